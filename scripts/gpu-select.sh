#!/usr/bin/env bash
# On the GPU machine, from the repository root, after `bash scripts/gpu-suite.sh` here (device
# run, carry ["carry"], command "bash scripts/gpu-select.sh"): the selection parity tests with
# the GPU required, then `rankserve bench selection --gpu` (decode speed per codec, GPU in one
# launch vs one CPU core; AND and OR latency CPU-only vs GPU-only vs hybrid on the same queries,
# cache warm) on a synthetic index of $DOCS documents built in the call. CARRY names the folder
# holding the binaries (default carry), TESTS the test executable (default $CARRY/tests/main);
# logs go to $OUT when it is set (bench.log, and per codec and mode a JSON line per query with
# its dfs and CPU, GPU and hybrid times: the scheduler's constants are fitted from these).
# CODECS (default "ef pfor"), REPS (default 5) and CACHE_BYTES (the GPU posting cache's budget,
# default the command's 1 GiB) size the run; PARITY=0 skips the tests (a large-corpus run);
# MODES (default "and or and-or") picks the query modes; BENCH_ARGS adds arguments to every
# `bench selection` (e.g. "--merge-path-min-df 0"); RATIO=1 adds two-term AND queries over a range of list-length ratios (scripts/ratio-queries.py)
# and their CPU-vs-GPU table, and the same queries with every GPU step by binary search, merge
# path and skip entries (`--step-ways`).
set -uo pipefail
carry=${CARRY:-carry}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
tests=${TESTS:-$carry/tests/main}
# The CLI tests run the binary where cargo built it (CARGO_BIN_EXE_rankserve, fixed at build time).
mkdir -p target/release && cp "$carry/rankserve" target/release/rankserve
if [ "${PARITY:-1}" != 0 ]; then
  RANKSERVE_REQUIRE_GPU=1 "$tests" selection search --test-threads 4 2>&1 | tee "$out/parity.log" | tail -20
  RANKSERVE_REQUIRE_GPU=1 RANKSERVE_FAULT_GPU=1 "$tests" gpu_search_selects gpu_fault \
    --test-threads 1 2>&1 | tee -a "$out/parity.log" | tail -4
fi
# On the H100 machine (2026-11-23, 18:34 UTC) 10 000 000 documents took 191 s for the corpus, both
# indexes and the queries, then 33–55 s per benchmark (REPS=3): 366 s in all.
DOCS=${DOCS:-500000}
QUERIES=${QUERIES:-500}
CODECS=${CODECS:-ef pfor}
cache=()
[ -n "${CACHE_BYTES:-}" ] && cache=(--gpu-posting-cache-bytes "$CACHE_BYTES")
work=$(mktemp -d)
start=$(date +%s)
"$carry/rankserve" corpus synth --docs "$DOCS" --seed 1 --out "$work/corpus.jsonl" 2>&1 \
  | tail -1 | tee -a "$out/build.log"
# EF keeps the forward index: `queries synth` draws the query terms from it.
"$carry/rankserve" index build --corpus "$work/corpus.jsonl" --out "$work/ef" --codec ef 2>&1 \
  | tail -2 | tee -a "$out/build.log"
if [[ " $CODECS " == *" pfor "* ]]; then
  "$carry/rankserve" index build --corpus "$work/corpus.jsonl" --out "$work/pfor" --codec pfor \
    --no-forward 2>&1 | tail -2 | tee -a "$out/build.log"
fi
rm "$work/corpus.jsonl"
"$carry/rankserve" queries synth --index "$work/ef" --count "$QUERIES" --out "$work/queries.txt"
echo "corpus, index builds, queries: $(($(date +%s) - start)) s" | tee -a "$out/build.log"
for codec in $CODECS; do
  for mode in ${MODES:-and or and-or}; do
    "$carry/rankserve" bench selection --index "$work/$codec" --queries "$work/queries.txt" \
      --mode "$mode" --reps "${REPS:-5}" "${cache[@]}" ${BENCH_ARGS:-} --gpu \
      --gpu-out "$out/queries-$codec-$mode.jsonl" 2>&1 | tee -a "$out/bench.log"
    echo "after $codec $mode: $(($(date +%s) - start)) s" | tee -a "$out/build.log"
  done
done
# The intersection crossover by length ratio: two-term AND queries from 1 to ~4 x 10^4.
if [ "${RATIO:-0}" = 1 ]; then
  python3 scripts/ratio-queries.py > "$work/ratio.txt"
  "$carry/rankserve" bench selection --index "$work/ef" --queries "$work/ratio.txt" --mode and \
    --reps "${REPS:-5}" "${cache[@]}" ${BENCH_ARGS:-} --gpu --gpu-out "$out/ratio-ef-and.jsonl" \
    --step-ways > "$out/ratio.log" 2>&1
  python3 scripts/ratio-queries.py --table "$out/ratio-ef-and.jsonl" | tee "$out/ratio.md"
  sed -n '/^intersection by length ratio/,/^GPU posting cache/p' "$out/ratio.log" | tee -a "$out/ratio.md"
fi
echo "total: $(($(date +%s) - start)) s"
