//! Benchmark drivers, their tables and plots: request-log replay against a server ([`replay`]),
//! the ranking stage on the CPU and the GPU ([`ranking`]) and the document stage per query
//! ([`selection`]).

pub mod ranking;
pub mod replay;
pub mod selection;
