//! One device shared by concurrent callers, whose waiting work runs in batches (flat
//! combining): a caller queues its job, then takes the device's lock; whoever holds it runs the
//! jobs queued so far (up to a batch's size) in one go and hands each its answer. Callers that
//! arrive while the device is busy are answered by the next holder, in one batch, instead of
//! each taking the lock in turn: their work can share launches, copies and waits.
//!
//! A caller waits at most as long as it says; if its job is still queued then, it takes the job
//! back (to run it elsewhere, on the CPU); once a holder has taken it, the caller waits for that
//! batch to end. Jobs run in the order they were queued.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Where a queued job's answer lands.
struct Slot<T> {
    answer: Mutex<Option<T>>,
    answered: Condvar,
}

impl<T> Slot<T> {
    fn put(&self, answer: T) {
        *self.answer.lock() = Some(answer);
        self.answered.notify_all();
    }

    fn take(&self) -> Option<T> {
        self.answer.lock().take()
    }

    fn wait(&self) -> T {
        let mut answer = self.answer.lock();
        loop {
            if let Some(answer) = answer.take() {
                return answer;
            }
            self.answered.wait(&mut answer);
        }
    }
}

/// A resource `R` (the device's state) and the jobs `J` waiting for it, answered with `T`.
pub struct Combiner<R, J, T> {
    resource: Mutex<R>,
    queued: Mutex<VecDeque<(u64, J, Arc<Slot<T>>)>>,
    next_id: AtomicU64,
    max_batch: usize,
}

impl<R, J, T> Combiner<R, J, T> {
    /// `resource`, whose jobs run at most `max_batch` at a time (1: each alone).
    pub fn new(resource: R, max_batch: usize) -> Combiner<R, J, T> {
        Combiner {
            resource: Mutex::new(resource),
            queued: Mutex::new(VecDeque::new()),
            next_id: AtomicU64::new(0),
            max_batch: max_batch.max(1),
        }
    }

    /// The resource itself, waiting for the batch that holds it (to replace or inspect it).
    pub fn lock(&self) -> MutexGuard<'_, R> {
        self.resource.lock()
    }

    /// Runs `job` with `run` (the jobs of a batch in queue order → one answer each, in the same
    /// order), in a batch with the jobs queued beside it, by whichever caller holds the
    /// resource. `Err(job)` gives the job back when no holder took it within `wait`.
    ///
    /// `run` must be the same function for every caller: a holder runs the others' jobs with
    /// its own. It must answer every job; a missing answer leaves its caller waiting.
    pub fn submit(
        &self,
        job: J,
        wait: Duration,
        mut run: impl FnMut(&mut R, Vec<J>) -> Vec<T>,
    ) -> Result<T, J> {
        let slot = Arc::new(Slot {
            answer: Mutex::new(None),
            answered: Condvar::new(),
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.queued.lock().push_back((id, job, Arc::clone(&slot)));
        let until = Instant::now() + wait;
        loop {
            if let Some(answer) = slot.take() {
                return Ok(answer);
            }
            let Some(mut resource) = self.resource.try_lock_until(until) else {
                let mut queued = self.queued.lock();
                return match queued.iter().position(|(queued_id, ..)| *queued_id == id) {
                    Some(at) => {
                        Err(queued.remove(at).map(|(_, job, _)| job).unwrap_or_else(|| {
                            unreachable!("the position was found under the same lock")
                        }))
                    }
                    // A holder took it: its batch is running.
                    None => {
                        drop(queued);
                        Ok(slot.wait())
                    }
                };
            };
            let batch: Vec<_> = {
                let mut queued = self.queued.lock();
                let n = queued.len().min(self.max_batch);
                queued.drain(..n).collect()
            };
            // Empty: the job was in a batch that ended before this caller took the lock, and
            // its answer is in the slot (answers land before the lock is released).
            if batch.is_empty() {
                continue;
            }
            let (jobs, slots): (Vec<J>, Vec<Arc<Slot<T>>>) =
                batch.into_iter().map(|(_, job, slot)| (job, slot)).unzip();
            let answers = run(&mut resource, jobs);
            for (slot, answer) in slots.iter().zip(answers) {
                slot.put(answer);
            }
            drop(resource);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 16 threads submit 50 jobs each to a slow resource: every job is answered with its own
    /// answer, exactly once, and batches of more than one job form.
    #[test]
    fn concurrent_jobs_are_each_answered_once_and_share_batches() {
        let combiner: Arc<Combiner<Vec<usize>, u64, u64>> = Arc::new(Combiner::new(Vec::new(), 8));
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let combiner = Arc::clone(&combiner);
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        let job = t * 1000 + i;
                        let answer =
                            combiner.submit(job, Duration::from_secs(60), |sizes, jobs| {
                                sizes.push(jobs.len());
                                std::thread::sleep(Duration::from_micros(200));
                                jobs.iter().map(|j| 2 * j).collect()
                            });
                        assert_eq!(answer, Ok(2 * job));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let sizes = combiner.lock().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 16 * 50);
        assert!(sizes.iter().all(|&n| (1..=8).contains(&n)), "{sizes:?}");
        assert!(sizes.iter().any(|&n| n > 1), "no batch formed: {sizes:?}");
    }

    /// A job still queued when its wait ends comes back to its caller; the holder's batch
    /// does not run it.
    #[test]
    fn a_job_not_taken_within_its_wait_comes_back() {
        let combiner: Arc<Combiner<Vec<u64>, u64, u64>> = Arc::new(Combiner::new(Vec::new(), 4));
        let held = combiner.lock();
        let waiter = {
            let combiner = Arc::clone(&combiner);
            std::thread::spawn(move || {
                combiner.submit(7, Duration::from_millis(20), |ran, jobs| {
                    ran.extend(&jobs);
                    jobs
                })
            })
        };
        assert_eq!(waiter.join().unwrap(), Err(7));
        drop(held);
        let answer = combiner.submit(8, Duration::ZERO, |ran, jobs| {
            ran.extend(&jobs);
            jobs
        });
        assert_eq!(answer, Ok(8));
        assert_eq!(*combiner.lock(), [8]);
    }
}
