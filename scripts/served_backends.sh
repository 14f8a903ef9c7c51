#!/usr/bin/env bash
# /v1/rank served on the CPU against the GPU (issue 20): one binary, four servers started one
# after another and measured in turn, ROUNDS times —
#   cpu     --backend cpu                    FE and scoring on the CPU pool
#   gpu-row --backend gpu --fe-backend cpu   FE on the CPU pool as the body is decoded, the rows
#                                            scored on the GPU
#   gpu     --backend gpu --fe-backend gpu   hit documents laid out for the device as the body is
#                                            decoded, extracted and scored in one device turn
#                                            (the fused path)
#   auto    --backend auto --fe-backend auto each request where its measured crossover sends it
# — each replayed production-like requests of DOCS (default 1000) hit documents per ranker of
# RANKERS (default "medium large") from each of CLIENTS (default "1 16 64") closed-loop clients
# for SECONDS_PER_RUN (default 3) seconds. Prints a markdown table of medians over rounds:
# throughput, client p50 / p99 and the server's own time (`timings.total_us`) p50 / p99, and
# the server-time p50 of the others as a share of cpu's. Replies stay in $OUT.
#
#   bash scripts/served_backends.sh BINARY
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$1
docs=${DOCS:-1000}
rankers=${RANKERS:-medium large}
clients_list=${CLIENTS:-1 16 64}
seconds=${SECONDS_PER_RUN:-3}
rounds=${ROUNDS:-2}
# shellcheck source=scripts/lib/load.sh
. scripts/lib/load.sh
load_dirs
for ranker in $rankers; do
  synth_requests "$bin" "$ranker" "$docs" "$work/$ranker.msgpack"
done
declare -A port=([cpu]=18701 [gpu-row]=18704 [gpu]=18702 [auto]=18703)
start_server "$bin" "${port[cpu]}" "$out/serve-cpu.log" "$work/data-cpu" --rankers rankers \
  --backend cpu
start_server "$bin" "${port[gpu-row]}" "$out/serve-gpu-row.log" "$work/data-gpu-row" \
  --rankers rankers --backend gpu --fe-backend cpu
start_server "$bin" "${port[gpu]}" "$out/serve-gpu.log" "$work/data-gpu" --rankers rankers \
  --backend gpu --fe-backend gpu
start_server "$bin" "${port[auto]}" "$out/serve-auto.log" "$work/data-auto" --rankers rankers \
  --backend auto --fe-backend auto

for round in $(seq "$rounds"); do
  for ranker in $rankers; do
    for clients in $clients_list; do
      for name in cpu gpu-row gpu auto; do
        replay_json "$bin" "${port[$name]}" "$work/$ranker.msgpack" "$clients" "$seconds" \
          "$out/r$round-$ranker-$clients-$name.json"
      done
    done
  done
done

python3 - "$out" "$rounds" "$rankers" "$clients_list" <<'PY'
import json, statistics, sys
out, rounds, rankers, loads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
names = ["cpu", "gpu-row", "gpu", "auto"]
print(f"medians of {rounds} rounds; µs; server = the replies' timings.total_us")
head = " | ".join(f"{n}: rps / client p50 / p99 / server p50 / p99" for n in names)
others = " | ".join(f"{n} ÷ cpu" for n in names[1:])
print(f"| ranker | clients | {head} | server p50 {others} | errors |")
print("|---|---:|" + "---|" * len(names) + "---:|" * len(names))
for ranker in rankers:
    for clients in loads:
        cells, server_p50, errors = [], {}, 0
        for n in names:
            runs = [json.load(open(f"{out}/r{r}-{ranker}-{clients}-{n}.json")) for r in range(1, rounds + 1)]
            med = lambda f: statistics.median(f(j) for j in runs)
            errors += sum(sum(j["errors"].values()) for j in runs)
            server_p50[n] = med(lambda j: j["server_total_us"]["p50"])
            cells.append(
                f"{med(lambda j: j['throughput_rps']):.0f} / {med(lambda j: j['latency_us']['p50']):.0f}"
                f" / {med(lambda j: j['latency_us']['p99']):.0f} / {server_p50[n]:.0f}"
                f" / {med(lambda j: j['server_total_us']['p99']):.0f}"
            )
        ratio = lambda n: server_p50[n] / server_p50["cpu"] if server_p50["cpu"] else float("nan")
        ratios = " | ".join(f"{ratio(n):.2f}" for n in names[1:])
        print(f"| {ranker} | {clients} | " + " | ".join(cells) + f" | {ratios} | {errors} |")
PY
