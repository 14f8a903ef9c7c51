//! `POST /v1/search` and `POST /v1/index/reload`: the search pipeline that chains the document
//! stage into the ranking stage over the index being served (DESIGN §4 puts it here, with the
//! server, so that neither stage imports the other).
//!
//! A search runs: query → the selection engine ([`SelectEngine`]: routed by the scheduler,
//! on the CPU or in a batch on the GPU, the fallback) for the best candidates by BM25 → the
//! ranking engine ([`RankEngine`](crate::rank::engine::RankEngine): FE, then scoring, batched
//! with `/v1/rank`'s requests), whose row source reads each candidate's hits from the index's
//! forward index straight into FE or the device's layout ([`CandidateHits`]) → top-k, ties by
//! smaller docID. Without a ranker, or on an index
//! without a forward index (a CIFF import), the hits are the BM25 top-k and `backends.rank` is
//! `none`.
//!
//! The request's `backend` drives both stages; each engine decides what it means. This file
//! decides only where the async handler waits: a selection the engine calls cheap
//! ([`SelectEngine::runs_inline`]) runs on the request's own task, a selection routed to the GPU
//! is awaited there ([`SelectEngine::select_queued`]), the others (and a GPU selection the device
//! did not answer) run on the blocking pool. `backends.select` says which processor selected.
//!
//! Inputs that select nothing are not errors (`docs/api.md` lists them): an empty query, a query
//! of unknown terms, `k = 0` answer no hits; `k` and `candidates` above the collection's size
//! are clamped to it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State as Shared};

use super::auth::authorize;
use super::candidate_hits::{CandidateError, CandidateHits};
use super::codec::{format_of_body, micros, read_body, Coded, Negotiated, Reply};
use super::error::{ApiError, ErrorBody};
use super::routes::{explain, rank_error, ranker, top_k};
use super::state::AppState;
use crate::api::shard::CollectionStats;
use crate::api::{
    IndexDescription, ReloadRequest, SearchBackends, SearchHit, SearchRequest, SearchResponse,
    SearchTimings,
};
use crate::backend::{Backend, Processor};
use crate::index::tokenize::Tokenizer;
use crate::index::{DocId, Index};
use crate::rank::engine::{Documents, FeRefused, RankError, RankJob, Ranked};
use crate::rank::store::LoadedRanker;
use crate::select::engine::{SelectEngine, Selected};
use crate::select::Query;

/// Most terms a query may have (before duplicates are removed). Removing duplicates and FE both
/// grow with the term count, and a body of 64 MiB holds millions of terms: a bound keeps one
/// request from holding a core for minutes. Real queries have a handful.
pub const MAX_QUERY_TERMS: usize = 1024;

/// The query's terms: `query` tokenized like the documents, or `terms` as given.
///
/// # Errors
/// [`ApiError::InvalidRequest`] when both or neither are given, or when there are more than
/// [`MAX_QUERY_TERMS`].
pub(super) fn query_terms(request: &SearchRequest) -> Result<Vec<String>, ApiError> {
    let terms = match (&request.query, &request.terms) {
        (Some(text), None) => Tokenizer::new().tokens(text),
        (None, Some(terms)) => terms.clone(),
        (Some(_), Some(_)) => {
            return Err(ApiError::InvalidRequest(
                "give `query` (text) or `terms` (a list), not both".into(),
            ))
        }
        (None, None) => {
            return Err(ApiError::InvalidRequest(
                "needs `query` (text) or `terms` (a list)".into(),
            ))
        }
    };
    if terms.len() > MAX_QUERY_TERMS {
        return Err(ApiError::InvalidRequest(format!(
            "the query has {} terms, at most {MAX_QUERY_TERMS} are accepted",
            terms.len()
        )));
    }
    Ok(terms)
}

/// The candidates and, when a ranker will rank them, their hits' source.
pub(super) struct Candidates {
    /// (docID, BM25 score): by docID when `hits` is set (row `i` is `selected[i]`, so the
    /// top-k's ties by smaller row are ties by smaller docID), else best first.
    pub(super) selected: Vec<(DocId, f64)>,
    pub(super) hits: Option<CandidateHits>,
    pub(super) select_us: u64,
    /// Time putting them in docID order and gathering the query's statistics for FE (the
    /// hits are read by the ranking engine, in its FE time).
    pub(super) hits_us: u64,
    /// The processor that selected them.
    pub(super) select_side: Processor,
}

/// The selection query of `request` over `index`: its terms, the hits wanted (the candidates
/// when a ranker will rank them, else `k`; at most the collection), its mode.
pub(super) fn selection_query(
    index: &Index,
    terms: Vec<String>,
    request: &SearchRequest,
    ranked: bool,
) -> Query {
    let wanted = match ranked {
        true => request.candidates.max(request.k),
        false => request.k,
    };
    Query::new(terms, wanted.min(index.num_docs() as usize), request.mode)
}

/// The candidates of a selection of the query `terms`, and with a ranker to rank them the
/// source of their hits ([`CandidateHits`], which reads them when the ranking engine asks),
/// with the `collection`'s statistics when given (a shard's search), else the index's.
pub(super) fn candidates(
    index: &Arc<Index>,
    terms: &[String],
    selected: Selected,
    ranked: bool,
    collection: Option<&CollectionStats>,
) -> Candidates {
    let Selected { result, side } = selected;
    if !ranked {
        return Candidates {
            selected: result.hits,
            hits: None,
            select_us: result.select_us,
            hits_us: 0,
            select_side: side,
        };
    }
    let started = Instant::now();
    let mut selected = result.hits;
    selected.sort_unstable_by_key(|&(doc, _)| doc);
    let docs = selected.iter().map(|&(doc, _)| doc).collect();
    let hits = CandidateHits::new(Arc::clone(index), terms, docs, collection);
    Candidates {
        selected,
        hits: Some(hits),
        select_us: result.select_us,
        hits_us: micros(started.elapsed()),
        select_side: side,
    }
}

/// A request's deadline: `timeout_ms` after arrival (the configured default when absent).
#[derive(Clone, Copy)]
pub(super) struct Deadline {
    pub(super) at: Option<Instant>,
    pub(super) timeout_ms: Option<u64>,
}

impl Deadline {
    /// The deadline of a request of `timeout_ms` (the configured default when `None`) that
    /// arrived at `arrived`.
    pub(super) fn of(state: &AppState, timeout_ms: Option<u64>, arrived: Instant) -> Deadline {
        let timeout_ms = timeout_ms.or(state.config.default_timeout_ms);
        Deadline {
            at: timeout_ms.map(|ms| arrived + Duration::from_millis(ms)),
            timeout_ms,
        }
    }

    /// [`ApiError::DeadlineExceeded`] once it has passed.
    pub(super) fn check(self) -> Result<(), ApiError> {
        match self.at {
            Some(at) if Instant::now() >= at => Err(ApiError::DeadlineExceeded {
                timeout_ms: self.timeout_ms.unwrap_or(0),
            }),
            _ => Ok(()),
        }
    }
}

/// The top-k and what the ranking stage spent on it.
pub(super) struct Ordered {
    pub(super) hits: Vec<SearchHit>,
    pub(super) fe_us: u64,
    pub(super) me_us: u64,
    pub(super) queue_us: u64,
    /// `cpu`, `gpu`, or `none` for the BM25 order.
    pub(super) backend: &'static str,
}

impl Ordered {
    /// The reply's timings and backends: selection's, the hit documents' and this ranking's.
    pub(super) fn report(
        &self,
        select_us: u64,
        hits_us: u64,
        select_side: Processor,
        arrived: Instant,
    ) -> (SearchTimings, SearchBackends) {
        let timings = SearchTimings {
            select_us,
            fe_us: hits_us + self.fe_us,
            mit_us: None,
            me_us: self.me_us,
            queue_us: self.queue_us,
            total_us: micros(arrived.elapsed()),
        };
        let backends = SearchBackends {
            select: select_side.as_str().into(),
            rank: self.backend.into(),
        };
        (timings, backends)
    }
}

fn hit(index: &Index, (doc, selection_score): (DocId, f64), score: f64) -> SearchHit {
    SearchHit {
        doc,
        id: index.doc_id(doc).to_string(),
        score: (!score.is_nan()).then_some(score),
        selection_score,
        explain: None,
    }
}

/// The BM25 order: the first `k` of `selected` (best first already).
pub(super) fn bm25_order(index: &Index, selected: &[(DocId, f64)], k: usize) -> Ordered {
    Ordered {
        hits: selected
            .iter()
            .take(k)
            .map(|&candidate| hit(index, candidate, candidate.1))
            .collect(),
        fe_us: 0,
        me_us: 0,
        queue_us: 0,
        backend: "none",
    }
}

/// Ranks the candidates' hits (row `i` is `selected[i]`, in docID order) in the ranking
/// engine, as `/v1/rank` does a body, and keeps the best `request.k` (ties by smaller docID).
#[allow(clippy::too_many_arguments)]
pub(super) async fn rank_candidates(
    state: &AppState,
    index: &Index,
    loaded: Arc<LoadedRanker>,
    selected: &[(DocId, f64)],
    hits: CandidateHits,
    request: &SearchRequest,
    deadline: Deadline,
) -> Result<Ordered, ApiError> {
    let job = RankJob {
        ranker: Arc::clone(&loaded),
        documents: Documents::Source(hits),
        backend: request.backend.unwrap_or(state.config.backend),
        asked_cpu: request.backend == Some(Backend::Cpu),
        deadline: deadline.at,
        keep_rows: request.explain,
    };
    let (scored, fe_us, rows) = match state.rank.rank(job).await {
        Ok(Ranked::Scored {
            scored,
            fe_us,
            rows,
            ..
        }) => (scored, fe_us, rows),
        Ok(Ranked::Reread(_)) => {
            return Err(ApiError::internal("the candidates' rows were withdrawn"))
        }
        Err(
            RankError::Fe(FeRefused::Ranker(err))
            | RankError::Source(CandidateError::Fe(FeRefused::Ranker(err))),
        ) => return Err(unrankable(&loaded, &err)),
        Err(err) => return Err(rank_error(err, deadline.timeout_ms)),
    };
    let order = top_k(&scored.scores, request.k);
    let mut explained = rows.map(|features| {
        let width = loaded.ranker.features.len();
        let rows: Vec<f64> = order
            .iter()
            .flat_map(|&i| &features[i * width..(i + 1) * width])
            .copied()
            .collect();
        explain(&loaded, &rows).into_iter()
    });
    let hits = order
        .iter()
        .map(|&i| SearchHit {
            explain: explained.as_mut().and_then(Iterator::next),
            ..hit(index, selected[i], scored.scores[i])
        })
        .collect();
    metrics::counter!("rankserve_documents_ranked_total", "ranker" => loaded.name.clone())
        .increment(selected.len() as u64);
    metrics::counter!("rankserve_backend_total", "backend" => scored.backend.as_str()).increment(1);
    Ok(Ordered {
        hits,
        fe_us,
        me_us: scored.eval_us,
        queue_us: scored.queue_us,
        backend: scored.backend.as_str(),
    })
}

/// The error of a ranker whose features are not all FE's.
fn unrankable(loaded: &LoadedRanker, err: &dyn std::fmt::Display) -> ApiError {
    ApiError::InvalidRequest(format!(
        "ranker {:?} cannot rank search results (its features must come from feature extraction): {err}",
        loaded.name
    ))
}

/// What a search has checked before it selects.
pub(super) struct Prepared {
    pub(super) deadline: Deadline,
    pub(super) backend: Backend,
    /// The query's terms ([`query_terms`]).
    pub(super) terms: Vec<String>,
    pub(super) index: Arc<Index>,
    /// The ranker that will rank the candidates: `None` without one, or on an index without a
    /// forward index.
    pub(super) loaded: Option<Arc<LoadedRanker>>,
    /// The ranker's admission place, held to the end of the search.
    pub(super) place: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// The checks of a search (`/v1/search`, a shard's search), in the order their errors are
/// answered: the backend, the terms, the index, the ranker and its admission, the ranker's
/// features, the deadline.
///
/// # Errors
/// As the checks say: `gpu_unavailable`, `invalid_request`, `no_index`, `unknown_ranker`,
/// `overloaded`, `deadline_exceeded`.
pub(super) async fn prepare(
    state: &AppState,
    request: &SearchRequest,
    arrived: Instant,
) -> Result<Prepared, ApiError> {
    let deadline = Deadline::of(state, request.timeout_ms, arrived);
    let backend = request.backend.unwrap_or(state.config.backend);
    if backend == Backend::Gpu && !state.has_gpu() {
        return Err(ApiError::GpuUnavailable);
    }
    let terms = query_terms(request)?;
    let index = state.index().ok_or(ApiError::NoIndex)?;
    let loaded = match &request.ranker {
        Some(name) => Some(ranker(state, name).await?),
        None => None,
    };
    let place = loaded.as_ref().map(|l| state.admit(&l.name)).transpose()?;
    // Ranking reads hit requests, which only a forward index can give.
    let loaded = loaded.filter(|_| index.has_forward());
    // A ranker whose features are not all FE's is refused before anything runs.
    if let Some(Err(err)) = loaded.as_deref().map(|l| l.fe.as_ref()) {
        return Err(unrankable(loaded.as_deref().expect("checked"), err));
    }
    deadline.check()?;
    Ok(Prepared {
        deadline,
        backend,
        terms,
        index,
        loaded,
        place,
    })
}

/// `POST /v1/search`.
#[utoipa::path(
    post,
    path = "/v1/search",
    tag = "search",
    request_body = SearchRequest,
    responses(
        (status = 200, description = "The top k hits, best first", body = SearchResponse),
        (status = 404, description = "`unknown_ranker`", body = ErrorBody),
        (status = 503, description = "`no_index`, `gpu_unavailable`, or `overloaded` (retry after `Retry-After`)", body = ErrorBody,
            headers(("Retry-After" = u32, description = "seconds, with `overloaded`"))),
        (status = 504, description = "`deadline_exceeded`", body = ErrorBody),
    )
)]
pub(super) async fn search(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
    Coded {
        value: request,
        started: arrived,
        ..
    }: Coded<SearchRequest>,
) -> Result<Reply<SearchResponse>, ApiError> {
    if let Some(broker) = state.broker() {
        let reply = super::broker::search(&state, broker, request, arrived).await?;
        return Ok(Reply(format, reply));
    }
    let Prepared {
        deadline,
        backend,
        terms,
        index,
        loaded,
        place: _place,
    } = prepare(&state, &request, arrived).await?;

    let ranked = loaded.is_some();
    let query = selection_query(&index, terms, &request, ranked);
    let route = state.select.route(&index, &query, backend);
    // A cheap CPU selection runs here, and a GPU selection is awaited here (its device's lane
    // answers it); the rest (long lists on the CPU, and a GPU selection the device did not answer)
    // on the blocking pool, where a query sent there is routed again under the load it meets. The
    // candidates' hits are read later, by the ranking engine on its own pool.
    let (selected, backend) = match (SelectEngine::runs_inline(&route), route.to_gpu()) {
        (true, _) => {
            let selected = (state.select).select(&index, &query, route, backend, deadline.at);
            (Some(selected.map_err(ApiError::internal)?), backend)
        }
        (false, true) => {
            let selected =
                (state.select).select_queued(&index, &query, route, backend, deadline.at);
            let selected = selected.await.map_err(ApiError::internal)?;
            // Not answered by the device: the CPU's turn.
            (selected, Backend::Cpu)
        }
        (false, false) => (None, backend),
    };
    let candidates = match selected {
        Some(selected) => candidates(&index, &query.terms, selected, ranked, None),
        None => {
            let (state, index) = (Arc::clone(&state), Arc::clone(&index));
            let at = deadline.at;
            tokio::task::spawn_blocking(move || {
                let _stage = tracing::info_span!("search", terms = query.terms.len()).entered();
                let route = state.select.route(&index, &query, backend);
                let selected = (state.select)
                    .select(&index, &query, route, backend, at)
                    .map_err(ApiError::internal)?;
                Ok::<_, ApiError>(candidates(&index, &query.terms, selected, ranked, None))
            })
            .await
            .map_err(ApiError::internal)??
        }
    };
    let Candidates {
        selected,
        hits,
        select_us,
        hits_us,
        select_side,
    } = candidates;
    deadline.check()?;

    let ordered = match (loaded, hits) {
        (Some(loaded), Some(hits)) => {
            rank_candidates(&state, &index, loaded, &selected, hits, &request, deadline).await?
        }
        _ => bm25_order(&index, &selected, request.k),
    };
    metrics::histogram!("rankserve_search_select_seconds")
        .record(Duration::from_micros(select_us).as_secs_f64());
    let ranker_label = request.ranker.unwrap_or_else(|| "none".into());
    metrics::histogram!("rankserve_search_duration_seconds", "ranker" => ranker_label)
        .record(arrived.elapsed().as_secs_f64());
    let (timings, backends) = ordered.report(select_us, hits_us, select_side, arrived);
    Ok(Reply(
        format,
        SearchResponse {
            hits: ordered.hits,
            timings,
            backends,
            shards: None,
        },
    ))
}

/// `POST /v1/index/reload` (admin): opens `dir` (default: the directory being served, else the
/// configured one) with every check [`Index::open`] makes, then swaps it in. A failure leaves
/// the index being served untouched.
#[utoipa::path(
    post,
    path = "/v1/index/reload",
    tag = "search",
    request_body(content = Option<ReloadRequest>, description = "Or an empty body: the directory being served, else the configured one"),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The index now served", body = IndexDescription),
        (status = 422, description = "`bad_index`: the directory did not open; the old index keeps serving", body = ErrorBody),
    )
)]
pub(super) async fn reload_index(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
    req: Request,
) -> Result<Reply<IndexDescription>, ApiError> {
    authorize(&state, req.headers())?;
    let (parts, body) = req.into_parts();
    let bytes = read_body(
        &parts.headers,
        body,
        state.body_limit(),
        state.body_deadline(),
    )
    .await?;
    // An empty body (with or without a Content-Type) asks for the default directory.
    let request: ReloadRequest = if bytes.is_empty() {
        ReloadRequest::default()
    } else {
        format_of_body(&parts.headers)?.decode(&bytes)?
    };
    let dir = request
        .dir
        .or_else(|| state.index().map(|index| index.dir().to_path_buf()))
        .or_else(|| state.config.index.clone())
        .ok_or_else(|| {
            ApiError::InvalidRequest(
                "no index directory: give `dir` (no index is configured or served)".into(),
            )
        })?;
    let opened = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || Index::open(&dir))
            .await
            .map_err(ApiError::internal)?
    };
    let index = Arc::new(opened.map_err(|err| ApiError::BadIndex {
        dir: crate::rank::cut_input(&dir.display().to_string()).into_owned(),
        reason: err.to_string(),
    })?);
    let description = describe(&index);
    let old = state.swap_index(Arc::clone(&index));
    // The posting cache loads the new index now rather than on the first GPU query (it would
    // reload then anyway: it keys by the index's generation, so it never serves the old lists).
    {
        let state = Arc::clone(&state);
        tokio::task::spawn_blocking(move || state.select.prepare(&index))
            .await
            .map_err(ApiError::internal)?;
    }
    tracing::info!(
        dir = %dir.display(),
        docs = description.docs,
        replaced = %old.as_ref().map_or("none".into(), |o| o.dir().display().to_string()),
        "index reloaded"
    );
    Ok(Reply(format, description))
}

fn describe(index: &Index) -> IndexDescription {
    let manifest = index.manifest();
    IndexDescription {
        dir: index.dir().to_path_buf(),
        docs: manifest.num_docs,
        terms: manifest.num_terms,
        codec: manifest.codec.name().into(),
        scoring: manifest.scoring.clone(),
        forward: index.has_forward(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::Mode;

    fn request(query: Option<&str>, terms: Option<&[&str]>) -> SearchRequest {
        SearchRequest {
            query: query.map(str::to_string),
            terms: terms.map(|t| t.iter().map(|s| s.to_string()).collect()),
            k: 10,
            candidates: 1000,
            mode: Mode::And,
            ranker: None,
            backend: None,
            explain: false,
            timeout_ms: None,
        }
    }

    #[test]
    fn query_text_is_tokenized_and_terms_are_taken_as_given() {
        let text = request(Some("The Kitchen; ranking!"), None);
        assert_eq!(query_terms(&text).unwrap(), ["the", "kitchen", "ranking"]);
        let terms = request(None, Some(&["The", "x y"]));
        assert_eq!(query_terms(&terms).unwrap(), ["The", "x y"]);
        assert_eq!(
            query_terms(&request(Some(""), None)).unwrap(),
            Vec::<String>::new()
        );
        assert!(query_terms(&request(Some("a"), Some(&["a"]))).is_err());
        assert!(query_terms(&request(None, None)).is_err());
        let most = vec!["t"; MAX_QUERY_TERMS];
        assert_eq!(
            query_terms(&request(None, Some(&most))).unwrap().len(),
            MAX_QUERY_TERMS
        );
        let text = "t ".repeat(MAX_QUERY_TERMS + 1);
        assert_eq!(
            query_terms(&request(Some(&text), None))
                .unwrap_err()
                .to_string(),
            "the query has 1025 terms, at most 1024 are accepted"
        );
    }

    #[test]
    fn a_passed_deadline_is_exceeded_and_none_never_is() {
        let passed = Deadline {
            at: Some(Instant::now()),
            timeout_ms: Some(0),
        };
        assert!(matches!(
            passed.check(),
            Err(ApiError::DeadlineExceeded { timeout_ms: 0 })
        ));
        let none = Deadline {
            at: None,
            timeout_ms: None,
        };
        assert!(none.check().is_ok());
    }
}
