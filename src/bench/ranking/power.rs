//! Power and energy per 1 000 documents under a constant load: the GPU through its power meter,
//! the CPU through RAPL where the host exposes it.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{gpu_err, rows_for, BenchError, BenchRanker, CpuThreads};
use crate::gpu::pinned::PinnedPool;
use crate::gpu::power::{PowerMeter, PowerReading};
use crate::gpu::{GpuDevice, GpuError};
use crate::rank::cpu::CpuPlan;
use crate::rank::fe::{synth_corpus_stats, synth_hit_documents, synth_query, FeatureResolver};
use crate::rank::gpu::fe::GpuFe;
use crate::rank::gpu::layout::{FeLayout, GpuFeError};
use crate::rank::gpu::ranker::GpuRanker;

/// Power under a constant load of one ranker on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct PowerRun {
    pub ranker: String,
    pub backend: String,
    pub docs_per_batch: usize,
    pub documents: usize,
    pub reading: PowerReading,
    pub docs_per_s: f64,
    /// Counter energy per 1 000 documents, and the same above the idle power.
    pub j_per_1000_docs: f64,
    pub j_per_1000_docs_above_idle: f64,
}

/// The power section: GPU idle power, GPU runs, and what could be said about the CPU.
#[derive(Debug, Clone, Serialize)]
pub struct PowerReport {
    pub gpu: Option<String>,
    pub gpu_idle: Option<PowerReading>,
    pub runs: Vec<PowerRun>,
    /// Why the GPU or the CPU could not be measured, when not.
    pub notes: Vec<String>,
}

/// Reads CPU package energy from RAPL (`/sys/class/powercap/intel-rapl:N/energy_uj`), where
/// the host exposes it and it is readable.
#[derive(Debug)]
pub struct Rapl {
    /// Per package: the counter file and its wrap-around range (µJ).
    zones: Vec<(std::path::PathBuf, u64)>,
}

impl Rapl {
    /// The package zones, or why there are none.
    ///
    /// # Errors
    /// A sentence saying why CPU energy is not measurable on this host.
    pub fn open() -> Result<Rapl, String> {
        let base = std::path::Path::new("/sys/class/powercap");
        let entries = std::fs::read_dir(base)
            .map_err(|e| format!("no RAPL on this host ({}: {e})", base.display()))?;
        let mut zones = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // Packages are intel-rapl:N; their sub-zones (intel-rapl:N:M) are inside them.
            if name.starts_with("intel-rapl:") && name.matches(':').count() == 1 {
                let path = entry.path();
                let range = std::fs::read_to_string(path.join("max_energy_range_uj"))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(u64::MAX);
                zones.push((path.join("energy_uj"), range));
            }
        }
        let rapl = Rapl { zones };
        match rapl.zones.is_empty() {
            true => Err("no RAPL package zones on this host".into()),
            false => rapl.read().map(|_| rapl),
        }
    }

    fn read(&self) -> Result<Vec<u64>, String> {
        self.zones
            .iter()
            .map(|(path, _)| {
                std::fs::read_to_string(path)
                    .map_err(|e| format!("RAPL not readable ({}: {e})", path.display()))?
                    .trim()
                    .parse()
                    .map_err(|e| format!("RAPL counter {} unreadable: {e}", path.display()))
            })
            .collect()
    }

    /// Joules used by every package while `work` ran.
    ///
    /// # Errors
    /// When a counter cannot be read.
    pub fn measure<T>(&self, work: impl FnOnce() -> T) -> Result<(T, f64), String> {
        let before = self.read()?;
        let value = work();
        let after = self.read()?;
        let uj: u64 = before
            .iter()
            .zip(&after)
            .zip(&self.zones)
            .map(|((&b, &a), (_, range))| if a >= b { a - b } else { range - b + a })
            .sum();
        Ok((value, uj as f64 / 1e6))
    }
}

/// Scores `docs`-document batches back to back for at least `seconds`; returns the documents
/// scored.
fn constant_load<E>(
    seconds: f64,
    docs: usize,
    mut score: impl FnMut() -> Result<(), E>,
) -> Result<usize, E> {
    let start = Instant::now();
    let mut done = 0;
    while start.elapsed().as_secs_f64() < seconds {
        score()?;
        done += docs;
    }
    Ok(done)
}

/// One batch of a constant load on the GPU.
type GpuLoad<'a> = Box<dyn FnMut() -> Result<(), GpuError> + 'a>;

/// What the power runs need.
#[derive(Debug, Clone, Copy)]
pub struct PowerConfig {
    /// Seconds of constant load per ranker and backend (and of idle).
    pub seconds: f64,
    /// Documents per batch of the load.
    pub docs: usize,
    /// Threads of the CPU load.
    pub threads: usize,
    pub seed: u64,
}

/// Idle GPU power, then each ranker under a constant load on the GPU (feature rows: `gpu`; and
/// for rankers that FE serves, hit documents laid out and scored on the fused path, FE included:
/// `gpu+fe`) and, where RAPL can be read, on the CPU (feature rows).
///
/// # Errors
/// [`BenchError::Gpu`] or [`BenchError::Power`] when the GPU or a reading fails part way.
pub fn bench_power(
    rankers: &[BenchRanker],
    config: &PowerConfig,
    gpu: Option<&GpuDevice>,
    progress: &mut dyn FnMut(&str),
) -> Result<PowerReport, BenchError> {
    let mut report = PowerReport {
        gpu: None,
        gpu_idle: None,
        runs: Vec::new(),
        notes: Vec::new(),
    };
    let interval = Duration::from_millis(100);
    let power_err = |what: String| {
        move |source| BenchError::Power {
            what,
            source: Box::new(source),
        }
    };
    let meter = match (gpu, PowerMeter::open(0)) {
        (Some(device), Ok(meter)) => Some((device, meter)),
        (None, _) => {
            report
                .notes
                .push("GPU power not measured: no usable GPU".into());
            None
        }
        (Some(_), Err(err)) => {
            report.notes.push(format!("GPU power not measured: {err}"));
            None
        }
    };
    let rapl = Rapl::open();
    if let Err(why) = &rapl {
        report
            .notes
            .push(format!("CPU energy: not measurable on this host ({why})"));
    }
    let per_1000 = |j: f64, n: usize| j / (n as f64 / 1000.0);
    if let Some((device, meter)) = &meter {
        report.gpu = Some(meter.name().to_string());
        let idle_s = (config.seconds / 2.0).max(2.0);
        progress(&format!("power: GPU idle for {idle_s:.0} s"));
        let ((), idle) = meter
            .measure(interval, || {
                std::thread::sleep(Duration::from_secs_f64(idle_s))
            })
            .map_err(power_err("GPU idle".into()))?;
        report.gpu_idle = Some(idle);
        let (mut fe, stats) = (GpuFe::new(), synth_corpus_stats());
        // Layouts in pinned memory, as the served path joins them.
        let pinned = PinnedPool::new(std::sync::Arc::clone(device.context()), 64 << 20);
        for bench in rankers {
            let name = bench.name.as_str();
            let rows = rows_for(bench, config.docs, config.seed);
            let r = GpuRanker::upload(device, &bench.ranker, Default::default())
                .map_err(gpu_err(name, "model upload"))?;
            // With FE: synthetic hit documents (Q = 4) laid out on every thread and scored in
            // one device turn, as the served fused path does; for rankers FE can serve.
            let hits = FeatureResolver::new(&bench.ranker.features)
                .ok()
                .map(|resolver| {
                    let docs = synth_hit_documents(config.docs, 4, config.seed);
                    (resolver.gather_map(), synth_query(4, config.seed), docs)
                });
            let mut loads: Vec<(&str, GpuLoad<'_>)> = vec![(
                "gpu",
                Box::new(|| r.score(device, &rows, false).map(|_| ())),
            )];
            if let Some((map, query, docs)) = &hits {
                let (r, fe, stats, pinned) = (&r, &mut fe, &stats, &pinned);
                loads.push((
                    "gpu+fe",
                    Box::new(move || {
                        let threads = rayon::current_num_threads();
                        let layouts = FeLayout::build_split(
                            query,
                            stats,
                            docs,
                            Some(map),
                            r.max_batch(),
                            threads,
                            Some(pinned),
                        )
                        .map_err(GpuFeError::into_gpu_error)?;
                        let layouts: Vec<&FeLayout> = layouts.iter().collect();
                        r.score_hits(device, fe, &layouts, false, false).map(|_| ())
                    }),
                ));
            }
            for (backend, mut load) in loads {
                load().map_err(gpu_err(name, "warm-up"))?;
                progress(&format!(
                    "power: {name} ({backend}) on the GPU for {:.0} s",
                    config.seconds
                ));
                let (done, reading) = meter
                    .measure(interval, || {
                        constant_load(config.seconds, config.docs, &mut load)
                    })
                    .map_err(power_err(format!("{name} ({backend}) on the GPU")))?;
                let done = done.map_err(gpu_err(name, "constant load"))?;
                let above_idle = reading.energy_j - idle.avg_w * reading.seconds;
                report.runs.push(PowerRun {
                    ranker: name.into(),
                    backend: backend.into(),
                    docs_per_batch: config.docs,
                    documents: done,
                    reading,
                    docs_per_s: done as f64 / reading.seconds,
                    j_per_1000_docs: per_1000(reading.energy_j, done),
                    j_per_1000_docs_above_idle: per_1000(above_idle, done),
                });
            }
        }
    }
    if let Ok(rapl) = &rapl {
        let pool = CpuThreads::new(config.threads)?;
        for bench in rankers {
            let name = bench.name.as_str();
            let rows = rows_for(bench, config.docs, config.seed);
            let plan = CpuPlan::new(&bench.ranker);
            progress(&format!(
                "power: {name} on the CPU for {:.0} s",
                config.seconds
            ));
            let start = Instant::now();
            let (done, energy_j) = rapl
                .measure(|| {
                    constant_load(config.seconds, config.docs, || {
                        std::hint::black_box(pool.score(&plan, &rows));
                        Ok::<(), BenchError>(())
                    })
                })
                .map_err(|what| BenchError::Input {
                    ranker: name.into(),
                    what,
                })?;
            let done = done?;
            let seconds = start.elapsed().as_secs_f64();
            report.runs.push(PowerRun {
                ranker: name.into(),
                backend: format!("cpu x{}", config.threads),
                docs_per_batch: config.docs,
                documents: done,
                reading: PowerReading {
                    seconds,
                    avg_w: energy_j / seconds,
                    max_w: f64::NAN,
                    samples: 0,
                    energy_j,
                },
                docs_per_s: done as f64 / seconds,
                j_per_1000_docs: per_1000(energy_j, done),
                j_per_1000_docs_above_idle: f64::NAN,
            });
        }
    }
    Ok(report)
}
