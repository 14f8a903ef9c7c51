//! The device's turns for selection: one query at a time holds the GPU posting cache, and the
//! queries waiting for it get it by their due time, earliest first (ties by arrival), rather
//! than whichever thread a lock happens to wake. A query is due at its deadline, or
//! `gpu_queue_ms` after its arrival when that comes first, so among queries without a
//! deadline the order is their arrival, and one with a short deadline jumps ahead of those
//! that can wait longer.

use std::collections::BTreeSet;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// The queue of queries waiting for the device; see the module docs.
#[derive(Debug, Default)]
pub struct Turns {
    state: Mutex<Waiting>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Waiting {
    /// Whether a query holds the device.
    busy: bool,
    /// The waiting queries: (due, arrival number).
    queue: BTreeSet<(Instant, u64)>,
    arrivals: u64,
}

/// The device's turn, given back when dropped.
#[derive(Debug)]
pub struct Turn<'a> {
    turns: &'a Turns,
}

impl Turns {
    /// Waits for the device's turn until `give_up` (at once when it has passed: the turn only
    /// if the device is free and nobody waits), behind the queries due before `due`. `None`
    /// when it gave up.
    pub fn wait(&self, due: Instant, give_up: Instant) -> Option<Turn<'_>> {
        let mut waiting = self.state.lock();
        let me = (due, waiting.arrivals);
        waiting.arrivals += 1;
        waiting.queue.insert(me);
        loop {
            if !waiting.busy && waiting.queue.first() == Some(&me) {
                waiting.queue.remove(&me);
                waiting.busy = true;
                return Some(Turn { turns: self });
            }
            if Instant::now() >= give_up {
                waiting.queue.remove(&me);
                // The next in line may be free to go now.
                self.changed.notify_all();
                return None;
            }
            self.changed.wait_until(&mut waiting, give_up);
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.turns.state.lock().busy = false;
        self.turns.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_busy_device_is_not_taken_and_a_free_one_is() {
        let turns = Turns::default();
        let now = Instant::now();
        let held = turns.wait(now, now).expect("free");
        assert!(turns.wait(now, Instant::now()).is_none());
        let started = Instant::now();
        assert!(turns
            .wait(now, started + Duration::from_millis(20))
            .is_none());
        assert!(started.elapsed() >= Duration::from_millis(20));
        drop(held);
        assert!(turns.wait(now, Instant::now()).is_some());
        // Whoever gave up left the queue.
        assert!(turns.state.lock().queue.is_empty());
    }

    #[test]
    fn waiting_queries_get_the_device_earliest_due_first() {
        let turns = Arc::new(Turns::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let base = Instant::now();
        let held = turns.wait(base, base).expect("free");
        // Queued in the order 3, 1, 2 of their due times.
        let waiters: Vec<_> = [3, 1, 2]
            .into_iter()
            .enumerate()
            .map(|(queued, due)| {
                let waiter = {
                    let (turns, order) = (Arc::clone(&turns), Arc::clone(&order));
                    std::thread::spawn(move || {
                        let far = Instant::now() + Duration::from_secs(60);
                        let _turn = turns.wait(base + Duration::from_secs(due), far);
                        order.lock().push(due);
                    })
                };
                while turns.state.lock().queue.len() <= queued {
                    std::thread::yield_now();
                }
                waiter
            })
            .collect();
        // One due before all of them gives up while the device is held, and leaves the queue.
        let soon = Instant::now() + Duration::from_millis(10);
        assert!(turns.wait(base, soon).is_none());
        assert_eq!(turns.state.lock().queue.len(), 3);
        drop(held);
        for waiter in waiters {
            waiter.join().expect("the waiter finishes");
        }
        assert_eq!(*order.lock(), [1, 2, 3]);
    }
}
