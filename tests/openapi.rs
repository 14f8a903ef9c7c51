//! The OpenAPI document against docs/api.md and the router: a route served without docs, or
//! documented without being served, fails here.

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use rankserve::server::error::ErrorBody;

use crate::http::{send, server_with};

type Route = (String, String);

/// The routes docs/api.md lists: each heading or table row that starts with a `METHOD /path`
/// code span (`## \`POST /v1/search\``, `| \`GET /v1/rankers\` | ...`).
fn documented_routes() -> BTreeSet<Route> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md")).unwrap();
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start_matches(['#', '|', ' ']);
            if rest.len() == line.len() {
                return None; // neither a heading nor a table row
            }
            let span = rest.strip_prefix('`')?.split('`').next()?;
            let (method, path) = span.split_once(' ')?;
            // An optional query written after the path (`/v1/rankers/{name}[?format=F]`).
            let path = path.split('[').next()?;
            let known = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];
            (known.contains(&method) && path.starts_with('/'))
                .then(|| (method.to_string(), path.to_string()))
        })
        .collect()
}

fn generated_routes(document: &serde_json::Value) -> BTreeSet<Route> {
    document["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect()
}

#[test]
fn the_openapi_document_has_exactly_the_routes_of_docs_api_md() {
    let document = serde_json::to_value(rankserve::server::openapi::document()).unwrap();
    assert_eq!(document["openapi"], "3.1.0");
    let documented = documented_routes();
    assert!(
        documented.len() >= 12,
        "the parser found too few routes: {documented:?}"
    );
    let generated = generated_routes(&document);
    assert_eq!(
        generated.difference(&documented).collect::<Vec<_>>(),
        Vec::<&Route>::new(),
        "served and in the OpenAPI document, missing from docs/api.md"
    );
    assert_eq!(
        documented.difference(&generated).collect::<Vec<_>>(),
        Vec::<&Route>::new(),
        "in docs/api.md, not served"
    );
}

#[tokio::test]
async fn the_router_serves_the_document_and_every_route_in_it() {
    let server = server_with(|_| {});
    let expected = serde_json::to_value(rankserve::server::openapi::document()).unwrap();
    for accept in ["application/json", "application/msgpack"] {
        let request = Request::get("/openapi.json")
            .header(header::ACCEPT, accept)
            .body(Body::empty())
            .unwrap();
        let (status, headers, body) = send(&server.app, request).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], accept);
        let served: serde_json::Value = match accept {
            "application/json" => serde_json::from_slice(&body).unwrap(),
            _ => rmp_serde::from_slice(&body).unwrap(),
        };
        assert_eq!(served, expected);
    }
    // Every route answers with its own handler (admin ones 401 without the token), not the
    // router's 404 `not_found` or 405 `method_not_allowed`.
    for (method, path) in generated_routes(&expected) {
        let uri = path.replace("{name}", "small");
        let request = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap())
            .uri(&uri)
            .body(Body::empty())
            .unwrap();
        let (status, _, body) = send(&server.app, request).await;
        let code = serde_json::from_slice::<ErrorBody>(&body)
            .ok()
            .map(|e| e.error.code);
        assert!(
            status != StatusCode::METHOD_NOT_ALLOWED && code.as_deref() != Some("not_found"),
            "{method} {uri}: {status} {code:?}"
        );
    }
}
