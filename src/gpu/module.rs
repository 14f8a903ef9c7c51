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
}

impl KernelModule {
    /// Every module, compiled once per context at start-up.
    pub const ALL: &'static [KernelModule] = &[
        KernelModule::Trees,
        KernelModule::Mit,
        KernelModule::Nn,
        KernelModule::Fe,
    ];

    /// The module's name: its file stem under `kernels/`.
    pub fn name(self) -> &'static str {
        match self {
            KernelModule::Trees => "trees",
            KernelModule::Mit => "mit",
            KernelModule::Nn => "nn",
            KernelModule::Fe => "fe",
        }
    }

    /// The CUDA C source, embedded so the binary needs no files at run time.
    pub fn source(self) -> &'static str {
        match self {
            KernelModule::Trees => include_str!("../../kernels/trees.cu"),
            KernelModule::Mit => include_str!("../../kernels/mit.cu"),
            KernelModule::Nn => include_str!("../../kernels/nn.cu"),
            KernelModule::Fe => include_str!("../../kernels/fe.cu"),
        }
    }

    /// The `extern "C"` entry points the module must define.
    pub fn kernels(self) -> &'static [&'static str] {
        match self {
            KernelModule::Trees => &["trees_eval"],
            KernelModule::Mit => &["mit_eval"],
            KernelModule::Nn => &["nn_bias_activation", "nn_scores"],
            KernelModule::Fe => &["fe_extract"],
        }
    }
}
