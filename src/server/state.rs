//! The state shared by every handler: configuration, the ranker store, the scorer, the index
//! being served, admission (a bounded number of requests per ranker), readiness and the request
//! sampler.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::api::RankRequest;
use super::batch::{BatchConfig, Scorer};
use super::codec::Format;
use super::error::ApiError;
use super::rank_body::RankBody;
use super::store::{RankerStore, StoreError};
use crate::config::{Backend, Config, Sampling};
use crate::gpu::power::PowerMeter;
use crate::gpu::{Combiner, GpuDevice};
use crate::index::{Index, IndexError};
use crate::select::gpu::{GpuSelectError, PostingCache, PostingCacheConfig, PostingCacheStats};
use crate::select::schedule::{self, Backlog, GpuJob, Scheduler};
use crate::select::SearchResult;

/// What handlers share.
pub type AppState = Arc<State>;

/// The GPU posting cache (when there is a GPU) and the GPU selections waiting for it.
type GpuSelections =
    Combiner<Option<PostingCache>, GpuJob, Option<Result<SearchResult, GpuSelectError>>>;

/// The shared state; see the module docs.
pub struct State {
    pub config: Config,
    pub store: RankerStore,
    pub scorer: Scorer,
    /// The index `/v1/search` reads. A request clones the `Arc` and keeps its index to the end,
    /// so a reload swaps it without waiting for (or disturbing) the searches in flight.
    index: RwLock<Option<Arc<Index>>>,
    /// The GPU posting cache of the served index, once the probe found a GPU, and the GPU
    /// selections waiting for it: one batch on the device at a time (the cache holds its
    /// buffers), made of the queries that arrived while the one before ran.
    posting_cache: GpuSelections,
    /// The selection stage's CPU/GPU choice.
    pub scheduler: Scheduler,
    /// The selections booked on each processor, which the choice counts.
    pub backlog: Backlog,
    admission: Mutex<HashMap<String, Arc<Semaphore>>>,
    ready: AtomicBool,
    gpu_probe: Mutex<Option<String>>,
    /// The GPU's power meter (NVML), when the probe found a GPU and NVML answers.
    power: std::sync::OnceLock<PowerMeter>,
    sampler: Option<Sampler>,
}

impl State {
    /// The state for `config`: opens the store (creating the directory), the index (when
    /// `config.index` names one; every file checked) and the sample log. Not ready until
    /// [`State::warm_up`] has run.
    ///
    /// # Errors
    /// The store's directory or the sample log cannot be created; the index does not open.
    pub fn new(config: Config) -> Result<AppState, StateError> {
        let gpu_select_batch = config.gpu_select_batch;
        let store = RankerStore::open(&config.rankers, config.cpu_cache_bytes)?;
        let scorer = Scorer::new(BatchConfig {
            window: Duration::from_micros(config.batch_window_us),
            max_docs: config.max_batch_docs,
            threads: config.cpu_threads,
        });
        let sampler = config.sampling.as_ref().map(Sampler::open).transpose()?;
        let index = config
            .index
            .as_deref()
            .map(Index::open)
            .transpose()?
            .map(Arc::new);
        let scheduler = Scheduler {
            griffin_ratio: config.griffin_ratio,
            ..Scheduler::default()
        };
        Ok(Arc::new(State {
            config,
            store,
            scorer,
            index: RwLock::new(index),
            posting_cache: Combiner::new(None, gpu_select_batch),
            scheduler,
            // Selections run on the blocking pool (a thread each) or, the cheapest, on the
            // runtime's workers: either way they share every core.
            backlog: Backlog::new(std::thread::available_parallelism().map_or(1, usize::from)),
            admission: Mutex::new(HashMap::new()),
            ready: AtomicBool::new(false),
            gpu_probe: Mutex::new(None),
            power: std::sync::OnceLock::new(),
            sampler,
        }))
    }

    /// Loads every ranker of the store into the CPU cache (a bad file is logged and skipped:
    /// requests for it answer 500 until it is replaced), runs the GPU probe (unless the
    /// configured backend is `cpu`), uploads the rankers to the GPU and measures their
    /// crossovers, and marks the server ready. Blocking: run it off the async runtime.
    pub fn warm_up(&self) {
        let mut loaded = Vec::new();
        match self.store.list() {
            Ok(rankers) => {
                for stored in rankers {
                    match self.store.get(&stored.name) {
                        Ok(ranker) => {
                            tracing::info!(ranker = %ranker.name, bytes = ranker.bytes, "ranker loaded");
                            loaded.push(ranker);
                        }
                        Err(err) => {
                            tracing::error!(ranker = %stored.name, error = %err, "ranker not loaded")
                        }
                    }
                }
            }
            Err(err) => tracing::error!(error = %err, "cannot list the rankers directory"),
        }
        let probe = self.probe_gpu();
        tracing::info!(gpu = %probe, "GPU probe finished");
        *self.gpu_probe.lock() = Some(probe);
        for ranker in &loaded {
            self.scorer.engines().crossover(ranker);
        }
        self.ready.store(true, Ordering::Release);
    }

    /// Finds the GPU and hands it to the scorer; says what it found.
    fn probe_gpu(&self) -> String {
        if self.config.backend == Backend::Cpu {
            return "not probed: the configured backend is cpu".to_string();
        }
        match GpuDevice::probe() {
            Ok(device) => {
                let found = format!("{} ({})", device.name(), device.arch());
                self.scorer
                    .engines()
                    .install_gpu(device.clone(), self.config.gpu_cache_bytes);
                let posting_config = PostingCacheConfig {
                    budget_bytes: self.config.gpu_posting_cache_bytes,
                    ..PostingCacheConfig::default()
                };
                match PostingCache::longest_first(device, posting_config) {
                    Ok(cache) => {
                        *self.posting_cache() = Some(cache);
                        if let Some(index) = self.index() {
                            self.prepare_posting_cache(&index);
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "no GPU posting cache: selection on the CPU")
                    }
                }
                // NVML numbers GPUs as CUDA does by default; the device is GPU 0.
                match PowerMeter::open(0) {
                    Ok(meter) => {
                        let _ = self.power.set(meter);
                    }
                    Err(err) => tracing::warn!(error = %err, "no GPU power readings"),
                }
                found
            }
            Err(err) => {
                tracing::warn!(reason = %err, "no GPU: ranking on the CPU");
                err.to_string()
            }
        }
    }

    /// The GPU's power meter, when there is one.
    /// Loads `index`'s resident lists into the GPU posting cache (when there is one), so that
    /// no query pays for it. A failure is logged; the cache then loads on the next GPU query,
    /// which runs on the CPU if that fails too.
    pub fn prepare_posting_cache(&self, index: &Index) {
        if let Some(cache) = self.posting_cache().as_mut() {
            match cache.prepare(index) {
                Ok(()) => {
                    let stats = cache.stats();
                    tracing::info!(
                        lists = stats.resident_lists,
                        bytes = stats.resident_bytes,
                        "GPU posting cache loaded"
                    )
                }
                Err(err) => tracing::warn!(error = %err, "GPU posting cache not loaded"),
            }
        }
    }

    /// Runs `job` on the GPU in a batch with the GPU selections waiting beside it
    /// ([`schedule::run_gpu_batch`]): `None` when no batch took it within `wait` (the device
    /// is busy: the caller's CPU is free; counted in `rankserve_gpu_queue_timeouts_total`) or
    /// its batch ended without answering it, `Some(None)` without a GPU.
    pub fn select_on_gpu(
        &self,
        job: GpuJob,
        wait: Duration,
    ) -> Option<Option<Result<SearchResult, GpuSelectError>>> {
        let ran = self.posting_cache.submit(job, wait, |cache, jobs| {
            metrics::histogram!("rankserve_select_gpu_batch_queries").record(jobs.len() as f64);
            schedule::run_gpu_batch(cache.as_mut(), &self.scheduler, &jobs)
        });
        // A zero wait is a query that could not afford to wait: it gave nothing up.
        if ran.is_none() && !wait.is_zero() {
            metrics::counter!("rankserve_gpu_queue_timeouts_total", "stage" => "select")
                .increment(1);
        }
        ran
    }

    /// The GPU posting cache (`None` without a GPU), once the batch holding it is done; while
    /// the guard lives, GPU selections wait for it.
    pub fn posting_cache(&self) -> parking_lot::MutexGuard<'_, Option<PostingCache>> {
        self.posting_cache.lock()
    }

    /// The GPU posting cache's counters, when there is one.
    pub fn posting_cache_stats(&self) -> Option<PostingCacheStats> {
        self.posting_cache().as_ref().map(PostingCache::stats)
    }

    pub fn power(&self) -> Option<&PowerMeter> {
        self.power.get()
    }

    /// Whether the probe found a GPU.
    pub fn has_gpu(&self) -> bool {
        self.scorer.engines().gpu().is_some()
    }

    /// Whether [`State::warm_up`] has finished.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// What the GPU probe found, once it has run.
    pub fn gpu_probe(&self) -> Option<String> {
        self.gpu_probe.lock().clone()
    }

    /// The index being served, if any.
    pub fn index(&self) -> Option<Arc<Index>> {
        self.index.read().clone()
    }

    /// Serves `index` from now on and returns the one it replaces. Requests holding the old
    /// one finish on it; it is unmapped when the last of them drops it.
    pub fn swap_index(&self, index: Arc<Index>) -> Option<Arc<Index>> {
        self.index.write().replace(index)
    }

    /// A place in `ranker`'s queue, held until the reply is written.
    ///
    /// # Errors
    /// [`ApiError::Overloaded`] when `queue_capacity` requests for it are in flight.
    pub fn admit(&self, ranker: &str) -> Result<OwnedSemaphorePermit, ApiError> {
        let capacity = self.config.queue_capacity;
        let semaphore = Arc::clone(
            self.admission
                .lock()
                .entry(ranker.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(capacity))),
        );
        semaphore
            .try_acquire_owned()
            .map_err(|_| ApiError::Overloaded {
                ranker: ranker.to_string(),
                capacity,
                retry_after_s: 1,
            })
    }

    /// Records the request in the sample log with the configured probability; a framed body
    /// drawn for the log is decoded in full first (and returned decoded).
    ///
    /// # Errors
    /// [`ApiError::BadBody`] when a drawn framed body's documents do not decode.
    pub fn sample(&self, body: RankBody) -> Result<RankBody, ApiError> {
        let Some(sampler) = &self.sampler else {
            return Ok(body);
        };
        if rand::random::<f64>() >= sampler.rate {
            return Ok(body);
        }
        let request = body.decoded()?;
        sampler.record(&request);
        Ok(RankBody::Decoded(request))
    }
}

/// Why the state could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot open the index: {0}")]
    Index(#[from] IndexError),
    #[error("cannot open the sample log {path}: {source}")]
    SampleLog {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Appends a random fraction of live `/v1/rank` requests to a request log (the format
/// `rankserve replay` reads).
struct Sampler {
    rate: f64,
    format: Format,
    out: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl Sampler {
    fn open(sampling: &Sampling) -> Result<Sampler, StateError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&sampling.path)
            .map_err(|source| StateError::SampleLog {
                path: sampling.path.clone(),
                source,
            })?;
        Ok(Sampler {
            rate: sampling.rate,
            format: log_format_of(&sampling.path),
            out: Mutex::new(std::io::BufWriter::new(file)),
        })
    }

    fn record(&self, request: &RankRequest) {
        let mut frame = match self.format.encode(request) {
            Ok(frame) => frame,
            Err(err) => return tracing::warn!(error = %err, "request not sampled"),
        };
        if self.format == Format::Json {
            frame.push(b'\n');
        }
        let mut out = self.out.lock();
        if let Err(err) = out.write_all(&frame).and_then(|()| out.flush()) {
            tracing::warn!(error = %err, "writing the sample log failed");
        }
    }
}

/// The format of a request log by its extension: `.jsonl` is JSON Lines, anything else
/// concatenated MessagePack objects.
pub fn log_format_of(path: &std::path::Path) -> Format {
    match path.extension().and_then(|e| e.to_str()) {
        Some("jsonl") => Format::Json,
        _ => Format::Msgpack,
    }
}
