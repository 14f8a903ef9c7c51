#!/usr/bin/env bash
# Batching A/B (issue 25): /v1/rank with the medium ranker, 10, 100 and 1 000 hit documents per
# request (`rankserve requests synth`), 1, 4, 16 and 64 closed-loop clients (`rankserve replay`),
# against three servers started once and measured in turn, ROUNDS times, so that their figures
# come from the same minutes:
#   window  OLD binary, its default 200 µs batching window (RANKSERVE_BATCH_WINDOW_US=200)
#   off     NEW binary, batching off (every request scored at once)
#   load    NEW binary, its default: batches formed only under load
# Prints a markdown table: per size and load, each server's client p50 / p99 (µs) and throughput
# (requests/s), medians over rounds; the raw replays stay in $OUT.
#
#   bash scripts/batching_ab.sh NEW OLD [SECONDS] [ROUNDS]    # default 3 s, 2 rounds
#
# BACKEND (default cpu; auto uses the GPU where the crossover says so) is every server's;
# LOAD_ARGS are added to the load server's (e.g. "--max-batch-docs 1024"). CANDIDATE, a third
# binary, adds a fourth server `candidate` run like `load` with CANDIDATE_ARGS (a variant of NEW,
# or NEW with other settings, measured in the same minutes); the last columns compare `load`.
set -euo pipefail
cd "$(dirname "$0")/.."
new=$1
old=$2
seconds=${3:-3}
rounds=${4:-2}
backend=${BACKEND:-cpu}
# shellcheck source=scripts/lib/load.sh
. scripts/lib/load.sh
load_dirs

sizes="10 100 1000"
loads="1 4 16 64"
for docs in $sizes; do
  synth_requests "$new" medium "$docs" "$work/medium-$docs.msgpack"
done

declare -A port=([window]=18601 [off]=18602 [load]=18603 [candidate]=18604)
names="window off load${CANDIDATE:+ candidate}"
# Each server its own data directory, started once the one before is ready: a ranker's crossover
# is measured as it loads, and servers starting together (each building the demo index) would
# measure it on a loaded host.
serve() {
  start_server "$1" "${port[$2]}" "$out/serve-$2.log" "$work/data-$2" \
    --backend "$backend" --rankers rankers "${@:3}"
}
RANKSERVE_BATCH_WINDOW_US=200 serve "$old" window
RANKSERVE_BATCHING=false serve "$new" off
# shellcheck disable=SC2086
serve "$new" load ${LOAD_ARGS:-}
# shellcheck disable=SC2086
[ -n "${CANDIDATE:-}" ] && serve "$CANDIDATE" candidate ${CANDIDATE_ARGS:-}

for round in $(seq "$rounds"); do
  for docs in $sizes; do
    for clients in $loads; do
      for name in $names; do
        replay_json "$new" "${port[$name]}" "$work/medium-$docs.msgpack" "$clients" "$seconds" \
          "$out/r$round-$docs-$clients-$name.json"
      done
    done
  done
done

# The crossover each server measured for the ranker (auto: which batches went to the GPU).
for name in $names; do
  curl -sf "http://127.0.0.1:${port[$name]}/v1/rankers/medium" >"$out/ranker-$name.json" || true
done

python3 - "$out" "$rounds" "$sizes" "$loads" "$backend" "$names" <<'PY'
import json, statistics, sys
out, rounds, sizes, loads, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5]
names = sys.argv[6].split()
print(f"backend {backend}; medians of {rounds} rounds; p50 / p99 µs, throughput requests/s")
for n in names:
    try:
        crossover = json.load(open(f"{out}/ranker-{n}.json")).get("crossover") or {}
        print(f"{n}: crossover {crossover.get('docs')} documents")
    except (OSError, ValueError):
        print(f"{n}: no crossover read back")
print("| documents | clients | " + " | ".join(f"{n}: p50 / p99 / rps" for n in names) + " | load p50 vs off | load rps vs best other |")
print("|---|---|" + "---|" * (len(names) + 2))
for docs in sizes:
    for clients in loads:
        cells, med = [], {}
        for n in names:
            runs = [json.load(open(f"{out}/r{r}-{docs}-{clients}-{n}.json")) for r in range(1, rounds + 1)]
            errors = sum(sum(r["errors"].values()) for r in runs)
            p50 = statistics.median(r["latency_us"]["p50"] for r in runs)
            p99 = statistics.median(r["latency_us"]["p99"] for r in runs)
            rps = statistics.median(r["throughput_rps"] for r in runs)
            med[n] = (p50, p99, rps)
            cells.append(f"{p50:.0f} / {p99:.0f} / {rps:.0f}" + (f" ({errors} errors)" if errors else ""))
        vs_off = 100 * (med["load"][0] / med["off"][0] - 1)
        vs_best = 100 * (med["load"][2] / max(med["window"][2], med["off"][2]) - 1)
        print(f"| {docs} | {clients} | " + " | ".join(cells) + f" | {vs_off:+.1f} % | {vs_best:+.1f} % |")
PY
