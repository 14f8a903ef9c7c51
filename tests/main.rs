//! Integration tests: one binary, one module per area.
mod cli;
mod formats;
mod http;
mod openapi;
mod parity;
mod rank_fused;
mod search;
mod selection;
mod selection_gpu;
mod shards;
mod slow_clients;
