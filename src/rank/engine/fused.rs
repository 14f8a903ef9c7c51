//! The fused requests waiting for a device: each device has a [`Lane`] of its own (its fused
//! lane, thread `gpu{N}-fused`) that takes the requests queued for it, up to
//! [`FUSED_JOBS_PER_TURN`] at a time, scores them in one device turn — consecutive requests of
//! one ranker version in one device batch (one pass of the model, one copy out) — and sends each
//! its scores. A request only queues its layouts and waits for its answer ([`score`]) or awaits
//! it ([`score_queued`]). Kept apart from [`super::backends`], which decides where a batch runs,
//! because this is how one device's turn is shared.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::batch::{micros, record_batch};
use crate::gpu::{Executor, GpuDevice, GpuError, Lane, Missed};
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

/// A fused job's answer.
type Answer = Result<FusedScores, GpuError>;

/// The most fused requests one device turn takes (their documents are split into device
/// batches as any layouts are).
const FUSED_JOBS_PER_TURN: usize = 32;

/// How long a fused request waits for a turn of its device to take it before it runs on the CPU
/// instead (a safety valve: under load the wait is milliseconds).
const FUSED_WAIT: Duration = Duration::from_secs(10);

/// A device's fused lane: where requests queue for its thread, which ends when the lane is
/// dropped (with the stage's share of the device).
pub(super) struct FusedLane(Lane<FusedJob, Answer>);

impl FusedLane {
    /// Starts `executor`'s lane (thread `gpu{N}-fused`): it scores the jobs queued here with the
    /// device's ranker cache and FE buffers, during the device's turns.
    pub(super) fn start(
        executor: &Arc<Executor>,
        rankers: &Arc<GpuRankerCache>,
        fe: &Arc<Mutex<GpuFe>>,
    ) -> Result<FusedLane, GpuError> {
        let (rankers, fe) = (Arc::clone(rankers), Arc::clone(fe));
        let name = format!("gpu{}-fused", executor.device().ordinal());
        let lane = Lane::start(name, executor, FUSED_JOBS_PER_TURN, move |device, jobs| {
            score_jobs(device, &rankers, &fe, &jobs)
        });
        lane.map(FusedLane).map_err(|err| GpuError::Unavailable {
            reason: format!("cannot start the device's fused lane: {err}"),
        })
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
    let answer = lane.0.submit(job(loaded, layouts), FUSED_WAIT);
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
    let answer = lane.0.submit_queued(job(loaded, layouts), FUSED_WAIT).await;
    settle(executor, answer)
}

/// The job of scoring `layouts` for `loaded`.
fn job(loaded: &Arc<LoadedRanker>, layouts: Vec<FeLayout>) -> FusedJob {
    FusedJob {
        ranker: Arc::clone(loaded),
        layouts,
    }
}

/// `answer` as the lane gave it, counted in its device's service record: a device failure takes
/// the device out.
fn settle(executor: &Executor, answer: Result<Answer, Missed>) -> Answer {
    let answer = answer.unwrap_or_else(|missed| {
        Err(match missed {
            Missed::NotTaken => GpuError::Unavailable {
                reason: format!("no device turn within {} s", FUSED_WAIT.as_secs()),
            },
            Missed::Stopped => GpuError::Unavailable {
                reason: missed.to_string(),
            },
            Missed::Unanswered => GpuError::BatchFailed {
                reason: missed.to_string(),
            },
        })
    });
    match &answer {
        Ok(_) => executor.succeeded(),
        Err(err) => {
            executor.failed(err);
        }
    }
    answer
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
