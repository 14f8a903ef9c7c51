//! The ranking stage's engine: everything between a batch of documents and their scores, decided
//! here once. It owns the ranker store (files and the CPU cache, [`RankerStore`]), the CPU pool
//! and the device's ranker cache ([`backends`]), the per-ranker batching queues ([`batch`]), the
//! CPU/GPU choice for feature extraction and for scoring, and the fallback to the CPU.
//!
//! Its input is stage-side ([`Documents`]): feature rows, hit documents of one query in feature
//! extraction's layout ([`HitBatch`]), or a [`RowSource`] that produces rows on the CPU pool
//! (the `/v1/rank` MessagePack reader, which extracts features as it decodes documents). It
//! knows nothing of HTTP: a caller turns its request into a [`RankJob`] and gets [`Ranked`]
//! back, or a [`RankError`].
//!
//! A job's trip: hit documents that take the fused device path ([`backends::HitPath::Fused`])
//! are extracted and scored in one device turn, alone ([`backends::Backends::rank_hits`]; a
//! source that may give hit documents lays them out itself, [`RowSource::hit_layouts`], on
//! the pool, [`backends::Backends::lay_out_source`], and the request awaits their scores from
//! the device's fused lane, [`backends::Backends::score_queued`], or the source goes back to
//! its rows).
//! Otherwise its rows are produced (FE for hit documents: on the CPU pool, or on the GPU when
//! `fe_backend=gpu` and scoring stays on the CPU). A job that can only run on the CPU is then
//! scored at once on the same pool thread: one trip to the pool, not two. One that may run on
//! the GPU goes, from a blocking thread, to its ranker's lane ([`batch::Batcher`]): scored at
//! once when no batch of that ranker runs, else in the next batch; batches run on the backend
//! [`backends::Backends::evaluate`] picks.

pub mod backends;
pub mod batch;
mod fused;
pub mod pool;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

pub use backends::{Backends, FeRefused, HitPath, HitsScored, SourceLaidOut};
pub use batch::{BatchConfig, ScoreError, Scored};
pub use pool::PoolTaskFailed;

use crate::backend::{Backend, Processor};
use crate::gpu::pinned::PinnedPool;
use crate::gpu::{Executor, GpuError};
use crate::rank::fe::{CorpusStats, GatherMap, HitDocument, QueryInfo};
use crate::rank::gpu::cache::GpuRankerCache;
use crate::rank::gpu::layout::FeLayout;
use crate::rank::store::{LoadedRanker, RankerStore};
use batch::{micros, Batcher, Job};
use tokio::sync::oneshot;

/// How the engine runs.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Threads of the CPU pool (1: the calling thread; `None`: [`pool::default_threads`]).
    pub threads: Option<usize>,
    /// Where hit documents' features are extracted (see [`backends`]).
    pub fe_backend: Backend,
    /// The batching queues.
    pub batch: BatchConfig,
    /// Budget of the device's ranker cache.
    pub gpu_cache_bytes: u64,
}

/// Hit documents of one query, in feature extraction's layout.
#[derive(Debug, Clone, PartialEq)]
pub struct HitBatch {
    pub query: QueryInfo,
    pub stats: CorpusStats,
    pub docs: Vec<HitDocument>,
}

/// A producer of feature rows that runs on the CPU pool: a decoder that extracts features as it
/// reads its documents.
pub trait RowSource: Send + 'static {
    /// Why it produced no rows (its documents are invalid).
    type Error: Send + 'static;

    /// Its documents.
    fn len(&self) -> usize;

    /// Whether it has no documents.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rows for `loaded` (row-major, the ranker's width), parallel on the current rayon
    /// pool over `threads`; `Ok(None)` when the source turned out not to be what its owner read
    /// it as, who must decide again from it ([`Ranked::Reread`]).
    ///
    /// # Errors
    /// Its documents are invalid.
    fn rows(
        &mut self,
        loaded: &LoadedRanker,
        threads: usize,
    ) -> Result<Option<Vec<f64>>, Self::Error>;

    /// Whether its documents may be hit documents: whether the fused device path is worth
    /// trying ([`RowSource::hit_layouts`]). None by default.
    fn may_give_hits(&self) -> bool {
        false
    }

    /// Its hit documents laid out for the fused device path in layouts of at most `max_docs`,
    /// with `gather`'s static features, parallel on the current rayon pool over `threads`.
    /// `None` when it does not lay them out (not all hit documents, or not valid ones: its
    /// [`RowSource::rows`] then decide, errors included); `Some(Err)` when the batch is over the
    /// device's limits (its rows then go to the CPU). Joined into `pinned` memory while the
    /// pool has room. None by default.
    fn hit_layouts(
        &mut self,
        gather: &GatherMap,
        max_docs: usize,
        threads: usize,
        pinned: Option<&PinnedPool>,
    ) -> Option<Result<Vec<FeLayout>, GpuError>> {
        let _ = (gather, max_docs, threads, pinned);
        None
    }
}

/// No source: for callers whose documents are rows or hits.
impl RowSource for Infallible {
    type Error = Infallible;

    fn len(&self) -> usize {
        match *self {}
    }

    fn rows(&mut self, _: &LoadedRanker, _: usize) -> Result<Option<Vec<f64>>, Infallible> {
        match *self {}
    }
}

/// A batch's documents.
#[derive(Debug)]
pub enum Documents<S> {
    /// Feature rows, row-major, the ranker's width.
    Rows(Vec<f64>),
    /// Hit documents, for feature extraction.
    Hits(HitBatch),
    /// Rows its owner produces on the CPU pool.
    Source(S),
}

/// One caller's documents to rank.
pub struct RankJob<S> {
    pub ranker: Arc<LoadedRanker>,
    pub documents: Documents<S>,
    /// The scoring backend (the request's, else the configuration's).
    pub backend: Backend,
    /// Whether the caller itself asked for the CPU (such a job is never batched).
    pub asked_cpu: bool,
    /// The time after which the work is not worth starting.
    pub deadline: Option<Instant>,
    /// Whether [`Ranked::Scored`] keeps the feature rows (to explain them).
    pub keep_rows: bool,
}

/// What ranking a job gave.
#[derive(Debug)]
pub enum Ranked<S> {
    Scored {
        scored: Scored,
        /// Time producing the rows (FE), and where it ran (rows given as such: the CPU).
        fe_us: u64,
        fe_backend: Processor,
        /// The rows, when the job asked to keep them.
        rows: Option<Vec<f64>>,
        /// The job's source, given back for its owner to free (off its reply's path).
        source: Option<S>,
    },
    /// The source asked to be decided again ([`RowSource::rows`] gave `None`).
    Reread(S),
}

/// Why a job was not ranked.
#[derive(Debug, thiserror::Error)]
pub enum RankError<E> {
    /// The source's documents are invalid.
    #[error("the documents are invalid")]
    Source(E),
    /// Feature extraction refused the hit documents.
    #[error(transparent)]
    Fe(#[from] FeRefused),
    /// The deadline passed first.
    #[error("deadline passed")]
    DeadlineExceeded,
    /// The engine's own failure.
    #[error("ranking failed: {0}")]
    Internal(String),
}

/// The ranking stage's engine; see the module docs.
pub struct RankEngine {
    store: RankerStore,
    backends: Arc<Backends>,
    batcher: Arc<Batcher>,
    gpu_cache_bytes: u64,
}

impl RankEngine {
    /// An engine over `store`, on the CPU until [`RankEngine::install_gpu`].
    pub fn new(store: RankerStore, config: EngineConfig) -> RankEngine {
        let backends = Arc::new(Backends::new(config.threads, config.fe_backend));
        RankEngine {
            store,
            batcher: Arc::new(Batcher::new(config.batch, Arc::clone(&backends))),
            backends,
            gpu_cache_bytes: config.gpu_cache_bytes,
        }
    }

    /// The ranker store.
    pub fn store(&self) -> &RankerStore {
        &self.store
    }

    /// The CPU pool and the GPU.
    pub fn backends(&self) -> &Arc<Backends> {
        &self.backends
    }

    /// Ranks on `executors`' devices from now on (the first call with a device counts).
    pub fn install_gpu(&self, executors: &[Arc<Executor>]) {
        self.backends.install_gpu(executors, self.gpu_cache_bytes);
    }

    /// Whether there is a GPU.
    pub fn has_gpu(&self) -> bool {
        self.backends.has_gpu()
    }

    /// Each device's ordinal and ranker cache (none without a GPU).
    pub fn gpu_rankers(&self) -> impl Iterator<Item = (usize, &GpuRankerCache)> {
        self.backends.gpu_rankers()
    }

    /// Whether some device holds a copy of `name`.
    pub fn resident_on_gpu(&self, name: &str) -> bool {
        self.gpu_rankers().any(|(_, gpu)| gpu.contains(name))
    }

    /// Readies `loaded` for the GPU (when there is one): uploads it and measures its CPU/GPU
    /// crossover. Blocking.
    pub fn prepare(&self, loaded: &LoadedRanker) {
        self.backends.prepare(loaded);
    }

    /// Forgets the device copy of `name` (after it was deleted from the store).
    pub fn forget(&self, name: &str) {
        for (_, gpu) in self.gpu_rankers() {
            gpu.remove(name);
        }
    }

    /// Ranks `job` (see the module docs).
    ///
    /// # Errors
    /// [`RankError`]: the documents are invalid, the deadline passed, a task failed.
    pub async fn rank<S: RowSource>(
        &self,
        job: RankJob<S>,
    ) -> Result<Ranked<S>, RankError<S::Error>> {
        let RankJob {
            ranker,
            documents,
            backend,
            asked_cpu,
            deadline,
            keep_rows,
        } = job;
        // A deadline already passed gets its answer before any work (and the same answer
        // whichever way the documents came: no race with a fast pool).
        if deadline.is_some_and(|deadline| deadline <= Instant::now()) {
            return Err(RankError::DeadlineExceeded);
        }
        let n_docs = match &documents {
            Documents::Rows(rows) => rows.len() / ranker.ranker.features.len().max(1),
            Documents::Hits(batch) => batch.docs.len(),
            Documents::Source(source) => source.len(),
        };
        let path = match &documents {
            Documents::Hits(_) => self.backends.hit_path(&ranker, n_docs, backend),
            // A source's features are extracted on the CPU unless it lays its hits out.
            Documents::Source(source) if source.may_give_hits() => {
                match self.backends.hit_path(&ranker, n_docs, backend) {
                    HitPath::Fused => HitPath::Fused,
                    HitPath::Rows { .. } => HitPath::Rows { fe_on_gpu: false },
                }
            }
            _ => HitPath::Rows { fe_on_gpu: false },
        };
        let (documents, backend) = match (documents, path) {
            (Documents::Hits(batch), HitPath::Fused) => {
                return self.rank_fused(ranker, batch, deadline, keep_rows).await;
            }
            (Documents::Source(source), HitPath::Fused) => {
                match self
                    .rank_source_fused(&ranker, source, backend, deadline, keep_rows)
                    .await?
                {
                    Ok(ranked) => return Ok(ranked),
                    Err((source, backend)) => (Documents::Source(source), backend),
                }
            }
            (documents, _) => (documents, backend),
        };
        let fe_on_gpu = path == HitPath::Rows { fe_on_gpu: true };
        let at_once = self
            .batcher
            .scores_at_once(&ranker, n_docs, backend, asked_cpu);
        // A job that stays on the CPU is scored in the same trip to the pool as its FE; one
        // that may wait for the GPU's turn is scored from a blocking thread instead.
        let on_pool = self.batcher.on_cpu_only(&ranker, n_docs, backend) && !fe_on_gpu;
        let fe_started = Instant::now();
        let produce = {
            let (backends, batcher) = (Arc::clone(&self.backends), Arc::clone(&self.batcher));
            let ranker = Arc::clone(&ranker);
            move || {
                let mut documents = documents;
                let rows = {
                    let _stage =
                        tracing::info_span!("fe", ranker = %ranker.name, documents = n_docs)
                            .entered();
                    rows_of(&backends, &ranker, &mut documents, fe_on_gpu)
                };
                let fe_done = Instant::now();
                let scoring = rows.map(|rows| {
                    rows.map(|(features, fe_backend)| {
                        let kept = keep_rows.then(|| features.clone());
                        let job = Job {
                            ranker,
                            features,
                            n_docs,
                            backend,
                            deadline,
                            submitted: fe_done,
                        };
                        let scoring = match on_pool {
                            true => {
                                let (reply, answer) = oneshot::channel();
                                batcher.run(job, at_once, reply);
                                Scoring::Answer(answer)
                            }
                            false => Scoring::Later(job),
                        };
                        (fe_backend, kept, scoring)
                    })
                });
                (documents, scoring, fe_done)
            }
        };
        // FE on the GPU waits for the device's turn: not on a pool thread.
        let produced = async {
            match fe_on_gpu {
                true => tokio::task::spawn_blocking(produce)
                    .await
                    .map_err(|err| RankError::Internal(err.to_string())),
                false => (self.backends.on_cpu_pool_task(produce).await)
                    .map_err(|err| RankError::Internal(err.to_string())),
            }
        };
        let (documents, scoring, fe_done) = until(deadline, produced).await??;
        let source = match documents {
            Documents::Source(source) => Some(source),
            _ => None,
        };
        let (fe_backend, rows, scoring) = match scoring? {
            Some(produced) => produced,
            None => {
                let source = source
                    .ok_or_else(|| RankError::Internal("rows withdrawn without a source".into()))?;
                return Ok(Ranked::Reread(source));
            }
        };
        let fe_us = micros(fe_done - fe_started);
        let answer = match scoring {
            Scoring::Answer(answer) => answer,
            // The thread that finds the ranker's lane idle may go on running the batches queued
            // behind this job: its answer comes through the channel, not the task's end.
            Scoring::Later(job) => {
                let (reply, answer) = oneshot::channel();
                let batcher = Arc::clone(&self.batcher);
                tokio::task::spawn_blocking(move || batcher.run(job, at_once, reply));
                answer
            }
        };
        let scored = until(deadline, answer)
            .await?
            .map_err(|_| RankError::Internal("scoring ended without an answer".into()))?
            .map_err(|err| match err {
                ScoreError::DeadlineExceeded => RankError::DeadlineExceeded,
                ScoreError::Internal(detail) => RankError::Internal(detail),
            })?;
        Ok(Ranked::Scored {
            scored,
            fe_us,
            fe_backend,
            rows,
            source,
        })
    }
}

impl RankEngine {
    /// Ranks hit documents on the fused device path (the CPU on a GPU failure), from a blocking
    /// thread: they are never batched with other jobs (the batch's own documents fill it).
    async fn rank_fused<S: RowSource>(
        &self,
        ranker: Arc<LoadedRanker>,
        batch: HitBatch,
        deadline: Option<Instant>,
        keep_rows: bool,
    ) -> Result<Ranked<S>, RankError<S::Error>> {
        let backends = Arc::clone(&self.backends);
        let n_docs = batch.docs.len();
        let work = tokio::task::spawn_blocking(move || {
            let _stage = tracing::info_span!("fe+score", ranker = %ranker.name, documents = n_docs)
                .entered();
            backends.rank_hits(&ranker, &batch, keep_rows)
        });
        let hits = until(deadline, work)
            .await?
            .map_err(|err| RankError::Internal(err.to_string()))??;
        Ok(fused_ranked(hits))
    }

    /// Ranks a source's hit documents on the fused device path when it lays them out
    /// ([`Backends::lay_out_source`], a task on the CPU pool). The request then awaits its
    /// device's fused lane ([`Backends::score_queued`]), no thread waiting for the turn; with
    /// the rows kept (`explain`) it takes a turn alone, from a blocking thread. Otherwise the
    /// source comes back, with the backend its rows are to be scored on: `backend` when it
    /// declined, the CPU after a GPU failure.
    async fn rank_source_fused<S: RowSource>(
        &self,
        ranker: &Arc<LoadedRanker>,
        source: S,
        backend: Backend,
        deadline: Option<Instant>,
        keep_rows: bool,
    ) -> Result<Result<Ranked<S>, (S, Backend)>, RankError<S::Error>> {
        let n_docs = source.len();
        let lay_out = {
            let (backends, ranker) = (Arc::clone(&self.backends), Arc::clone(ranker));
            move || {
                let _stage =
                    tracing::info_span!("fe", ranker = %ranker.name, documents = n_docs).entered();
                let mut source = source;
                let laid_out = backends.lay_out_source(&ranker, &mut source);
                (source, laid_out)
            }
        };
        let ranked = async {
            let (source, laid_out) = (self.backends.on_cpu_pool_task(lay_out).await)
                .map_err(|err| RankError::Internal(err.to_string()))?;
            let (layouts, started) = match laid_out {
                SourceLaidOut::Layouts { layouts, started } => (layouts, started),
                SourceLaidOut::Declined => return Ok(Err((source, backend))),
                SourceLaidOut::FellBack => return Ok(Err((source, Backend::Cpu))),
            };
            let scored = match keep_rows {
                false => self.backends.score_queued(ranker, layouts, started).await,
                true => {
                    let (backends, ranker) = (Arc::clone(&self.backends), Arc::clone(ranker));
                    let alone = move || backends.score_layouts(&ranker, layouts, started, true);
                    (tokio::task::spawn_blocking(alone).await)
                        .map_err(|err| RankError::Internal(err.to_string()))?
                }
            };
            Ok(match scored {
                Some(hits) => Ok(fused_ranked(hits)),
                None => Err((source, Backend::Cpu)),
            })
        };
        until(deadline, ranked).await?
    }
}

/// The answer to a job ranked on the fused path (its batch counted where it ran).
fn fused_ranked<S>(hits: HitsScored) -> Ranked<S> {
    Ranked::Scored {
        scored: Scored {
            scores: hits.scores,
            queue_us: hits.queue_us,
            eval_us: hits.eval_us,
            batch_docs: hits.batch_docs,
            batch_requests: hits.batch_requests,
            backend: hits.processor,
        },
        fe_us: hits.fe_us,
        fe_backend: hits.processor,
        rows: hits.rows,
        source: None,
    }
}

/// Where a job's scoring stands after its FE.
enum Scoring {
    /// Scored, or queued for its ranker's next batch: its answer to come.
    Answer(oneshot::Receiver<Result<Scored, ScoreError>>),
    /// To be submitted from a thread that may wait for the GPU.
    Later(Job),
}

/// The rows of `documents` for `ranker`, and where they were produced.
type Produced<E> = Result<Option<(Vec<f64>, Processor)>, RankError<E>>;

fn rows_of<S: RowSource>(
    backends: &Backends,
    ranker: &LoadedRanker,
    documents: &mut Documents<S>,
    fe_on_gpu: bool,
) -> Produced<S::Error> {
    match documents {
        Documents::Rows(rows) => Ok(Some((std::mem::take(rows), Processor::Cpu))),
        Documents::Hits(batch) => Ok(Some(backends.extract(ranker, batch, fe_on_gpu)?)),
        Documents::Source(source) => Ok(source
            .rows(ranker, backends.width())
            .map_err(RankError::Source)?
            .map(|rows| (rows, Processor::Cpu))),
    }
}

/// Awaits `work` until `deadline`.
async fn until<T, E>(
    deadline: Option<Instant>,
    work: impl std::future::Future<Output = T>,
) -> Result<T, RankError<E>> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline.into(), work)
            .await
            .map_err(|_| RankError::DeadlineExceeded),
        None => Ok(work.await),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rank::fe::{synth_corpus_stats, synth_hit_documents, synth_query};

    /// The bundled medium ranker, from a store over `rankers/`, and an engine on it.
    fn engine(fe_backend: Backend, batching: bool) -> (RankEngine, Arc<LoadedRanker>) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers");
        let store = RankerStore::open(&dir, 1 << 30).unwrap();
        let loaded = store.get("medium").unwrap();
        let config = EngineConfig {
            threads: Some(2),
            fe_backend,
            batch: BatchConfig {
                batching,
                max_docs: 4096,
            },
            gpu_cache_bytes: 1 << 30,
        };
        (RankEngine::new(store, config), loaded)
    }

    fn hits(docs: usize, terms: u32) -> HitBatch {
        HitBatch {
            query: synth_query(terms, 3),
            stats: synth_corpus_stats(),
            docs: synth_hit_documents(docs, terms, 5),
        }
    }

    fn job(loaded: &Arc<LoadedRanker>, documents: Documents<Infallible>) -> RankJob<Infallible> {
        RankJob {
            ranker: Arc::clone(loaded),
            documents,
            backend: Backend::Auto,
            asked_cpu: false,
            deadline: None,
            keep_rows: true,
        }
    }

    async fn ranked(
        engine: &RankEngine,
        job: RankJob<Infallible>,
    ) -> (Scored, Processor, Vec<f64>) {
        match engine.rank(job).await.expect("ranked") {
            Ranked::Scored {
                scored,
                fe_backend,
                rows,
                ..
            } => (scored, fe_backend, rows.expect("kept")),
            Ranked::Reread(never) => match never {},
        }
    }

    fn bits(values: &[f64]) -> Vec<u64> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    /// Hit documents through the engine (batching on or off) give the rows FE gives and the
    /// scores those rows give as rows; a passed deadline is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hits_and_rows_rank_alike_with_batching_on_or_off() {
        for batching in [false, true] {
            let (engine, loaded) = engine(Backend::Cpu, batching);
            let batch = hits(300, 3);
            let resolver = loaded.fe.as_ref().unwrap();
            let mut want_rows = vec![0.0; 300 * resolver.len()];
            (resolver)
                .extract_batch(&batch.query, &batch.stats, &batch.docs, &mut want_rows, 1)
                .unwrap();
            let (scored, fe_backend, rows) =
                ranked(&engine, job(&loaded, Documents::Hits(batch))).await;
            assert_eq!(fe_backend, Processor::Cpu);
            assert_eq!(bits(&rows), bits(&want_rows));
            let (from_rows, ..) = ranked(&engine, job(&loaded, Documents::Rows(want_rows))).await;
            assert_eq!(bits(&scored.scores), bits(&from_rows.scores));
            assert_eq!(scored.scores.len(), 300);
            assert_eq!(scored.backend, Processor::Cpu);

            let late = RankJob {
                deadline: Some(Instant::now()),
                ..job(&loaded, Documents::Hits(hits(10, 2)))
            };
            assert!(matches!(
                engine.rank(late).await,
                Err(RankError::DeadlineExceeded)
            ));
        }
    }

    /// Fused requests that wait for the device while it is busy are scored together in its next
    /// turn (one device batch, the layouts one after another), each with its own scores: those
    /// of the CPU (on a GPU; skipped without one, failing under `RANKSERVE_REQUIRE_GPU=1`; under
    /// `RANKSERVE_FAULT_GPU=1` every request comes back from the CPU).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn fused_requests_that_wait_for_the_device_share_its_turn() {
        let what = "fused_requests_that_wait_for_the_device_share_its_turn";
        let Some(device) = crate::gpu::device::device_for_tests(what) else {
            return;
        };
        let faulty = std::env::var("RANKSERVE_FAULT_GPU").is_ok_and(|v| v == "1");
        let (cpu, loaded) = engine(Backend::Cpu, false);
        let executor = Executor::new(device);
        let (gpu, _) = engine(Backend::Gpu, true);
        gpu.install_gpu(std::slice::from_ref(&executor));
        let gpu = Arc::new(gpu);
        let batches: Vec<HitBatch> = (0..6)
            .map(|i| HitBatch {
                query: synth_query(3, i),
                stats: synth_corpus_stats(),
                docs: synth_hit_documents(40 + 90 * i as usize, 3, i),
            })
            .collect();
        let scores = |engine: Arc<RankEngine>, batch: HitBatch, backend: Backend| {
            let job = RankJob {
                backend,
                keep_rows: false,
                ..job(&loaded, Documents::Hits(batch))
            };
            async move {
                match engine.rank(job).await.expect("ranked") {
                    Ranked::Scored { scored, .. } => scored,
                    Ranked::Reread(never) => match never {},
                }
            }
        };
        let cpu = Arc::new(cpu);
        let mut want = Vec::new();
        for batch in &batches {
            want.push(scores(Arc::clone(&cpu), batch.clone(), Backend::Cpu).await);
        }
        // The device is held while the requests queue for it, then let go.
        let turn = executor.turns().take();
        let tasks: Vec<_> = (batches.iter().cloned())
            .map(|batch| tokio::spawn(scores(Arc::clone(&gpu), batch, Backend::Gpu)))
            .collect();
        let waiting_since = Instant::now();
        while executor.load() < batches.len() && !faulty {
            assert!(
                waiting_since.elapsed() < Duration::from_secs(20),
                "the requests never queued"
            );
            // A blocking sleep: the turn is a lock guard, not held across an await; the
            // requests run on the runtime's other workers.
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(turn);
        let mut shared = false;
        for (i, (task, want)) in tasks.into_iter().zip(&want).enumerate() {
            let got = task.await.expect("ranked");
            let ran = if faulty {
                Processor::Cpu
            } else {
                Processor::Gpu
            };
            assert_eq!(got.backend, ran, "request {i}");
            shared |= got.batch_requests > 1;
            assert_eq!(got.scores.len(), want.scores.len(), "request {i}");
            for (d, (g, w)) in got.scores.iter().zip(&want.scores).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                    "request {i}, document {d}: GPU {g} vs CPU {w}"
                );
            }
        }
        assert!(shared || faulty, "no request shared a device turn");
    }

    /// Hit documents on the fused device path (FE, gather and scoring in one device turn) give
    /// the CPU's rows bit for bit and its scores within DESIGN §2's tolerance (the medium
    /// ranker's NN: 1e-4), for 1, 700 and 65 537 documents (over the device batch: split), with
    /// `auto` FE and `gpu` scoring too; a query over the kernel's terms reruns on the CPU; an
    /// invalid document is refused with the CPU's error, nothing scored (on a GPU; skipped
    /// without one, failing under `RANKSERVE_REQUIRE_GPU=1`; under `RANKSERVE_FAULT_GPU=1`
    /// every batch must come back from the CPU).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fused_hits_through_the_engine_match_the_cpu() {
        let Some(device) =
            crate::gpu::device::device_for_tests("fused_hits_through_the_engine_match_the_cpu")
        else {
            return;
        };
        let (cpu, loaded) = engine(Backend::Cpu, false);
        let executor = Executor::new(device);
        let (gpu, _) = engine(Backend::Gpu, true);
        gpu.install_gpu(std::slice::from_ref(&executor));
        let (auto, _) = engine(Backend::Auto, true);
        auto.install_gpu(&[executor]);
        let over_limit = crate::rank::gpu::layout::MAX_TERMS + 1;
        // Under RANKSERVE_FAULT_GPU=1 every device call fails: every batch reruns on the CPU.
        let faulty = std::env::var("RANKSERVE_FAULT_GPU").is_ok_and(|v| v == "1");
        for (engine, docs, terms, ran) in [
            (&gpu, 1, 3, Processor::Gpu),
            (&gpu, 700, 64, Processor::Gpu),
            (&auto, 700, 4, Processor::Gpu),
            (&gpu, 65_537, 2, Processor::Gpu),
            (&gpu, 50, over_limit, Processor::Cpu),
        ] {
            let mut batch = hits(docs, terms);
            // Documents without static features (NaN) or without streams.
            for doc in batch.docs.iter_mut().step_by(3) {
                doc.static_features.clear();
            }
            for doc in batch.docs.iter_mut().skip(1).step_by(5) {
                doc.streams = Default::default();
            }
            let cpu_job = RankJob {
                backend: Backend::Cpu,
                ..job(&loaded, Documents::Hits(batch.clone()))
            };
            let (want, _, want_rows) = ranked(&cpu, cpu_job).await;
            let gpu_job = RankJob {
                backend: Backend::Gpu,
                ..job(&loaded, Documents::Hits(batch))
            };
            let (got, fe_backend, rows) = ranked(engine, gpu_job).await;
            let what = format!("{docs} documents, {terms} terms");
            let ran = if faulty { Processor::Cpu } else { ran };
            assert_eq!((fe_backend, got.backend), (ran, ran), "{what}");
            assert_eq!(bits(&rows), bits(&want_rows), "{what}");
            assert_eq!(got.scores.len(), want.scores.len(), "{what}");
            for (d, (g, w)) in got.scores.iter().zip(&want.scores).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                    "{what}: document {d}: GPU {g} vs CPU {w}"
                );
            }
        }
        let mut bad = hits(40, 2);
        // A hit past the end of its stream.
        let past_the_end = crate::rank::fe::HitStream::new(1, [[[0u32, 5u32]]]);
        bad.docs[17].streams.insert("body", past_the_end);
        let mut refusals = Vec::new();
        for (engine, backend) in [(&cpu, Backend::Cpu), (&gpu, Backend::Gpu)] {
            let job = RankJob {
                backend,
                ..job(&loaded, Documents::Hits(bad.clone()))
            };
            match engine.rank(job).await {
                Err(RankError::Fe(err)) => refusals.push(err.to_string()),
                other => panic!("expected a refusal: {:?}", other.map(|_| ())),
            }
        }
        assert_eq!(refusals[1], refusals[0]);
        assert!(refusals[0].starts_with("document 17 "), "{}", refusals[0]);
    }

    /// `fe_backend=gpu` extracts on the device with the CPU's values bit for bit, and a query
    /// over the kernel's term limit falls back to the CPU with the same scores (on a GPU;
    /// skipped without one, failing under `RANKSERVE_REQUIRE_GPU=1`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gpu_feature_extraction_through_the_engine_matches_the_cpu() {
        let Some(device) = crate::gpu::device::device_for_tests(
            "gpu_feature_extraction_through_the_engine_matches_the_cpu",
        ) else {
            return;
        };
        let (cpu, loaded) = engine(Backend::Cpu, false);
        let (gpu, _) = engine(Backend::Gpu, false);
        gpu.install_gpu(&[Executor::new(device)]);
        let over_limit = crate::rank::gpu::layout::MAX_TERMS + 1;
        for (terms, fe_on) in [(3, Processor::Gpu), (over_limit, Processor::Cpu)] {
            let cpu_job = RankJob {
                backend: Backend::Cpu,
                ..job(&loaded, Documents::Hits(hits(700, terms)))
            };
            let (want, _, want_rows) = ranked(&cpu, cpu_job).await;
            let gpu_job = RankJob {
                backend: Backend::Cpu,
                ..job(&loaded, Documents::Hits(hits(700, terms)))
            };
            let (got, fe_backend, rows) = ranked(&gpu, gpu_job).await;
            assert_eq!(fe_backend, fe_on, "{terms} terms");
            assert_eq!(bits(&rows), bits(&want_rows), "{terms} terms");
            assert_eq!(bits(&got.scores), bits(&want.scores), "{terms} terms");
        }
    }
}
