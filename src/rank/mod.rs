//! The ranking stage: ranker models and their files, feature extraction (FE), model-input
//! transforms (MIT), model evaluation (ME: trees and NN layers), on the CPU (the reference).
//!
//! - [`fe`]: feature extraction over hit requests.
//! - [`model`]: the validated in-memory ranker, shared by every backend.
//! - [`format`]: the native ranker file (read, validate, write); [`error`]: its errors.
//! - [`cpu`]: the CPU evaluator (reference and fast plan).
//! - [`freeform`]: the FreeForm expression parser and evaluator.
//! - [`import`]: LightGBM and XGBoost tree ensembles as rankers.

pub mod cpu;
pub mod error;
pub mod fe;
pub mod format;
pub mod freeform;
pub mod import;
pub mod model;

pub use error::RankerError;
