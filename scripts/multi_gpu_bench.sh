#!/usr/bin/env bash
# Issue 24's multi-GPU measurements, on a host with two or more GPUs: /v1/rank throughput and
# latency with one GPU (`--gpus 0`) against every GPU (`--gpus all`), runs interleaved; then a
# device failure injected under load. Each binary given (`PATH` or `NAME=PATH`, several for an
# A/B) serves RANKERS (default "medium large") with `--backend gpu` and each `--fe-backend` of
# FE_BACKENDS (default "gpu cpu": hit documents extracted and scored in one device turn;
# extracted on the CPU and the rows scored on the device through the batching lanes);
# `rankserve replay` (the first binary's) sends production-like requests of DOCS (default 1000)
# documents from each of CLIENTS (default "16 64") closed-loop clients for SECONDS_PER_RUN
# (default 5), ROUNDS (default 2) times. The failure run serves every GPU with the first binary
# and RANKSERVE_FAULT_GPU=1@MS (GPU 1 fails from FAULT_MS = 2000 ms after start) while 64
# clients replay for 3 × SECONDS_PER_RUN: every request must still be answered (FAULT=0 leaves
# it out). SERVE_ARGS adds flags to every server (e.g. "--cpu-threads 8"). FLOOR=PATH (the
# `http_floor` example) adds, in the same rounds, the host's ceiling with no device: a transport
# floor (the body read, one pool hand-off, a reply of DOCS scores) and, per ranker, a layout
# floor (the body framed and its hit documents laid out as the fused path does before its
# device turn), their pools the size of the server's default with a GPU (FLOOR_THREADS to
# change): GPUs "none". Logs, the device lines of /metrics and each replay's JSON report (the
# server's stages' means and percentiles) go to $OUT; a table is printed last (server p99s:
# FE or layout, queue for the device, scoring; how busy the host's cores were, the cores' time
# the server and the rest of the host (the replay client) used, and the devices' seconds in
# turns per second, to tell a host-bound point from a device-bound one).
#
#   OUT=$OUT bash scripts/multi_gpu_bench.sh carry/rankserve
#   OUT=$OUT FE_BACKENDS=gpu bash scripts/multi_gpu_bench.sh new=carry/rankserve old=carry/old/rankserve
set -uo pipefail
cd "$(dirname "$0")/.."
bins=()
for arg in "$@"; do
  case $arg in *=*) bins+=("$arg") ;; *) bins+=("$(basename "$(dirname "$arg")")=$arg") ;; esac
done
bin=${bins[0]#*=}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
seconds=${SECONDS_PER_RUN:-5}
docs=${DOCS:-1000}
rankers=${RANKERS:-medium large}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
for ranker in $rankers; do
  "$bin" requests synth --ranker "$ranker" --docs "$docs" --count 64 \
    --out "$work/$ranker.msgpack" >/dev/null
done

# Starts binary $1's `rankserve serve` on port $2 with the flags after them; waits until it is
# ready.
serve() {
  local server=$1 port=$2
  shift 2
  # shellcheck disable=SC2086 # the flags are words
  "$server" serve --addr "127.0.0.1:$port" --backend gpu --rankers rankers ${SERVE_ARGS:-} "$@" \
    >>"$out/serve-$port.log" 2>&1 &
  until_ready "$port" 120
}

# Records the job started last as port $1's process; waits until its /readyz answers, for at
# most $2 seconds.
until_ready() {
  echo $! >"$work/pid-$1"
  for _ in $(seq $(($2 * 5))); do
    curl -sf "http://127.0.0.1:$1/readyz" >/dev/null && return
    sleep 0.2
  done
  echo "server on $1 never became ready" >&2
}

# The host's idle and total CPU ticks so far (every core).
cpu_ticks() {
  awk '/^cpu /{t = 0; for (i = 2; i <= NF; i++) t += $i; print $5 + $6, t}' /proc/stat
}

# CPU ticks (user + system) the server on port $1 has used so far.
server_ticks() {
  awk '{print $14 + $15}' "/proc/$(cat "$work/pid-$1")/stat"
}

# The server on port $1's CPU ticks (user + system) so far by thread name, digits dropped (the
# scoring pool's `score-N` threads as `score-`; tokio's async workers and blocking threads share
# `tokio-rt-worker`): "name ticks" per line.
thread_ticks() {
  local task
  for task in /proc/"$(cat "$work/pid-$1")"/task/*/stat; do
    # The name, in brackets, may hold spaces: split after its closing bracket.
    sed -E 's/^[0-9]+ \((.*)\) [A-Z] (.*)$/\1\t\2/' "$task" 2>/dev/null
  done | awk -F'\t' '{split($2, f, " "); sub(/[0-9]+$/, "", $1); t[$1] += f[11] + f[12]}
    END{for (n in t) print n "\t" t[n]}'
}

# Microseconds the devices of the server on port $1 have spent in turns so far, summed.
turn_us() {
  curl -s "http://127.0.0.1:$1/metrics" |
    awk '/^rankserve_gpu_device_busy_microseconds_total/{s += $2} END{printf "%d\n", s}'
}

# One replay against port $1 of log $2 with $3 clients for $4 seconds into $5 (JSON); prints a
# table row "rps p50 p99 ok errors fe_p99 queue_p99 me_p99 host_busy server_cores other_cores
# device_turns pool/tokio/rest": how busy the host's cores were (all processes, the replay client's included),
# how many cores' time the server used and the rest of the host (the replay client, mostly),
# and the devices' time in turns per second of the run, summed over devices (2.0: two devices
# never idle), and the server's cores split by thread: its scoring pool, tokio's threads, the rest.
replay() {
  local ticks turns served
  ticks=$(cpu_ticks)
  turns=$(turn_us "$1")
  served=$(server_ticks "$1")
  thread_ticks "$1" >"$work/threads-before"
  "$bin" replay --url "http://127.0.0.1:$1" --log "$2" --concurrency "$3" --duration "$4" \
    --json >"$5" 2>>"$out/replay.err"
  python3 - "$5" "$ticks" "$(cpu_ticks)" "$turns" "$(turn_us "$1")" "$4" "$served" \
    "$(server_ticks "$1")" "$(getconf CLK_TCK)" "$work/threads-before" \
    <(thread_ticks "$1") <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
(idle0, total0), (idle1, total1) = (map(int, a.split()) for a in sys.argv[2:4])
seconds = float(sys.argv[6])
turns = (int(sys.argv[5]) - int(sys.argv[4])) / (seconds * 1e6)
# /proc/stat's first line counts every core's ticks; a process's ticks are CLK_TCK a second.
ticks_per_s = int(sys.argv[9])
cores = (total1 - total0) / ticks_per_s / seconds
busy = 1 - (idle1 - idle0) / max(1, total1 - total0)
server = (int(sys.argv[8]) - int(sys.argv[7])) / ticks_per_s / seconds
# Cores by thread group: the scoring pool, tokio's threads, the rest.
def threads(path):
    return {n: int(t) for n, t in (l.rstrip("\n").split("\t") for l in open(path) if "\t" in l)}
before, after = threads(sys.argv[10]), threads(sys.argv[11])
groups = {"score-": 0.0, "tokio-": 0.0, "": 0.0}
for name, t in after.items():
    group = next(g for g in groups if name.startswith(g))
    groups[group] += (t - before.get(name, 0)) / ticks_per_s / seconds
lat = j["latency_us"]
print(round(j["throughput_rps"]), lat["p50"], lat["p99"], j["ok"], sum(j["errors"].values()),
      j["server_fe_us"]["p99"], j["server_queue_us"]["p99"], j["server_me_us"]["p99"],
      f"{100 * busy:.0f}%", f"{server:.1f}", f"{busy * cores - server:.1f}", f"{turns:.2f}",
      "/".join(f"{c:.1f}" for c in groups.values()))
PY
}

# Starts the floor on port $1 with the flags after it; waits until it is ready.
floor() {
  local port=$1
  shift
  local cores
  cores=$(nproc)
  "$FLOOR" --addr "127.0.0.1:$port" --docs "$docs" \
    --cpu-threads "${FLOOR_THREADS:-$((cores - cores / 4))}" "$@" >>"$out/floor-$port.log" 2>&1 &
  until_ready "$port" 20
}

rows=()
for fe in ${FE_BACKENDS:-gpu cpu}; do
  servers=()
  port=18800
  if [ -n "${FLOOR:-}" ]; then
    floor 18870
    port=18870
    for ranker in $rankers; do
      port=$((port + 1))
      floor "$port" --rankers rankers --lay-out "$ranker"
    done
    port=18800
  fi
  for named in "${bins[@]}"; do
    for gpus in one all; do
      port=$((port + 1))
      serve "${named#*=}" "$port" --gpus "$([ $gpus = one ] && echo 0 || echo all)" --fe-backend "$fe"
      servers+=("${named%%=*}:$gpus:$port")
    done
  done
  for round in $(seq "${ROUNDS:-2}"); do
    for ranker in $rankers; do
      for clients in ${CLIENTS:-16 64}; do
        floors=()
        if [ -n "${FLOOR:-}" ]; then
          # The layout floor of this ranker: the ports follow RANKERS' order.
          floors=("floor-transport:none:18870"
            "floor-layout:none:$((18870 + $(echo "$rankers" | tr ' ' '\n' | grep -nx "$ranker" | cut -d: -f1)))")
        fi
        for server in "${floors[@]}" "${servers[@]}"; do
          IFS=: read -r name gpus port <<<"$server"
          row=$(replay "$port" "$work/$ranker.msgpack" "$clients" "$seconds" \
            "$out/rank-$fe-$ranker-$clients-$name-$gpus-$round.json")
          rows+=("$fe $round $ranker $clients $name $gpus $row")
          echo "FE $fe round $round $ranker clients $clients $name gpus $gpus: $row"
        done
      done
    done
  done
  for server in "${servers[@]}"; do
    IFS=: read -r name gpus port <<<"$server"
    curl -s "http://127.0.0.1:$port/metrics" | grep -E '^rankserve_gpu_(device|fallback)' \
      >"$out/metrics-$fe-$name-$gpus.txt"
  done
  kill $(jobs -p) 2>/dev/null
  wait 2>/dev/null
done

# A device failure under load: GPU 1 fails from 2 s after start (the server is ready later,
# so it fails at the first work it gets once the replay runs).
fault_ms=${FAULT_MS:-2000}
if [ "${FAULT:-1}" = 1 ]; then
  RANKSERVE_FAULT_GPU="1@$fault_ms" serve "$bin" 18899 --gpus all --fe-backend gpu
  fault=$(replay 18899 "$work/${rankers%% *}.msgpack" 64 $((3 * seconds)) "$work/fault.json")
  curl -s "http://127.0.0.1:18899/metrics" | grep -E '^rankserve_gpu_(device|fallback)' \
    >"$out/metrics-fault.txt"
  kill $(jobs -p) 2>/dev/null
  wait 2>/dev/null
fi

echo
echo "| FE | round | ranker | clients | binary | GPUs | req/s | p50 µs | p99 µs | ok | errors | server FE p99 | queue p99 | scoring p99 | host CPU busy | server cores | other cores | device turns s/s | pool / tokio / rest cores |"
echo "|---|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for r in "${rows[@]}"; do
  echo "| ${r// / | } |"
done
if [ "${FAULT:-1}" = 1 ]; then
  echo
  echo "GPU 1 failing from ${fault_ms} ms, 64 clients: rps p50 p99 ok errors fe_p99 queue_p99 me_p99 host_busy server_cores other_cores device_turns pool/tokio/rest = $fault"
  cat "$out/metrics-fault.txt"
fi
