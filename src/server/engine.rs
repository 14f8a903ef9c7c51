//! Where a batch is evaluated: the CPU (a dedicated rayon pool of `cpu_threads`, built once) or
//! the GPU (the device found by the start-up probe and its ranker cache), chosen per batch.
//!
//! - `backend=cpu` never touches the GPU.
//! - `backend=gpu` runs on the GPU (the handler answers 503 `gpu_unavailable` first when there
//!   is none).
//! - `backend=auto` runs on the GPU when the batch has at least the ranker's measured crossover
//!   of documents ([`crate::rank::gpu::crossover`]), measured when the ranker loads.
//!
//! Any GPU failure (a CUDA error, a ranker over the GPU cache's budget) moves the batch to the
//! CPU, which gives the same answer; it is logged and counted in
//! `rankserve_gpu_fallback_total`, and the reply says `cpu`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use super::store::LoadedRanker;
use crate::config::Backend;
use crate::gpu::{GpuDevice, GpuError};
use crate::rank::gpu::cache::GpuRankerCache;
use crate::rank::gpu::crossover::{self, Crossover};

/// The longest one batch size of the crossover measurement may take before larger sizes are
/// skipped.
const CROSSOVER_STEP_BUDGET: Duration = Duration::from_millis(200);

/// Which backend evaluated a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    Cpu,
    Gpu,
}

impl Ran {
    pub fn as_str(self) -> &'static str {
        match self {
            Ran::Cpu => "cpu",
            Ran::Gpu => "gpu",
        }
    }
}

/// The CPU pool and, once the probe found one, the GPU.
pub struct Engines {
    pool: Option<rayon::ThreadPool>,
    gpu: OnceLock<GpuRankerCache>,
    /// One batch on the device at a time: the device has one stream and one cuBLAS handle.
    gpu_turn: Mutex<()>,
}

impl Engines {
    /// CPU scoring on `threads` threads (1: the calling thread). The GPU comes later, from
    /// [`Engines::install_gpu`].
    pub fn new(threads: usize) -> Engines {
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
        Engines {
            pool,
            gpu: OnceLock::new(),
            gpu_turn: Mutex::new(()),
        }
    }

    /// Makes `device` available with a ranker cache of `cache_bytes`; only the first call counts.
    pub fn install_gpu(&self, device: Arc<GpuDevice>, cache_bytes: u64) {
        let _ = self.gpu.set(GpuRankerCache::new(device, cache_bytes));
    }

    /// The GPU ranker cache, when there is a GPU.
    pub fn gpu(&self) -> Option<&GpuRankerCache> {
        self.gpu.get()
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

    /// Whether [`Engines::evaluate`] with `backend` runs on the CPU whatever the batch: the CPU
    /// was asked for, or there is no GPU.
    pub fn cpu_only(&self, backend: Backend) -> bool {
        backend == Backend::Cpu || self.gpu().is_none()
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
    ) -> (Vec<f64>, Ran) {
        let on_gpu = match backend {
            Backend::Cpu => false,
            Backend::Gpu => true,
            Backend::Auto => self
                .crossover(loaded)
                .is_some_and(|c| c.prefers_gpu(n_docs)),
        };
        if let (true, Some(cache)) = (on_gpu && n_docs > 0, self.gpu()) {
            let scored = self.with_gpu(|| {
                let cached = cache.get_or_upload(&loaded.name, loaded.version, &loaded.ranker)?;
                cached.gpu.score(cache.device(), features, false)
            });
            match scored {
                Ok(scored) => return (scored.scores, Ran::Gpu),
                Err(err) => fell_back("rank", &loaded.name, &err),
            }
        }
        (self.cpu(loaded, features), Ran::Cpu)
    }

    fn with_gpu<T>(&self, run: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
        let _turn = self.gpu_turn.lock();
        run()
    }

    /// The ranker's crossover, measured on first use when there is a GPU (`None` without one).
    /// A failed measurement is logged and keeps the ranker on the CPU under `auto`.
    pub fn crossover<'a>(&self, loaded: &'a LoadedRanker) -> Option<&'a Crossover> {
        let cache = self.gpu()?;
        Some(loaded.crossover.get_or_init(|| {
            let measured = self.with_gpu(|| {
                let cached = cache.get_or_upload(&loaded.name, loaded.version, &loaded.ranker)?;
                crossover::measure(
                    cache.device(),
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
                    fell_back("rank", &loaded.name, &err);
                    Crossover {
                        docs: None,
                        points: Vec::new(),
                    }
                }
            }
        }))
    }
}

/// A task on the CPU scoring pool did not finish.
#[derive(Debug, thiserror::Error)]
#[error("a task on the CPU scoring pool failed: {0}")]
pub struct PoolTaskFailed(String);

/// Logs and counts a GPU failure of `stage` (`rank` or `select`) whose work moved to the CPU;
/// `subject` names the ranker or the query.
pub(super) fn fell_back(stage: &'static str, subject: &str, err: &GpuError) {
    let reason = match err {
        GpuError::TooLarge { .. } => "too_large",
        _ => "gpu_error",
    };
    tracing::warn!(stage, subject, error = %err, "GPU failed: running on the CPU");
    metrics::counter!("rankserve_gpu_fallback_total", "stage" => stage, "reason" => reason)
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pool_task_returns_its_result_or_an_error_when_it_panics() {
        for threads in [1, 2] {
            let engines = Engines::new(threads);
            let on_pool = engines
                .on_cpu_pool_task(|| rayon::current_thread_index().is_some())
                .await
                .expect("ran");
            // One thread: no pool, the blocking pool runs it.
            assert_eq!(on_pool, threads > 1);
            let failed = engines
                .on_cpu_pool_task(|| -> u32 { panic!("a task that fails") })
                .await;
            assert!(failed.is_err(), "{threads} threads: {failed:?}");
            // The pool survives a task's panic.
            assert_eq!(engines.on_cpu_pool_task(|| 7).await.expect("ran"), 7);
        }
    }
}
