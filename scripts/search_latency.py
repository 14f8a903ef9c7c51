#!/usr/bin/env python3
"""Latency of POST /v1/search against a running `rankserve serve`, one client, keep-alive.

Sends every query of a queries file (one per line, as `rankserve queries synth` writes them)
once per configuration (ranker × candidates), after one warm-up pass, and prints per
configuration the median and p90 of the client-measured latency and the medians of the server's
stage timings (select_us, fe_us, me_us, queue_us, total_us). Standard library only.

Example:
  rankserve serve --index idx --addr 127.0.0.1:8090 &
  scripts/search_latency.py --url http://127.0.0.1:8090 --queries q.txt \
      --rankers none,small,medium,large --candidates 100,1000 --mode or
"""

import argparse
import http.client
import json
import statistics
import time
import urllib.parse


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--rankers", default="none,small,medium,large", help="'none' is BM25 order")
    p.add_argument("--candidates", default="100,1000")
    p.add_argument("--mode", default="or", choices=["and", "or", "and_or"])
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args()

    url = urllib.parse.urlparse(args.url)
    conn = http.client.HTTPConnection(url.hostname, url.port)
    with open(args.queries) as f:
        queries = [line.strip() for line in f if line.strip()]

    def search(body):
        payload = json.dumps(body)
        started = time.perf_counter()
        conn.request("POST", "/v1/search", payload, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        elapsed_us = (time.perf_counter() - started) * 1e6
        if response.status != 200:
            raise SystemExit(f"{response.status}: {data[:300]!r}")
        return elapsed_us, json.loads(data)

    print(f"{len(queries)} queries, mode {args.mode}, k {args.k}")
    print("ranker   cand  hits  client_p50_us client_p90_us  select_us fe_us  me_us queue_us total_us")
    for ranker in args.rankers.split(","):
        for candidates in [int(c) for c in args.candidates.split(",")]:
            if ranker == "none" and candidates != int(args.candidates.split(",")[0]):
                continue  # candidates do not matter without a ranker
            body = {"mode": args.mode, "k": args.k, "candidates": candidates}
            if ranker != "none":
                body["ranker"] = ranker
            for q in queries:  # warm-up: caches, the ranker's batching thread
                search(dict(body, query=q))
            client, timings, hits = [], {}, []
            for q in queries:
                elapsed, reply = search(dict(body, query=q))
                client.append(elapsed)
                hits.append(len(reply["hits"]))
                for key, value in reply["timings"].items():
                    if value is not None:
                        timings.setdefault(key, []).append(value)
            med = {key: statistics.median(v) for key, v in timings.items()}
            print(
                f"{ranker:8} {candidates:5} {statistics.mean(hits):5.1f} {statistics.median(client):13.0f} "
                f"{percentile(client, 0.9):13.0f} {med['select_us']:10.0f} {med['fe_us']:5.0f} "
                f"{med['me_us']:6.0f} {med['queue_us']:8.0f} {med['total_us']:8.0f}"
            )


if __name__ == "__main__":
    main()
