//! The device runtime, knowing nothing of rankers or postings: the CUDA context, NVRTC
//! modules, buffers and pools, the batching queue and power sampling (as they land), and a
//! byte-budgeted LRU cache generic over what it holds.
//!
//! - [`lru`]: the byte-budgeted LRU cache. The ranker cache (CPU-side in `server`, GPU-side in
//!   `rank/gpu`) and the posting cache (`select/gpu`) are instances of it.

pub mod lru;
