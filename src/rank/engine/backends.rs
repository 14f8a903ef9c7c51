//! Where a batch runs: the CPU (a dedicated rayon pool of `cpu_threads`, built once) or the
//! GPU (a device's [`Executor`] and the ranker cache on it), chosen per batch, for feature
//! extraction and for scoring.
//!
//! Scoring:
//! - `backend=cpu` never touches the GPU.
//! - `backend=gpu` runs on the GPU (the server answers 503 `gpu_unavailable` first when there
//!   is none).
//! - `backend=auto` runs on the GPU when the batch has at least the ranker's measured crossover
//!   of documents ([`crate::rank::gpu::crossover`]), measured when the ranker loads.
//!
//! Feature extraction of hit documents follows `fe_backend` (the configuration's): `cpu`
//! (the default), `gpu`, or `auto` (the GPU from the ranker's scoring crossover on, as
//! scoring: no FE crossover is measured yet).
//!
//! Any GPU failure (a CUDA error, a ranker over the GPU cache's budget, a query over the FE
//! kernel's term limit) moves the work to the CPU, which gives the same answer; it is logged
//! and counted by [`fell_back`], and the reply says `cpu`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use super::HitBatch;
use crate::backend::{fell_back, Backend, Processor, Stage};
use crate::gpu::Executor;
use crate::rank::fe::HitError;
use crate::rank::gpu::cache::GpuRankerCache;
use crate::rank::gpu::crossover::{self, Crossover};
use crate::rank::gpu::fe::{GpuFe, GpuFeError};
use crate::rank::store::LoadedRanker;

/// The longest one batch size of the crossover measurement may take before larger sizes are
/// skipped.
const CROSSOVER_STEP_BUDGET: Duration = Duration::from_millis(200);

/// The ranking stage's share of a device.
struct GpuRanking {
    executor: Arc<Executor>,
    rankers: GpuRankerCache,
    /// FE's device buffers, reused from batch to batch (used during the device's turn).
    fe: Mutex<GpuFe>,
}

/// The CPU pool and, once the probe found one, the GPU.
pub struct Backends {
    pool: Option<rayon::ThreadPool>,
    threads: usize,
    fe_backend: Backend,
    gpu: OnceLock<GpuRanking>,
}

impl Backends {
    /// CPU work on `threads` threads (1: the calling thread); hit documents' features on
    /// `fe_backend`. The GPU comes later, from [`Backends::install_gpu`].
    pub fn new(threads: usize, fe_backend: Backend) -> Backends {
        let pool = (threads != 1)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("score-{i}"))
                    .build()
            })
            .and_then(|built| {
                built
                    .inspect_err(|err| tracing::warn!(error = %err, "no CPU scoring pool: scoring on rayon's global pool"))
                    .ok()
            });
        Backends {
            pool,
            threads,
            fe_backend,
            gpu: OnceLock::new(),
        }
    }

    /// Makes `executor`'s device available with a ranker cache of `cache_bytes`; only the first
    /// call counts.
    pub fn install_gpu(&self, executor: Arc<Executor>, cache_bytes: u64) {
        let rankers = GpuRankerCache::new(Arc::clone(executor.device()), cache_bytes);
        let _ = self.gpu.set(GpuRanking {
            executor,
            rankers,
            fe: Mutex::new(GpuFe::new()),
        });
    }

    /// The GPU ranker cache, when there is a GPU.
    pub fn gpu_rankers(&self) -> Option<&GpuRankerCache> {
        self.gpu.get().map(|gpu| &gpu.rankers)
    }

    /// Threads CPU work uses.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `work` on the CPU scoring pool and waits for it without holding an async worker or
    /// a blocking-pool thread: the pool's thread sends the result straight to the waiting task.
    /// Feature extraction runs there too, so that its parallel parts leave the scoring threads
    /// warm for the scoring that follows, rather than compete with a second pool for the cores.
    /// A trip through `spawn_blocking` and then the pool's `install` wakes two threads more
    /// on the request's path. Without a pool (one scoring thread) `work` runs on the blocking
    /// pool. A panic in `work` becomes an error, as it does for `spawn_blocking`.
    ///
    /// # Errors
    /// [`PoolTaskFailed`] when `work` panicked.
    pub async fn on_cpu_pool_task<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, PoolTaskFailed> {
        let Some(pool) = &self.pool else {
            return tokio::task::spawn_blocking(work)
                .await
                .map_err(|err| PoolTaskFailed(err.to_string()));
        };
        let (send, receive) = tokio::sync::oneshot::channel();
        pool.spawn(move || {
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            let _ = send.send(ran.map_err(|_| PoolTaskFailed("it panicked".into())));
        });
        receive
            .await
            .map_err(|_| PoolTaskFailed("the pool dropped it".into()))?
    }

    /// Whether [`Backends::evaluate`] with `backend` runs on the CPU whatever the batch: the
    /// CPU was asked for, or there is no GPU.
    pub fn cpu_only(&self, backend: Backend) -> bool {
        backend == Backend::Cpu || self.gpu.get().is_none()
    }

    /// Whether `backend` (scoring's, or the configured FE backend) sends a batch of `n_docs`
    /// documents of `loaded` to the GPU.
    fn prefers_gpu(&self, loaded: &LoadedRanker, n_docs: usize, backend: Backend) -> bool {
        match backend {
            Backend::Cpu => false,
            Backend::Gpu => true,
            Backend::Auto => self
                .crossover(loaded)
                .is_some_and(|c| c.prefers_gpu(n_docs)),
        }
    }

    /// Whether the configured FE backend sends hit documents of `batch` to the GPU.
    pub fn fe_on_gpu(&self, loaded: &LoadedRanker, batch: &HitBatch) -> bool {
        self.gpu.get().is_some() && self.prefers_gpu(loaded, batch.docs.len(), self.fe_backend)
    }

    /// The feature rows of `batch` for `loaded` (row-major, the ranker's width), extracted on
    /// the CPU (its parallel parts on the pool when called from it), or on the GPU when
    /// `on_gpu` and there is one (blocking while it waits for the device's turn); the GPU's
    /// failure runs the CPU's extraction (same values).
    ///
    /// # Errors
    /// [`FeRefused::Ranker`] when the ranker has a feature FE cannot produce;
    /// [`FeRefused::Hits`] (the CPU's error) for an invalid batch.
    pub fn extract(
        &self,
        loaded: &LoadedRanker,
        batch: &HitBatch,
        on_gpu: bool,
    ) -> Result<(Vec<f64>, Processor), FeRefused> {
        let resolver = loaded
            .fe
            .as_ref()
            .map_err(|err| FeRefused::Ranker(err.to_string()))?;
        let mut rows = vec![f64::NAN; batch.docs.len() * resolver.len()];
        if let (true, Some(gpu)) = (on_gpu && !batch.docs.is_empty(), self.gpu.get()) {
            let extracted = gpu.executor.run(|device| {
                gpu.fe.lock().extract_batch(
                    device,
                    resolver,
                    &batch.query,
                    &batch.stats,
                    &batch.docs,
                    &mut rows,
                )
            });
            match extracted {
                Ok(()) => return Ok((rows, Processor::Gpu)),
                Err(GpuFeError::Hits(err)) => return Err(FeRefused::Hits(err)),
                Err(GpuFeError::Gpu(err)) => fell_back(Stage::Fe, &loaded.name, &err),
            }
        }
        resolver.extract_batch(
            &batch.query,
            &batch.stats,
            &batch.docs,
            &mut rows,
            self.threads,
        )?;
        Ok((rows, Processor::Cpu))
    }

    /// Scores on the CPU.
    pub fn cpu(&self, loaded: &LoadedRanker, features: &[f64]) -> Vec<f64> {
        match &self.pool {
            Some(pool) => pool.install(|| loaded.plan.score_batch(features, 0)),
            None => loaded.plan.score_batch(features, 1),
        }
    }

    /// Scores `n_docs` rows of `features` on the backend `backend` picks (see the module docs).
    pub fn evaluate(
        &self,
        loaded: &LoadedRanker,
        features: &[f64],
        n_docs: usize,
        backend: Backend,
    ) -> (Vec<f64>, Processor) {
        let on_gpu = self.prefers_gpu(loaded, n_docs, backend);
        if let (true, Some(gpu)) = (on_gpu && n_docs > 0, self.gpu.get()) {
            let scored = gpu.executor.run(|device| {
                let cached =
                    (gpu.rankers).get_or_upload(&loaded.name, loaded.version, &loaded.ranker)?;
                cached.gpu.score(device, features, false)
            });
            match scored {
                Ok(scored) => return (scored.scores, Processor::Gpu),
                Err(err) => fell_back(Stage::Rank, &loaded.name, &err),
            }
        }
        (self.cpu(loaded, features), Processor::Cpu)
    }

    /// The ranker's crossover, measured on first use when there is a GPU (`None` without one).
    /// A failed measurement is logged and keeps the ranker on the CPU under `auto`.
    pub fn crossover<'a>(&self, loaded: &'a LoadedRanker) -> Option<&'a Crossover> {
        let gpu = self.gpu.get()?;
        Some(loaded.crossover.get_or_init(|| {
            let measured = gpu.executor.run(|device| {
                let cached =
                    (gpu.rankers).get_or_upload(&loaded.name, loaded.version, &loaded.ranker)?;
                crossover::measure(
                    device,
                    &loaded.ranker,
                    &cached.gpu,
                    &|rows| self.cpu(loaded, rows),
                    CROSSOVER_STEP_BUDGET,
                )
            });
            match measured {
                Ok(found) => {
                    tracing::info!(ranker = %loaded.name, crossover_docs = ?found.docs, "CPU/GPU crossover measured");
                    found
                }
                Err(err) => {
                    fell_back(Stage::Rank, &loaded.name, &err);
                    Crossover {
                        docs: None,
                        points: Vec::new(),
                    }
                }
            }
        }))
    }
}

/// Why feature extraction refused a batch.
#[derive(Debug, thiserror::Error)]
pub enum FeRefused {
    /// The ranker has a feature that FE cannot produce.
    #[error("{0}")]
    Ranker(String),
    /// The batch is invalid.
    #[error(transparent)]
    Hits(#[from] HitError),
}

/// A task on the CPU scoring pool did not finish.
#[derive(Debug, thiserror::Error)]
#[error("a task on the CPU scoring pool failed: {0}")]
pub struct PoolTaskFailed(String);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pool_task_returns_its_result_or_an_error_when_it_panics() {
        for threads in [1, 2] {
            let backends = Backends::new(threads, Backend::Cpu);
            let on_pool = backends
                .on_cpu_pool_task(|| rayon::current_thread_index().is_some())
                .await
                .expect("ran");
            // One thread: no pool, the blocking pool runs it.
            assert_eq!(on_pool, threads > 1);
            let failed = backends
                .on_cpu_pool_task(|| -> u32 { panic!("a task that fails") })
                .await;
            assert!(failed.is_err(), "{threads} threads: {failed:?}");
            // The pool survives a task's panic.
            assert_eq!(backends.on_cpu_pool_task(|| 7).await.expect("ran"), 7);
        }
    }
}
