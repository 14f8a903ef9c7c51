#!/usr/bin/env bash
# Where a batching server's time goes under load (issue 25): /v1/rank with the medium ranker and
# production-like hit documents, closed-loop clients (`rankserve replay`), servers started once
# and measured in turn, ROUNDS times. Per run it prints one line:
#   rps            the client's throughput; client p50/p99 latency (µs)
#   host           the share of the host's CPU time busy during the run (every process)
#   cpu            the server's CPU seconds, and the three thread groups that used the most
#   batches        batches per second, mean documents and requests per batch (the server's
#                  rankserve_batch_* histograms over the run)
#   fe, me, queue, total   the server's own timings from the replies: p50 / mean (µs)
# A lane whose batches/s × mean `me` nears 1 s/s runs all the time: its one thread is the limit.
#
#   bash scripts/batching_profile.sh NEW OLD [CANDIDATE]
#
# OLD runs with its 200 µs window (RANKSERVE_BATCH_WINDOW_US=200), NEW with its defaults,
# CANDIDATE (optional) with CANDIDATE_ARGS. SIZES (documents per request, default "100 10"),
# LOADS (clients, default "16 64"), SECONDS_PER_RUN (default 3), ROUNDS (default 2) and BACKEND
# (default auto) are the environment's. Replies land in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
new=$1
old=$2
candidate=${3:-}
sizes=${SIZES:-100 10}
loads=${LOADS:-16 64}
seconds=${SECONDS_PER_RUN:-3}
rounds=${ROUNDS:-2}
# shellcheck source=scripts/lib/load.sh
. scripts/lib/load.sh
load_dirs

for docs in $sizes; do
  synth_requests "$new" medium "$docs" "$work/medium-$docs.msgpack"
done
declare -A port=([window]=18611 [load]=18612 [candidate]=18613) pid
serve() {
  start_server "$1" "${port[$2]}" "$out/serve-$2.log" "$work/data-$2" \
    --backend "${BACKEND:-auto}" --rankers rankers "${@:3}"
  pid[$2]=$SERVER_PID
}
RANKSERVE_BATCH_WINDOW_US=200 serve "$old" window
serve "$new" load
if [ -n "$candidate" ]; then
  # shellcheck disable=SC2086
  serve "$candidate" candidate ${CANDIDATE_ARGS:-}
fi
names="window load${candidate:+ candidate}"

# CPU ticks per thread of a process (utime + stime, then the thread's name).
thread_ticks() {
  for task in /proc/"$1"/task/*; do
    echo "$(awk '{print $14 + $15}' "$task/stat" 2>/dev/null) $(cat "$task/comm" 2>/dev/null)"
  done
}
host_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
batch_metrics() {
  curl -sf "http://127.0.0.1:${port[$1]}/metrics" \
    | grep -E '^rankserve_batch_(documents|requests)_(sum|count) ' | tr '\n' ' ' || true
}

for round in $(seq "$rounds"); do
  for docs in $sizes; do
    for clients in $loads; do
      for name in $names; do
        reply="$out/r$round-$docs-$clients-$name.json"
        thread_ticks "${pid[$name]}" >"$work/before"
        host_before=$(host_ticks)
        metrics_before=$(batch_metrics "$name")
        replay_json "$new" "${port[$name]}" "$work/medium-$docs.msgpack" "$clients" "$seconds" \
          "$reply"
        thread_ticks "${pid[$name]}" >"$work/after"
        python3 - "$work/before" "$work/after" "$host_before" "$(host_ticks)" \
          "$metrics_before" "$(batch_metrics "$name")" "$reply" "$seconds" \
          "$name $docs docs $clients clients r$round" <<'PY'
import collections, json, os, sys
before, after, host0, host1, m0, m1, reply, seconds, label = sys.argv[1:]
hz = os.sysconf("SC_CLK_TCK")

def groups(path):
    out = collections.Counter()
    for line in open(path):
        ticks, _, name = line.strip().partition(" ")
        if ticks:
            # Numbered threads (score-3) count as one group.
            out[name.rstrip("0123456789-")] += int(ticks)
    return out

cpu = groups(after)
cpu.subtract(groups(before))
(busy0, all0), (busy1, all1) = map(float, host0.split()), map(float, host1.split())
host = (busy1 - busy0) / max(1.0, all1 - all0)

def metrics(text):
    toks = text.split()
    return {toks[i]: float(toks[i + 1]) for i in range(0, len(toks) - 1, 2)}

m0, m1 = metrics(m0), metrics(m1)
delta = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)
batches = delta("rankserve_batch_documents_count")
r = json.load(open(reply))
timing = lambda k: f"{r[k]['p50']}/{r[k]['mean']:.0f}"
top = ", ".join(f"{k} {v / hz:.1f}" for k, v in cpu.most_common(3))
print(
    f"{label:28s} rps {r['throughput_rps']:7.0f} client {r['latency_us']['p50']}/{r['latency_us']['p99']}"
    f" | host {host * 100:4.1f} % | cpu {sum(cpu.values()) / hz:5.1f} s ({top})"
    f" | batches {batches / float(seconds):6.0f}/s of {delta('rankserve_batch_documents_sum') / max(batches, 1):5.0f} docs,"
    f" {delta('rankserve_batch_requests_sum') / max(batches, 1):4.1f} requests"
    f" | fe {timing('server_fe_us')} me {timing('server_me_us')} queue {timing('server_queue_us')}"
    f" total {timing('server_total_us')}"
)
PY
      done
    done
  done
done | tee "$out/profile.txt"
