//! The route table and the OpenAPI 3.1 document of the HTTP API, served at `GET /openapi.json`.
//!
//! Generated, not written: each handler's `#[utoipa::path]` attribute gives its method, path,
//! parameters and statuses, the wire types' `ToSchema` derives give the bodies' schemas, and
//! [`routes`] registers the routes from those same attributes (utoipa-axum's `OpenApiRouter`;
//! [`super::router`] adds the layers), so a route cannot be served without being in the
//! document. What holds for every route is added here once rather than on each attribute: every
//! route may answer the common error body, every JSON body is also MessagePack (the codec
//! negotiates both), and the admin routes' bearer token.

use std::sync::OnceLock;

use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, OpenApi as Document, Ref, RefOr, ResponseBuilder};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::codec::{Negotiated, Reply};
use super::error::ErrorBody;
use super::state::AppState;
use super::{routes as handlers, search, shard};
use crate::api::Format;

/// Where the generated parts are gathered: the document's head, and the schemas no route
/// names directly.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "rankserve",
        description = "Candidate selection and learning-to-rank scoring over HTTP. Bodies are \
            JSON or MessagePack (`Content-Type`; replies follow `Accept`). Field by field, with \
            every error code: docs/api.md."
    ),
    components(schemas(ErrorBody)),
    tags(
        (name = "rank", description = "Scoring documents with a ranker"),
        (name = "search", description = "Selection from the index, then ranking"),
        (name = "rankers", description = "The ranker store"),
        (name = "shards", description = "What a broker asks of the shards it fans searches out to"),
        (name = "operations", description = "Health, readiness, metrics, this document"),
    )
)]
struct ApiDoc;

/// Every route, each registered from its handler's `#[utoipa::path]` attribute, which also
/// puts it in the OpenAPI document ([`document`]).
pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(handlers::rank))
        .routes(routes!(search::search))
        .routes(routes!(handlers::list_rankers))
        .routes(routes!(
            handlers::describe_ranker,
            handlers::put_ranker,
            handlers::delete_ranker
        ))
        .routes(routes!(handlers::load_ranker))
        .routes(routes!(search::reload_index))
        .routes(routes!(shard::shard_stats))
        .routes(routes!(shard::shard_search))
        .routes(routes!(handlers::healthz))
        .routes(routes!(handlers::readyz))
        .routes(routes!(handlers::metrics))
        .routes(routes!(openapi_json))
}

/// The name of the admin routes' security scheme (`security(("admin_token" = []))`).
const ADMIN_TOKEN: &str = "admin_token";

/// The document: the routes of [`routes`], completed as the module docs say.
pub fn document() -> Document {
    let mut doc = routes().into_openapi();
    for operation in doc.paths.paths.values_mut().flat_map(|item| {
        [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
            &mut item.head,
            &mut item.options,
            &mut item.trace,
        ]
        .into_iter()
        .flatten()
    }) {
        operation
            .responses
            .responses
            .entry("default".into())
            .or_insert_with(|| {
                ResponseBuilder::new()
                    .description(
                        "An error: `{\"error\": {\"code\", \"message\"}}` (codes in docs/api.md)",
                    )
                    .content(
                        Format::Json.content_type(),
                        Content::new(Some(RefOr::Ref(Ref::from_schema_name(ErrorBody::name())))),
                    )
                    .into()
            });
        also_messagepack(operation);
    }
    doc.components
        .get_or_insert_with(Default::default)
        .add_security_scheme(
            ADMIN_TOKEN,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The configured `admin_token` (config file or RANKSERVE_ADMIN_TOKEN)",
                    ))
                    .build(),
            ),
        );
    doc
}

/// Beside each JSON body of `operation` (request and replies), the same as MessagePack.
fn also_messagepack(operation: &mut Operation) {
    let json = Format::Json.content_type();
    let msgpack = Format::Msgpack.content_type();
    if let Some(RefOr::T(body)) = operation.request_body.as_mut() {
        if let Some(content) = body.content.get(json).cloned() {
            body.content.entry(msgpack.into()).or_insert(content);
        }
    }
    for response in operation.responses.responses.values_mut() {
        if let RefOr::T(response) = response {
            if let Some(content) = response.content.get(json).cloned() {
                response.content.entry(msgpack.into()).or_insert(content);
            }
        }
    }
}

/// `GET /openapi.json`: this document, built once.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object))
)]
pub(super) async fn openapi_json(Negotiated(format): Negotiated) -> Reply<&'static Document> {
    static DOCUMENT: OnceLock<Document> = OnceLock::new();
    Reply(format, DOCUMENT.get_or_init(document))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_json_body_is_also_messagepack_and_every_route_has_the_error_reply() {
        let doc = serde_json::to_value(document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let bodies = operation["requestBody"]["content"]
                    .as_object()
                    .into_iter()
                    .chain(
                        operation["responses"]
                            .as_object()
                            .unwrap()
                            .values()
                            .filter_map(|r| r["content"].as_object()),
                    );
                for content in bodies {
                    assert_eq!(
                        content.contains_key("application/json"),
                        content.contains_key("application/msgpack"),
                        "{method} {path}: {content:?}"
                    );
                }
                assert!(
                    operation["responses"]["default"]["content"]["application/json"]["schema"]
                        ["$ref"]
                        .as_str()
                        .is_some_and(|r| r.ends_with("/ErrorBody")),
                    "{method} {path}"
                );
            }
        }
        assert_eq!(
            doc["components"]["securitySchemes"][ADMIN_TOKEN]["scheme"],
            "bearer"
        );
    }
}
