#!/usr/bin/env bash
# On the GPU machine: `rankserve bench selection --gpu` of several binaries on one synthetic
# index built in the call, interleaved, so their ratios come from one machine and one run (the
# lent machines differ by up to 2.5× between calls). BINS lists "name=path" pairs (the first
# builds the corpus, index and queries); MODES (default "and or"), DOCS (default 3 000 000),
# QUERIES (500), REPS (3), ROUNDS (1), BENCH_ARGS (added to every bench) size it; RATIO=1 adds
# the two-term AND queries by list-length ratio (scripts/ratio-queries.py) to every round.
# Logs go to $OUT (and, with RATIO=1, each binary's CPU-vs-GPU table by ratio, NAME-ratio-ROUND.md);
# a line per bench is printed last.
#
#   BINS="before=carry/old/rankserve after=carry/rankserve" OUT=$OUT bash scripts/gpu-select-ab.sh
set -uo pipefail
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
read -r -a bins <<< "${BINS:?BINS=\"name=path ...\"}"
first=${bins[0]#*=}
work=$(mktemp -d)
start=$(date +%s)
bash "$(dirname "$0")/synth_index.sh" "$first" "$work"
sets=("queries")
if [ "${RATIO:-0}" = 1 ]; then
  python3 scripts/ratio-queries.py > "$work/ratio.txt"
  sets+=("ratio")
fi
echo "index and queries: $(($(date +%s) - start)) s"
summary=()
for round in $(seq "${ROUNDS:-1}"); do
  for set in "${sets[@]}"; do
    modes=${MODES:-and or}
    [ "$set" = ratio ] && modes=and
    for mode in $modes; do
      for bin in "${bins[@]}"; do
        name=${bin%%=*}
        log="$out/$name-$set-$mode-$round.log"
        "${bin#*=}" bench selection --index "$work/ef" --queries "$work/$set.txt" --mode "$mode" \
          --reps "${REPS:-3}" ${BENCH_ARGS:-} --gpu --gpu-out "$out/$name-$set-$mode-$round.jsonl" \
          > "$log" 2>&1
        rows=$(grep -E '^\| (CPU|GPU|hybrid) \|' "$log" | awk -F'|' '{printf "%s mean %s p99 %s; ", $2, $3, $6}')
        same=$(grep -Eo 'identical to the CPU.s on [0-9]+/[0-9]+ queries, hybrid.s on [0-9]+/[0-9]+' "$log")
        summary+=("round $round $set $mode $name: $rows$same")
        if [ "$set" = ratio ]; then
          python3 scripts/ratio-queries.py --table "$out/$name-$set-$mode-$round.jsonl" \
            > "$out/$name-ratio-$round.md"
        fi
      done
    done
  done
done
echo "total: $(($(date +%s) - start)) s"
printf '%s\n' "${summary[@]}"
