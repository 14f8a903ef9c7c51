//! What OR and AND on the GPU share: the top-k of a device array of scores (`score_block_topk` candidates, merged by the CPU's [`TopK`]).

use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};

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

/// The best `k` of `n` scores on the device (-0.0 marks an entry no document reached), best
/// first, ties by smaller docID. Entry `e` is document `e`, or `ids[e]` when `ids` is given
/// (increasing with `e`).
///
/// # Errors
/// [`GpuError::TooLarge`] when the candidate slots overflow a u32; a driver error when an
/// allocation, the launch or the copy fails.
pub(super) fn top_k(
    device: &GpuDevice,
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
    let stream = device.stream();
    let mut best = stream
        .alloc_zeros::<f64>(slots)
        .during("top-k candidates allocation")?;
    let mut docs = stream
        .alloc_zeros::<u32>(slots)
        .during("top-k candidates allocation")?;
    let keep_u32 = keep as u32;
    let null: u64 = 0;
    let function = device.function(KernelModule::Score, "score_block_topk")?;
    let mut launch = stream.launch_builder(function);
    launch.arg(scores);
    match ids {
        Some(ids) => launch.arg(ids),
        None => launch.arg(&null),
    };
    launch.arg(&n).arg(&keep_u32).arg(&mut best).arg(&mut docs);
    let config = LaunchConfig {
        grid_dim: (groups as u32, 1, 1),
        block_dim: (TOPK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `score_block_topk(const double*, const u32*, u32, u32, double*, u32*)` in this
    // order: `scores` (and `ids` when given, else a null pointer) hold n entries, the outputs
    // groups × keep slots (keep ≤ 2048, the total checked to fit a u32); one 256-thread block per
    // 2048 entries as the kernel's comment requires.
    unsafe { launch.launch(config) }.during("score_block_topk")?;
    let best = stream
        .clone_dtoh(&best)
        .during("top-k candidates download")?;
    let docs = stream
        .clone_dtoh(&docs)
        .during("top-k candidates download")?;
    let mut top = TopK::new(k);
    for (&doc, &score) in docs.iter().zip(&best) {
        if doc != NO_DOC {
            top.push(doc, score);
        }
    }
    Ok(top.into_sorted())
}
