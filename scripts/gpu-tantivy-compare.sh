#!/usr/bin/env bash
# Issue 21, item 3: on the GPU machine, rankserve (GPU + the host's cores) against the Tantivy
# crate (peers/tantivy) on the same cores, on one synthetic corpus of $DOCS documents (default
# 10 M): one thread, and $THREADS client threads (default 16).
#
# The carry folder ($CARRY, default carry) holds the stripped release binaries and the scripts:
#   $CARRY/rankserve            target/release/rankserve, stripped
#   $CARRY/tantivy-runner       scripts/build-tantivy-peer.sh --strip
#   $CARRY/gpu-tantivy-compare.sh                            (a copy of scripts/*)
# and the command, from the repository root there, is
#   OUT=$OUT CARRY=carry-NAME bash carry-NAME/gpu-tantivy-compare.sh
# Logs go under $OUT (default a new temporary folder); a short table is printed last.
# One device command may run 10 minutes: give WORK a fixed folder that survives between calls (on
# the device machine, an ignored folder of the working tree such as target/w21t) and split the
# work over calls on the warm machine. Tantivy's index of 10 M documents does not fit one call
# (H100 host, 16 threads, 2026-11-27: 8 segments committed after ≈ 6 min, then the merge into
# one segment still running 4 min later; the corpus took 13.5–15.0 s, rankserve's build
# 86–90 s): with TANTIVY_DETACHED=1 the build step starts it, right after the corpus, in a
# session of its own, which outlives the call while the machine stays warm (the next call within
# its 30 s), and STEPS=await waits for it until the call has run CALL_S seconds (default 560;
# call it again until it prints "tantivy index ready"). So: STEPS="build await", STEPS=await as
# often as needed, then STEPS=run (both sets ≈ 440 s at 10 M documents, or one SETS / MODES per
# call). Machines go back after 30 minutes held, WORK with them: the whole sequence needs
# ≈ 25 minutes of one machine, calls back to back. A step skips what WORK already holds; run
# refuses without Tantivy's finished index. COUNT_HITS=1 also
# writes each query's top-k and hit count on both sides (an exhaustive count per query, untimed).
#
# What runs, per query set (normal: `queries synth`; heavy: the $QUERIES AND queries with the
# most hits among 10 × $QUERIES synthesized) and mode (AND, OR), top-$K:
# - one thread, passes over the query set ($PASSES timed after a warm-up pass, a query's time its
#   median), k1 = 1.2, b = 0.75 on both sides: `rankserve bench selection --gpu` (CPU alone, GPU
#   alone and the hybrid, taking turns on each query) and `tantivy-runner search --threads 1`;
# - $THREADS clients: Tantivy, $THREADS threads in one process each running one query at a time
#   (throughput = queries / pass wall time, latency per query as above); rankserve the same way
#   in process (`bench selection --clients $THREADS`: client threads through the server's
#   selection engine, CPU alone, GPU alone and the scheduler's choice under load, Tantivy's BM25
#   parameters), and as a server: `rankserve serve` (backend auto: the hybrid) sent a search log
#   of the query set (`rankserve requests search`, BM25 ranking only, no ranker, MessagePack) by
#   `rankserve replay` with $THREADS keep-alive clients over loopback HTTP, closed loop,
#   $REPLAY_S seconds (default 5) after 2 untimed — whose latencies include an HTTP round trip,
#   whose client threads share the cores with the server, and which scores with the server's own
#   BM25 parameters (DESIGN §5's k1 = 0.9, b = 0.4, which a request cannot change); the server's
#   own p50 / p99 (`timings.total_us`) are printed beside the client's.
# Sizes: DOCS (10000000), QUERIES (1000), K (10), PASSES (5), THREADS (16), CODEC (ef), REPLAY_S (5);
# MODES ("and or"), SETS ("normal heavy"), TANTIVY_HEAP_MB (4096: the index writer's budget, split
# between its threads); WORK (a temporary folder: the corpus, ~10 GB at 10 M documents, is deleted
# once both indexes are built; the indexes, ~8 GB for rankserve and ~4 GB for Tantivy at 10 M,
# stay until the end). At 1 M documents on the 2-core development machine (loaded by other
# builds), rankserve's build took 154 s (47 s of CPU), Tantivy's 450 s (188 s of CPU, then one
# merge into one segment).
set -uo pipefail
carry=${CARRY:-carry}
out=${OUT:-$(mktemp -d)}
work=${WORK:-$(mktemp -d)}
mkdir -p "$out" "$work"
DOCS=${DOCS:-10000000}
QUERIES=${QUERIES:-1000}
K=${K:-10}
PASSES=${PASSES:-5}
THREADS=${THREADS:-16}
CODEC=${CODEC:-ef}
rs="$carry/rankserve"
tv="$carry/tantivy-runner"
started=$(date +%s.%N)
log() { echo "$*" | tee -a "$out/steps.log"; }
clock() { date +%s.%N; }
since() { awk -v now="$(clock)" -v then="$1" 'BEGIN { printf "%.1f", now - then }'; }

{ nproc; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; } \
  | tee "$out/machine.txt"
steps=" ${STEPS:-build run} "
tantivy_build() {
  local t
  t=$(clock)
  "$tv" index --corpus "$work/corpus.jsonl" --out "$work/tantivy" --threads "$(nproc)" \
    --heap-mb "${TANTIVY_HEAP_MB:-4096}" \
    > "$out/tantivy-build.json" 2> "$out/tantivy-build.log" \
    && log "tantivy-runner index ($(nproc) threads, merged to one segment): $(since "$t") s, $(du -sh "$work/tantivy" | cut -f1)" \
    && cp "$out/tantivy-build.json" "$work/tantivy.done" \
    && { [ ! -s "$work/idx/index.json" ] || rm -f "$work/corpus.jsonl"; }
}
tantivy_start() {
  if [ "${TANTIVY_DETACHED:-0}" = 1 ]; then
    # Its log goes to WORK: $OUT is emptied before each call.
    out=$work setsid bash -c "$(declare -f clock since log tantivy_build); \
      tv=$tv work=$work out=$work TANTIVY_HEAP_MB=${TANTIVY_HEAP_MB:-4096} tantivy_build" \
      < /dev/null > /dev/null 2>&1 &
    log "tantivy-runner index started in a session of its own (its log in $work)"
  else
    tantivy_build
  fi
}
if [[ $steps == *" build "* ]]; then
  if [ ! -s "$work/corpus.jsonl" ] && { [ ! -s "$work/idx/index.json" ] || [ ! -e "$work/tantivy" ]; }; then
    t=$(clock)
    "$rs" corpus synth --docs "$DOCS" --seed 1 --out "$work/corpus.jsonl" > "$out/corpus.log" 2>&1
    log "corpus synth, $DOCS documents: $(since "$t") s, $(du -sh "$work/corpus.jsonl" | cut -f1)"
  fi
  # Detached, Tantivy's build (the longest step) starts first and shares the cores with
  # rankserve's build and the query sets.
  [ "${TANTIVY_DETACHED:-0}" = 1 ] && [ ! -e "$work/tantivy" ] && tantivy_start
  if [ ! -s "$work/idx/index.json" ]; then
    t=$(clock)
    "$rs" index build --corpus "$work/corpus.jsonl" --out "$work/idx" --codec "$CODEC" --json \
      > "$out/rankserve-build.json" 2> "$out/rankserve-build.log"
    log "rankserve index build ($CODEC, every core): $(since "$t") s, $(du -sh "$work/idx" | cut -f1)"
  fi
  if [ ! -s "$work/heavy.txt" ]; then
    "$rs" queries synth --index "$work/idx" --count "$QUERIES" --seed 1 --out "$work/normal.txt"
    "$rs" queries synth --index "$work/idx" --count $((10 * QUERIES)) --seed 2 \
      --out "$work/pool.txt"
    "$rs" bench selection --index "$work/idx" --queries "$work/pool.txt" --mode and --k "$K" \
      --k1 1.2 --b 0.75 --reps 1 --timing back-to-back --out "$work/pool.jsonl" > /dev/null
    python3 - "$work/pool.jsonl" "$QUERIES" > "$work/heavy.txt" <<'EOF'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
runs.sort(key=lambda r: -r["hits"])
for r in runs[: int(sys.argv[2])]:
    print(r["query"])
EOF
  fi
  [ -e "$work/tantivy" ] || tantivy_start
fi
if [[ $steps == *" await "* ]]; then
  t=$(clock)
  while [ ! -e "$work/tantivy.done" ] \
    && awk -v s="$(since "$started")" -v m="${CALL_S:-560}" 'BEGIN { exit !(s < m) }'; do
    sleep 5
  done
  if [ -e "$work/tantivy.done" ]; then
    log "tantivy index ready: $(cat "$work/tantivy.done")"
  else
    log "tantivy index still building after $(since "$t") s"
  fi
fi
[[ $steps == *" run "* ]] || exit 0
if [ ! -e "$work/tantivy.done" ]; then
  log "Tantivy's index is not finished (no $work/tantivy.done): STEPS=await first"
  exit 1
fi

port=18091
"$rs" serve --index "$work/idx" --addr "127.0.0.1:$port" > "$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$port/healthz" > /dev/null 2>&1 && break
  sleep 1
done

summary=()
for set in ${SETS:-normal heavy}; do
  for mode in ${MODES:-and or}; do
    q="$work/$set.txt"
    tag="$set-$mode"
    # Per-query top-k and hit counts (counted untimed, exhaustively: minutes for OR at 10 M).
    rs_hits=() tv_hits=()
    if [ "${COUNT_HITS:-0}" = 1 ]; then
      rs_hits=(--out "$out/rankserve-$tag.jsonl")
      tv_hits=(--count --out "$out/tantivy-$tag.jsonl")
    fi
    "$rs" bench selection --index "$work/idx" --queries "$q" --mode "$mode" --k "$K" \
      --k1 1.2 --b 0.75 --reps "$PASSES" --gpu --clients "$THREADS" "${rs_hits[@]}" \
      --gpu-out "$out/rankserve-gpu-$tag.jsonl" > "$out/rankserve-1thread-$tag.log" 2>&1
    "$tv" search --index "$work/tantivy" --queries "$q" --mode "$mode" --k "$K" \
      --passes "$PASSES" --threads 1 "${tv_hits[@]}" \
      --summary "$out/tantivy-1thread-$tag.json" > /dev/null 2> "$out/tantivy-1thread-$tag.log"
    "$tv" search --index "$work/tantivy" --queries "$q" --mode "$mode" --k "$K" \
      --passes "$PASSES" --threads "$THREADS" --summary "$out/tantivy-${THREADS}threads-$tag.json" \
      > /dev/null 2> "$out/tantivy-${THREADS}threads-$tag.log"
    searches="$work/search-$tag.msgpack"
    "$rs" requests search --queries "$q" --mode "$mode" --k "$K" --candidates "$K" \
      --out "$searches" 2> "$out/rankserve-${THREADS}clients-$tag.log"
    "$rs" replay --url "http://127.0.0.1:$port" --log "$searches" --concurrency "$THREADS" \
      --duration 2 > /dev/null 2>> "$out/rankserve-${THREADS}clients-$tag.log"
    "$rs" replay --url "http://127.0.0.1:$port" --log "$searches" --concurrency "$THREADS" \
      --duration "${REPLAY_S:-5}" --json > "$out/rankserve-${THREADS}clients-$tag.json" \
      2>> "$out/rankserve-${THREADS}clients-$tag.log"
    summary+=("$tag")
  done
done

echo
echo "one thread, µs per query, mean / p50 / p99 ($PASSES passes; rankserve: CPU, GPU, hybrid rows of its table):"
for tag in "${summary[@]}"; do
  echo "== $tag"
  python3 - "$out/tantivy-1thread-$tag.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))["us"]
print(f"| tantivy | {s['mean']:.1f} | {s['p50']:.1f} | {s['p99']:.1f} |")
EOF
  grep -E '^\| (CPU|GPU|hybrid) \|' "$out/rankserve-1thread-$tag.log" \
    | awk -F'|' '{printf "| rankserve %s | %s | %s | %s |\n", $2, $3, $4, $6}'
done
echo
echo "$THREADS clients: throughput and latency (tantivy and rankserve in-process threads; rankserve also over HTTP, hybrid):"
for tag in "${summary[@]}"; do
  echo "== $tag"
  python3 - "$out/tantivy-${THREADS}threads-$tag.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"tantivy: {s['qps_median_pass']:.0f} queries/s, p50 {s['us']['p50']:.1f} µs, p99 {s['us']['p99']:.1f} µs")
EOF
  grep -E '^\| (cpu|gpu|auto) \|' "$out/rankserve-1thread-$tag.log" | sed 's/^/rankserve in process: /'
  python3 - "$out/rankserve-${THREADS}clients-$tag.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
lat, server = r["latency_us"], r["server_total_us"]
selected = ", ".join(f"{b} {n}" for b, n in sorted(r["backends"].get("select", {}).items()))
print(f"rankserve over HTTP: {r['throughput_rps']:.0f} queries/s, client p50 {lat['p50']} µs, "
      f"p90 {lat['p90']} µs, p99 {lat['p99']} µs; server p50 {server['p50']} µs, "
      f"p99 {server['p99']} µs; selected by {selected}; errors {r['errors'] or 'none'}")
EOF
done
