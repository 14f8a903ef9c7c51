#!/usr/bin/env bash
# Runs on the GPU machine, over what scripts/gpu-suite.sh put in carry/: every test executable
# with RANKSERVE_REQUIRE_GPU=1 (GPU tests fail instead of skipping), then the benchmarks given as
# arguments (each a rankserve command line). Logs go under $OUT; a short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/rankserve-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,power.draw --format=csv | tee "$out/gpu.txt"
export RANKSERVE_REQUIRE_GPU=1 RUST_BACKTRACE=1
# The CLI tests run the binary where cargo built it (CARGO_BIN_EXE_rankserve, fixed at build time).
mkdir -p target/release && cp carry/rankserve target/release/rankserve
summary=()
for t in carry/tests/*; do
  name=$(basename "$t")
  # Test executables look for fixtures relative to the crate root, where this script runs.
  if "$t" --test-threads 4 >"$out/test-$name.log" 2>&1; then status=pass; else status=FAIL; fi
  passed=$(grep -Eo '[0-9]+ passed' "$out/test-$name.log" | awk '{s+=$1} END {print s+0}')
  failed=$(grep -Eo '[0-9]+ failed' "$out/test-$name.log" | awk '{s+=$1} END {print s+0}')
  summary+=("tests/$name: $status ($passed passed, $failed failed)")
  [ "$status" = FAIL ] && grep -E "^(test .* FAILED|---- |thread .* panicked)" -A4 "$out/test-$name.log" | head -40
done
# The fallback path: every GPU call fails, every answer must still be the CPU's.
if RANKSERVE_FAULT_GPU=1 carry/tests/main gpu_fault --test-threads 1 >"$out/test-fault.log" 2>&1; then
  summary+=("fault injection (RANKSERVE_FAULT_GPU=1): pass")
else
  summary+=("fault injection (RANKSERVE_FAULT_GPU=1): FAIL"); tail -30 "$out/test-fault.log"
fi
for cmd in "$@"; do
  log="$out/bench-$(echo "$cmd" | tr -c 'A-Za-z0-9' '_' | cut -c1-60).log"
  echo "== rankserve $cmd" | tee "$log"
  # eval, so that a command can name $OUT (quoted by the caller) and other variables.
  eval "carry/rankserve $cmd" 2>&1 | tee -a "$log"
done
printf '%s\n' "${summary[@]}"
