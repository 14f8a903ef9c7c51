//! Fuzzing of every decoder that untrusted bytes reach: structure-aware property tests that
//! start from valid inputs, mutate them (tree edits: wrong types, extreme numbers, removed and
//! duplicated fields, deep nesting; byte edits: truncation, flips, forged lengths) and assert
//! that nothing panics, that the decode's peak heap stays under a bound proportional to the
//! input, and that a refusal names its place (field path, line and column, byte offset, file).
//!
//! Its own test binary, for its counting global allocator. Plain `cargo test --test fuzz` runs
//! a few thousand cases with a fixed seed; `RANKSERVE_FUZZ_CASES=N RANKSERVE_FUZZ_SEED=S` runs
//! `N` cases per target from seed `S` (docs/operations.md, "Fuzzing").

mod support;

mod bodies;
mod ciff;
mod index_files;
mod rankers;

#[global_allocator]
static COUNTING: support::Counting = support::Counting;
