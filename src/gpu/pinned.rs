//! Page-locked host memory in a pool shared by every device, for data the host writes and a
//! device then reads by DMA: a request's hit layout is written straight into it (in parallel,
//! outside any device's turn) and copied to whichever device scores it with one asynchronous
//! copy, instead of the driver's pageable copy through its own staging buffer, which is slower
//! and takes one blocking call per array.
//!
//! The blocks are allocated portable (pinned for every context, so any device may copy from
//! them) in power-of-two sizes and kept when released, up to the pool's byte limit; past it a
//! caller gets `None` and keeps its data on the heap ([`HostBuffer::Heap`]).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaStream, DevicePtrMut};
use parking_lot::Mutex;

use super::error::DriverResultExt;
use super::GpuError;

/// The smallest block: smaller layouts share its size class.
const MIN_BLOCK_BYTES: usize = 64 << 10;

/// Element types whose every bit pattern is a value, so a reused block's stale contents may be
/// read as them.
///
/// # Safety
/// Implement only for types where any bit pattern of their size is a valid value.
pub unsafe trait Plain: Copy + Send + Sync + 'static {}

// SAFETY: every bit pattern is a u32, an i32 or an f64.
unsafe impl Plain for u32 {}
// SAFETY: as above.
unsafe impl Plain for i32 {}
// SAFETY: as above.
unsafe impl Plain for f64 {}

/// A pinned allocation.
struct Block {
    ptr: NonNull<u8>,
    bytes: usize,
}

// SAFETY: a block is plain host memory, owned by one holder at a time (the pool's free list or
// one buffer).
unsafe impl Send for Block {}

struct PoolInner {
    /// The context the blocks were allocated in, bound to free them.
    ctx: Arc<CudaContext>,
    limit: usize,
    /// Released blocks, and the bytes of every block allocated (free or in use).
    free: Mutex<(Vec<Block>, usize)>,
}

impl PoolInner {
    fn release(&self, block: Block) {
        self.free.lock().0.push(block);
    }

    /// Frees `block`'s memory (the pool's context bound to this thread first).
    fn free_block(&self, block: Block) {
        let freed = self
            .ctx
            .bind_to_thread()
            .map_err(|err| err.to_string())
            .and_then(|()| {
                // SAFETY: the block came from `malloc_host` and no buffer holds it any more.
                unsafe { result::free_host(block.ptr.as_ptr().cast()) }
                    .map_err(|err| err.to_string())
            });
        if let Err(err) = freed {
            tracing::warn!(error = %err, bytes = block.bytes, "freeing pinned host memory");
        }
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        let blocks = std::mem::take(&mut self.free.get_mut().0);
        for block in blocks {
            self.free_block(block);
        }
    }
}

/// A pool of pinned host blocks (see the module's docs). Cheap to clone: clones share it.
#[derive(Clone)]
pub struct PinnedPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (free, allocated) = &*self.inner.free.lock();
        f.debug_struct("PinnedPool")
            .field("limit", &self.inner.limit)
            .field("allocated", allocated)
            .field("free_blocks", &free.len())
            .finish()
    }
}

impl PinnedPool {
    /// An empty pool that allocates in `ctx` and holds at most `limit` bytes.
    pub fn new(ctx: Arc<CudaContext>, limit: usize) -> PinnedPool {
        PinnedPool {
            inner: Arc::new(PoolInner {
                ctx,
                limit,
                free: Mutex::new((Vec::new(), 0)),
            }),
        }
    }

    /// `len` values of pinned memory holding whatever an earlier user left there, or `None`
    /// when the pool is at its limit (released blocks of other sizes are freed first to make
    /// room) or the allocation failed (logged).
    pub fn take<T: Plain>(&self, len: usize) -> Option<PinnedBuffer<T>> {
        let bytes = (len.max(1) * size_of::<T>())
            .next_power_of_two()
            .max(MIN_BLOCK_BYTES);
        let block = {
            let (free, allocated) = &mut *self.inner.free.lock();
            match free.iter().position(|b| b.bytes == bytes) {
                Some(i) => Some(free.swap_remove(i)),
                None => {
                    while *allocated + bytes > self.inner.limit {
                        let block = free.pop()?;
                        *allocated -= block.bytes;
                        self.inner.free_block(block);
                    }
                    *allocated += bytes;
                    None
                }
            }
        };
        let block = match block {
            Some(block) => block,
            None => match self.allocate(bytes) {
                Ok(block) => block,
                Err(err) => {
                    self.inner.free.lock().1 -= bytes;
                    tracing::warn!(error = %err, bytes, "pinned host allocation; using the heap");
                    return None;
                }
            },
        };
        Some(PinnedBuffer {
            block: Some(block),
            len,
            pool: Arc::clone(&self.inner),
            _values: PhantomData,
        })
    }

    fn allocate(&self, bytes: usize) -> Result<Block, GpuError> {
        const OP: &str = "pinned host allocation";
        self.inner.ctx.bind_to_thread().during(OP)?;
        // SAFETY: a plain allocation of `bytes`, freed by `free_block` with the same context.
        let ptr =
            unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }.during(OP)?;
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| GpuError::Unavailable {
            reason: "cuMemHostAlloc returned a null pointer".into(),
        })?;
        Ok(Block { ptr, bytes })
    }
}

/// `len` values in a block of a [`PinnedPool`], given back to the pool when dropped.
pub struct PinnedBuffer<T> {
    block: Option<Block>,
    len: usize,
    pool: Arc<PoolInner>,
    _values: PhantomData<T>,
}

impl<T> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.pool.release(block);
        }
    }
}

impl<T: Plain> Deref for PinnedBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        let block = self
            .block
            .as_ref()
            .expect("a buffer holds its block until dropped");
        // SAFETY: the block holds at least `len` values of `T` (sized in `take`), is page
        // aligned, and any bit pattern is a `T`.
        unsafe { std::slice::from_raw_parts(block.ptr.as_ptr().cast(), self.len) }
    }
}

impl<T: Plain> DerefMut for PinnedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let block = self
            .block
            .as_ref()
            .expect("a buffer holds its block until dropped");
        // SAFETY: as in `deref`; this buffer is the block's only holder.
        unsafe { std::slice::from_raw_parts_mut(block.ptr.as_ptr().cast(), self.len) }
    }
}

/// Host data bound for a device: pinned when the pool had room, else on the heap.
pub enum HostBuffer<T> {
    Pinned(PinnedBuffer<T>),
    Heap(Vec<T>),
}

impl<T: Plain + Default> HostBuffer<T> {
    /// `len` values: from `pool` when it has room (their contents whatever an earlier user
    /// left: the caller writes every value it or a device reads), else zeros on the heap.
    pub fn new(len: usize, pool: Option<&PinnedPool>) -> HostBuffer<T> {
        match pool.and_then(|pool| pool.take(len)) {
            Some(pinned) => HostBuffer::Pinned(pinned),
            None => HostBuffer::Heap(vec![T::default(); len]),
        }
    }
}

impl<T: Plain + cudarc::driver::DeviceRepr> HostBuffer<T> {
    /// Queues on `stream` the copy of the values to the front of `dst` (at least as long): by
    /// DMA from pinned memory, or the driver's pageable copy from the heap. A pinned buffer must
    /// stay alive and unwritten until the stream has passed the copy.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when `dst` is shorter; a driver error when the copy cannot be
    /// queued.
    pub fn copy_to(
        &self,
        stream: &Arc<CudaStream>,
        dst: &mut CudaSlice<T>,
    ) -> Result<(), GpuError> {
        const OP: &str = "upload";
        if self.is_empty() {
            return Ok(());
        }
        if dst.len() < self.len() {
            return Err(GpuError::TooLarge {
                what: "values uploaded",
                got: self.len(),
                limit: dst.len(),
            });
        }
        match self {
            HostBuffer::Heap(values) => stream
                .memcpy_htod(values, &mut dst.slice_mut(..values.len()))
                .during(OP),
            HostBuffer::Pinned(values) => {
                let (dst, _written) = dst.device_ptr_mut(stream);
                // SAFETY: `dst` holds at least `values.len()` values of `T`; `values` is pinned
                // host memory that the caller keeps alive and unwritten until the copy has run.
                unsafe { result::memcpy_htod_async(dst, values, stream.cu_stream()) }.during(OP)
            }
        }
    }
}

impl<T: Plain> Deref for HostBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            HostBuffer::Pinned(values) => values,
            HostBuffer::Heap(values) => values,
        }
    }
}

impl<T: Plain> DerefMut for HostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            HostBuffer::Pinned(values) => values,
            HostBuffer::Heap(values) => values,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::device::device_for_tests;

    #[test]
    fn blocks_are_reused_by_size_and_the_pool_keeps_to_its_limit_gpu() {
        let Some(device) = device_for_tests("pinned pool") else {
            return;
        };
        let pool = PinnedPool::new(Arc::clone(device.context()), 4 * MIN_BLOCK_BYTES);
        let mut small = pool.take::<u32>(10).expect("room");
        small.fill(7);
        let block = small.as_ptr() as usize;
        drop(small);
        let small = pool.take::<u32>(100).expect("room");
        assert_eq!(
            small.as_ptr() as usize,
            block,
            "the released block is reused"
        );
        assert_eq!(
            (small.len(), small[0]),
            (100, 7),
            "as the last user left it"
        );

        // Just over one block of f64: the two-block size class.
        let two_blocks = MIN_BLOCK_BYTES / 8 + 1;
        let big = pool
            .take::<f64>(two_blocks)
            .expect("room: 1 + 2 of 4 blocks");
        assert_eq!(big.len(), two_blocks);
        assert!(
            pool.take::<f64>(two_blocks).is_none(),
            "1 + 2 + 2 blocks: over the limit"
        );
        drop(big);
        drop(small);
        // The whole limit at once: the released blocks are freed to make room.
        let all = pool
            .take::<u32>(MIN_BLOCK_BYTES)
            .expect("room after freeing");
        assert_eq!(all.len(), MIN_BLOCK_BYTES);
        assert!(pool.take::<u32>(1).is_none());
    }
}
