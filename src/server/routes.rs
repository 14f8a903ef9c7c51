//! The handlers of `/v1/rank`, the ranker routes (admin ones behind [`super::auth`]) and the
//! operations routes (`healthz`, `readyz`, `metrics`); [`super::router`] wires them. The search
//! handlers live in [`super::search`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State as Shared};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::OwnedSemaphorePermit;

use super::auth::authorize;
use super::codec::{micros, read_body, Coded, Negotiated, RankerName, Reply};
use super::error::{ApiError, ErrorBody};
use super::state::AppState;
use crate::api::RankBody;
use crate::api::{
    Explanation, LayerShape, RankResponse, RankerDescription, RankerList, Readiness, Timings,
};
use crate::backend::Backend;
use crate::rank::cpu::model_inputs;
use crate::rank::cut_input;
use crate::rank::engine::{Documents, RankError, RankJob, Ranked};
use crate::rank::import::ModelKind;
use crate::rank::model::{Activation, Input};
use crate::rank::store::{LoadedRanker, StoreError};

fn store_error(err: StoreError) -> ApiError {
    match err {
        StoreError::BadName { name } => ApiError::BadRankerName { name },
        StoreError::NotFound { name } => ApiError::UnknownRanker { name },
        // A stored file that no longer loads is the server's fault; an upload's is the caller's
        // (see `put_ranker`).
        err @ (StoreError::Invalid { .. } | StoreError::Io { .. }) => ApiError::internal(err),
    }
}

/// Finds a ranker in the cache, or loads it off the async runtime: a miss reads and parses a
/// file, and the hand-off to the blocking pool costs tens of µs that a hit need not pay.
pub(super) async fn ranker(state: &AppState, name: &str) -> Result<Arc<LoadedRanker>, ApiError> {
    if let Some(hit) = state.store().cached(name) {
        return Ok(hit);
    }
    let (state, name) = (Arc::clone(state), name.to_string());
    tokio::task::spawn_blocking(move || state.store().get(&name))
        .await
        .map_err(ApiError::internal)?
        .map_err(store_error)
}

/// `POST /v1/rank`.
#[utoipa::path(
    post,
    path = "/v1/rank",
    tag = "rank",
    request_body = crate::api::RankRequest,
    responses(
        (status = 200, description = "Scores in request order", body = RankResponse),
        (status = 404, description = "`unknown_ranker`", body = ErrorBody),
        (status = 503, description = "`overloaded` (the ranker's queue is full: retry after `Retry-After`) or `gpu_unavailable`", body = ErrorBody,
            headers(("Retry-After" = u32, description = "seconds, with `overloaded`"))),
        (status = 504, description = "`deadline_exceeded`", body = ErrorBody),
    )
)]
pub(super) async fn rank(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
    Coded {
        value: body,
        started: arrived,
        read_us,
        decode_us,
        ..
    }: Coded<RankBody>,
) -> Result<Reply<RankResponse>, ApiError> {
    // A sampled request is recorded (decoded in full) before anything is decided from it.
    let mut body = state.sample(body)?;
    loop {
        let head = body.head();
        let timeout_ms = head.timeout_ms.or(state.config.default_timeout_ms);
        let deadline = timeout_ms.map(|ms| arrived + Duration::from_millis(ms));
        let backend = head.backend.unwrap_or(state.config.backend);
        let (k, explain_asked, asked) = (head.k, head.explain, head.backend);
        let (loaded, _place) = match admit(&state, &head.ranker, backend).await {
            Ok(admitted) => admitted,
            Err(err) => return Err(body.body_error().map_or(err, ApiError::from)),
        };
        let n_docs = body.len();
        let job = RankJob {
            ranker: Arc::clone(&loaded),
            documents: Documents::Source(body),
            backend,
            asked_cpu: asked == Some(Backend::Cpu),
            deadline,
            keep_rows: explain_asked,
        };
        let (scored, fe_us, rows, source) = match state.rank.rank(job).await {
            Ok(Ranked::Scored {
                scored,
                fe_us,
                rows,
                source,
                ..
            }) => (scored, fe_us, rows, source),
            // Decided from misread fields (see `RankBody::frame_documents`): once more, from
            // the body decoded in full, which cannot be misread.
            Ok(Ranked::Reread(decoded)) => {
                body = decoded;
                continue;
            }
            Err(err) => return Err(rank_error(err, timeout_ms)),
        };
        // Freeing a thousand decoded hit documents takes a few hundred microseconds: off the
        // reply's path. A framed body is one buffer.
        if let Some(decoded @ RankBody::Decoded(_)) = source {
            tokio::task::spawn_blocking(move || drop(decoded));
        }
        let order = k.map(|k| top_k(&scored.scores, k));
        let explain = rows.map(|rows| explain(&loaded, &rows));
        metrics::counter!("rankserve_documents_ranked_total", "ranker" => loaded.name.clone())
            .increment(n_docs as u64);
        metrics::counter!("rankserve_backend_total", "backend" => scored.backend.as_str())
            .increment(1);
        metrics::histogram!("rankserve_rank_duration_seconds", "ranker" => loaded.name.clone())
            .record(arrived.elapsed().as_secs_f64());
        return Ok(Reply(
            format,
            RankResponse {
                scores: scored
                    .scores
                    .iter()
                    .map(|&s| (!s.is_nan()).then_some(s))
                    .collect(),
                order,
                timings: Timings {
                    read_us,
                    decode_us,
                    fe_us,
                    mit_us: None,
                    me_us: scored.eval_us,
                    queue_us: scored.queue_us,
                    batch_docs: scored.batch_docs,
                    batch_requests: scored.batch_requests,
                    total_us: micros(arrived.elapsed()),
                },
                backend: scored.backend.as_str().to_string(),
                explain,
            },
        ));
    }
}

/// The checks between reading a `/v1/rank` body and building its features: the backend it
/// asks for is there, the ranker exists (loaded), and the ranker's queue admits the request.
async fn admit(
    state: &AppState,
    name: &str,
    backend: Backend,
) -> Result<(Arc<LoadedRanker>, OwnedSemaphorePermit), ApiError> {
    if backend == Backend::Gpu && !state.has_gpu() {
        return Err(ApiError::GpuUnavailable);
    }
    let loaded = ranker(state, name).await?;
    let place = state.admit(name)?;
    Ok((loaded, place))
}

/// The answer to a request whose ranking failed with `err`; `timeout_ms` is the deadline's.
pub(super) fn rank_error<E: Into<ApiError>>(
    err: RankError<E>,
    timeout_ms: Option<u64>,
) -> ApiError {
    match err {
        RankError::Source(err) => err.into(),
        RankError::DeadlineExceeded => ApiError::DeadlineExceeded {
            timeout_ms: timeout_ms.unwrap_or(0),
        },
        err @ (RankError::Fe(_) | RankError::Internal(_)) => ApiError::internal(err),
    }
}

/// Indices of the `k` best scores, best first, ties by smaller index, NaN last.
pub(super) fn top_k(scores: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    let key = |i: &usize| {
        (
            scores[*i].is_nan(),
            std::cmp::Reverse(OrdF64(scores[*i])),
            *i,
        )
    };
    let k = k.min(order.len());
    if k < order.len() && k > 0 {
        order.select_nth_unstable_by_key(k - 1, key);
        order.truncate(k);
    }
    order.sort_unstable_by_key(key);
    order.truncate(k);
    order
}

/// `f64` under `total_cmp` (every comparison, `PartialOrd` included, so NaN keys are equal).
struct OrdF64(f64);
impl PartialEq for OrdF64 {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Per row of `features` (row-major, the ranker's width): `V` and the model inputs.
pub(super) fn explain(loaded: &LoadedRanker, features: &[f64]) -> Vec<Explanation> {
    let width = loaded.ranker.features.len().max(1);
    features
        .chunks(width)
        .map(|row| Explanation {
            features: row.iter().map(|&v| (!v.is_nan()).then_some(v)).collect(),
            inputs: model_inputs(&loaded.ranker, row)
                .into_iter()
                .map(|v| (!v.is_nan()).then_some(v))
                .collect(),
        })
        .collect()
}

/// `GET /v1/rankers`.
#[utoipa::path(
    get,
    path = "/v1/rankers",
    tag = "rankers",
    responses((status = 200, description = "The rankers in the store", body = RankerList))
)]
pub(super) async fn list_rankers(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
) -> Result<Reply<RankerList>, ApiError> {
    let mut rankers = state.store().list().map_err(store_error)?;
    for ranker in &mut rankers {
        ranker.resident_gpu = state.rank.resident_on_gpu(&ranker.name);
    }
    Ok(Reply(format, RankerList { rankers }))
}

/// `GET /v1/rankers/{name}`: describes a ranker, loading it if needed.
#[utoipa::path(
    get,
    path = "/v1/rankers/{name}",
    tag = "rankers",
    params(RankerName),
    responses(
        (status = 200, description = "The ranker", body = RankerDescription),
        (status = 404, description = "`unknown_ranker`", body = ErrorBody),
    )
)]
pub(super) async fn describe_ranker(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
    RankerName(name): RankerName,
) -> Result<Reply<RankerDescription>, ApiError> {
    let loaded = ranker(&state, &name).await?;
    Ok(Reply(format, describe(&state, &loaded)))
}

fn describe(state: &AppState, loaded: &LoadedRanker) -> RankerDescription {
    let mut inputs = BTreeMap::new();
    for input in &loaded.ranker.inputs {
        let kind = match input {
            Input::Linear { .. } => "linear",
            Input::LogLinear { .. } => "loglinear",
            Input::Bucket { .. } => "bucket",
            Input::FreeForm(_) => "freeform",
            Input::Tree(_) => "tree",
            Input::Dummy => "dummy",
        };
        *inputs.entry(kind.to_string()).or_insert(0) += 1;
    }
    let layers = loaded
        .ranker
        .layers
        .iter()
        .map(|layer| LayerShape {
            inputs: layer.inputs,
            outputs: layer.outputs,
            activation: match layer.activation {
                Activation::Identity => "identity",
                Activation::Relu => "relu",
                Activation::Tanh => "tanh",
                Activation::Sigmoid => "sigmoid",
            }
            .to_string(),
        })
        .collect();
    RankerDescription {
        name: loaded.name.clone(),
        features: loaded.ranker.features.clone(),
        inputs,
        layers,
        trees: loaded.ranker.ensemble.as_ref().map_or(0, |e| e.trees.len()),
        bytes: loaded.bytes,
        file_bytes: loaded.file_bytes,
        resident: [
            ("cpu", state.store().is_resident(&loaded.name)),
            ("gpu", state.rank.resident_on_gpu(&loaded.name)),
        ]
        .into_iter()
        .filter(|&(_, here)| here)
        .map(|(place, _)| place.to_string())
        .collect(),
        crossover: loaded.crossover.get().cloned(),
    }
}

/// The query of `PUT /v1/rankers/{name}`.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct PutRankerQuery {
    /// The file's format: `auto` (the default: detected from the bytes) or one of `native`,
    /// `lightgbm`, `lightgbm-text`, `xgboost`, `xgboost-ubj`, `ranklib`, `catboost`, `onnx`.
    format: Option<String>,
}

/// `PUT /v1/rankers/{name}[?format=F]` (admin): the body is a model file of any format
/// `rank::import` reads (JSON, UBJSON, text, XML or protobuf; any content type), detected or
/// named.
#[utoipa::path(
    put,
    path = "/v1/rankers/{name}",
    tag = "rankers",
    params(RankerName, PutRankerQuery),
    request_body(
        content = Vec<u8>,
        content_type = "application/octet-stream",
        description = "A model file: a rankserve ranker, LightGBM (JSON dump or text model), XGBoost (JSON or UBJSON), CatBoost JSON, ONNX or RankLib XML (any body type; the format is detected or named by `format`; docs/ranker-format.md)"
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The ranker now served under that name", body = RankerDescription),
        (status = 400, description = "`bad_ranker` (the old ranker keeps serving), `bad_ranker_name` or `invalid_request` (an unknown format)", body = ErrorBody),
    )
)]
pub(super) async fn put_ranker(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
    RankerName(name): RankerName,
    query: Result<Query<PutRankerQuery>, QueryRejection>,
    req: Request,
) -> Result<Reply<RankerDescription>, ApiError> {
    authorize(&state, req.headers())?;
    let Query(query) = query.map_err(|e| ApiError::InvalidRequest(e.body_text()))?;
    let kind = match query.format.as_deref() {
        None | Some("auto") => None,
        Some(named) => Some(ModelKind::from_name(named).ok_or_else(|| {
            let known: Vec<&str> = ModelKind::NAMES.iter().map(|(n, _)| *n).collect();
            ApiError::InvalidRequest(format!(
                "unknown format {:?}: expected auto, {}",
                cut_input(named),
                known.join(", ")
            ))
        })?),
    };
    let (parts, body) = req.into_parts();
    let bytes = read_body(
        &parts.headers,
        body,
        state.body_limit(),
        state.body_deadline(),
    )
    .await?;
    let shared = Arc::clone(&state);
    let loaded = tokio::task::spawn_blocking(move || {
        let loaded = shared.store().put(&name, &bytes, kind)?;
        shared.rank.prepare(&loaded);
        Ok(loaded)
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|err| match err {
        StoreError::Invalid { name, source } => ApiError::BadRanker {
            name,
            reason: source.to_string(),
        },
        other => store_error(other),
    })?;
    tracing::info!(ranker = %loaded.name, version = loaded.version, "ranker replaced");
    Ok(Reply(format, describe(&state, &loaded)))
}

/// `DELETE /v1/rankers/{name}` (admin).
#[utoipa::path(
    delete,
    path = "/v1/rankers/{name}",
    tag = "rankers",
    params(RankerName),
    security(("admin_token" = [])),
    responses(
        (status = 204, description = "Deleted (requests in flight keep their copy)"),
        (status = 404, description = "`unknown_ranker`", body = ErrorBody),
    )
)]
pub(super) async fn delete_ranker(
    Shared(state): Shared<AppState>,
    RankerName(name): RankerName,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    authorize(&state, &headers)?;
    let shared = Arc::clone(&state);
    tokio::task::spawn_blocking(move || {
        shared.store().delete(&name)?;
        shared.rank.forget(&name);
        Ok::<_, StoreError>(())
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(store_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/rankers/{name}/load` (admin): re-reads the file into the CPU cache, uploads it to
/// the GPU cache and measures its crossover (when there is a GPU).
#[utoipa::path(
    post,
    path = "/v1/rankers/{name}/load",
    tag = "rankers",
    params(RankerName),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The ranker, loaded", body = RankerDescription),
        (status = 404, description = "`unknown_ranker`", body = ErrorBody),
    )
)]
pub(super) async fn load_ranker(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
    RankerName(name): RankerName,
    headers: HeaderMap,
) -> Result<Reply<RankerDescription>, ApiError> {
    authorize(&state, &headers)?;
    let shared = Arc::clone(&state);
    let loaded = tokio::task::spawn_blocking(move || {
        let loaded = shared.store().reload(&name)?;
        shared.rank.prepare(&loaded);
        Ok::<_, StoreError>(loaded)
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(store_error)?;
    Ok(Reply(format, describe(&state, &loaded)))
}

fn readiness(state: &AppState) -> Readiness {
    Readiness {
        ready: state.is_ready(),
        rankers_loaded: state
            .store()
            .list()
            .map_or(0, |l| l.iter().filter(|r| r.resident_cpu).count()),
        gpu: state.gpu_probe(),
    }
}

/// `GET /healthz`: the process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process answers", body = Readiness))
)]
pub(super) async fn healthz(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
) -> Reply<Readiness> {
    Reply(format, readiness(&state))
}

/// `GET /readyz`: 503 until the rankers are loaded and the GPU probe has finished.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Not ready yet (the same body)", body = Readiness),
    )
)]
pub(super) async fn readyz(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
) -> Response {
    let readiness = readiness(&state);
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Reply(format, readiness)).into_response()
}

/// `GET /metrics`: Prometheus text.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text exposition (names in src/server/metrics.rs)", body = String, content_type = "text/plain; version=0.0.4"))
)]
pub(super) async fn metrics(Shared(state): Shared<AppState>) -> Response {
    let text = super::metrics::render(&state);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The naive reference: a full stable sort.
    fn top_k_naive(scores: &[f64], k: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| {
            scores[a]
                .is_nan()
                .cmp(&scores[b].is_nan())
                .then(scores[b].total_cmp(&scores[a]))
                .then(a.cmp(&b))
        });
        order.truncate(k);
        order
    }

    #[test]
    fn top_k_breaks_ties_by_index_and_puts_nan_last() {
        let scores = [1.0, 3.0, f64::NAN, 3.0, 2.0];
        assert_eq!(top_k(&scores, 3), [1, 3, 4]);
        assert_eq!(top_k(&scores, 10), [1, 3, 4, 0, 2]);
        assert_eq!(top_k(&scores, 0), Vec::<usize>::new());
    }

    proptest! {
        #[test]
        fn top_k_matches_full_sort(
            scores in proptest::collection::vec(prop_oneof![(-3i8..3).prop_map(f64::from), Just(f64::NAN)], 0..40),
            k in 0usize..45,
        ) {
            prop_assert_eq!(top_k(&scores, k), top_k_naive(&scores, k));
        }
    }
}
