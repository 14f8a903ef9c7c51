//! The document stage on the GPU (host side): posting lists copied to the device, decoded there
//! block by block ([`decode`]: `kernels/pfor.cu`, `kernels/ef.cu`), and OR queries scored term
//! at a time into dense accumulators with a top-k on the device ([`or`]: `kernels/score.cu`).
//!
//! The CPU ([`crate::select::cpu`]) is the reference: GPU results are the same documents in the
//! same order with bit-identical scores (DESIGN §5), which `tests/selection_gpu.rs` checks.
//! This is the first slice of the GPU document stage: no posting cache yet (every query copies
//! its lists), no AND, no scheduler; the server does not call it yet.

pub mod decode;
pub mod or;

pub use decode::{DecodedList, DeviceList};
pub use or::search_or;

use super::SelectError;
use crate::gpu::GpuError;

/// Why a GPU selection failed: the query itself (the CPU refuses it too), or the device (the
/// caller runs the query on the CPU instead).
#[derive(Debug, thiserror::Error)]
pub enum GpuSelectError {
    /// The query is invalid on any backend.
    #[error(transparent)]
    Query(#[from] SelectError),
    /// A device error: allocation, copy, launch or a limit of the kernels.
    #[error(transparent)]
    Gpu(#[from] GpuError),
}
