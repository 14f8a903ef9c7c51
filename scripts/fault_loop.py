#!/usr/bin/env python3
"""kill -9 loop (issue 19): the release server is killed with SIGKILL at a random moment while
rankers are uploaded (PUT /v1/rankers/{name}, two names, each alternating between an old and a
new version) and the index is reloaded (POST /v1/index/reload, alternating between two
directories), then restarted. After every kill:

  - every ranker file in the store is byte for byte the old or the new version (never half
    written);
  - the server starts again and answers: /readyz, the ranker listed, a /v1/rank request scored
    as the old or the new version scores it, a /v1/search answered as before any kill.

Leftover `.upload-*.tmp` files are counted (the store removes those older than 10 minutes when
it opens). Fails (exit 1) on any check that does not hold.

    python3 scripts/fault_loop.py [--seconds 60] [--iterations N]

Needs a release build (cargo build --release) or --bin PATH; standard library only.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

TOKEN = "fault-loop"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="target/release/rankserve")
    p.add_argument("--seconds", type=float, default=60.0, help="stop starting iterations after this")
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--port", type=int, default=18710)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def call(port, method, path, body=None, timeout=30):
    """(status, parsed JSON reply or raw bytes)."""
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Authorization", f"Bearer {TOKEN}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def variants(path):
    """The ranker file as shipped and a version scoring differently (its last bias + 1)."""
    old = open(path, "rb").read()
    ranker = json.loads(old)
    ranker["layers"][-1]["bias"][0] += 1.0
    return old, json.dumps(ranker, indent=1).encode()


def main():
    args = parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="rankserve-faults-")
    rankers = os.path.join(work, "rankers")
    os.makedirs(rankers)
    versions = {"soak": variants("rankers/medium.json"), "soak_small": variants("rankers/small.json")}
    for name, (old, _) in versions.items():
        open(os.path.join(rankers, f"{name}.json"), "wb").write(old)
    corpus = os.path.join(work, "corpus.jsonl")
    subprocess.run([args.bin, "corpus", "synth", "--docs", "5000", "--seed", "1", "--out", corpus],
                   check=True, stdout=subprocess.DEVNULL)
    indexes = [os.path.join(work, "index-a"), os.path.join(work, "index-b")]
    subprocess.run([args.bin, "index", "build", "--corpus", corpus, "--out", indexes[0]],
                   check=True, stdout=subprocess.DEVNULL)
    shutil.copytree(indexes[0], indexes[1])
    log = open(os.path.join(work, "serve.log"), "w")
    port = args.port

    def start():
        server = subprocess.Popen(
            [args.bin, "serve", "--addr", f"127.0.0.1:{port}", "--rankers", rankers, "--index", indexes[0],
             "--backend", "cpu", "--data-dir", work],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, RANKSERVE_ADMIN_TOKEN=TOKEN))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            if server.poll() is not None:
                return server, None
            try:
                if call(port, "GET", "/readyz", timeout=1)[0] == 200:
                    return server, time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.05)
        return server, None

    log_path = os.path.join(work, "request.jsonl")
    subprocess.run([args.bin, "requests", "synth", "--ranker", "medium", "--docs", "50", "--count", "1",
                    "--out", log_path], check=True, stdout=subprocess.DEVNULL)
    rank_body = json.loads(open(log_path).read())
    search_body = {"query": "the of and", "k": 10, "mode": "or"}

    # The scores of each version and the search answer, before any kill.
    server, ready = start()
    if ready is None:
        sys.exit("the server did not start")
    expected = {}
    for name, pair in versions.items():
        expected[name] = []
        for version in pair:
            assert call(port, "PUT", f"/v1/rankers/{name}", version)[0] == 200
            status, reply = call(port, "POST", "/v1/rank", dict(rank_body, ranker=name))
            assert status == 200, reply
            expected[name].append(reply["scores"])
        assert expected[name][0] != expected[name][1]
    status, reply = call(port, "POST", "/v1/search", search_body)
    assert status == 200, reply
    search_hits = reply["hits"]
    server.kill()
    server.wait()

    failures = []
    counts = {"kills": 0, "uploads answered": 0, "reloads answered": 0, "files new": 0, "files old": 0,
              "leftover temporaries (max)": 0}
    restart_s = []
    started = time.monotonic()
    for it in range(args.iterations):
        if time.monotonic() - started > args.seconds:
            break
        server, ready = start()
        if ready is None:
            failures.append(f"iteration {it}: the server did not restart (exit {server.poll()})")
            break
        restart_s.append(ready)
        for name in versions:
            status, reply = call(port, "GET", f"/v1/rankers/{name}")
            if status != 200:
                failures.append(f"iteration {it}: GET {name}: {status} {reply}")
            status, reply = call(port, "POST", "/v1/rank", dict(rank_body, ranker=name))
            if status != 200 or reply["scores"] not in expected[name]:
                failures.append(f"iteration {it}: {name} scores neither the old nor the new version's")
        status, reply = call(port, "POST", "/v1/search", search_body)
        if status != 200 or reply["hits"] != search_hits:
            failures.append(f"iteration {it}: search answered {status} differently")

        stop = threading.Event()

        def uploads(name):
            while not stop.is_set():
                try:
                    if call(port, "PUT", f"/v1/rankers/{name}", versions[name][rng.randrange(2)])[0] == 200:
                        counts["uploads answered"] += 1
                except OSError:
                    return

        def reloads():
            while not stop.is_set():
                try:
                    if call(port, "POST", "/v1/index/reload", {"dir": rng.choice(indexes)})[0] == 200:
                        counts["reloads answered"] += 1
                except OSError:
                    return

        threads = [threading.Thread(target=uploads, args=(n,)) for n in versions]
        threads.append(threading.Thread(target=reloads))
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.05, 1.0))
        server.send_signal(signal.SIGKILL)
        server.wait()
        counts["kills"] += 1
        stop.set()
        for t in threads:
            t.join()
        for name, (old, new) in versions.items():
            data = open(os.path.join(rankers, f"{name}.json"), "rb").read()
            if data == new:
                counts["files new"] += 1
            elif data == old:
                counts["files old"] += 1
            else:
                failures.append(f"iteration {it}: {name}.json is neither version ({len(data)} bytes)")
        leftover = sum(1 for f in os.listdir(rankers) if f.startswith(".upload-"))
        counts["leftover temporaries (max)"] = max(counts["leftover temporaries (max)"], leftover)

    server, ready = start()
    if ready is None:
        failures.append("the server did not start after the last kill")
    else:
        server.terminate()
        server.wait()
    restart_s.sort()
    print(f"{counts['kills']} kill -9s in {time.monotonic() - started:.0f} s: " +
          ", ".join(f"{k} {v}" for k, v in counts.items() if k != "kills"))
    if restart_s:
        print(f"restart to ready: median {1000 * restart_s[len(restart_s) // 2]:.0f} ms, "
              f"max {1000 * restart_s[-1]:.0f} ms")
    for f in failures[:20]:
        print(f"FAILURE {f}")
    print("FAILED" if failures else "OK")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
