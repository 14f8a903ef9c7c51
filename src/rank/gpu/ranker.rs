//! A whole ranker on the GPU: its device copy (transform table, FreeForm programs, tree node
//! arrays, NN weights) and the launches that score a batch of feature vectors.
//!
//! One batch of D documents runs as: copy the features in (D × F f64); `mit_eval` fills the
//! model-input matrix (D × N' f32, N' = inputs plus dummy padding); `trees_eval` writes the tree
//! inputs' leaves into its last columns; each NN layer is one SGEMM (D × N' · N' × H) followed by
//! `nn_bias_activation`; `trees_eval` sums the ensemble (f64); `nn_scores` adds it to the NN's
//! output (or to the sum of the inputs when there are no layers); the scores are copied out.

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};

use super::trees::{GpuTrees, TreeLayout, TreeTargets};
use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, KernelModule};
use crate::rank::model::{Activation, Ranker};
use crate::rank::plan::{GpuTransform, InputPlan, PlanOptions};

// SAFETY: `GpuTransform` is `repr(C)` plain old data matching `struct Transform` in mit.cu (its
// size is asserted in rank::plan; the parity tests check the values).
unsafe impl DeviceRepr for GpuTransform {}

/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;

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
}

/// The result of scoring a batch on the GPU.
#[derive(Debug, Clone, Default)]
pub struct GpuScores {
    /// One score per document.
    pub scores: Vec<f64>,
    /// With `explain`: each document's model inputs in the ranker's input order (row-major).
    pub inputs: Option<Vec<f32>>,
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
        })
    }

    /// Bytes the ranker occupies on the device.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Scores a batch: `features` is row-major `[docs][ranker.features.len()]`.
    ///
    /// # Errors
    /// A [`GpuError`] when any copy, launch or GEMM fails; the caller falls back to the CPU.
    pub fn score(
        &self,
        device: &GpuDevice,
        features: &[f64],
        explain: bool,
    ) -> Result<GpuScores, GpuError> {
        device.check_fault("ranker scoring")?;
        let n_docs = if self.n_features == 0 {
            0
        } else {
            features.len() / self.n_features
        };
        if n_docs == 0 {
            return Ok(GpuScores {
                scores: Vec::new(),
                inputs: explain.then(Vec::new),
            });
        }
        let stream = device.stream();
        let docs32 = count32(n_docs, "documents per batch")?;
        let features_dev = stream.clone_htod(features).during("feature upload")?;
        // The model-input matrix; at least one column so that a ranker with no inputs still has
        // a valid (zero) buffer for `nn_scores`.
        let columns = self.n_columns.max(1);
        let mut inputs = stream
            .alloc_zeros::<f32>(n_docs * columns)
            .during("input allocation")?;
        if self.has_transforms {
            let (n_columns, n_features) = (
                count32(self.n_columns, "model inputs")?,
                count32(self.n_features, "features")?,
            );
            let f = device.function(KernelModule::Mit, "mit_eval")?;
            let mut launch = stream.launch_builder(f);
            launch
                .arg(&self.transforms)
                .arg(&n_columns)
                .arg(&self.program)
                .arg(&features_dev)
                .arg(&docs32)
                .arg(&n_features)
                .arg(&mut inputs);
            // SAFETY: arguments follow `mit_eval`'s signature (transform table, u32 column count,
            // program, f64 features, u32 documents, u32 features, f32 inputs); `features_dev`
            // holds n_docs × n_features values and `inputs` n_docs × n_columns.
            unsafe { launch.launch(elementwise(n_docs * self.n_columns)) }
                .during("mit_eval launch")?;
        }
        // Tree inputs feed the NN as f32 columns; without layers their leaves are summed in
        // f64, as the CPU sums inputs, and the columns are filled only for `explain`.
        let mut tree_sums = None;
        if let Some(trees) = &self.tree_inputs {
            let no_layers = self.layers.is_empty();
            let mut sums = match no_layers {
                true => Some(stream.alloc_zeros::<f64>(n_docs).during("sum allocation")?),
                false => None,
            };
            let targets = TreeTargets {
                inputs: (!no_layers || explain).then_some((&mut inputs, columns, self.tree_col0)),
                leaf_ids: None,
                sums: sums.as_mut(),
                base: 0.0,
            };
            trees.launch(device, &features_dev, n_docs, self.n_features, targets)?;
            tree_sums = sums;
        }
        let mut current = None::<CudaSlice<f32>>;
        for layer in &self.layers {
            let input = current.as_ref().unwrap_or(&inputs);
            let mut output = stream
                .alloc_zeros::<f32>(n_docs * layer.outputs)
                .during("layer allocation")?;
            // Row-major Y[D][H] = X[D][N] · W[H][N]ᵀ is, in cuBLAS's column-major terms,
            // Yᵀ (H × D) = op(W) · Xᵀ with W read as N × H and transposed.
            let config = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_T,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: cublas_int(layer.outputs, "layer outputs")?,
                n: cublas_int(n_docs, "documents per batch")?,
                k: cublas_int(layer.inputs, "layer inputs")?,
                alpha: 1.0f32,
                lda: cublas_int(layer.inputs, "layer inputs")?,
                ldb: cublas_int(layer.inputs, "layer inputs")?,
                beta: 0.0f32,
                ldc: cublas_int(layer.outputs, "layer outputs")?,
            };
            // SAFETY: `layer.weights` holds outputs × inputs values, `input` n_docs × inputs and
            // `output` n_docs × outputs, matching m, n, k and the leading dimensions above.
            unsafe {
                device
                    .blas()
                    .gemm(config, &layer.weights, input, &mut output)
            }
            .map_err(|source| GpuError::Cublas {
                op: "layer SGEMM",
                source,
            })?;
            let outputs32 = count32(layer.outputs, "layer outputs")?;
            let f = device.function(KernelModule::Nn, "nn_bias_activation")?;
            let mut launch = stream.launch_builder(f);
            launch
                .arg(&mut output)
                .arg(&layer.bias)
                .arg(&docs32)
                .arg(&outputs32)
                .arg(&layer.activation);
            // SAFETY: arguments follow `nn_bias_activation`'s signature; `output` holds
            // n_docs × outputs values and `bias` outputs values.
            unsafe { launch.launch(elementwise(n_docs * layer.outputs)) }
                .during("nn_bias_activation launch")?;
            current = Some(output);
        }
        let mut ensemble_sums = None;
        if let Some((trees, base)) = &self.ensemble {
            let mut sums = stream.alloc_zeros::<f64>(n_docs).during("sum allocation")?;
            let targets = TreeTargets {
                inputs: None,
                leaf_ids: None,
                sums: Some(&mut sums),
                base: *base,
            };
            trees.launch(device, &features_dev, n_docs, self.n_features, targets)?;
            ensemble_sums = Some(sums);
        }
        let (values, stride, summed) = match &current {
            Some(out) => (out, 1, 1),
            None => (&inputs, columns, self.tree_col0),
        };
        let (stride32, summed32) = (
            count32(stride, "model inputs")?,
            count32(summed, "model inputs")?,
        );
        let mut scores = stream.alloc_zeros::<f64>(n_docs).during("score allocation")?;
        let null: u64 = 0;
        let f = device.function(KernelModule::Nn, "nn_scores")?;
        let mut launch = stream.launch_builder(f);
        launch.arg(values).arg(&stride32).arg(&summed32);
        for sums in [&tree_sums, &ensemble_sums] {
            match sums {
                Some(sums) => launch.arg(sums),
                None => launch.arg(&null),
            };
        }
        launch.arg(&docs32).arg(&mut scores);
        // SAFETY: arguments follow `nn_scores`'s signature; `values` holds n_docs × stride f32
        // with summed <= stride, the tree-input and ensemble sums (or null u64s) n_docs f64 each,
        // `scores` n_docs f64.
        unsafe { launch.launch(elementwise(n_docs)) }.during("nn_scores launch")?;
        let scores = stream.clone_dtoh(&scores).during("score download")?;
        let inputs = match explain {
            true => {
                let matrix = stream.clone_dtoh(&inputs).during("input download")?;
                let mut ordered = Vec::with_capacity(n_docs * self.n_inputs);
                for row in matrix.chunks(columns) {
                    ordered.extend(self.column_of_input.iter().map(|&c| row[c]));
                }
                Some(ordered)
            }
            false => None,
        };
        stream.synchronize().during("ranker scoring")?;
        Ok(GpuScores { scores, inputs })
    }
}
