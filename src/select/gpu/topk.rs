//! What OR and AND on the GPU share: the top-k of a device array of scores (`score_block_topk`
//! candidates, merged by the CPU's [`TopK`]).
//!
//! The candidate buffers (device and pinned host) live in [`TopKBuffers`], kept by the posting
//! cache and grown only when a batch needs more room than any before it: a query allocates
//! nothing and launches once (a pass more over many entries, below); the batch it belongs to
//! waits on the stream once for all its queries. The kernel writes its candidates (scores, then
//! docIDs, in the query's own run of one buffer) straight into pinned host memory through the
//! buffer's device mapping: no download to queue and wait for.
//!
//! For k ≤ 32 (`score_block_topk_warp`) each block picks its best k by shuffle arg-max rounds
//! instead of sorting its 2 048 entries: on the H100 the sort was 52 µs of a 116 µs AND query
//! (CUDA events, 200 000 documents, k = 10). The download of the candidates that followed took
//! about 20 µs, one copy or two, where the kernel's own writes over PCIe take a few.
//!
//! Over many entries the same kernel runs again on the candidates (device scratch buffers) until
//! at most one block's worth is left, and only that last pass writes to the host: an OR query
//! over 10 M documents has 4 883 blocks, whose 48 830 candidates the host once merged, one push
//! each, for most of the query's host time: 169 µs then, 18 µs since (H100, k = 10, median).

use cudarc::driver::{CudaSlice, CudaView, DevicePtr, LaunchConfig, PushKernelArg};

use super::phases::{self, Mark, QueryEvents};
use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, KernelModule, MappedHost};
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
/// across queries: each query of a batch has its own run of words (from `PendingTopK::at`), its
/// `n` scores then its `n` docIDs packed two to a word.
pub struct TopKBuffers {
    candidates: MappedHost<f64>,
    /// Device candidates between passes, alternately written and read (empty until a query
    /// needs more than one pass).
    scratch: [Candidates; 2],
}

/// Candidate scores and docIDs in device memory.
struct Candidates {
    scores: CudaSlice<f64>,
    docs: CudaSlice<u32>,
}

impl Candidates {
    fn alloc(device: &GpuDevice, slots: usize) -> Result<Candidates, GpuError> {
        let stream = device.stream();
        // SAFETY: a pass writes every slot the next one reads (its grid covers them all).
        let scores = unsafe { stream.alloc::<f64>(slots.max(1)) }.during("top-k scratch")?;
        let docs = unsafe { stream.alloc::<u32>(slots.max(1)) }.during("top-k scratch")?;
        Ok(Candidates { scores, docs })
    }

    fn slots(&self) -> usize {
        self.scores.len()
    }
}

/// Words of `slots` candidates: a score each, then the docIDs two to a word.
fn words(slots: usize) -> usize {
    slots + slots.div_ceil(2)
}

impl TopKBuffers {
    /// Buffers of `words` host words (at least one) and empty scratch.
    ///
    /// # Errors
    /// A driver error when an allocation fails.
    pub fn alloc(device: &GpuDevice, words: usize) -> Result<TopKBuffers, GpuError> {
        Ok(TopKBuffers {
            candidates: MappedHost::alloc(device, words.max(1))?,
            scratch: [Candidates::alloc(device, 1)?, Candidates::alloc(device, 1)?],
        })
    }

    /// Makes room for `words` host words (to a power of two). Only between batches: the host
    /// words are freed at once, while a queued kernel may still write them.
    ///
    /// # Errors
    /// A driver error when the allocation fails.
    pub fn reserve(&mut self, device: &GpuDevice, words: usize) -> Result<(), GpuError> {
        if self.candidates.host.len() < words {
            self.candidates = MappedHost::alloc(device, words.next_power_of_two())?;
        }
        Ok(())
    }

    /// The best `pending.k` of a top-k queued by [`launch_top_k`], best first, ties by smaller
    /// docID. Call it once the stream has passed the launch (the batch's one wait).
    ///
    /// # Errors
    /// A driver error when the host buffer cannot be read.
    pub fn collect(&self, pending: &PendingTopK) -> Result<Vec<(DocId, f64)>, GpuError> {
        if pending.slots == 0 {
            return Ok(Vec::new());
        }
        let host = self
            .candidates
            .host
            .as_slice()
            .during("top-k candidates read")?;
        let (best, doc_words) =
            host[pending.at..pending.at + words(pending.slots)].split_at(pending.slots);
        // The device wrote the docIDs as u32 pairs in each word: low half first (little-endian).
        let docs = doc_words
            .iter()
            .flat_map(|w| [w.to_bits() as u32, (w.to_bits() >> 32) as u32]);
        let mut top = TopK::new(pending.k);
        for (doc, &score) in docs.zip(best) {
            if doc != NO_DOC {
                top.push(doc, score);
            }
        }
        Ok(top.into_sorted())
    }
}

/// A top-k queued on the stream: its candidates' host words from word `at` on.
#[derive(Debug, Clone, Copy)]
pub struct PendingTopK {
    at: usize,
    slots: usize,
    k: usize,
}

/// The passes of a top-k of `k` over `n` entries: each pass's entries in, candidate groups out
/// (its slots are groups × the kept candidates per group); the last writes to the host.
fn passes(n: u32, k: usize) -> (usize, Vec<(usize, usize)>) {
    let keep = k.min(TOPK_CHUNK);
    let mut n = n as usize;
    let mut passes = Vec::new();
    loop {
        let groups = n.div_ceil(TOPK_CHUNK);
        passes.push((n, groups));
        let slots = groups * keep;
        // While more than a block's worth is left (and a pass still shrinks them), again.
        if slots <= TOPK_CHUNK || 2 * keep > TOPK_CHUNK {
            return (keep, passes);
        }
        n = slots;
    }
}

/// Host words a top-k of `k` over `n` entries writes ([`launch_top_k`]'s run).
pub(super) fn host_words(n: u32, k: usize) -> usize {
    if n == 0 || k == 0 {
        return 0;
    }
    let (keep, passes) = passes(n, k);
    passes.last().map_or(0, |&(_, groups)| words(groups * keep))
}

/// Queues the top-k of `n` scores on the device (-0.0 marks an entry no document reached):
/// entry `e` is document `e`, or `ids[e]` when `ids` is given. Its candidates land in the host
/// words from `at` on (`host_words(n, k)` of them, which [`TopKBuffers::reserve`] made room
/// for); [`TopKBuffers::collect`] reads them once the stream has passed them.
///
/// # Errors
/// [`GpuError::TooLarge`] when the candidate slots overflow a u32 or the host words from `at`
/// on are too few; a driver error when an allocation or the launch fails.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_top_k(
    device: &GpuDevice,
    buffers: &mut TopKBuffers,
    events: Option<&QueryEvents>,
    scores: &CudaSlice<f64>,
    ids: Option<&CudaView<'_, u32>>,
    n: u32,
    k: usize,
    at: usize,
) -> Result<PendingTopK, GpuError> {
    let none = PendingTopK { at, slots: 0, k };
    if n == 0 || k == 0 {
        return Ok(none);
    }
    let (keep, passes) = passes(n, k);
    let kernel = match keep <= TOPK_WARP_KEEP {
        true => "score_block_topk_warp",
        false => "score_block_topk",
    };
    let function = device.function(KernelModule::Score, kernel)?;
    let stream = device.stream();
    let mut src_scores = scores.device_ptr(stream).0;
    // A null `ids`: entry e is document e.
    let mut src_ids = ids.map_or(0, |ids| ids.device_ptr(stream).0);
    let mut slots = 0;
    // Pass p reads (scores, ids) of `n` entries and writes groups × keep candidates: to device
    // scratch until the last pass, which writes to the host.
    for (pass, &(n, groups)) in passes.iter().enumerate() {
        slots = groups * keep;
        if u32::try_from(slots).is_err() {
            return Err(GpuError::TooLarge {
                what: "top-k candidate slots",
                got: slots,
                limit: u32::MAX as usize,
            });
        }
        let last = pass + 1 == passes.len();
        let (out_scores, out_docs) = if last {
            let room = buffers.candidates.host.len();
            if at + words(slots) > room {
                return Err(GpuError::TooLarge {
                    what: "top-k candidate words of a batch (reserved fewer)",
                    got: at + words(slots),
                    limit: room,
                });
            }
            let mapped = buffers.candidates.mapped + 8 * at as u64;
            (mapped, mapped + 8 * slots as u64)
        } else {
            // Reallocating mid-batch is safe: a device buffer is freed in stream order.
            let out = &mut buffers.scratch[pass % 2];
            if out.slots() < slots {
                *out = Candidates::alloc(device, slots.next_power_of_two())?;
            }
            (
                out.scores.device_ptr(stream).0,
                out.docs.device_ptr(stream).0,
            )
        };
        let (n_u32, keep_u32) = (n as u32, keep as u32);
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&src_scores)
            .arg(&src_ids)
            .arg(&n_u32)
            .arg(&keep_u32)
            .arg(&out_scores)
            .arg(&out_docs);
        let config = LaunchConfig {
            grid_dim: (groups as u32, 1, 1),
            block_dim: (TOPK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `score_block_topk` and `score_block_topk_warp` are both `(const double*,
        // const u32*, u32, u32, double*, u32*)` in this order: the sources (the caller's
        // `scores` and `ids`, or a null `ids`; or the previous pass's scratch) hold n entries
        // (n fits a u32: the caller's n, or a previous pass's checked slots); the outputs (a
        // scratch pair of ≥ slots entries, or device addresses of the mapped host buffer: slots
        // f64 then slots u32 within words(slots) words from `at`, checked above) take groups ×
        // keep slots (keep ≤ 2048, ≤ 32 for the warp kernel); one 256-thread block per 2048
        // entries as their comments require. Every pass is on the one stream, in order.
        unsafe { launch.launch(config) }.during(kernel)?;
        (src_scores, src_ids) = (out_scores, out_docs);
    }
    phases::mark(events, Mark::Selected, stream)?;
    Ok(PendingTopK { at, slots, k })
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::gpu::device::device_for_tests;

    /// Three million entries: two passes on the device for the warp kernel (k ≤ 32), three for
    /// the sort with k = 100, one for k = 1000 and k ≥ 1024 (a pass would not shrink them); many
    /// tied scores (broken by the smaller docID) and a third untouched.
    #[test]
    fn many_blocks_reduce_on_the_device_like_the_cpu_gpu() {
        let Some(device) = device_for_tests("many_blocks_reduce_on_the_device_like_the_cpu_gpu")
        else {
            return;
        };
        let n = 3_000_000usize;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let scores: Vec<f64> = (0..n)
            .map(|_| match rng.random_range(0..3) {
                0 => -0.0,
                _ => rng.random_range(0..5000) as f64 / 7.0,
            })
            .collect();
        let ids: Vec<u32> = (0..n as u32).map(|e| 2 * e + 1).collect();
        let stream = device.stream();
        let scores_dev = stream.clone_htod(&scores).unwrap();
        let ids_dev = stream.clone_htod(&ids).unwrap();
        let mut buffers = TopKBuffers::alloc(&device, 1).unwrap();
        // Every (k, ids) case in one batch: each has its own run of the host words, reserved
        // before the first launch.
        let ks = [1, 10, 32, 33, 100, 1000, 1024, 5000];
        let total: usize = ks.iter().map(|&k| 2 * host_words(n as u32, k)).sum();
        buffers.reserve(&device, total).unwrap();
        let mut cases = Vec::new();
        let mut at = 0;
        for k in ks {
            for with_ids in [false, true] {
                let mut want = TopK::new(k);
                for (e, &s) in scores.iter().enumerate() {
                    if s.to_bits() != (-0.0f64).to_bits() {
                        want.push(if with_ids { ids[e] } else { e as u32 }, s);
                    }
                }
                let view = ids_dev.as_view();
                let pending = launch_top_k(
                    &device,
                    &mut buffers,
                    None,
                    &scores_dev,
                    with_ids.then_some(&view),
                    n as u32,
                    k,
                    at,
                )
                .unwrap();
                at += host_words(n as u32, k);
                cases.push((k, with_ids, pending, want.into_sorted()));
            }
        }
        device.synchronize().unwrap();
        for (k, with_ids, pending, want) in cases {
            assert_eq!(
                buffers.collect(&pending).unwrap(),
                want,
                "k {k}, ids {with_ids}"
            );
        }
    }
}
