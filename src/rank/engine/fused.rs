//! The fused requests waiting for a device: each device has a thread of its own (its fused
//! lane) that takes the requests queued for it, up to [`FUSED_JOBS_PER_TURN`] at a time, scores
//! them in one device turn — consecutive requests of one ranker version in one device batch (one
//! pass of the model, one copy out) — and sends each its scores, then takes the next requests at
//! once. A request only queues its layouts and waits for its answer ([`score`]) or awaits it
//! ([`score_queued`]): no caller leads a turn, so none waits for the device on the others'
//! behalf, and no hand-off of the lead to a sleeping caller separates one turn from the next. Kept apart from [`super::backends`], which
//! decides where a batch runs, because this is how one device's turn is shared.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::batch::{micros, record_batch};
use crate::gpu::{Executor, GpuDevice, GpuError};
use crate::rank::gpu::cache::GpuRankerCache;
use crate::rank::gpu::fe::GpuFe;
use crate::rank::gpu::layout::FeLayout;
use crate::rank::store::LoadedRanker;

/// A request's hit documents laid out for the fused path, queued for a device.
struct FusedJob {
    ranker: Arc<LoadedRanker>,
    layouts: Vec<FeLayout>,
}

/// A fused job's scores and the device batch that scored them.
pub(super) struct FusedScores {
    pub(super) scores: Vec<f64>,
    pub(super) turn: Instant,
    pub(super) turn_us: u64,
    pub(super) batch_docs: usize,
    pub(super) batch_requests: usize,
}

/// A job in a device's fused lane: the job, by when its caller stops waiting, where its answer
/// goes.
struct Queued {
    job: FusedJob,
    until: Instant,
    answer: AnswerTo,
}

/// A fused job's answer.
type Answer = Result<FusedScores, GpuError>;

/// Where a fused job's answer goes: to a thread waiting for it, or to a task awaiting it.
enum AnswerTo {
    Thread(mpsc::SyncSender<Answer>),
    Task(oneshot::Sender<Answer>),
}

impl AnswerTo {
    /// Sends `answer` (nowhere when the caller has stopped waiting).
    fn send(self, answer: Answer) {
        match self {
            AnswerTo::Thread(to) => drop(to.send(answer)),
            AnswerTo::Task(to) => drop(to.send(answer)),
        }
    }
}

/// The most fused requests one device turn takes (their documents are split into device
/// batches as any layouts are).
const FUSED_JOBS_PER_TURN: usize = 32;

/// How long a fused request waits for its device's answer before it runs on the CPU instead (a
/// safety valve: under load the wait is milliseconds).
const FUSED_WAIT: Duration = Duration::from_secs(10);

/// A device's fused lane: where requests queue for its thread, which ends when the lane is
/// dropped (with the stage's share of the device).
pub(super) struct FusedLane {
    jobs: mpsc::Sender<Queued>,
}

impl FusedLane {
    /// Starts `executor`'s lane: its thread scores the jobs queued here with the device's
    /// ranker cache and FE buffers, during the device's turns.
    pub(super) fn start(
        executor: &Arc<Executor>,
        rankers: &Arc<GpuRankerCache>,
        fe: &Arc<Mutex<GpuFe>>,
    ) -> Result<FusedLane, GpuError> {
        let (executor, rankers, fe) = (Arc::clone(executor), Arc::clone(rankers), Arc::clone(fe));
        let (jobs, queued) = mpsc::channel();
        let name = format!("gpu{}-fused", executor.device().ordinal());
        std::thread::Builder::new()
            .name(name)
            .spawn(move || run_lane(&executor, &rankers, &fe, &queued))
            .map_err(|err| GpuError::Unavailable {
                reason: format!("cannot start the device's fused lane: {err}"),
            })?;
        Ok(FusedLane { jobs })
    }
}

/// Queues `layouts` for `loaded` in `executor`'s fused `lane` and waits for its scores. A
/// device failure takes the device out (the request then goes to the CPU, as do requests not
/// answered within [`FUSED_WAIT`]).
pub(super) fn score(
    executor: &Executor,
    lane: &FusedLane,
    loaded: &Arc<LoadedRanker>,
    layouts: Vec<FeLayout>,
) -> Answer {
    let _queued = executor.queued();
    let (answer, answered) = mpsc::sync_channel(1);
    let answer =
        queue(lane, loaded, layouts, AnswerTo::Thread(answer)).and_then(|()| {
            match answered.recv_timeout(FUSED_WAIT) {
                Ok(answer) => answer,
                Err(mpsc::RecvTimeoutError::Timeout) => Err(unanswered()),
                Err(mpsc::RecvTimeoutError::Disconnected) => Err(stopped()),
            }
        });
    settle(executor, answer)
}

/// [`score`], awaiting the scores instead of waiting for them.
pub(super) async fn score_queued(
    executor: &Executor,
    lane: &FusedLane,
    loaded: &Arc<LoadedRanker>,
    layouts: Vec<FeLayout>,
) -> Answer {
    let _queued = executor.queued();
    let (answer, answered) = oneshot::channel();
    let answer = match queue(lane, loaded, layouts, AnswerTo::Task(answer)) {
        Ok(()) => match tokio::time::timeout(FUSED_WAIT, answered).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(stopped()),
            Err(_) => Err(unanswered()),
        },
        Err(err) => Err(err),
    };
    settle(executor, answer)
}

/// Queues `layouts` for `loaded` in `lane`, its answer to go to `answer`.
fn queue(
    lane: &FusedLane,
    loaded: &Arc<LoadedRanker>,
    layouts: Vec<FeLayout>,
    answer: AnswerTo,
) -> Result<(), GpuError> {
    let job = FusedJob {
        ranker: Arc::clone(loaded),
        layouts,
    };
    let until = Instant::now() + FUSED_WAIT;
    (lane.jobs.send(Queued { job, until, answer })).map_err(|_| stopped())
}

/// Counts `answer` in its device's service record: a device failure takes the device out.
fn settle(executor: &Executor, answer: Answer) -> Answer {
    match &answer {
        Ok(_) => executor.succeeded(),
        Err(err) => {
            executor.failed(err);
        }
    }
    answer
}

/// The answer of a fused job whose lane has stopped.
fn stopped() -> GpuError {
    GpuError::Unavailable {
        reason: "the device's fused lane has stopped".into(),
    }
}

/// The answer of a fused job not answered within [`FUSED_WAIT`].
fn unanswered() -> GpuError {
    GpuError::Unavailable {
        reason: format!("no device turn within {} s", FUSED_WAIT.as_secs()),
    }
}

/// A fused lane's thread: takes the queued jobs (waiting for the first), drops those whose
/// caller has stopped waiting, scores the rest in one turn of the device and answers each;
/// until the lane is dropped. A turn that panics answers its jobs with an error and the lane
/// goes on.
fn run_lane(
    executor: &Executor,
    rankers: &GpuRankerCache,
    fe: &Mutex<GpuFe>,
    queued: &mpsc::Receiver<Queued>,
) {
    while let Ok(first) = queued.recv() {
        let mut batch = vec![first];
        while batch.len() < FUSED_JOBS_PER_TURN {
            match queued.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let now = Instant::now();
        batch.retain(|queued| queued.until > now);
        if batch.is_empty() {
            continue;
        }
        let (jobs, answers): (Vec<FusedJob>, Vec<_>) =
            batch.into_iter().map(|q| (q.job, q.answer)).unzip();
        let scored = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _turn = executor.turns().take();
            executor.during_turn(|device| score_jobs(device, rankers, fe, &jobs))
        }));
        match scored {
            Ok(scored) => {
                for (answer, scores) in answers.into_iter().zip(scored) {
                    answer.send(scores);
                }
            }
            Err(_) => {
                tracing::error!(
                    device = executor.device().ordinal(),
                    "a fused device turn panicked"
                );
                for answer in answers {
                    answer.send(Err(GpuError::BatchFailed {
                        reason: "the device turn panicked".into(),
                    }));
                }
            }
        }
    }
}

/// Scores fused `jobs` in the device's turn, in queue order: consecutive jobs of one ranker
/// version in one call (their layouts share device batches: one pass of the model, one copy
/// out), split back into each job's scores. A failed call fails its jobs: the first with the
/// error itself (a device failure counts once), the others as a failed batch.
fn score_jobs(
    device: &Arc<GpuDevice>,
    rankers: &GpuRankerCache,
    fe: &Mutex<GpuFe>,
    jobs: &[FusedJob],
) -> Vec<Result<FusedScores, GpuError>> {
    let mut answers = Vec::with_capacity(jobs.len());
    let same_ranker = |a: &FusedJob, b: &FusedJob| {
        a.ranker.name == b.ranker.name && a.ranker.version == b.ranker.version
    };
    for group in jobs.chunk_by(same_ranker) {
        let turn = Instant::now();
        let loaded = &group[0].ranker;
        let layouts: Vec<&FeLayout> = group.iter().flat_map(|job| &job.layouts).collect();
        let batch_docs = layouts.iter().map(|l| l.n_docs()).sum();
        let scored = rankers
            .get_or_upload(&loaded.name, loaded.version, &loaded.ranker)
            .and_then(|cached| {
                let fe = &mut fe.lock();
                (cached.gpu).score_hits(device, fe, &layouts, false, false)
            });
        let turn_us = micros(turn.elapsed());
        match scored {
            Ok(scored) => {
                record_batch(batch_docs, group.len());
                let mut rest = &scored.scores[..];
                for job in group {
                    let n = job.layouts.iter().map(FeLayout::n_docs).sum();
                    let (scores, after) = rest.split_at(n);
                    rest = after;
                    answers.push(Ok(FusedScores {
                        scores: scores.to_vec(),
                        turn,
                        turn_us,
                        batch_docs,
                        batch_requests: group.len(),
                    }));
                }
            }
            Err(err) => {
                let reason = err.to_string();
                answers.push(Err(err));
                answers.extend((1..group.len()).map(|_| {
                    Err(GpuError::BatchFailed {
                        reason: reason.clone(),
                    })
                }));
            }
        }
    }
    answers
}
