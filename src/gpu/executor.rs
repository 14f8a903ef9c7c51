//! One executor per device: the device and its turns. Every piece of work that uses a device
//! (a ranking batch, a batch of selections, an upload into a cache, a crossover measurement)
//! runs during a turn of that device's executor, one turn at a time: a device has one stream
//! and one cuBLAS handle, and the stages' caches hold its buffers. A host with several GPUs has
//! several executors; a stage picks one and submits to it.
//!
//! Work that may be batched with other callers' work waits in a [`Combiner`](super::Combiner),
//! which runs each batch during one turn.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};

use super::GpuDevice;

/// A device's turns: whoever holds one may use the device.
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

/// A device and its turns.
pub struct Executor {
    device: Arc<GpuDevice>,
    turns: Turns,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("device", &self.device.name())
            .finish()
    }
}

impl Executor {
    /// The executor of `device`.
    pub fn new(device: Arc<GpuDevice>) -> Arc<Executor> {
        Arc::new(Executor {
            device,
            turns: Turns::default(),
        })
    }

    /// The device.
    pub fn device(&self) -> &Arc<GpuDevice> {
        &self.device
    }

    /// The device's turns, for a [`Combiner`](super::Combiner) that batches work for it.
    pub fn turns(&self) -> &Turns {
        &self.turns
    }

    /// Runs `work` on the device during a turn, waiting for it.
    pub fn run<T>(&self, work: impl FnOnce(&Arc<GpuDevice>) -> T) -> T {
        let _turn = self.turns.take();
        work(&self.device)
    }
}
