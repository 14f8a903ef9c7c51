//! Which processor runs a stage's work: what a request or the configuration asks for
//! ([`Backend`]), which one ran ([`Processor`]), and the one place where a GPU failure that moved
//! work to the CPU is logged and counted ([`fell_back`]).
//!
//! It sits below the configuration and both stages, so that each of them names a backend without
//! importing another.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::gpu::GpuError;

/// The backend a request or the configuration asks for.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Per batch (ranking) or per query (selection): the GPU where its measured costs say it
    /// wins, else the CPU; the CPU on any GPU failure.
    Auto,
    /// Never the GPU.
    Cpu,
    /// The GPU; 503 `gpu_unavailable` without one.
    Gpu,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Auto => "auto",
            Backend::Cpu => "cpu",
            Backend::Gpu => "gpu",
        })
    }
}

/// The processor that ran a batch or a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Processor {
    Cpu,
    Gpu,
}

impl Processor {
    pub fn as_str(self) -> &'static str {
        match self {
            Processor::Cpu => "cpu",
            Processor::Gpu => "gpu",
        }
    }
}

/// The stage whose work fell back, as the fallback metric labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Candidate selection.
    Select,
    /// Feature extraction.
    Fe,
    /// Scoring (transforms, trees, layers).
    Rank,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Select => "select",
            Stage::Fe => "fe",
            Stage::Rank => "rank",
        }
    }
}

/// Logs and counts (`rankserve_gpu_fallback_total{stage, reason}`) a GPU failure of `stage`
/// whose work ran on the CPU instead; `subject` names the ranker or the query. `reason` is
/// `too_large` when the work did not fit the device's budget, `out_of_service` when every
/// device is out after a failure (`gpu::executor`), else `gpu_error`.
pub fn fell_back(stage: Stage, subject: &str, err: &GpuError) {
    let reason = match err {
        GpuError::TooLarge { .. } => "too_large",
        // Every device was taken out after a failure (counted once, when it failed).
        GpuError::Unavailable { .. } => "out_of_service",
        _ => "gpu_error",
    };
    let stage = stage.as_str();
    match reason {
        "out_of_service" => tracing::debug!(stage, subject, error = %err, "running on the CPU"),
        _ => tracing::warn!(stage, subject, error = %err, "GPU failed: running on the CPU"),
    }
    metrics::counter!("rankserve_gpu_fallback_total", "stage" => stage, "reason" => reason)
        .increment(1);
}
