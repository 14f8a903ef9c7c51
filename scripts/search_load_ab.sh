#!/usr/bin/env bash
# Interleaved A/B of /v1/search under concurrent clients (issue 6: the scheduler with the
# processors' queues): builds a synthetic corpus, its EF index and queries with the first binary,
# starts one server per binary on that index (all at once, each on its own port), then for each
# round, mode and client count lets the binaries take turns being replayed to: a search log of
# the queries (`rankserve requests search`, BM25 order, no ranker, k 10, 100 candidates) sent by
# `rankserve replay` (the first binary's, the same client for every server: keep-alive clients,
# one thread each, closed loop), WARMUP_SECONDS (default 2, untimed) then SECONDS_PER_RUN
# (default 5). BINS lists "name=path" pairs (the first must have `requests search`); DOCS
# (default 3 000 000), QUERIES (500), MODES ("or and_or"), CLIENTS ("1 4 16"), BACKENDS
# ("auto"), ROUNDS (2) size it. Each run's line gives the throughput, the client's p50/p90/p99,
# the server's own select and total p50/p99 (`timings` of the replies), how busy the host's
# cores were over the run (every process, the client's included), the devices' seconds in turns
# per second (summed over devices: 2.00 is two devices never idle) and how many queries each
# processor selected (`backends.select`). Logs, the replays' JSON reports and every table go to
# $OUT; a line per run is printed last. ARGS_<name> adds serve flags to one server (e.g.
# ARGS_alone="--gpu-select-batch 1", the same binary without GPU batches); at the end each
# server's GPU batch sizes (queries per batch, from /metrics) are printed.
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
for mode in ${MODES:-or and_or}; do
  for backend in ${BACKENDS:-auto}; do
    "$first" requests search --queries "$work/queries.txt" --mode "$mode" --k 10 --candidates 100 \
      --backend "$backend" --out "$work/search-$mode-$backend.msgpack" 2>/dev/null
  done
done

# host_ticks: the host's idle and total CPU ticks, every core (/proc/stat).
host_ticks() { awk '/^cpu /{print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 + $10 + $11}' /proc/stat; }
# device_seconds PORT: the server's seconds in device turns, summed over its devices (/metrics).
device_seconds() {
  curl -sf "http://127.0.0.1:$1/metrics" \
    | awk '/^rankserve_gpu_device_busy_microseconds_total/{s += $NF} END {printf "%.6f", s / 1e6}'
}

summary=()
for round in $(seq "${ROUNDS:-2}"); do
  for mode in ${MODES:-or and_or}; do
    for clients in ${CLIENTS:-1 4 16}; do
      for backend in ${BACKENDS:-auto}; do
        p=18600
        for bin in "${bins[@]}"; do
          p=$((p + 1))
          log="$out/${bin%%=*}-$mode-$clients-$backend-$round"
          requests="$work/search-$mode-$backend.msgpack"
          "$first" replay --url "http://127.0.0.1:$p" --log "$requests" --concurrency "$clients" \
            --duration "${WARMUP_SECONDS:-2}" > /dev/null 2> "$log.log"
          # shellcheck disable=SC2207 # three numbers
          before=($(host_ticks) "$(device_seconds "$p")")
          "$first" replay --url "http://127.0.0.1:$p" --log "$requests" --concurrency "$clients" \
            --duration "${SECONDS_PER_RUN:-5}" --json > "$log.json" 2>> "$log.log"
          # shellcheck disable=SC2207 # three numbers
          after=($(host_ticks) "$(device_seconds "$p")")
          row=$(python3 - "$log.json" "${before[@]}" "${after[@]}" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
idle0, total0, turns0, idle1, total1, turns1 = map(float, sys.argv[2:8])
lat, select, total = r["latency_us"], r["server_select_us"], r["server_total_us"]
selected = " ".join(f"{b}:{n}" for b, n in sorted(r["backends"].get("select", {}).items()))
errors = f" errors {r['errors']}" if r["errors"] else ""
print(f"qps {r['throughput_rps']:.0f} p50 {lat['p50']} p90 {lat['p90']} p99 {lat['p99']} "
      f"select p50 {select['p50']} p99 {select['p99']} total p50 {total['p50']} p99 {total['p99']} "
      f"host {1 - (idle1 - idle0) / max(1, total1 - total0):.0%} "
      f"turns {(turns1 - turns0) / r['duration_s']:.2f} s/s {selected}{errors}")
EOF
          )
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
