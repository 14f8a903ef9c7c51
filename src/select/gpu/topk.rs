//! What OR and AND on the GPU share: the top-k of a device array of scores (`score_block_topk`
//! candidates, merged by the CPU's [`TopK`]).
//!
//! The candidate buffers (device and pinned host) live in [`TopKBuffers`], kept by the posting
//! cache and grown only when a query needs more slots than any before it: a query allocates
//! nothing, launches once, and waits on the stream once. The kernel writes its candidates
//! (scores, then docIDs, in one buffer) straight into pinned host memory through the buffer's
//! device mapping: no download to queue and wait for.
//!
//! For k ≤ 32 (`score_block_topk_warp`) each block picks its best k by shuffle arg-max rounds
//! instead of sorting its 2 048 entries: on the H100 the sort was 52 µs of a 116 µs AND query
//! (CUDA events, 200 000 documents, k = 10). The download of the candidates that followed took
//! about 20 µs, one copy or two, where the kernel's own writes over PCIe take a few.

use cudarc::driver::{sys, CudaSlice, CudaView, LaunchConfig, PinnedHostSlice, PushKernelArg};

use super::phases::{self, Mark, QueryEvents};
use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, KernelModule};
use crate::index::DocId;
use crate::select::topk::TopK;

/// Entries per `score_block_topk` block (`TOPK_CHUNK` in score.cu).
const TOPK_CHUNK: usize = 2048;
/// Threads per `score_block_topk` block (`TOPK_THREADS` in score.cu).
const TOPK_THREADS: u32 = 256;
/// Most candidates per block that `score_block_topk_warp` keeps (one warp's lanes).
const TOPK_WARP_KEEP: usize = 32;
/// A candidate slot without a document (`NO_DOC` in score.cu).
const NO_DOC: u32 = u32::MAX;

/// Candidate slots in pinned host memory that the device writes through its mapping, reused
/// across queries: a query of `n` slots uses the first `words(n)` words, its `n` scores then its
/// `n` docIDs packed two to a word.
pub struct TopKBuffers {
    slots: usize,
    host: PinnedHostSlice<f64>,
    /// The device's address of `host`.
    mapped: u64,
}

/// Words of `slots` candidates: a score each, then the docIDs two to a word.
fn words(slots: usize) -> usize {
    slots + slots.div_ceil(2)
}

impl TopKBuffers {
    /// Buffers of `slots` candidates (at least one).
    ///
    /// # Errors
    /// A driver error when an allocation fails.
    pub fn alloc(device: &GpuDevice, slots: usize) -> Result<TopKBuffers, GpuError> {
        let slots = slots.max(1);
        // SAFETY: the kernel writes every slot it reports before the host reads it (after the
        // stream's wait), and the host reads only the slots a query's launch wrote. Mapped for
        // the device; not write-combined: the host reads this buffer.
        let mut host = unsafe {
            device
                .context()
                .alloc_pinned_with_flags::<f64>(words(slots), sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }
        .during("top-k pinned candidates allocation")?;
        let ptr = host
            .as_mut_ptr()
            .during("top-k pinned candidates allocation")?;
        let mut mapped: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` starts a pinned allocation made with CU_MEMHOSTALLOC_DEVICEMAP in the
        // context bound to this thread (by the allocation above); flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut mapped, ptr.cast(), 0) }
            .result()
            .during("top-k pinned candidates mapping")?;
        Ok(TopKBuffers {
            slots,
            host,
            mapped,
        })
    }
}

/// The best `k` of `n` scores on the device (-0.0 marks an entry no document reached), best
/// first, ties by smaller docID. Entry `e` is document `e`, or `ids[e]` when `ids` is given
/// (increasing with `e`). `buffers` grows (to a power of two) when it holds too few slots.
///
/// # Errors
/// [`GpuError::TooLarge`] when the candidate slots overflow a u32; a driver error when an
/// allocation, the launch or a copy fails.
pub(super) fn top_k(
    device: &GpuDevice,
    buffers: &mut TopKBuffers,
    events: Option<&QueryEvents>,
    scores: &CudaSlice<f64>,
    ids: Option<&CudaView<'_, u32>>,
    n: u32,
    k: usize,
) -> Result<Vec<(DocId, f64)>, GpuError> {
    if n == 0 || k == 0 {
        return Ok(Vec::new());
    }
    let keep = k.min(TOPK_CHUNK);
    let groups = (n as usize).div_ceil(TOPK_CHUNK);
    let slots = groups * keep;
    if u32::try_from(slots).is_err() {
        return Err(GpuError::TooLarge {
            what: "top-k candidate slots",
            got: slots,
            limit: u32::MAX as usize,
        });
    }
    if buffers.slots < slots {
        *buffers = TopKBuffers::alloc(device, slots.next_power_of_two())?;
    }
    let stream = device.stream();
    let keep_u32 = keep as u32;
    let null: u64 = 0;
    let kernel = match keep <= TOPK_WARP_KEEP {
        true => "score_block_topk_warp",
        false => "score_block_topk",
    };
    let function = device.function(KernelModule::Score, kernel)?;
    let best = buffers.mapped;
    let docs = buffers.mapped + 8 * slots as u64;
    let mut launch = stream.launch_builder(function);
    launch.arg(scores);
    match ids {
        Some(ids) => launch.arg(ids),
        None => launch.arg(&null),
    };
    launch.arg(&n).arg(&keep_u32).arg(&best).arg(&docs);
    let config = LaunchConfig {
        grid_dim: (groups as u32, 1, 1),
        block_dim: (TOPK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `score_block_topk` and `score_block_topk_warp` are both `(const double*, const
    // u32*, u32, u32, double*, u32*)` in this order: `scores` (and `ids` when given, else a null
    // pointer) hold n entries, the outputs (device addresses of the mapped host buffer: slots
    // f64 from `best`, slots u32 from `docs`, within its words(slots) ≤ words(buffers.slots))
    // groups × keep slots each (keep ≤ 2048, ≤ 32 for the warp kernel, the total checked to fit
    // a u32); one 256-thread block per 2048 entries as their comments require.
    unsafe { launch.launch(config) }.during(kernel)?;
    phases::mark(events, Mark::Selected, stream)?;
    // The query's one wait: once the stream is idle the kernel's writes are visible here.
    device.synchronize()?;
    let host = buffers.host.as_slice().during("top-k candidates read")?;
    let (best, doc_words) = host[..words(slots)].split_at(slots);
    // The device wrote the docIDs as u32 pairs in each word: low half first (little-endian).
    let docs = doc_words
        .iter()
        .flat_map(|w| [w.to_bits() as u32, (w.to_bits() >> 32) as u32]);
    let mut top = TopK::new(k);
    for (doc, &score) in docs.zip(best) {
        if doc != NO_DOC {
            top.push(doc, score);
        }
    }
    Ok(top.into_sorted())
}
