//! The ranking stage: ranker models and their files, feature extraction (FE), model-input
//! transforms (MIT), model evaluation (ME: trees and NN layers), on the CPU (the reference)
//! and the GPU, and the engine that runs them.
//!
//! - [`fe`]: feature extraction over hit requests.
//! - [`model`]: the validated in-memory ranker, shared by every backend.
//! - [`format`]: the native ranker file (read, validate, write); [`error`]: its errors.
//! - [`cpu`]: the CPU evaluator (reference and fast plan).
//! - [`freeform`]: the FreeForm expression parser and evaluator.
//! - [`gpu`]: the GPU path, checked against [`cpu`]; [`plan`]: its host-side input layout.
//! - [`synth`]: deterministic synthetic rankers and feature rows.
//! - [`store`]: ranker files and the CPU cache of parsed rankers.
//! - [`engine`]: batching, the CPU/GPU choice for FE and scoring, and the fallback: the one
//!   place a batch of documents becomes scores.
//! - [`import`]: LightGBM and XGBoost tree ensembles as rankers.

pub mod cpu;
pub mod engine;
pub mod error;
pub mod fe;
pub mod format;
pub mod freeform;
pub mod gpu;
pub mod import;
pub mod model;
pub mod plan;
pub mod store;
pub mod synth;

pub use error::{cut_input, cut_to, RankerError};
