//! What OR and AND on the GPU share: the top-k of a device array of scores (`score_block_topk`
//! candidates, merged by the CPU's [`TopK`]).
//!
//! The candidate buffers (device and pinned host) live in [`TopKBuffers`], kept by the posting
//! cache and grown only when a query needs more slots than any before it: a query allocates
//! nothing, launches once, and queues both candidate downloads into pinned memory before its one
//! wait on the stream.

use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PinnedHostSlice, PushKernelArg};

use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, KernelModule};
use crate::index::DocId;
use crate::select::topk::TopK;

/// Entries per `score_block_topk` block (`TOPK_CHUNK` in score.cu).
const TOPK_CHUNK: usize = 2048;
/// Threads per `score_block_topk` block (`TOPK_THREADS` in score.cu).
const TOPK_THREADS: u32 = 256;
/// A candidate slot without a document (`NO_DOC` in score.cu).
const NO_DOC: u32 = u32::MAX;

/// Candidate slots on the device and their pinned host copies, reused across queries.
pub struct TopKBuffers {
    slots: usize,
    best: CudaSlice<f64>,
    docs: CudaSlice<u32>,
    best_host: PinnedHostSlice<f64>,
    docs_host: PinnedHostSlice<u32>,
}

impl TopKBuffers {
    /// Buffers of `slots` candidates (at least one).
    ///
    /// # Errors
    /// A driver error when an allocation fails.
    pub fn alloc(device: &GpuDevice, slots: usize) -> Result<TopKBuffers, GpuError> {
        let slots = slots.max(1);
        let stream = device.stream();
        // SAFETY (both): the kernel writes every slot it reports before the host reads it, and
        // the host reads only the slots a query's launch wrote. Flags 0 (not write-combined):
        // the host reads these buffers.
        let best_host = unsafe { device.context().alloc_pinned_with_flags::<f64>(slots, 0) }
            .during("top-k pinned candidates allocation")?;
        let docs_host = unsafe { device.context().alloc_pinned_with_flags::<u32>(slots, 0) }
            .during("top-k pinned candidates allocation")?;
        Ok(TopKBuffers {
            slots,
            best: unsafe { stream.alloc::<f64>(slots) }.during("top-k candidates allocation")?,
            docs: unsafe { stream.alloc::<u32>(slots) }.during("top-k candidates allocation")?,
            best_host,
            docs_host,
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
    let function = device.function(KernelModule::Score, "score_block_topk")?;
    let mut launch = stream.launch_builder(function);
    launch.arg(scores);
    match ids {
        Some(ids) => launch.arg(ids),
        None => launch.arg(&null),
    };
    launch
        .arg(&n)
        .arg(&keep_u32)
        .arg(&mut buffers.best)
        .arg(&mut buffers.docs);
    let config = LaunchConfig {
        grid_dim: (groups as u32, 1, 1),
        block_dim: (TOPK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `score_block_topk(const double*, const u32*, u32, u32, double*, u32*)` in this
    // order: `scores` (and `ids` when given, else a null pointer) hold n entries, the outputs at
    // least groups × keep slots (keep ≤ 2048, the total checked to fit a u32); one 256-thread
    // block per 2048 entries as the kernel's comment requires.
    unsafe { launch.launch(config) }.during("score_block_topk")?;
    stream
        .memcpy_dtoh(&buffers.best.slice(..slots), &mut buffers.best_host)
        .during("top-k candidates download")?;
    stream
        .memcpy_dtoh(&buffers.docs.slice(..slots), &mut buffers.docs_host)
        .during("top-k candidates download")?;
    // The query's one wait. (cudarc records the pinned buffers' events only when the context
    // has several streams, so their `as_slice` does not wait here: the stream is waited for.)
    device.synchronize()?;
    let docs = &buffers
        .docs_host
        .as_slice()
        .during("top-k candidates download")?[..slots];
    let best = &buffers
        .best_host
        .as_slice()
        .during("top-k candidates download")?[..slots];
    let mut top = TopK::new(k);
    for (&doc, &score) in docs.iter().zip(best) {
        if doc != NO_DOC {
            top.push(doc, score);
        }
    }
    Ok(top.into_sorted())
}
