//! The ranking stage on the GPU, built on the device runtime in [`crate::gpu`]: device layouts
//! of rankers and the launches that evaluate them. Results must match [`crate::rank`]'s CPU
//! reference within DESIGN §2's tolerances (tree leaf choices identical), and feature extraction
//! ([`fe`] on the device, from hit layouts built on the host by [`layout`]), whose catalogue
//! values equal the CPU's bit for bit.

mod batch;
pub mod cache;
pub mod crossover;
pub mod fe;
pub mod layout;
pub mod ranker;
mod rows;
pub mod trees;
