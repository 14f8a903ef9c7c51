//! What a replay counts as the answers come in ([`Tally`]) and what it reports
//! ([`ReplayReport`]): the client's latency, the server's own timings read from the replies,
//! which backends ran, and errors by status.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::log::{Endpoint, RequestLog};
use crate::api::{Format, RankResponse, SearchResponse};

/// What a replay measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    pub url: String,
    /// Where the log's requests went (`/v1/rank` or `/v1/search`).
    #[serde(default)]
    pub endpoint: Endpoint,
    pub load: String,
    pub duration_s: f64,
    pub requests: u64,
    pub ok: u64,
    pub throughput_rps: f64,
    /// `/v1/rank`: documents ranked per second; `/v1/search`: hits returned per second.
    pub documents_per_s: f64,
    /// Client-side latency of answered requests, microseconds.
    pub latency_us: Percentiles,
    /// The server's `timings.total_us` (parsed request to reply), microseconds.
    pub server_total_us: Percentiles,
    /// The server's `timings.read_us` (receiving the request body; `/v1/rank`), microseconds.
    #[serde(default)]
    pub server_read_us: Percentiles,
    /// The server's `timings.decode_us` (decoding the request body; `/v1/rank`), microseconds.
    pub server_decode_us: Percentiles,
    /// The server's `timings.select_us` (candidate selection; `/v1/search`), microseconds.
    #[serde(default)]
    pub server_select_us: Percentiles,
    /// The server's `timings.fe_us` (feature extraction or reading the vectors), microseconds.
    pub server_fe_us: Percentiles,
    /// The server's `timings.me_us` (scoring of the request's batch), microseconds.
    pub server_me_us: Percentiles,
    /// The server's `timings.queue_us`, microseconds.
    pub server_queue_us: Percentiles,
    /// Answers by stage and the backend the reply says ran it: `rank` (`cpu`, `gpu`; `none`
    /// for a search without a ranker) and, for `/v1/search`, `select` (`cpu`, `gpu`).
    #[serde(default)]
    pub backends: BTreeMap<String, BTreeMap<String, u64>>,
    /// Non-2xx answers by status, `"connection"` for requests with no answer, and `"client"`
    /// for closed-loop clients that could not start (a thread or runtime refused).
    pub errors: BTreeMap<String, u64>,
}

/// p50, p90, p99, p99.9 and max of a distribution, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub mean: f64,
}

impl Percentiles {
    fn of(h: &Option<hdrhistogram::Histogram<u64>>) -> Percentiles {
        let Some(h) = h.as_ref().filter(|h| !h.is_empty()) else {
            return Percentiles::default();
        };
        Percentiles {
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: h.mean(),
        }
    }
}

impl ReplayReport {
    /// A plain-text table: the client's latency, then the server's timings that the
    /// endpoint's replies carry.
    pub fn table(&self) -> String {
        let (counted, server_rows) = match self.endpoint {
            Endpoint::Rank => (
                "docs/s",
                vec![
                    ("server total", &self.server_total_us),
                    ("server body read", &self.server_read_us),
                    ("server decode", &self.server_decode_us),
                    ("server FE", &self.server_fe_us),
                    ("server scoring (me)", &self.server_me_us),
                    ("server queue", &self.server_queue_us),
                ],
            ),
            Endpoint::Search => (
                "hits/s",
                vec![
                    ("server total", &self.server_total_us),
                    ("server select", &self.server_select_us),
                    ("server FE", &self.server_fe_us),
                    ("server scoring (me)", &self.server_me_us),
                    ("server queue", &self.server_queue_us),
                ],
            ),
        };
        let mut out = format!(
            "{}{} ({}), {:.1} s: {} requests, {} ok, {:.1} req/s, {:.0} {counted}\n",
            self.url,
            self.endpoint.path(),
            self.load,
            self.duration_s,
            self.requests,
            self.ok,
            self.throughput_rps,
            self.documents_per_s
        );
        out += &format!(
            "{:<22}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}\n",
            "µs", "p50", "p90", "p99", "p99.9", "max", "mean"
        );
        for (name, p) in [("client latency", &self.latency_us)]
            .into_iter()
            .chain(server_rows)
        {
            out += &format!(
                "{name:<22}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10.0}\n",
                p.p50, p.p90, p.p99, p.p999, p.max, p.mean
            );
        }
        if !self.backends.is_empty() {
            let stages: Vec<String> = self
                .backends
                .iter()
                .map(|(stage, counts)| {
                    let counts: Vec<String> =
                        counts.iter().map(|(b, n)| format!("{b} {n}")).collect();
                    format!("{stage} {}", counts.join(", "))
                })
                .collect();
            out += &format!("backends: {}\n", stages.join("; "));
        }
        if self.errors.is_empty() {
            out += "errors: none\n";
        } else {
            for (status, n) in &self.errors {
                out += &format!("errors {status}: {n}\n");
            }
        }
        out
    }
}

/// A 2xx reply's body, read as its endpoint's reply type.
pub(super) enum Reply {
    Rank(RankResponse),
    Search(SearchResponse),
}

impl Reply {
    /// `body` as `endpoint`'s reply in `format`; `None` when it does not decode as one.
    fn read(endpoint: Endpoint, format: Format, body: &[u8]) -> Option<Reply> {
        match endpoint {
            Endpoint::Rank => format.decode(body).ok().map(Reply::Rank),
            Endpoint::Search => format.decode(body).ok().map(Reply::Search),
        }
    }
}

/// What came back for one request: its status and body, or nothing (no answer on the
/// connection).
pub(super) type Answer = Option<(hyper::StatusCode, Result<Bytes, hyper::Error>)>;

/// How one request ended, as the tally counts it.
pub(super) enum Outcome {
    /// A 2xx reply, with its timings when it parses as its endpoint's reply.
    Answered(Duration, Option<Reply>),
    Status(hyper::StatusCode),
    /// No answer on the connection.
    Lost,
}

impl Outcome {
    /// Reads `answer` to a request of `log`, taken `latency` after the request was due
    /// (replies come in the log's format).
    pub(super) fn of(log: &RequestLog, latency: Duration, answer: Answer) -> Outcome {
        match answer {
            Some((status, Ok(body))) if status.is_success() => {
                Outcome::Answered(latency, Reply::read(log.endpoint, log.format, &body))
            }
            Some((status, _)) => Outcome::Status(status),
            None => Outcome::Lost,
        }
    }
}

/// The counts and distributions of a replay so far.
#[derive(Default)]
pub(super) struct Tally {
    latency: Option<hdrhistogram::Histogram<u64>>,
    total: Option<hdrhistogram::Histogram<u64>>,
    read: Option<hdrhistogram::Histogram<u64>>,
    decode: Option<hdrhistogram::Histogram<u64>>,
    select: Option<hdrhistogram::Histogram<u64>>,
    fe: Option<hdrhistogram::Histogram<u64>>,
    me: Option<hdrhistogram::Histogram<u64>>,
    queue: Option<hdrhistogram::Histogram<u64>>,
    requests: u64,
    ok: u64,
    documents: u64,
    backends: BTreeMap<String, BTreeMap<String, u64>>,
    errors: BTreeMap<String, u64>,
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    // 1 µs to 100 s, 3 significant digits: the bounds are constant and valid.
    hdrhistogram::Histogram::new_with_bounds(1, 100_000_000, 3).expect("constant histogram bounds")
}

/// Records `v` (0 included: a stage that did not run, such as FE in a search without a
/// ranker, reads 0, not 1), capped at the histogram's top.
fn add(h: &mut Option<hdrhistogram::Histogram<u64>>, v: u64) {
    let _ = h.get_or_insert_with(histogram).record(v.min(100_000_000));
}

impl Tally {
    /// Counts a closed-loop client whose thread or runtime did not start: its requests are
    /// missing from the load, which the report says instead of hiding.
    pub(super) fn client_failed(&mut self) {
        *self.errors.entry("client".to_string()).or_insert(0) += 1;
    }

    /// Counts one answer of `stage` run by `backend`.
    fn ran(&mut self, stage: &str, backend: &str) {
        *self
            .backends
            .entry(stage.to_string())
            .or_default()
            .entry(backend.to_string())
            .or_insert(0) += 1;
    }

    pub(super) fn record(&mut self, outcome: Outcome) {
        self.requests += 1;
        match outcome {
            Outcome::Answered(latency, reply) => {
                self.ok += 1;
                add(&mut self.latency, latency.as_micros() as u64);
                match reply {
                    Some(Reply::Rank(reply)) => {
                        let t = reply.timings;
                        self.documents += reply.scores.len() as u64;
                        add(&mut self.total, t.total_us);
                        add(&mut self.read, t.read_us);
                        add(&mut self.decode, t.decode_us);
                        add(&mut self.fe, t.fe_us);
                        add(&mut self.me, t.me_us);
                        add(&mut self.queue, t.queue_us);
                        self.ran("rank", &reply.backend);
                    }
                    Some(Reply::Search(reply)) => {
                        let t = reply.timings;
                        self.documents += reply.hits.len() as u64;
                        add(&mut self.total, t.total_us);
                        add(&mut self.select, t.select_us);
                        add(&mut self.fe, t.fe_us);
                        add(&mut self.me, t.me_us);
                        add(&mut self.queue, t.queue_us);
                        self.ran("select", &reply.backends.select);
                        self.ran("rank", &reply.backends.rank);
                    }
                    None => {}
                }
            }
            Outcome::Status(status) => {
                *self.errors.entry(status.as_u16().to_string()).or_insert(0) += 1;
            }
            Outcome::Lost => *self.errors.entry("connection".to_string()).or_insert(0) += 1,
        }
    }

    /// The report of a replay of `endpoint` requests against `url` under `load` that ran
    /// `elapsed_s` seconds.
    pub(super) fn report(
        self,
        url: &str,
        endpoint: Endpoint,
        load: String,
        elapsed_s: f64,
    ) -> ReplayReport {
        ReplayReport {
            url: url.to_string(),
            endpoint,
            load,
            duration_s: elapsed_s,
            requests: self.requests,
            ok: self.ok,
            throughput_rps: self.ok as f64 / elapsed_s,
            documents_per_s: self.documents as f64 / elapsed_s,
            latency_us: Percentiles::of(&self.latency),
            server_total_us: Percentiles::of(&self.total),
            server_read_us: Percentiles::of(&self.read),
            server_decode_us: Percentiles::of(&self.decode),
            server_select_us: Percentiles::of(&self.select),
            server_fe_us: Percentiles::of(&self.fe),
            server_me_us: Percentiles::of(&self.me),
            server_queue_us: Percentiles::of(&self.queue),
            backends: self.backends,
            errors: self.errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SearchBackends, SearchHit, SearchTimings};

    fn search_log() -> RequestLog {
        RequestLog {
            format: Format::Json,
            endpoint: Endpoint::Search,
            bodies: vec![Bytes::from_static(b"{}")],
        }
    }

    fn search_reply(select_us: u64, total_us: u64, select: &str) -> Bytes {
        let reply = SearchResponse {
            hits: vec![SearchHit {
                doc: 3,
                id: "d3".into(),
                score: Some(1.5),
                selection_score: 1.5,
                explain: None,
            }],
            timings: SearchTimings {
                select_us,
                fe_us: 0,
                mit_us: None,
                me_us: 0,
                queue_us: 0,
                total_us,
            },
            backends: SearchBackends {
                select: select.into(),
                rank: "none".into(),
            },
            shards: None,
        };
        Bytes::from(serde_json::to_vec(&reply).unwrap())
    }

    #[test]
    fn search_replies_are_tallied_with_their_timings_and_backends() {
        let log = search_log();
        let mut tally = Tally::default();
        let ok = hyper::StatusCode::OK;
        for (select_us, total_us, select) in [(10, 40, "cpu"), (20, 50, "cpu"), (30, 90, "gpu")] {
            let answer = Some((ok, Ok(search_reply(select_us, total_us, select))));
            tally.record(Outcome::of(&log, Duration::from_micros(100), answer));
        }
        let refused = Some((hyper::StatusCode::BAD_REQUEST, Ok(Bytes::new())));
        tally.record(Outcome::of(&log, Duration::from_micros(5), refused));
        tally.record(Outcome::of(&log, Duration::from_micros(5), None));
        let report = tally.report("http://h:1", Endpoint::Search, "concurrency 1".into(), 2.0);
        assert_eq!((report.requests, report.ok), (5, 3));
        assert_eq!(report.documents_per_s, 1.5);
        assert_eq!(report.server_select_us.p50, 20);
        assert_eq!(report.server_select_us.max, 30);
        assert_eq!(report.server_total_us.p99, 90);
        assert_eq!(report.server_decode_us, Percentiles::default());
        assert_eq!(
            (report.server_fe_us.max, report.server_fe_us.mean),
            (0, 0.0)
        );
        assert_eq!(report.backends["select"]["cpu"], 2);
        assert_eq!(report.backends["select"]["gpu"], 1);
        assert_eq!(report.backends["rank"]["none"], 3);
        assert_eq!(report.errors["400"], 1);
        assert_eq!(report.errors["connection"], 1);
        let table = report.table();
        assert!(
            table.starts_with("http://h:1/v1/search (concurrency 1), 2.0 s: 5 requests, 3 ok, 1.5 req/s, 2 hits/s\n"),
            "{table}"
        );
        assert!(table.contains("\nserver select "), "{table}");
        assert!(!table.contains("server decode"), "{table}");
        assert!(
            table.contains("\nbackends: rank none 3; select cpu 2, gpu 1\n"),
            "{table}"
        );
    }
}
