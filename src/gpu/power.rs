//! GPU power and energy through NVML (`libnvidia-ml.so.1`, loaded at run time by nvml-wrapper):
//! the instantaneous board power and the driver's total-energy counter. The benchmark samples
//! them around a constant load; the server can export them as gauges
//! (`rankserve_gpu_power_watts`, `rankserve_gpu_energy_joules`) from [`PowerMeter::power_w`] and
//! [`PowerMeter::energy_j`].
//!
//! Opening a meter on a machine without the NVIDIA driver is an ordinary error
//! ([`PowerError::Init`]), never a panic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

/// Why power could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    /// NVML could not be loaded or initialised (no driver, no library).
    #[error("NVML is unavailable: {source}")]
    Init {
        #[source]
        source: NvmlError,
    },
    /// NVML knows no GPU at a CUDA device's PCI address.
    #[error("NVML found no GPU at PCI address {address}: {source}")]
    Address {
        address: String,
        #[source]
        source: NvmlError,
    },
    /// An NVML query failed.
    #[error("NVML {op} failed on GPU {index}: {source}")]
    Query {
        op: &'static str,
        index: u32,
        #[source]
        source: NvmlError,
    },
}

/// Reads one GPU's power draw and energy counter.
pub struct PowerMeter {
    nvml: Nvml,
    index: u32,
    name: String,
}

impl std::fmt::Debug for PowerMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerMeter")
            .field("index", &self.index)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Power over an interval: the average of the samples, and the energy counter's difference.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PowerReading {
    /// Wall-clock length of the interval.
    pub seconds: f64,
    /// Mean of the power samples, in watts.
    pub avg_w: f64,
    /// The highest sample, in watts.
    pub max_w: f64,
    /// Power samples taken.
    pub samples: usize,
    /// Difference of the total-energy counter over the interval, in joules.
    pub energy_j: f64,
}

impl PowerMeter {
    /// Initialises NVML and opens GPU `index` (NVML's numbering).
    ///
    /// # Errors
    /// [`PowerError::Init`] when NVML cannot be loaded (no NVIDIA driver on this machine);
    /// [`PowerError::Query`] when the GPU cannot be opened or does not report power.
    pub fn open(index: u32) -> Result<PowerMeter, PowerError> {
        let nvml = Nvml::init().map_err(|source| PowerError::Init { source })?;
        PowerMeter::open_in(nvml, index)
    }

    /// Opens the GPU at PCI address `pci_bus_id` ([`GpuDevice::pci_bus_id`]): the same board
    /// as a CUDA device whatever `CUDA_VISIBLE_DEVICES` renumbers.
    ///
    /// [`GpuDevice::pci_bus_id`]: super::GpuDevice::pci_bus_id
    ///
    /// # Errors
    /// As [`PowerMeter::open`]; [`PowerError::Address`] when NVML knows no GPU there.
    pub fn open_pci(pci_bus_id: &str) -> Result<PowerMeter, PowerError> {
        let nvml = Nvml::init().map_err(|source| PowerError::Init { source })?;
        let index = (nvml.device_by_pci_bus_id(pci_bus_id))
            .and_then(|d| d.index())
            .map_err(|source| PowerError::Address {
                address: pci_bus_id.to_string(),
                source,
            })?;
        PowerMeter::open_in(nvml, index)
    }

    fn open_in(nvml: Nvml, index: u32) -> Result<PowerMeter, PowerError> {
        let name = nvml
            .device_by_index(index)
            .and_then(|d| d.name())
            .map_err(|source| PowerError::Query {
                op: "device lookup",
                index,
                source,
            })?;
        let meter = PowerMeter { nvml, index, name };
        meter.power_w()?;
        meter.energy_j()?;
        Ok(meter)
    }

    /// The GPU's name as NVML reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The board's current power draw, in watts.
    ///
    /// # Errors
    /// [`PowerError::Query`] when NVML fails.
    pub fn power_w(&self) -> Result<f64, PowerError> {
        let mw = self
            .device("power usage")?
            .power_usage()
            .map_err(|source| self.query_error("power usage", source))?;
        Ok(f64::from(mw) / 1e3)
    }

    /// The driver's total-energy counter (since it was loaded), in joules.
    ///
    /// # Errors
    /// [`PowerError::Query`] when NVML fails or the GPU has no energy counter (before Volta).
    pub fn energy_j(&self) -> Result<f64, PowerError> {
        let mj = self
            .device("total energy")?
            .total_energy_consumption()
            .map_err(|source| self.query_error("total energy", source))?;
        Ok(mj as f64 / 1e3)
    }

    /// Runs `work` while a second thread samples the power every `interval`, and reads the
    /// energy counter before and after.
    ///
    /// # Errors
    /// [`PowerError::Query`] when a reading fails; `work` has run by then.
    pub fn measure<T>(
        &self,
        interval: Duration,
        work: impl FnOnce() -> T,
    ) -> Result<(T, PowerReading), PowerError> {
        let stop = AtomicBool::new(false);
        let energy0 = self.energy_j()?;
        let start = Instant::now();
        let (value, samples) = std::thread::scope(|scope| {
            let sampler = scope.spawn(|| {
                let mut samples = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    samples.push(self.power_w());
                    std::thread::sleep(interval);
                }
                samples
            });
            let value = work();
            stop.store(true, Ordering::Relaxed);
            // The sampler only sleeps and reads NVML; a panic there is a bug in nvml-wrapper.
            (value, sampler.join().unwrap_or_default())
        });
        let seconds = start.elapsed().as_secs_f64();
        let energy_j = self.energy_j()? - energy0;
        let samples = samples.into_iter().collect::<Result<Vec<f64>, _>>()?;
        let n = samples.len().max(1) as f64;
        Ok((
            value,
            PowerReading {
                seconds,
                avg_w: samples.iter().sum::<f64>() / n,
                max_w: samples.iter().copied().fold(0.0, f64::max),
                samples: samples.len(),
                energy_j,
            },
        ))
    }

    fn device(&self, op: &'static str) -> Result<nvml_wrapper::Device<'_>, PowerError> {
        self.nvml
            .device_by_index(self.index)
            .map_err(|source| self.query_error(op, source))
    }

    fn query_error(&self, op: &'static str, source: NvmlError) -> PowerError {
        PowerError::Query {
            op,
            index: self.index,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the NVIDIA driver, opening a meter is an error that says so; with one (the GPU
    /// machine), the readings are plausible.
    #[test]
    fn open_fails_cleanly_or_reads_plausible_values() {
        match PowerMeter::open(0) {
            Err(err) => {
                assert!(
                    !crate::gpu::device::gpu_required(),
                    "RANKSERVE_REQUIRE_GPU=1 but NVML failed: {err}"
                );
                assert!(err.to_string().starts_with("NVML"), "{err}");
            }
            Ok(meter) => {
                let ((), reading) = meter
                    .measure(Duration::from_millis(10), || {
                        std::thread::sleep(Duration::from_millis(100))
                    })
                    .unwrap();
                assert!(reading.avg_w > 1.0 && reading.avg_w < 2000.0, "{reading:?}");
                assert!(reading.energy_j >= 0.0, "{reading:?}");
            }
        }
    }
}
