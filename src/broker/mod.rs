//! The broker: `rankserve serve --broker shards.toml` answers `/v1/search` by fanning it out to
//! shard servers over HTTP/MessagePack (`docs/deploy.md`, "Shards").
//!
//! This module owns the shard list (the TOML file), the calls to the shards (concurrent, each
//! within the per-shard timeout and the request's deadline, pooled keep-alive connections) and
//! the merge of their answers ([`merge`]); the `/v1/search` handler's broker side
//! (`server::broker`) chains them: the collection's statistics for the query's terms from every
//! shard (`POST /v1/shard/stats`), then the search with them (`POST /v1/shard/search`).

pub mod merge;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::api::Format;

/// Per-shard timeout when the shard list names none.
pub const DEFAULT_SHARD_TIMEOUT_MS: u64 = 2000;

/// The shard list, `shards.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShardsFile {
    /// The longest one shard may take to answer one call, in milliseconds.
    #[serde(default)]
    timeout_ms: Option<u64>,
    shards: Vec<ShardEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShardEntry {
    /// Its name in replies and metrics [default: its URL].
    #[serde(default)]
    name: Option<String>,
    /// `http://host:port` of its `rankserve serve`.
    url: String,
}

/// Why a shard list was refused.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot read the shard list {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("shard list {path}: {reason}")]
    Invalid {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// One shard server.
#[derive(Debug, Clone)]
pub struct Shard {
    pub name: String,
    /// Its base URL, without a trailing `/`.
    base: String,
}

/// How one call to one shard ended.
#[derive(Debug)]
pub enum Outcome<T> {
    /// A 2xx reply that decoded.
    Answered(T),
    /// A 4xx reply: the request's fault, which every shard would find.
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    /// No usable answer: a timeout, a connection error, a 5xx, a body that did not decode.
    Missing(String),
}

/// The broker: its shards and the HTTP client that calls them.
pub struct Broker {
    shards: Vec<Shard>,
    timeout: Duration,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Broker {
    /// The broker of the shard list at `path`.
    ///
    /// # Errors
    /// [`BrokerError::Read`] when the file does not read; [`BrokerError::Invalid`] when it is not
    /// TOML of the documented keys, lists no shard, names a shard twice, or has a URL that is
    /// not `http://host:port`.
    pub fn open(path: &Path) -> Result<Broker, BrokerError> {
        let text = std::fs::read_to_string(path).map_err(|source| BrokerError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |reason: String| BrokerError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let file: ShardsFile = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let shards = (file.shards.into_iter())
            .map(|entry| {
                let base = entry.url.trim_end_matches('/').to_string();
                match base.parse::<hyper::Uri>() {
                    Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
                    _ => return Err(format!("shard URL {:?} is not http://host:port", entry.url)),
                }
                Ok(Shard {
                    name: entry.name.unwrap_or_else(|| base.clone()),
                    base,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        let timeout = Duration::from_millis(file.timeout_ms.unwrap_or(DEFAULT_SHARD_TIMEOUT_MS));
        Broker::new(shards, timeout).map_err(invalid)
    }

    /// The broker of `shards` (name, base URL), each call bounded by `timeout`.
    ///
    /// # Errors
    /// No shard, or a name given twice.
    fn new(shards: Vec<Shard>, timeout: Duration) -> Result<Broker, String> {
        if shards.is_empty() {
            return Err("no shard listed: give [[shards]] entries with a url".into());
        }
        for (i, shard) in shards.iter().enumerate() {
            if shards[..i].iter().any(|s| s.name == shard.name) {
                return Err(format!("shard name {:?} given twice", shard.name));
            }
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Broker {
            shards,
            timeout,
            client,
        })
    }

    /// The shards, in the list's order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The per-shard timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// POSTs `body` (MessagePack) to `path` on each shard of `which` (indices into
    /// [`Broker::shards`]) at once; each call ends within the per-shard timeout and `deadline`.
    /// Outcomes in `which`'s order; each call is counted and timed under `phase`.
    pub async fn fan_out<Req: Serialize, Resp: DeserializeOwned + Send + 'static>(
        &self,
        which: &[usize],
        path: &str,
        phase: &'static str,
        body: &Req,
        deadline: Option<Instant>,
    ) -> Vec<Outcome<Resp>> {
        let body = match Format::Msgpack.encode(body) {
            Ok(bytes) => Bytes::from(bytes),
            Err(err) => {
                let reason = format!("request did not encode: {err}");
                return which
                    .iter()
                    .map(|_| Outcome::Missing(reason.clone()))
                    .collect();
            }
        };
        let limit = match deadline {
            Some(at) => self
                .timeout
                .min(at.saturating_duration_since(Instant::now())),
            None => self.timeout,
        };
        let calls: Vec<_> = (which.iter())
            .map(|&i| {
                let name = self.shards[i].name.clone();
                let url = format!("{}{path}", self.shards[i].base);
                let call = call::<Resp>(self.client.clone(), url, body.clone());
                tokio::spawn(async move {
                    let started = Instant::now();
                    let outcome = match tokio::time::timeout(limit, call).await {
                        Ok(outcome) => outcome,
                        Err(_) => {
                            Outcome::Missing(format!("no answer within {} ms", limit.as_millis()))
                        }
                    };
                    record(&name, phase, &outcome, started.elapsed());
                    outcome
                })
            })
            .collect();
        let mut outcomes = Vec::with_capacity(calls.len());
        for call in calls {
            outcomes.push(
                call.await
                    .unwrap_or_else(|err| Outcome::Missing(format!("call failed: {err}"))),
            );
        }
        outcomes
    }
}

/// Counts and times one call (`docs/api.md`, "Metrics").
fn record<T>(shard: &str, phase: &'static str, outcome: &Outcome<T>, took: Duration) {
    let outcome = match outcome {
        Outcome::Answered(_) => "ok",
        Outcome::Refused { .. } => "refused",
        Outcome::Missing(_) => "missing",
    };
    metrics::counter!("rankserve_broker_shard_calls_total", "shard" => shard.to_string(), "phase" => phase, "outcome" => outcome)
        .increment(1);
    metrics::histogram!("rankserve_broker_shard_seconds", "shard" => shard.to_string(), "phase" => phase)
        .record(took.as_secs_f64());
}

/// The error body of a shard's reply.
#[derive(Deserialize)]
struct ErrorReply {
    error: ErrorFields,
}

#[derive(Deserialize)]
struct ErrorFields {
    code: String,
    message: String,
}

/// One POST of `body` to `url`, its reply decoded.
async fn call<Resp: DeserializeOwned>(
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
    body: Bytes,
) -> Outcome<Resp> {
    let request = hyper::Request::post(url)
        .header(header::CONTENT_TYPE, Format::Msgpack.content_type())
        .header(header::ACCEPT, Format::Msgpack.content_type())
        .body(Full::new(body));
    let request = match request {
        Ok(request) => request,
        Err(err) => return Outcome::Missing(format!("bad request URL: {err}")),
    };
    let response = match client.request(request).await {
        Ok(response) => response,
        Err(err) => return Outcome::Missing(format!("request failed: {err}")),
    };
    let status = response.status();
    let bytes = match response.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(err) => return Outcome::Missing(format!("reply cut short: {err}")),
    };
    let format = Format::Msgpack;
    if status.is_success() {
        return match format.decode::<Resp>(&bytes) {
            Ok(value) => Outcome::Answered(value),
            Err(err) => Outcome::Missing(format!("reply did not decode: {err}")),
        };
    }
    let (code, message) = match format.decode::<ErrorReply>(&bytes) {
        Ok(reply) => (reply.error.code, reply.error.message),
        Err(_) => ("unknown".into(), format!("HTTP {status}")),
    };
    match status.is_client_error() {
        true => Outcome::Refused {
            status: status.as_u16(),
            code,
            message,
        },
        false => Outcome::Missing(format!("HTTP {} {code}: {message}", status.as_u16())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(text: &str) -> Result<Broker, BrokerError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shards.toml");
        std::fs::write(&path, text).unwrap();
        Broker::open(&path)
    }

    #[test]
    fn a_shard_list_reads_with_names_urls_and_timeout() {
        let broker = open(
            "timeout_ms = 250\n[[shards]]\nurl = \"http://a:1/\"\n[[shards]]\nname = \"b\"\nurl = \"http://b:2\"\n",
        )
        .unwrap();
        let names: Vec<_> = broker.shards().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["http://a:1", "b"]);
        assert_eq!(broker.shards()[0].base, "http://a:1");
        assert_eq!(broker.timeout(), Duration::from_millis(250));
    }

    #[test]
    fn bad_shard_lists_are_refused_saying_why() {
        for (text, why) in [
            ("shards = []", "no shard listed"),
            ("[[shards]]\nurl = \"ftp://a\"", "is not http://host:port"),
            (
                "[[shards]]\nurl = \"http://a:1\"\n[[shards]]\nurl = \"http://a:1\"",
                "given twice",
            ),
            (
                "[[shards]]\nurl = \"http://a:1\"\nport = 3",
                "unknown field",
            ),
        ] {
            let err = open(text).err().expect(text).to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
    }
}
