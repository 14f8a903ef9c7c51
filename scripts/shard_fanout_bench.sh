#!/usr/bin/env bash
# The fan-out's cost (docs/benchmarks.md, "Shards"): one index against a broker + 4 shards of the
# same corpus, all on this machine, 1 and 16 clients. Run from the repository after
# `cargo build --release`; OUT (default shard-bench/) keeps the corpus and indexes between runs.
# DOCS (default 1000000) documents; MODE (default or). Per server, client count and ranker
# (none: BM25 order; small), `rankserve replay` sends a search log of the queries (100
# candidates) for REPLAY_SECONDS (default 5) after 2 untimed and prints its table: throughput,
# the client's latency and the server's own timings (select, FE, scoring, total).
set -euo pipefail
S=${OUT:-shard-bench}
BIN=${BIN:-target/release/rankserve}
DOCS=${DOCS:-1000000}
mkdir -p "$S"
[ -f $S/corpus.jsonl.gz ] || $BIN corpus synth --docs $DOCS --seed 1 --out $S/corpus.jsonl.gz
[ -d $S/whole ] || (time $BIN index build --corpus $S/corpus.jsonl.gz --out $S/whole) 2>&1 | tail -5
[ -d $S/sharded ] || (time $BIN index build --corpus $S/corpus.jsonl.gz --out $S/sharded --shards 4) 2>&1 | tail -8
[ -f $S/q.txt ] || $BIN queries synth --index $S/whole --count 400 --seed 1 --out $S/q.txt
$BIN requests search --queries $S/q.txt --mode ${MODE:-or} --candidates 100 --out $S/search-none.msgpack
$BIN requests search --queries $S/q.txt --mode ${MODE:-or} --candidates 100 --ranker small \
  --out $S/search-small.msgpack
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
RANKSERVE_LOG_FORMAT=json $BIN serve --backend cpu --index $S/whole --addr 127.0.0.1:8190 2>$S/whole.log & pids+=($!)
for i in 0 1 2 3; do
  $BIN serve --backend cpu --index $S/sharded/shard-$i --addr 127.0.0.1:819$((i+1)) 2>$S/shard-$i.log & pids+=($!)
done
{
  echo "timeout_ms = 5000"
  for i in 0 1 2 3; do printf '[[shards]]\nname = "shard-%s"\nurl = "http://127.0.0.1:819%s"\n' $i $((i+1)); done
} > $S/shards.toml
$BIN serve --backend cpu --broker $S/shards.toml --addr 127.0.0.1:8195 2>$S/broker.log & pids+=($!)
for port in 8190 8191 8192 8193 8194 8195; do
  until curl -sf localhost:$port/readyz >/dev/null; do sleep 0.5; done
done
for c in 1 16; do
  for url in http://127.0.0.1:8190 http://127.0.0.1:8195; do
    for ranker in none small; do
      echo "== $url, $c clients, ranker $ranker"
      $BIN replay --url $url --log $S/search-$ranker.msgpack --concurrency $c --duration 2 >/dev/null
      $BIN replay --url $url --log $S/search-$ranker.msgpack --concurrency $c --duration ${REPLAY_SECONDS:-5}
    done
  done
done
