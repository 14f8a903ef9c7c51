#!/usr/bin/env python3
"""Trains small, deterministic LightGBM and XGBoost models and writes the parity fixtures.

For each model NAME this writes into fixtures/trees/:
  NAME.model.json    LightGBM `booster.dump_model()` / XGBoost `booster.save_model("x.json")`
  NAME.rows.csv      scoring rows, no header, an empty field is a missing value
  NAME.expected.txt  the library's own raw prediction for each row (`raw_score=True` /
                     `output_margin=True`), one per line, printed with `repr` (round-trips)

The scoring rows mix draws from the training distribution with edge cases: every split
threshold read back from the dumped model (exactly on it, and the neighbouring doubles),
NaN, zeros, +-1e-36 and values just past LightGBM's zero threshold (1e-35f), negative and
unseen categories, NaN categories.

It also writes small models that the importer must refuse (multi-class, linear trees).

Run:  pip install -r scripts/requirements-fixtures.txt && python3 scripts/make_tree_fixtures.py
"""

import json
import math
import os
import sys

import lightgbm as lgb
import numpy as np
import xgboost as xgb

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "trees")

# LightGBM's kZeroThreshold is the float 1e-35f, widened to double.
ZERO_THRESHOLD = float(np.float32(1e-35))


def fmt(x):
    """A CSV field: empty for a missing value, else the shortest round-tripping repr."""
    x = float(x)
    return "" if math.isnan(x) else repr(x)


def write_fixture(name, model_json, rows, expected):
    with open(os.path.join(OUT, name + ".model.json"), "w") as f:
        json.dump(model_json, f, separators=(",", ":"))
        f.write("\n")
    with open(os.path.join(OUT, name + ".rows.csv"), "w") as f:
        for row in rows:
            f.write(",".join(fmt(v) for v in row) + "\n")
    with open(os.path.join(OUT, name + ".expected.txt"), "w") as f:
        for v in expected:
            f.write(repr(float(v)) + "\n")
    print(f"{name}: {len(rows)} rows", file=sys.stderr)


def lgb_thresholds(dump):
    """(feature, threshold) of every numerical split in a LightGBM dump."""
    out = []

    def walk(node):
        if "split_feature" not in node:
            return
        if node["decision_type"] == "<=":
            out.append((node["split_feature"], float(node["threshold"])))
        walk(node["left_child"])
        walk(node["right_child"])

    for tree in dump["tree_info"]:
        walk(tree["tree_structure"])
    return out


def xgb_thresholds(model_json):
    """(feature, threshold) of every split in an XGBoost JSON model (thresholds are f32)."""
    out = []
    for tree in model_json["learner"]["gradient_booster"]["model"]["trees"]:
        for i, left in enumerate(tree["left_children"]):
            if left != -1:
                out.append((tree["split_indices"][i], float(np.float32(tree["split_conditions"][i]))))
    return out


def edge_rows(base, thresholds, rng, categorical=()):
    """Rows on and around each threshold, and rows of special values, over random `base` rows."""
    rows = []
    seen = set()
    for feature, t in thresholds:
        if (feature, t) in seen:
            continue
        seen.add((feature, t))
        for v in (t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf)):
            row = base[rng.integers(len(base))].copy()
            row[feature] = v
            rows.append(row)
    n = base.shape[1]
    specials = [np.nan, 0.0, -0.0, 1e-36, -1e-36, 1e-35, -1e-35, ZERO_THRESHOLD, -ZERO_THRESHOLD,
                np.nextafter(ZERO_THRESHOLD, np.inf), -np.nextafter(ZERO_THRESHOLD, np.inf), 1e-300]
    for v in specials:
        rows.append(np.full(n, v))  # every feature at once
        for feature in range(n):
            if feature in categorical:
                continue
            row = base[rng.integers(len(base))].copy()
            row[feature] = v
            rows.append(row)
    for feature in categorical:
        for v in (np.nan, -1.0, -3.0, -0.5, 0.0, 2.5, 100.0, 1.0, 2.0, 3.0):
            row = base[rng.integers(len(base))].copy()
            row[feature] = v
            rows.append(row)
    return rows


def lgb_dump(booster):
    dump = booster.dump_model()
    # Through JSON text and back, so the thresholds we read are exactly those in the file.
    return json.loads(json.dumps(dump))


def lightgbm_lambdarank(rng):
    n_query, per_query, n_feat = 40, 10, 6
    n = n_query * per_query
    X = rng.normal(size=(n, n_feat))
    X[:, 3] = rng.integers(0, 8, size=n)  # categorical: categories 0..7
    X[:, 5] = np.where(rng.random(n) < 0.3, 0.0, X[:, 5])
    score = X[:, 0] + 0.5 * X[:, 1] + np.where(np.isin(X[:, 3], [1, 4, 6]), 1.0, 0.0) - 0.3 * X[:, 2]
    y = np.clip(np.round(score + rng.normal(scale=0.5, size=n)), 0, 4)
    pagerank = X[:, 4].copy()
    X[rng.random((n, n_feat)) < 0.12] = np.nan  # NaN-missing, the categorical included
    X[:, 4] = pagerank  # no missing values in training: missing_type None
    names = ["bm25", "title_hits", "url_depth", "site_category", "pagerank", "clicks"]
    params = dict(objective="lambdarank", num_leaves=7, learning_rate=0.2, min_data_in_leaf=5,
                  min_data_per_group=5, cat_smooth=1.0, max_cat_to_onehot=4, deterministic=True,
                  force_row_wise=True, num_threads=1, seed=7, verbose=-1)
    ds = lgb.Dataset(X, y, group=[per_query] * n_query, feature_name=names,
                     categorical_feature=[3], free_raw_data=False)
    booster = lgb.train(params, ds, num_boost_round=20)
    dump = lgb_dump(booster)
    rows = [X[i].copy() for i in range(120)]
    rows += edge_rows(X[:120], lgb_thresholds(dump), rng, categorical=(3,))
    rows = np.array(rows)
    pred = booster.predict(rows, raw_score=True, num_threads=1)
    write_fixture("lgb_lambdarank", dump, rows, pred)


def lightgbm_binary_zero(rng):
    n, n_feat = 400, 5
    X = rng.normal(size=(n, n_feat))
    X[rng.random((n, n_feat)) < 0.25] = 0.0  # zeros are the missing values here
    X[rng.random((n, n_feat)) < 0.05] = np.nan
    y = ((np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) * np.nan_to_num(X[:, 2])
          + rng.normal(scale=0.5, size=n)) > 0).astype(float)
    params = dict(objective="binary", zero_as_missing=True, num_leaves=7, learning_rate=0.2,
                  min_data_in_leaf=5, deterministic=True, force_row_wise=True, num_threads=1,
                  seed=11, verbose=-1)
    booster = lgb.train(params, lgb.Dataset(X, y), num_boost_round=20)  # Column_i names
    dump = lgb_dump(booster)
    rows = [X[i].copy() for i in range(120)]
    rows += edge_rows(X[:120], lgb_thresholds(dump), rng)
    rows = np.array(rows)
    pred = booster.predict(rows, raw_score=True, num_threads=1)
    write_fixture("lgb_binary_zero", dump, rows, pred)


def xgb_save(booster, path):
    booster.save_model(path)
    with open(path) as f:
        return json.load(f)


def xgboost_ndcg(rng, tmp):
    n_query, per_query, n_feat = 40, 10, 5
    n = n_query * per_query
    X = rng.normal(size=(n, n_feat))
    y = np.clip(np.round(X[:, 0] + 0.5 * X[:, 1] * X[:, 2] + rng.normal(scale=0.5, size=n)), 0, 4)
    X[rng.random((n, n_feat)) < 0.12] = np.nan
    qid = np.repeat(np.arange(n_query), per_query)
    names = ["bm25", "proximity", "freshness", "length", "static_rank"]
    dtrain = xgb.DMatrix(X, y, qid=qid, missing=np.nan, feature_names=names)
    params = {"objective": "rank:ndcg", "max_depth": 4, "eta": 0.2, "tree_method": "hist",
              "nthread": 1, "seed": 3}
    booster = xgb.train(params, dtrain, num_boost_round=20)
    model = xgb_save(booster, os.path.join(tmp, "ndcg.json"))
    rows = [X[i].copy() for i in range(120)]
    rows += edge_rows(X[:120], xgb_thresholds(model), rng)
    rows = np.array(rows)
    pred = booster.predict(xgb.DMatrix(rows, missing=np.nan, feature_names=names),
                           output_margin=True)
    write_fixture("xgb_ndcg", model, rows, pred)


def xgboost_logistic_base_score(rng, tmp):
    n, n_feat = 400, 4
    X = rng.normal(size=(n, n_feat))
    y = ((X[:, 0] - X[:, 1] + rng.normal(scale=0.7, size=n)) > 0.2).astype(float)
    X[rng.random((n, n_feat)) < 0.1] = np.nan
    params = {"objective": "binary:logistic", "base_score": 0.46, "max_depth": 3, "eta": 0.3,
              "tree_method": "hist", "nthread": 1, "seed": 5}
    booster = xgb.train(params, xgb.DMatrix(X, y, missing=np.nan), num_boost_round=15)
    model = xgb_save(booster, os.path.join(tmp, "logistic.json"))
    base = model["learner"]["learner_model_param"]["base_score"]
    assert isinstance(base, str) and base.startswith("["), f"base_score written as {base!r}"
    rows = [X[i].copy() for i in range(100)]
    rows += edge_rows(X[:100], xgb_thresholds(model), rng)
    rows = np.array(rows)
    pred = booster.predict(xgb.DMatrix(rows, missing=np.nan), output_margin=True)
    write_fixture("xgb_logistic", model, rows, pred)


def refused_models(rng, tmp):
    """Tiny models the importer must refuse, with a clear message."""
    X = rng.normal(size=(120, 3))
    y = rng.integers(0, 3, size=120).astype(float)
    multi = lgb.train(dict(objective="multiclass", num_class=3, num_leaves=3, num_threads=1,
                           deterministic=True, verbose=-1, min_data_in_leaf=5),
                      lgb.Dataset(X, y), num_boost_round=2)
    linear = lgb.train(dict(objective="regression", linear_tree=True, num_leaves=3, num_threads=1,
                            deterministic=True, verbose=-1, min_data_in_leaf=5),
                       lgb.Dataset(X, X[:, 0] * 2.0), num_boost_round=2)
    xmulti = xgb.train({"objective": "multi:softprob", "num_class": 3, "max_depth": 2, "nthread": 1,
                        "seed": 1}, xgb.DMatrix(X, y), num_boost_round=2)
    for name, model in (("lgb_multiclass", lgb_dump(multi)), ("lgb_linear", lgb_dump(linear)),
                        ("xgb_multiclass", xgb_save(xmulti, os.path.join(tmp, "multi.json")))):
        with open(os.path.join(OUT, name + ".model.json"), "w") as f:
            json.dump(model, f, separators=(",", ":"))
            f.write("\n")


def main():
    import tempfile

    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        lightgbm_lambdarank(np.random.default_rng(20261122))
        lightgbm_binary_zero(np.random.default_rng(20261123))
        xgboost_ndcg(np.random.default_rng(20261124), tmp)
        xgboost_logistic_base_score(np.random.default_rng(20261125), tmp)
        refused_models(np.random.default_rng(20261126), tmp)
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write(f"lightgbm {lgb.__version__}\nxgboost {xgb.__version__}\nnumpy {np.__version__}\n")


if __name__ == "__main__":
    main()
