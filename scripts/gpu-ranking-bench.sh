#!/usr/bin/env bash
# The ranking-stage measurements of issue 4, on the GPU machine, over what scripts/gpu-suite.sh
# put in carry/ (the LightGBM wheel included, from .whl/):
#   1. the tests with RANKSERVE_REQUIRE_GPU=1 and `rankserve bench ranking` (scripts/gpu-run.sh);
#   2. the LightGBM peer (scripts/lightgbm_peer.py), its model imported and benchmarked by
#      rankserve on the same rows, scores checked against LightGBM's;
#   3. with --power, the power runs instead of 1 and 2 (they take minutes).
# Everything is logged under $OUT/work, then packed into $OUT/ranking-results.tar.gz (the device
# tool brings back at most 8 files); the tables are printed last.
#
#   device run, carry ["carry"]: bash scripts/gpu-ranking-bench.sh [--power]
set -uo pipefail
cd "$(dirname "$0")/.."
final=${OUT:-/tmp/rankserve-out}
out=$final/work
mkdir -p "$out"
export OUT=$out
pack() { tar czf "$final/ranking-results.tar.gz" -C "$out" . && rm -rf "$out"; }
export PYTHONUNBUFFERED=1
if [ "${1:-}" = --power ]; then
  carry/rankserve bench ranking --power --power-only --power-seconds "${POWER_SECONDS:-20}" \
    --out "$out/power" 2>&1 | tee "$out/power.log"
  pack
  exit 0
fi
# Time limits keep the whole call inside one device command's limit, packing included.
timeout "${RUN_TIMEOUT:-130}" bash scripts/gpu-run.sh 'bench ranking --out "$OUT/bench"' 2>&1 | tee "$out/run.log"
peer_ok=0
if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site carry/whl/*.whl >"$out/pip.log" 2>&1; then
  export PYTHONPATH=/tmp/site
  if timeout "${PEER_TIMEOUT:-70}" python3 scripts/lightgbm_peer.py --out .peer --threads 16 --reps 3 2>&1 | tee "$out/peer.log"; then
    peer_ok=1
  fi
else
  echo "LightGBM wheel did not install:"; tail -5 "$out/pip.log"
fi
if [ $peer_ok = 1 ]; then
  carry/rankserve ranker import --format lightgbm --in .peer/model.json --out .peer/lightgbm.json &&
  timeout 40 carry/rankserve bench ranking --ranker .peer/lightgbm.json --features .peer/rows.csv \
    --expect .peer/scores.txt --docs 1,10,100,1000,10000 --threads 16 --out "$out/peer" \
    2>&1 | tee "$out/peer-bench.log"
fi
echo "== tables"
sed -n '/^latency per batch/,$p' "$out"/bench-*.log
if [ $peer_ok = 1 ]; then cat .peer/peer.json; sed -n '/^latency per batch/,$p' "$out/peer-bench.log"; fi
pack
exit 0
