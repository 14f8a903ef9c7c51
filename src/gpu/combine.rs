//! One device shared by concurrent callers, whose waiting work runs in batches (flat
//! combining): a caller queues its job; one caller at a time leads (the first to queue while
//! no one leads): it waits for the device's turn ([`Turns`], one per
//! [`Executor`](super::Executor)), runs the jobs queued so far (up to a batch's size) in one go
//! with the resource they need (a stage's device-side cache), and once its own job is answered
//! passes the lead to the oldest job still queued, then hands each its answer. Callers that
//! arrive while the device is busy are answered by the leader, in one batch, instead of each
//! taking the device in turn: their work can share launches, copies and waits.
//!
//! Only the leader waits for the device; the others wait for their answer alone, so an answered
//! caller returns at once. (When every caller waited for the turn, one whose job another's batch
//! had answered learnt it only once its own turn came, after the batches of those queued ahead
//! of it: under load each answer came several batches late, closed-loop clients sent their next
//! job late, and batches stayed small.)
//!
//! A caller waits at most as long as it says; if its job is still queued then, it withdraws it
//! (to run it elsewhere, on the CPU), passing the lead on if it held it; once a batch has taken
//! the job, the caller waits for that batch to end, which answers it (or says it could not, if
//! the batch panicked). Jobs run in the order they were queued.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::executor::Turns;

/// What a queued job's caller is told.
enum Word<T> {
    /// Nothing yet.
    Waiting,
    /// Lead: the job is the oldest queued and no one else leads.
    Lead,
    /// The job's batch ended: its answer, `None` when the batch did not give one (its run
    /// panicked or gave too few answers).
    Answered(Option<T>),
}

/// Where a caller is told: the lead, or its job's answer.
struct Slot<T> {
    word: Mutex<Word<T>>,
    told: Condvar,
}

impl<T> Slot<T> {
    fn new() -> Slot<T> {
        Slot {
            word: Mutex::new(Word::Waiting),
            told: Condvar::new(),
        }
    }

    fn tell(&self, word: Word<T>) {
        *self.word.lock() = word;
        self.told.notify_all();
    }

    /// What the caller has been told, waiting for it until `until` (for ever with `None`);
    /// `Waiting` when nothing came by then. Taking the word leaves `Waiting` behind.
    fn wait(&self, until: Option<Instant>) -> Word<T> {
        let mut word = self.word.lock();
        while matches!(*word, Word::Waiting) {
            match until {
                Some(until) => {
                    if self.told.wait_until(&mut word, until).timed_out() {
                        break;
                    }
                }
                None => self.told.wait(&mut word),
            }
        }
        std::mem::replace(&mut *word, Word::Waiting)
    }

    /// What the caller has been told so far, without waiting.
    fn told(&self) -> Word<T> {
        std::mem::replace(&mut *self.word.lock(), Word::Waiting)
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
            slot.tell(Word::Answered(None));
        }
    }
}

/// A queued job: its id (to withdraw it), the job, where its caller is told.
type Queued<J, T> = (u64, J, Arc<Slot<T>>);

/// The jobs no batch has taken yet, and whether a caller leads.
struct Queue<J, T> {
    jobs: VecDeque<Queued<J, T>>,
    led: bool,
}

impl<J, T> Queue<J, T> {
    /// Takes job `id` out if it is still queued; whether it was.
    fn withdraw(&mut self, id: u64) -> bool {
        let at = self.jobs.iter().position(|(queued, ..)| *queued == id);
        at.map(|at| self.jobs.remove(at)).is_some()
    }

    /// The leader steps down: the oldest queued job's caller leads next, or no one when none
    /// is queued.
    fn pass_lead(&mut self) {
        match self.jobs.front() {
            Some((_, _, slot)) => slot.tell(Word::Lead),
            None => self.led = false,
        }
    }
}

/// The lead held by a caller: dropped (also by a panic in a batch's run), it withdraws the
/// caller's job if still queued and passes the lead on, so that the queue never waits for a
/// leader that is gone.
struct Leading<'a, J, T> {
    queue: &'a Mutex<Queue<J, T>>,
    id: u64,
}

impl<J, T> Drop for Leading<'_, J, T> {
    fn drop(&mut self) {
        let mut queue = self.queue.lock();
        queue.withdraw(self.id);
        queue.pass_lead();
    }
}

/// A resource `R` (the device's state) and the jobs `J` waiting for it, answered with `T`.
pub struct Combiner<R, J, T> {
    resource: Mutex<R>,
    queue: Mutex<Queue<J, T>>,
    next_id: AtomicU64,
    max_batch: usize,
}

impl<R, J, T> Combiner<R, J, T> {
    /// `resource`, whose jobs run at most `max_batch` at a time (1: each alone).
    pub fn new(resource: R, max_batch: usize) -> Combiner<R, J, T> {
        Combiner {
            resource: Mutex::new(resource),
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                led: false,
            }),
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
    /// order), in a batch with the jobs queued beside it, led by one of their callers during the
    /// device's turn (from `turns`, the same for every caller). `None` when no batch took the job
    /// within `wait` (it is withdrawn), or when the batch that took it ended without its answer
    /// (its run panicked).
    ///
    /// `run` must be the same function for every caller: a leader runs the others' jobs with
    /// its own.
    pub fn submit(
        &self,
        turns: &Turns,
        job: J,
        wait: Duration,
        run: impl FnMut(&mut R, Vec<J>) -> Vec<T>,
    ) -> Option<T> {
        let until = Instant::now() + wait;
        let slot = Arc::new(Slot::new());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let leads = {
            let mut queue = self.queue.lock();
            queue.jobs.push_back((id, job, Arc::clone(&slot)));
            !std::mem::replace(&mut queue.led, true)
        };
        if !leads {
            match slot.wait(Some(until)) {
                Word::Answered(answer) => return answer,
                Word::Lead => {}
                Word::Waiting => {
                    let mut queue = self.queue.lock();
                    // Told while taking the lock: the lead (passed on with the job withdrawn)
                    // or the answer.
                    match slot.told() {
                        Word::Answered(answer) => return answer,
                        Word::Lead => {
                            queue.withdraw(id);
                            queue.pass_lead();
                            return None;
                        }
                        Word::Waiting if queue.withdraw(id) => return None,
                        // A batch took it: it answers.
                        Word::Waiting => {
                            drop(queue);
                            return match slot.wait(None) {
                                Word::Answered(answer) => answer,
                                _ => unreachable!("only a queued job is passed the lead"),
                            };
                        }
                    }
                }
            }
        }
        self.lead(turns, id, &slot, until, run)
    }

    /// Leads for job `id`: waits for the device's turn until `until` (then withdraws the job),
    /// runs batches until one has answered the job, gives the turn back and passes the lead on,
    /// and only then tells the batches' other callers their answers: the next leader's wake-up
    /// and turn overlap that telling (a wake-up each), which under load would otherwise leave
    /// the device idle between turns.
    fn lead(
        &self,
        turns: &Turns,
        id: u64,
        slot: &Slot<T>,
        until: Instant,
        mut run: impl FnMut(&mut R, Vec<J>) -> Vec<T>,
    ) -> Option<T> {
        let leading = Leading {
            queue: &self.queue,
            id,
        };
        let turn = turns.take_until(until)?;
        let mut resource = self.resource.lock();
        // Batches run, each with its answers, to be told once the lead is passed on. Only the
        // leader takes jobs, so its job stays queued until a batch here takes it (an empty queue
        // would mean it is not: nothing is left to wait for).
        let mut ran = Vec::new();
        loop {
            let batch: Vec<_> = {
                let mut queue = self.queue.lock();
                let n = queue.jobs.len().min(self.max_batch);
                queue.jobs.drain(..n).collect()
            };
            if batch.is_empty() {
                break;
            }
            let has_own = batch.iter().any(|(queued, ..)| *queued == id);
            let (jobs, slots): (Vec<J>, Vec<Arc<Slot<T>>>) =
                batch.into_iter().map(|(_, job, slot)| (job, slot)).unzip();
            let answering = Answering { slots, answered: 0 };
            ran.push((answering, run(&mut resource, jobs)));
            if has_own {
                break;
            }
        }
        drop(resource);
        drop(turn);
        drop(leading);
        let mut own = None;
        for (mut answering, answers) in ran {
            for answer in answers {
                let Some(caller) = answering.slots.get(answering.answered) else {
                    break;
                };
                match std::ptr::eq(Arc::as_ptr(caller), slot) {
                    true => own = Some(answer),
                    false => caller.tell(Word::Answered(Some(answer))),
                }
                answering.answered += 1;
            }
        }
        own
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 16 threads submit 50 jobs each to a slow resource: every job is answered with its own
    /// answer, exactly once, and batches form that are mostly full.
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
        // Answered callers return at once and queue their next job while the batch after runs,
        // so batches fill up (measured: 7.8 jobs on the mean of 8; 1.3 when every caller waited
        // for the device's turn to learn its answer).
        let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
        assert!(
            mean > 3.0,
            "batches of {mean:.1} jobs on the mean: {sizes:?}"
        );
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

    /// A leader whose wait runs out before the device's turn comes withdraws its job and passes
    /// the lead to the next job queued, which is then run.
    #[test]
    fn a_leader_that_gives_up_passes_the_lead_on() {
        let combiner: Arc<Combiner<Vec<u64>, u64, u64>> = Arc::new(Combiner::new(Vec::new(), 4));
        let turns = Arc::new(Turns::default());
        let held = turns.take();
        let submit = |job: u64, wait: Duration| {
            let (combiner, turns) = (Arc::clone(&combiner), Arc::clone(&turns));
            std::thread::spawn(move || {
                combiner.submit(&turns, job, wait, |ran, jobs| {
                    ran.extend(&jobs);
                    jobs
                })
            })
        };
        let leader = submit(1, Duration::from_millis(50));
        while combiner.queue.lock().jobs.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let follower = submit(2, Duration::from_secs(60));
        assert_eq!(leader.join().unwrap(), None);
        drop(held);
        assert_eq!(follower.join().unwrap(), Some(2));
        assert_eq!(*combiner.lock(), [2]);
        assert!(!combiner.queue.lock().led, "the lead was not given up");
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
        while combiner.queue.lock().jobs.len() < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(held);
        let answers: Vec<_> = waiters.into_iter().map(|w| w.join()).collect();
        // One thread held the batch and panicked; the other two were told it ended.
        assert_eq!(answers.iter().filter(|a| a.is_err()).count(), 1);
        assert!(answers.iter().flatten().all(Option::is_none));
    }
}
