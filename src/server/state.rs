//! The state shared by every handler: configuration, the two stages' engines (the ranking
//! engine owns the ranker store), the index being served, admission (a bounded number of
//! requests per ranker), readiness and the request sampler. It wires the engines to the device
//! the probe finds, and decides nothing about devices itself.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;
use crate::api::Format;
use crate::api::{RankBody, RankRequest};
use crate::backend::Backend;
use crate::broker::{Broker, BrokerError};
use crate::config::{Config, Sampling};
use crate::gpu::power::PowerMeter;
use crate::gpu::{Executor, GpuDevice};
use crate::index::{Index, IndexError};
use crate::rank::engine::{BatchConfig, EngineConfig, RankEngine};
use crate::rank::store::{RankerStore, StoreError};
use crate::select::engine::{SelectConfig, SelectEngine};

/// What handlers share.
pub type AppState = Arc<State>;

/// The shared state; see the module docs.
pub struct State {
    pub config: Config,
    /// The ranking stage: the ranker store, batching, the CPU/GPU choice, the fallback.
    pub rank: RankEngine,
    /// The document stage: the scheduler, the GPU's selections, the fallback.
    pub select: SelectEngine,
    /// The index `/v1/search` reads. A request clones the `Arc` and keeps its index to the end,
    /// so a reload swaps it without waiting for (or disturbing) the searches in flight.
    index: RwLock<Option<Arc<Index>>>,
    admission: Mutex<HashMap<String, Arc<Semaphore>>>,
    ready: AtomicBool,
    gpu_probe: Mutex<Option<String>>,
    /// Each device's executor, once the probe found them (both engines hold them too).
    executors: std::sync::OnceLock<Vec<Arc<Executor>>>,
    /// Each device's ordinal and power meter (NVML), where NVML answers.
    power: std::sync::OnceLock<Vec<(usize, PowerMeter)>>,
    sampler: Option<Sampler>,
    /// With `--broker`: the shards `/v1/search` fans out to.
    broker: Option<Broker>,
}

impl State {
    /// The state for `config`: opens the store (creating the directory), the index (when
    /// `config.index` names one; every file checked) and the sample log. Not ready until
    /// [`State::warm_up`] has run.
    ///
    /// # Errors
    /// The store's directory or the sample log cannot be created; the index does not open.
    pub fn new(config: Config) -> Result<AppState, StateError> {
        let store = RankerStore::open(&config.rankers, config.cpu_cache_bytes)?;
        let rank = RankEngine::new(
            store,
            EngineConfig {
                threads: config.cpu_threads,
                fe_backend: config.fe_backend,
                batch: BatchConfig {
                    batching: config.batching,
                    max_docs: config.max_batch_docs,
                },
                gpu_cache_bytes: config.gpu_cache_bytes,
            },
        );
        // Selections run on the blocking pool (a thread each) or, the cheapest, on the
        // runtime's workers: either way they share every core.
        let select = SelectEngine::new(
            SelectConfig {
                griffin_ratio: config.griffin_ratio,
                gpu_batch: config.gpu_select_batch,
                gpu_queue: Duration::from_millis(config.gpu_queue_ms),
                posting_cache_bytes: config.gpu_posting_cache_bytes,
            },
            std::thread::available_parallelism().map_or(1, usize::from),
        );
        let sampler = config.sampling.as_ref().map(Sampler::open).transpose()?;
        let broker = config.broker.as_deref().map(Broker::open).transpose()?;
        let index = config
            .index
            .as_deref()
            .map(Index::open)
            .transpose()?
            .map(Arc::new);
        Ok(Arc::new(State {
            config,
            rank,
            select,
            index: RwLock::new(index),
            admission: Mutex::new(HashMap::new()),
            ready: AtomicBool::new(false),
            gpu_probe: Mutex::new(None),
            executors: std::sync::OnceLock::new(),
            power: std::sync::OnceLock::new(),
            sampler,
            broker,
        }))
    }

    /// Loads every ranker of the store into the CPU cache (a bad file is logged and skipped:
    /// requests for it answer 500 until it is replaced), runs the GPU probe (unless the
    /// configured backend is `cpu`), uploads the rankers to the GPU and measures their
    /// crossovers, and marks the server ready. Blocking: run it off the async runtime.
    pub fn warm_up(&self) {
        let mut loaded = Vec::new();
        match self.store().list() {
            Ok(rankers) => {
                for stored in rankers {
                    match self.store().get(&stored.name) {
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
            self.rank.prepare(ranker);
        }
        self.ready.store(true, Ordering::Release);
    }

    /// Finds the configured GPUs and hands their executors to both engines; says what it
    /// found.
    fn probe_gpu(&self) -> String {
        if self.config.backend == Backend::Cpu {
            return "not probed: the configured backend is cpu".to_string();
        }
        match GpuDevice::probe_all(self.config.gpus.only()) {
            Ok(devices) => {
                let found = (devices.iter())
                    .map(|d| format!("GPU {}: {} ({})", d.ordinal(), d.name(), d.arch()))
                    .collect::<Vec<_>>()
                    .join(", ");
                let executors: Vec<Arc<Executor>> =
                    devices.iter().cloned().map(Executor::new).collect();
                self.rank.install_gpu(&executors);
                self.select.install_gpu(&executors, self.index().as_deref());
                let meters = (devices.iter())
                    .filter_map(|d| match PowerMeter::open_pci(d.pci_bus_id()) {
                        Ok(meter) => Some((d.ordinal(), meter)),
                        Err(err) => {
                            tracing::warn!(device = d.ordinal(), error = %err, "no GPU power readings");
                            None
                        }
                    })
                    .collect();
                let _ = self.power.set(meters);
                let _ = self.executors.set(executors);
                found
            }
            Err(err) => {
                tracing::warn!(reason = %err, "no GPU: ranking on the CPU");
                err.to_string()
            }
        }
    }

    /// The most bytes a request body may have.
    pub fn body_limit(&self) -> usize {
        self.config.body_limit_bytes
    }

    /// How long a request body may take to arrive, whole.
    pub fn body_deadline(&self) -> Duration {
        Duration::from_millis(self.config.body_timeout_ms)
    }

    /// The ranker store (the ranking engine's).
    pub fn store(&self) -> &RankerStore {
        self.rank.store()
    }

    /// Each device's ordinal and power meter (none without a GPU or NVML).
    pub fn power(&self) -> &[(usize, PowerMeter)] {
        self.power.get().map_or(&[], Vec::as_slice)
    }

    /// Each device's executor (none before the probe found one).
    pub fn gpu_executors(&self) -> &[Arc<Executor>] {
        self.executors.get().map_or(&[], Vec::as_slice)
    }

    /// Whether the probe found a GPU.
    pub fn has_gpu(&self) -> bool {
        self.rank.has_gpu()
    }

    /// Whether [`State::warm_up`] has finished.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// What the GPU probe found, once it has run.
    pub fn gpu_probe(&self) -> Option<String> {
        self.gpu_probe.lock().clone()
    }

    /// With `--broker`, the shards `/v1/search` fans out to.
    pub fn broker(&self) -> Option<&Broker> {
        self.broker.as_ref()
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
    #[error(transparent)]
    Broker(#[from] BrokerError),
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
            format: Format::of_log(&sampling.path),
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
