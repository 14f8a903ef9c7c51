//! Benchmark drivers, their tables and plots: request-log replay against a server ([`replay`]),
//! the ranking stage on the CPU and the GPU ([`ranking`]), the document stage per query
//! ([`selection`]) and under concurrent clients in process ([`clients`]).

pub mod clients;
pub mod ranking;
pub mod replay;
pub mod selection;
