//! Benchmark drivers, their tables and plots: request-log replay against a server ([`replay`])
//! and the ranking stage on the CPU and the GPU ([`ranking`]).

pub mod ranking;
pub mod replay;
