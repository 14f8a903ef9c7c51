//! The device runtime: one CUDA context per process, one [`Executor`] per device (its turns:
//! the stages' work runs on a device one piece at a time, batched where a stage's [`Lane`] queues
//! it), NVRTC-compiled kernel modules, device buffers, and the errors they raise. It knows
//! nothing of rankers or postings: the ranking and selection stages build their GPU paths
//! (`rank::gpu`, `select::gpu`) on top of it.
//!
//! The GPU is optional. [`GpuDevice::probe`] checks that the CUDA libraries are present before
//! any other CUDA call (cudarc panics otherwise), creates the context and compiles every kernel
//! module for the device's own architecture; when anything fails it returns the reason, which the
//! caller logs once before serving on the CPU.
//!
//! - [`lru`]: the byte-budgeted LRU cache. The ranker caches (CPU-side in `rank::store`,
//!   GPU-side in `rank::gpu`) and the posting cache (`select::gpu`) are instances of it.
//! - [`mapped`]: pinned host memory that kernels write through its device mapping.
//! - [`pinned`]: a pool of pinned host memory that the host writes and any device copies in.
//! - [`power`]: board power and energy through NVML, for the benchmark and the metrics.

pub mod device;
pub mod error;
pub mod executor;
pub mod lane;
pub mod lru;
pub mod mapped;
pub mod module;
pub mod pinned;
pub mod power;

pub use device::GpuDevice;
pub use error::GpuError;
pub use executor::{Executor, Fleet, Turns};
pub use lane::{Lane, Missed};
pub use mapped::MappedHost;
pub use module::KernelModule;
