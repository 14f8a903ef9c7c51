//! The document stage on the GPU (host side): posting lists copied to the device, decoded there
//! block by block ([`decode`]: `kernels/pfor.cu`, `kernels/ef.cu`).
//!
//! The CPU ([`crate::select::cpu`]) is the reference: GPU results are the same documents in the
//! same order with bit-identical scores (DESIGN §5), which `tests/selection_gpu.rs` checks.
//! This is the first slice of the GPU document stage: decoding only so far.

pub mod decode;

pub use decode::{DecodedList, DeviceList};
