//! The document stage's engine: where a query runs, decided here once. It owns the scheduler
//! (the CPU/GPU choice per query and per intersection step, [`Scheduler`]), the backlog of
//! selections booked on each processor ([`Backlog`]), each device's posting cache and the GPU
//! selections waiting for it (the device's selection [`Lane`], a thread that runs the selections
//! queued so far in one batch per turn, [`schedule::run_gpu_batch`]), the wait for the device and
//! the fallback to the CPU.
//!
//! With several GPUs every device caches the same lists (the longest, under its own budget), so
//! a query's lists are resident on every device or on none, and a query bound for the GPU goes
//! to the least loaded device in service ([`Fleet::pick`]). A device whose batch fails is taken
//! out of service (its queries run on the CPU, counted) and tried again later.
//!
//! A caller routes a query ([`SelectEngine::route`]: the choice under the current load, before
//! anything waits for the device, so that a query bound for the CPU never holds it), then runs
//! the route ([`SelectEngine::select`], blocking) and gets one answer: the hits and the processor
//! that found them. A route cheap enough to run on the caller's own async task says so
//! ([`SelectEngine::runs_inline`]); a route to the GPU may instead be awaited from it
//! ([`SelectEngine::select_queued`]), the CPU's part (if the device gives no answer) left to the
//! caller.
//!
//! The wait for the device: `gpu` waits up to `gpu_queue_ms`, `auto` only as long as waiting
//! still beats the CPU (the route's estimated margin), never past the request's deadline; a
//! query that did not get the device by then runs on the CPU, and its booking moves there. A GPU
//! failure runs the query on the CPU (same answer), counted by [`fell_back`].

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::gpu::{GpuSelectError, PostingCache, PostingCacheConfig, PostingCacheStats};
use super::schedule::{self, Backlog, GpuJob, Load, Route, Scheduled, Scheduler};
use super::{Query, SearchResult, SelectError};
use crate::backend::{fell_back, Backend, Processor, Stage};
use crate::gpu::{Executor, Fleet, Lane, Missed};
use crate::index::Index;

/// Estimated CPU time under which a selection runs on the request's own task instead of the
/// blocking pool: the hand-off costs more than such a query. Measured on the H100 host
/// (`docs/benchmarks-history.md`, issue 6, run I, 3 M documents, one client): AND selections
/// with a median of 17–22 µs cost the server a median 77–128 µs through the pool, 37–44 µs
/// inline.
const INLINE_SELECT_US: f64 = 50.0;

/// How the engine runs.
#[derive(Debug, Clone, Copy)]
pub struct SelectConfig {
    /// Griffin's threshold of the scheduler.
    pub griffin_ratio: f64,
    /// The most GPU selections run as one batch.
    pub gpu_batch: usize,
    /// The longest a `backend=gpu` selection waits for the device.
    pub gpu_queue: Duration,
    /// Budget of the device's posting cache.
    pub posting_cache_bytes: u64,
}

/// The answer to a query run on the GPU.
type GpuAnswer = Result<SearchResult, GpuSelectError>;

/// A selection's hits and the processor that found them.
#[derive(Debug)]
pub struct Selected {
    pub result: SearchResult,
    pub side: Processor,
}

/// The document stage's engine; see the module docs.
pub struct SelectEngine {
    scheduler: Scheduler,
    backlog: Backlog,
    config: SelectConfig,
    /// Each device's posting cache of the served index and the GPU selections waiting for it,
    /// once the probe found a device.
    gpu: OnceLock<Fleet<SelectDevice>>,
}

/// The document stage on one device: its posting cache, and the lane whose thread runs the
/// selections queued for the device with it.
struct SelectDevice {
    cache: Arc<Mutex<PostingCache>>,
    lane: Lane<GpuJob, GpuAnswer>,
}

impl SelectEngine {
    /// An engine on the CPU (until [`SelectEngine::install_gpu`]) whose selections share
    /// `cpu_cores` cores.
    pub fn new(config: SelectConfig, cpu_cores: usize) -> SelectEngine {
        SelectEngine {
            scheduler: Scheduler {
                griffin_ratio: config.griffin_ratio,
                ..Scheduler::default()
            },
            backlog: Backlog::new(cpu_cores),
            config,
            gpu: OnceLock::new(),
        }
    }

    /// Selects on `executors`' devices from now on, each with a posting cache loaded for
    /// `index` when there is one (the first call with a device counts). A device whose cache
    /// cannot be made is logged and left out; without any, selection stays on the CPU.
    pub fn install_gpu(&self, executors: &[Arc<Executor>], index: Option<&Index>) {
        let config = PostingCacheConfig {
            budget_bytes: self.config.posting_cache_bytes,
            ..PostingCacheConfig::default()
        };
        let devices: Vec<_> = (executors.iter())
            .filter_map(|executor| {
                let device = Arc::clone(executor.device());
                let started = (executor.run(|_| PostingCache::longest_first(device, config)))
                    .map_err(|err| err.to_string())
                    .and_then(|cache| self.start_lane(executor, cache));
                match started {
                    Ok(on_device) => Some((Arc::clone(executor), on_device)),
                    Err(err) => {
                        tracing::warn!(device = executor.device().ordinal(), error = %err, "no GPU posting cache: selection not on this device");
                        None
                    }
                }
            })
            .collect();
        if devices.is_empty() {
            return;
        }
        self.backlog.set_gpu_devices(devices.len());
        if self.gpu.set(Fleet::new(devices)).is_err() {
            return;
        }
        if let Some(index) = index {
            self.prepare(index);
        }
    }

    /// Starts `executor`'s selection lane (thread `gpu{N}-select`), which runs the queued GPU
    /// selections with `cache`, [`SelectConfig::gpu_batch`] at most a turn.
    fn start_lane(
        &self,
        executor: &Arc<Executor>,
        cache: PostingCache,
    ) -> Result<SelectDevice, String> {
        let cache = Arc::new(Mutex::new(cache));
        let scheduler = self.scheduler;
        let name = format!("gpu{}-select", executor.device().ordinal());
        let lane = Lane::start(name, executor, self.config.gpu_batch, {
            let cache = Arc::clone(&cache);
            move |_, jobs| {
                metrics::histogram!("rankserve_select_gpu_batch_queries").record(jobs.len() as f64);
                schedule::run_gpu_batch(&mut cache.lock(), &scheduler, &jobs)
            }
        });
        let lane =
            lane.map_err(|err| format!("cannot start the device's selection lane: {err}"))?;
        Ok(SelectDevice { cache, lane })
    }

    /// Loads `index`'s resident lists into every device's posting cache (side by side), so
    /// that no query pays for it. A failure is logged; that cache then loads on its next GPU
    /// query, which runs on the CPU if that fails too. Blocking: it waits for the devices'
    /// turns.
    pub fn prepare(&self, index: &Index) {
        let Some(fleet) = self.gpu.get() else {
            return;
        };
        std::thread::scope(|scope| {
            for (executor, on_device) in fleet.iter() {
                scope.spawn(move || {
                    let device = executor.device().ordinal();
                    let prepared = executor.run(|_| {
                        let mut cache = on_device.cache.lock();
                        cache.prepare(index).map(|()| cache.stats())
                    });
                    match prepared {
                        Ok(stats) => tracing::info!(
                            device,
                            lists = stats.resident_lists,
                            bytes = stats.resident_bytes,
                            "GPU posting cache loaded"
                        ),
                        Err(err) => {
                            tracing::warn!(device, error = %err, "GPU posting cache not loaded")
                        }
                    }
                });
            }
        });
    }

    /// Each device's ordinal and posting cache counters (none without a GPU).
    pub fn posting_cache_stats(&self) -> Vec<(usize, PostingCacheStats)> {
        (self.gpu.get().into_iter().flat_map(Fleet::iter))
            .map(|(executor, on_device)| {
                (executor.device().ordinal(), on_device.cache.lock().stats())
            })
            .collect()
    }

    /// The selections booked on each processor now.
    pub fn load(&self) -> Load {
        self.backlog.load()
    }

    /// Where `backend` sends `query` over `index` under the current load.
    pub fn route<'a>(&self, index: &'a Index, query: &Query, backend: Backend) -> Route<'a> {
        self.scheduler
            .route(index, query, backend, &self.backlog.load())
    }

    /// Whether `route` is a selection cheap enough to run on the caller's async task
    /// ([`INLINE_SELECT_US`]).
    pub fn runs_inline(route: &Route) -> bool {
        !route.to_gpu() && route.choice.cpu_us + route.choice.cpu_wait_us <= INLINE_SELECT_US
    }

    /// Runs `query` along `route` ([`SelectEngine::route`] of the same index and query),
    /// booked on its processor until done; blocking while it waits for the device.
    ///
    /// # Errors
    /// [`SelectError::InvalidParameter`] for BM25 parameters out of range.
    pub fn select(
        &self,
        index: &Arc<Index>,
        query: &Query,
        route: Route,
        backend: Backend,
        deadline: Option<Instant>,
    ) -> Result<Selected, SelectError> {
        let booking = self.backlog.book(route.choice.side, route.choice.gpu_us);
        let ran = match route.to_gpu() {
            false => schedule::search_routed(index, query, route, None, &self.scheduler),
            // Run in a batch with the GPU selections waiting beside it; an `auto` route carries
            // the scheduler's per-step plan.
            true => {
                let wait = self.gpu_wait(&route, backend, deadline);
                match self.on_gpu(route.gpu_job(Arc::clone(index), query), wait) {
                    Some(answer) => schedule::settle(index, query, route, Some(answer)),
                    // A query that did not get the device (none, or busy past its wait) runs on
                    // the CPU: its place moves there.
                    None => {
                        drop(booking);
                        let _booking = self.backlog.book(Processor::Cpu, 0.0);
                        schedule::search_routed(index, query, route, None, &self.scheduler)
                    }
                }
            }
        }?;
        Ok(selected(query, ran))
    }

    /// [`SelectEngine::select`] of a route to the GPU ([`Route::to_gpu`]), awaiting the
    /// device's answer instead of waiting for it: no thread is held while the query is queued.
    /// `Ok(None)` when the device gave no answer — none in service, busy past the query's wait,
    /// or failed (logged and counted as a fallback): the caller then runs the query on the CPU,
    /// off its async task ([`SelectEngine::select`] with [`Backend::Cpu`]).
    ///
    /// # Errors
    /// [`SelectError::InvalidParameter`] for BM25 parameters out of range.
    pub async fn select_queued(
        &self,
        index: &Arc<Index>,
        query: &Query,
        route: Route<'_>,
        backend: Backend,
        deadline: Option<Instant>,
    ) -> Result<Option<Selected>, SelectError> {
        let _booking = self.backlog.book(Processor::Gpu, route.choice.gpu_us);
        let wait = self.gpu_wait(&route, backend, deadline);
        let job = route.gpu_job(Arc::clone(index), query);
        let Some((executor, on_device)) = self.pick() else {
            return Ok(None);
        };
        let _queued = executor.queued();
        let ran = on_device.lane.submit_queued(job, wait).await;
        match account(executor, ran, wait) {
            Some(Ok(result)) => {
                let side = Processor::Gpu;
                let ran = Scheduled {
                    result,
                    side,
                    fallback: None,
                };
                Ok(Some(selected(query, ran)))
            }
            Some(Err(GpuSelectError::Query(err))) => Err(err),
            Some(Err(GpuSelectError::Gpu(err))) => {
                fell_back(Stage::Select, &query.terms.join(" "), &err);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// How long a query routed to the GPU along `route` may wait for the device: `gpu` up to
    /// `gpu_queue_ms`, `auto` only as long as waiting still beats the CPU; never past
    /// `deadline`.
    fn gpu_wait(&self, route: &Route, backend: Backend, deadline: Option<Instant>) -> Duration {
        let wait = match backend {
            Backend::Gpu => self.config.gpu_queue,
            Backend::Auto => Duration::from_secs_f64(route.choice.gpu_margin_us() / 1e6),
            Backend::Cpu => Duration::ZERO,
        };
        deadline.map_or(wait, |at| {
            wait.min(at.saturating_duration_since(Instant::now()))
        })
    }

    /// The least loaded device in service, for the next GPU selection.
    fn pick(&self) -> Option<&(Arc<Executor>, SelectDevice)> {
        self.gpu.get()?.pick(&[], |_| true)
    }

    /// Runs `job` on the least loaded device in service, in a batch with the GPU selections
    /// queued beside it: `None` when there is no device in service or the device gave no
    /// answer ([`account`]).
    fn on_gpu(&self, job: GpuJob, wait: Duration) -> Option<GpuAnswer> {
        let (executor, on_device) = self.pick()?;
        let _queued = executor.queued();
        account(executor, on_device.lane.submit(job, wait), wait)
    }
}

/// What the lane of `executor`'s device made of a selection that waited up to `wait`, counted:
/// `None` when no turn took it within `wait` (the device is busy: the caller's CPU is free;
/// counted in `rankserve_gpu_queue_timeouts_total`) or when its turn ended without answering it.
/// A failure of the device takes it out of service; an answer puts one that was being tried
/// again back.
fn account(
    executor: &Executor,
    ran: Result<GpuAnswer, Missed>,
    wait: Duration,
) -> Option<GpuAnswer> {
    match &ran {
        Ok(Ok(_)) => executor.succeeded(),
        Ok(Err(GpuSelectError::Gpu(err))) => {
            executor.failed(err);
        }
        // A zero wait is a query that could not afford to wait: it gave nothing up.
        Err(Missed::NotTaken) if !wait.is_zero() => {
            metrics::counter!("rankserve_gpu_queue_timeouts_total", "stage" => "select")
                .increment(1);
        }
        _ => {}
    }
    ran.ok()
}

/// `ran` as the caller's answer, its fallback (if any) logged and its processor counted.
fn selected(query: &Query, ran: Scheduled) -> Selected {
    if let Some(err) = &ran.fallback {
        fell_back(Stage::Select, &query.terms.join(" "), err);
    }
    metrics::counter!("rankserve_select_backend_total", "backend" => ran.side.as_str())
        .increment(1);
    Selected {
        result: ran.result,
        side: ran.side,
    }
}
