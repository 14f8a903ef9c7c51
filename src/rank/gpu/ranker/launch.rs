//! The launches that score one device batch of a [`GpuRanker`] whose feature rows are in
//! device memory: model-input transforms, tree inputs, NN layers (cuBLAS SGEMM), the ensemble and
//! the scores, then the scores' copy out. Kept apart from the batches' host side (staging,
//! overlap, buffer pools) in the parent module.

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::result::memcpy_dtoh_async;
use cudarc::driver::{CudaSlice, DevicePtr, LaunchArgs, PushKernelArg};

use super::{count32, cublas_int, elementwise, GpuRanker};
use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, KernelModule};
use crate::rank::gpu::batch::BatchBuffers;
use crate::rank::gpu::trees::TreeTargets;

impl GpuRanker {
    /// Queues on the device's stream the scoring of the `n_docs` rows in `b.features`: MIT,
    /// trees, NN layers, the ensemble and the scores, then the scores' copy into
    /// `b.staging_out`; `record` marks the phases 2 to 4 (see `PhaseEvents`). The model
    /// inputs are computed in full for `explain`.
    pub(super) fn queue_scoring(
        &self,
        device: &GpuDevice,
        b: &mut BatchBuffers,
        n_docs: usize,
        explain: bool,
        record: &dyn Fn(usize) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        let stream = device.stream();
        let docs32 = count32(n_docs, "documents per batch")?;
        let columns = self.n_columns.max(1);
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
                .arg(&b.features)
                .arg(&docs32)
                .arg(&n_features)
                .arg(&mut b.inputs);
            // SAFETY: arguments follow `mit_eval`'s signature (transform table, u32 column count,
            // program, f64 features, u32 documents, u32 features, f32 inputs); `b.features`
            // holds at least n_docs × n_features values and `b.inputs` n_docs × n_columns.
            unsafe { launch.launch(elementwise(n_docs * self.n_columns)) }
                .during("mit_eval launch")?;
        }
        record(2)?;
        // Tree inputs feed the NN as f32 columns; without layers their leaves are summed in
        // f64, as the CPU sums inputs, and the columns are filled only for `explain`.
        if let Some(trees) = &self.tree_inputs {
            let no_layers = self.layers.is_empty();
            let targets = TreeTargets {
                inputs: (!no_layers || explain).then_some((&mut b.inputs, columns, self.tree_col0)),
                leaf_ids: None,
                sums: b.tree_sums.as_mut(),
                base: 0.0,
            };
            trees.launch(device, &b.features, n_docs, self.n_features, targets)?;
        }
        // A last layer of one output is scored whole by `nn_single_output_scores`, after the
        // ensemble below: one launch where its SGEMM, bias and the scores would take three.
        let single_output = (self.layers.last()).filter(|last| last.outputs == 1);
        let by_gemm = self.layers.len() - usize::from(single_output.is_some());
        for (i, layer) in self.layers[..by_gemm].iter().enumerate() {
            let (before, rest) = b.layers.split_at_mut(i);
            let input = before.last().unwrap_or(&b.inputs);
            let output = &mut rest[0];
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
            // SAFETY: `layer.weights` holds outputs × inputs values, `input` at least
            // n_docs × inputs and `output` n_docs × outputs, matching m, n, k and the leading
            // dimensions above.
            unsafe { device.blas().gemm(config, &layer.weights, input, output) }.map_err(
                |source| GpuError::Cublas {
                    op: "layer SGEMM",
                    source,
                },
            )?;
            let outputs32 = count32(layer.outputs, "layer outputs")?;
            let f = device.function(KernelModule::Nn, "nn_bias_activation")?;
            let mut launch = stream.launch_builder(f);
            launch
                .arg(&mut *output)
                .arg(&layer.bias)
                .arg(&docs32)
                .arg(&outputs32)
                .arg(&layer.activation);
            // SAFETY: arguments follow `nn_bias_activation`'s signature; `output` holds at least
            // n_docs × outputs values and `bias` outputs values.
            unsafe { launch.launch(elementwise(n_docs * layer.outputs)) }
                .during("nn_bias_activation launch")?;
        }
        if let (Some((trees, base)), Some(sums)) = (&self.ensemble, b.ensemble_sums.as_mut()) {
            let targets = TreeTargets {
                inputs: None,
                leaf_ids: None,
                sums: Some(sums),
                base: *base,
            };
            trees.launch(device, &b.features, n_docs, self.n_features, targets)?;
        }
        let null: u64 = 0;
        if let Some(last) = single_output {
            let input = b.layers[..by_gemm].last().unwrap_or(&b.inputs);
            let inputs32 = count32(last.inputs, "layer inputs")?;
            let f = device.function(KernelModule::Nn, "nn_single_output_scores")?;
            let mut launch = stream.launch_builder(f);
            launch
                .arg(input)
                .arg(&inputs32)
                .arg(&last.weights)
                .arg(&last.bias)
                .arg(&last.activation);
            push_sums(&mut launch, [&b.tree_sums, &b.ensemble_sums], &null);
            launch.arg(&docs32).arg(&mut b.scores);
            // SAFETY: arguments follow `nn_single_output_scores`'s signature; `input` holds
            // n_docs × inputs f32 (the layer before's output, or the model inputs, whose width
            // is the layer's inputs as for the SGEMM), `weights` inputs f32 and `bias` one; the
            // tree-input and ensemble sums (or null u64s) n_docs f64 each, `scores` n_docs f64.
            unsafe { launch.launch(elementwise(n_docs * 32)) }
                .during("nn_single_output_scores launch")?;
        } else {
            let (values, stride, summed) = match b.layers.last() {
                Some(last) => (last, 1, 1),
                None => (&b.inputs, columns, self.tree_col0),
            };
            let (stride32, summed32) = (
                count32(stride, "model inputs")?,
                count32(summed, "model inputs")?,
            );
            let f = device.function(KernelModule::Nn, "nn_scores")?;
            let mut launch = stream.launch_builder(f);
            launch.arg(values).arg(&stride32).arg(&summed32);
            push_sums(&mut launch, [&b.tree_sums, &b.ensemble_sums], &null);
            launch.arg(&docs32).arg(&mut b.scores);
            // SAFETY: arguments follow `nn_scores`'s signature; `values` holds n_docs × stride
            // f32 with summed <= stride, the tree-input and ensemble sums (or null u64s) n_docs
            // f64 each, `scores` n_docs f64.
            unsafe { launch.launch(elementwise(n_docs)) }.during("nn_scores launch")?;
        }
        record(3)?;
        {
            let scores_out = &mut b.staging_out.as_mut_slice().during("score staging")?[..n_docs];
            let (src, _read) = b.scores.device_ptr(stream);
            // SAFETY: `src` holds at least n_docs f64 and `scores_out` is n_docs f64 of pinned
            // host memory, read only after the stream is synchronised below.
            unsafe { memcpy_dtoh_async(scores_out, src, stream.cu_stream()) }
                .during("score download")?;
        }
        record(4)?;
        Ok(())
    }
}

/// Pushes the tree-input and the ensemble sums, each a device pointer or a null u64 where the
/// ranker has none, as `nn_scores` and `nn_single_output_scores` take them.
fn push_sums<'a>(
    launch: &mut LaunchArgs<'a>,
    sums: [&'a Option<CudaSlice<f64>>; 2],
    null: &'a u64,
) {
    for sums in sums {
        match sums {
            Some(sums) => launch.arg(sums),
            None => launch.arg(null),
        };
    }
}
