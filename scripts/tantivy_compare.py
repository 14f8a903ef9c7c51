#!/usr/bin/env python3
"""rankserve's document stage against Tantivy (issue 5's peer check), on the same corpus and
queries, one thread per query on both sides.

Tantivy indexes `body` only with its default tokenizer (split on non-alphanumerics, lower-case:
the same tokens as rankserve's tokenizer on the synthetic corpus) and scores BM25 with k1 = 1.2,
b = 0.75 and one-byte quantized document lengths; rankserve is run with the same k1 and b
(`rankserve bench selection --k1 1.2 --b 0.75`) and, as DESIGN §5 says, scores `body` by
default. Scores differ slightly (quantized lengths), so the check is the overlap of the top-10
sets, and the latency is each side's median over its own repetitions per query.

    pip install tantivy
    rankserve corpus synth --docs 5000000 --out corpus.jsonl
    rankserve index build --corpus corpus.jsonl --out idx
    rankserve queries synth --index idx --count 1000 --out queries.txt
    python3 scripts/tantivy_compare.py --corpus corpus.jsonl --index idx --queries queries.txt \
        --work tantivy-work [--rankserve target/release/rankserve] [--mode and]

Tantivy's search is timed from Python around `searcher.search` with the query parsed
beforehand: the call's own overhead (a few µs) counts against Tantivy, so the comparison
slightly favours rankserve at the microsecond scale; it is reported with the results.
"""

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time


def read_corpus(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                doc = json.loads(line)
                yield doc["id"], doc.get("streams", {}).get("body", "")


def build_tantivy(corpus, directory, threads):
    import tantivy

    schema = tantivy.SchemaBuilder()
    schema.add_text_field("id", stored=True, tokenizer_name="raw")
    schema.add_text_field("body", stored=False)
    schema = schema.build()
    os.makedirs(directory, exist_ok=True)
    index = tantivy.Index(schema, path=directory)
    writer = index.writer(heap_size=1 << 30, num_threads=threads)
    started = time.perf_counter()
    n = 0
    for doc_id, body in read_corpus(corpus):
        writer.add_document(tantivy.Document(id=doc_id, body=body))
        n += 1
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return index, n, time.perf_counter() - started


def tantivy_runs(index, queries, mode, k, reps):
    searcher = index.searcher()
    runs = []
    for text in queries:
        terms = [t for t in text.split() if t]
        joined = " ".join(("+" + t) if mode == "and" else t for t in terms)
        query = index.parse_query(joined, ["body"])
        hits = searcher.search(query, k).hits
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            hits = searcher.search(query, k).hits
            times.append((time.perf_counter() - started) * 1e6)
        ids = [searcher.doc(address)["id"][0] for _, address in hits]
        runs.append({"query": text, "us": statistics.median(times), "ids": ids})
    return runs


def summary(us):
    us = sorted(us)
    at = lambda q: us[max(0, min(len(us) - 1, int(len(us) * q + 0.999999) - 1))]
    return {"mean": statistics.fmean(us), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--index", required=True, help="the rankserve index of the same corpus")
    ap.add_argument("--queries", required=True)
    ap.add_argument("--work", required=True, help="directory for Tantivy's index and the runs")
    ap.add_argument("--rankserve", default="target/release/rankserve")
    ap.add_argument("--mode", choices=["and", "or"], default="and")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="Tantivy's indexing threads")
    args = ap.parse_args()

    queries = [q.strip() for q in open(args.queries, encoding="utf-8") if q.strip()]
    os.makedirs(args.work, exist_ok=True)
    ours_path = os.path.join(args.work, "rankserve-runs.jsonl")
    subprocess.run(
        [args.rankserve, "bench", "selection", "--index", args.index, "--queries", args.queries,
         "--mode", args.mode, "--k", str(args.k), "--k1", "1.2", "--b", "0.75",
         "--reps", str(args.reps), "--out", ours_path],
        check=True,
    )
    ours = [json.loads(line) for line in open(ours_path, encoding="utf-8")]

    index, n_docs, build_s = build_tantivy(args.corpus, os.path.join(args.work, "tantivy-index"), args.threads)
    print(f"Tantivy indexed {n_docs} documents in {build_s:.1f} s with {args.threads} threads "
          f"({n_docs / build_s:.0f} docs/s)")
    theirs = tantivy_runs(index, queries, args.mode, args.k, args.reps)

    overlaps = []
    for a, b in zip(ours, theirs):
        want = set(b["ids"])
        if not want and not a["ids"]:
            continue  # both empty: nothing to compare
        overlaps.append(len(set(a["ids"]) & want) / max(len(want), len(a["ids"]), 1))
    s_ours, s_theirs = summary([r["us"] for r in ours]), summary([r["us"] for r in theirs])
    report = {
        "queries": len(queries),
        "mode": args.mode,
        "k": args.k,
        "mean_top_k_overlap": statistics.fmean(overlaps) if overlaps else None,
        "compared": len(overlaps),
        "rankserve_us": s_ours,
        "tantivy_us": s_theirs,
    }
    json.dump(report, open(os.path.join(args.work, "report.json"), "w"), indent=1)
    print(f"{len(queries)} {args.mode.upper()} queries, top-{args.k}: mean overlap "
          f"{report['mean_top_k_overlap']:.3f} over {len(overlaps)} queries with results")
    print(f"{'µs per query, 1 thread':<24}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name, s in (("rankserve", s_ours), ("tantivy", s_theirs)):
        print(f"{name:<24}{s['mean']:>10.1f}{s['p50']:>10.1f}{s['p90']:>10.1f}{s['p99']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
