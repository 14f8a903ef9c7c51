//! Scoring off the async runtime, with a batching queue per ranker.
//!
//! Requests for the same ranker (the same loaded version) that arrive within the batch window
//! are merged into one feature matrix of at most `max_batch_docs` rows, scored by one
//! evaluation and split back. Each ranker has a dedicated OS thread that collects and
//! scores its batches: a thread can wait on its channel with microsecond precision
//! (`recv_timeout`), where tokio's timer has a 1 ms granularity, and a running batch never holds
//! an async worker. A document's score never depends on its batch-mates: both backends score
//! rows independently.
//!
//! Work nobody will read is skipped: a job whose caller has gone (its deadline fired and the
//! handler answered 504) or whose deadline has passed is dropped when its batch is formed.
//!
//! Bypass (scored at once on tokio's blocking pool): batching off (window 0), `backend=cpu`,
//! and requests that fill a batch on their own (at least `max_batch_docs` documents).
//!
//! A batch runs on the backend its first request asked for (requests with another `backend`
//! open the next batch); [`Backends`] picks CPU or GPU for `auto` from the batch's size.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::backends::Backends;
use crate::backend::{Backend, Processor};
use crate::rank::store::LoadedRanker;

/// Batching parameters.
#[derive(Debug, Clone, Copy)]
pub struct BatchConfig {
    /// How long a batch stays open after its first request; zero turns batching off.
    pub window: Duration,
    /// Most documents in one batch.
    pub max_docs: usize,
}

/// A scored request.
#[derive(Debug)]
pub struct Scored {
    /// One score per document, in request order.
    pub scores: Vec<f64>,
    /// Time from submission to the start of its batch's evaluation.
    pub queue_us: u64,
    /// Evaluation time of the batch it ran in (MIT + ME).
    pub eval_us: u64,
    /// Documents and requests of that batch.
    pub batch_docs: usize,
    pub batch_requests: usize,
    /// The backend that evaluated the batch.
    pub backend: Processor,
}

/// Why a request was not scored.
#[derive(Debug, thiserror::Error)]
pub enum ScoreError {
    #[error("deadline passed before scoring started")]
    DeadlineExceeded,
    #[error("scoring task failed: {0}")]
    Internal(String),
}

struct Job {
    ranker: Arc<LoadedRanker>,
    features: Vec<f64>,
    n_docs: usize,
    backend: Backend,
    deadline: Option<Instant>,
    submitted: Instant,
    reply: oneshot::Sender<Result<Scored, ScoreError>>,
}

/// Scores requests directly or through per-ranker batching threads.
pub struct Batcher {
    config: BatchConfig,
    backends: Arc<Backends>,
    queues: Mutex<HashMap<String, mpsc::Sender<Job>>>,
}

impl Batcher {
    pub fn new(config: BatchConfig, backends: Arc<Backends>) -> Batcher {
        Batcher {
            config,
            backends,
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// Whether batching is on.
    pub fn batching(&self) -> bool {
        !self.config.window.is_zero()
    }

    /// Scores `features` (`n_docs × ranker.features.len()`, row-major) with `ranker` on
    /// `backend`, batched with other requests unless `bypass` (the request asked for the CPU
    /// itself) or the request is big enough on its own.
    ///
    /// # Errors
    /// [`ScoreError::DeadlineExceeded`] when `deadline` passed before the work started.
    pub async fn score(
        &self,
        ranker: Arc<LoadedRanker>,
        features: Vec<f64>,
        deadline: Option<Instant>,
        backend: Backend,
        bypass: bool,
    ) -> Result<Scored, ScoreError> {
        let n_features = ranker.ranker.features.len();
        let n_docs = features.len().checked_div(n_features).unwrap_or(0);
        let submitted = Instant::now();
        if self.scores_at_once(n_docs, bypass) {
            let backends = Arc::clone(&self.backends);
            let score = move || {
                score_now(
                    &backends, &ranker, &features, n_docs, backend, deadline, submitted,
                )
            };
            // Scoring that may wait for the GPU's turn must not hold a CPU pool thread.
            return if self.backends.cpu_only(backend) {
                self.backends
                    .on_cpu_pool_task(score)
                    .await
                    .map_err(|e| ScoreError::Internal(e.to_string()))?
            } else {
                tokio::task::spawn_blocking(score)
                    .await
                    .map_err(|e| ScoreError::Internal(e.to_string()))?
            };
        }
        let (reply, receive) = oneshot::channel();
        let job = Job {
            ranker,
            features,
            n_docs,
            backend,
            deadline,
            submitted,
            reply,
        };
        self.queue_for(&job.ranker.name)?
            .send(job)
            .map_err(|_| ScoreError::Internal("batch thread gone".into()))?;
        receive
            .await
            .map_err(|_| ScoreError::Internal("batch thread dropped the request".into()))?
    }

    /// Whether a request of `n_docs` documents is scored at once, without a batch: batching
    /// is off, the request asked for the CPU itself (`bypass`), or it fills a batch alone.
    pub fn scores_at_once(&self, n_docs: usize, bypass: bool) -> bool {
        bypass || !self.batching() || n_docs >= self.config.max_docs
    }

    fn queue_for(&self, name: &str) -> Result<mpsc::Sender<Job>, ScoreError> {
        let mut queues = self.queues.lock();
        if let Some(queue) = queues.get(name) {
            return Ok(queue.clone());
        }
        let (send, receive) = mpsc::channel();
        let (config, backends) = (self.config, Arc::clone(&self.backends));
        std::thread::Builder::new()
            .name(format!("batch-{name}"))
            .spawn(move || run_batches(receive, config, &backends))
            .map_err(|e| ScoreError::Internal(format!("spawning a batch thread: {e}")))?;
        queues.insert(name.to_string(), send.clone());
        Ok(send)
    }
}

/// Scores one request's `features` now, on the calling thread (its parallel parts on the CPU
/// pool), unless `deadline` passed: how [`Batcher::score`] scores a request it does not batch,
/// and how the `/v1/rank` handler scores one right after its feature extraction, on the same
/// pool thread, when [`Batcher::scores_at_once`] on the CPU.
///
/// # Errors
/// [`ScoreError::DeadlineExceeded`] when `deadline` passed before scoring started.
pub fn score_now(
    backends: &Backends,
    ranker: &LoadedRanker,
    features: &[f64],
    n_docs: usize,
    backend: Backend,
    deadline: Option<Instant>,
    submitted: Instant,
) -> Result<Scored, ScoreError> {
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Err(ScoreError::DeadlineExceeded);
    }
    let started = Instant::now();
    let _stage = tracing::debug_span!("score", ranker = %ranker.name, documents = n_docs).entered();
    let (scores, ran) = backends.evaluate(ranker, features, n_docs, backend);
    Ok(Scored {
        scores,
        queue_us: micros(started - submitted),
        eval_us: micros(started.elapsed()),
        batch_docs: n_docs,
        batch_requests: 1,
        backend: ran,
    })
}

pub(crate) fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

/// A batch thread: collect, drop the expired, score, split, repeat until the scorer is dropped.
fn run_batches(queue: mpsc::Receiver<Job>, config: BatchConfig, backends: &Backends) {
    let mut carried: Option<Job> = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => match queue.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let closes = Instant::now() + config.window;
        let mut docs = first.n_docs;
        let mut jobs = vec![first];
        while docs < config.max_docs {
            let wait = closes.saturating_duration_since(Instant::now());
            let Ok(job) = queue.recv_timeout(wait) else {
                break;
            };
            // A new version of the ranker, another backend, or no room: this job opens the
            // next batch.
            if !Arc::ptr_eq(&job.ranker, &jobs[0].ranker)
                || job.backend != jobs[0].backend
                || docs + job.n_docs > config.max_docs
            {
                carried = Some(job);
                break;
            }
            docs += job.n_docs;
            jobs.push(job);
        }
        score_jobs(jobs, backends);
    }
}

fn score_jobs(jobs: Vec<Job>, backends: &Backends) {
    let started = Instant::now();
    let mut live = Vec::with_capacity(jobs.len());
    for job in jobs {
        if job.reply.is_closed() {
            continue;
        }
        if job.deadline.is_some_and(|d| started >= d) {
            let _ = job.reply.send(Err(ScoreError::DeadlineExceeded));
            continue;
        }
        live.push(job);
    }
    let Some(first) = live.first() else { return };
    let ranker = Arc::clone(&first.ranker);
    let batch_docs: usize = live.iter().map(|j| j.n_docs).sum();
    let _stage = tracing::debug_span!("score", ranker = %ranker.name, documents = batch_docs, requests = live.len())
        .entered();
    let backend = first.backend;
    let (scores, ran) = if live.len() == 1 {
        backends.evaluate(&ranker, &live[0].features, batch_docs, backend)
    } else {
        let mut matrix = Vec::with_capacity(live.iter().map(|j| j.features.len()).sum());
        for job in &live {
            matrix.extend_from_slice(&job.features);
        }
        backends.evaluate(&ranker, &matrix, batch_docs, backend)
    };
    let eval_us = micros(started.elapsed());
    metrics::histogram!("rankserve_batch_documents").record(batch_docs as f64);
    metrics::histogram!("rankserve_batch_requests").record(live.len() as f64);
    let batch_requests = live.len();
    let mut offset = 0;
    for job in live {
        let scores = scores[offset..offset + job.n_docs].to_vec();
        offset += job.n_docs;
        let _ = job.reply.send(Ok(Scored {
            scores,
            queue_us: micros(started - job.submitted),
            eval_us,
            batch_docs,
            batch_requests,
            backend: ran,
        }));
    }
}
