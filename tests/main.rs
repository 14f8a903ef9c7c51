//! Integration tests: one binary, one module per area.
mod formats;
mod http;
