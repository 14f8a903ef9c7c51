#!/usr/bin/env bash
# Interleaved A/B of /v1/rank service overhead (issue 3): the binaries given take turns, ROUNDS
# times, each serving the medium ranker on loopback (CPU backend, batching off) while
# `rankserve replay` sends it production-like 1 000-document MessagePack requests (the same
# log for every binary) from CONCURRENCY clients for SECONDS. Per binary and round it prints
# the throughput, the client's latency and the server's mean timings (`handler_rest`: the handler's total less
# the timed steps; `outside`: the client's latency less the handler's total); at the end, per
# binary, the median (and range) over rounds of each. Overhead is client latency − FE − scoring, as in
# scripts/load_check.sh; `overhead@FE0` uses the first binary's FE time of the same round
# instead, so that a binary which moves decoding into FE is not credited for relabelling it.
#
#   bash scripts/load_ab.sh SECONDS ROUNDS BINARY...      # e.g. 5 3 before/rankserve after/rankserve
#
# DOCS (default 1000) and CONCURRENCY (default 1) override the request size and the clients.
# FLOOR=PATH (the `http_floor` example, `cargo build --release --example http_floor`) adds, in
# each round, that server held for the first binary's FE + scoring of the round: its overhead
# is the transport floor (body transfer, HTTP, wake-ups) that no handler removes.
# FLOOR_ARGS are passed to it: `--transport raw --hold-on worker` makes it the least a server
# can do (HTTP by hand, the hold on the thread that read the request, no hand-off).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=$1
rounds=$2
shift 2
docs=${DOCS:-1000}
concurrency=${CONCURRENCY:-1}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
"$1" requests synth --ranker medium --docs "$docs" --count 64 --out "$work/requests.msgpack" >/dev/null

# Waits for the server $1 listening on $port, replays the log against it for $seconds with the
# client of binary $2 into $3, then stops the server.
replay_against() {
  local server=$1
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
    sleep 0.1
  done
  "$2" replay --url "http://127.0.0.1:$port" --log "$work/requests.msgpack" \
    --concurrency "$concurrency" --duration "$seconds" --json >"$3"
  kill "$server"
  wait "$server" 2>/dev/null || true
}

port=18520
for round in $(seq "$rounds"); do
  for b in $(seq "$#"); do
    bin=${!b}
    port=$((port + 1))
    # Batching off, told the way each binary reads it (an older one: a window of 0).
    RANKSERVE_BATCHING=false RANKSERVE_BATCH_WINDOW_US=0 \
      "$bin" serve --addr "127.0.0.1:$port" --backend cpu --rankers rankers \
      >"$work/serve.log" 2>&1 &
    replay_against $! "$bin" "$work/r$round-$b.json"
  done
  if [ -n "${FLOOR:-}" ]; then
    port=$((port + 1))
    hold=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(round(j["server_fe_us"]["mean"] + j["server_me_us"]["mean"]))' "$work/r$round-1.json")
    "$FLOOR" --addr "127.0.0.1:$port" --docs "$docs" --hold-us "$hold" ${FLOOR_ARGS:-} >"$work/floor.log" 2>&1 &
    replay_against $! "$1" "$work/r$round-$(($# + 1)).json"
  fi
done

python3 - "$work" "$rounds" "$@" ${FLOOR:+floor} <<'PY'
import json, statistics, sys
work, rounds, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
keys = ["rps", "p50", "p99", "mean", "read", "decode", "fe", "me", "queue", "handler_rest", "outside", "overhead", "overhead@FE0"]
rows = {b: {k: [] for k in keys} for b in range(len(bins))}
for r in range(1, rounds + 1):
    fe0 = None
    for b in range(len(bins)):
        j = json.load(open(f"{work}/r{r}-{b + 1}.json"))
        assert not j["errors"], j["errors"]
        s = {k: j.get(f"server_{k}_us", {"mean": 0})["mean"] for k in ("read", "decode", "fe", "me", "queue")}
        lat = j["latency_us"]
        fe0 = s["fe"] if fe0 is None else fe0
        v = {"rps": j["throughput_rps"], "p50": lat["p50"], "p99": lat["p99"], "mean": lat["mean"], **s,
             "handler_rest": j["server_total_us"]["mean"] - sum(s.values()),
             "outside": lat["mean"] - j["server_total_us"]["mean"],
             "overhead": 100 * (lat["mean"] - s["fe"] - s["me"]) / lat["mean"],
             # The floor's held time stands for FE and scoring together (its `me`).
             "overhead@FE0": 100 * (lat["mean"] - (0 if bins[b] == "floor" else fe0) - s["me"]) / lat["mean"]}
        for k in keys:
            rows[b][k].append(v[k])
        print(f"round {r} {bins[b]}: " + ", ".join(f"{k} {v[k]:.0f}" for k in keys))
print("medians over rounds [min–max] (rps: requests/s; µs; overheads in %):")
for b in range(len(bins)):
    print(f"{bins[b]}: " + ", ".join(
        f"{k} {statistics.median(x):.0f} [{min(x):.0f}–{max(x):.0f}]" for k, x in rows[b].items()))
PY
