//! Integration tests: one binary, one module per area.
mod cli;
mod client_example;
mod formats;
mod http;
mod parity;
mod search;
mod selection;
mod selection_gpu;
mod slow_clients;
