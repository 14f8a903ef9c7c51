#!/usr/bin/env bash
# Interleaved A/B of /v1/search under concurrent clients (issue 6: the scheduler with the
# processors' queues): builds a synthetic corpus, its EF index and queries with the first binary,
# starts one server per binary on that index (all at once, each on its own port), then for each
# round, mode and client count lets the binaries take turns running scripts/search_latency.py
# (BM25 order, no ranker). BINS lists "name=path" pairs; DOCS (default 3 000 000), QUERIES
# (500), MODES ("or and_or"), CLIENTS ("1 4 16"), BACKENDS ("auto"), ROUNDS (2) size it; SECONDS_PER_RUN
# runs each point closed-loop for that long instead of one pass over the queries, and then each
# line also says how busy the host's cores were and the devices' seconds in turns per second
# (summed over devices) in that window. Logs
# and every table go to $OUT; a line per run is printed last. ARGS_<name> adds serve flags to
# one server (e.g. ARGS_alone="--gpu-select-batch 1", the same binary without GPU batches); at the
# end each server's GPU batch sizes (queries per batch, from /metrics) are printed.
#
#   BINS="before=carry/old/rankserve after=carry/rankserve" OUT=$OUT bash scripts/search_load_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
read -r -a bins <<< "${BINS:?BINS=\"name=path ...\"}"
first=${bins[0]#*=}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
start=$(date +%s)
bash "$(dirname "$0")/synth_index.sh" "$first" "$work"
echo "index and queries: $(($(date +%s) - start)) s"

port=18600
for bin in "${bins[@]}"; do
  port=$((port + 1))
  args=ARGS_${bin%%=*}
  # shellcheck disable=SC2086 # the flags are words
  "${bin#*=}" serve --index "$work/ef" --addr "127.0.0.1:$port" --backend auto ${!args:-} \
    >"$out/serve-${bin%%=*}.log" 2>&1 &
done
for p in $(seq 18601 "$port"); do
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$p/readyz" >/dev/null && break
    sleep 0.2
  done
done
echo "servers ready: $(($(date +%s) - start)) s"
summary=()
for round in $(seq "${ROUNDS:-2}"); do
  for mode in ${MODES:-or and_or}; do
    for clients in ${CLIENTS:-1 4 16}; do
      for backend in ${BACKENDS:-auto}; do
        p=18600
        for bin in "${bins[@]}"; do
          p=$((p + 1))
          log="$out/${bin%%=*}-$mode-$clients-$backend-$round.log"
          python3 scripts/search_latency.py --url "http://127.0.0.1:$p" --queries "$work/queries.txt" \
            --rankers none --candidates 100 --mode "$mode" --backend "$backend" \
            --concurrency "$clients" ${SECONDS_PER_RUN:+--seconds "$SECONDS_PER_RUN"} > "$log" 2>&1
          row=$(tail -1 "$log" | awk '{printf "qps %s p50 %s p90 %s p99 %s select p50 %s p99 %s total p50 %s p99 %s host %s turns %s s/s %s %s", $4, $5, $6, $7, $8, $9, $13, $14, $15, $16, $17, $18}')
          summary+=("round $round $mode clients $clients $backend ${bin%%=*}: $row")
        done
      done
    done
  done
done
echo "total: $(($(date +%s) - start)) s"
p=18600
for bin in "${bins[@]}"; do
  p=$((p + 1))
  batches=$(curl -sf "http://127.0.0.1:$p/metrics" | grep -E '^rankserve_select_gpu_batch_queries_(sum|count)' | awk '{printf "%s %s ", $1, $2}')
  summary+=("${bin%%=*} GPU batches: ${batches:-none}")
done
printf '%s\n' "${summary[@]}"
