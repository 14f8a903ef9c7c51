#!/usr/bin/env bash
# Builds, with the rankserve binary BIN, a synthetic corpus of DOCS documents (default 3 000 000,
# seed 1), its EF index in DIR/ef and QUERIES queries (default 500) in DIR/queries.txt; the
# corpus file itself is removed once indexed. Used by the A/B scripts that run on the GPU machine.
#
#   bash scripts/synth_index.sh BIN DIR
set -euo pipefail
bin=$1
dir=$2
"$bin" corpus synth --docs "${DOCS:-3000000}" --seed 1 --out "$dir/corpus.jsonl" 2>&1 | tail -1
"$bin" index build --corpus "$dir/corpus.jsonl" --out "$dir/ef" --codec ef 2>&1 | tail -1
rm "$dir/corpus.jsonl"
"$bin" queries synth --index "$dir/ef" --count "${QUERIES:-500}" --out "$dir/queries.txt"
