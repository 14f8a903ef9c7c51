#!/usr/bin/env python3
"""rankserve's document stage against the Tantivy crate (issue 21's peer, peers/tantivy), on the
same corpus, the same tokens and the same queries, both engines timed the same way.

peers/tantivy (`tantivy-runner`) indexes the corpus's `body` stream with rankserve's own
tokenizer (pre-tokenized text) and runs each query as a `BooleanQuery` of term queries (AND: all
`Must`, OR: all `Should`) through `TopDocs::order_by_score`, Tantivy's block-max path. Tantivy's
BM25 is k1 = 1.2, b = 0.75 with one-byte quantized document lengths; rankserve runs with the same
k1 and b (`bench selection --k1 1.2 --b 0.75`), exact lengths: scores differ slightly, so the top-k
check is the overlap of the two top-k sets, and the hit counts (every matching document, counted
untimed by each engine) must be equal.

Timing, both sides: one thread, one untimed pass over the queries, then --passes passes each
running every query once; a query's time is its median over the passes. The engines take turns
(--rounds rounds, the order alternating), and a query's time is the median of its rounds. With
--timing back-to-back each query instead runs --passes times in a row (its data stays in cache:
labelled so in the report).

    rankserve corpus synth --docs 1000000 --out corpus.jsonl
    rankserve index build --corpus corpus.jsonl --out idx
    rankserve queries synth --index idx --count 1000 --out queries.txt
    python3 scripts/tantivy_compare.py --corpus corpus.jsonl --index idx --queries queries.txt \\
        --work tw [--rankserve target/release/rankserve] [--runner PATH] [--modes and,or]

--baseline OLD_RANKSERVE runs a second rankserve binary in the same rounds (before/after beside
Tantivy); --clock thread-cpu times both engines by the query thread's CPU time (on a shared machine).

Without --runner the script builds the runner (scripts/build-tantivy-peer.sh, CARGO_TARGET_DIR
as set). Tantivy's index is built once into WORK/tantivy-index and reused while it exists.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, log):
    """Runs `cmd`, appending its output to `log`; returns its stdout."""
    started = time.time()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(cmd)}  # {time.time() - started:.1f} s\n{out.stdout}{out.stderr}\n")
    return out.stdout


def read_runs(path):
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def nearest_rank(sorted_us, q):
    """As rankserve's bench and the runner take percentiles."""
    if not sorted_us:
        return 0.0
    return sorted_us[max(0, math.ceil(len(sorted_us) * q) - 1)]


def summary(us):
    us = sorted(us)
    return {"mean": statistics.fmean(us), "p50": nearest_rank(us, 0.5), "p90": nearest_rank(us, 0.9),
            "p99": nearest_rank(us, 0.99), "max": us[-1]}


def compare(ours, theirs, k):
    """Top-k overlap and hit-count agreement, query by query."""
    overlaps, count_mismatches, examples = [], 0, []
    for a, b in zip(ours, theirs):
        assert a["query"] == b["query"], (a["query"], b["query"])
        if a.get("hits") != b.get("hits"):
            count_mismatches += 1
            if len(examples) < 5:
                examples.append({"query": a["query"], "rankserve": a.get("hits"), "tantivy": b.get("hits")})
        want = set(b["ids"])
        if want or a["ids"]:
            overlaps.append(len(set(a["ids"]) & want) / max(len(want), len(a["ids"]), 1))
    return {
        "mean_top_k_overlap": statistics.fmean(overlaps) if overlaps else None,
        "queries_with_results": len(overlaps),
        "hit_count_mismatches": count_mismatches,
        "hit_count_mismatch_examples": examples,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--index", required=True, help="the rankserve index of the same corpus")
    ap.add_argument("--queries", required=True)
    ap.add_argument("--work", required=True, help="directory for Tantivy's index, the runs and the report")
    ap.add_argument("--rankserve", default=os.path.join(ROOT, "target/release/rankserve"))
    ap.add_argument("--runner", help="a built tantivy-runner (default: build peers/tantivy)")
    ap.add_argument("--baseline", help="another rankserve binary (before a change), run as a third engine "
                    "in the same rounds on the same index: before/after beside Tantivy")
    ap.add_argument("--modes", default="and,or", help="comma-separated: and, or")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="turns per engine, interleaved")
    ap.add_argument("--timing", choices=["passes", "back-to-back"], default="passes")
    ap.add_argument("--clock", choices=["wall", "thread-cpu"], default="wall",
                    help="what both engines read a query's time from (thread-cpu: the query thread's CPU "
                         "time, leaving out waits for a core on a shared machine)")
    ap.add_argument("--index-threads", type=int, default=0, help="Tantivy's indexing threads (0: all)")
    ap.add_argument("--label", default="", help="a name for this query set in the report")
    args = ap.parse_args()

    os.makedirs(args.work, exist_ok=True)
    log = os.path.join(args.work, "log.txt")
    runner = args.runner or subprocess.run(
        ["bash", os.path.join(ROOT, "scripts/build-tantivy-peer.sh")], check=True,
        capture_output=True, text=True).stdout.strip()
    tantivy_index = os.path.join(args.work, "tantivy-index")
    build = None
    if not os.path.exists(os.path.join(tantivy_index, "meta.json")):
        build = json.loads(run([runner, "index", "--corpus", args.corpus, "--out", tantivy_index,
                                "--threads", str(args.index_threads)], log).strip().splitlines()[-1])
        print(f"Tantivy indexed {build['docs']} documents in {build['with_merge_s']:.1f} s "
              f"({build['threads']} threads, merged into one segment): {build['index_bytes'] / 1e6:.0f} MB")

    report = {"label": args.label, "queries_file": args.queries, "k": args.k, "timing": args.timing,
              "clock": args.clock,
              "passes": args.passes, "rounds": args.rounds, "tantivy_build": build, "modes": {}}
    stem = args.label or os.path.splitext(os.path.basename(args.queries))[0]
    for mode in args.modes.split(","):
        engines = ["rankserve", "baseline", "tantivy"] if args.baseline else ["rankserve", "tantivy"]
        per_round = {e: [] for e in engines}
        for r in range(args.rounds):
            order = engines if r % 2 == 0 else engines[::-1]
            for engine in order:
                out = os.path.join(args.work, f"{stem}-{mode}-{engine}-{r}.jsonl")
                if engine != "tantivy":
                    binary = args.rankserve if engine == "rankserve" else args.baseline
                    run([binary, "bench", "selection", "--index", args.index, "--queries", args.queries,
                         "--mode", mode, "--k", str(args.k), "--k1", "1.2", "--b", "0.75",
                         "--reps", str(args.passes), "--timing", args.timing, "--clock", args.clock,
                         "--out", out], log)
                else:
                    timing = (["--back-to-back", str(args.passes)] if args.timing == "back-to-back"
                              else ["--passes", str(args.passes)])
                    run([runner, "search", "--index", tantivy_index, "--queries", args.queries,
                         "--mode", mode, "--k", str(args.k), "--clock", args.clock, "--count",
                         "--out", out] + timing, log)
                per_round[engine].append(read_runs(out))
        # A query's time: the median of its per-round medians.
        merged = {}
        for engine, rounds in per_round.items():
            runs = [dict(r) for r in rounds[0]]
            for i, run_ in enumerate(runs):
                run_["us"] = statistics.median(rr[i]["us"] for rr in rounds)
            merged[engine] = runs
        ours, theirs = merged["rankserve"], merged["tantivy"]
        s_ours, s_theirs = summary([r["us"] for r in ours]), summary([r["us"] for r in theirs])
        rounds = {e: [summary([r["us"] for r in rr]) for rr in per_round[e]] for e in per_round}
        result = {"rankserve_us": s_ours, "tantivy_us": s_theirs, "per_round": rounds,
                  "ratio": {q: s_ours[q] / s_theirs[q] for q in s_ours if s_theirs[q] > 0},
                  "docs_scored_mean": statistics.fmean(r.get("docs_scored", 0) for r in ours),
                  "blocks_decoded_mean": statistics.fmean(r.get("blocks_decoded", 0) for r in ours),
                  "hits_mean": statistics.fmean(r.get("hits", 0) or 0 for r in ours),
                  **compare(ours, theirs, args.k)}
        if args.baseline:
            before = merged["baseline"]
            result["baseline_us"] = summary([r["us"] for r in before])
            result["baseline_ratio"] = {q: result["baseline_us"][q] / s_theirs[q] for q in s_theirs
                                        if s_theirs[q] > 0}
            result["baseline_docs_scored_mean"] = statistics.fmean(r.get("docs_scored", 0) for r in before)
            result["baseline_blocks_decoded_mean"] = statistics.fmean(r.get("blocks_decoded", 0) for r in before)
            # The same top-k (ids and scores) before and after, query by query.
            result["baseline_top_k_differs"] = sum(a["ids"] != b["ids"] or a["scores"] != b["scores"]
                                                   for a, b in zip(ours, before))
        report["modes"][mode] = result
        print(f"{len(ours)} {mode.upper()} queries ({stem}), top-{args.k}, one thread, {args.timing}, {args.clock}"
              f" ({args.passes} per query, {args.rounds} interleaved rounds): top-{args.k} overlap "
              f"{result['mean_top_k_overlap']:.3f}, hit counts differ on {result['hit_count_mismatches']}")
        print("| µs per query | mean | p50 | p90 | p99 | max |")
        print("|---|---:|---:|---:|---:|---:|")
        rows = [("tantivy", s_theirs), ("rankserve", s_ours)]
        if args.baseline:
            rows.insert(1, ("rankserve (baseline)", result["baseline_us"]))
        for name, s in rows:
            print(f"| {name} | {s['mean']:.1f} | {s['p50']:.1f} | {s['p90']:.1f} | {s['p99']:.1f} | {s['max']:.1f} |")
        ratio = result["ratio"]
        print(f"| rankserve / tantivy | {ratio['mean']:.2f} | {ratio['p50']:.2f} | {ratio['p90']:.2f} | "
              f"{ratio['p99']:.2f} | {ratio['max']:.2f} |")
        print(f"docs scored per query {result['docs_scored_mean']:.0f}, blocks decoded {result['blocks_decoded_mean']:.0f}"
              + (f" (baseline {result['baseline_docs_scored_mean']:.0f}, {result['baseline_blocks_decoded_mean']:.0f}; "
                 f"top-k differs from the baseline's on {result['baseline_top_k_differs']} queries)"
                 if args.baseline else ""))
    with open(os.path.join(args.work, f"report-{stem}.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
