//! The ranking stage: ranker models and their files, feature extraction (FE), model-input
//! transforms (MIT), model evaluation (ME: trees and NN layers), on the CPU (the reference).
//!
//! - [`fe`]: feature extraction over hit requests.
//! - [`model`]: the validated in-memory ranker, shared by every backend.

pub mod fe;
pub mod model;
