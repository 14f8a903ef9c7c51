//! `rankserve serve`: the HTTP API (see `docs/api.md`).

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{BadInputExt, CmdResult};
use rankserve::config::{Config, Layer, LogFormat};
use rankserve::index::builder::{open_or_build, BuildOptions};
use rankserve::server;

/// The corpus the demo index is built from, relative to the working directory (the repository).
const DEMO_CORPUS: &str = "fixtures/corpus.jsonl";
/// The demo index's directory under `--data-dir`.
const DEMO_INDEX: &str = "index";

/// Serve the HTTP API. Settings come from `--config FILE` (TOML), then `RANKSERVE_*`
/// environment variables, then these flags.
///
/// Example: `rankserve serve --addr 127.0.0.1:8080 --rankers rankers/`
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  RANKSERVE_ADMIN_TOKEN=secret rankserve serve --addr 127.0.0.1:8080 --rankers rankers/"
)]
pub struct Args {
    /// TOML configuration file (keys as in docs/api.md, "Configuration").
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen address [default: 127.0.0.1:8080].
    #[arg(long)]
    addr: Option<String>,
    /// Index directory for /v1/search (the document stage) [default: a demo index built once
    /// from fixtures/corpus.jsonl into DATA_DIR/index].
    #[arg(long, value_name = "DIR")]
    index: Option<PathBuf>,
    /// Run as a broker: answer /v1/search by fanning it out to the shard servers listed in
    /// FILE (TOML: `timeout_ms`, then `[[shards]]` entries with `name` and `url`; each shard a
    /// `rankserve serve --index` of one directory of `rankserve index build --shards`), merging
    /// their answers into the unsharded index's (docs/deploy.md).
    #[arg(long, value_name = "FILE")]
    broker: Option<PathBuf>,
    /// Directory of ranker files NAME.json [default: rankers/].
    #[arg(long, value_name = "DIR")]
    rankers: Option<PathBuf>,
    /// Directory for data the server builds (the demo index) [default: .rankserve/].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Default backend: auto, cpu or gpu [default: auto].
    #[arg(long)]
    backend: Option<String>,
    /// Where hit documents' features are extracted: cpu, gpu (fused with scoring in one device
    /// turn), or auto (fused from the ranker's FE + scoring crossover on, while a device is idle
    /// or the request is large; the CPU without a GPU) [default: auto].
    #[arg(long)]
    fe_backend: Option<String>,
    /// The GPUs to use: all, or CUDA device ordinals like 0,1 (after CUDA_VISIBLE_DEVICES)
    /// [default: all].
    #[arg(long)]
    gpus: Option<String>,
    /// Most bytes in a request body [default: 67108864].
    #[arg(long)]
    body_limit_bytes: Option<String>,
    /// Memory budget of the CPU ranker cache [default: 1073741824].
    #[arg(long)]
    cpu_cache_bytes: Option<String>,
    /// Threads of the CPU pool, which scores batches on the CPU and decodes requests [default:
    /// the machine's; three quarters of them when a GPU ranks].
    #[arg(long)]
    cpu_threads: Option<String>,
    /// Memory budget of the GPU ranker cache [default: 4294967296].
    #[arg(long)]
    gpu_cache_bytes: Option<String>,
    /// Memory budget of the GPU posting cache of the served index; 0: lists copied per query
    /// [default: 1073741824].
    #[arg(long)]
    gpu_posting_cache_bytes: Option<String>,
    /// Selection scheduler: AND runs on the CPU when the second shortest list is more than this
    /// many times the shortest, and hands over between steps when the next list is more than
    /// this many times the intersection so far [default: 4096].
    #[arg(long)]
    griffin_ratio: Option<String>,
    /// The longest a backend=gpu selection waits for the busy device before it runs on the CPU,
    /// in milliseconds [default: 500].
    #[arg(long)]
    gpu_queue_ms: Option<String>,
    /// The most GPU selections run as one batch (the queries that arrived while the device was
    /// busy share its copies, launches and waits); 1 runs each alone [default: 16].
    #[arg(long)]
    gpu_select_batch: Option<String>,
    /// Requests admitted per ranker before 503 overloaded [default: 256].
    #[arg(long)]
    queue_capacity: Option<String>,
    /// Merge requests that arrive while their ranker's batch runs into the next batch: true
    /// or false (every request scored at once) [default: true].
    #[arg(long)]
    batching: Option<String>,
    /// Most documents in one batch; a request of at least this many is scored alone
    /// [default: 2048].
    #[arg(long)]
    max_batch_docs: Option<String>,
    /// Deadline of a request without timeout_ms; 0 for none [default: 10000].
    #[arg(long)]
    default_timeout_ms: Option<String>,
    /// The longest a client may take to send a whole request body, in milliseconds; then 408
    /// body_timeout [default: 30000].
    #[arg(long)]
    body_timeout_ms: Option<String>,
    /// A connection is closed when no complete request head arrives this many milliseconds
    /// after it opened or its last reply was sent [default: 60000].
    #[arg(long)]
    idle_timeout_ms: Option<String>,
    /// On SIGTERM or Ctrl-C, how long requests in flight may take before their connections
    /// are dropped and the process exits, in milliseconds [default: 10000].
    #[arg(long)]
    shutdown_grace_ms: Option<String>,
    /// Log format: human or json [default: human].
    #[arg(long)]
    log_format: Option<String>,
    /// Record a sample of /v1/rank requests to this log (.msgpack or .jsonl).
    #[arg(long, value_name = "LOG")]
    sample_log: Option<PathBuf>,
    /// Fraction of /v1/rank requests recorded [default: 0.01].
    #[arg(long)]
    sample_rate: Option<String>,
}

impl Args {
    fn into_layer(self) -> (Option<PathBuf>, Layer) {
        let layer = Layer {
            addr: self.addr,
            rankers: self.rankers,
            data_dir: self.data_dir,
            index: self.index,
            broker: self.broker,
            backend: self.backend,
            fe_backend: self.fe_backend,
            gpus: self.gpus,
            // The token is read from the file or the environment only: a flag shows in `ps`.
            admin_token: None,
            body_limit_bytes: self.body_limit_bytes,
            cpu_cache_bytes: self.cpu_cache_bytes,
            cpu_threads: self.cpu_threads,
            gpu_cache_bytes: self.gpu_cache_bytes,
            gpu_posting_cache_bytes: self.gpu_posting_cache_bytes,
            griffin_ratio: self.griffin_ratio,
            gpu_queue_ms: self.gpu_queue_ms,
            gpu_select_batch: self.gpu_select_batch,
            queue_capacity: self.queue_capacity,
            batching: self.batching,
            max_batch_docs: self.max_batch_docs,
            default_timeout_ms: self.default_timeout_ms,
            body_timeout_ms: self.body_timeout_ms,
            idle_timeout_ms: self.idle_timeout_ms,
            shutdown_grace_ms: self.shutdown_grace_ms,
            log_format: self.log_format,
            sample_log: self.sample_log,
            sample_rate: self.sample_rate,
        };
        (self.config, layer)
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

pub fn run(args: Args) -> CmdResult {
    let (file, flags) = args.into_layer();
    let mut config = Config::resolve(
        file.as_deref(),
        Layer::from_env(|k| std::env::var(k).ok()),
        flags,
    )
    .bad_input()?;
    init_logging(config.log_format);
    if config.index.is_none() && config.broker.is_none() {
        config.index = demo_index(&config.data_dir)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(async move {
        let addr = config.addr;
        let state = server::State::new(config).context("opening the server state")?;
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let index = state.index().map_or("none".into(), |i| i.dir().display().to_string());
        let shards = state.broker().map_or(0, |b| b.shards().len());
        tracing::info!(addr = %listener.local_addr()?, rankers = %state.store().dir().display(), index, shards, "listening");
        server::serve(listener, state, server::shutdown_signal()).await.context("serving")?;
        tracing::info!("stopped");
        Ok(())
    });
    // The grace period is over: blocking work of dropped requests is not waited for.
    runtime.shutdown_background();
    served
}

/// The demo index `DATA_DIR/index`: reused when it opens, else built from [`DEMO_CORPUS`].
/// Without that corpus (not run from the repository) the server runs without an index, and says
/// so.
fn demo_index(data_dir: &Path) -> Result<Option<PathBuf>, super::Failure> {
    let out = data_dir.join(DEMO_INDEX);
    let corpus = Path::new(DEMO_CORPUS);
    if !out.exists() && !corpus.exists() {
        tracing::warn!(
            corpus = DEMO_CORPUS,
            "no demo corpus here: serving without an index (/v1/search answers 503 no_index; pass --index DIR)"
        );
        return Ok(None);
    }
    let report = open_or_build(corpus, &out, &BuildOptions::default()).with_context(|| {
        format!(
            "building the demo index {} from {DEMO_CORPUS}",
            out.display()
        )
    })?;
    match report {
        Some(r) => {
            tracing::info!(index = %out.display(), docs = r.docs, seconds = r.seconds, "demo index built")
        }
        None => tracing::info!(index = %out.display(), "demo index reused"),
    }
    Ok(Some(out))
}
