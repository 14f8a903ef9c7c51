#!/usr/bin/env python3
"""Trains small CatBoost models and builds small ONNX models, and writes the parity fixtures.

For each model NAME this writes into fixtures/trees/:
  NAME.model.json    CatBoost `model.save_model(path, format="json")`, or
  NAME.model.onnx    an ONNX model (onnxmltools from LightGBM / XGBoost, skl2onnx from
                     scikit-learn, or built with the `onnx` helper API like a PyTorch export)
  NAME.rows.csv      scoring rows, no header, an empty field is a missing value
  NAME.expected.txt  the library's own prediction for each row, one per line, printed with
                     `repr`: CatBoost's `predict(prediction_type="RawFormulaVal")`, onnxruntime's
                     output for the rows as float32 (what rankserve reproduces: f32(x))

The rows mix draws from the training distribution with edge cases around every threshold read
back from the written model (CatBoost borders, ONNX nodes_values; all f32): the threshold, the
neighbouring doubles, the neighbouring floats, and the double halfway to the next float (which
rounds to even), and NaN in every column.

It also writes models the importers must refuse (CatBoost multi-class and categorical features,
an ONNX classifier).

Run:  pip install -r scripts/requirements-fixtures.txt && python3 scripts/make_catboost_onnx_fixtures.py
"""

import json
import math
import os
import sys
import tempfile

import catboost
import lightgbm as lgb
import numpy as np
import onnx
import onnxmltools
import onnxruntime as ort
import skl2onnx
import sklearn
import xgboost as xgb
from onnx import TensorProto, helper, numpy_helper
from onnxmltools.convert.common.data_types import FloatTensorType
from sklearn.ensemble import GradientBoostingClassifier, GradientBoostingRegressor

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "trees")


def fmt(x):
    """A CSV field: empty for a missing value, else the shortest round-tripping repr."""
    x = float(x)
    return "" if math.isnan(x) else repr(x)


def write_rows(name, rows, expected):
    with open(os.path.join(OUT, name + ".rows.csv"), "w") as f:
        for row in rows:
            f.write(",".join(fmt(v) for v in row) + "\n")
    with open(os.path.join(OUT, name + ".expected.txt"), "w") as f:
        for v in expected:
            f.write(repr(float(v)) + "\n")
    print(f"{name}: {len(rows)} rows", file=sys.stderr)


def around(t):
    """A float32 threshold and the values whose rounding to float32 decides around it."""
    t32 = np.float32(t)
    t = float(t32)
    with np.errstate(over="ignore"):  # past CatBoost's FLT_MAX border (its NaN split) is inf
        up32 = float(np.nextafter(t32, np.float32(np.inf)))
        down32 = float(np.nextafter(t32, np.float32(-np.inf)))
    return [t, float(np.nextafter(t, -np.inf)), float(np.nextafter(t, np.inf)), up32, down32,
            (t + up32) / 2, (t + down32) / 2]


def edge_rows(base, thresholds, rng):
    """Rows on and around each (feature, threshold), and NaN / zero rows, over `base` rows."""
    rows = []
    for feature, t in sorted(set(thresholds)):
        for v in around(t):
            row = base[rng.integers(len(base))].copy()
            row[feature] = v
            rows.append(row)
    n = base.shape[1]
    for v in (np.nan, 0.0, -0.0, 1e-300, 1e30):
        rows.append(np.full(n, v))
        for feature in range(n):
            row = base[rng.integers(len(base))].copy()
            row[feature] = v
            rows.append(row)
    return rows


# ---- CatBoost ----

def cb_save(model, tmp, name):
    path = os.path.join(tmp, name + ".json")
    model.save_model(path, format="json")
    with open(path) as f:
        return json.load(f)


def cb_thresholds(model_json):
    out = []
    for tree in model_json.get("oblivious_trees", []):
        for s in tree["splits"]:
            out.append((s["float_feature_index"], s["border"]))

    def walk(node):
        if "split" in node:
            out.append((node["split"]["float_feature_index"], node["split"]["border"]))
            walk(node["left"])
            walk(node["right"])

    for tree in model_json.get("trees", []):
        walk(tree)
    return out


def write_catboost(name, model, model_json, X, rng, n_base=60):
    with open(os.path.join(OUT, name + ".model.json"), "w") as f:
        json.dump(model_json, f, separators=(",", ":"))
        f.write("\n")
    rows = [X[i].copy() for i in range(n_base)]
    rows += edge_rows(X[:n_base], cb_thresholds(model_json), rng)
    rows = np.array(rows)
    pred = model.predict(rows, prediction_type="RawFormulaVal", thread_count=1)
    write_rows(name, rows, pred)


def ranking_data(rng, n_query=40, per_query=10, n_feat=5, nan=0.1):
    n = n_query * per_query
    X = rng.normal(size=(n, n_feat))
    y = np.clip(np.round(X[:, 0] + 0.5 * X[:, 1] * X[:, 2] + rng.normal(scale=0.5, size=n)), 0, 4)
    X[rng.random((n, n_feat)) < nan] = np.nan
    X[:, 3] = np.round(X[:, 3], 1)  # many rows exactly on the borders
    qid = np.repeat(np.arange(n_query), per_query)
    return X, y, qid


def catboost_models(rng, tmp):
    common = dict(thread_count=1, random_seed=7, verbose=0, allow_writing_files=False)
    X, y, qid = ranking_data(rng)
    names = ["bm25", "proximity", "freshness", "clicks", "static_rank"]
    for name, loss, extra in (
            ("cb_yetirank", "YetiRank", dict(depth=4)),
            ("cb_pairlogit", "PairLogit", dict(depth=3)),
            ("cb_queryrmse_lossguide", "QueryRMSE",
             dict(grow_policy="Lossguide", max_leaves=8, depth=4)),
    ):
        pool = catboost.Pool(X, y, group_id=qid, feature_names=names)
        model = catboost.CatBoost(dict(loss_function=loss, iterations=15, learning_rate=0.4,
                                       **extra, **common))
        model.fit(pool)
        write_catboost(name, model, cb_save(model, tmp, name), X, rng)
    # RMSE with NaN as the maximum (nan_value_treatment AsTrue), depthwise trees, no names.
    Xr = rng.normal(size=(300, 4))
    yr = Xr[:, 0] - 2 * Xr[:, 1] + rng.normal(scale=0.3, size=300)
    Xr[rng.random((300, 4)) < 0.15] = np.nan
    for name, extra in (("cb_rmse_nanmax", dict(depth=3)),
                        ("cb_rmse_depthwise", dict(depth=3, grow_policy="Depthwise"))):
        model = catboost.CatBoostRegressor(iterations=15, learning_rate=0.3, nan_mode="Max",
                                           **extra, **common)
        model.fit(Xr, yr)
        write_catboost(name, model, cb_save(model, tmp, name), Xr, rng)
    # Refused: multi-class, categorical features.
    yc = rng.integers(0, 3, size=300)
    multi = catboost.CatBoostClassifier(iterations=2, depth=2, loss_function="MultiClass",
                                        **common)
    multi.fit(np.nan_to_num(Xr), yc)
    cats = np.array([["a", "b", "c"][i % 3] for i in range(300)], dtype=object)
    Xc = np.column_stack([np.nan_to_num(Xr[:, :2]).astype(object), cats])
    categorical = catboost.CatBoostRegressor(iterations=2, depth=2, cat_features=[2], **common)
    categorical.fit(Xc, yr)
    for name, model in (("cb_multiclass", multi), ("cb_categorical", categorical)):
        with open(os.path.join(OUT, name + ".model.json"), "w") as f:
            json.dump(cb_save(model, tmp, name), f, separators=(",", ":"))
            f.write("\n")


# ---- ONNX ----

def ort_predict(model, rows):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    out = session.run(None, {name: rows.astype(np.float32)})[0]
    return out.reshape(len(rows))


def onnx_thresholds(model):
    out = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "TreeEnsembleRegressor":
            for f, v, m in zip(attrs["nodes_featureids"], attrs["nodes_values"],
                               attrs["nodes_modes"]):
                if m != b"LEAF":
                    out.append((f, v))
        elif node.op_type == "TreeEnsemble":
            splits = numpy_helper.to_array(attrs["nodes_splits"])
            out += [(f, float(v)) for f, v in zip(attrs["nodes_featureids"], splits)]
    return out


def write_onnx(name, model, X, rng, n_base=60, edges=True):
    onnx.checker.check_model(model)
    with open(os.path.join(OUT, name + ".model.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    rows = [X[i].copy() for i in range(n_base)]
    if edges:
        rows += edge_rows(X[:n_base], onnx_thresholds(model), rng)
    rows = np.array(rows)
    write_rows(name, rows, ort_predict(model, rows))


def regression_data(rng, n=400, n_feat=4, nan=0.1):
    X = rng.normal(size=(n, n_feat))
    y = X[:, 0] + 0.5 * X[:, 1] * X[:, 2] + rng.normal(scale=0.3, size=n)
    X[rng.random((n, n_feat)) < nan] = np.nan
    return X, y


def onnx_tree_models(rng):
    X, y = regression_data(rng)
    booster = lgb.train(dict(objective="regression", num_leaves=8, learning_rate=0.2,
                             min_data_in_leaf=5, deterministic=True, num_threads=1, seed=3,
                             verbose=-1), lgb.Dataset(X, y), num_boost_round=15)
    model = onnxmltools.convert_lightgbm(
        booster, initial_types=[("input", FloatTensorType([None, X.shape[1]]))], target_opset=15)
    write_onnx("onnx_lightgbm", model, X, rng)
    write_onnx("onnx5_lightgbm", to_tree_ensemble(model), X, rng)

    reg = xgb.XGBRegressor(n_estimators=15, max_depth=3, learning_rate=0.3, tree_method="hist",
                           n_jobs=1, random_state=5, base_score=0.5)
    reg.fit(X, y)
    model = onnxmltools.convert_xgboost(
        reg, initial_types=[("input", FloatTensorType([None, X.shape[1]]))], target_opset=15)
    write_onnx("onnx_xgboost", model, X, rng)

    Xs = np.nan_to_num(X)
    gbr = GradientBoostingRegressor(n_estimators=15, max_depth=3, learning_rate=0.2,
                                    random_state=1).fit(Xs, y)
    model = skl2onnx.convert_sklearn(
        gbr, initial_types=[("input", skl2onnx.common.data_types.FloatTensorType(
            [None, X.shape[1]]))], target_opset={"": 17, "ai.onnx.ml": 3})
    write_onnx("onnx_sklearn_gbr", model, X, rng)

    # Refused: a classifier (its ops and outputs are not one score).
    clf = GradientBoostingClassifier(n_estimators=2, max_depth=2, random_state=1).fit(
        Xs, (y > 0).astype(int))
    model = skl2onnx.convert_sklearn(
        clf, initial_types=[("input", skl2onnx.common.data_types.FloatTensorType(
            [None, X.shape[1]]))], target_opset={"": 17, "ai.onnx.ml": 3})
    with open(os.path.join(OUT, "onnx_classifier.model.onnx"), "wb") as f:
        f.write(model.SerializeToString())


def onnx_modes_model(rng):
    """Hand-built trees using every nodes_mode, with and without missing-value tracking."""
    modes = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
    thresholds = [0.1, -0.7, 1.3, 0.0, 0.5, -1.25, 2.0, 0.3]
    treeids, nodeids, featureids, values, nmodes, trues, falses, tracks = ([] for _ in range(8))
    t_trees, t_nodes, t_weights = [], [], []
    tree = 0
    for i, mode in enumerate(modes):
        for track in (0, 1):
            # node 0: mode on feature i % 3; true → node 1 (a LEQ split), false → node 2 (leaf)
            t0 = thresholds[(2 * i + track) % len(thresholds)]
            t1 = thresholds[(2 * i + track + 3) % len(thresholds)]
            for node, (mode_, feat, val, tn, fn, tr) in enumerate((
                    (mode, i % 3, t0, 1, 2, track),
                    ("BRANCH_LEQ", (i + 1) % 3, t1, 3, 4, 1 - track),
                    ("LEAF", 0, 0.0, 0, 0, 0),
                    ("LEAF", 0, 0.0, 0, 0, 0),
                    ("LEAF", 0, 0.0, 0, 0, 0))):
                treeids.append(tree)
                nodeids.append(node)
                featureids.append(feat)
                values.append(val)
                nmodes.append(mode_)
                trues.append(tn)
                falses.append(fn)
                tracks.append(tr)
            for node in (2, 3, 4):
                t_trees.append(tree)
                t_nodes.append(node)
                t_weights.append(float(rng.normal()))
            tree += 1
    node = helper.make_node(
        "TreeEnsembleRegressor", ["input"], ["variable"], domain="ai.onnx.ml", name="modes",
        n_targets=1, aggregate_function="SUM", post_transform="NONE", base_values=[0.125],
        nodes_treeids=treeids, nodes_nodeids=nodeids, nodes_featureids=featureids,
        nodes_values=values, nodes_modes=nmodes, nodes_truenodeids=trues,
        nodes_falsenodeids=falses, nodes_missing_value_tracks_true=tracks,
        target_treeids=t_trees, target_nodeids=t_nodes, target_ids=[0] * len(t_trees),
        target_weights=t_weights)
    graph = helper.make_graph(
        [node], "modes",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    X = rng.normal(size=(200, 3))
    X[:, 0] = np.round(X[:, 0], 1)  # some rows exactly on 0.1, 0.3, 0.5, ...
    X[rng.random((200, 3)) < 0.1] = np.nan
    write_onnx("onnx_modes", model, X, rng)
    write_onnx("onnx5_modes", to_tree_ensemble(model), X, rng)


def to_tree_ensemble(model3):
    """The same trees as the opset-5 `TreeEnsemble` op (integer modes in a uint8 tensor, leaves in
    their own arrays, no base values), converted by hand as onnx's own tests lay it out."""
    node = next(n for n in model3.graph.node if n.op_type == "TreeEnsembleRegressor")
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    keys = list(zip(a["nodes_treeids"], a["nodes_nodeids"]))
    is_leaf = [m == b"LEAF" for m in a["nodes_modes"]]
    branch = {k: i for i, k in enumerate(k for k, leaf in zip(keys, is_leaf) if not leaf)}
    leaf = {k: i for i, k in enumerate(k for k, leaf in zip(keys, is_leaf) if leaf)}
    weights = [0.0] * len(leaf)
    for t, n, w in zip(a["target_treeids"], a["target_nodeids"], a["target_weights"]):
        weights[leaf[(t, n)]] = w
    code = {b"BRANCH_LEQ": 0, b"BRANCH_LT": 1, b"BRANCH_GTE": 2, b"BRANCH_GT": 3, b"BRANCH_EQ": 4,
            b"BRANCH_NEQ": 5}
    fields = {f: [] for f in ("feature", "split", "mode", "true", "trueleaf", "false", "falseleaf",
                              "track")}
    for k, (tree, _) in enumerate(keys):
        if is_leaf[k]:
            continue
        fields["feature"].append(a["nodes_featureids"][k])
        fields["split"].append(a["nodes_values"][k])
        fields["mode"].append(code[a["nodes_modes"][k]])
        fields["track"].append(a["nodes_missing_value_tracks_true"][k])
        for side in ("true", "false"):
            child = (tree, a[f"nodes_{side}nodeids"][k])
            fields[side].append(leaf[child] if child in leaf else branch[child])
            fields[side + "leaf"].append(int(child in leaf))
    roots = [branch[(t, 0)] for t in dict.fromkeys(a["nodes_treeids"])]
    n = len(fields["mode"])
    node5 = helper.make_node(
        "TreeEnsemble", ["input"], ["variable"], domain="ai.onnx.ml", name="trees",
        n_targets=1, aggregate_function=1, post_transform=0, tree_roots=roots,
        nodes_featureids=fields["feature"],
        nodes_splits=helper.make_tensor("nodes_splits", TensorProto.FLOAT, (n,), fields["split"]),
        nodes_modes=helper.make_tensor("nodes_modes", TensorProto.UINT8, (n,), fields["mode"]),
        nodes_truenodeids=fields["true"], nodes_trueleafs=fields["trueleaf"],
        nodes_falsenodeids=fields["false"], nodes_falseleafs=fields["falseleaf"],
        nodes_missing_value_tracks_true=fields["track"], leaf_targetids=[0] * len(weights),
        leaf_weights=helper.make_tensor("leaf_weights", TensorProto.FLOAT, (len(weights),),
                                        weights))
    graph = helper.make_graph([node5], "trees", list(model3.graph.input),
                              [helper.make_tensor_value_info("variable", TensorProto.FLOAT,
                                                             [None, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("ai.onnx.ml", 5)])
    model.ir_version = 10
    return model


def onnx_mlp_models(rng):
    """MLPs laid out as PyTorch exports nn.Sequential(Linear, ReLU, Linear, Tanh, Linear) (Gemm
    with transB=1) and as MatMul + Add chains. Built with the onnx helper API (no torch needed)."""
    n_feat = 6
    widths = [n_feat, 16, 8, 1]

    def init(name, array):
        return numpy_helper.from_array(array.astype(np.float32), name)

    # Gemm, as torch.onnx.export writes nn.Linear: weight [out, in], transB=1.
    inits, nodes, current = [], [], "input"
    for layer, (w_in, w_out) in enumerate(zip(widths, widths[1:])):
        w = rng.normal(scale=1 / math.sqrt(w_in), size=(w_out, w_in))
        b = rng.normal(scale=0.1, size=(w_out,))
        inits += [init(f"{layer}.weight", w), init(f"{layer}.bias", b)]
        out = f"/{layer}/Gemm_output_0"
        nodes.append(helper.make_node("Gemm", [current, f"{layer}.weight", f"{layer}.bias"],
                                      [out], name=f"/{layer}/Gemm", alpha=1.0, beta=1.0,
                                      transB=1))
        current = out
        act = {0: "Relu", 1: "Tanh"}.get(layer)
        if act:
            out = f"/{layer}/{act}_output_0"
            nodes.append(helper.make_node(act, [current], [out], name=f"/{layer}/{act}"))
            current = out
    nodes.append(helper.make_node("Identity", [current], ["output"], name="/Identity"))
    graph = helper.make_graph(
        nodes, "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", n_feat])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="pytorch-like")
    model.ir_version = 8
    X = rng.normal(size=(300, n_feat))
    write_onnx("onnx_mlp_gemm", model, X, rng, n_base=150, edges=False)

    # MatMul [in, out] + Add, Sigmoid at the end.
    inits, nodes, current = [], [], "input"
    for layer, (w_in, w_out) in enumerate(zip(widths, widths[1:])):
        w = rng.normal(scale=1 / math.sqrt(w_in), size=(w_in, w_out))
        b = rng.normal(scale=0.1, size=(w_out,))
        inits += [init(f"w{layer}", w), init(f"b{layer}", b)]
        nodes.append(helper.make_node("MatMul", [current, f"w{layer}"], [f"m{layer}"]))
        nodes.append(helper.make_node("Add", [f"m{layer}", f"b{layer}"], [f"a{layer}"]))
        act = ["Relu", "Tanh", "Sigmoid"][layer]
        nodes.append(helper.make_node(act, [f"a{layer}"], [f"h{layer}"]))
        current = f"h{layer}"
    graph = helper.make_graph(
        nodes, "matmul_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, n_feat])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, [None, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    X = rng.normal(size=(300, n_feat))
    write_onnx("onnx_mlp_matmul", model, X, rng, n_base=150, edges=False)


def main():
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        catboost_models(np.random.default_rng(20261126), tmp)
    onnx_tree_models(np.random.default_rng(20261127))
    onnx_modes_model(np.random.default_rng(20261128))
    onnx_mlp_models(np.random.default_rng(20261129))
    with open(os.path.join(OUT, "VERSIONS-catboost-onnx.txt"), "w") as f:
        for module in (catboost, onnx, ort, onnxmltools, skl2onnx, sklearn, lgb, xgb, np):
            f.write(f"{module.__name__} {module.__version__}\n")


if __name__ == "__main__":
    main()
