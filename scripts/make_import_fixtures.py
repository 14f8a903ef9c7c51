#!/usr/bin/env python3
"""Writes the parity fixtures of the LightGBM text, XGBoost UBJSON and RankLib imports.

For each model NAME this writes into fixtures/trees/ (beside make_tree_fixtures.py's, read by
the same test harness):
  NAME.model.txt / .ubj / .xml  the model file as the library saves it
  NAME.rows.csv                 scoring rows, no header, an empty field is a missing value
  NAME.expected.txt             the library's own raw prediction per row, `repr` (round-trips)

- LightGBM (`booster.save_model`, text): a lambdarank model with a categorical feature and NaN,
  and a binary model with zero_as_missing: predictions by LightGBM (`raw_score=True`).
- XGBoost (`booster.save_model("x.ubj")`): rank:ndcg with NaN, and binary:logistic with a
  base_score: predictions by XGBoost (`output_margin=True`).
- RankLib: there is no RankLib here (no pip package, and Maven Central is not reachable from
  the machine that made these), so LambdaMART ensembles are written in RankLib's XML by this
  script (the layout of RankLib's `Ensemble.toString`/`Split.getString`), and the expected
  scores come from `ranklib_score` below, an independent evaluator written from RankLib's
  source (`Split.eval`, `Ensemble.eval`, `DenseDataPoint.getFeatureValue`): they check
  rankserve against that reading of RankLib, not against RankLib itself.

The rows are the training draws plus, for each split threshold, the threshold itself and its
neighbours, and special values (NaN, zeros, values around LightGBM's zero threshold, unseen
and negative categories): `edge_rows` of make_tree_fixtures.py.

It also writes models the importers must refuse: a LightGBM text model with linear trees, an
XGBoost UBJSON gblinear model and one with categorical splits.

Run:  pip install -r scripts/requirements-fixtures.txt && python3 scripts/make_import_fixtures.py
"""

import os
import sys
import tempfile

import lightgbm as lgb
import numpy as np
import xgboost as xgb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tree_fixtures import OUT, edge_rows, fmt, lgb_dump, lgb_thresholds  # noqa: E402


def write_rows(name, rows, expected):
    with open(os.path.join(OUT, name + ".rows.csv"), "w") as f:
        for row in rows:
            f.write(",".join(fmt(v) for v in row) + "\n")
    with open(os.path.join(OUT, name + ".expected.txt"), "w") as f:
        for v in expected:
            f.write(repr(float(v)) + "\n")
    print(f"{name}: {len(rows)} rows", file=sys.stderr)


def write_model(name, ext, data):
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(os.path.join(OUT, f"{name}.model.{ext}"), mode) as f:
        f.write(data)


# ---- LightGBM text ----

def lightgbm_text_lambdarank(rng):
    n_query, per_query, n_feat = 30, 10, 5
    n = n_query * per_query
    X = rng.normal(size=(n, n_feat))
    X[:, 2] = rng.integers(0, 40, size=n)  # categorical, categories past 32 (two bitset words)
    score = X[:, 0] + np.where(np.isin(X[:, 2], [1, 5, 33, 38]), 1.0, 0.0) - 0.4 * X[:, 1]
    y = np.clip(np.round(score + rng.normal(scale=0.5, size=n)), 0, 4)
    X[rng.random((n, n_feat)) < 0.12] = np.nan
    names = ["bm25", "freshness", "site_category", "clicks", "length"]
    params = dict(objective="lambdarank", num_leaves=7, learning_rate=0.2, min_data_in_leaf=5,
                  min_data_per_group=5, cat_smooth=1.0, max_cat_to_onehot=4, deterministic=True,
                  force_row_wise=True, num_threads=1, seed=17, verbose=-1)
    ds = lgb.Dataset(X, y, group=[per_query] * n_query, feature_name=names,
                     categorical_feature=[2], free_raw_data=False)
    booster = lgb.train(params, ds, num_boost_round=12)
    write_model("lgbt_lambdarank", "txt", booster.model_to_string())
    rows = [X[i].copy() for i in range(80)]
    rows += edge_rows(X[:80], lgb_thresholds(lgb_dump(booster)), rng, categorical=(2,))
    rows = np.array(rows)
    write_rows("lgbt_lambdarank", rows, booster.predict(rows, raw_score=True, num_threads=1))


def lightgbm_text_binary_zero(rng):
    n, n_feat = 300, 4
    X = rng.normal(size=(n, n_feat))
    X[rng.random((n, n_feat)) < 0.25] = 0.0
    X[rng.random((n, n_feat)) < 0.05] = np.nan
    y = ((np.nan_to_num(X[:, 0]) - np.nan_to_num(X[:, 1]) + rng.normal(scale=0.5, size=n))
         > 0).astype(float)
    params = dict(objective="binary", zero_as_missing=True, num_leaves=5, learning_rate=0.3,
                  min_data_in_leaf=5, deterministic=True, force_row_wise=True, num_threads=1,
                  seed=19, verbose=-1)
    booster = lgb.train(params, lgb.Dataset(X, y), num_boost_round=10)
    write_model("lgbt_binary_zero", "txt", booster.model_to_string())
    rows = [X[i].copy() for i in range(80)]
    rows += edge_rows(X[:80], lgb_thresholds(lgb_dump(booster)), rng)
    rows = np.array(rows)
    write_rows("lgbt_binary_zero", rows, booster.predict(rows, raw_score=True, num_threads=1))


# ---- XGBoost UBJSON ----

def xgb_ubj(booster, tmp, name):
    """The .ubj bytes and the same model's JSON (for its thresholds)."""
    booster.save_model(os.path.join(tmp, name + ".ubj"))
    with open(os.path.join(tmp, name + ".ubj"), "rb") as f:
        data = f.read()
    assert data[:1] == b"{" and data[1:2] != b'"', "save_model(.ubj) did not write UBJSON"
    import json
    booster.save_model(os.path.join(tmp, name + ".json"))
    with open(os.path.join(tmp, name + ".json")) as f:
        return data, json.load(f)


def xgb_thresholds(model_json):
    out = []
    for tree in model_json["learner"]["gradient_booster"]["model"]["trees"]:
        for i, left in enumerate(tree["left_children"]):
            if left != -1:
                out.append((tree["split_indices"][i],
                            float(np.float32(tree["split_conditions"][i]))))
    return out


def xgboost_ubj_ndcg(rng, tmp):
    n_query, per_query, n_feat = 30, 10, 4
    n = n_query * per_query
    X = rng.normal(size=(n, n_feat))
    y = np.clip(np.round(X[:, 0] + 0.5 * X[:, 1] * X[:, 2] + rng.normal(scale=0.5, size=n)), 0, 4)
    X[rng.random((n, n_feat)) < 0.12] = np.nan
    qid = np.repeat(np.arange(n_query), per_query)
    names = ["bm25", "proximity", "freshness", "static_rank"]
    dtrain = xgb.DMatrix(X, y, qid=qid, missing=np.nan, feature_names=names)
    params = {"objective": "rank:ndcg", "max_depth": 3, "eta": 0.2, "tree_method": "hist",
              "nthread": 1, "seed": 23}
    booster = xgb.train(params, dtrain, num_boost_round=12)
    data, model = xgb_ubj(booster, tmp, "ndcg")
    write_model("xgbu_ndcg", "ubj", data)
    rows = [X[i].copy() for i in range(80)]
    rows += edge_rows(X[:80], xgb_thresholds(model), rng)
    rows = np.array(rows)
    pred = booster.predict(xgb.DMatrix(rows, missing=np.nan, feature_names=names),
                           output_margin=True)
    write_rows("xgbu_ndcg", rows, pred)


def xgboost_ubj_logistic(rng, tmp):
    n, n_feat = 300, 3
    X = rng.normal(size=(n, n_feat))
    y = ((X[:, 0] - X[:, 1] + rng.normal(scale=0.7, size=n)) > 0.2).astype(float)
    X[rng.random((n, n_feat)) < 0.1] = np.nan
    params = {"objective": "binary:logistic", "base_score": 0.37, "max_depth": 3, "eta": 0.3,
              "tree_method": "hist", "nthread": 1, "seed": 29}
    booster = xgb.train(params, xgb.DMatrix(X, y, missing=np.nan), num_boost_round=10)
    data, model = xgb_ubj(booster, tmp, "logistic")
    write_model("xgbu_logistic", "ubj", data)
    rows = [X[i].copy() for i in range(80)]
    rows += edge_rows(X[:80], xgb_thresholds(model), rng)
    rows = np.array(rows)
    write_rows("xgbu_logistic", rows,
               booster.predict(xgb.DMatrix(rows, missing=np.nan), output_margin=True))


# ---- RankLib ----

def java_float(x):
    """Java's Float.toString of a float: the shortest decimal that reads back as it."""
    return str(np.float32(x))


def random_tree(rng, X, depth, max_depth):
    """A RankLib tree as nested tuples: ("leaf", double) or ("split", fid, float, left, right)."""
    if depth == max_depth or rng.random() < 0.2:
        return ("leaf", float(rng.normal()))
    col = int(rng.integers(X.shape[1]))
    values = X[:, col][~np.isnan(X[:, col])]
    threshold = np.float32(rng.choice(values))  # a training value: rows sit exactly on it
    return ("split", col + 1, threshold,
            random_tree(rng, X, depth + 1, max_depth), random_tree(rng, X, depth + 1, max_depth))


def ranklib_xml(trees, weight):
    """The model file as RankLib's LambdaMART.model() writes it."""
    out = ["## LambdaMART", f"## No. of trees = {len(trees)}", "## No. of leaves = 8",
           "## No. of threshold candidates = 256", f"## Learning rate = {weight}",
           "## Stop early = 100", "", "<ensemble>"]

    def node(t, indent):
        if t[0] == "leaf":
            out.append(f"{indent}<output> {t[1]!r} </output>")
        else:
            out.append(f"{indent}<feature> {t[1]} </feature>")
            out.append(f"{indent}<threshold> {java_float(t[2])} </threshold>")
            for pos, child in (("left", t[3]), ("right", t[4])):
                out.append(f'{indent}<split pos="{pos}">')
                node(child, indent + "\t")
                out.append(f"{indent}</split>")

    for i, t in enumerate(trees):
        out.append(f'\t<tree id="{i + 1}" weight="{java_float(weight)}">')
        out.append("\t\t<split>")
        node(t, "\t\t\t")
        out.append("\t\t</split>")
        out.append("\t</tree>")
    out.append("</ensemble>")
    return "\n".join(out) + "\n"


def ranklib_score(trees, weight, row):
    """RankLib's score of one row, as its source computes it.

    DenseDataPoint.getFeatureValue: the feature vector is float[]; an unknown (NaN) value reads
    as 0. Split.eval: left when value <= threshold (both float); the leaf's avgLabel is a
    double, but a loaded model's comes from Float.parseFloat. Ensemble.eval: `float s`,
    `s += tree.eval(dp) * weights.get(i)`, i.e. s = (float)((double)s + leaf * (double)weight).
    """
    w = np.float64(np.float32(weight))
    s = np.float32(0.0)
    for t in trees:
        while t[0] == "split":
            v = row[t[1] - 1]
            v = np.float32(0.0) if np.isnan(v) else np.float32(v)
            t = t[3] if v <= t[2] else t[4]
        leaf = np.float64(np.float32(t[1]))
        s = np.float32(np.float64(s) + leaf * w)
    return float(s)


def ranklib_lambdamart(rng):
    n, n_feat = 200, 5
    X = rng.normal(size=(n, n_feat)).astype(np.float32).astype(np.float64)
    X[rng.random((n, n_feat)) < 0.1] = np.nan
    X[rng.random((n, n_feat)) < 0.05] = 0.0
    weight = 0.1
    trees = [random_tree(rng, X, 0, 3) for _ in range(40)]
    write_model("ranklib_lambdamart", "xml", ranklib_xml(trees, weight))
    thresholds = []

    def walk(t):
        if t[0] == "split":
            thresholds.append((t[1] - 1, float(t[2])))
            walk(t[3])
            walk(t[4])

    for t in trees:
        walk(t)
    rows = [X[i].copy() for i in range(80)]
    rows += edge_rows(X[:80], thresholds, rng)
    rows = np.array(rows)
    write_rows("ranklib_lambdamart", rows, [ranklib_score(trees, weight, r) for r in rows])


# ---- models to refuse ----

def refused_models(rng, tmp):
    X = rng.normal(size=(120, 3))
    linear = lgb.train(dict(objective="regression", linear_tree=True, num_leaves=3, num_threads=1,
                            deterministic=True, verbose=-1, min_data_in_leaf=5),
                       lgb.Dataset(X, X[:, 0] * 2.0), num_boost_round=2)
    write_model("lgbt_linear", "txt", linear.model_to_string())
    gblinear = xgb.train({"booster": "gblinear", "objective": "reg:squarederror", "nthread": 1},
                         xgb.DMatrix(X, X[:, 0]), num_boost_round=2)
    write_model("xgbu_gblinear", "ubj", xgb_ubj(gblinear, tmp, "gblinear")[0])
    X[:, 2] = rng.integers(0, 4, size=120)
    categorical = xgb.train({"max_depth": 2, "nthread": 1, "tree_method": "hist"},
                            xgb.DMatrix(X, X[:, 0] + (X[:, 2] == 1), feature_types=["q", "q", "c"],
                                        enable_categorical=True),
                            num_boost_round=2)
    write_model("xgbu_categorical", "ubj", xgb_ubj(categorical, tmp, "categorical")[0])


def main():
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        lightgbm_text_lambdarank(np.random.default_rng(20261201))
        lightgbm_text_binary_zero(np.random.default_rng(20261202))
        xgboost_ubj_ndcg(np.random.default_rng(20261203), tmp)
        xgboost_ubj_logistic(np.random.default_rng(20261204), tmp)
        ranklib_lambdamart(np.random.default_rng(20261205))
        refused_models(np.random.default_rng(20261206), tmp)


if __name__ == "__main__":
    main()
