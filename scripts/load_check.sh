#!/usr/bin/env bash
# Load check of /v1/rank (issue 3): the medium ranker with 100 and 1000 documents per request,
# batching on and off, closed loop with rankserve's own replayer against a loopback server.
# Prints, per case, client throughput and latency and the server's own timings, and the
# service's overhead: client latency minus feature extraction and scoring (HTTP, codec, queue).
# Since the fused decode (docs/benchmarks-history.md, "Documents decoded during feature extraction"),
# a MessagePack body's `decode` is its fields and framing only: its documents are decoded within
# FE. scripts/load_ab.sh compares binaries with FE counted as the first binary measured it.
#
#   bash scripts/load_check.sh [SECONDS] [CONCURRENCY]     # default 10 s, 4 clients
#
# Needs a release build (cargo build --release) or RANKSERVE=path/to/rankserve. BACKEND=auto
# (or gpu) serves with the GPU where there is one; the default is cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
concurrency=${2:-4}
bin=${RANKSERVE:-target/release/rankserve}
backend=${BACKEND:-cpu}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

for docs in 100 1000; do
  "$bin" requests synth --ranker medium --docs "$docs" --count 64 --out "$work/medium-$docs.msgpack"
done

port=18480
for batching in true false; do
  port=$((port + 1))
  RANKSERVE_LOG_FORMAT=json "$bin" serve --addr "127.0.0.1:$port" --backend "$backend" \
    --batching "$batching" --rankers rankers >"$work/serve-$batching.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
    sleep 0.1
  done
  for docs in 100 1000; do
    echo "== medium, $docs documents per request, backend $backend, batching $batching, $concurrency clients"
    "$bin" replay --url "http://127.0.0.1:$port" --log "$work/medium-$docs.msgpack" \
      --concurrency "$concurrency" --duration "$seconds" --json >"$work/report.json"
    python3 - "$work/report.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
lat, total = r["latency_us"], r["server_total_us"]
mean = {k: r.get("server_" + k + "_us", {"mean": 0})["mean"] for k in ("read", "decode", "fe", "me", "queue")}
print(f"  {r['throughput_rps']:.1f} req/s, {r['documents_per_s']:.0f} docs/s, errors {r['errors'] or 'none'}")
print(f"  client latency p50 {lat['p50']} µs, p99 {lat['p99']} µs, mean {lat['mean']:.0f} µs; server total mean {total['mean']:.0f} µs")
print("  server means: " + ", ".join(f"{k} {v:.0f} µs" for k, v in mean.items()))
overhead = lat["mean"] - mean["fe"] - mean["me"]
outside = lat["mean"] - total["mean"]
print(f"  service overhead (client latency - FE - scoring) mean {overhead:.0f} µs = {100 * overhead / lat['mean']:.1f} %:"
      f" body read {mean['read']:.0f}, decode {mean['decode']:.0f}, batch queue {mean['queue']:.0f}, outside the handler (HTTP, headers, reply) {outside:.0f} µs")
EOF
  done
  kill "$server"
  wait "$server" 2>/dev/null || true
done
