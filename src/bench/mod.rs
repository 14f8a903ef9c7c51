//! Benchmark drivers, their tables and plots: request-log replay against a server ([`replay`]),
//! the ranking stage on the CPU and the GPU ([`ranking`]), the document stage per query
//! ([`selection`]) and under concurrent clients in process ([`clients`]), and the forward
//! index's hit requests for ranking ([`hits`]).

pub mod clients;
pub mod hits;
pub mod ranking;
pub mod replay;
pub mod selection;
