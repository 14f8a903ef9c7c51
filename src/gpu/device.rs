//! The GPU device: context, stream, compiled kernels, and the start-up probe.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DriverError};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::error::{DriverResultExt, GpuError};
use super::module::KernelModule;

/// Environment variable that makes every GPU call fail, to prove the CPU fallback in tests.
pub const FAULT_ENV: &str = "RANKSERVE_FAULT_GPU";

/// An initialised GPU: one context, its default stream and every kernel, compiled.
pub struct GpuDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    name: String,
    arch: String,
    sm_count: usize,
    functions: HashMap<(KernelModule, &'static str), CudaFunction>,
    fault: bool,
}

impl std::fmt::Debug for GpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDevice")
            .field("name", &self.name)
            .field("arch", &self.arch)
            .finish_non_exhaustive()
    }
}

impl GpuDevice {
    /// Finds GPU 0, creates its context and compiles every kernel module for its architecture.
    ///
    /// # Errors
    /// [`GpuError::Unavailable`] when the CUDA driver or NVRTC library is absent or there is no
    /// device (the caller serves on the CPU and logs the reason); a driver or compile error when
    /// initialisation fails part way.
    pub fn probe() -> Result<Arc<GpuDevice>, GpuError> {
        // cudarc's dynamic loading panics on the first call into a missing library, so check
        // for both libraries before touching either.
        // SAFETY: these only try to open the shared libraries; no CUDA state is touched.
        let driver_present = unsafe { cudarc::driver::sys::is_culib_present() };
        let nvrtc_present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
        if !driver_present {
            return Err(GpuError::Unavailable {
                reason: "the CUDA driver library (libcuda.so) is not on the loader path".into(),
            });
        }
        // SAFETY: as above.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(GpuError::Unavailable {
                reason: "the cuBLAS library (libcublas.so) is not on the loader path".into(),
            });
        }
        if !nvrtc_present {
            return Err(GpuError::Unavailable {
                reason: "the NVRTC library (libnvrtc.so) is not on the loader path".into(),
            });
        }
        let count = CudaContext::device_count().map_err(|e| GpuError::Unavailable {
            reason: format!("the CUDA driver found no usable device: {e}"),
        })?;
        if count < 1 {
            return Err(GpuError::Unavailable {
                reason: "the CUDA driver reports no devices".into(),
            });
        }
        let ctx = CudaContext::new(0).during("context creation")?;
        let name = ctx.name().during("device name")?;
        let (major, minor) = ctx.compute_capability().during("compute capability")?;
        let arch = format!("sm_{major}{minor}");
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .during("multiprocessor count")?
            .max(1) as usize;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|source| GpuError::Cublas {
            op: "handle creation",
            source,
        })?;
        let mut functions = HashMap::new();
        for &module in KernelModule::ALL {
            let ptx = compile_ptx_with_opts(
                module.source(),
                CompileOptions {
                    options: std::iter::once(format!("--gpu-architecture={arch}"))
                        .chain(module.nvrtc_options().iter().map(|o| o.to_string()))
                        .collect(),
                    name: Some(format!("{}.cu", module.name())),
                    ..Default::default()
                },
            )
            .map_err(|source| GpuError::Compile {
                module: module.name(),
                arch: arch.clone(),
                source,
            })?;
            let loaded = ctx.load_module(ptx).during("module load")?;
            for &kernel in module.kernels() {
                let function =
                    loaded
                        .load_function(kernel)
                        .map_err(|source| GpuError::MissingKernel {
                            module: module.name(),
                            kernel,
                            source,
                        })?;
                functions.insert((module, kernel), function);
            }
        }
        let fault = std::env::var(FAULT_ENV).is_ok_and(|v| v == "1");
        Ok(Arc::new(GpuDevice {
            ctx,
            stream,
            blas,
            name,
            arch,
            sm_count,
            functions,
            fault,
        }))
    }

    /// Streaming multiprocessors: how many blocks a launch needs to occupy the whole device.
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// The device's marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The architecture the kernels were compiled for, e.g. `sm_90`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The context, for stages that allocate and launch.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every stage's work is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The cuBLAS handle, bound to [`GpuDevice::stream`]. Its math mode is cuBLAS's default, so
    /// SGEMM computes in full fp32 (no TF32).
    pub fn blas(&self) -> &CudaBlas {
        &self.blas
    }

    /// Waits until every queued operation on [`GpuDevice::stream`] has finished.
    ///
    /// # Errors
    /// A driver error when the stream reports one (a failed asynchronous operation).
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream.synchronize().during("stream synchronize")
    }

    /// A compiled kernel.
    ///
    /// # Errors
    /// [`GpuError::FaultInjected`] under `RANKSERVE_FAULT_GPU=1`. A kernel that is not listed in
    /// its module's [`KernelModule::kernels`] is a programming error caught at probe time, so it is
    /// reported as a missing kernel only if the list and the call disagree.
    pub fn function(
        &self,
        module: KernelModule,
        kernel: &'static str,
    ) -> Result<&CudaFunction, GpuError> {
        self.check_fault(kernel)?;
        self.functions
            .get(&(module, kernel))
            .ok_or(GpuError::MissingKernel {
                module: module.name(),
                kernel,
                source: DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_FOUND),
            })
    }

    /// Fails with [`GpuError::FaultInjected`] when fault injection is on.
    pub fn check_fault(&self, op: &'static str) -> Result<(), GpuError> {
        if self.fault {
            Err(GpuError::FaultInjected { op })
        } else {
            Ok(())
        }
    }
}

/// Whether this process must have a working GPU (`RANKSERVE_REQUIRE_GPU=1`): GPU tests fail
/// instead of skipping.
pub fn gpu_required() -> bool {
    std::env::var("RANKSERVE_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The GPU for a test, or `None` (with the reason printed) when there is none and
/// `RANKSERVE_REQUIRE_GPU=1` is not set.
///
/// # Panics
/// When `RANKSERVE_REQUIRE_GPU=1` and no GPU could be initialised: GPU tests fail instead of
/// skipping on the GPU machine.
pub fn device_for_tests(test: &str) -> Option<Arc<GpuDevice>> {
    match GpuDevice::probe() {
        Ok(device) => Some(device),
        Err(err) if gpu_required() => {
            panic!("{test}: RANKSERVE_REQUIRE_GPU=1 but the GPU is unusable: {err}")
        }
        Err(err) => {
            eprintln!("{test}: skipped on the GPU ({err})");
            None
        }
    }
}
