//! The kernel modules: CUDA C sources embedded at build time, one file per stage, compiled by
//! NVRTC at start-up for the device's own architecture.

/// A kernel module: one `kernels/<name>.cu` file and the entry points it defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelModule {
    /// Decision trees: tree inputs and tree ensembles.
    Trees,
    /// Model-input transforms.
    Mit,
    /// NN layers: bias and activation after each GEMM, final scores.
    Nn,
    /// Feature extraction: every catalogue feature of a batch of hit documents.
    Fe,
    /// PForDelta posting-block decoding.
    Pfor,
    /// Elias-Fano posting-block decoding.
    Ef,
    /// AND's intersection steps: merge path, binary search or skip entries per step, survivors
    /// for the CPU.
    Intersect,
    /// BM25: OR term at a time into dense accumulators, AND's survivors, top-k candidates.
    Score,
}

impl KernelModule {
    /// Every module, compiled once per context at start-up.
    pub const ALL: &'static [KernelModule] = &[
        KernelModule::Trees,
        KernelModule::Mit,
        KernelModule::Nn,
        KernelModule::Fe,
        KernelModule::Pfor,
        KernelModule::Ef,
        KernelModule::Intersect,
        KernelModule::Score,
    ];

    /// The module's name: its file stem under `kernels/`.
    pub fn name(self) -> &'static str {
        match self {
            KernelModule::Trees => "trees",
            KernelModule::Mit => "mit",
            KernelModule::Nn => "nn",
            KernelModule::Fe => "fe",
            KernelModule::Pfor => "pfor",
            KernelModule::Ef => "ef",
            KernelModule::Intersect => "intersect",
            KernelModule::Score => "score",
        }
    }

    /// The CUDA C source, embedded so the binary needs no files at run time.
    pub fn source(self) -> &'static str {
        match self {
            KernelModule::Trees => include_str!("../../kernels/trees.cu"),
            KernelModule::Mit => include_str!("../../kernels/mit.cu"),
            KernelModule::Nn => include_str!("../../kernels/nn.cu"),
            KernelModule::Fe => include_str!("../../kernels/fe.cu"),
            // The decoders share kernels/packing.cuh, prepended here (NVRTC sees no files).
            KernelModule::Pfor => concat!(
                include_str!("../../kernels/packing.cuh"),
                include_str!("../../kernels/pfor.cu")
            ),
            KernelModule::Ef => concat!(
                include_str!("../../kernels/packing.cuh"),
                include_str!("../../kernels/ef.cu")
            ),
            // Both search sorted docIDs with kernels/search.cuh's lower_bound; intersect's
            // skip-entry step reads and writes the decoders' block descriptors (packing.cuh).
            KernelModule::Intersect => concat!(
                include_str!("../../kernels/search.cuh"),
                include_str!("../../kernels/packing.cuh"),
                include_str!("../../kernels/intersect.cu")
            ),
            KernelModule::Score => concat!(
                include_str!("../../kernels/search.cuh"),
                include_str!("../../kernels/score.cu")
            ),
        }
    }

    /// NVRTC options beyond the architecture: `score` must not fuse multiply-adds, so that its
    /// f32 BM25 arithmetic rounds exactly as the CPU's (`select::bm25`).
    pub fn nvrtc_options(self) -> &'static [&'static str] {
        match self {
            KernelModule::Score => &["--fmad=false"],
            KernelModule::Trees
            | KernelModule::Mit
            | KernelModule::Nn
            | KernelModule::Pfor
            | KernelModule::Ef
            | KernelModule::Intersect
            | KernelModule::Fe => &[],
        }
    }

    /// The `extern "C"` entry points the module must define.
    pub fn kernels(self) -> &'static [&'static str] {
        match self {
            KernelModule::Trees => &["trees_eval"],
            KernelModule::Mit => &["mit_eval"],
            KernelModule::Nn => &["nn_bias_activation", "nn_scores", "nn_single_output_scores"],
            KernelModule::Fe => &["fe_extract", "fe_gather"],
            KernelModule::Pfor => &["pfor_decode_blocks"],
            KernelModule::Ef => &["ef_decode_blocks"],
            KernelModule::Intersect => &[
                "intersect_merge_path",
                "intersect_search",
                "intersect_skip_blocks",
                "intersect_skip_seek",
                "intersect_gather",
            ],
            KernelModule::Score => &[
                "score_fill",
                "score_term",
                "score_and_found",
                "score_block_topk",
                "score_block_topk_warp",
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

    use super::KernelModule;
    use crate::gpu::device::gpu_required;

    /// NVRTC needs no GPU: where its library is on the loader path (the GPU machine; a developer
    /// machine with the `nvidia-cuda-nvrtc` wheel's lib folder on `LD_LIBRARY_PATH`), a kernel
    /// that does not compile fails here (for compute_90, the H100's), before any device run.
    #[test]
    fn every_module_compiles_with_nvrtc() {
        // SAFETY: only looks the library up (cudarc panics on a call into a missing one).
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            assert!(
                !gpu_required(),
                "RANKSERVE_REQUIRE_GPU=1 but NVRTC is missing"
            );
            eprintln!("every_module_compiles_with_nvrtc: skipped (no libnvrtc on the loader path)");
            return;
        }
        for &module in KernelModule::ALL {
            let options = std::iter::once("--gpu-architecture=compute_90")
                .chain(module.nvrtc_options().iter().copied())
                .map(String::from)
                .collect();
            let compiled = compile_ptx_with_opts(
                module.source(),
                CompileOptions {
                    options,
                    name: Some(format!("{}.cu", module.name())),
                    ..Default::default()
                },
            );
            if let Err(err) = compiled {
                panic!("kernels/{}.cu: {err:?}", module.name());
            }
        }
    }
}
