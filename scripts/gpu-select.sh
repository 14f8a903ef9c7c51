#!/usr/bin/env bash
# On the GPU machine, from the repository root, after `bash scripts/gpu-suite.sh` here (device
# run, carry ["carry"], command "bash scripts/gpu-select.sh"): the selection parity tests with
# the GPU required, then decode speed (GPU vs one CPU core) on a synthetic index of $DOCS
# documents built in the call. CARRY names the folder holding the binaries (default carry).
set -uo pipefail
carry=${CARRY:-carry}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
RANKSERVE_REQUIRE_GPU=1 "$carry/tests/main" selection --test-threads 4 2>&1 | tail -25
# 1 000 000 documents did not finish corpus + one index build within 155 s on the H100 machine
# (2026-11-23); 200 000 take about 21 s to index on 2 cores here.
DOCS=${DOCS:-200000}
work=$(mktemp -d)
start=$(date +%s)
"$carry/rankserve" corpus synth --docs "$DOCS" --seed 1 --out "$work/corpus.jsonl" 2>&1 | tail -1
for codec in ef pfor; do
  "$carry/rankserve" index build --corpus "$work/corpus.jsonl" --out "$work/$codec" --codec "$codec" \
    --no-forward 2>&1 | tail -1
  RANKSERVE_REQUIRE_GPU=1 RANKSERVE_BENCH_INDEX="$work/$codec" "$carry/tests/main" \
    selection_gpu::decode_speed --ignored --nocapture --test-threads 1 2>&1 | grep decode_speed
done
echo "index builds + decode timing: $(($(date +%s) - start)) s"
