#!/usr/bin/env python3
"""Two-term AND queries over the synthetic corpus (`rankserve corpus synth`) whose lists' length
ratio spans 1 to ~4 x 10^4 (10 M documents), for the CPU-vs-GPU intersection crossover by
length ratio:

    python3 scripts/ratio-queries.py > ratio.txt
    rankserve bench selection --index IDX --queries ratio.txt --mode and --gpu --gpu-out ratio.jsonl
    python3 scripts/ratio-queries.py --table ratio.jsonl

A synthetic term is its Zipf rank written in bijective base 64 with 64 syllables
(`corpus::synth_word`), so a rank names a term without reading the index; its df is whatever the
corpus gave it, and the table reads the dfs back from the benchmark's log.
"""
import json
import sys

SYLLABLES = [c + v for c in "bdfgklmnprstv" for v in "aeiou"][:64]


def synth_word(rank):
    digits = []
    while rank > 0:
        rank -= 1
        digits.append(rank % 64)
        rank //= 64
    return "".join(SYLLABLES[d] for d in reversed(digits))


def queries():
    # The shorter list's rank, then longer lists from rank 1 (the commonest term) up to it.
    for short in (300, 3_000, 30_000, 300_000):
        longs = sorted({max(1, round(short / 10 ** (i / 4))) for i in range(0, 25)})
        for long in longs:
            if long < short:
                yield f"{synth_word(short)} {synth_word(long)}"


def table(path):
    rows = [json.loads(line) for line in open(path)]
    bins = {}
    for r in rows:
        if len(r["dfs"]) != 2 or min(r["dfs"]) == 0:
            continue
        short, long = sorted(r["dfs"])
        ratio = long / short
        decade = 0
        while 10 ** (decade + 1) <= ratio:
            decade += 1
        bins.setdefault(decade, []).append((r["cpu_us"], r["gpu_us"], short, long))
    print("| length ratio | queries | shorter list (median df) | CPU µs (median) | GPU µs (median) | GPU faster in |")
    print("|---|---:|---:|---:|---:|---:|")
    med = lambda v: sorted(v)[len(v) // 2]
    for decade in sorted(bins):
        b = bins[decade]
        wins = sum(1 for c, g, _, _ in b if g < c)
        print(f"| 10^{decade}–10^{decade + 1} | {len(b)} | {med([s for *_, s, _ in b])} | "
              f"{med([c for c, *_ in b]):.1f} | {med([g for _, g, *_ in b]):.1f} | {wins}/{len(b)} |")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        for q in queries():
            print(q)
