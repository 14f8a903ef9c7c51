//! The CPU pool: a dedicated rayon pool of `cpu_threads` (built at its first use, sized by
//! [`default_threads`] when not configured), and how work reaches it — a task awaited from async
//! code without holding an async worker ([`Backends::on_cpu_pool_task`]), a task started and not
//! awaited ([`Backends::spawn_on_cpu_pool`]), work run from a thread outside the pool so that its
//! parallel parts use it (`install`) — with the tasks in flight counted, so that each spreads its
//! parallel parts over its share of the threads ([`Backends::width`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::backends::Backends;

/// The CPU pool: its threads, and the rayon pool of them (none for one thread: work runs on
/// the calling thread).
pub(super) struct CpuPool {
    threads: usize,
    pool: Option<rayon::ThreadPool>,
}

impl CpuPool {
    fn new(threads: usize) -> CpuPool {
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
        CpuPool { threads, pool }
    }
}

/// Threads of the CPU pool when `cpu_threads` is not set, on a host of `cores`: every one
/// without a GPU; three quarters with one (at least one). With a GPU ranking, the pool
/// decodes and lays out each request's documents while the device extracts and scores them,
/// and the async runtime's threads, which read the bodies and send the answers, need the cores
/// beside it, while a pool of every core spends its idle threads' time spinning
/// (docs/benchmarks.md, "Several GPUs in one process": on a 32-core two-GPU host, 24 threads
/// against 32 served 0.92–1.11× the requests with lower p99 at 14 of 16 points and 2–4 fewer
/// cores; on a 16-core host, 12 against 16, 2–6 % more).
pub fn default_threads(cores: usize, gpu: bool) -> usize {
    match gpu {
        true => (cores - cores / 4).max(1),
        false => cores.max(1),
    }
}

impl Backends {
    /// The CPU pool, built at the first call: `cpu_threads` threads, or [`default_threads`] for
    /// the GPUs installed by then.
    fn cpu_pool(&self) -> &CpuPool {
        self.cpu.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            let gpu = self.has_gpu();
            let threads = (self.asked_threads).unwrap_or_else(|| default_threads(cores, gpu));
            tracing::info!(threads, cores, gpu, "CPU pool");
            CpuPool::new(threads)
        })
    }

    pub(super) fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.cpu_pool().pool.as_ref()
    }

    /// Threads CPU work uses.
    pub fn threads(&self) -> usize {
        self.cpu_pool().threads
    }

    /// Threads a pool task's parallel parts should spread over now: the pool's threads shared
    /// among the tasks in flight, one at least. Under load every task runs on its own thread,
    /// start to end: a task that waits for its parallel parts lets its thread pick up another
    /// task (rayon steals while it waits), which then finishes first, so requests fanned out on
    /// a busy pool are served out of arrival order, and the pool's queue is first in, first out
    /// only for tasks that never wait.
    pub fn width(&self) -> usize {
        (self.threads() / self.in_flight.load(Ordering::Relaxed).max(1)).max(1)
    }

    /// Whether the CPU pool has no task in flight (false without a pool).
    pub fn pool_idle(&self) -> bool {
        self.pool().is_some() && self.in_flight.load(Ordering::Relaxed) == 0
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
        if self.pool().is_none() {
            return tokio::task::spawn_blocking(work)
                .await
                .map_err(|err| PoolTaskFailed(err.to_string()));
        }
        let (send, receive) = tokio::sync::oneshot::channel();
        self.spawn_on_cpu_pool(move || {
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            let _ = send.send(ran.map_err(|_| PoolTaskFailed("it panicked".into())));
        });
        receive
            .await
            .map_err(|_| PoolTaskFailed("the pool dropped it".into()))?
    }

    /// Starts `work` on the CPU scoring pool and returns at once, the task counted among those
    /// in flight until it ends ([`Backends::width`]); without a pool `work` runs on the calling
    /// thread. A panic in `work` is logged and ends only `work`.
    pub fn spawn_on_cpu_pool(&self, work: impl FnOnce() + Send + 'static) {
        fn run(work: impl FnOnce()) {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
                tracing::error!("a CPU pool task panicked");
            }
        }
        let Some(pool) = self.pool() else {
            return run(work);
        };
        let in_flight = Arc::clone(&self.in_flight);
        in_flight.fetch_add(1, Ordering::Relaxed);
        pool.spawn(move || {
            run(work);
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Runs `work` on the CPU pool from a thread outside it, so that its parallel parts use the
    /// pool (on the calling thread without a pool), counted among the tasks in flight while it
    /// runs ([`Backends::width`]).
    pub(super) fn install<R: Send>(&self, work: impl FnOnce() -> R + Send) -> R {
        // Already one of the pool's tasks (counted when it was spawned): its parallel parts use
        // the pool from here.
        if (self.pool()).is_some_and(|pool| pool.current_thread_index().is_some()) {
            return work();
        }
        struct InFlight<'a>(&'a AtomicUsize);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlight(&self.in_flight);
        match self.pool() {
            Some(pool) => pool.install(work),
            None => work(),
        }
    }
}

/// A task on the CPU scoring pool did not finish.
#[derive(Debug, thiserror::Error)]
#[error("a task on the CPU scoring pool failed: {0}")]
pub struct PoolTaskFailed(String);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;

    #[tokio::test]
    async fn a_pool_task_returns_its_result_or_an_error_when_it_panics() {
        for threads in [1, 2] {
            let backends = Backends::new(Some(threads), Backend::Cpu);
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

    /// An idle pool gives a task all its threads; two tasks in flight share them, and once
    /// they end a task has them all again.
    #[tokio::test]
    async fn tasks_in_flight_share_the_pools_threads() {
        let backends = Arc::new(Backends::new(Some(4), Backend::Cpu));
        assert_eq!(backends.width(), 4);
        // Each task reads its width once both have started, and ends once both have read it.
        let both = Arc::new(std::sync::Barrier::new(2));
        let task = || {
            let (backends, both) = (Arc::clone(&backends), Arc::clone(&both));
            move || {
                both.wait();
                let width = backends.width();
                both.wait();
                width
            }
        };
        let (first, second) = tokio::join!(
            backends.on_cpu_pool_task(task()),
            backends.on_cpu_pool_task(task())
        );
        assert_eq!((first.expect("ran"), second.expect("ran")), (2, 2));
        until_pool_idle(&backends).await;
        assert_eq!(backends.width(), 4);
    }

    /// Waits until no pool task is in flight (at most 5 s): a task's count is given back just
    /// after it has sent its result, so a caller that awaited the result may still see it.
    async fn until_pool_idle(backends: &Backends) {
        let by = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !backends.pool_idle() {
            assert!(
                std::time::Instant::now() < by,
                "a pool task's count was not given back"
            );
            tokio::task::yield_now().await;
        }
    }

    /// A pool task's work installed on the pool runs where it is, counted once: it keeps the
    /// whole pool's width.
    #[tokio::test]
    async fn work_installed_from_a_pool_task_is_counted_once() {
        let backends = Arc::new(Backends::new(Some(4), Backend::Cpu));
        assert!(backends.pool_idle());
        let inside = Arc::clone(&backends);
        let (width, idle) = (backends
            .on_cpu_pool_task(move || inside.install(|| (inside.width(), inside.pool_idle()))))
        .await
        .expect("ran");
        assert_eq!((width, idle), (4, false));
        until_pool_idle(&backends).await;
    }

    /// Without a GPU the pool takes every core; with one, three quarters.
    #[test]
    fn the_default_pool_leaves_a_quarter_of_the_cores_beside_a_gpu() {
        assert_eq!(default_threads(32, false), 32);
        assert_eq!(default_threads(32, true), 24);
        assert_eq!(default_threads(16, true), 12);
        assert_eq!(default_threads(2, true), 2);
        assert_eq!(default_threads(1, true), 1);
        assert_eq!(default_threads(0, false), 1);
    }
}
