//! Pinned host memory that kernels write through its device mapping: results the host reads
//! after the stream's wait with no download to queue (the top-k's candidates, the blocks a
//! skip-entry step decoded).

use cudarc::driver::{sys, DeviceRepr, PinnedHostSlice, ValidAsZeroBits};

use super::error::DriverResultExt;
use super::{GpuDevice, GpuError};

/// `len` values of pinned host memory and their address on the device.
pub struct MappedHost<T> {
    /// The host side: read it once the stream has passed the kernels that write it.
    pub host: PinnedHostSlice<T>,
    /// The device's address of `host`, for kernel arguments.
    pub mapped: u64,
}

impl<T: DeviceRepr + ValidAsZeroBits> MappedHost<T> {
    /// Allocates `len` values (at least one), mapped for the device.
    ///
    /// # Errors
    /// A driver error when the allocation or its mapping fails.
    pub fn alloc(device: &GpuDevice, len: usize) -> Result<MappedHost<T>, GpuError> {
        // SAFETY: kernels write what the host reads before it reads it (after the stream's
        // wait); the host reads only what a launch wrote. Not write-combined: the host reads it.
        let mut host = unsafe {
            device
                .context()
                .alloc_pinned_with_flags::<T>(len.max(1), sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }
        .during("mapped pinned allocation")?;
        let ptr = host.as_mut_ptr().during("mapped pinned allocation")?;
        let mut mapped: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` starts a pinned allocation made with CU_MEMHOSTALLOC_DEVICEMAP in the
        // context bound to this thread (by the allocation above); flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut mapped, ptr.cast(), 0) }
            .result()
            .during("mapped pinned allocation mapping")?;
        Ok(MappedHost { host, mapped })
    }
}
