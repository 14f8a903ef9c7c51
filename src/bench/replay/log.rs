//! Request logs: `/v1/rank` or `/v1/search` request bodies, as concatenated MessagePack objects
//! (`.msgpack`) or JSON Lines (`.jsonl`), read back exactly as written, and the logs
//! `rankserve requests synth` and `rankserve requests search` write.

use std::io::Cursor;
use std::path::Path;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::api::{FeatureValues, Format, RankDocument, RankRequest, SearchRequest};
use crate::rank::fe::{synth_corpus_stats, synth_hit_documents, synth_query, FeatureResolver};
use crate::rank::model::Ranker;

/// Why a request log could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: request {index} (at byte {offset}) does not parse: {reason}")]
    Parse {
        path: String,
        index: usize,
        offset: u64,
        reason: String,
    },
    #[error("{path}: the log holds no request")]
    Empty { path: String },
}

/// The endpoint a log's requests are sent to.
///
/// It is read from the requests themselves rather than given beside the log: a `/v1/rank`
/// body and a `/v1/search` body cannot be taken for each other (both types refuse unknown
/// fields, a rank request needs `ranker` and `documents`, and `documents` is no search field),
/// so a log is never sent to the wrong endpoint to be answered with 400s under load, and one
/// that mixes both kinds is refused when it is read, naming the first request of the other kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Endpoint {
    #[default]
    #[serde(rename = "/v1/rank")]
    Rank,
    #[serde(rename = "/v1/search")]
    Search,
}

impl Endpoint {
    /// The request target, from the server's root.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Rank => "/v1/rank",
            Endpoint::Search => "/v1/search",
        }
    }

    /// Parses the request at the start of `bytes` (a whole JSON line, or the MessagePack object
    /// `bytes` begins with) as this endpoint's request type; returns its length in bytes.
    fn parse(self, format: Format, bytes: &[u8]) -> Result<usize, String> {
        match self {
            Endpoint::Rank => parse_request::<RankRequest>(format, bytes),
            Endpoint::Search => parse_request::<SearchRequest>(format, bytes),
        }
    }
}

fn parse_request<T: DeserializeOwned>(format: Format, bytes: &[u8]) -> Result<usize, String> {
    match format {
        Format::Json => serde_json::from_slice::<T>(bytes)
            .map(|_| bytes.len())
            .map_err(|e| e.to_string()),
        Format::Msgpack => {
            let mut de = rmp_serde::Deserializer::new(Cursor::new(bytes));
            T::deserialize(&mut de)
                .map(|_| de.position() as usize)
                .map_err(|e| e.to_string())
        }
    }
}

/// Parses the request at the start of `bytes` as `endpoint`'s type once the log's first
/// request has decided it, else as either type (the one that parses decides); returns its
/// length in bytes.
fn parse_next(
    endpoint: &mut Option<Endpoint>,
    format: Format,
    bytes: &[u8],
) -> Result<usize, String> {
    if let Some(decided) = *endpoint {
        return decided.parse(format, bytes).map_err(|reason| {
            format!(
                "as a {} request, as the log's first is: {reason}",
                decided.path()
            )
        });
    }
    let mut reasons = Vec::new();
    for candidate in [Endpoint::Rank, Endpoint::Search] {
        match candidate.parse(format, bytes) {
            Ok(len) => {
                *endpoint = Some(candidate);
                return Ok(len);
            }
            Err(reason) => reasons.push(format!("as a {} request: {reason}", candidate.path())),
        }
    }
    Err(reasons.join("; "))
}

/// A request log in memory: each request's body, exactly as logged, and where they go.
#[derive(Debug, Clone)]
pub struct RequestLog {
    pub format: Format,
    pub endpoint: Endpoint,
    pub bodies: Vec<Bytes>,
}

impl RequestLog {
    /// Reads a log; every request must parse as the request type of the first's endpoint
    /// ([`Endpoint`]).
    ///
    /// # Errors
    /// [`LogError`] naming the request's index and byte offset.
    pub fn read(path: &Path) -> Result<RequestLog, LogError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LogError::Io {
            path: shown.clone(),
            source,
        })?;
        let format = Format::of_log(path);
        let mut endpoint = None;
        let mut bodies = Vec::new();
        let bytes = Bytes::from(bytes);
        let parse = |index: usize, offset: u64, reason: String| LogError::Parse {
            path: shown.clone(),
            index,
            offset,
            reason,
        };
        match format {
            Format::Json => {
                let mut offset = 0u64;
                for line in bytes.split(|&b| b == b'\n') {
                    if !line.iter().all(u8::is_ascii_whitespace) {
                        parse_next(&mut endpoint, format, line)
                            .map_err(|reason| parse(bodies.len(), offset, reason))?;
                        bodies.push(bytes.slice_ref(line));
                    }
                    offset += line.len() as u64 + 1;
                }
            }
            Format::Msgpack => {
                let mut start = 0usize;
                while start < bytes.len() {
                    let len = parse_next(&mut endpoint, format, &bytes[start..])
                        .map_err(|reason| parse(bodies.len(), start as u64, reason))?;
                    bodies.push(bytes.slice(start..start + len));
                    start += len;
                }
            }
        }
        let Some(endpoint) = endpoint else {
            return Err(LogError::Empty { path: shown });
        };
        Ok(RequestLog {
            format,
            endpoint,
            bodies,
        })
    }

    /// Writes `requests` (`/v1/rank` or `/v1/search` requests) as a log at `path` (its format
    /// by extension).
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn write<T: Serialize>(path: &Path, requests: &[T]) -> Result<(), LogError> {
        let format = Format::of_log(path);
        let mut out = Vec::new();
        for request in requests {
            let frame = format.encode(request).map_err(|e| LogError::Io {
                path: path.display().to_string(),
                source: std::io::Error::other(e),
            })?;
            out.extend_from_slice(&frame);
            if format == Format::Json {
                out.push(b'\n');
            }
        }
        std::fs::write(path, out).map_err(|source| LogError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

/// One `/v1/search` request per query, in order: `template` with `query` set to it.
pub fn search_requests(queries: &[String], template: &SearchRequest) -> Vec<SearchRequest> {
    queries
        .iter()
        .map(|query| SearchRequest {
            query: Some(query.clone()),
            ..template.clone()
        })
        .collect()
}

/// Production-like `/v1/rank` requests for `ranker` (store name `name`): hit documents (several
/// streams, Zipf-distributed positions, from `fe::synth_hit_documents`) when every feature of
/// the ranker comes from the FE catalogue, else feature vectors (about 5 % missing values,
/// the rest drawn from a log-normal spread, as counts and scores are).
pub fn synth_requests(
    name: &str,
    ranker: &Ranker,
    docs: usize,
    count: usize,
    k: Option<usize>,
    seed: u64,
) -> Vec<RankRequest> {
    let hits = FeatureResolver::new(&ranker.features).is_ok();
    let width = ranker.features.len();
    (0..count)
        .map(|i| {
            let seed = seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(i as u64);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let (documents, query, stats) = if hits {
                let terms = rng.random_range(2..=5);
                let documents = synth_hit_documents(docs, terms, seed)
                    .into_iter()
                    .map(|h| RankDocument {
                        id: h.id.clone(),
                        features: None,
                        hits: Some(h),
                    })
                    .collect();
                (
                    documents,
                    Some(synth_query(terms, seed)),
                    Some(synth_corpus_stats()),
                )
            } else {
                let documents = (0..docs)
                    .map(|d| RankDocument {
                        id: Some(format!("q{i}d{d}")),
                        features: Some(FeatureValues::Vector(
                            (0..width)
                                .map(|_| {
                                    (rng.random::<f64>() >= 0.05).then(|| {
                                        (rng.random::<f64>() * 2.0 - 1.0).exp()
                                            * rng.random_range(0.0..4.0)
                                    })
                                })
                                .collect(),
                        )),
                        hits: None,
                    })
                    .collect();
                (documents, None, None)
            };
            RankRequest {
                ranker: name.to_string(),
                documents,
                query,
                stats,
                k,
                backend: None,
                explain: false,
                timeout_ms: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::rank::model::Input;
    use crate::select::Mode;

    fn ranker(features: Vec<String>) -> Ranker {
        Ranker {
            inputs: vec![Input::Linear {
                feature: 0,
                slope: 1.0,
                intercept: 0.0,
            }],
            features,
            layers: Vec::new(),
            ensemble: None,
        }
    }

    fn search_template() -> SearchRequest {
        SearchRequest {
            query: None,
            terms: None,
            k: 7,
            candidates: 100,
            mode: Mode::Or,
            ranker: Some("small".into()),
            backend: Some(Backend::Cpu),
            explain: false,
            timeout_ms: None,
        }
    }

    #[test]
    fn logs_round_trip_in_both_formats() {
        let dir = tempfile::tempdir().unwrap();
        let requests = synth_requests("r", &ranker(vec!["x".into(), "y".into()]), 3, 5, Some(2), 1);
        assert!(requests
            .iter()
            .all(|r| r.documents.iter().all(|d| d.features.is_some())));
        for name in ["log.msgpack", "log.jsonl"] {
            let path = dir.path().join(name);
            RequestLog::write(&path, &requests).unwrap();
            let log = RequestLog::read(&path).unwrap();
            assert_eq!(log.endpoint, Endpoint::Rank);
            assert_eq!(log.bodies.len(), 5);
            let back: Vec<RankRequest> = log
                .bodies
                .iter()
                .map(|b| log.format.decode(b).unwrap())
                .collect();
            assert_eq!(back, requests);
        }
    }

    #[test]
    fn search_logs_round_trip_in_both_formats() {
        let dir = tempfile::tempdir().unwrap();
        let queries = ["ranking lists".to_string(), "a".into(), "x y z".into()];
        let requests = search_requests(&queries, &search_template());
        assert_eq!(requests[1].query.as_deref(), Some("a"));
        assert_eq!(requests[2].ranker.as_deref(), Some("small"));
        for name in ["log.msgpack", "log.jsonl"] {
            let path = dir.path().join(name);
            RequestLog::write(&path, &requests).unwrap();
            let log = RequestLog::read(&path).unwrap();
            assert_eq!(log.endpoint, Endpoint::Search, "{name}");
            let back: Vec<SearchRequest> = log
                .bodies
                .iter()
                .map(|b| log.format.decode(b).unwrap())
                .collect();
            assert_eq!(back, requests, "{name}");
        }
    }

    #[test]
    fn catalogue_rankers_get_hit_documents() {
        let features = crate::rank::fe::feature_names()[..3].to_vec();
        let requests = synth_requests("r", &ranker(features), 4, 2, None, 9);
        assert!(requests
            .iter()
            .all(|r| r.query.is_some() && r.documents.iter().all(|d| d.hits.is_some())));
        assert_eq!(
            requests,
            synth_requests(
                "r",
                &ranker(crate::rank::fe::feature_names()[..3].to_vec()),
                4,
                2,
                None,
                9
            )
        );
    }

    #[test]
    fn a_bad_frame_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.jsonl");
        std::fs::write(
            &path,
            "{\"ranker\": \"r\", \"documents\": []}\n{\"ranker\": 3}\n",
        )
        .unwrap();
        let err = RequestLog::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("request 1 (at byte 33) does not parse: as a /v1/rank request, as the log's first is: "),
            "{err}"
        );
    }

    #[test]
    fn a_search_request_in_a_rank_log_is_named_in_either_format() {
        let dir = tempfile::tempdir().unwrap();
        let rank = synth_requests("r", &ranker(vec!["x".into()]), 1, 2, None, 1);
        let search = search_requests(&["q".to_string()], &search_template());
        for name in ["mixed.msgpack", "mixed.jsonl"] {
            let path = dir.path().join(name);
            let format = Format::of_log(&path);
            let mut bytes = Vec::new();
            let mut offsets = Vec::new();
            for frame in [
                format.encode(&rank[0]).unwrap(),
                format.encode(&rank[1]).unwrap(),
                format.encode(&search[0]).unwrap(),
            ] {
                offsets.push(bytes.len());
                bytes.extend_from_slice(&frame);
                if format == Format::Json {
                    bytes.push(b'\n');
                }
            }
            std::fs::write(&path, bytes).unwrap();
            let err = RequestLog::read(&path).unwrap_err().to_string();
            let want = format!(
                "{}: request 2 (at byte {}) does not parse: as a /v1/rank request, as the log's first is: ",
                path.display(),
                offsets[2]
            );
            assert!(err.starts_with(&want), "{name}: {err}");
        }
    }

    #[test]
    fn a_first_request_of_neither_kind_says_why_for_both() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("neither.jsonl");
        std::fs::write(&path, "\n{\"ranker\": \"r\", \"k\": \"ten\"}\n").unwrap();
        let err = RequestLog::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("request 0 (at byte 1) does not parse: as a /v1/rank request: ")
                && err.contains("; as a /v1/search request: "),
            "{err}"
        );
        let empty = dir.path().join("empty.msgpack");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(
            RequestLog::read(&empty).unwrap_err().to_string(),
            format!("{}: the log holds no request", empty.display())
        );
    }
}
