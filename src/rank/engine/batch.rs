//! Batches that form only under load (flat combining), per ranker, for the jobs that may run on
//! the GPU.
//!
//! A job whose ranker has no batch running is scored at once, on the thread that submits it:
//! an idle engine holds nobody. Jobs that arrive while a batch of their ranker runs queue, and
//! when that batch ends the queue is run as the next batch (at most `max_batch_docs` documents,
//! jobs of the same ranker version and backend, in arrival order) by the same thread, which
//! answers each job as its batch ends and keeps going until the queue is empty. Waiting jobs
//! hold no thread: each awaits its answer. A device runs one batch at a time anyway; merging
//! the jobs that wait for it shares a launch, and lets small requests together pass the
//! ranker's crossover. With several GPUs a ranker runs as many batches at once as there are
//! devices (each goes to the least loaded device), so one busy ranker keeps them all working.
//!
//! A job that can only run on the CPU (`backend=cpu`, no GPU, or `auto` for a ranker whose
//! crossover lies beyond `max_batch_docs`) is never batched, and a batch formed in the lane that
//! the crossover sends to the CPU is handed to the CPU pool while the lane runs on: the CPU
//! scores rows independently at the same cost per row in a batch or alone, so a batch only
//! serialises requests that the pool would score side by side. Measured (docs/benchmarks.md,
//! "Batching", the 2-core development machine): CPU batches formed under load cost 19–27 % of
//! the throughput at 4 clients against scoring each request at once.
//!
//! There is no window: a batch never waits for more jobs. The old 200 µs window made requests
//! of 10–100 documents 1.6–2.3 times slower at one client (same page); batches formed under
//! load merge the jobs that a window would have waited for.
//!
//! Work nobody will read is skipped: a queued job whose caller has gone (its deadline fired and
//! the handler answered 504) or whose deadline has passed is dropped when its batch is formed.
//! A document's score never depends on its batch-mates' values: both backends score rows
//! independently. On the GPU the batch's size may move the last bits of a sum (the tree kernel's
//! launch shape and cuBLAS's kernel follow it), within DESIGN §2's tolerance.
//!
//! Bypass (scored at once, never queued): batching off, a job that can only run on the CPU
//! (`backend=cpu` asked for by the request or configured, or no GPU), and jobs that fill a
//! batch on their own (at least `max_batch_docs` documents).

use std::collections::{HashMap, VecDeque};
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
    /// Whether jobs that arrive while their ranker's batch runs are merged into the next one
    /// (off: every job is scored at once, side by side).
    pub batching: bool,
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

/// Where a job's answer goes.
pub type Reply = oneshot::Sender<Result<Scored, ScoreError>>;

/// One caller's rows, to be scored.
pub struct Job {
    pub ranker: Arc<LoadedRanker>,
    /// `n_docs × ranker.features.len()`, row-major.
    pub features: Vec<f64>,
    pub n_docs: usize,
    pub backend: Backend,
    pub deadline: Option<Instant>,
    /// When its rows were ready.
    pub submitted: Instant,
}

/// A job waiting for the next batch of its ranker, and where its answer goes.
struct Queued {
    job: Job,
    reply: Reply,
}

/// A ranker's batches: how many are running, and the jobs that arrived meanwhile.
#[derive(Default)]
struct Lane {
    running: usize,
    queued: VecDeque<Queued>,
}

/// Scores jobs at once, or in batches formed while their ranker's batch runs.
pub struct Batcher {
    config: BatchConfig,
    backends: Arc<Backends>,
    lanes: Mutex<HashMap<String, Arc<Mutex<Lane>>>>,
}

impl Batcher {
    pub fn new(config: BatchConfig, backends: Arc<Backends>) -> Batcher {
        Batcher {
            config,
            backends,
            lanes: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a job of `n_docs` documents for `loaded` on `backend` is scored at once, never
    /// queued: batching is off, the request asked for the CPU itself (`bypass`), the job can
    /// only run on the CPU ([`Batcher::on_cpu_only`]), or it fills a batch alone.
    pub fn scores_at_once(
        &self,
        loaded: &LoadedRanker,
        n_docs: usize,
        backend: Backend,
        bypass: bool,
    ) -> bool {
        bypass
            || !self.config.batching
            || self.on_cpu_only(loaded, n_docs, backend)
            || n_docs >= self.config.max_docs
    }

    /// Whether a job of `n_docs` documents for `loaded`, and every batch this batcher could
    /// put it in, runs on the CPU on `backend` ([`Backends::cpu_only`] at the larger of
    /// `n_docs` and `max_batch_docs`): then a batch only serialises requests that the pool
    /// would score side by side, and the job never waits for the GPU.
    pub fn on_cpu_only(&self, loaded: &LoadedRanker, n_docs: usize, backend: Backend) -> bool {
        (self.backends).cpu_only(loaded, backend, n_docs.max(self.config.max_docs))
    }

    /// Answers `job` into `reply`: at once when `at_once` ([`Batcher::scores_at_once`]), else as
    /// [`Batcher::submit`] does. Blocking, as that.
    pub fn run(&self, job: Job, at_once: bool, reply: Reply) {
        match at_once {
            true => score_batch(vec![Queued { job, reply }], &self.backends),
            false => self.submit(job, reply),
        }
    }

    /// Scores `job` on the calling thread when its ranker runs fewer batches than there are
    /// GPUs (one without a GPU), answers it, and goes on running, batch after batch, the jobs
    /// that queued meanwhile until none is left (flat combining: whoever found room in the lane
    /// serves it); otherwise queues `job` for the next batch, whose runner answers it. Blocking
    /// while it scores: call it from a thread that may wait for the GPU's turn, not from the
    /// CPU pool.
    pub fn submit(&self, job: Job, reply: Reply) {
        let lane = self.lane_of(&job.ranker.name);
        {
            let mut state = lane.lock();
            if state.running >= self.batches_at_once() {
                state.queued.push_back(Queued { job, reply });
                return;
            }
            state.running += 1;
        }
        let mut batch = vec![Queued { job, reply }];
        loop {
            self.score(batch);
            let mut state = lane.lock();
            if state.queued.is_empty() {
                state.running -= 1;
                return;
            }
            batch = next_batch(&mut state, self.config.max_docs);
        }
    }

    /// Batches a ranker's lane runs at once: one per GPU (one without a GPU). Two per GPU, so
    /// that one batch's host work would overlap the other's device turn, measured worse on an
    /// H100 host (docs/benchmarks.md, "Batching"): smaller batches, more turns.
    fn batches_at_once(&self) -> usize {
        self.backends.gpu_devices().max(1)
    }

    /// Scores `batch` on this thread when it goes to the GPU. One that the crossover sends to
    /// the CPU goes to the pool instead, and the lane runs on: it holds no device turn, and on
    /// the runner's thread the CPU's batches would run one after another, each over the pool's
    /// width under load (one thread), where scoring them at once spreads them over the cores.
    fn score(&self, batch: Vec<Queued>) {
        let Some(first) = batch.first() else { return };
        let docs = batch.iter().map(|queued| queued.job.n_docs).sum();
        match (self.backends).cpu_only(&first.job.ranker, first.job.backend, docs) {
            true => {
                let backends = Arc::clone(&self.backends);
                (self.backends).spawn_on_cpu_pool(move || score_batch(batch, &backends));
            }
            false => score_batch(batch, &self.backends),
        }
    }

    fn lane_of(&self, name: &str) -> Arc<Mutex<Lane>> {
        let mut lanes = self.lanes.lock();
        match lanes.get(name) {
            Some(lane) => Arc::clone(lane),
            None => Arc::clone(lanes.entry(name.to_string()).or_default()),
        }
    }
}

/// The next batch of `lane`: the first queued job and those after it of the same ranker version
/// and backend, in order, while the documents fit `max_docs` (the first always goes).
fn next_batch(lane: &mut Lane, max_docs: usize) -> Vec<Queued> {
    let Some(first) = lane.queued.pop_front() else {
        return Vec::new();
    };
    let mut docs = first.job.n_docs;
    let mut batch = vec![first];
    while let Some(next) = lane.queued.front() {
        let fits = Arc::ptr_eq(&next.job.ranker, &batch[0].job.ranker)
            && next.job.backend == batch[0].job.backend
            && docs + next.job.n_docs <= max_docs;
        if !fits {
            break;
        }
        docs += next.job.n_docs;
        batch.extend(lane.queued.pop_front());
    }
    batch
}

pub(crate) fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

pub(crate) fn record_batch(docs: usize, requests: usize) {
    metrics::histogram!("rankserve_batch_documents").record(docs as f64);
    metrics::histogram!("rankserve_batch_requests").record(requests as f64);
}

/// Scores a batch of queued jobs in one evaluation (each job's rows one block of it, not copied
/// together first) and answers each; drops the jobs whose caller has gone or whose deadline
/// passed first.
fn score_batch(jobs: Vec<Queued>, backends: &Backends) {
    let started = Instant::now();
    let mut live = Vec::with_capacity(jobs.len());
    for queued in jobs {
        if queued.reply.is_closed() {
            continue;
        }
        if queued.job.deadline.is_some_and(|d| started >= d) {
            let _ = queued.reply.send(Err(ScoreError::DeadlineExceeded));
            continue;
        }
        live.push(queued);
    }
    let Some(first) = live.first() else { return };
    let (ranker, backend) = (Arc::clone(&first.job.ranker), first.job.backend);
    let batch_docs: usize = live.iter().map(|q| q.job.n_docs).sum();
    let _stage = tracing::debug_span!("score", ranker = %ranker.name, documents = batch_docs, requests = live.len())
        .entered();
    let blocks: Vec<&[f64]> = live.iter().map(|q| q.job.features.as_slice()).collect();
    let (scores, ran) = backends.evaluate(&ranker, &blocks, batch_docs, backend);
    let eval_us = micros(started.elapsed());
    let batch_requests = live.len();
    record_batch(batch_docs, batch_requests);
    let mut offset = 0;
    for queued in live {
        let n_docs = queued.job.n_docs;
        let scores = scores[offset..offset + n_docs].to_vec();
        offset += n_docs;
        let _ = queued.reply.send(Ok(Scored {
            scores,
            queue_us: micros(started - queued.job.submitted),
            eval_us,
            batch_docs,
            batch_requests,
            backend: ran,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> (crate::rank::store::RankerStore, Arc<LoadedRanker>) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers");
        let store = crate::rank::store::RankerStore::open(&dir, 1 << 30).unwrap();
        let small = store.get("small").unwrap();
        (store, small)
    }

    fn rows(ranker: &Arc<LoadedRanker>, n_docs: usize, seed: u64) -> Job {
        let width = ranker.ranker.features.len();
        Job {
            ranker: Arc::clone(ranker),
            features: crate::rank::synth::synth_features(&ranker.ranker, n_docs, seed)
                [..n_docs * width]
                .to_vec(),
            n_docs,
            backend: Backend::Auto,
            deadline: None,
            submitted: Instant::now(),
        }
    }

    fn job(ranker: &Arc<LoadedRanker>, n_docs: usize, backend: Backend) -> Queued {
        let (reply, _) = oneshot::channel();
        Queued {
            job: Job {
                ranker: Arc::clone(ranker),
                features: vec![0.0; n_docs * ranker.ranker.features.len()],
                n_docs,
                backend,
                deadline: None,
                submitted: Instant::now(),
            },
            reply,
        }
    }

    /// A job's scores alone.
    fn evaluate(batcher: &Batcher, job: &Job) -> Vec<f64> {
        (batcher.backends)
            .evaluate(&job.ranker, &[&job.features], job.n_docs, job.backend)
            .0
    }

    fn bits(scores: &[f64]) -> Vec<u64> {
        scores.iter().map(|s| s.to_bits()).collect()
    }

    /// An idle lane scores a job at once, alone; jobs that arrive while a batch runs queue and
    /// run as one batch when it ends, each with the scores it gets alone; then the lane is idle.
    #[tokio::test]
    async fn an_idle_lane_scores_at_once_and_a_busy_one_forms_the_next_batch() {
        let (_store, small) = small();
        let config = BatchConfig {
            batching: true,
            max_docs: 4096,
        };
        let batcher = Batcher::new(config, Arc::new(Backends::new(Some(1), Backend::Cpu)));
        let alone = rows(&small, 5, 1);
        let want = evaluate(&batcher, &alone);
        let (reply, mut answer) = oneshot::channel();
        batcher.submit(alone, reply);
        let scored = answer
            .try_recv()
            .expect("an idle lane scores at once")
            .unwrap();
        assert_eq!(
            (scored.batch_requests, bits(&scored.scores)),
            (1, bits(&want))
        );

        // A batch holds the lane: jobs queue behind it.
        let lane = batcher.lane_of("small");
        lane.lock().running = batcher.batches_at_once();
        let jobs: Vec<Job> = (0..3).map(|i| rows(&small, 4 + i, 10 + i as u64)).collect();
        let want: Vec<_> = (jobs.iter()).map(|job| evaluate(&batcher, job)).collect();
        let mut answers: Vec<_> = (jobs.into_iter())
            .map(|job| {
                let (reply, answer) = oneshot::channel();
                batcher.submit(job, reply);
                answer
            })
            .collect();
        assert!(answers.iter_mut().all(|a| a.try_recv().is_err()), "queued");
        // The next job to find the lane idle (here: after the batch ends) runs them: its own,
        // then the queue as one batch.
        lane.lock().running = 0;
        let (reply, last) = oneshot::channel();
        batcher.submit(rows(&small, 2, 20), reply);
        assert_eq!(last.await.unwrap().unwrap().batch_requests, 1);
        for (answer, want) in answers.into_iter().zip(want) {
            let scored = answer.await.unwrap().unwrap();
            assert_eq!((scored.batch_requests, scored.batch_docs), (3, 4 + 5 + 6));
            assert_eq!(bits(&scored.scores), bits(&want));
        }
        assert_eq!(lane.lock().running, 0, "the runner left the lane running");
    }

    /// A batch the crossover sends to the CPU goes to the pool: the runner does not wait for it
    /// (here the pool's threads are all taken when it is submitted) and leaves the lane; the
    /// job is answered, with its scores alone, once the pool gets to it.
    #[tokio::test]
    async fn a_batch_for_the_cpu_goes_to_the_pool_and_the_runner_moves_on() {
        let (_store, small) = small();
        let config = BatchConfig {
            batching: true,
            max_docs: 4096,
        };
        let backends = Arc::new(Backends::new(Some(2), Backend::Cpu));
        let batcher = Batcher::new(config, Arc::clone(&backends));
        let job = rows(&small, 7, 3);
        let want = evaluate(&batcher, &job);
        // Both pool threads wait for the gate.
        let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let (started, taken) = std::sync::mpsc::channel();
        for _ in 0..2 {
            let (gate, started) = (Arc::clone(&gate), started.clone());
            backends.spawn_on_cpu_pool(move || {
                started.send(()).unwrap();
                let (open, opened) = &*gate;
                let _open = opened.wait_while(open.lock().unwrap(), |open| !*open);
            });
        }
        taken.recv().unwrap();
        taken.recv().unwrap();
        let (reply, mut answer) = oneshot::channel();
        let batcher = Arc::new(batcher);
        let (returned, submit_returned) = std::sync::mpsc::channel();
        std::thread::spawn({
            let batcher = Arc::clone(&batcher);
            move || {
                batcher.submit(job, reply);
                let _ = returned.send(());
            }
        });
        let waited = submit_returned.recv_timeout(Duration::from_secs(10));
        assert!(waited.is_ok(), "the runner waited for the CPU's batch");
        assert!(
            answer.try_recv().is_err(),
            "scored while the pool was taken"
        );
        assert_eq!(batcher.lane_of("small").lock().running, 0);
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        let scored = answer.await.unwrap().unwrap();
        assert_eq!(bits(&scored.scores), bits(&want));
    }

    /// A batch takes queued jobs in order while they share the first one's ranker version and
    /// backend and fit the batch; the first always goes, however large.
    #[test]
    fn a_batch_takes_like_jobs_in_order_while_they_fit() {
        let (store, small) = small();
        let reloaded = store.reload("small").unwrap();
        let mut lane = Lane::default();
        let sizes = |batch: &[Queued]| batch.iter().map(|q| q.job.n_docs).collect::<Vec<_>>();
        for (n_docs, backend, ranker) in [
            (500, Backend::Auto, &small),
            (300, Backend::Auto, &small),
            (300, Backend::Auto, &small),
            (10, Backend::Auto, &small),
            (10, Backend::Gpu, &small),
            (10, Backend::Gpu, &reloaded),
            (5000, Backend::Gpu, &reloaded),
        ] {
            lane.queued.push_back(job(ranker, n_docs, backend));
        }
        assert_eq!(sizes(&next_batch(&mut lane, 1000)), [500, 300]);
        assert_eq!(sizes(&next_batch(&mut lane, 1000)), [300, 10]);
        assert_eq!(sizes(&next_batch(&mut lane, 1000)), [10]);
        assert_eq!(sizes(&next_batch(&mut lane, 1000)), [10]);
        assert_eq!(sizes(&next_batch(&mut lane, 1000)), [5000]);
        assert!(next_batch(&mut lane, 1000).is_empty());
    }
}
