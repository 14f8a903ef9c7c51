//! Benchmark drivers and their tables: request-log replay against a server ([`replay`]) and
//! the document stage per query ([`selection`]).

pub mod replay;
pub mod selection;
