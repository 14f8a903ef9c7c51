#!/usr/bin/env python3
"""Load and slow-client soak of the release server (issue 19): 64 clients (by default) send a
mix of /v1/rank (the bundled rankers, 100 and 1 000 hit documents) and /v1/search (a small
synthetic index, half of them ranked by `medium`) over keep-alive connections for a bounded
time, beside slow clients that trickle their bodies and idle connections that send nothing.
The server's RSS is sampled every 5 s. The same load runs twice on one server.

Fails (exit 1) on:
  - any 5xx other than 503 `overloaded` (every 503 must carry that code and Retry-After);
  - RSS growth between the runs: the second run's peak above the first's by more than
    --rss-tolerance (10 % by default) plus 16 MiB;
  - a good request's answer changing: every request's reply (scores and order; hits, docs
    and scores) must equal the one it got, alone, before the load.

Prints per run: throughput, p50/p99 by kind, status counts, the slow and idle clients'
outcomes, and the RSS samples.

    python3 scripts/load_soak.py [--seconds 60] [--clients 64] [--slow 8] [--idle 32]

Needs a release build (cargo build --release) or --bin PATH. Python 3.8+, standard library
only; the clients run in one asyncio process, which on a small machine shares the cores with
the server (say so beside the figures).
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="target/release/rankserve")
    p.add_argument("--seconds", type=float, default=60.0, help="length of each of the two runs")
    p.add_argument("--clients", type=int, default=64, help="closed-loop clients")
    p.add_argument("--slow", type=int, default=8, help="clients trickling their bodies")
    p.add_argument("--idle", type=int, default=32, help="connections that send nothing")
    p.add_argument("--trickle-bytes-per-s", type=float, default=200.0)
    p.add_argument("--docs", type=int, default=20000, help="documents of the synthetic index")
    p.add_argument("--rss-tolerance", type=float, default=0.10)
    p.add_argument("--port", type=int, default=18610)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    return p.parse_args()


def run(cmd, **kw):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kw)


def prepare(args, work):
    """Rankers, the synthetic index and the request bodies: [(kind, path, body bytes)]."""
    rankers = os.path.join(work, "rankers")
    os.makedirs(rankers)
    for name in ("small", "medium"):
        shutil.copy(f"rankers/{name}.json", rankers)
    corpus = os.path.join(work, "corpus.jsonl")
    run([args.bin, "corpus", "synth", "--docs", str(args.docs), "--seed", "1", "--out", corpus])
    index = os.path.join(work, "index")
    run([args.bin, "index", "build", "--corpus", corpus, "--out", index])
    os.remove(corpus)
    queries = os.path.join(work, "queries.txt")
    run([args.bin, "queries", "synth", "--index", index, "--count", "64", "--out", queries])
    requests = []
    for ranker, docs, count in (("medium", 100, 24), ("small", 100, 8), ("medium", 1000, 8)):
        log = os.path.join(work, f"{ranker}-{docs}.jsonl")
        run([args.bin, "requests", "synth", "--ranker", ranker, "--rankers", rankers,
             "--docs", str(docs), "--count", str(count), "--k", "10", "--out", log])
        with open(log) as f:
            for line in f:
                requests.append((f"rank {ranker} {docs}", "/v1/rank", line.strip().encode()))
    with open(queries) as f:
        for i, line in enumerate(l.strip() for l in f if l.strip()):
            body = {"query": line, "k": 10, "mode": "or"}
            kind = "search"
            if i % 2:
                body.update(ranker="medium", candidates=200)
                kind = "search medium"
            requests.append((kind, "/v1/search", json.dumps(body).encode()))
    return rankers, index, requests


def request_bytes(path, body, port):
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head, body


async def read_response(reader):
    """(status, headers, body); raises on a closed connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


def answer_of(path, body):
    """The part of a reply that must not change under load."""
    reply = json.loads(body)
    if path == "/v1/rank":
        return (reply["scores"], reply.get("order"))
    return [(h["doc"], h["id"], h["score"], h["selection_score"]) for h in reply["hits"]]


class Tally:
    def __init__(self):
        self.latency = defaultdict(list)
        self.status = Counter()
        self.failures = []
        self.slow = Counter()
        self.idle = Counter()

    def fail(self, what):
        if len(self.failures) < 20:
            self.failures.append(what)
        self.status["FAILED"] += 1


async def client(port, requests, expected, deadline, tally, rng):
    reader = writer = None
    while time.monotonic() < deadline:
        i = rng.randrange(len(requests))
        kind, path, body = requests[i]
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head, body = request_bytes(path, body, port)
            started = time.monotonic()
            writer.write(head + body)
            await writer.drain()
            status, headers, reply = await read_response(reader)
            tally.latency[kind].append(time.monotonic() - started)
            tally.status[status] += 1
            if status == 200:
                if answer_of(path, reply) != expected[i]:
                    tally.fail(f"{kind} request {i}: the answer changed under load")
            elif status == 503:
                code = json.loads(reply)["error"]["code"]
                if code != "overloaded" or "retry-after" not in headers:
                    tally.fail(f"{kind}: 503 {code}, Retry-After {headers.get('retry-after')}")
            elif status >= 500:
                tally.fail(f"{kind}: {status} {reply[:200]!r}")
            if headers.get("connection", "").lower() == "close":
                writer.close()
                writer = None
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as e:
            tally.status["connection " + type(e).__name__] += 1
            writer = None
    if writer is not None:
        writer.close()


async def slow_client(port, requests, deadline, tally, rng, rate):
    """Sends a whole request, its body trickled at `rate` bytes/s; records what came back."""
    while time.monotonic() < deadline:
        kind, path, body = requests[rng.randrange(len(requests))]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head, body = request_bytes(path, body, port)
            writer.write(head)
            chunk = max(1, int(rate / 10))
            sent = 0
            answered = None
            while sent < len(body) and time.monotonic() < deadline:
                writer.write(body[sent:sent + chunk])
                sent += chunk
                await writer.drain()
                try:
                    answered = await asyncio.wait_for(read_response(reader), 0.1)
                    break
                except asyncio.TimeoutError:
                    pass
            if answered is None and sent >= len(body):
                answered = await asyncio.wait_for(read_response(reader), 30)
            if answered is None:
                tally.slow["unfinished at the end"] += 1
            else:
                status, _, reply = answered
                tally.slow[status] += 1
                if status >= 500 and status != 503:
                    tally.fail(f"slow {kind}: {status} {reply[:200]!r}")
            writer.close()
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            tally.slow["closed by the server"] += 1
        except asyncio.TimeoutError:
            tally.slow["no answer in 30 s"] += 1


async def idle_connection(port, deadline, tally):
    """Connects and sends nothing; records whether the server closed it before the end."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        tally.idle["refused"] += 1
        return
    try:
        data = await asyncio.wait_for(reader.read(1), max(0.0, deadline - time.monotonic()))
        tally.idle["closed by the server" if not data else "sent bytes unasked"] += 1
    except asyncio.TimeoutError:
        tally.idle["open at the end"] += 1
    except (ConnectionError, OSError):
        tally.idle["reset by the server"] += 1
    writer.close()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def sample_rss(pid, deadline, started, samples):
    while time.monotonic() < deadline:
        samples.append((time.monotonic() - started, rss_kib(pid)))
        await asyncio.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
    samples.append((time.monotonic() - started, rss_kib(pid)))


async def expected_answers(port, requests):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = []
    for kind, path, body in requests:
        head, body = request_bytes(path, body, port)
        writer.write(head + body)
        status, _, reply = await read_response(reader)
        if status != 200:
            sys.exit(f"{kind}: {status} {reply[:300]!r} before any load")
        out.append(answer_of(path, reply))
    writer.close()
    return out


async def one_run(args, pid, requests, expected, started):
    tally = Tally()
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.seconds
    samples = []
    tasks = [sample_rss(pid, deadline, started, samples)]
    tasks += [client(args.port, requests, expected, deadline, tally, random.Random(rng.random()))
              for _ in range(args.clients)]
    tasks += [slow_client(args.port, requests, deadline, tally, random.Random(rng.random()),
                          args.trickle_bytes_per_s) for _ in range(args.slow)]
    tasks += [idle_connection(args.port, deadline, tally) for _ in range(args.idle)]
    t0 = time.monotonic()
    await asyncio.gather(*tasks)
    return tally, samples, time.monotonic() - t0


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def report(n, tally, samples, elapsed):
    total = sum(len(v) for v in tally.latency.values())
    print(f"== run {n}: {elapsed:.0f} s, {total} answered requests, {total / elapsed:.1f} req/s")
    for kind in sorted(tally.latency):
        lat = tally.latency[kind]
        print(f"  {kind:<18} {len(lat) / elapsed:8.1f} req/s  p50 {1000 * percentile(lat, 0.5):7.1f} ms"
              f"  p99 {1000 * percentile(lat, 0.99):7.1f} ms")
    print("  statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(tally.status.items(), key=str)))
    print("  slow clients: " + (", ".join(f"{k}: {v}" for k, v in sorted(tally.slow.items(), key=str)) or "none"))
    print("  idle connections: " + (", ".join(f"{k}: {v}" for k, v in sorted(tally.idle.items(), key=str)) or "none"))
    print("  RSS (s: MiB): " + ", ".join(f"{t:.0f}: {kib / 1024:.0f}" for t, kib in samples))
    for f in tally.failures:
        print(f"  FAILURE {f}")


async def main():
    args = parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    work = tempfile.mkdtemp(prefix="rankserve-soak-")
    server = None
    try:
        rankers, index, requests = prepare(args, work)
        log = open(os.path.join(work, "serve.log"), "w")
        env = dict(os.environ, RANKSERVE_LOG_FORMAT="json")
        server = subprocess.Popen(
            [args.bin, "serve", "--addr", f"127.0.0.1:{args.port}", "--rankers", rankers,
             "--index", index, "--backend", args.backend, "--data-dir", work],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        for _ in range(300):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", args.port)
                writer.write(f"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                status, _, _ = await read_response(reader)
                writer.close()
                if status == 200:
                    break
            except (OSError, asyncio.IncompleteReadError):
                pass
            await asyncio.sleep(0.1)
        else:
            sys.exit("the server did not become ready")
        expected = await expected_answers(args.port, requests)
        print(f"server pid {server.pid}, {len(requests)} distinct requests, {args.clients} clients, "
              f"{args.slow} slow, {args.idle} idle, {args.seconds:.0f} s a run, RSS before load "
              f"{rss_kib(server.pid) / 1024:.0f} MiB")
        started = time.monotonic()
        peaks = []
        failed = False
        for n in (1, 2):
            tally, samples, elapsed = await one_run(args, server.pid, requests, expected, started)
            report(n, tally, samples, elapsed)
            # The first sample is taken before the run's load (the end of the previous run).
            peaks.append(max(kib for _, kib in samples[1:]))
            failed |= bool(tally.failures) or server.poll() is not None
        growth = peaks[1] - peaks[0]
        allowed = args.rss_tolerance * peaks[0] + 16 * 1024
        print(f"RSS peak run 1 {peaks[0] / 1024:.0f} MiB, run 2 {peaks[1] / 1024:.0f} MiB "
              f"(growth {growth / 1024:+.0f} MiB, allowed {allowed / 1024:.0f} MiB)")
        if growth > allowed:
            print("FAILURE: RSS grew between the runs")
            failed = True
        if server.poll() is not None:
            print(f"FAILURE: the server exited with {server.returncode}")
        print("FAILED" if failed else "OK")
        return 1 if failed else 0
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait()
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
