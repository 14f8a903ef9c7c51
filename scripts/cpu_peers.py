#!/usr/bin/env python3
"""rankserve's CPU scorer against LightGBM and lleaves (issue 22), in interleaved rounds.

Needs the LightGBM peer model (scripts/lightgbm_peer.py --out PEER: model.txt, rows.csv,
scores.txt, model.json), the cpu_peer example (`cargo build --release --example cpu_peer`: it
reads model.txt through rankserve's LightGBM text importer), and in Python:
lightgbm, numpy, lleaves 1.3.0 with llvmlite 0.44.

    python3 scripts/lightgbm_peer.py --out .peer
    python3 scripts/cpu_peers.py --peer .peer --out .peer/cpu_peers.json

lleaves compiles the model once into PEER/lleaves-HOST.o (its cache; the compile time is kept in
PEER/lleaves-HOST.json) — minutes for 1 250 trees; later runs load the cache (--compile-only
compiles and stops: run it in the background while other scorers are measured). Without
PEER/rows.csv the rows are drawn again as lightgbm_peer.py drew them (its defaults) and
LightGBM's own scores of them are the reference. Each round times
every scorer on every batch size and thread count, the scorers in a rotating order; a cell's
figure is the median over rounds of each round's median, with the [min–max] over rounds; wall
time and the process's CPU time (on a machine shared with other work, CPU time is what a
one-thread call costs, whatever share of a core it got). The
bundled large ranker (--large) has tree inputs and NN layers, which LightGBM and lleaves do not
run: it is timed on rankserve alone (QuickScorer and the block walk). LightGBM and lleaves are
timed through their Python calls (what a user runs), rankserve inside the cpu_peer binary.
"""

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import time

import lightgbm as lgb
import numpy as np


def timed(f, reps):
    """Medians of wall time and of the process's CPU time (ms) over `reps` calls after one."""
    f()  # warm-up
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        f()
        cpu.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def lleaves_model(peer):
    import lleaves

    host = socket.gethostname()
    cache = os.path.join(peer, f"lleaves-{host}.o")
    info_path = os.path.join(peer, f"lleaves-{host}.json")
    model = lleaves.Model(model_file=os.path.join(peer, "model.txt"))
    t0 = time.perf_counter()
    model.compile(cache=cache)
    took = time.perf_counter() - t0
    if os.path.exists(info_path):
        info = json.load(open(info_path))
        info["cached_load_s"] = round(took, 3)
    else:
        info = {"compile_s": round(took, 1), "host": host}
        json.dump(info, open(info_path, "w"))
    return model, info


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", default=".peer")
    p.add_argument("--bin", default="target/release/examples", help="folder with cpu_peer")
    p.add_argument("--large", default="rankers/large.json")
    p.add_argument("--docs", default="1,100,1000,10000")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the all-threads column")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=3, help="timed calls per cell and round")
    p.add_argument("--scorers", default="lightgbm,lleaves,rankserve,large",
                   help="of lightgbm, lleaves, rankserve (the peer model), large (the large ranker)")
    p.add_argument("--compile-only", action="store_true", help="compile lleaves' cache and stop")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    docs = [int(d) for d in a.docs.split(",")]
    thread_counts = sorted({1, a.threads})
    wanted = a.scorers.split(",")
    if a.compile_only:
        print(json.dumps(lleaves_model(a.peer)[1]))
        return

    # The file every scorer reads: LightGBM's model.txt (rankserve's text importer reads its
    # `inf` thresholds as the JSON dump writes them).
    imported = os.path.join(a.peer, "model.txt")
    booster = lgb.Booster(model_file=os.path.join(a.peer, "model.txt"))
    csv = os.path.join(a.peer, "rows.csv")
    expect = os.path.join(a.peer, "scores.txt")
    if os.path.exists(csv):
        rows = np.genfromtxt(csv, delimiter=",", missing_values="", filling_values=np.nan)
    else:
        import lightgbm_peer

        rows = lightgbm_peer.test_rows()
        expect = os.path.join(a.peer, "scores-here.txt")
        with open(expect, "w") as f:
            f.writelines(repr(float(s)) + "\n" for s in booster.predict(rows, raw_score=True))
    rows_bin = os.path.join(a.peer, "rows.f64")
    rows.astype("<f8").tofile(rows_bin)
    want = max(docs)
    reps_needed = -(-want // len(rows))
    x = np.tile(rows, (reps_needed, 1))[:want]

    scorers = {}
    if "lightgbm" in wanted:
        scorers["lightgbm"] = lambda batch, t: booster.predict(batch, raw_score=True, num_threads=t)
    lleaves_info = None
    if "lleaves" in wanted:
        model, lleaves_info = lleaves_model(a.peer)
        scorers["lleaves"] = lambda batch, t: model.predict(batch, n_jobs=t)
        ours = booster.predict(rows, raw_score=True)
        lleaves_info["max_abs_diff_to_lightgbm"] = float(np.max(np.abs(model.predict(rows) - ours)))

    def rankserve(ranker, extra, trees):
        out = subprocess.run(
            [os.path.join(a.bin, "cpu_peer"), "--ranker", ranker, "--docs", a.docs,
             "--threads", ",".join(map(str, thread_counts)), "--trees", trees, "--reps", str(a.reps)] + extra,
            check=True, capture_output=True, text=True).stdout
        return [json.loads(line) for line in out.splitlines()]

    peer_extra = ["--rows", rows_bin, "--expect", expect]
    cells = {}  # (model, scorer, threads, docs) -> [round medians]
    builds = {}
    order = ["lightgbm", "lleaves", "rankserve", "large"]
    for r in range(a.rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            if name in scorers:
                for t in thread_counts:
                    for n in docs:
                        cells.setdefault(("peer", name, t, n), []).append(
                            timed(lambda: scorers[name](x[:n], t), a.reps))
            elif name in ("rankserve", "large") and name in wanted:
                ranker, extra = (imported, peer_extra) if name == "rankserve" else (a.large, [])
                model_name = "peer" if name == "rankserve" else "large"
                for rec in rankserve(ranker, extra, "auto,walk"):
                    scorer = "rankserve " + ("walk" if rec["trees"] == "walk" else "quick")
                    if "build_ms" in rec:
                        builds.setdefault((model_name, scorer), []).append(rec)
                    else:
                        cells.setdefault((model_name, scorer, rec["threads"], rec["docs"]), []).append(
                            (rec["median_ms"], rec["cpu_median_ms"]))
        print(f"round {r + 1} of {a.rounds} done", flush=True)

    summary = {
        "host": cpu_name(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "lightgbm": lgb.__version__, "lleaves": lleaves_info, "rounds": a.rounds, "reps": a.reps,
        "builds": {f"{m} / {s}": {"build_ms": statistics.median(b["build_ms"] for b in recs),
                                   "identical_to_walk": all(b["identical_to_walk"] for b in recs),
                                   "max_abs_diff_to_peer": recs[0]["max_abs_diff_to_peer"]}
                   for (m, s), recs in builds.items()},
        "cells": [{"model": m, "scorer": s, "threads": t, "docs": n,
                   "median_ms": statistics.median(w for w, _ in v), "min_ms": min(w for w, _ in v),
                   "max_ms": max(w for w, _ in v), "cpu_median_ms": statistics.median(c for _, c in v),
                   "cpu_min_ms": min(c for _, c in v), "cpu_max_ms": max(c for _, c in v)}
                  for (m, s, t, n), v in sorted(cells.items())],
    }
    if a.out:
        json.dump(summary, open(a.out, "w"), indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "cells"}, indent=1))
    table = {(c["model"], c["scorer"], c["threads"], c["docs"]): c for c in summary["cells"]}
    for model in ("peer", "large"):
        names = sorted({s for (m, s, _, _) in table if m == model})
        for kind in ("", "cpu_"):
            print(f"\n{model}: {'CPU time' if kind else 'wall time'}, median ms [min-max over rounds]")
            print("| threads | docs | " + " | ".join(names) + " |")
            for t in thread_counts:
                for n in docs:
                    row = [f"{c[kind + 'median_ms']:.3f} [{c[kind + 'min_ms']:.3f}–{c[kind + 'max_ms']:.3f}]"
                           for c in (table.get((model, s, t, n)) for s in names) if c]
                    print(f"| {t} | {n} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
