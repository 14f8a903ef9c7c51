//! A whole ranker on the GPU: its device copy (transform table, FreeForm programs, tree node
//! arrays, NN weights) and the launches that score a batch of feature vectors.
//!
//! One batch of D documents runs as: copy the features in (D × F f64); `mit_eval` fills the
//! model-input matrix (D × N' f32, N' = inputs plus dummy padding); `trees_eval` writes the tree
//! inputs' leaves into its last columns; each NN layer is one SGEMM (D × N' · N' × H) followed by
//! `nn_bias_activation`; `trees_eval` sums the ensemble (f64); `nn_scores` adds it to the NN's
//! output (or to the sum of the inputs when there are no layers); the scores are copied out.
//!
//! Hit documents ([`GpuRanker::score_hits`]) take the same path with the first step replaced by
//! feature extraction on the device: their layout is copied in, `fe_extract` writes the catalogue
//! and `fe_gather` the ranker's features straight into the features buffer, so one device turn
//! goes from hits to scores and only the scores (and, when asked, the rows) come back.

use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
use parking_lot::Mutex;

mod launch;

pub use super::batch::GpuPhases;
use super::batch::{BatchBuffers, BatchShape, PhaseEvents};
use super::fe::GpuFe;
use super::layout::FeLayout;
use super::rows::{ChunkRows, HostRows};
use super::trees::{GpuTrees, TreeLayout};
use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError};
use crate::rank::model::{Activation, Ranker};
use crate::rank::plan::{GpuTransform, InputPlan, PlanOptions};

// SAFETY: `GpuTransform` is `repr(C)` plain old data matching `struct Transform` in mit.cu (its
// size is asserted in rank::plan; the parity tests check the values).
unsafe impl DeviceRepr for GpuTransform {}

/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;
/// Documents per device batch unless [`GpuRanker::with_max_batch`] says otherwise.
pub const DEFAULT_MAX_BATCH: usize = 65_536;
/// The fewest documents a pooled buffer set is allocated for.
const MIN_CAPACITY: usize = 1024;
/// Buffer sets kept for reuse; concurrent callers beyond it allocate their own and drop them.
const POOL_SIZE: usize = 4;
/// A batch of host rows of at least two parts of this many documents is scored in parts whose
/// copy in overlaps the scoring of the part before ([`GpuRanker::score_rows_overlapped`]).
/// Below it a part's launches would weigh more than the copy they hide: 2 048 rows of 136
/// features are a 2.2 MB copy, about 80 µs at the 27 GB/s measured into an H100.
const MIN_OVERLAP_PART: usize = 2048;
/// Parts a batch of host rows is split into for the overlap (fewer when they would fall under
/// [`MIN_OVERLAP_PART`]): the first part's copy in and the last part's scoring are not
/// overlapped, so more parts hide more of the copy, each at the cost of its launches.
const OVERLAP_PARTS: usize = 4;

struct GpuLayer {
    weights: CudaSlice<f32>,
    bias: CudaSlice<f32>,
    inputs: usize,
    outputs: usize,
    activation: u32,
}

/// A ranker resident on the device.
pub struct GpuRanker {
    n_features: usize,
    n_inputs: usize,
    n_columns: usize,
    column_of_input: Vec<usize>,
    transforms: CudaSlice<GpuTransform>,
    program: CudaSlice<u32>,
    /// Whether any column is computed by `mit_eval` (not only trees).
    has_transforms: bool,
    tree_inputs: Option<GpuTrees>,
    tree_col0: usize,
    layers: Vec<GpuLayer>,
    ensemble: Option<(GpuTrees, f64)>,
    bytes: usize,
    max_batch: usize,
    pool: Mutex<Vec<BatchBuffers>>,
}

// The server shares one GpuRanker between request threads: `score(&self, ..)` must stay callable
// from several threads at once.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<GpuRanker>();
};

/// The result of scoring a batch on the GPU.
#[derive(Debug, Clone, Default)]
pub struct GpuScores {
    /// One score per document.
    pub scores: Vec<f64>,
    /// With `explain`: each document's model inputs in the ranker's input order (row-major).
    pub inputs: Option<Vec<f32>>,
    /// When asked of [`GpuRanker::score_hits`]: the feature rows extracted on the device
    /// (row-major, the ranker's width).
    pub rows: Option<Vec<f64>>,
}

fn activation_code(activation: Activation) -> u32 {
    match activation {
        Activation::Identity => 0,
        Activation::Relu => 1,
        Activation::Tanh => 2,
        Activation::Sigmoid => 3,
    }
}

fn elementwise(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(BLOCK as usize).clamp(1, 65_535 * 8) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn count32(n: usize, what: &'static str) -> Result<u32, GpuError> {
    u32::try_from(n).map_err(|_| GpuError::TooLarge {
        what,
        got: n,
        limit: u32::MAX as usize,
    })
}

fn cublas_int(n: usize, what: &'static str) -> Result<i32, GpuError> {
    i32::try_from(n).map_err(|_| GpuError::TooLarge {
        what,
        got: n,
        limit: i32::MAX as usize,
    })
}

impl GpuRanker {
    /// What a device batch of this ranker holds ([`BatchBuffers::new`]).
    fn batch_shape(&self) -> BatchShape {
        BatchShape {
            n_features: self.n_features,
            n_columns: self.n_columns,
            layer_outputs: self.layers.iter().map(|l| l.outputs).collect(),
            tree_sums: self.tree_inputs.is_some() && self.layers.is_empty(),
            ensemble_sums: self.ensemble.is_some(),
        }
    }

    /// Lays `ranker` out for the GPU and copies it to the device.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when the ranker does not fit the kernels (a FreeForm expression
    /// deeper than the GPU stack, more than 2³² nodes); a driver error when a copy fails.
    pub fn upload(
        device: &GpuDevice,
        ranker: &Ranker,
        options: PlanOptions,
    ) -> Result<GpuRanker, GpuError> {
        device.check_fault("ranker upload")?;
        let plan = InputPlan::build(ranker, options).map_err(|e| match e {
            crate::rank::plan::PlanError::FreeFormTooDeep { depth, .. } => GpuError::TooLarge {
                what: "FreeForm stack depth",
                got: depth,
                limit: crate::rank::plan::FREEFORM_STACK,
            },
        })?;
        let stream = device.stream();
        let transforms_host: &[GpuTransform] = if plan.transforms.is_empty() {
            &[GpuTransform {
                kind: 0,
                feature: 0,
                slope: 0.0,
                intercept: 0.0,
                lower: 0.0,
                upper: 0.0,
            }]
        } else {
            &plan.transforms
        };
        let program_host: &[u32] = if plan.program.is_empty() {
            &[0, 0]
        } else {
            &plan.program
        };
        let mut bytes = transforms_host.len() * 32 + program_host.len() * 4;
        let tree_inputs = if plan.trees.is_empty() {
            None
        } else {
            let trees = GpuTrees::upload(device, &TreeLayout::build(&plan.trees)?)?;
            bytes += trees.bytes();
            Some(trees)
        };
        let ensemble = match &ranker.ensemble {
            Some(e) => {
                let trees = GpuTrees::upload(device, &TreeLayout::build(&e.trees)?)?;
                bytes += trees.bytes();
                Some((trees, e.base_score))
            }
            None => None,
        };
        let mut layers = Vec::with_capacity(ranker.layers.len());
        for (i, layer) in ranker.layers.iter().enumerate() {
            let (weights, inputs) = if i == 0 {
                (plan.permute_first_layer(layer), plan.n_columns())
            } else {
                (layer.weights.clone(), layer.inputs)
            };
            bytes += (weights.len() + layer.bias.len()) * 4;
            layers.push(GpuLayer {
                weights: stream.clone_htod(&weights).during("ranker upload")?,
                bias: stream.clone_htod(&layer.bias).during("ranker upload")?,
                inputs,
                outputs: layer.outputs,
                activation: activation_code(layer.activation),
            });
        }
        Ok(GpuRanker {
            n_features: ranker.features.len(),
            n_inputs: ranker.inputs.len(),
            n_columns: plan.n_columns(),
            has_transforms: plan.tree_col0 > 0,
            column_of_input: plan.column_of_input,
            transforms: stream.clone_htod(transforms_host).during("ranker upload")?,
            program: stream.clone_htod(program_host).during("ranker upload")?,
            tree_inputs,
            tree_col0: plan.tree_col0,
            layers,
            ensemble,
            bytes,
            max_batch: DEFAULT_MAX_BATCH,
            pool: Mutex::new(Vec::new()),
        })
    }

    /// Bytes the ranker occupies on the device.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Splits batches larger than `docs` documents into device batches of at most `docs`
    /// ([`DEFAULT_MAX_BATCH`] unless set); the pooled buffers never grow past it.
    #[must_use]
    pub fn with_max_batch(mut self, docs: usize) -> GpuRanker {
        self.max_batch = docs.max(1);
        self.pool.lock().clear();
        self
    }

    /// The most documents one device batch holds; larger calls are split.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Bytes of device memory held by the pooled batch buffers (besides [`GpuRanker::bytes`]).
    pub fn pool_bytes(&self) -> usize {
        self.pool.lock().iter().map(|b| b.device_bytes).sum()
    }

    /// Scores a batch: `features` is row-major `[docs][ranker.features.len()]`. Batches larger
    /// than [`GpuRanker::max_batch`] run as several device batches, one after another; a
    /// document's score does not depend on how the batch was split. Safe to call from several
    /// threads: each call takes its own set of pooled buffers.
    ///
    /// # Errors
    /// A [`GpuError`] when any copy, launch or GEMM fails; the caller falls back to the CPU.
    pub fn score(
        &self,
        device: &GpuDevice,
        features: &[f64],
        explain: bool,
    ) -> Result<GpuScores, GpuError> {
        self.score_blocks(device, &[features], explain)
    }

    /// [`GpuRanker::score`] of the rows of several blocks (each row-major at the ranker's
    /// width) as one batch, in block order: each device batch is staged straight from the
    /// blocks (a batch of requests is not first copied into one matrix).
    ///
    /// # Errors
    /// As [`GpuRanker::score`].
    pub fn score_blocks(
        &self,
        device: &GpuDevice,
        blocks: &[&[f64]],
        explain: bool,
    ) -> Result<GpuScores, GpuError> {
        let rows = HostRows::new(blocks, self.n_features);
        self.score_rows(device, rows, explain, None)
            .map(|(scores, _)| scores)
    }

    /// Scores hit documents in one device turn: for each layout (at most
    /// [`GpuRanker::max_batch`] documents, built with this ranker's gather map: see
    /// [`FeLayout::build_split`]) the layout is copied in, the features extracted (`fe_extract`)
    /// and gathered into this ranker's input buffer (`fe_gather`), then scored as
    /// [`GpuRanker::score`] scores rows; only the scores come back, and the rows too with
    /// `keep_rows`. Documents are in layout order. Consecutive layouts that fit one device batch
    /// together (several requests' layouts) are scored as one: one pass of the model, one copy
    /// out.
    ///
    /// # Errors
    /// As [`GpuRanker::score`]; [`GpuError::TooLarge`] for a layout over the device batch;
    /// [`GpuError::BatchFailed`] for one gathered for a ranker of another width.
    pub fn score_hits(
        &self,
        device: &GpuDevice,
        fe: &mut GpuFe,
        layouts: &[&FeLayout],
        explain: bool,
        keep_rows: bool,
    ) -> Result<GpuScores, GpuError> {
        (self.score_hits_with(device, fe, layouts, explain, keep_rows, None)).map(|(s, _)| s)
    }

    /// [`GpuRanker::score_hits`] with CUDA events recorded between the phases of each device
    /// batch, for benchmarks: `copy_in_us` is then the layouts' copy in, `fe_extract` and
    /// `fe_gather`.
    ///
    /// # Errors
    /// As [`GpuRanker::score_hits`], and a driver error when an event cannot be created or read.
    pub fn score_hits_timed(
        &self,
        device: &GpuDevice,
        fe: &mut GpuFe,
        layouts: &[&FeLayout],
    ) -> Result<(GpuScores, GpuPhases), GpuError> {
        let events = PhaseEvents::new(device)?;
        self.score_hits_with(device, fe, layouts, false, false, Some(&events))
    }

    fn score_hits_with(
        &self,
        device: &GpuDevice,
        fe: &mut GpuFe,
        layouts: &[&FeLayout],
        explain: bool,
        keep_rows: bool,
        events: Option<&PhaseEvents>,
    ) -> Result<(GpuScores, GpuPhases), GpuError> {
        for layout in layouts {
            if layout.n_docs() > self.max_batch {
                return Err(GpuError::TooLarge {
                    what: "documents per device batch",
                    got: layout.n_docs(),
                    limit: self.max_batch,
                });
            }
            if layout.width() != self.n_features {
                return Err(GpuError::BatchFailed {
                    reason: format!(
                        "the hits were laid out for {} features, the ranker reads {}",
                        layout.width(),
                        self.n_features
                    ),
                });
            }
        }
        let mut batches: Vec<&[&FeLayout]> = Vec::new();
        let (mut first, mut docs) = (0, 0);
        for (i, layout) in layouts.iter().enumerate() {
            if docs + layout.n_docs() > self.max_batch {
                batches.push(&layouts[first..i]);
                (first, docs) = (i, 0);
            }
            docs += layout.n_docs();
        }
        batches.push(&layouts[first..]);
        let chunks = batches.into_iter().map(ChunkRows::Hits);
        let scored = self.score_batches(device, chunks, Some(fe), explain, keep_rows, events);
        if scored.is_err() {
            // A layout in pinned memory goes back to its pool when the caller drops it: no copy
            // from it may still be queued (a failed stream's error is already in `scored`).
            let _ = device.stream().synchronize();
        }
        scored
    }

    /// [`GpuRanker::score`] with CUDA events recorded between the phases of each device batch,
    /// for benchmarks; [`GpuRanker::score`] records none.
    ///
    /// # Errors
    /// As [`GpuRanker::score`], and a driver error when an event cannot be created or read.
    pub fn score_timed(
        &self,
        device: &GpuDevice,
        features: &[f64],
    ) -> Result<(GpuScores, GpuPhases), GpuError> {
        let events = PhaseEvents::new(device)?;
        let blocks = [features];
        self.score_rows(
            device,
            HostRows::new(&blocks, self.n_features),
            false,
            Some(&events),
        )
    }

    /// [`GpuRanker::score`] of host rows, in device batches of at most `max_batch` documents.
    fn score_rows(
        &self,
        device: &GpuDevice,
        rows: HostRows<'_>,
        explain: bool,
        events: Option<&PhaseEvents>,
    ) -> Result<(GpuScores, GpuPhases), GpuError> {
        let n_docs = rows.n_docs();
        if !explain && events.is_none() && n_docs >= 2 * MIN_OVERLAP_PART {
            let scores = self.score_rows_overlapped(device, rows)?;
            return Ok((scores, GpuPhases::default()));
        }
        let batch = self.max_batch.min(n_docs).max(1);
        let chunks = (0..n_docs)
            .step_by(batch)
            .map(|first| ChunkRows::Host(rows.part(first, first + batch)));
        self.score_batches(device, chunks, None, explain, false, events)
    }

    /// [`GpuRanker::score`] of a large batch of host rows (`n_docs`, at least two parts), in
    /// parts on two buffer sets so that the transfer hides under the scoring: while part i is
    /// scored on the device's stream, part i + 1 is staged on the host and copied in on its copy
    /// stream. Each part's copy is ordered before its scoring by an event, and a buffer set is
    /// reused only once the host has waited for the scoring of the part before in it (which
    /// also ends that part's copy in, so its staging buffer is free).
    fn score_rows_overlapped(
        &self,
        device: &GpuDevice,
        rows: HostRows<'_>,
    ) -> Result<GpuScores, GpuError> {
        device.check_fault("ranker scoring")?;
        let n_docs = rows.n_docs();
        let part_docs = (n_docs.div_ceil(OVERLAP_PARTS))
            .max(MIN_OVERLAP_PART)
            .min(self.max_batch);
        let parts: Vec<HostRows<'_>> = (0..n_docs)
            .step_by(part_docs)
            .map(|first| rows.part(first, first + part_docs))
            .collect();
        let event = || {
            (device.context())
                .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .during("event creation")
        };
        let (copied, scored) = ([event()?, event()?], [event()?, event()?]);
        let mut sets = [
            self.take_buffers(device, part_docs)?,
            self.take_buffers(device, part_docs)?,
        ];
        let (stream, copy_stream) = (device.stream(), device.copy_stream());
        let mut scores = Vec::with_capacity(n_docs);
        let no_phases = |_: usize| Ok(());
        let mut queue = || -> Result<(), GpuError> {
            // New buffers are allocated and zeroed in the device stream's order: the copies
            // wait for that (and for whatever else it still runs).
            copied[0].record(stream).during("event record")?;
            copy_stream.wait(&copied[0]).during("stream wait")?;
            for (i, part) in parts.iter().enumerate() {
                let set = i % 2;
                if i >= 2 {
                    scored[set].synchronize().during("ranker scoring")?;
                    sets[set].collect_scores(parts[i - 2].n_docs(), &mut scores)?;
                }
                let b = &mut sets[set];
                let values = b.stage(part.pieces())?;
                b.upload_staged(values, copy_stream)?;
                copied[set].record(copy_stream).during("event record")?;
                stream.wait(&copied[set]).during("stream wait")?;
                self.queue_scoring(device, b, part.n_docs(), false, &no_phases)?;
                scored[set].record(stream).during("event record")?;
            }
            for (i, part) in parts.iter().enumerate().skip(parts.len().saturating_sub(2)) {
                scored[i % 2].synchronize().during("ranker scoring")?;
                sets[i % 2].collect_scores(part.n_docs(), &mut scores)?;
            }
            Ok(())
        };
        if let Err(err) = queue() {
            // Nothing queued may still read or write the buffers when they are dropped.
            let _ = copy_stream.synchronize();
            let _ = stream.synchronize();
            return Err(err);
        }
        let mut pool = self.pool.lock();
        for buffers in sets {
            if pool.len() < POOL_SIZE {
                pool.push(buffers);
            }
        }
        Ok(GpuScores {
            scores,
            inputs: None,
            rows: None,
        })
    }

    /// Scores the device batches `chunks` one after another (hits need `fe`), appending each
    /// batch's scores (inputs, rows) in order.
    fn score_batches<'a>(
        &self,
        device: &GpuDevice,
        chunks: impl Iterator<Item = ChunkRows<'a>> + Clone,
        mut fe: Option<&mut GpuFe>,
        explain: bool,
        keep_rows: bool,
        events: Option<&PhaseEvents>,
    ) -> Result<(GpuScores, GpuPhases), GpuError> {
        device.check_fault("ranker scoring")?;
        let sizes = chunks.clone().map(|c| c.n_docs());
        let (n_docs, largest) = sizes.fold((0, 0), |(n, m), d| (n + d, m.max(d)));
        let mut out = GpuScores {
            scores: Vec::with_capacity(n_docs),
            inputs: explain.then(|| Vec::with_capacity(n_docs * self.n_inputs)),
            rows: keep_rows.then(|| Vec::with_capacity(n_docs * self.n_features)),
        };
        let mut phases = GpuPhases::default();
        if n_docs == 0 {
            return Ok((out, phases));
        }
        let mut buffers = self.take_buffers(device, largest)?;
        for chunk in chunks.filter(|c| c.n_docs() > 0) {
            // On an error the buffers are dropped, not pooled: the stream's state is unknown.
            let fe = fe.as_deref_mut();
            let b = &mut buffers;
            self.score_chunk(device, b, chunk, fe, &mut out, events, &mut phases)?;
        }
        let mut pool = self.pool.lock();
        if pool.len() < POOL_SIZE {
            pool.push(buffers);
        }
        Ok((out, phases))
    }

    /// A pooled buffer set for at least `docs` documents, or a new one.
    fn take_buffers(&self, device: &GpuDevice, docs: usize) -> Result<BatchBuffers, GpuError> {
        let pooled = {
            let mut pool = self.pool.lock();
            match pool.iter().position(|b| b.capacity >= docs) {
                Some(i) => Some(pool.swap_remove(i)),
                // Too small for this batch: drop one so the pool does not keep growing.
                None => {
                    pool.pop();
                    None
                }
            }
        };
        match pooled {
            Some(buffers) => Ok(buffers),
            None => {
                let capacity = docs
                    .next_power_of_two()
                    .max(MIN_CAPACITY)
                    .min(self.max_batch)
                    .max(docs);
                BatchBuffers::new(device, capacity, &self.batch_shape())
            }
        }
    }

    /// Scores one device batch (at most the buffers' capacity) and appends to `out`.
    #[allow(clippy::too_many_arguments)]
    fn score_chunk(
        &self,
        device: &GpuDevice,
        b: &mut BatchBuffers,
        rows: ChunkRows<'_>,
        fe: Option<&mut GpuFe>,
        out: &mut GpuScores,
        events: Option<&PhaseEvents>,
        phases: &mut GpuPhases,
    ) -> Result<(), GpuError> {
        let n_docs = rows.n_docs();
        let stream = device.stream();
        let columns = self.n_columns.max(1);
        let record = |phase: usize| match events {
            Some(e) => e.record(phase, stream),
            None => Ok(()),
        };
        match (rows, fe) {
            (ChunkRows::Host(rows), _) => {
                let staged_at = Instant::now();
                let values = b.stage(rows.pieces())?;
                phases.stage_us += staged_at.elapsed().as_secs_f64() * 1e6;
                record(0)?;
                // The staging buffer is not written again before the stream is synchronised
                // at the end of this chunk.
                b.upload_staged(values, stream)?;
            }
            (ChunkRows::Hits(layouts), Some(fe)) => {
                record(0)?;
                // The requests' layouts side by side on the device, each gathered into its
                // rows; the model below waits for all of them.
                fe.extract_each_into(device, layouts, &mut b.features, self.n_features)?;
            }
            (ChunkRows::Hits(_), None) => {
                return Err(GpuError::BatchFailed {
                    reason: "hit documents scored without feature-extraction buffers".into(),
                })
            }
        }
        record(1)?;
        self.queue_scoring(device, b, n_docs, out.inputs.is_some(), &record)?;
        if let Some(ordered) = out.inputs.as_mut() {
            let matrix = stream
                .clone_dtoh(&b.inputs.slice(..n_docs * columns))
                .during("input download")?;
            for row in matrix.chunks(columns) {
                ordered.extend(self.column_of_input.iter().map(|&c| row[c]));
            }
        }
        if let Some(rows) = out.rows.as_mut() {
            let values = n_docs * self.n_features;
            if values > 0 {
                let matrix = stream
                    .clone_dtoh(&b.features.slice(..values))
                    .during("feature rows download")?;
                rows.extend_from_slice(&matrix);
            }
        }
        stream.synchronize().during("ranker scoring")?;
        b.collect_scores(n_docs, &mut out.scores)?;
        if let Some(events) = events {
            events.add_to(phases)?;
        }
        Ok(())
    }
}
