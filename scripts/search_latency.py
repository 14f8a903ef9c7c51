#!/usr/bin/env python3
"""Latency of POST /v1/search against a running `rankserve serve`, keep-alive clients.

Sends every query of a queries file (one per line, as `rankserve queries synth` writes them)
once per configuration (ranker × candidates), after one warm-up pass, from `--concurrency`
clients (processes, one connection each, taking the queries in turn) — or, with `--seconds`,
each client cycles through its share for that long after the warm-up pass, and the throughput is
the answers within that window over its length (one pass of a few queries per client measures
mostly how the clients start and end) — and prints per configuration
the throughput, the median, p90 and p99 of the client-measured latency, the medians of the
server's stage timings (select_us, fe_us, me_us, queue_us, total_us), the p99 of select_us and
total_us, with `--seconds` how busy the host's cores were (every process, the clients' included)
and the server's devices' seconds in turns per second (summed over devices: 2.00 is two devices
never idle) over the window, and how many queries each processor selected (`backends.select`).
Standard library only.

Example:
  rankserve serve --index idx --addr 127.0.0.1:8090 &
  scripts/search_latency.py --url http://127.0.0.1:8090 --queries q.txt \\
      --rankers none,small,medium,large --candidates 100,1000 --mode or --concurrency 4
"""

import argparse
import collections
import http.client
import json
import multiprocessing
import statistics
import time
import urllib.parse


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def client(url, bodies, start, until=None):
    """One client: sends `bodies` in turn on one keep-alive connection from `start` (a shared
    clock) on, once each or, with `until`, round and round until then; returns
    [(latency_us, reply)] or raises SystemExit on a non-200 answer."""
    conn = http.client.HTTPConnection(url.hostname, url.port)
    while time.time() < start:
        time.sleep(0.0005)
    results = []
    sent = 0
    while sent < len(bodies) if until is None else time.time() < until:
        body = bodies[sent % len(bodies)]
        sent += 1
        payload = json.dumps(body).encode()
        started = time.perf_counter()
        conn.request("POST", "/v1/search", payload, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        elapsed_us = (time.perf_counter() - started) * 1e6
        if response.status != 200:
            raise SystemExit(f"{response.status}: {data[:300]!r}")
        if until is not None and time.time() > until:
            break  # answered after the window
        results.append((elapsed_us, json.loads(data)))
    return results


def load_counters(url):
    """The host's idle and total CPU ticks (/proc/stat, every core; None elsewhere) and the
    server's seconds in device turns, summed over its devices (/metrics)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        cpu = (ticks[3] + ticks[4], sum(ticks))
    except OSError:
        cpu = None
    conn = http.client.HTTPConnection(url.hostname, url.port)
    conn.request("GET", "/metrics")
    turns = sum(
        float(line.split()[-1])
        for line in conn.getresponse().read().decode().splitlines()
        if line.startswith("rankserve_gpu_device_busy_microseconds_total")
    )
    return cpu, turns / 1e6


def run(url, bodies, concurrency, seconds=None):
    """Sends `bodies` from `concurrency` client processes (one Python process each: threads of
    one process share its interpreter lock, which measured 5× the server's own median time on
    the H100 host with four of them), client i taking bodies i, i + concurrency, ... (once each,
    or for `seconds` round and round); returns (seconds from the common start to the last
    answer, or `seconds`; [(latency_us, reply)]; with `seconds`, how busy the host's cores were
    and the devices' seconds in turns per second over that window, else None)."""
    if concurrency == 1 and seconds is None:
        started = time.perf_counter()
        results = client(url, bodies, 0)
        return time.perf_counter() - started, results, None
    # Every process is forked and waiting before the clock starts.
    start = time.time() + 0.2 + 0.01 * concurrency
    until = None if seconds is None else start + seconds
    load = None
    with multiprocessing.Pool(concurrency) as pool:
        shares = pool.starmap_async(
            client, [(url, bodies[i::concurrency], start, until) for i in range(concurrency)]
        )
        if until is not None:
            time.sleep(max(0.0, start - time.time()))
            (cpu0, turns0) = load_counters(url)
            time.sleep(max(0.0, until - time.time()))
            (cpu1, turns1) = load_counters(url)
            host = cpu0 and cpu1 and 1 - (cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1])
            load = (host, (turns1 - turns0) / seconds)
        shares = shares.get()
    elapsed = time.time() - start if seconds is None else seconds
    return elapsed, [result for share in shares for result in share], load


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--rankers", default="none,small,medium,large", help="'none' is BM25 order")
    p.add_argument("--candidates", default="100,1000")
    p.add_argument("--mode", default="or", choices=["and", "or", "and_or"])
    p.add_argument("--backend", choices=["auto", "cpu", "gpu"], help="the server's default when absent")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--seconds", type=float, help="closed-loop for this long instead of one pass")
    args = p.parse_args()

    url = urllib.parse.urlparse(args.url)
    with open(args.queries) as f:
        queries = [line.strip() for line in f if line.strip()]

    print(f"{len(queries)} queries, mode {args.mode}, k {args.k}, {args.concurrency} clients, "
          f"backend {args.backend or 'default'}")
    print("ranker   cand  hits    qps  client_p50_us client_p90_us client_p99_us  select_us select_p99 fe_us  me_us "
          "queue_us total_us total_p99 host_busy turns_s/s  selected_by")
    for ranker in args.rankers.split(","):
        for candidates in [int(c) for c in args.candidates.split(",")]:
            if ranker == "none" and candidates != int(args.candidates.split(",")[0]):
                continue  # candidates do not matter without a ranker
            body = {"mode": args.mode, "k": args.k, "candidates": candidates}
            if ranker != "none":
                body["ranker"] = ranker
            if args.backend:
                body["backend"] = args.backend
            bodies = [dict(body, query=q) for q in queries]
            run(url, bodies, args.concurrency)  # warm-up: caches, the ranker's batching thread
            seconds, results, load = run(url, bodies, args.concurrency, args.seconds)
            client = [elapsed for elapsed, _ in results]
            timings = {}
            for _, reply in results:
                for key, value in reply["timings"].items():
                    if value is not None:
                        timings.setdefault(key, []).append(value)
            sides = collections.Counter(reply["backends"]["select"] for _, reply in results)
            hits = statistics.mean(len(reply["hits"]) for _, reply in results)
            med = {key: statistics.median(v) for key, v in timings.items()}
            print(
                f"{ranker:8} {candidates:5} {hits:5.1f} {len(results) / seconds:6.0f} "
                f"{statistics.median(client):13.0f} {percentile(client, 0.9):13.0f} "
                f"{percentile(client, 0.99):13.0f} {med['select_us']:10.0f} "
                f"{percentile(timings['select_us'], 0.99):10.0f} {med['fe_us']:5.0f} "
                f"{med['me_us']:6.0f} {med['queue_us']:8.0f} {med['total_us']:8.0f} "
                f"{percentile(timings['total_us'], 0.99):9.0f} "
                + (f"{load[0]:9.0%} {load[1]:9.2f}  " if load and load[0] is not None else "        -         -  ")
                + " ".join(f"{side}:{n}" for side, n in sorted(sides.items()))
            )


if __name__ == "__main__":
    main()
