#!/usr/bin/env python3
"""The heavy query set of issue 21's comparison: the COUNT queries with the most hits among those
of a `rankserve bench selection --out` run (one JSON line per query, with `hits`), in their
original order. The hits are those of that run's mode (AND in the issue's tables).

    rankserve queries synth --index idx --count 5000 --seed 2 --out pool.txt
    rankserve bench selection --index idx --queries pool.txt --mode and --reps 1 --out pool.jsonl
    python3 scripts/heavy_queries.py pool.jsonl --count 1000 > heavy.txt
"""

import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", help="bench selection --out's JSON lines")
    ap.add_argument("--count", type=int, default=1000)
    args = ap.parse_args()
    runs = [json.loads(line) for line in open(args.runs, encoding="utf-8") if line.strip()]
    if any("hits" not in r for r in runs):
        sys.exit(f"{args.runs}: a line without `hits` (written by a rankserve without hit counts?)")
    keep = sorted(range(len(runs)), key=lambda i: (-runs[i]["hits"], i))[: args.count]
    for i in sorted(keep):
        print(runs[i]["query"])
    hits = sorted(runs[i]["hits"] for i in keep)
    print(f"{len(keep)} of {len(runs)} queries, hits from {hits[0]} to {hits[-1]} (median {hits[len(hits) // 2]})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
