#!/usr/bin/env bash
# The ranking-stage measurements of issue 4, on the GPU machine, over what scripts/gpu-suite.sh
# put in carry/ (the LightGBM wheel included, from .whl/: fetch it here once with the device README's
# `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl lightgbm`).
# Phases, in the order given (default: bench peer):
#   bench  the tests with RANKSERVE_REQUIRE_GPU=1 and `rankserve bench ranking` (scripts/gpu-run.sh);
#   peer   the LightGBM peer (scripts/lightgbm_peer.py), its model imported and benchmarked by
#          rankserve on the same rows, scores checked against LightGBM's;
#   power  idle power, then each ranker under constant load (POWER_SECONDS, default 20 s each).
# Everything is logged under $OUT/work, then packed into $OUT/ranking-results.tar.gz (the device
# tool brings back at most 8 files); the tables are printed last.
#
#   device run, carry ["carry"]: bash scripts/gpu-ranking-bench.sh [bench] [peer] [power]
set -uo pipefail
cd "$(dirname "$0")/.."
final=${OUT:-/tmp/rankserve-out}
out=$final/work
mkdir -p "$out"
export OUT=$out PYTHONUNBUFFERED=1
tables=()
for phase in "${@:-bench peer}"; do for phase in $phase; do
  case $phase in
  bench)
    # Time limits keep the whole call inside one device command's limit, packing included.
    timeout "${RUN_TIMEOUT:-130}" bash scripts/gpu-run.sh 'bench ranking --out "$OUT/bench"' 2>&1 | tee "$out/run.log"
    tables+=("$out"/bench-*.log)
    ;;
  peer)
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site carry/whl/*.whl >"$out/pip.log" 2>&1 &&
      PYTHONPATH=/tmp/site timeout "${PEER_TIMEOUT:-70}" python3 scripts/lightgbm_peer.py \
        --out .peer --threads 16 --reps 3 2>&1 | tee "$out/peer.log"; then
      cp .peer/peer.json "$out/"
      carry/rankserve ranker import --format lightgbm --in .peer/model.json --out .peer/lightgbm.json &&
      timeout 40 carry/rankserve bench ranking --ranker .peer/lightgbm.json --features .peer/rows.csv \
        --expect .peer/scores.txt --docs 1,10,100,1000,10000 --threads 16 --out "$out/peer" \
        2>&1 | tee "$out/peer-bench.log"
      tables+=("$out/peer.json" "$out/peer-bench.log")
    else
      echo "LightGBM peer failed"; tail -5 "$out/pip.log"
    fi
    ;;
  power)
    carry/rankserve bench ranking --power --power-only --power-seconds "${POWER_SECONDS:-20}" \
      --out "$out/power" 2>&1 | tee "$out/power.log"
    tables+=("$out/power.log")
    ;;
  *) echo "unknown phase $phase (bench, peer, power)"; exit 2 ;;
  esac
done; done
echo "== tables"
for t in "${tables[@]}"; do
  case $t in *.json) cat "$t"; echo ;; *) sed -n '/^latency per batch\|^power\|^reference/,$p' "$t" ;; esac
done
tar czf "$final/ranking-results.tar.gz" -C "$out" . && rm -rf "$out"
exit 0
