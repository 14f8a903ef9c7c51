//! Where a batch runs: the CPU (a dedicated rayon pool of `cpu_threads`, built once: `pool.rs`)
//! or a GPU (a device's [`Executor`] and the ranker cache on it), chosen per batch, for feature
//! extraction and for scoring.
//!
//! With several GPUs, each has its own ranker cache and FE buffers, and a batch goes to the
//! device the [`Fleet`] picks: the least loaded one that holds the ranker, unless another device
//! is less loaded (it then uploads the ranker: a hot ranker ends up on every device, a cold one
//! stays on one). A device that fails is taken out of service and the batch runs on the next
//! device, or on the CPU when none is left.
//!
//! Scoring:
//! - `backend=cpu` never touches the GPU.
//! - `backend=gpu` runs on the GPU (the server answers 503 `gpu_unavailable` first when there
//!   is none).
//! - `backend=auto` runs on the GPU when the batch has at least the ranker's measured crossover
//!   of documents ([`crate::rank::gpu::crossover`]), measured when the ranker loads.
//!
//! Hit documents ([`HitPath`], [`Backends::hit_path`]) follow `fe_backend` (the
//! configuration's) and the scoring backend:
//! - `fe_backend=cpu`, or no GPU: FE on the CPU pool, then the rows are scored as above.
//! - scoring on `cpu`: FE on the GPU only for `fe_backend=gpu` (the rows come back to the CPU).
//! - otherwise the fused device path ([`Backends::rank_hits`]): the hits laid out on the CPU pool,
//!   then one device turn extracts, gathers and scores them and only the scores come back; for
//!   `fe_backend=gpu`, for `fe_backend=auto` (the default) with scoring on `gpu`, and for `auto`
//!   on both from the ranker's hits crossover ([`crate::rank::gpu::crossover::measure_hits`]: FE
//!   and scoring together) on; under `auto` only while a device is idle or the batch is large
//!   ([`FUSED_UNDER_LOAD_DOCS`]). Fused requests waiting for the same device share its turn
//!   (the device's fused lane, `fused.rs`, scores those queued so far in its next turn).
//!
//! Any GPU failure (a CUDA error, a ranker over the GPU cache's budget, a query over the FE
//! kernel's term limit) moves the work to the CPU, which gives the same answer; it is logged
//! and counted by [`fell_back`], and the reply says `cpu`.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::batch::{micros, record_batch};
use super::fused::{self, FusedLane, FusedScores};
use super::pool::CpuPool;
use super::{HitBatch, RowSource};
use crate::backend::{fell_back, Backend, Processor, Stage};
use crate::gpu::pinned::PinnedPool;
use crate::gpu::{Executor, Fleet, GpuError};
use crate::rank::fe::{FeatureResolver, HitError};
use crate::rank::gpu::cache::GpuRankerCache;
use crate::rank::gpu::crossover::{self, Crossover, HitSample};
use crate::rank::gpu::fe::GpuFe;
use crate::rank::gpu::layout::{FeLayout, GpuFeError};
use crate::rank::gpu::ranker::DEFAULT_MAX_BATCH;
use crate::rank::store::LoadedRanker;

/// The longest one batch size of the crossover measurement may take before larger sizes are
/// skipped.
const CROSSOVER_STEP_BUDGET: Duration = Duration::from_millis(200);

/// The ranking stage's share of a device.
struct GpuRanking {
    rankers: Arc<GpuRankerCache>,
    /// FE's device buffers, reused from batch to batch (used during the device's turn).
    fe: Arc<Mutex<GpuFe>>,
    /// Fused requests waiting for the device: its lane's thread scores every one queued so
    /// far in its next turn, those of one ranker in one device batch. `None` when the thread
    /// could not start (fused requests then run on the CPU).
    fused: Option<FusedLane>,
}

/// How a batch of hit documents runs (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitPath {
    /// Feature rows first (on the GPU when `fe_on_gpu`, rows back to the host), then scored as
    /// rows are.
    Rows { fe_on_gpu: bool },
    /// Feature extraction and scoring in one device turn.
    Fused,
}

impl HitPath {
    /// The path for `fe_backend` and the scoring `backend`; `crossed` says whether the batch
    /// reaches the ranker's hits crossover (asked only for `auto` on both), `uncontended`
    /// whether a fused turn would not hold up batched work (asked only for `fe_backend=auto`
    /// with the GPU possible for scoring).
    fn choose(
        fe_backend: Backend,
        backend: Backend,
        has_gpu: bool,
        crossed: impl FnOnce() -> bool,
        uncontended: impl FnOnce() -> bool,
    ) -> HitPath {
        let fused_or_rows = |fused: bool| match fused {
            true => HitPath::Fused,
            false => HitPath::Rows { fe_on_gpu: false },
        };
        match (has_gpu, fe_backend, backend) {
            (false, ..) | (true, Backend::Cpu, _) => HitPath::Rows { fe_on_gpu: false },
            (true, fe, Backend::Cpu) => HitPath::Rows {
                fe_on_gpu: fe == Backend::Gpu,
            },
            (true, Backend::Gpu, _) => HitPath::Fused,
            (true, Backend::Auto, Backend::Gpu) => fused_or_rows(uncontended()),
            (true, Backend::Auto, Backend::Auto) => fused_or_rows(crossed() && uncontended()),
        }
    }
}

/// Under `fe_backend=auto`, the fewest hit documents with which a batch takes the fused path
/// while every device has work: fused requests share a device turn only with the fused
/// requests queued at the moment, where feature rows from every request of the ranker share
/// batches. With shared turns (docs/benchmarks.md, "Served"), requests of 100 documents on one
/// GPU of the H200 host: the fused path served 0.92–1.15× the rows' requests at 16 clients and
/// 0.72–0.74× at 64; of 1 000 documents on the H100 host, 2.1–2.9× at 16 and 64 clients. Sizes
/// between were not measured.
const FUSED_UNDER_LOAD_DOCS: usize = 512;

/// Hit documents ranked by [`Backends::rank_hits`].
#[derive(Debug)]
pub struct HitsScored {
    pub scores: Vec<f64>,
    /// The feature rows, when asked for.
    pub rows: Option<Vec<f64>>,
    /// Where FE and scoring ran (together).
    pub processor: Processor,
    /// Host time laying the hits out for the device, or extracting their features on the CPU.
    pub fe_us: u64,
    /// Time waiting for the device's turn.
    pub queue_us: u64,
    /// The device's turn (copy in, FE, gather, MIT, ME, copy out), or the CPU's scoring.
    pub eval_us: u64,
    /// Documents and requests in the batch that scored them (on the device, several requests'
    /// may share one turn).
    pub batch_docs: usize,
    pub batch_requests: usize,
}

/// How [`Backends::lay_out_source`] ended.
#[derive(Debug)]
pub enum SourceLaidOut {
    /// Laid out for the device from `started` on, to be scored by
    /// [`Backends::score_queued`] (or [`Backends::score_layouts`] with the rows).
    Layouts {
        layouts: Vec<FeLayout>,
        started: Instant,
    },
    /// The source did not lay its documents out (they are not all hit documents, or not valid):
    /// its rows decide.
    Declined,
    /// The batch is over the FE kernel's limits (logged and counted): its rows, on the CPU.
    FellBack,
}

/// The CPU pool and, once the probe found one, the GPU.
pub struct Backends {
    /// `cpu_threads` as configured; `None`: [`default_threads`].
    pub(super) asked_threads: Option<usize>,
    /// Built at its first use, which in the server comes after the warm-up's GPU probe: the
    /// default size depends on whether a GPU ranks.
    pub(super) cpu: OnceLock<CpuPool>,
    /// Tasks given to the pool by [`Backends::on_cpu_pool_task`] and not yet ended (queued or
    /// running): what [`Backends::width`] shares the threads among.
    pub(super) in_flight: Arc<AtomicUsize>,
    fe_backend: Backend,
    gpu: OnceLock<Fleet<GpuRanking>>,
    /// Pinned host memory that hit layouts are joined into, for any device ([`PinnedPool`]).
    pinned: OnceLock<PinnedPool>,
}

/// The most pinned host memory hit layouts hold at once: 64 requests of 10 000 hit documents
/// (about 2.5 MB each) fit; past it, layouts stay on the heap (a pageable copy).
const PINNED_LAYOUT_BYTES: usize = 256 << 20;

impl Backends {
    /// CPU work on `threads` threads (1: the calling thread; `None`: [`default_threads`]); hit
    /// documents' features on `fe_backend`. The GPU comes later, from
    /// [`Backends::install_gpu`].
    pub fn new(threads: Option<usize>, fe_backend: Backend) -> Backends {
        Backends {
            asked_threads: threads,
            cpu: OnceLock::new(),
            in_flight: Arc::new(AtomicUsize::new(0)),
            fe_backend,
            gpu: OnceLock::new(),
            pinned: OnceLock::new(),
        }
    }

    /// Makes `executors`' devices available, each with a ranker cache of `cache_bytes`; only
    /// the first call with at least one device counts.
    pub fn install_gpu(&self, executors: &[Arc<Executor>], cache_bytes: u64) {
        if executors.is_empty() {
            return;
        }
        let devices = (executors.iter())
            .map(|executor| {
                let device = Arc::clone(executor.device());
                let rankers = Arc::new(GpuRankerCache::new(device, cache_bytes));
                let fe = Arc::new(Mutex::new(GpuFe::new()));
                let lane = (FusedLane::start(executor, &rankers, &fe)).inspect_err(
                    |err| tracing::error!(error = %err, "no fused lane: fused requests on the CPU"),
                );
                let fused = lane.ok();
                (Arc::clone(executor), GpuRanking { rankers, fe, fused })
            })
            .collect();
        if self.gpu.set(Fleet::new(devices)).is_ok() {
            let ctx = Arc::clone(executors[0].device().context());
            let _ = self.pinned.set(PinnedPool::new(ctx, PINNED_LAYOUT_BYTES));
        }
    }

    /// Whether there is a GPU.
    pub fn has_gpu(&self) -> bool {
        self.gpu.get().is_some()
    }

    /// How many GPUs batches are spread over (0 without one).
    pub fn gpu_devices(&self) -> usize {
        self.gpu.get().map_or(0, |fleet| fleet.iter().count())
    }

    /// Each device's ordinal and GPU ranker cache (none without a GPU).
    pub fn gpu_rankers(&self) -> impl Iterator<Item = (usize, &GpuRankerCache)> {
        (self.gpu.get().into_iter().flat_map(Fleet::iter))
            .map(|(executor, gpu)| (executor.device().ordinal(), &*gpu.rankers))
    }

    /// Whether [`Backends::evaluate`] with `backend` runs every batch of `loaded` of up to
    /// `max_docs` rows on the CPU: the CPU was asked for, there is no GPU, or under `auto` the
    /// ranker's crossover lies beyond `max_docs` (a host whose cores outrun the device for
    /// every batch the engine forms; or no crossover).
    pub fn cpu_only(&self, loaded: &LoadedRanker, backend: Backend, max_docs: usize) -> bool {
        backend == Backend::Cpu || !self.has_gpu() || !self.prefers_gpu(loaded, max_docs, backend)
    }

    /// Whether the scoring `backend` sends a batch of `n_docs` rows of `loaded` to the GPU.
    fn prefers_gpu(&self, loaded: &LoadedRanker, n_docs: usize, backend: Backend) -> bool {
        match backend {
            Backend::Cpu => false,
            Backend::Gpu => true,
            Backend::Auto => self
                .crossover(loaded)
                .is_some_and(|c| c.prefers_gpu(n_docs)),
        }
    }

    /// How `n_docs` hit documents for `loaded`, scored on `backend`, run (see the module docs).
    pub fn hit_path(&self, loaded: &LoadedRanker, n_docs: usize, backend: Backend) -> HitPath {
        HitPath::choose(
            self.fe_backend,
            backend,
            self.has_gpu(),
            || {
                self.hits_crossover(loaded)
                    .is_some_and(|c| c.prefers_gpu(n_docs))
            },
            || n_docs >= FUSED_UNDER_LOAD_DOCS || self.device_idle(),
        )
    }

    /// Whether some device has no work waiting or running.
    fn device_idle(&self) -> bool {
        (self.gpu.get()).is_some_and(|fleet| fleet.iter().any(|(executor, _)| executor.load() == 0))
    }

    /// Features and scores of `batch` for `loaded` on the fused device path: laid out on the CPU
    /// pool (validated in the same pass), then one device turn, which splits a batch over the
    /// device batch into several; only the scores come back, and the rows with `keep_rows`. A
    /// GPU failure anywhere (or a query over the FE kernel's terms) reruns the whole batch on
    /// the CPU, FE and scoring. Blocking while it waits for the device's turn.
    ///
    /// # Errors
    /// [`FeRefused::Ranker`] when the ranker has a feature FE cannot produce;
    /// [`FeRefused::Hits`] (the CPU's error, whichever backend found it) for an invalid batch.
    pub fn rank_hits(
        &self,
        loaded: &Arc<LoadedRanker>,
        batch: &HitBatch,
        keep_rows: bool,
    ) -> Result<HitsScored, FeRefused> {
        let resolver = loaded
            .fe
            .as_ref()
            .map_err(|err| FeRefused::Ranker(err.to_string()))?;
        if self.has_gpu() && !batch.docs.is_empty() {
            let started = Instant::now();
            let map = resolver.gather_map();
            let laid_out = self.install(|| {
                let (query, stats, docs) = (&batch.query, &batch.stats, &batch.docs);
                let max = DEFAULT_MAX_BATCH;
                let pinned = self.pinned.get();
                FeLayout::build_split(query, stats, docs, Some(&map), max, self.width(), pinned)
            });
            match laid_out {
                Err(GpuFeError::Hits(err)) => return Err(FeRefused::Hits(err)),
                Err(GpuFeError::Gpu(err)) => fell_back(Stage::Fe, &loaded.name, &err),
                Ok(layouts) => {
                    if let Some(scored) = self.score_layouts(loaded, layouts, started, keep_rows) {
                        return Ok(scored);
                    }
                }
            }
        }
        let started = Instant::now();
        let mut rows = vec![f64::NAN; batch.docs.len() * resolver.len()];
        self.install(|| {
            let (query, stats) = (&batch.query, &batch.stats);
            resolver.extract_batch(query, stats, &batch.docs, &mut rows, self.width())
        })?;
        let extracted = Instant::now();
        let scores = self.cpu(loaded, &rows);
        record_batch(batch.docs.len(), 1);
        Ok(HitsScored {
            scores,
            rows: keep_rows.then_some(rows),
            processor: Processor::Cpu,
            fe_us: micros(extracted - started),
            queue_us: 0,
            eval_us: micros(extracted.elapsed()),
            batch_docs: batch.docs.len(),
            batch_requests: 1,
        })
    }

    /// The first half of [`Backends::rank_hits`] for a row source that lays its hit documents
    /// out itself ([`RowSource::hit_layouts`], on the CPU pool), for the ranker's fused device
    /// path.
    pub fn lay_out_source<S: RowSource>(
        &self,
        loaded: &LoadedRanker,
        source: &mut S,
    ) -> SourceLaidOut {
        let Ok(resolver) = loaded.fe.as_ref() else {
            return SourceLaidOut::Declined;
        };
        if !self.has_gpu() {
            return SourceLaidOut::Declined;
        }
        let started = Instant::now();
        let map = resolver.gather_map();
        let laid_out = self.install(|| {
            source.hit_layouts(&map, DEFAULT_MAX_BATCH, self.width(), self.pinned.get())
        });
        match laid_out {
            None => SourceLaidOut::Declined,
            Some(Err(err)) => {
                fell_back(Stage::Fe, &loaded.name, &err);
                SourceLaidOut::FellBack
            }
            Some(Ok(layouts)) => SourceLaidOut::Layouts { layouts, started },
        }
    }

    /// The fused path's device turn: `layouts` (laid out from `started` on) extracted, gathered
    /// and scored on the GPU, blocking while it waits for a turn; `None` after a GPU failure
    /// (logged and counted), which leaves the batch to the CPU. Without `keep_rows` the request
    /// queues on the device ([`fused::score`]) and may share its turn with others; with
    /// it (`explain`), it takes a turn alone.
    pub fn score_layouts(
        &self,
        loaded: &Arc<LoadedRanker>,
        layouts: Vec<FeLayout>,
        started: Instant,
        keep_rows: bool,
    ) -> Option<HitsScored> {
        let gpu = self.gpu.get()?;
        let waiting = Instant::now();
        let n_docs = layouts.iter().map(FeLayout::n_docs).sum();
        let scored = if keep_rows {
            let layouts: Vec<&FeLayout> = layouts.iter().collect();
            gpu.run(holds(loaded), |device, gpu| {
                let turn = Instant::now();
                let cached =
                    (gpu.rankers).get_or_upload(&loaded.name, loaded.version, &loaded.ranker)?;
                let fe = &mut gpu.fe.lock();
                let scored = (cached.gpu).score_hits(device, fe, &layouts, false, true)?;
                record_batch(n_docs, 1);
                let fused = FusedScores {
                    scores: scored.scores,
                    turn,
                    turn_us: micros(turn.elapsed()),
                    batch_docs: n_docs,
                    batch_requests: 1,
                };
                Ok((fused, scored.rows))
            })
        } else {
            (self.fused_lane(loaded))
                .and_then(|(executor, lane)| fused::score(executor, lane, loaded, layouts))
                .map(|fused| (fused, None))
        };
        hits_scored(loaded, scored, started, waiting)
    }

    /// [`Backends::score_layouts`] without the rows, awaited rather than waited for: the
    /// request queues on the device's fused lane and no thread waits for its turn.
    pub async fn score_queued(
        &self,
        loaded: &Arc<LoadedRanker>,
        layouts: Vec<FeLayout>,
        started: Instant,
    ) -> Option<HitsScored> {
        let waiting = Instant::now();
        let scored = match self.fused_lane(loaded) {
            Ok((executor, lane)) => fused::score_queued(executor, lane, loaded, layouts).await,
            Err(err) => Err(err),
        };
        hits_scored(loaded, scored.map(|fused| (fused, None)), started, waiting)
    }

    /// The device a fused request for `loaded` goes to, and its fused lane.
    fn fused_lane(&self, loaded: &LoadedRanker) -> Result<(&Executor, &FusedLane), GpuError> {
        let unavailable = |reason: &str| GpuError::Unavailable {
            reason: reason.into(),
        };
        let gpu = (self.gpu.get()).ok_or_else(|| unavailable("no GPU"))?;
        let (executor, gpu) = (gpu.pick(&[], holds(loaded)))
            .ok_or_else(|| unavailable("every GPU is out of service after a failure"))?;
        let lane =
            (gpu.fused.as_ref()).ok_or_else(|| unavailable("the device has no fused lane"))?;
        Ok((executor, lane))
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
            // An invalid batch is the caller's error, not the device's: it stops the work at
            // once and comes back as it is.
            let mut invalid = None;
            let extracted = gpu.run(
                |_| true,
                |device, gpu| {
                    let (query, stats) = (&batch.query, &batch.stats);
                    let fe = &mut gpu.fe.lock();
                    match fe.extract_batch(device, resolver, query, stats, &batch.docs, &mut rows) {
                        Err(GpuFeError::Hits(err)) => {
                            invalid = Some(err);
                            Ok(())
                        }
                        Err(GpuFeError::Gpu(err)) => Err(err),
                        Ok(()) => Ok(()),
                    }
                },
            );
            match (extracted, invalid) {
                (_, Some(err)) => return Err(FeRefused::Hits(err)),
                (Ok(()), None) => return Ok((rows, Processor::Gpu)),
                (Err(err), None) => fell_back(Stage::Fe, &loaded.name, &err),
            }
        }
        resolver.extract_batch(
            &batch.query,
            &batch.stats,
            &batch.docs,
            &mut rows,
            self.width(),
        )?;
        Ok((rows, Processor::Cpu))
    }

    /// Scores on the CPU: on the pool, in parallel unless [`Backends::width`] says one thread.
    pub fn cpu(&self, loaded: &LoadedRanker, features: &[f64]) -> Vec<f64> {
        match (self.pool(), self.width()) {
            (Some(pool), 1) => pool.install(|| loaded.plan.score_batch(features, 1)),
            (Some(pool), _) => pool.install(|| loaded.plan.score_batch(features, 0)),
            (None, _) => loaded.plan.score_batch(features, 1),
        }
    }

    /// Scores the `n_docs` rows of `blocks` (row-major blocks of the ranker's width, one per
    /// request of a batch), in block order, on the backend `backend` picks (see the module
    /// docs). The GPU stages its batches straight from the blocks; the CPU scores them as one
    /// matrix (copied into one only when there are several).
    pub fn evaluate(
        &self,
        loaded: &LoadedRanker,
        blocks: &[&[f64]],
        n_docs: usize,
        backend: Backend,
    ) -> (Vec<f64>, Processor) {
        let on_gpu = self.prefers_gpu(loaded, n_docs, backend);
        if let (true, Some(gpu)) = (on_gpu && n_docs > 0, self.gpu.get()) {
            let scored = gpu.run(holds(loaded), |device, gpu| {
                let cached =
                    (gpu.rankers).get_or_upload(&loaded.name, loaded.version, &loaded.ranker)?;
                cached.gpu.score_blocks(device, blocks, false)
            });
            match scored {
                Ok(scored) => return (scored.scores, Processor::Gpu),
                Err(err) => fell_back(Stage::Rank, &loaded.name, &err),
            }
        }
        let scores = match blocks {
            [block] => self.cpu(loaded, block),
            _ => self.cpu(loaded, &blocks.concat()),
        };
        (scores, Processor::Cpu)
    }

    /// The ranker's crossover, measured on first use when there is a GPU (`None` without one).
    /// A failed measurement is logged and keeps the ranker on the CPU under `auto`.
    pub fn crossover<'a>(&self, loaded: &'a LoadedRanker) -> Option<&'a Crossover> {
        let fleet = self.gpu.get()?;
        Some(loaded.crossover.get_or_init(|| {
            let Some((executor, gpu)) = fleet.first() else {
                return no_crossover();
            };
            let measured = executor.run(|device| {
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
            found(loaded, "scoring", measured)
        }))
    }

    /// The ranker's crossover for hit documents (FE and scoring together, CPU against the fused
    /// device path), measured on first use when there is a GPU and the ranker takes hit
    /// documents (`None` otherwise). A failed measurement is logged and keeps hit documents on
    /// the CPU under `auto`.
    pub fn hits_crossover<'a>(&self, loaded: &'a LoadedRanker) -> Option<&'a Crossover> {
        let fleet = self.gpu.get()?;
        let resolver = loaded.fe.as_ref().ok()?;
        Some(loaded.hits_crossover.get_or_init(|| {
            let Some((executor, gpu)) = fleet.first() else {
                return no_crossover();
            };
            let map = resolver.gather_map();
            let cpu = |sample: &HitSample<'_>| {
                std::hint::black_box(self.cpu_hits(loaded, resolver, sample));
            };
            let measured = executor.run(|device| {
                let cached =
                    (gpu.rankers).get_or_upload(&loaded.name, loaded.version, &loaded.ranker)?;
                let gpu_run = |s: &HitSample<'_>| -> Result<(), GpuError> {
                    let layouts = self
                        .install(|| {
                            FeLayout::build_split(
                                s.query,
                                s.stats,
                                s.docs,
                                Some(&map),
                                DEFAULT_MAX_BATCH,
                                self.threads(),
                                self.pinned.get(),
                            )
                        })
                        .map_err(GpuFeError::into_gpu_error)?;
                    let fe = &mut gpu.fe.lock();
                    let layouts: Vec<&FeLayout> = layouts.iter().collect();
                    (cached.gpu)
                        .score_hits(device, fe, &layouts, false, false)
                        .map(|_| ())
                };
                crossover::measure_hits(&cpu, &gpu_run, CROSSOVER_STEP_BUDGET)
            });
            found(loaded, "hit documents (FE and scoring)", measured)
        }))
    }

    /// CPU FE and scoring of a crossover sample, as [`Backends::rank_hits`] runs them on the CPU.
    fn cpu_hits(
        &self,
        loaded: &LoadedRanker,
        resolver: &FeatureResolver,
        sample: &HitSample<'_>,
    ) -> Vec<f64> {
        let mut rows = vec![f64::NAN; sample.docs.len() * resolver.len()];
        let extracted = self.install(|| {
            let (query, stats) = (sample.query, sample.stats);
            resolver.extract_batch(query, stats, sample.docs, &mut rows, self.threads())
        });
        match extracted {
            Ok(()) => self.cpu(loaded, &rows),
            Err(_) => Vec::new(),
        }
    }

    /// Readies `loaded` for the GPU: its scoring crossover, and its hits crossover when
    /// `fe_backend=auto` will follow it. Blocking.
    pub fn prepare(&self, loaded: &LoadedRanker) {
        self.crossover(loaded);
        if self.fe_backend == Backend::Auto {
            self.hits_crossover(loaded);
        }
    }
}

/// A crossover measurement's result, logged; a failure is counted as a fallback and gives no
/// crossover (the CPU under `auto`).
fn found(loaded: &LoadedRanker, what: &str, measured: Result<Crossover, GpuError>) -> Crossover {
    match measured {
        Ok(found) => {
            tracing::info!(ranker = %loaded.name, crossover_docs = ?found.docs, "CPU/GPU crossover of {what} measured");
            found
        }
        Err(err) => {
            fell_back(Stage::Rank, &loaded.name, &err);
            no_crossover()
        }
    }
}

/// No crossover: the ranker stays on the CPU under `auto`.
fn no_crossover() -> Crossover {
    Crossover {
        docs: None,
        points: Vec::new(),
    }
}

/// What a fused device turn gave `loaded`'s request laid out from `started` on that began to
/// wait for it at `waiting`: its scores and timings, or `None` after a GPU failure (logged and
/// counted), which leaves the batch to the CPU.
fn hits_scored(
    loaded: &LoadedRanker,
    scored: Result<(FusedScores, Option<Vec<f64>>), GpuError>,
    started: Instant,
    waiting: Instant,
) -> Option<HitsScored> {
    match scored {
        Ok((scored, rows)) => Some(HitsScored {
            scores: scored.scores,
            rows,
            processor: Processor::Gpu,
            fe_us: micros(waiting - started),
            queue_us: micros(scored.turn.saturating_duration_since(waiting)),
            eval_us: scored.turn_us,
            batch_docs: scored.batch_docs,
            batch_requests: scored.batch_requests,
        }),
        Err(err) => {
            fell_back(Stage::Rank, &loaded.name, &err);
            None
        }
    }
}

/// Whether a device's ranker cache holds `loaded` (some version of it), for the [`Fleet`]'s
/// choice of a device.
fn holds(loaded: &LoadedRanker) -> impl Fn(&GpuRanking) -> bool + '_ {
    |gpu| gpu.rankers.contains(&loaded.name)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Hit documents take the fused device path only with a GPU, FE not pinned to the CPU and
    /// scoring not pinned to the CPU; `auto` on both asks the hits crossover, and only then.
    #[test]
    fn hit_paths_follow_both_backends_and_the_hits_crossover() {
        use Backend::{Auto, Cpu, Gpu};
        let rows = |fe_on_gpu| HitPath::Rows { fe_on_gpu };
        let never = || -> bool { panic!("the crossover is asked only for auto on both") };
        let unasked = || -> bool { panic!("the load is asked only for fe_backend=auto") };
        let yes = || true;
        let no = || false;
        for backend in [Auto, Cpu, Gpu] {
            for fe in [Auto, Cpu, Gpu] {
                assert_eq!(
                    HitPath::choose(fe, backend, false, never, unasked),
                    rows(false)
                );
            }
            assert_eq!(
                HitPath::choose(Cpu, backend, true, never, unasked),
                rows(false)
            );
        }
        assert_eq!(HitPath::choose(Gpu, Cpu, true, never, unasked), rows(true));
        assert_eq!(
            HitPath::choose(Auto, Cpu, true, never, unasked),
            rows(false)
        );
        // `fe_backend=gpu` is the fused path whatever the load.
        assert_eq!(
            HitPath::choose(Gpu, Auto, true, never, unasked),
            HitPath::Fused
        );
        assert_eq!(
            HitPath::choose(Gpu, Gpu, true, never, unasked),
            HitPath::Fused
        );
        // `fe_backend=auto`: the fused path when it would not hold up batched work.
        assert_eq!(HitPath::choose(Auto, Gpu, true, never, yes), HitPath::Fused);
        assert_eq!(HitPath::choose(Auto, Gpu, true, never, no), rows(false));
        assert_eq!(HitPath::choose(Auto, Auto, true, yes, yes), HitPath::Fused);
        assert_eq!(HitPath::choose(Auto, Auto, true, no, yes), rows(false));
        assert_eq!(HitPath::choose(Auto, Auto, true, yes, no), rows(false));
    }
}
