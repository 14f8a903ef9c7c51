//! A stage's lane on one device: a thread of the device's own that takes the jobs queued for
//! it, waits for the device's turn ([`Turns`](super::Turns), shared with every other stage),
//! takes the jobs still queued then (up to a batch), runs them in one go and sends each caller
//! its answer, then goes back to the queue at once. A caller only queues its job and waits for
//! its answer ([`Lane::submit`]) or awaits it ([`Lane::submit_queued`]).
//!
//! Why a thread and not the callers themselves: when a caller led each batch (flat combining,
//! the first to queue ran the batch on its own thread), every turn ended with a wake-up of the
//! next leader, a sleeping caller, before the device had work again; under load that gap came
//! once per turn. The lane's thread is awake when a turn ends and starts the next with whatever
//! queued meanwhile. On two H200 against the leader-runs-the-turn queue: `/v1/rank`'s fused
//! requests at 64 clients +9 % and +19 % requests/s (`29e7885`), `/v1/search` at 10 M documents
//! with both devices +7–34 % queries/s (`405837e`; docs/benchmarks.md).
//!
//! A caller waits for its job to be taken at most as long as it says; a job still queued then is
//! withdrawn (to run elsewhere, on the CPU). Once a turn has taken the job the caller waits for
//! that turn's answer: a turn that panics answers its jobs [`Missed::Unanswered`], and the lane
//! goes on. Jobs are taken in the order they were queued. Dropping the lane stops its thread
//! once the jobs already queued are done.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use super::{Executor, GpuDevice, Turns};

/// Why a job queued in a lane got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Missed {
    /// No turn took it within the caller's wait: it was withdrawn.
    #[error("no device turn took it within its wait")]
    NotTaken,
    /// The turn that took it ended without its answer (its run panicked).
    #[error("the device turn that took it gave no answer")]
    Unanswered,
    /// The lane has stopped.
    #[error("the device's lane has stopped")]
    Stopped,
}

/// A job's answer, or why there is none.
type Answer<T> = Result<T, Missed>;

/// Where a job's answer goes: to a thread waiting for it, or to a task awaiting it.
enum AnswerTo<T> {
    Thread(mpsc::SyncSender<Answer<T>>),
    Task(oneshot::Sender<Answer<T>>),
}

impl<T> AnswerTo<T> {
    /// Sends `answer` (nowhere when the caller has stopped waiting).
    fn send(self, answer: Answer<T>) {
        match self {
            AnswerTo::Thread(to) => drop(to.send(answer)),
            AnswerTo::Task(to) => drop(to.send(answer)),
        }
    }
}

/// A queued job: its id (to withdraw it), the job, by when its caller stops waiting for a turn
/// to take it (`None`: never), where its answer goes.
struct Queued<J, T> {
    id: u64,
    job: J,
    until: Option<Instant>,
    answer: AnswerTo<T>,
}

/// The jobs no turn has taken yet; whether the lane is closed to new ones.
struct Queue<J, T> {
    jobs: VecDeque<Queued<J, T>>,
    closed: bool,
}

/// What the callers and the lane's thread share.
struct Shared<J, T> {
    queue: Mutex<Queue<J, T>>,
    /// Told when a job is queued or the lane closes.
    arrived: Condvar,
}

/// A stage's lane on one device; see the module docs.
pub struct Lane<J, T> {
    shared: Arc<Shared<J, T>>,
    next_id: AtomicU64,
}

impl<J: Send + 'static, T: Send + 'static> Lane<J, T> {
    /// Starts a lane on `executor`'s device: its thread (`name`) runs at most `max_batch` jobs a
    /// turn with `run` (the device and the jobs in queue order → one answer each, in the same
    /// order; a job left without an answer is told [`Missed::Unanswered`]), inside the device's
    /// turn ([`Executor::during_turn`]).
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start(
        name: String,
        executor: &Arc<Executor>,
        max_batch: usize,
        mut run: impl FnMut(&Arc<GpuDevice>, Vec<J>) -> Vec<T> + Send + 'static,
    ) -> std::io::Result<Lane<J, T>> {
        Lane::spawn(
            name,
            Arc::clone(executor),
            |executor| executor.turns(),
            max_batch,
            move |executor, jobs| executor.during_turn(|device| run(device, jobs)),
        )
    }

    /// Starts a lane whose thread owns `owner`, takes its turns from `turns(&owner)` and runs a
    /// turn's jobs with `run`.
    fn spawn<O: Send + 'static>(
        name: String,
        owner: O,
        turns: fn(&O) -> &Turns,
        max_batch: usize,
        mut run: impl FnMut(&O, Vec<J>) -> Vec<T> + Send + 'static,
    ) -> std::io::Result<Lane<J, T>> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                closed: false,
            }),
            arrived: Condvar::new(),
        });
        let lane_shared = Arc::clone(&shared);
        std::thread::Builder::new().name(name).spawn(move || {
            run_lane(&lane_shared, turns(&owner), max_batch.max(1), |jobs| {
                run(&owner, jobs)
            })
        })?;
        Ok(Lane {
            shared,
            next_id: AtomicU64::new(0),
        })
    }
}

impl<J, T> Lane<J, T> {
    /// Queues `job` and waits for its answer: [`Missed::NotTaken`] when no turn took it within
    /// `wait` (it is withdrawn); once taken, the caller waits for its turn to end.
    pub fn submit(&self, job: J, wait: Duration) -> Answer<T> {
        let (to, answered) = mpsc::sync_channel(1);
        let id = self.queue(job, wait, AnswerTo::Thread(to))?;
        match answered.recv_timeout(wait) {
            Ok(answer) => answer,
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(Missed::Stopped),
            Err(mpsc::RecvTimeoutError::Timeout) if self.withdraw(id) => Err(Missed::NotTaken),
            Err(mpsc::RecvTimeoutError::Timeout) => answered.recv().unwrap_or(Err(Missed::Stopped)),
        }
    }

    /// [`Lane::submit`], awaiting the answer instead of waiting for it: no thread is held.
    pub async fn submit_queued(&self, job: J, wait: Duration) -> Answer<T> {
        let (to, mut answered) = oneshot::channel();
        let id = self.queue(job, wait, AnswerTo::Task(to))?;
        match tokio::time::timeout(wait, &mut answered).await {
            Ok(answer) => answer.unwrap_or(Err(Missed::Stopped)),
            Err(_) if self.withdraw(id) => Err(Missed::NotTaken),
            Err(_) => answered.await.unwrap_or(Err(Missed::Stopped)),
        }
    }

    /// Queues `job`, its caller waiting `wait` for a turn to take it; its id.
    fn queue(&self, job: J, wait: Duration, answer: AnswerTo<T>) -> Result<u64, Missed> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let until = Instant::now().checked_add(wait);
        let mut queue = self.shared.queue.lock();
        if queue.closed {
            return Err(Missed::Stopped);
        }
        queue.jobs.push_back(Queued {
            id,
            job,
            until,
            answer,
        });
        drop(queue);
        self.shared.arrived.notify_one();
        Ok(id)
    }

    /// Takes job `id` out if no turn has taken it yet; whether it was still queued.
    fn withdraw(&self, id: u64) -> bool {
        let mut queue = self.shared.queue.lock();
        let at = queue.jobs.iter().position(|queued| queued.id == id);
        at.map(|at| queue.jobs.remove(at)).is_some()
    }

    /// Jobs queued and not yet taken by a turn.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.shared.queue.lock().jobs.len()
    }
}

impl<J, T> Drop for Lane<J, T> {
    fn drop(&mut self) {
        self.shared.queue.lock().closed = true;
        self.shared.arrived.notify_all();
    }
}

/// A lane's thread: waits for a job, then for the device's turn, takes the jobs queued by then
/// (those whose caller stopped waiting are told so), runs them and answers each; until the lane
/// is closed and its queue empty.
fn run_lane<J, T>(
    shared: &Shared<J, T>,
    turns: &Turns,
    max_batch: usize,
    mut run: impl FnMut(Vec<J>) -> Vec<T>,
) {
    loop {
        {
            let mut queue = shared.queue.lock();
            while queue.jobs.is_empty() && !queue.closed {
                shared.arrived.wait(&mut queue);
            }
            if queue.jobs.is_empty() {
                return;
            }
        }
        // Jobs keep queuing (and may be withdrawn) while the turn is awaited.
        let turn = turns.take();
        let taken: Vec<Queued<J, T>> = {
            let mut queue = shared.queue.lock();
            let n = queue.jobs.len().min(max_batch);
            queue.jobs.drain(..n).collect()
        };
        let now = Instant::now();
        let mut jobs = Vec::with_capacity(taken.len());
        let mut answers = Vec::with_capacity(taken.len());
        for queued in taken {
            match queued.until.is_none_or(|until| until >= now) {
                true => {
                    jobs.push(queued.job);
                    answers.push(queued.answer);
                }
                // Its caller is withdrawing it (or gone).
                false => queued.answer.send(Err(Missed::NotTaken)),
            }
        }
        if jobs.is_empty() {
            continue;
        }
        let ran = catch_unwind(AssertUnwindSafe(|| run(jobs)));
        drop(turn);
        let mut answers = answers.into_iter();
        match ran {
            Ok(done) => {
                // `done` first: a zip takes from its first iterator before it learns the second
                // is done, and a sender taken here unused would tell its caller the lane stopped.
                for (done, answer) in done.into_iter().zip(answers.by_ref()) {
                    answer.send(Ok(done));
                }
            }
            Err(_) => tracing::error!(
                lane = std::thread::current().name().unwrap_or("lane"),
                "a device turn panicked: its jobs are answered with an error"
            ),
        }
        for answer in answers {
            answer.send(Err(Missed::Unanswered));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane on turns of its own (no device): `run` gets a turn's jobs.
    fn lane<J: Send + 'static, T: Send + 'static>(
        turns: &Arc<Turns>,
        max_batch: usize,
        mut run: impl FnMut(Vec<J>) -> Vec<T> + Send + 'static,
    ) -> Lane<J, T> {
        let turns = Arc::clone(turns);
        Lane::spawn(
            "test-lane".into(),
            turns,
            |turns| turns,
            max_batch,
            move |_, jobs| run(jobs),
        )
        .unwrap()
    }

    /// 16 threads submit 50 jobs each to a slow device: every job is answered with its own
    /// answer, exactly once, and turns take several jobs at once.
    #[test]
    fn concurrent_jobs_are_each_answered_once_and_share_turns() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let turns = Arc::new(Turns::default());
        let lane = Arc::new(lane(&turns, 8, {
            let sizes = Arc::clone(&sizes);
            move |jobs: Vec<u64>| {
                sizes.lock().push(jobs.len());
                std::thread::sleep(Duration::from_micros(200));
                jobs.iter().map(|j| 2 * j).collect()
            }
        }));
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let lane = Arc::clone(&lane);
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        let job = t * 1000 + i;
                        assert_eq!(lane.submit(job, Duration::from_secs(60)), Ok(2 * job));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let sizes = sizes.lock().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 16 * 50);
        assert!(sizes.iter().all(|&n| (1..=8).contains(&n)), "{sizes:?}");
        let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
        assert!(mean > 3.0, "turns of {mean:.1} jobs on the mean: {sizes:?}");
    }

    /// A job still queued when its wait ends (the device busy with another stage's turn) is
    /// withdrawn: its caller is told so and no turn runs it; a later job is run.
    #[test]
    fn a_job_not_taken_within_its_wait_is_withdrawn() {
        let ran = Arc::new(Mutex::new(Vec::<u64>::new()));
        let turns = Arc::new(Turns::default());
        let lane = lane(&turns, 4, {
            let ran = Arc::clone(&ran);
            move |jobs: Vec<u64>| {
                ran.lock().extend(&jobs);
                jobs
            }
        });
        let held = turns.take();
        assert_eq!(
            lane.submit(7, Duration::from_millis(20)),
            Err(Missed::NotTaken)
        );
        assert_eq!(lane.queued(), 0);
        drop(held);
        assert_eq!(lane.submit(8, Duration::from_secs(60)), Ok(8));
        assert_eq!(*ran.lock(), [8]);
    }

    /// A turn that panics answers its jobs [`Missed::Unanswered`] instead of leaving them waiting,
    /// and the lane takes the next jobs.
    #[test]
    fn a_panicking_turn_leaves_no_job_waiting() {
        let turns = Arc::new(Turns::default());
        let lane = Arc::new(lane(&turns, 8, |jobs: Vec<u64>| {
            if jobs.contains(&13) {
                panic!("a turn with job 13");
            }
            jobs
        }));
        let held = turns.take();
        let waiters: Vec<_> = [1, 13, 2]
            .into_iter()
            .map(|job| {
                let lane = Arc::clone(&lane);
                std::thread::spawn(move || lane.submit(job, Duration::from_secs(60)))
            })
            .collect();
        while lane.queued() < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(held);
        for waiter in waiters {
            assert_eq!(waiter.join().unwrap(), Err(Missed::Unanswered));
        }
        assert_eq!(lane.submit(3, Duration::from_secs(60)), Ok(3));
    }

    /// A task awaits its answer; one whose job no turn took within its wait is told so.
    #[tokio::test]
    #[allow(
        clippy::await_holding_lock,
        reason = "the turn held stands for another stage's"
    )]
    async fn a_task_awaits_its_answer_or_withdraws() {
        let turns = Arc::new(Turns::default());
        let lane = lane(&turns, 4, |jobs: Vec<u64>| {
            jobs.iter().map(|j| j + 1).collect()
        });
        assert_eq!(lane.submit_queued(1, Duration::from_secs(60)).await, Ok(2));
        let held = turns.take();
        let late = lane.submit_queued(5, Duration::from_millis(20)).await;
        drop(held);
        assert_eq!(late, Err(Missed::NotTaken));
        assert_eq!(lane.queued(), 0);
    }

    /// A turn whose run gives fewer answers than jobs tells the rest [`Missed::Unanswered`].
    #[test]
    fn jobs_left_without_an_answer_are_told() {
        let turns = Arc::new(Turns::default());
        let lane = Arc::new(lane(&turns, 8, |_: Vec<u64>| Vec::<u64>::new()));
        assert_eq!(
            lane.submit(1, Duration::from_secs(60)),
            Err(Missed::Unanswered)
        );
    }
}
