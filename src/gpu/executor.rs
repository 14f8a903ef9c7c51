//! One executor per device: the device and its turns. Every piece of work that uses a device
//! (a ranking batch, a batch of selections, an upload into a cache, a crossover measurement)
//! runs during a turn of that device's executor, one turn at a time: a device has one stream
//! and one cuBLAS handle, and the stages' caches hold its buffers. A host with several GPUs has
//! several executors in a [`Fleet`], which picks one for each piece of work, takes a device
//! that fails out of service and later lets one piece of work try it again.
//!
//! Work that may be batched with other callers' work (a device's GPU selections, its fused
//! ranking requests) waits in a stage's [`Lane`](super::Lane) on the device: a thread of the
//! device's own that runs each batch during one turn.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::{GpuDevice, GpuError};

/// How long a device that failed stays out of service before work tries it again.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Whether a device is in service, and when one taken out after a failure is tried again.
/// Once [`RETRY_AFTER`] has passed, one piece of work is let through as a probe while the device
/// stays out for everything else: under load, a device that still fails costs one failed
/// attempt per retry, not one for each request that arrives in the moment it reopens. The
/// probe's success puts the device back in service, its failure takes it out again.
#[derive(Debug, Default)]
struct Outage {
    until: Mutex<Option<Instant>>,
    /// How many times the device was taken out: work that waited for a turn while this moved
    /// goes elsewhere without trying the device.
    taken_out: AtomicU64,
}

impl Outage {
    /// Whether the device is in service at `now`, or due for a probe.
    fn in_service(&self, now: Instant) -> bool {
        self.until.lock().is_none_or(|until| now >= until)
    }

    /// Whether a piece of work may use the device at `now`: always while it is in service;
    /// once due for a probe, only the first caller, which claims the probe (the device stays out
    /// for [`RETRY_AFTER`] more unless the probe succeeds).
    fn admit(&self, now: Instant) -> bool {
        let mut until = self.until.lock();
        match *until {
            None => true,
            Some(at) if now >= at => {
                *until = Some(now + RETRY_AFTER);
                true
            }
            Some(_) => false,
        }
    }

    /// Takes the device out of service from `now`.
    fn take_out(&self, now: Instant) {
        *self.until.lock() = Some(now + RETRY_AFTER);
        self.taken_out.fetch_add(1, Ordering::Relaxed);
    }

    /// Puts the device back in service after work succeeded on it; whether it was out.
    fn recovered(&self) -> bool {
        self.until.lock().take().is_some()
    }
}

/// A device's turns: whoever holds one may use the device. The lock is parking_lot's, which is
/// eventually fair: a thread that releases it may take it again ahead of the waiters, but one
/// that has waited too long (about half a millisecond) is handed it directly.
#[derive(Debug, Default)]
pub struct Turns(Mutex<()>);

/// A turn on a device, held until dropped.
pub type Turn<'a> = MutexGuard<'a, ()>;

impl Turns {
    /// Waits for the device's turn.
    pub fn take(&self) -> Turn<'_> {
        self.0.lock()
    }

    /// Waits for the device's turn until `until`; `None` when it did not come by then.
    pub fn take_until(&self, until: Instant) -> Option<Turn<'_>> {
        self.0.try_lock_until(until)
    }
}

/// A device, its turns, how much work waits for it, and whether it is in service.
pub struct Executor {
    device: Arc<GpuDevice>,
    turns: Turns,
    /// Pieces of work waiting for a turn or holding it.
    load: AtomicUsize,
    /// Whether the device is out of service after a failure.
    outage: Outage,
    /// The device's ordinal, the `device` label of its metrics.
    label: String,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("device", &self.device.name())
            .field("ordinal", &self.device.ordinal())
            .finish()
    }
}

/// Counts a piece of work in its executor's load until dropped.
pub struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Executor {
    /// The executor of `device`.
    pub fn new(device: Arc<GpuDevice>) -> Arc<Executor> {
        let label = device.ordinal().to_string();
        metrics::gauge!("rankserve_gpu_device_up", "device" => label.clone()).set(1.0);
        Arc::new(Executor {
            device,
            turns: Turns::default(),
            load: AtomicUsize::new(0),
            outage: Outage::default(),
            label,
        })
    }

    /// The device.
    pub fn device(&self) -> &Arc<GpuDevice> {
        &self.device
    }

    /// The device's turns, for a [`Lane`](super::Lane) that batches work for it (call
    /// [`Executor::queued`] first and [`Executor::during_turn`] inside the turn).
    pub fn turns(&self) -> &Turns {
        &self.turns
    }

    /// Counts one more piece of work waiting for the device until the guard drops.
    pub fn queued(&self) -> Queued<'_> {
        self.load.fetch_add(1, Ordering::Relaxed);
        Queued(&self.load)
    }

    /// Pieces of work waiting for the device or using it now.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    /// Runs `work` on the device during a turn, waiting for it.
    pub fn run<T>(&self, work: impl FnOnce(&Arc<GpuDevice>) -> T) -> T {
        let _queued = self.queued();
        let _turn = self.turns.take();
        self.during_turn(work)
    }

    /// Runs `work` in a turn the caller holds: binds the device's context to this thread (raw
    /// driver calls then reach this device) and counts the turn and its time in the device's
    /// metrics. A context that cannot be bound fails the next driver call, which reports it.
    pub fn during_turn<T>(&self, work: impl FnOnce(&Arc<GpuDevice>) -> T) -> T {
        let started = Instant::now();
        if let Err(err) = self.device.bind() {
            tracing::warn!(device = %self.label, error = %err, "binding the device's context");
        }
        let done = work(&self.device);
        let device = self.label.clone();
        metrics::counter!("rankserve_gpu_device_turns_total", "device" => device.clone())
            .increment(1);
        metrics::counter!("rankserve_gpu_device_busy_microseconds_total", "device" => device)
            .increment(started.elapsed().as_micros() as u64);
        done
    }

    /// Whether work may be sent to the device: it has not failed, or failed over
    /// [`RETRY_AFTER`] ago (the next piece of work, admitted by [`Executor::admit`], tries it
    /// again).
    pub fn in_service(&self) -> bool {
        self.outage.in_service(Instant::now())
    }

    /// Whether a piece of work the caller is about to send may use the device: `false` only
    /// when it is out of service, or due to be tried again and another piece of work has
    /// already been let through as that try. Report how the work went with
    /// [`Executor::failed`] or [`Executor::succeeded`].
    pub fn admit(&self) -> bool {
        self.outage.admit(Instant::now())
    }

    /// Records that work succeeded on the device: one that was being tried again after a
    /// failure is back in service.
    pub fn succeeded(&self) {
        if self.outage.recovered() {
            tracing::info!(device = %self.label, "GPU back in service");
            metrics::gauge!("rankserve_gpu_device_up", "device" => self.label.clone()).set(1.0);
        }
    }

    /// Records that work failed on the device with `err`: a failure of the device itself (a
    /// driver or cuBLAS error, an injected fault) takes it out of service for [`RETRY_AFTER`],
    /// logged and counted; an error of the work (too large for the device, a batch another job
    /// failed) does not. Returns whether the device was taken out.
    pub fn failed(&self, err: &GpuError) -> bool {
        if !err.is_device_failure() {
            return false;
        }
        self.outage.take_out(Instant::now());
        tracing::warn!(device = %self.label, error = %err, retry_after_s = RETRY_AFTER.as_secs(), "GPU out of service");
        metrics::counter!("rankserve_gpu_device_failures_total", "device" => self.label.clone())
            .increment(1);
        true
    }

    /// Brings the device's gauges up to date (`rankserve_gpu_device_up`,
    /// `rankserve_gpu_device_load`).
    pub fn record_gauges(&self) {
        let device = self.label.clone();
        metrics::gauge!("rankserve_gpu_device_up", "device" => device.clone())
            .set(f64::from(u8::from(self.in_service())));
        metrics::gauge!("rankserve_gpu_device_load", "device" => device).set(self.load() as f64);
    }
}

/// Every device's executor, each with a stage's state on that device (`S`: its caches and
/// buffers), and the choice of a device for each piece of work.
pub struct Fleet<S> {
    devices: Vec<(Arc<Executor>, S)>,
}

impl<S> Fleet<S> {
    /// A fleet of `devices`, each executor with the stage's state on it.
    pub fn new(devices: Vec<(Arc<Executor>, S)>) -> Fleet<S> {
        Fleet { devices }
    }

    /// The devices and their states, in ordinal order.
    pub fn iter(&self) -> impl Iterator<Item = &(Arc<Executor>, S)> {
        self.devices.iter()
    }

    /// The first device in service, for work any device may do once (a measurement).
    pub fn first(&self) -> Option<&(Arc<Executor>, S)> {
        self.devices
            .iter()
            .find(|(executor, _)| executor.in_service())
    }

    /// The device for the next piece of work, among those in service and not in `tried`
    /// ([`choose`]; `holds` says whether a device already has what the work needs). A device due
    /// to be tried again after a failure is chosen only by the one caller it admits
    /// ([`Executor::admit`]); report how the work went on it ([`Executor::failed`],
    /// [`Executor::succeeded`]).
    pub fn pick(&self, tried: &[usize], holds: impl Fn(&S) -> bool) -> Option<&(Arc<Executor>, S)> {
        let mut open: Vec<&(Arc<Executor>, S)> = (self.devices.iter())
            .filter(|(executor, _)| {
                !tried.contains(&executor.device().ordinal()) && executor.in_service()
            })
            .collect();
        loop {
            let candidates: Vec<(usize, bool)> = open
                .iter()
                .map(|(executor, state)| (executor.load(), holds(state)))
                .collect();
            let chosen = choose(&candidates)?;
            if open[chosen].0.admit() {
                return Some(open[chosen]);
            }
            open.remove(chosen);
        }
    }

    /// Runs `work` during a turn of the device [`Fleet::pick`] chooses. When the device fails
    /// (see [`Executor::failed`]) it is taken out and the work runs on the next device, as does
    /// work that was waiting for the device's turn when it was taken out; the error comes back
    /// when the work itself failed, or when no device in service was left.
    ///
    /// # Errors
    /// The work's error, or the last device's failure; [`GpuError::Unavailable`] when every
    /// device is out of service.
    pub fn run<T>(
        &self,
        holds: impl Fn(&S) -> bool,
        mut work: impl FnMut(&Arc<GpuDevice>, &S) -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        let mut tried = Vec::new();
        let mut last = None;
        while let Some((executor, state)) = self.pick(&tried, &holds) {
            let outages = executor.outage.taken_out.load(Ordering::Relaxed);
            // Work that queued for the turn while another piece failed on the device moves on
            // without trying it (under load, many pieces wait for a turn).
            let still_in_service = || executor.outage.taken_out.load(Ordering::Relaxed) == outages;
            let ran = executor.run(|device| still_in_service().then(|| work(device, state)));
            let Some(ran) = ran else {
                tried.push(executor.device().ordinal());
                continue;
            };
            match ran {
                Ok(done) => {
                    executor.succeeded();
                    return Ok(done);
                }
                Err(err) if executor.failed(&err) => {
                    tried.push(executor.device().ordinal());
                    last = Some(err);
                }
                Err(err) => return Err(err),
            }
        }
        Err(last.unwrap_or_else(|| GpuError::Unavailable {
            reason: "every GPU is out of service after a failure".into(),
        }))
    }
}

/// Which of `candidates` (each a device's load and whether it holds what the work needs) takes
/// the work: the least loaded holder, unless a device that does not hold it is less loaded —
/// then that one, which loads it. Work that comes one piece at a time stays on the device that
/// has its data (a cold ranker lives on one device); work that piles up on a holder spreads to
/// idler devices, so that hot data ends up on every device. Ties go to the lower ordinal.
pub fn choose(candidates: &[(usize, bool)]) -> Option<usize> {
    let least = |want_holder: bool| {
        (candidates.iter().enumerate())
            .filter(|(_, &(_, holds))| holds || !want_holder)
            .min_by_key(|(_, &(load, _))| load)
            .map(|(i, _)| i)
    };
    match (least(true), least(false)) {
        (Some(holder), Some(any)) if candidates[any].0 < candidates[holder].0 => Some(any),
        (Some(holder), _) => Some(holder),
        (None, any) => any,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_device_is_tried_again_by_one_piece_of_work_at_a_time() {
        let outage = Outage::default();
        let start = Instant::now();
        assert!(outage.in_service(start) && outage.admit(start) && outage.admit(start));
        assert!(!outage.recovered(), "a device in service was not out");

        outage.take_out(start);
        assert_eq!(outage.taken_out.load(Ordering::Relaxed), 1);
        assert!(!outage.in_service(start) && !outage.admit(start));
        let due = start + RETRY_AFTER;
        assert!(outage.in_service(due), "due to be tried again");
        assert!(outage.admit(due), "the first caller is the probe");
        assert!(!outage.admit(due), "the rest wait for the probe");
        assert!(!outage.in_service(due));

        // The probe fails: out again, until a retry period after that failure.
        let failed = due + Duration::from_millis(1);
        outage.take_out(failed);
        assert!(!outage.admit(failed + RETRY_AFTER - Duration::from_millis(1)));
        assert!(outage.admit(failed + RETRY_AFTER));
        // This probe succeeds: back in service for everyone.
        assert!(outage.recovered());
        assert!(outage.admit(failed + RETRY_AFTER) && outage.admit(failed + RETRY_AFTER));

        // A probe that never reports (its caller gave up) is retried a period later.
        outage.take_out(start);
        assert!(outage.admit(due));
        assert!(!outage.admit(due + RETRY_AFTER - Duration::from_millis(1)));
        assert!(outage.admit(due + RETRY_AFTER));
    }

    #[test]
    fn work_stays_with_its_data_until_the_holder_is_busier_than_another_device() {
        assert_eq!(choose(&[]), None);
        // One at a time: the holder, even when it is not the first device.
        assert_eq!(choose(&[(0, false), (0, true)]), Some(1));
        // Equal load: the holder.
        assert_eq!(choose(&[(2, false), (2, true)]), Some(1));
        // The holder busier than an idle device: the idle one takes it (and loads the data).
        assert_eq!(choose(&[(0, false), (1, true)]), Some(0));
        // Among holders, the least loaded; ties to the lower ordinal.
        assert_eq!(choose(&[(3, true), (1, true), (1, true)]), Some(1));
        // Nobody holds it: the least loaded.
        assert_eq!(choose(&[(4, false), (2, false)]), Some(1));
    }
}
