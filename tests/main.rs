//! Integration tests: one binary, one module per area.

/// The `rankserve` binary's allocator, so that the timings some tests print (`parity`'s fused
/// path from a request's body, say) measure what the server runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cli;
mod formats;
mod http;
mod http_errors;
mod http_gpu;
mod live;
mod openapi;
mod parity;
mod rank_fused;
mod replay;
mod search;
mod search_gpu;
mod selection;
mod selection_gpu;
mod shards;
mod slow_clients;
mod uploads;
