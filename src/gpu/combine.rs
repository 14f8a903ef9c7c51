//! One device shared by concurrent callers, whose waiting work runs in batches (flat
//! combining): a caller queues its job, then waits for the device's turn ([`Turns`], one per
//! [`Executor`](super::Executor)); whoever gets it runs the jobs queued so far (up to a batch's
//! size) in one go, with the resource they need (a stage's device-side cache), and hands each
//! its answer. Callers that
//! arrive while the device is busy are answered by the next holder, in one batch, instead of
//! each taking the lock in turn: their work can share launches, copies and waits.
//!
//! A caller waits at most as long as it says; if its job is still queued then, it withdraws it
//! (to run it elsewhere, on the CPU); once a holder has taken it, the caller waits for that
//! batch to end, which answers it (or says it could not, if the batch panicked). Jobs run in
//! the order they were queued.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::executor::Turns;

/// Where a queued job's answer lands: `Some(None)` when its batch ended without answering it
/// (the run panicked or gave too few answers).
struct Slot<T> {
    answer: Mutex<Option<Option<T>>>,
    answered: Condvar,
}

impl<T> Slot<T> {
    fn put(&self, answer: Option<T>) {
        *self.answer.lock() = Some(answer);
        self.answered.notify_all();
    }

    fn take(&self) -> Option<Option<T>> {
        self.answer.lock().take()
    }

    fn wait(&self) -> Option<T> {
        let mut answer = self.answer.lock();
        loop {
            if let Some(answer) = answer.take() {
                return answer;
            }
            self.answered.wait(&mut answer);
        }
    }
}

/// The slots of a running batch: those its run did not answer are told so when it ends, even
/// by a panic, so that no caller waits for ever.
struct Answering<T> {
    slots: Vec<Arc<Slot<T>>>,
    answered: usize,
}

impl<T> Drop for Answering<T> {
    fn drop(&mut self) {
        for slot in &self.slots[self.answered..] {
            slot.put(None);
        }
    }
}

/// A queued job: its id (to withdraw it), the job, where its answer lands.
type Queued<J, T> = (u64, J, Arc<Slot<T>>);

/// A resource `R` (the device's state) and the jobs `J` waiting for it, answered with `T`.
pub struct Combiner<R, J, T> {
    resource: Mutex<R>,
    /// The jobs no holder has taken yet, each with its id and answer slot.
    queued: Mutex<VecDeque<Queued<J, T>>>,
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

    /// The resource itself, waiting for the batch that holds it (to replace or inspect it;
    /// work on the device takes the device's turn first, as batches do).
    pub fn lock(&self) -> MutexGuard<'_, R> {
        self.resource.lock()
    }

    /// Runs `job` with `run` (the jobs of a batch in queue order → one answer each, in the same
    /// order), in a batch with the jobs queued beside it, by whichever caller gets the device's
    /// turn (from `turns`, the same for every caller). `None` when no holder took the job within `wait` (it is withdrawn), or when the
    /// batch that took it ended without its answer (its run panicked).
    ///
    /// `run` must be the same function for every caller: a holder runs the others' jobs with
    /// its own.
    pub fn submit(
        &self,
        turns: &Turns,
        job: J,
        wait: Duration,
        mut run: impl FnMut(&mut R, Vec<J>) -> Vec<T>,
    ) -> Option<T> {
        let slot = Arc::new(Slot {
            answer: Mutex::new(None),
            answered: Condvar::new(),
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.queued.lock().push_back((id, job, Arc::clone(&slot)));
        let until = Instant::now() + wait;
        loop {
            if let Some(answer) = slot.take() {
                return answer;
            }
            let Some(turn) = turns.take_until(until) else {
                let mut queued = self.queued.lock();
                match queued.iter().position(|(queued_id, ..)| *queued_id == id) {
                    Some(at) => {
                        queued.remove(at);
                        return None;
                    }
                    // A holder took it: its batch is running.
                    None => {
                        drop(queued);
                        return slot.wait();
                    }
                }
            };
            let mut resource = self.resource.lock();
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
            let mut answering = Answering { slots, answered: 0 };
            for answer in run(&mut resource, jobs) {
                if let Some(slot) = answering.slots.get(answering.answered) {
                    slot.put(Some(answer));
                    answering.answered += 1;
                }
            }
            drop(answering);
            drop(resource);
            drop(turn);
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
        let turns = Arc::new(Turns::default());
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let (combiner, turns) = (Arc::clone(&combiner), Arc::clone(&turns));
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        let job = t * 1000 + i;
                        let answer =
                            combiner.submit(&turns, job, Duration::from_secs(60), |sizes, jobs| {
                                sizes.push(jobs.len());
                                std::thread::sleep(Duration::from_micros(200));
                                jobs.iter().map(|j| 2 * j).collect()
                            });
                        assert_eq!(answer, Some(2 * job));
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

    /// A job still queued when its wait ends is withdrawn: its caller gets `None` and no batch
    /// runs it.
    #[test]
    fn a_job_not_taken_within_its_wait_is_withdrawn() {
        let combiner: Arc<Combiner<Vec<u64>, u64, u64>> = Arc::new(Combiner::new(Vec::new(), 4));
        let turns = Arc::new(Turns::default());
        let held = turns.take();
        let waiter = {
            let (combiner, turns) = (Arc::clone(&combiner), Arc::clone(&turns));
            std::thread::spawn(move || {
                combiner.submit(&turns, 7, Duration::from_millis(20), |ran, jobs| {
                    ran.extend(&jobs);
                    jobs
                })
            })
        };
        assert_eq!(waiter.join().unwrap(), None);
        drop(held);
        let answer = combiner.submit(&turns, 8, Duration::ZERO, |ran, jobs| {
            ran.extend(&jobs);
            jobs
        });
        assert_eq!(answer, Some(8));
        assert_eq!(*combiner.lock(), [8]);
    }

    /// A batch whose run panics answers its waiting jobs with `None` instead of leaving them
    /// waiting; the panic stays the holder's.
    #[test]
    fn a_panicking_batch_leaves_no_job_waiting() {
        let combiner: Arc<Combiner<(), u64, u64>> = Arc::new(Combiner::new((), 8));
        let turns = Arc::new(Turns::default());
        let held = turns.take();
        let waiters: Vec<_> = (0..3)
            .map(|job| {
                let (combiner, turns) = (Arc::clone(&combiner), Arc::clone(&turns));
                std::thread::spawn(move || {
                    combiner.submit(&turns, job, Duration::from_secs(60), |_, jobs| {
                        if jobs.len() > 1 {
                            panic!("a batch of {} jobs", jobs.len());
                        }
                        jobs
                    })
                })
            })
            .collect();
        // Let all three queue before the device is free.
        while combiner.queued.lock().len() < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(held);
        let answers: Vec<_> = waiters.into_iter().map(|w| w.join()).collect();
        // One thread held the batch and panicked; the other two were told it ended.
        assert_eq!(answers.iter().filter(|a| a.is_err()).count(), 1);
        assert!(answers.iter().flatten().all(Option::is_none));
    }
}
