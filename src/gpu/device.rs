//! The GPU device: context, stream, compiled kernels, and the start-up probe.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DriverError};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use super::error::{DriverResultExt, GpuError};
use super::module::KernelModule;

/// Environment variable that makes every GPU call fail, to prove the fallback in tests: `1`
/// (every device, from the start) or `DEVICE@MS` (device `DEVICE` only, from `MS` milliseconds
/// after the probe: a device failing under load).
pub const FAULT_ENV: &str = "RANKSERVE_FAULT_GPU";

/// Fault injection as [`FAULT_ENV`] asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Every,
    One { ordinal: usize, after: Duration },
}

impl Fault {
    fn from_env() -> Fault {
        std::env::var(FAULT_ENV).map_or(Fault::None, |v| Fault::parse(&v))
    }

    /// `1`, `DEVICE@MS`, or anything else (no fault).
    fn parse(value: &str) -> Fault {
        if value == "1" {
            return Fault::Every;
        }
        let one = value.split_once('@').and_then(|(ordinal, ms)| {
            Some(Fault::One {
                ordinal: ordinal.parse().ok()?,
                after: Duration::from_millis(ms.parse().ok()?),
            })
        });
        one.unwrap_or(Fault::None)
    }

    /// From when device `ordinal`'s calls fail, if ever.
    fn of(self, ordinal: usize) -> Option<Instant> {
        match self {
            Fault::None => None,
            Fault::Every => Some(Instant::now()),
            Fault::One { ordinal: o, after } => (o == ordinal).then(|| Instant::now() + after),
        }
    }
}

/// The device's PCI address, `domain:bus:device.0`, NVML's form.
fn pci_bus_id(ctx: &CudaContext) -> Result<String, GpuError> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let attribute = |a| ctx.attribute(a).during("PCI address");
    Ok(format!(
        "{:08X}:{:02X}:{:02X}.0",
        attribute(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
        attribute(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
        attribute(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
    ))
}

/// Every kernel module compiled for `arch`, in [`KernelModule::ALL`]'s order.
fn compile_modules(arch: &str) -> Result<Vec<Ptx>, GpuError> {
    KernelModule::ALL
        .iter()
        .map(|&module| {
            compile_ptx_with_opts(
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
                arch: arch.to_string(),
                source,
            })
        })
        .collect()
}

/// An initialised GPU: one context, its default stream and every kernel, compiled.
pub struct GpuDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// A second stream, for copies that overlap the work queued on `stream`.
    copy_stream: Arc<CudaStream>,
    blas: CudaBlas,
    name: String,
    arch: String,
    sm_count: usize,
    functions: HashMap<(KernelModule, &'static str), CudaFunction>,
    ordinal: usize,
    pci_bus_id: String,
    /// From when every call fails (fault injection, [`FAULT_ENV`]).
    fault: Option<Instant>,
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
        GpuDevice::probe_all(Some(&[0])).map(|mut devices| devices.remove(0))
    }

    /// Opens the devices `only` lists (CUDA's ordinals, after `CUDA_VISIBLE_DEVICES`), or every
    /// visible one for `None`: a context each, the kernels compiled once per architecture.
    ///
    /// # Errors
    /// As [`GpuDevice::probe`]; [`GpuError::Unavailable`] also when `only` names a device that
    /// is not visible.
    pub fn probe_all(only: Option<&[usize]>) -> Result<Vec<Arc<GpuDevice>>, GpuError> {
        // cudarc's dynamic loading panics on the first call into a missing library, so check
        // for every library before touching any.
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
        let ordinals: Vec<usize> = match only {
            Some(only) => only.to_vec(),
            None => (0..count as usize).collect(),
        };
        if let Some(&missing) = ordinals.iter().find(|&&o| o >= count as usize) {
            return Err(GpuError::Unavailable {
                reason: format!("GPU {missing} was asked for, but the CUDA driver sees {count}"),
            });
        }
        let fault = Fault::from_env();
        let mut ptx_by_arch = HashMap::new();
        ordinals
            .into_iter()
            .map(|ordinal| GpuDevice::open(ordinal, fault.of(ordinal), &mut ptx_by_arch))
            .collect()
    }

    /// Creates device `ordinal`'s context and loads every kernel module, compiled for its
    /// architecture unless `ptx_by_arch` already holds them.
    fn open(
        ordinal: usize,
        fault: Option<Instant>,
        ptx_by_arch: &mut HashMap<String, Vec<Ptx>>,
    ) -> Result<Arc<GpuDevice>, GpuError> {
        let ctx = CudaContext::new(ordinal).during("context creation")?;
        // SAFETY: with event tracking off, cudarc leaves ordering across streams to the caller.
        // Every stage queues its work on the one stream (`stream`); the only work on other
        // streams — `copy_stream` (`GpuRanker`'s overlapped batches) and `GpuFe`'s extraction
        // lanes — is ordered against it by explicit events, nothing is freed while a copy on
        // `copy_stream` may still read it, and a lane's buffers are allocated and freed in its
        // own stream's order. Left on, the other streams would make cudarc record and wait for
        // events around every use of every buffer.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().during("device name")?;
        let (major, minor) = ctx.compute_capability().during("compute capability")?;
        let arch = format!("sm_{major}{minor}");
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .during("multiprocessor count")?
            .max(1) as usize;
        let pci_bus_id = pci_bus_id(&ctx)?;
        let stream = ctx.default_stream();
        let copy_stream = ctx.new_stream().during("stream creation")?;
        let blas = CudaBlas::new(stream.clone()).map_err(|source| GpuError::Cublas {
            op: "handle creation",
            source,
        })?;
        if !ptx_by_arch.contains_key(&arch) {
            ptx_by_arch.insert(arch.clone(), compile_modules(&arch)?);
        }
        let mut functions = HashMap::new();
        for (&module, ptx) in KernelModule::ALL.iter().zip(&ptx_by_arch[&arch]) {
            let loaded = ctx.load_module(ptx.clone()).during("module load")?;
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
        Ok(Arc::new(GpuDevice {
            ctx,
            stream,
            copy_stream,
            blas,
            ordinal,
            pci_bus_id,
            name,
            arch,
            sm_count,
            functions,
            fault,
        }))
    }

    /// The device's CUDA ordinal in this process (after `CUDA_VISIBLE_DEVICES`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's PCI address as NVML names it (`domain:bus:device.0`), which does not
    /// depend on `CUDA_VISIBLE_DEVICES`.
    pub fn pci_bus_id(&self) -> &str {
        &self.pci_bus_id
    }

    /// Makes the device's context current on the calling thread, so that raw driver calls made
    /// during a turn (cudarc's own calls bind it themselves) reach this device.
    ///
    /// # Errors
    /// A driver error when the context cannot be bound.
    pub fn bind(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().during("context bind")
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

    /// A stream for copies in that overlap the work on [`GpuDevice::stream`]: ordered against it
    /// by events only (cudarc's event tracking is off), and not synchronised by
    /// [`GpuDevice::synchronize`].
    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.copy_stream
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

    /// Fails with [`GpuError::FaultInjected`] when fault injection is on for this device.
    pub fn check_fault(&self, op: &'static str) -> Result<(), GpuError> {
        if self.fault.is_some_and(|from| Instant::now() >= from) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_injection_reads_every_device_or_one_after_a_delay() {
        assert_eq!(Fault::parse("1"), Fault::Every);
        assert_eq!(
            Fault::parse("1@2500"),
            Fault::One {
                ordinal: 1,
                after: Duration::from_millis(2500)
            }
        );
        for off in ["", "0", "yes", "1@", "@5", "x@5"] {
            assert_eq!(Fault::parse(off), Fault::None, "{off:?}");
        }
        let one = Fault::parse("1@0");
        assert!(one.of(0).is_none());
        assert!(one.of(1).is_some());
        assert!(Fault::Every.of(3).is_some());
    }
}
