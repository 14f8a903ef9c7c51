//! The CPU/GPU crossover of a ranker: the batch size from which the GPU, copies included, scores
//! a batch faster than the CPU does. Measured when a ranker loads (DESIGN §1); `backend=auto`
//! sends a batch to the GPU when it has at least that many documents. Two are measured: scoring
//! feature rows ([`measure`]), and feature extraction and scoring of hit documents together
//! ([`measure_hits`]: CPU FE then CPU scoring against the fused device path), which
//! `fe_backend=auto` follows.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::ranker::GpuRanker;
use crate::gpu::{GpuDevice, GpuError};
use crate::rank::fe::{synth_corpus_stats, synth_hit_documents, synth_query, HitDocument};
use crate::rank::fe::{CorpusStats, QueryInfo};
use crate::rank::model::Ranker;
use crate::rank::synth::synth_features;

/// Query terms of the synthetic hit documents [`measure_hits`] times (the request log's
/// typical query).
pub const HITS_QUERY_TERMS: u32 = 4;

/// Batch sizes timed, smallest first.
pub const BATCH_SIZES: &[usize] = &[1, 8, 32, 128, 512, 2048, 8192];
/// Timed runs per size and backend (after one warm-up); the median is kept.
const REPS: usize = 5;

/// One measured batch size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CrossoverPoint {
    pub docs: usize,
    /// Median wall time of one batch, in microseconds.
    pub cpu_us: f64,
    pub gpu_us: f64,
}

/// What the measurement found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Crossover {
    /// The smallest measured batch size from which the GPU is faster at that size and every
    /// larger one measured; `None` when the GPU never was.
    pub docs: Option<usize>,
    pub points: Vec<CrossoverPoint>,
}

impl Crossover {
    /// Whether a batch of `docs` documents should run on the GPU.
    pub fn prefers_gpu(&self, docs: usize) -> bool {
        self.docs.is_some_and(|from| docs >= from)
    }
}

fn median_us(mut run: impl FnMut() -> Result<(), GpuError>) -> Result<f64, GpuError> {
    run()?;
    let mut times = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let started = Instant::now();
        run()?;
        times.push(started.elapsed());
    }
    times.sort_unstable();
    Ok(times[REPS / 2].as_secs_f64() * 1e6)
}

/// Times `cpu` (the CPU scoring the server would use instead) against `gpu` at each of
/// [`BATCH_SIZES`] on synthetic feature rows of `ranker`, stopping early once a size takes
/// longer than `budget` on the slower side (larger sizes would only take longer).
///
/// # Errors
/// The first GPU error; the caller then serves the ranker on the CPU.
pub fn measure(
    device: &GpuDevice,
    ranker: &Ranker,
    gpu: &GpuRanker,
    cpu: &dyn Fn(&[f64]) -> Vec<f64>,
    budget: Duration,
) -> Result<Crossover, GpuError> {
    if ranker.features.is_empty() {
        return Ok(Crossover {
            docs: None,
            points: Vec::new(),
        });
    }
    let rows = synth_features(ranker, *BATCH_SIZES.last().unwrap_or(&1), 0x0C05_50E5);
    let width = ranker.features.len();
    measure_with(
        budget,
        |docs| {
            std::hint::black_box(cpu(&rows[..docs * width]));
        },
        |docs| gpu.score(device, &rows[..docs * width], false).map(|_| ()),
    )
}

/// Synthetic hit documents of one query, as [`measure_hits`] times them.
pub struct HitSample<'a> {
    pub query: &'a QueryInfo,
    pub stats: &'a CorpusStats,
    pub docs: &'a [HitDocument],
}

/// Times `cpu` (CPU feature extraction and scoring, as the server would run them) against `gpu`
/// (the fused device path) on synthetic hit documents ([`HITS_QUERY_TERMS`] terms) at each of
/// [`BATCH_SIZES`], as [`measure`] does.
///
/// # Errors
/// The first GPU error; the caller then serves hit documents on the CPU.
pub fn measure_hits(
    cpu: &dyn Fn(&HitSample<'_>),
    gpu: &dyn Fn(&HitSample<'_>) -> Result<(), GpuError>,
    budget: Duration,
) -> Result<Crossover, GpuError> {
    let query = synth_query(HITS_QUERY_TERMS, 0x0C05);
    let stats = synth_corpus_stats();
    let all = synth_hit_documents(*BATCH_SIZES.last().unwrap_or(&1), HITS_QUERY_TERMS, 0x50E5);
    let sample = |docs: usize| HitSample {
        query: &query,
        stats: &stats,
        docs: &all[..docs],
    };
    measure_with(budget, |docs| cpu(&sample(docs)), |docs| gpu(&sample(docs)))
}

/// The points of `cpu` against `gpu`, each run on the first `docs` of its sample for each of
/// [`BATCH_SIZES`], stopping once a size takes longer than `budget` on the slower side.
fn measure_with(
    budget: Duration,
    mut cpu: impl FnMut(usize),
    mut gpu: impl FnMut(usize) -> Result<(), GpuError>,
) -> Result<Crossover, GpuError> {
    let mut points = Vec::new();
    for &docs in BATCH_SIZES {
        let cpu_us = median_us(|| {
            cpu(docs);
            Ok(())
        })?;
        let gpu_us = median_us(|| gpu(docs))?;
        points.push(CrossoverPoint {
            docs,
            cpu_us,
            gpu_us,
        });
        if cpu_us.max(gpu_us) > budget.as_secs_f64() * 1e6 {
            break;
        }
    }
    Ok(Crossover {
        docs: crossover_of(&points),
        points,
    })
}

/// The smallest size from which every measured point has the GPU faster.
fn crossover_of(points: &[CrossoverPoint]) -> Option<usize> {
    let mut from = None;
    for point in points.iter().rev() {
        if point.gpu_us < point.cpu_us {
            from = Some(point.docs);
        } else {
            break;
        }
    }
    from
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(docs: usize, cpu_us: f64, gpu_us: f64) -> CrossoverPoint {
        CrossoverPoint {
            docs,
            cpu_us,
            gpu_us,
        }
    }

    #[test]
    fn crossover_is_where_the_gpu_wins_from_then_on() {
        let points = [
            point(1, 5.0, 50.0),
            point(8, 20.0, 10.0), // a lucky win, lost again at 32
            point(32, 60.0, 70.0),
            point(128, 300.0, 80.0),
            point(512, 1200.0, 90.0),
        ];
        assert_eq!(crossover_of(&points), Some(128));
        assert_eq!(crossover_of(&points[..3]), None);
        assert_eq!(crossover_of(&[point(1, 9.0, 3.0)]), Some(1));
        assert_eq!(crossover_of(&[]), None);
        let measured = Crossover {
            docs: Some(128),
            points: points.to_vec(),
        };
        assert!(!measured.prefers_gpu(127) && measured.prefers_gpu(128));
        assert!(!Crossover {
            docs: None,
            points: Vec::new()
        }
        .prefers_gpu(1_000_000));
    }
}
