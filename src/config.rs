//! Configuration of `rankserve serve`: a TOML file, then `RANKSERVE_*` environment variables,
//! then command-line flags (each layer overrides the one before), validated once at start-up
//! into a [`Config`] whose errors name the key and where it came from.
//!
//! Keys (TOML name / environment variable / default):
//!
//! | key | env | default |
//! |---|---|---|
//! | `addr` | `RANKSERVE_ADDR` | `127.0.0.1:8080` |
//! | `rankers` | `RANKSERVE_RANKERS` | `rankers/` |
//! | `data_dir` | `RANKSERVE_DATA_DIR` | `.rankserve/` |
//! | `index` | `RANKSERVE_INDEX` | none (`serve` then builds or reuses the demo index `DATA_DIR/index`; not with `broker`) |
//! | `broker` | `RANKSERVE_BROKER` | none (a shard list, `shards.toml`: `/v1/search` is answered by those shards, `docs/deploy.md`) |
//! | `backend` | `RANKSERVE_BACKEND` | `auto` (`auto`, `cpu`, `gpu`) |
//! | `fe_backend` | `RANKSERVE_FE_BACKEND` | `auto` (where hit documents' features are extracted: `cpu`; `gpu`, fused with scoring on the GPU unless scoring is on the CPU; or `auto`, fused from the ranker's FE+scoring crossover on, or whenever scoring is on `gpu`, while a device is idle or the batch is large; the CPU without a GPU) |
//! | `gpus` | `RANKSERVE_GPUS` | `all` (the GPUs to use: `all` visible ones, or a list of CUDA ordinals such as `0,2`, counted after `CUDA_VISIBLE_DEVICES`) |
//! | `admin_token` | `RANKSERVE_ADMIN_TOKEN` | none (admin routes disabled) |
//! | `body_limit_bytes` | `RANKSERVE_BODY_LIMIT_BYTES` | 64 MiB |
//! | `cpu_cache_bytes` | `RANKSERVE_CPU_CACHE_BYTES` | 1 GiB |
//! | `cpu_threads` | `RANKSERVE_CPU_THREADS` | the machine's parallelism; three quarters of it when a GPU ranks (the pool then decodes and lays out requests beside the async runtime's threads; docs/benchmarks.md, "Several GPUs in one process") |
//! | `gpu_cache_bytes` | `RANKSERVE_GPU_CACHE_BYTES` | 4 GiB (device copies of rankers) |
//! | `gpu_posting_cache_bytes` | `RANKSERVE_GPU_POSTING_CACHE_BYTES` | 1 GiB (posting lists resident on the device; 0: every list copied per query) |
//! | `griffin_ratio` | `RANKSERVE_GRIFFIN_RATIO` | 4096 (AND runs on the CPU when the second shortest list is more than this many times the shortest, and hands over between steps when the next list is not resident on the GPU and more than this many times the intersection so far) |
//! | `gpu_queue_ms` | `RANKSERVE_GPU_QUEUE_MS` | 500 (the longest a `backend=gpu` selection waits for the device, busy with other queries, before it runs on the CPU) |
//! | `gpu_select_batch` | `RANKSERVE_GPU_SELECT_BATCH` | 16 (the most GPU selections that run as one batch: the queries that arrived while the device was busy; 1: each alone) |
//! | `queue_capacity` | `RANKSERVE_QUEUE_CAPACITY` | 256 requests per ranker |
//! | `batching` | `RANKSERVE_BATCHING` | `true` (requests that arrive while their ranker's batch runs are merged into the next batch; an idle engine scores a request at once; `false`: every request at once) |
//! | `max_batch_docs` | `RANKSERVE_MAX_BATCH_DOCS` | 2048 (most documents in one batch; a request of at least this many is scored alone. Measured on an H100 host, 16 cores, `auto`, medium ranker (docs/benchmarks.md, "Batching"): against 1 024, two 1 000-document requests merged gave +8 % throughput at 64 clients and +6.5 % at 16, 100-document requests +6 % at 64 clients, p99 lower. Batches are staged straight from each request's rows; before that (each batch first copied into one matrix) merging four 1 000-document requests lost 10–12 % on an H200 host) |
//! | `default_timeout_ms` | `RANKSERVE_DEFAULT_TIMEOUT_MS` | 10000 (0: none) |
//! | `body_timeout_ms` | `RANKSERVE_BODY_TIMEOUT_MS` | 30000 (the longest a client may take to send a whole request body, from its headers on; then 408 `body_timeout`) |
//! | `idle_timeout_ms` | `RANKSERVE_IDLE_TIMEOUT_MS` | 60000 (a connection closed when no complete request head arrives this long after it opened or its last reply was sent: idle keep-alive connections and slow headers) |
//! | `shutdown_grace_ms` | `RANKSERVE_SHUTDOWN_GRACE_MS` | 10000 (after SIGTERM or Ctrl-C, how long requests in flight may take to finish before their connections are dropped and the process exits) |
//! | `log_format` | `RANKSERVE_LOG_FORMAT` | `human` (`human`, `json`) |
//! | `sample_log` | `RANKSERVE_SAMPLE_LOG` | none (a `.msgpack` or `.jsonl` request log) |
//! | `sample_rate` | `RANKSERVE_SAMPLE_RATE` | 0.01 (fraction of `/v1/rank` requests recorded) |

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;

use crate::backend::Backend;

/// Where a configuration value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The TOML file at this path.
    File(PathBuf),
    /// This environment variable.
    Env(String),
    /// A command-line flag.
    Flag,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::File(path) => write!(f, "config file {}", path.display()),
            Source::Env(var) => write!(f, "environment variable {var}"),
            Source::Flag => f.write_str("command line"),
        }
    }
}

/// Why the configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The config file is not valid TOML or has an unknown key or a value of the wrong type.
    #[error("config file {path}: {reason}")]
    Toml { path: PathBuf, reason: String },
    /// A value has the wrong form or is out of range.
    #[error("{key} (from {origin}): expected {expected}, got {got:?}")]
    Invalid {
        key: &'static str,
        origin: Source,
        expected: &'static str,
        got: String,
    },
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Human,
    Json,
}

/// A value of a choice among names (`auto`, `cpu`, ...), parsed as clap spells them.
struct Named<T>(T);

impl<T: clap::ValueEnum> FromStr for Named<T> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        T::from_str(s, false).map(Named)
    }
}

/// The GPUs a server uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
    /// Every device CUDA sees.
    All,
    /// These CUDA ordinals, in this order, each once.
    Only(Vec<usize>),
}

impl Gpus {
    /// The ordinals asked for, `None` for every device.
    pub fn only(&self) -> Option<&[usize]> {
        match self {
            Gpus::All => None,
            Gpus::Only(ordinals) => Some(ordinals),
        }
    }
}

impl FromStr for Gpus {
    type Err = String;
    fn from_str(s: &str) -> Result<Gpus, String> {
        if s.trim() == "all" {
            return Ok(Gpus::All);
        }
        let mut ordinals = Vec::new();
        for part in s.split(',') {
            let ordinal: usize = part
                .trim()
                .parse()
                .map_err(|_| format!("not an ordinal: {part:?}"))?;
            if !ordinals.contains(&ordinal) {
                ordinals.push(ordinal);
            }
        }
        Ok(Gpus::Only(ordinals))
    }
}

/// Recording a sample of live `/v1/rank` requests into a request log.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// The log (`.msgpack`: concatenated MessagePack objects, `.jsonl`: JSON Lines).
    pub path: PathBuf,
    /// Fraction of requests recorded, in (0, 1]: of those whose body was read and parsed,
    /// drawn before anything else (so requests later refused, e.g. 503 `overloaded`, are
    /// recorded as a frontend sent them).
    pub rate: f64,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub addr: SocketAddr,
    pub rankers: PathBuf,
    pub data_dir: PathBuf,
    pub index: Option<PathBuf>,
    /// The shard list of a broker (`crate::broker`).
    pub broker: Option<PathBuf>,
    pub backend: Backend,
    /// Where feature extraction of hit documents runs (`rank::engine::backends`).
    pub fe_backend: Backend,
    /// The GPUs the server uses (one executor each, `gpu::executor`).
    pub gpus: Gpus,
    /// `None`: admin routes answer 403 `admin_disabled`.
    pub admin_token: Option<String>,
    pub body_limit_bytes: usize,
    pub cpu_cache_bytes: u64,
    /// `None`: decided when the CPU pool is built (`rank::engine::pool::default_threads`).
    pub cpu_threads: Option<usize>,
    /// Budget of the GPU ranker cache (device memory).
    pub gpu_cache_bytes: u64,
    /// Budget of the GPU posting cache (device memory) of the served index.
    pub gpu_posting_cache_bytes: u64,
    /// Griffin's threshold of the selection scheduler (`select::schedule`).
    pub griffin_ratio: f64,
    /// The longest a `backend=gpu` selection waits for the device before it runs on the CPU.
    pub gpu_queue_ms: u64,
    /// The most GPU selections run as one batch (`select::gpu::search_batch`).
    pub gpu_select_batch: usize,
    pub queue_capacity: usize,
    /// Batches that form under load (`rank::engine::batch`); off: every request at once.
    pub batching: bool,
    pub max_batch_docs: usize,
    /// `None`: no default deadline.
    pub default_timeout_ms: Option<u64>,
    /// The longest a request body may take to arrive, whole (not an idle timer per chunk).
    pub body_timeout_ms: u64,
    /// The longest a connection waits for a complete request head, from its opening or the
    /// end of its previous reply.
    pub idle_timeout_ms: u64,
    /// How long a shutdown waits for requests in flight before it drops their connections.
    pub shutdown_grace_ms: u64,
    pub log_format: LogFormat,
    pub sampling: Option<Sampling>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            rankers: PathBuf::from("rankers"),
            data_dir: PathBuf::from(".rankserve"),
            index: None,
            broker: None,
            backend: Backend::Auto,
            fe_backend: Backend::Auto,
            gpus: Gpus::All,
            admin_token: None,
            body_limit_bytes: 64 << 20,
            cpu_cache_bytes: 1 << 30,
            cpu_threads: None,
            gpu_cache_bytes: 4 << 30,
            gpu_posting_cache_bytes: 1 << 30,
            griffin_ratio: crate::select::schedule::DEFAULT_GRIFFIN_RATIO,
            gpu_queue_ms: 500,
            gpu_select_batch: 16,
            queue_capacity: 256,
            batching: true,
            max_batch_docs: 2048,
            default_timeout_ms: Some(10_000),
            body_timeout_ms: 30_000,
            idle_timeout_ms: 60_000,
            shutdown_grace_ms: 10_000,
            log_format: LogFormat::Human,
            sampling: None,
        }
    }
}

/// One layer of configuration: every key optional. Deserialized from the TOML file, read from
/// the environment, or filled from flags.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    pub addr: Option<String>,
    pub rankers: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub index: Option<PathBuf>,
    pub broker: Option<PathBuf>,
    pub backend: Option<String>,
    pub fe_backend: Option<String>,
    pub gpus: Option<String>,
    pub admin_token: Option<String>,
    pub body_limit_bytes: Option<String>,
    pub cpu_cache_bytes: Option<String>,
    pub cpu_threads: Option<String>,
    pub gpu_cache_bytes: Option<String>,
    pub gpu_posting_cache_bytes: Option<String>,
    pub griffin_ratio: Option<String>,
    pub gpu_queue_ms: Option<String>,
    pub gpu_select_batch: Option<String>,
    pub queue_capacity: Option<String>,
    pub batching: Option<String>,
    pub max_batch_docs: Option<String>,
    pub default_timeout_ms: Option<String>,
    pub body_timeout_ms: Option<String>,
    pub idle_timeout_ms: Option<String>,
    pub shutdown_grace_ms: Option<String>,
    pub log_format: Option<String>,
    pub sample_log: Option<PathBuf>,
    pub sample_rate: Option<String>,
}

fn toml_layer(path: &Path, text: &str) -> Result<Layer, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Toml {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut normalized = toml::Table::new();
    for (key, value) in table {
        let value = match value {
            toml::Value::Integer(i) => toml::Value::String(i.to_string()),
            toml::Value::Float(x) => toml::Value::String(x.to_string()),
            toml::Value::Boolean(b) => toml::Value::String(b.to_string()),
            other => other,
        };
        normalized.insert(key, value);
    }
    Layer::deserialize(toml::Value::Table(normalized)).map_err(|e| ConfigError::Toml {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

impl Layer {
    /// The `RANKSERVE_*` variables found by `lookup` (e.g. `|k| std::env::var(k).ok()`).
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Layer {
        Layer {
            addr: lookup("RANKSERVE_ADDR"),
            rankers: lookup("RANKSERVE_RANKERS").map(PathBuf::from),
            data_dir: lookup("RANKSERVE_DATA_DIR").map(PathBuf::from),
            index: lookup("RANKSERVE_INDEX").map(PathBuf::from),
            broker: lookup("RANKSERVE_BROKER").map(PathBuf::from),
            backend: lookup("RANKSERVE_BACKEND"),
            fe_backend: lookup("RANKSERVE_FE_BACKEND"),
            gpus: lookup("RANKSERVE_GPUS"),
            admin_token: lookup("RANKSERVE_ADMIN_TOKEN"),
            body_limit_bytes: lookup("RANKSERVE_BODY_LIMIT_BYTES"),
            cpu_cache_bytes: lookup("RANKSERVE_CPU_CACHE_BYTES"),
            cpu_threads: lookup("RANKSERVE_CPU_THREADS"),
            gpu_cache_bytes: lookup("RANKSERVE_GPU_CACHE_BYTES"),
            gpu_posting_cache_bytes: lookup("RANKSERVE_GPU_POSTING_CACHE_BYTES"),
            griffin_ratio: lookup("RANKSERVE_GRIFFIN_RATIO"),
            gpu_queue_ms: lookup("RANKSERVE_GPU_QUEUE_MS"),
            gpu_select_batch: lookup("RANKSERVE_GPU_SELECT_BATCH"),
            queue_capacity: lookup("RANKSERVE_QUEUE_CAPACITY"),
            batching: lookup("RANKSERVE_BATCHING"),
            max_batch_docs: lookup("RANKSERVE_MAX_BATCH_DOCS"),
            default_timeout_ms: lookup("RANKSERVE_DEFAULT_TIMEOUT_MS"),
            body_timeout_ms: lookup("RANKSERVE_BODY_TIMEOUT_MS"),
            idle_timeout_ms: lookup("RANKSERVE_IDLE_TIMEOUT_MS"),
            shutdown_grace_ms: lookup("RANKSERVE_SHUTDOWN_GRACE_MS"),
            log_format: lookup("RANKSERVE_LOG_FORMAT"),
            sample_log: lookup("RANKSERVE_SAMPLE_LOG").map(PathBuf::from),
            sample_rate: lookup("RANKSERVE_SAMPLE_RATE"),
        }
    }
}

/// The env variable of a key, for error messages.
fn env_name(key: &str) -> String {
    format!("RANKSERVE_{}", key.to_ascii_uppercase())
}

struct Resolver {
    config: Config,
    sample_log: Option<PathBuf>,
    sample_rate: f64,
}

impl Resolver {
    fn apply(&mut self, layer: Layer, source: &dyn Fn(&str) -> Source) -> Result<(), ConfigError> {
        fn parse<T: FromStr>(
            key: &'static str,
            value: &str,
            expected: &'static str,
            source: &dyn Fn(&str) -> Source,
            ok: impl Fn(&T) -> bool,
        ) -> Result<T, ConfigError> {
            match value.trim().parse::<T>() {
                Ok(v) if ok(&v) => Ok(v),
                _ => Err(ConfigError::Invalid {
                    key,
                    origin: source(key),
                    expected,
                    got: value.to_string(),
                }),
            }
        }
        let c = &mut self.config;
        if let Some(v) = layer.addr {
            c.addr = parse(
                "addr",
                &v,
                "a socket address like 127.0.0.1:8080",
                source,
                |_| true,
            )?;
        }
        if let Some(v) = layer.rankers {
            c.rankers = v;
        }
        if let Some(v) = layer.data_dir {
            c.data_dir = v;
        }
        if let Some(v) = layer.index {
            c.index = Some(v);
        }
        if let Some(v) = layer.broker {
            c.broker = Some(v);
        }
        if let Some(v) = layer.backend {
            c.backend = parse("backend", &v, "one of auto, cpu, gpu", source, |_| true)
                .map(|Named(backend)| backend)?;
        }
        if let Some(v) = layer.fe_backend {
            c.fe_backend = parse("fe_backend", &v, "one of auto, cpu, gpu", source, |_| true)
                .map(|Named(backend)| backend)?;
        }
        if let Some(v) = layer.gpus {
            c.gpus = parse(
                "gpus",
                &v,
                "all, or CUDA device ordinals like 0,1",
                source,
                |_| true,
            )?;
        }
        if let Some(v) = layer.admin_token {
            if v.is_empty() {
                return Err(ConfigError::Invalid {
                    key: "admin_token",
                    origin: source("admin_token"),
                    expected: "a non-empty token",
                    got: v,
                });
            }
            c.admin_token = Some(v);
        }
        if let Some(v) = layer.body_limit_bytes {
            c.body_limit_bytes = parse(
                "body_limit_bytes",
                &v,
                "a byte count ≥ 1024",
                source,
                |n| *n >= 1024,
            )?;
        }
        if let Some(v) = layer.cpu_cache_bytes {
            c.cpu_cache_bytes = parse("cpu_cache_bytes", &v, "a byte count ≥ 1", source, |n| {
                *n >= 1
            })?;
        }
        if let Some(v) = layer.cpu_threads {
            c.cpu_threads = Some(parse(
                "cpu_threads",
                &v,
                "an integer in 1..=1024",
                source,
                |n| (1..=1024).contains(n),
            )?);
        }
        if let Some(v) = layer.gpu_cache_bytes {
            c.gpu_cache_bytes = parse("gpu_cache_bytes", &v, "a byte count ≥ 1", source, |n| {
                *n >= 1
            })?;
        }
        if let Some(v) = layer.gpu_posting_cache_bytes {
            c.gpu_posting_cache_bytes = parse(
                "gpu_posting_cache_bytes",
                &v,
                "a byte count ≥ 0",
                source,
                |_| true,
            )?;
        }
        if let Some(v) = layer.griffin_ratio {
            c.griffin_ratio = parse(
                "griffin_ratio",
                &v,
                "a finite number ≥ 1",
                source,
                |r: &f64| r.is_finite() && *r >= 1.0,
            )?;
        }
        if let Some(v) = layer.gpu_queue_ms {
            c.gpu_queue_ms = parse("gpu_queue_ms", &v, "milliseconds ≥ 0", source, |_| true)?;
        }
        if let Some(v) = layer.gpu_select_batch {
            c.gpu_select_batch = parse("gpu_select_batch", &v, "an integer ≥ 1", source, |n| {
                *n >= 1
            })?;
        }
        if let Some(v) = layer.queue_capacity {
            c.queue_capacity = parse("queue_capacity", &v, "an integer ≥ 1", source, |n| {
                *n >= 1
            })?;
        }
        if let Some(v) = layer.batching {
            c.batching = parse("batching", &v, "true or false", source, |_| true)?;
        }
        if let Some(v) = layer.max_batch_docs {
            c.max_batch_docs = parse("max_batch_docs", &v, "an integer ≥ 1", source, |n| {
                *n >= 1
            })?;
        }
        if let Some(v) = layer.default_timeout_ms {
            let ms: u64 = parse(
                "default_timeout_ms",
                &v,
                "milliseconds (0: none)",
                source,
                |_| true,
            )?;
            c.default_timeout_ms = (ms > 0).then_some(ms);
        }
        if let Some(v) = layer.body_timeout_ms {
            c.body_timeout_ms = parse("body_timeout_ms", &v, "milliseconds ≥ 1", source, |n| {
                *n >= 1
            })?;
        }
        if let Some(v) = layer.idle_timeout_ms {
            c.idle_timeout_ms = parse("idle_timeout_ms", &v, "milliseconds ≥ 1", source, |n| {
                *n >= 1
            })?;
        }
        if let Some(v) = layer.shutdown_grace_ms {
            c.shutdown_grace_ms = parse(
                "shutdown_grace_ms",
                &v,
                "milliseconds ≥ 0",
                source,
                |_| true,
            )?;
        }
        if let Some(v) = layer.log_format {
            c.log_format = parse("log_format", &v, "one of human, json", source, |_| true)
                .map(|Named(format)| format)?;
        }
        if let Some(v) = layer.sample_log {
            if !matches!(
                v.extension().and_then(|e| e.to_str()),
                Some("msgpack" | "jsonl")
            ) {
                return Err(ConfigError::Invalid {
                    key: "sample_log",
                    origin: source("sample_log"),
                    expected: "a path ending in .msgpack or .jsonl",
                    got: v.display().to_string(),
                });
            }
            self.sample_log = Some(v);
        }
        if let Some(v) = layer.sample_rate {
            self.sample_rate = parse(
                "sample_rate",
                &v,
                "a fraction in (0, 1]",
                source,
                |r: &f64| *r > 0.0 && *r <= 1.0,
            )?;
        }
        Ok(())
    }
}

impl Config {
    /// Resolves defaults, then the TOML file (if any), then `env`, then `flags`, validating
    /// each value once.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key and the layer it came from.
    pub fn resolve(file: Option<&Path>, env: Layer, flags: Layer) -> Result<Config, ConfigError> {
        let mut resolver = Resolver {
            config: Config::default(),
            sample_log: None,
            sample_rate: 0.01,
        };
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let layer = toml_layer(path, &text)?;
            resolver.apply(layer, &|_| Source::File(path.to_path_buf()))?;
        }
        resolver.apply(env, &|key| Source::Env(env_name(key)))?;
        resolver.apply(flags, &|_| Source::Flag)?;
        let Resolver {
            mut config,
            sample_log,
            sample_rate,
        } = resolver;
        config.sampling = sample_log.map(|path| Sampling {
            path,
            rate: sample_rate,
        });
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Layer {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Layer::from_env(|k| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults_without_anything() {
        let c = Config::resolve(None, Layer::default(), Layer::default()).unwrap();
        assert_eq!(c.addr.to_string(), "127.0.0.1:8080");
        assert_eq!(c.rankers, PathBuf::from("rankers"));
        assert!(c.batching);
        assert_eq!(c.backend, Backend::Auto);
        assert!(c.admin_token.is_none() && c.sampling.is_none());
        assert_eq!(
            (c.body_timeout_ms, c.idle_timeout_ms, c.shutdown_grace_ms),
            (30_000, 60_000, 10_000)
        );
    }

    #[test]
    fn timeouts_parse_and_zero_is_refused_where_it_would_mean_never() {
        let c = Config::resolve(
            None,
            env(&[
                ("RANKSERVE_BODY_TIMEOUT_MS", "250"),
                ("RANKSERVE_IDLE_TIMEOUT_MS", "500"),
                ("RANKSERVE_SHUTDOWN_GRACE_MS", "0"),
            ]),
            Layer::default(),
        )
        .unwrap();
        assert_eq!(
            (c.body_timeout_ms, c.idle_timeout_ms, c.shutdown_grace_ms),
            (250, 500, 0)
        );
        let flags = Layer {
            body_timeout_ms: Some("0".into()),
            ..Layer::default()
        };
        let err = Config::resolve(None, Layer::default(), flags).unwrap_err();
        assert_eq!(
            err.to_string(),
            "body_timeout_ms (from command line): expected milliseconds ≥ 1, got \"0\""
        );
    }

    #[test]
    fn layers_override_in_order_file_env_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rankserve.toml");
        std::fs::write(
            &path,
            "addr = \"0.0.0.0:9000\"\nbatching = false\nqueue_capacity = 8\nbackend = \"cpu\"\n",
        )
        .unwrap();
        let env = env(&[
            ("RANKSERVE_BATCHING", "true"),
            ("RANKSERVE_ADMIN_TOKEN", "s3cret"),
        ]);
        let flags = Layer {
            queue_capacity: Some("9".into()),
            ..Layer::default()
        };
        let c = Config::resolve(Some(&path), env, flags).unwrap();
        assert_eq!(c.addr.to_string(), "0.0.0.0:9000");
        assert!(c.batching);
        assert_eq!(c.queue_capacity, 9);
        assert_eq!(c.backend, Backend::Cpu);
        assert_eq!(c.admin_token.as_deref(), Some("s3cret"));
    }

    #[test]
    fn errors_name_the_key_and_source() {
        let err = Config::resolve(None, env(&[("RANKSERVE_BACKEND", "tpu")]), Layer::default())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "backend (from environment variable RANKSERVE_BACKEND): expected one of auto, cpu, gpu, got \"tpu\""
        );
        let flags = Layer {
            sample_rate: Some("1.5".into()),
            ..Layer::default()
        };
        let err = Config::resolve(None, Layer::default(), flags).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sample_rate (from command line): expected a fraction in (0, 1], got \"1.5\""
        );
    }

    #[test]
    fn gpus_are_all_or_a_list_of_ordinals() {
        assert_eq!(Config::default().gpus, Gpus::All);
        for (value, want) in [
            ("all", Gpus::All),
            ("1", Gpus::Only(vec![1])),
            ("0, 2,2", Gpus::Only(vec![0, 2])),
        ] {
            let c =
                Config::resolve(None, env(&[("RANKSERVE_GPUS", value)]), Layer::default()).unwrap();
            assert_eq!(c.gpus, want, "{value:?}");
        }
        let err =
            Config::resolve(None, env(&[("RANKSERVE_GPUS", "0,x")]), Layer::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "gpus (from environment variable RANKSERVE_GPUS): expected all, or CUDA device ordinals like 0,1, got \"0,x\""
        );
    }

    #[test]
    fn selection_keys_parse_and_griffin_ratio_is_at_least_one() {
        let c = Config::resolve(
            None,
            env(&[
                ("RANKSERVE_GPU_POSTING_CACHE_BYTES", "0"),
                ("RANKSERVE_GRIFFIN_RATIO", "32.5"),
            ]),
            Layer::default(),
        )
        .unwrap();
        assert_eq!((c.gpu_posting_cache_bytes, c.griffin_ratio), (0, 32.5));
        let defaults = Config::default();
        assert_eq!(
            (defaults.gpu_posting_cache_bytes, defaults.griffin_ratio),
            (1 << 30, crate::select::schedule::DEFAULT_GRIFFIN_RATIO)
        );
        let err = Config::resolve(
            None,
            env(&[("RANKSERVE_GRIFFIN_RATIO", "0.5")]),
            Layer::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "griffin_ratio (from environment variable RANKSERVE_GRIFFIN_RATIO): expected a finite number ≥ 1, got \"0.5\""
        );
    }

    #[test]
    fn unknown_toml_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "adr = \"x\"\n").unwrap();
        let err = Config::resolve(Some(&path), Layer::default(), Layer::default()).unwrap_err();
        assert!(err.to_string().contains("unknown field `adr`"), "{err}");
    }

    #[test]
    fn sampling_needs_a_known_extension() {
        let flags = Layer {
            sample_log: Some("x.txt".into()),
            ..Layer::default()
        };
        assert!(Config::resolve(None, Layer::default(), flags).is_err());
        let flags = Layer {
            sample_log: Some("x.jsonl".into()),
            sample_rate: Some("0.5".into()),
            ..Layer::default()
        };
        let c = Config::resolve(None, Layer::default(), flags).unwrap();
        assert_eq!(
            c.sampling,
            Some(Sampling {
                path: "x.jsonl".into(),
                rate: 0.5
            })
        );
    }
}
