//! A ranker's device batch on the GPU: the device buffers of every intermediate and the pinned
//! host staging of a batch ([`BatchBuffers`], pooled by [`super::ranker::GpuRanker`]), and the
//! events that time its phases for benchmarks ([`PhaseEvents`], [`GpuPhases`]).

use cudarc::driver::result::memcpy_htod_async;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtrMut, PinnedHostSlice};
use rayon::prelude::*;

use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError};

/// Feature values above which the copy into the staging buffer is split across threads.
const PARALLEL_STAGE: usize = 1 << 16;

/// One device batch's working memory: device buffers for every intermediate and the pinned
/// host staging buffers, for up to `capacity` documents.
pub(super) struct BatchBuffers {
    pub(super) capacity: usize,
    pub(super) features: CudaSlice<f64>,
    pub(super) inputs: CudaSlice<f32>,
    /// One output matrix per NN layer.
    pub(super) layers: Vec<CudaSlice<f32>>,
    /// The f64 sum of the tree inputs, for rankers with tree inputs and no layers.
    pub(super) tree_sums: Option<CudaSlice<f64>>,
    pub(super) ensemble_sums: Option<CudaSlice<f64>>,
    pub(super) scores: CudaSlice<f64>,
    /// Write-combined: the CPU writes features here, the DMA engine reads them.
    staging_in: PinnedHostSlice<f64>,
    /// Cached pinned memory the scores are copied back to.
    pub(super) staging_out: PinnedHostSlice<f64>,
    pub(super) device_bytes: usize,
}

/// What a ranker's device batch holds besides its documents.
pub(super) struct BatchShape {
    pub(super) n_features: usize,
    pub(super) n_columns: usize,
    /// Each NN layer's outputs per document.
    pub(super) layer_outputs: Vec<usize>,
    /// An f64 sum of the tree inputs (tree inputs and no layers).
    pub(super) tree_sums: bool,
    pub(super) ensemble_sums: bool,
}

impl BatchBuffers {
    pub(super) fn new(
        device: &GpuDevice,
        capacity: usize,
        shape: &BatchShape,
    ) -> Result<BatchBuffers, GpuError> {
        let stream = device.stream();
        let zeros = |n: usize| {
            stream
                .alloc_zeros::<f64>(n)
                .during("batch buffer allocation")
        };
        let zeros32 = |n: usize| {
            stream
                .alloc_zeros::<f32>(n)
                .during("batch buffer allocation")
        };
        let feature_values = capacity * shape.n_features.max(1);
        let columns = shape.n_columns.max(1);
        let layers = (shape.layer_outputs.iter())
            .map(|&outputs| zeros32(capacity * outputs))
            .collect::<Result<Vec<_>, _>>()?;
        let tree_sums = shape.tree_sums.then(|| zeros(capacity)).transpose()?;
        let ensemble_sums = shape.ensemble_sums.then(|| zeros(capacity)).transpose()?;
        let device_bytes = feature_values * 8
            + capacity * columns * 4
            + (shape.layer_outputs.iter())
                .map(|&outputs| capacity * outputs * 4)
                .sum::<usize>()
            + capacity
                * 8
                * (1 + usize::from(tree_sums.is_some()) + usize::from(ensemble_sums.is_some()));
        let ctx = device.context();
        Ok(BatchBuffers {
            capacity,
            features: zeros(feature_values)?,
            inputs: zeros32(capacity * columns)?,
            layers,
            tree_sums,
            ensemble_sums,
            scores: zeros(capacity)?,
            // SAFETY: the staging buffers are written (features) or copied into (scores) before
            // anything reads them; f64 has no invalid bit patterns.
            staging_in: unsafe { ctx.alloc_pinned::<f64>(feature_values) }
                .during("pinned staging allocation")?,
            // SAFETY: as above. Flags 0: cached memory, fast for the CPU to read.
            staging_out: unsafe { ctx.alloc_pinned_with_flags::<f64>(capacity, 0) }
                .during("pinned staging allocation")?,
            device_bytes,
        })
    }

    /// Copies the host rows `pieces`, one after another, into the pinned staging buffer (at
    /// most its capacity); returns the values staged.
    pub(super) fn stage<'a>(
        &mut self,
        pieces: impl Iterator<Item = &'a [f64]>,
    ) -> Result<usize, GpuError> {
        let staging = self.staging_in.as_mut_slice().during("feature staging")?;
        let capacity = staging.len();
        let mut copies = Vec::new();
        let mut free = &mut staging[..];
        for piece in pieces {
            let (dst, rest) = free.split_at_mut(piece.len());
            copies.push((dst, piece));
            free = rest;
        }
        let staged = capacity - free.len();
        // Many small pieces (a batch of small requests) are copied side by side too.
        match staged < PARALLEL_STAGE {
            true => copies.into_iter().for_each(|(dst, src)| stage(dst, src)),
            false => copies
                .into_par_iter()
                .for_each(|(dst, src)| stage(dst, src)),
        }
        Ok(staged)
    }

    /// Queues on `stream` the copy of the first `values` staged feature values into `features`.
    /// The caller keeps the staging buffer unwritten until the copy has run.
    pub(super) fn upload_staged(
        &mut self,
        values: usize,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        let staged = &self.staging_in.as_slice().during("feature staging")?[..values];
        let (dst, _written) = self.features.device_ptr_mut(stream);
        // SAFETY: `dst` holds capacity × n_features f64, at least `values` (the staging buffer
        // holds as many); `staged` is pinned host memory the caller leaves unwritten until the
        // copy has run.
        unsafe { memcpy_htod_async(dst, staged, stream.cu_stream()) }.during("feature upload")
    }

    /// Appends the first `n_docs` scores copied back into the pinned buffer to `out`, once the
    /// copy has run.
    pub(super) fn collect_scores(&self, n_docs: usize, out: &mut Vec<f64>) -> Result<(), GpuError> {
        let scores = self.staging_out.as_slice().during("score staging")?;
        out.extend_from_slice(&scores[..n_docs]);
        Ok(())
    }
}

/// Where a batch's time went, in microseconds, summed over its device batches. The device
/// phases come from CUDA events recorded on the stream between them; staging is host time.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct GpuPhases {
    /// Host: copying the features into the pinned staging buffer.
    pub stage_us: f64,
    /// Device: the features' DMA from pinned host memory (PCIe); for hit documents, the
    /// layout's copy in, feature extraction and the gather into the ranker's rows.
    pub copy_in_us: f64,
    /// Device: model-input transforms (`mit_eval`); the features arrive extracted, so FE is
    /// not part of it.
    pub mit_us: f64,
    /// Device: model evaluation: tree inputs, NN layers (SGEMM + bias/activation), the
    /// ensemble and the final sum.
    pub me_us: f64,
    /// Device: the scores' copy back to pinned host memory.
    pub copy_out_us: f64,
}

/// The events that delimit the phases of one device batch: before the copy in, after it, after
/// the transforms, after model evaluation, after the copy out.
pub(super) struct PhaseEvents([CudaEvent; 5]);

impl PhaseEvents {
    pub(super) fn new(device: &GpuDevice) -> Result<PhaseEvents, GpuError> {
        let event = || {
            device
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .during("event creation")
        };
        Ok(PhaseEvents([
            event()?,
            event()?,
            event()?,
            event()?,
            event()?,
        ]))
    }

    pub(super) fn record(&self, phase: usize, stream: &CudaStream) -> Result<(), GpuError> {
        self.0[phase].record(stream).during("event record")
    }

    /// Adds the elapsed times of the last recorded batch to `phases`.
    pub(super) fn add_to(&self, phases: &mut GpuPhases) -> Result<(), GpuError> {
        let us = |a: usize| -> Result<f64, GpuError> {
            let ms = self.0[a]
                .elapsed_ms(&self.0[a + 1])
                .during("event timing")?;
            Ok(f64::from(ms) * 1e3)
        };
        phases.copy_in_us += us(0)?;
        phases.mit_us += us(1)?;
        phases.me_us += us(2)?;
        phases.copy_out_us += us(3)?;
        Ok(())
    }
}

/// Copies `src` into the staging buffer `dst`, on several threads when it is large.
fn stage(dst: &mut [f64], src: &[f64]) {
    if src.len() < PARALLEL_STAGE {
        dst.copy_from_slice(src);
    } else {
        dst.par_chunks_mut(PARALLEL_STAGE / 4)
            .zip(src.par_chunks(PARALLEL_STAGE / 4))
            .for_each(|(d, s)| d.copy_from_slice(s));
    }
}
