#!/usr/bin/env bash
# Builds, on the development machine, everything the GPU machine runs (it has no Rust toolchain):
# the release binary and the test executables, stripped, into carry/ (git-ignored; the device
# tool carries at most 64 MiB). Then, on the GPU machine, `bash scripts/gpu-run.sh` runs them.
#
#   bash scripts/gpu-suite.sh            # then: device run, carry ["carry"], command "bash scripts/gpu-run.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
rm -rf carry
mkdir -p carry/tests
cp "${CARGO_TARGET_DIR:-target}/release/rankserve" carry/
cargo test --release --locked --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    msg = json.loads(line)
    exe = msg.get("executable")
    if msg.get("reason") == "compiler-artifact" and exe and msg["profile"]["test"]:
        kind = msg["target"]["kind"][0]
        name = "lib" if kind == "lib" else msg["target"]["name"]
        shutil.copy(exe, "carry/tests/" + name)
        print("carry/tests/" + name)
'
# The criterion benchmarks (run there as `carry/benches/NAME --bench`).
mkdir -p carry/benches
cargo bench --locked --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    msg = json.loads(line)
    exe = msg.get("executable")
    if msg.get("reason") == "compiler-artifact" and exe and msg["target"]["kind"] == ["bench"]:
        shutil.copy(exe, "carry/benches/" + msg["target"]["name"])
        print("carry/benches/" + msg["target"]["name"])
'
strip carry/rankserve carry/tests/* carry/benches/*
if [ -d .whl ]; then cp -r .whl carry/whl; fi
du -sh carry
