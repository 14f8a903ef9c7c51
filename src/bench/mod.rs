//! bench: placeholder until its issue lands.

pub mod replay;
