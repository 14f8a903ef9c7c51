//! The fused requests waiting for a device: each request's hit layouts queue in the device's
//! [`FusedQueue`] (a [`Combiner`]); the caller leading the queue scores every request queued
//! there in one device turn, consecutive requests of one ranker version in one device batch
//! (one pass of the model, one copy out), and splits the scores back. Kept apart from
//! [`super::backends`], which decides where a batch runs, because this is how one device's turn
//! is shared.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::batch::{micros, record_batch};
use crate::gpu::{Combiner, Executor, GpuDevice, GpuError};
use crate::rank::gpu::cache::GpuRankerCache;
use crate::rank::gpu::fe::GpuFe;
use crate::rank::gpu::layout::FeLayout;
use crate::rank::store::LoadedRanker;

/// A device's queue of fused requests.
pub(super) type FusedQueue = Combiner<(), FusedJob, Result<FusedScores, GpuError>>;

/// A request's hit documents laid out for the fused path, queued for a device.
pub(super) struct FusedJob {
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

/// The most fused requests one device turn takes (their documents are split into device
/// batches as any layouts are).
pub(super) const FUSED_JOBS_PER_TURN: usize = 32;

/// How long a fused request waits for a device's turn before it runs on the CPU instead (a
/// safety valve: under load the wait is milliseconds).
const FUSED_WAIT: Duration = Duration::from_secs(10);

/// Queues `layouts` for `loaded` in `executor`'s device `queue` and waits for its scores: the
/// caller leading the queue scores every fused request queued there ([`score_jobs`]) with the
/// device's ranker cache and FE buffers. A device failure takes the device out (the request
/// then goes to the CPU, as do requests that waited [`FUSED_WAIT`] without a turn).
pub(super) fn score(
    executor: &Executor,
    queue: &FusedQueue,
    rankers: &GpuRankerCache,
    fe: &Mutex<GpuFe>,
    loaded: &Arc<LoadedRanker>,
    layouts: Vec<FeLayout>,
) -> Result<FusedScores, GpuError> {
    let _queued = executor.queued();
    let job = FusedJob {
        ranker: Arc::clone(loaded),
        layouts,
    };
    let answer = queue
        .submit(executor.turns(), job, FUSED_WAIT, |(), jobs| {
            executor.during_turn(|device| score_jobs(device, rankers, fe, &jobs))
        })
        .unwrap_or_else(|| {
            Err(GpuError::Unavailable {
                reason: format!("no device turn within {} s", FUSED_WAIT.as_secs()),
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
