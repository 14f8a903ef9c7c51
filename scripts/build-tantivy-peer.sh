#!/usr/bin/env bash
# Builds the Tantivy peer (peers/tantivy: its own crate and Cargo.lock, outside the main crate's
# build) in release and prints the binary's path. The main crate's `cargo test` never builds it.
#   CARGO_TARGET_DIR=/some/dir scripts/build-tantivy-peer.sh [--strip]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/peers/tantivy/target}
CARGO_TARGET_DIR=$target cargo build --release --locked \
    --manifest-path "$root/peers/tantivy/Cargo.toml" >&2
bin=$target/release/tantivy-runner
if [[ ${1:-} == --strip ]]; then
    strip "$bin"
fi
echo "$bin"
