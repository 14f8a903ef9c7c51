//! Typed device errors. Every variant says which operation, module or kernel failed; no cudarc
//! result is unwrapped anywhere in the crate.

use cudarc::driver::DriverError;
use cudarc::nvrtc::CompileError;

/// An error of the device runtime or of a GPU stage built on it.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No usable GPU: the reason is logged once at start-up and the CPU serves.
    #[error("no GPU: {reason}")]
    Unavailable { reason: String },
    /// `RANKSERVE_FAULT_GPU=1` made this call fail (tests of the CPU fallback).
    #[error("GPU fault injected by RANKSERVE_FAULT_GPU during {op}")]
    FaultInjected { op: &'static str },
    /// A CUDA driver call failed.
    #[error("CUDA driver error during {op}: {source}")]
    Driver {
        op: &'static str,
        #[source]
        source: DriverError,
    },
    /// NVRTC could not compile a kernel module.
    #[error("NVRTC could not compile kernels/{module}.cu for {arch}: {source}")]
    Compile {
        module: &'static str,
        arch: String,
        #[source]
        source: CompileError,
    },
    /// A kernel entry point is missing from its compiled module.
    #[error("kernel `{kernel}` is missing from module {module}: {source}")]
    MissingKernel {
        module: &'static str,
        kernel: &'static str,
        #[source]
        source: DriverError,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS error during {op}: {source}")]
    Cublas {
        op: &'static str,
        #[source]
        source: cudarc::cublas::result::CublasError,
    },
    /// A batch of work that this one was part of failed (the batch's first job carries the
    /// error itself).
    #[error("the GPU batch this ran in failed: {reason}")]
    BatchFailed { reason: String },
    /// The work does not fit what the device or the kernel supports.
    #[error("{what} exceeds the GPU limit: {got} > {limit}")]
    TooLarge {
        what: &'static str,
        got: usize,
        limit: usize,
    },
}

impl GpuError {
    /// Whether the device itself failed (a driver or cuBLAS error, an injected fault), rather
    /// than the work (too large for it) or a batch it ran in (whose first job reports the
    /// device's error).
    pub fn is_device_failure(&self) -> bool {
        matches!(
            self,
            GpuError::Driver { .. } | GpuError::Cublas { .. } | GpuError::FaultInjected { .. }
        )
    }
}

/// Attaches the failing operation's name to a driver result.
pub trait DriverResultExt<T> {
    /// Maps a [`DriverError`] to [`GpuError::Driver`] naming `op`.
    fn during(self, op: &'static str) -> Result<T, GpuError>;
}

impl<T> DriverResultExt<T> for Result<T, DriverError> {
    fn during(self, op: &'static str) -> Result<T, GpuError> {
        self.map_err(|source| GpuError::Driver { op, source })
    }
}
