#!/usr/bin/env python3
"""LightGBM peer for `rankserve bench ranking` (issues 2 and 4).

Trains a lambdarank model of --trees trees with up to --leaves leaves over --features features
with --missing of the values missing (NaN), on synthetic queries; dumps it with dump_model() to
OUT/model.json (and saves it as OUT/model.txt, the text model lleaves compiles); writes --rows test rows to OUT/rows.csv (no header, empty field = missing, values
printed to round-trip); times LightGBM's own predict (raw scores) on 1 thread and on --threads
threads, median of --reps; writes its raw scores to OUT/scores.txt and a summary to
OUT/peer.json. Then rankserve scores the same rows:

    python3 scripts/lightgbm_peer.py --out .peer
    rankserve ranker import --format lightgbm --in .peer/model.json --out .peer/lightgbm.json
    rankserve bench ranking --ranker .peer/lightgbm.json --features .peer/rows.csv \\
        --expect .peer/scores.txt --docs 1,100,10000

Everything it writes is generated data: keep OUT out of git (.peer/ is ignored).
"""

import argparse
import json
import os
import statistics
import time

import lightgbm as lgb
import numpy as np


def synth(rng, n, n_features, missing):
    """Feature rows with a few informative features, NaN at random, relevance labels 0-4."""
    x = rng.normal(size=(n, n_features))
    # Some integer-valued and skewed columns, as ranking features are.
    x[:, ::7] = np.floor(np.abs(x[:, ::7]) * 3)
    x[:, 1::5] = np.exp(x[:, 1::5])
    signal = x[:, 0] + 0.5 * x[:, 3] - 0.3 * x[:, 10] + 0.2 * np.tanh(x[:, 20] * x[:, 21])
    label = np.clip(np.round(signal + rng.normal(scale=0.7, size=n) + 1.5), 0, 4)
    x[rng.random(size=x.shape) < missing] = np.nan
    return x, label


def test_rows(seed=7, train_rows=20000, rows=10000, features=136, missing=0.05):
    """The test rows main() writes to rows.csv with these arguments, drawn again without
    training (the same generator draws the training rows first)."""
    rng = np.random.default_rng(seed)
    synth(rng, train_rows, features, missing)
    return synth(rng, rows, features, missing)[0]


def fmt(v):
    return "" if np.isnan(v) else repr(float(v))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".peer")
    p.add_argument("--trees", type=int, default=1250)
    p.add_argument("--leaves", type=int, default=63)
    p.add_argument("--features", type=int, default=136)
    p.add_argument("--missing", type=float, default=0.05)
    p.add_argument("--train-rows", type=int, default=20000)
    p.add_argument("--rows", type=int, default=10000)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)

    x, y = synth(rng, a.train_rows, a.features, a.missing)
    group = [50] * (a.train_rows // 50) + ([a.train_rows % 50] if a.train_rows % 50 else [])
    params = {
        "objective": "lambdarank",
        "num_leaves": a.leaves,
        "learning_rate": 0.05,
        "min_data_in_leaf": 10,
        "feature_fraction": 0.8,
        "bagging_fraction": 0.8,
        "bagging_freq": 1,
        "num_threads": a.threads,
        "seed": a.seed,
        "verbosity": -1,
    }
    t0 = time.perf_counter()
    booster = lgb.train(params, lgb.Dataset(x, label=y, group=group), num_boost_round=a.trees)
    train_s = time.perf_counter() - t0
    model = booster.dump_model()
    leaves = [t["num_leaves"] for t in model["tree_info"]]
    with open(os.path.join(a.out, "model.json"), "w") as f:
        json.dump(model, f)
    booster.save_model(os.path.join(a.out, "model.txt"))  # what lleaves compiles

    xt, _ = synth(rng, a.rows, a.features, a.missing)
    with open(os.path.join(a.out, "rows.csv"), "w") as f:
        for row in xt:
            f.write(",".join(fmt(v) for v in row) + "\n")

    timings = {}
    scores = None
    for threads in sorted({1, a.threads}):
        booster.predict(xt[:100], raw_score=True, num_threads=threads)  # warm-up
        samples = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            scores = booster.predict(xt, raw_score=True, num_threads=threads)
            samples.append((time.perf_counter() - t0) * 1e3)
        timings[threads] = {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples)}
    with open(os.path.join(a.out, "scores.txt"), "w") as f:
        for s in scores:
            f.write(repr(float(s)) + "\n")
    summary = {
        "lightgbm": lgb.__version__,
        "trees": len(leaves),
        "leaves_max": max(leaves),
        "leaves_mean": sum(leaves) / len(leaves),
        "features": a.features,
        "missing": a.missing,
        "train_rows": a.train_rows,
        "train_s": round(train_s, 2),
        "rows": a.rows,
        "predict": {f"{t}_threads": v for t, v in timings.items()},
    }
    with open(os.path.join(a.out, "peer.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("lightgbm peer:", json.dumps(summary))


if __name__ == "__main__":
    main()
