#!/usr/bin/env bash
# The fuzz tests' long mode as one process per seed, all at once: a long run on a many-core
# machine (docs/operations.md, Fuzzing). Each process runs every target with CASES cases and
# its own seed, for at most SECONDS; a process still running then is stopped and reported as
# such (not as a failure: the cases it ran passed, a failure ends a process at once).
#
#   bash scripts/fuzz_parallel.sh FUZZ_BINARY FIRST_SEED PROCESSES CASES SECONDS
#   bash scripts/fuzz_parallel.sh target/release/deps/fuzz-HASH 100 16 8000 420
set -uo pipefail
bin=$1 first=$2 processes=$3 cases=$4 seconds=$5
out=${OUT:-/tmp/rankserve-fuzz}
mkdir -p "$out"
start=$(date +%s)
for ((s = first; s < first + processes; s++)); do
  (
    RANKSERVE_FUZZ_CASES=$cases RANKSERVE_FUZZ_SEED=$s timeout "$seconds" \
      "$bin" --nocapture --test-threads 7 >"$out/fuzz-seed-$s.log" 2>&1
    echo "seed $s: exit $?" >>"$out/fuzz-exits.txt"
  ) &
done
wait
elapsed=$(( $(date +%s) - start ))
failed=$(grep -c "exit [^0]" "$out/fuzz-exits.txt" | head -1)
# A target's summary line: "fuzz TARGET: seed S, N cases in T s (...)".
cases_run=$(grep -ho "[0-9]* cases in" "$out"/fuzz-seed-*.log | awk '{s+=$1} END {print s+0}')
echo "processes $processes, $cases cases per target each, ${elapsed} s wall, $(nproc) cores"
echo "cases run in completed targets: $cases_run"
sort -t' ' -k2n "$out/fuzz-exits.txt"
grep -h "panicked\|failed:" "$out"/fuzz-seed-*.log | head -20
echo "processes with a non-zero exit (124 = stopped at the time limit): $failed"
