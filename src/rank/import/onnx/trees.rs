//! The tree-ensemble ops (`TreeEnsembleRegressor`, opset-5 `TreeEnsemble`) into the ranker's
//! trees: the modes, missing-value rule and subtree copies of the module docs.

use super::*;

pub(super) const TREE_ENSEMBLE_REGRESSOR_ATTRIBUTES: &[&str] = &[
    "aggregate_function",
    "base_values",
    "n_targets",
    "nodes_falsenodeids",
    "nodes_featureids",
    "nodes_hitrates",
    "nodes_missing_value_tracks_true",
    "nodes_modes",
    "nodes_nodeids",
    "nodes_treeids",
    "nodes_truenodeids",
    "nodes_values",
    "post_transform",
    "target_ids",
    "target_nodeids",
    "target_treeids",
    "target_weights",
];

/// A `nodes_modes` entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Mode {
    Leq,
    Lt,
    Gte,
    Gt,
    Eq,
    Neq,
    Leaf,
}

/// Converts a `TreeEnsembleRegressor` node: its trees, its base value, and the input width its
/// feature ids need.
pub(super) fn tree_ensemble_regressor(
    node: &NodeProto,
    at: &str,
    declared_width: Option<usize>,
) -> Result<(Vec<Tree>, f64, usize), ImportError> {
    let map =
        check_attributes(node, at, TREE_ENSEMBLE_REGRESSOR_ATTRIBUTES).map_err(|e| {
            match node
                .attribute
                .iter()
                .find(|a| a.name.ends_with("_as_tensor"))
            {
                Some(a) => ONNX.unsupported(
                    format!("{at}.attribute {:?}", a.name),
                    "double-precision thresholds, weights or base values are not supported; \
                 supported: the float attributes (nodes_values, target_weights, base_values)",
                ),
                None => e,
            }
        })?;
    let attrs = Attributes { map, at };
    let n_targets = attrs.int("n_targets", 1)?;
    if n_targets != 1 {
        return Err(ONNX.unsupported(
            attrs.path("n_targets"),
            format!("{n_targets} targets; a ranker has one output, so only 1 is supported"),
        ));
    }
    let aggregate = attrs.string("aggregate_function", "SUM")?;
    if aggregate != "SUM" {
        return Err(ONNX.unsupported(
            attrs.path("aggregate_function"),
            format!("{aggregate:?}; supported: \"SUM\" (the ranker adds its trees)"),
        ));
    }
    let post = attrs.string("post_transform", "NONE")?;
    if post != "NONE" {
        return Err(ONNX.unsupported(
            attrs.path("post_transform"),
            format!(
                "{post:?}; supported: \"NONE\" (a transform of the sum is not a sum of trees; \
                 export the raw score)"
            ),
        ));
    }
    let base = match attrs.floats("base_values")? {
        [] => 0.0,
        [b] => f64::from(*b),
        more => {
            return Err(ONNX.unsupported(
                attrs.path("base_values"),
                format!("{} values; supported: at most one (one target)", more.len()),
            ))
        }
    };
    if !base.is_finite() {
        return Err(ONNX.invalid(attrs.path("base_values"), "expected a finite number"));
    }

    let treeids = attrs.ints("nodes_treeids")?;
    let n = treeids.len();
    let nodeids = attrs.ints("nodes_nodeids")?;
    let featureids = attrs.ints("nodes_featureids")?;
    let values = attrs.floats("nodes_values")?;
    let trueids = attrs.ints("nodes_truenodeids")?;
    let falseids = attrs.ints("nodes_falsenodeids")?;
    let modes = attrs.strings("nodes_modes")?;
    let tracks = attrs.ints("nodes_missing_value_tracks_true")?;
    for (name, len) in [
        ("nodes_nodeids", nodeids.len()),
        ("nodes_featureids", featureids.len()),
        ("nodes_values", values.len()),
        ("nodes_truenodeids", trueids.len()),
        ("nodes_falsenodeids", falseids.len()),
        ("nodes_modes", modes.len()),
    ] {
        if len != n {
            return Err(ONNX.invalid(
                attrs.path(name),
                format!("expected {n} entries (as nodes_treeids), got {len}"),
            ));
        }
    }
    if !tracks.is_empty() && tracks.len() != n {
        return Err(ONNX.invalid(
            attrs.path("nodes_missing_value_tracks_true"),
            format!("expected 0 or {n} entries, got {}", tracks.len()),
        ));
    }
    let modes = modes
        .iter()
        .enumerate()
        .map(|(i, m)| match m.as_slice() {
            b"BRANCH_LEQ" => Ok(Mode::Leq),
            b"BRANCH_LT" => Ok(Mode::Lt),
            b"BRANCH_GTE" => Ok(Mode::Gte),
            b"BRANCH_GT" => Ok(Mode::Gt),
            b"BRANCH_EQ" => Ok(Mode::Eq),
            b"BRANCH_NEQ" => Ok(Mode::Neq),
            b"LEAF" => Ok(Mode::Leaf),
            other => Err(ONNX.unsupported(
                format!("{}[{i}]", attrs.path("nodes_modes")),
                format!(
                    "{:?}; supported: BRANCH_LEQ, BRANCH_LT, BRANCH_GTE, BRANCH_GT, BRANCH_EQ, \
                     BRANCH_NEQ, LEAF",
                    String::from_utf8_lossy(other)
                ),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;

    // Leaf values: the target weights of each (tree, node), summed.
    let t_trees = attrs.ints("target_treeids")?;
    let t_nodes = attrs.ints("target_nodeids")?;
    let t_ids = attrs.ints("target_ids")?;
    let t_weights = attrs.floats("target_weights")?;
    for (name, len) in [
        ("target_nodeids", t_nodes.len()),
        ("target_ids", t_ids.len()),
        ("target_weights", t_weights.len()),
    ] {
        if len != t_trees.len() {
            return Err(ONNX.invalid(
                attrs.path(name),
                format!(
                    "expected {} entries (as target_treeids), got {len}",
                    t_trees.len()
                ),
            ));
        }
    }
    let mut weights: HashMap<(i64, i64), f64> = HashMap::new();
    for k in 0..t_trees.len() {
        if t_ids[k] != 0 {
            return Err(ONNX.unsupported(
                format!("{}[{k}]", attrs.path("target_ids")),
                format!("target {}; supported: 0 (one target)", t_ids[k]),
            ));
        }
        *weights.entry((t_trees[k], t_nodes[k])).or_insert(0.0) += f64::from(t_weights[k]);
    }

    // Trees in order of first appearance; each tree's nodes by id.
    let mut order: Vec<i64> = Vec::new();
    let mut by_tree: HashMap<i64, HashMap<i64, usize>> = HashMap::new();
    for k in 0..n {
        let tree = by_tree.entry(treeids[k]).or_insert_with(|| {
            order.push(treeids[k]);
            HashMap::new()
        });
        if tree.insert(nodeids[k], k).is_some() {
            return Err(ONNX.invalid(
                format!("{}[{k}]", attrs.path("nodes_nodeids")),
                format!("node {} of tree {} is given twice", nodeids[k], treeids[k]),
            ));
        }
    }
    // A child (or root) id of tree `tree`: a branch's position, or a leaf's summed weights.
    let resolve = |tree: i64, id: i64, name: &str, k: usize| -> Result<Ref, ImportError> {
        let p = *by_tree[&tree].get(&id).ok_or_else(|| {
            ONNX.invalid(
                format!("{}[{k}]", attrs.path(name)),
                format!("tree {tree} has no node {id}"),
            )
        })?;
        Ok(match modes[p] {
            Mode::Leaf => Ref::Leaf(weights.get(&(tree, id)).copied().unwrap_or(0.0)),
            _ => Ref::Branch(p),
        })
    };
    let branches = (0..n)
        .map(|k| {
            if modes[k] == Mode::Leaf {
                return Ok(None);
            }
            Ok(Some(Branch {
                feature: featureids[k],
                threshold: values[k],
                mode: modes[k],
                tracks_true: tracks.get(k).is_some_and(|&v| v == 1),
                on_true: resolve(treeids[k], trueids[k], "nodes_truenodeids", k)?,
                on_false: resolve(treeids[k], falseids[k], "nodes_falsenodeids", k)?,
            }))
        })
        .collect::<Result<Vec<_>, ImportError>>()?;
    let ensemble = Ensemble {
        branches: &branches,
        attrs: &attrs,
        names: ["nodes_featureids", "nodes_values", "nodes_modes"],
        declared_width,
    };
    let mut used_width = 0usize;
    let trees = order
        .iter()
        .map(|&tree| {
            let p = *by_tree[&tree].get(&0).ok_or_else(|| {
                ONNX.invalid(
                    attrs.path("nodes_nodeids"),
                    format!("tree {tree} has no node 0 (its root)"),
                )
            })?;
            let root = match modes[p] {
                Mode::Leaf => Ref::Leaf(weights.get(&(tree, 0)).copied().unwrap_or(0.0)),
                _ => Ref::Branch(p),
            };
            ensemble.tree(root, &format!("tree {tree}"), &mut used_width)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((trees, base, used_width))
}

pub(super) const TREE_ENSEMBLE_ATTRIBUTES: &[&str] = &[
    "aggregate_function",
    "leaf_targetids",
    "leaf_weights",
    "membership_values",
    "n_targets",
    "nodes_falseleafs",
    "nodes_falsenodeids",
    "nodes_featureids",
    "nodes_hitrates",
    "nodes_missing_value_tracks_true",
    "nodes_modes",
    "nodes_splits",
    "nodes_trueleafs",
    "nodes_truenodeids",
    "post_transform",
    "tree_roots",
];

/// Converts an opset-5 `TreeEnsemble` node (integer enums, tensors for splits, modes and leaf
/// weights, leaves in their own arrays): its trees, its base value (none: 0), and the input width
/// its feature ids need.
pub(super) fn tree_ensemble(
    node: &NodeProto,
    at: &str,
    declared_width: Option<usize>,
) -> Result<(Vec<Tree>, f64, usize), ImportError> {
    let attrs = Attributes {
        map: check_attributes(node, at, TREE_ENSEMBLE_ATTRIBUTES)?,
        at,
    };
    let n_targets = attrs.int("n_targets", 1)?;
    if n_targets != 1 {
        return Err(ONNX.unsupported(
            attrs.path("n_targets"),
            format!("{n_targets} targets; a ranker has one output, so only 1 is supported"),
        ));
    }
    let aggregate = attrs.int("aggregate_function", 1)?;
    if aggregate != 1 {
        return Err(ONNX.unsupported(
            attrs.path("aggregate_function"),
            format!("{aggregate}; supported: 1 (SUM: the ranker adds its trees)"),
        ));
    }
    let post = attrs.int("post_transform", 0)?;
    if post != 0 {
        return Err(ONNX.unsupported(
            attrs.path("post_transform"),
            format!(
                "{post}; supported: 0 (NONE: a transform of the sum is not a sum of trees; \
                 export the raw score)"
            ),
        ));
    }
    if !attrs.tensor("membership_values")?.is_empty() {
        return Err(ONNX.unsupported(
            attrs.path("membership_values"),
            "set membership (BRANCH_MEMBER) is not supported",
        ));
    }
    let roots = attrs.ints("tree_roots")?;
    let featureids = attrs.ints("nodes_featureids")?;
    let n = featureids.len();
    let splits = attrs.tensor("nodes_splits")?;
    let modes = attrs.tensor_bytes("nodes_modes")?;
    let trueids = attrs.ints("nodes_truenodeids")?;
    let trueleafs = attrs.ints("nodes_trueleafs")?;
    let falseids = attrs.ints("nodes_falsenodeids")?;
    let falseleafs = attrs.ints("nodes_falseleafs")?;
    let tracks = attrs.ints("nodes_missing_value_tracks_true")?;
    for (name, len) in [
        ("nodes_splits", splits.len()),
        ("nodes_modes", modes.len()),
        ("nodes_truenodeids", trueids.len()),
        ("nodes_trueleafs", trueleafs.len()),
        ("nodes_falsenodeids", falseids.len()),
        ("nodes_falseleafs", falseleafs.len()),
    ] {
        if len != n {
            return Err(ONNX.invalid(
                attrs.path(name),
                format!("expected {n} entries (as nodes_featureids), got {len}"),
            ));
        }
    }
    if !tracks.is_empty() && tracks.len() != n {
        return Err(ONNX.invalid(
            attrs.path("nodes_missing_value_tracks_true"),
            format!("expected 0 or {n} entries, got {}", tracks.len()),
        ));
    }
    let targets = attrs.ints("leaf_targetids")?;
    let leaf_weights = attrs.tensor("leaf_weights")?;
    if targets.len() != leaf_weights.len() {
        return Err(ONNX.invalid(
            attrs.path("leaf_targetids"),
            format!(
                "expected {} entries (as leaf_weights), got {}",
                leaf_weights.len(),
                targets.len()
            ),
        ));
    }
    if let Some(k) = targets.iter().position(|&t| t != 0) {
        return Err(ONNX.unsupported(
            format!("{}[{k}]", attrs.path("leaf_targetids")),
            format!("target {}; supported: 0 (one target)", targets[k]),
        ));
    }
    let child = |ids: &[i64], leafs: &[i64], k: usize, name: &str| -> Result<Ref, ImportError> {
        let (id, leaf) = (ids[k], leafs[k] != 0);
        let limit = if leaf { leaf_weights.len() } else { n };
        let index = usize::try_from(id)
            .ok()
            .filter(|&i| i < limit)
            .ok_or_else(|| {
                ONNX.invalid(
                    format!("{}[{k}]", attrs.path(name)),
                    format!(
                        "expected a {} index in 0..{limit}, got {id}",
                        if leaf { "leaf" } else { "node" }
                    ),
                )
            })?;
        Ok(if leaf {
            Ref::Leaf(f64::from(leaf_weights[index]))
        } else {
            Ref::Branch(index)
        })
    };
    let branches = (0..n)
        .map(|k| {
            let mode = match modes[k] {
                0 => Mode::Leq,
                1 => Mode::Lt,
                2 => Mode::Gte,
                3 => Mode::Gt,
                4 => Mode::Eq,
                5 => Mode::Neq,
                other => {
                    return Err(ONNX.unsupported(
                        format!("{}[{k}]", attrs.path("nodes_modes")),
                        format!(
                            "{other}; supported: 0 (BRANCH_LEQ), 1 (LT), 2 (GTE), 3 (GT), 4 (EQ), \
                             5 (NEQ); 6 (BRANCH_MEMBER) is not"
                        ),
                    ))
                }
            };
            Ok(Some(Branch {
                feature: featureids[k],
                threshold: splits[k],
                mode,
                tracks_true: tracks.get(k).is_some_and(|&v| v == 1),
                on_true: child(trueids, trueleafs, k, "nodes_truenodeids")?,
                on_false: child(falseids, falseleafs, k, "nodes_falsenodeids")?,
            }))
        })
        .collect::<Result<Vec<_>, ImportError>>()?;
    let ensemble = Ensemble {
        branches: &branches,
        attrs: &attrs,
        names: ["nodes_featureids", "nodes_splits", "nodes_modes"],
        declared_width,
    };
    let mut used_width = 0usize;
    let trees = roots
        .iter()
        .enumerate()
        .map(|(t, &root)| {
            let root = usize::try_from(root)
                .ok()
                .filter(|&r| r < n)
                .ok_or_else(|| {
                    ONNX.invalid(
                        format!("{}[{t}]", attrs.path("tree_roots")),
                        format!("expected a node index in 0..{n}, got {root}"),
                    )
                })?;
            ensemble.tree(Ref::Branch(root), &format!("tree {t}"), &mut used_width)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((trees, 0.0, used_width))
}

/// A child (or a root): a branch's position in the node arrays, or a leaf's value.
#[derive(Clone, Copy)]
pub(super) enum Ref {
    Branch(usize),
    Leaf(f64),
}

/// A branch node of either op, its children resolved.
pub(super) struct Branch {
    feature: i64,
    threshold: f32,
    mode: Mode,
    tracks_true: bool,
    on_true: Ref,
    on_false: Ref,
}

/// The branches of one ensemble (by node position; `None` for leaf positions) and where errors
/// point: the attributes holding feature ids, thresholds and modes.
pub(super) struct Ensemble<'a> {
    branches: &'a [Option<Branch>],
    attrs: &'a Attributes<'a>,
    names: [&'static str; 3],
    declared_width: Option<usize>,
}

/// Where a built node's index goes: the root, or a parent's left or right child.
#[derive(Clone, Copy)]
pub(super) enum Slot {
    Root,
    Left(usize),
    Right(usize),
}

impl Ensemble<'_> {
    /// The branch positions reachable from `root`, each once.
    fn reachable(&self, root: Ref) -> usize {
        let mut seen = vec![false; self.branches.len()];
        let mut stack = vec![root];
        let mut count = 0;
        while let Some(r) = stack.pop() {
            let Ref::Branch(k) = r else { continue };
            if std::mem::replace(&mut seen[k], true) {
                continue;
            }
            count += 1;
            if let Some(b) = &self.branches[k] {
                stack.extend([b.on_true, b.on_false]);
            }
        }
        count
    }

    /// Builds one tree from `root` in pre-order, copying the subtrees that `EQ` / `NEQ` need
    /// twice (and any reached from two parents); unreachable nodes are dropped, as onnxruntime
    /// never visits them.
    fn tree(&self, root: Ref, label: &str, used_width: &mut usize) -> Result<Tree, ImportError> {
        let [feature_name, threshold_name, mode_name] = self.names;
        let at = |name: &str, k: usize| format!("{}[{k}]", self.attrs.path(name));
        let reachable = self.reachable(root);
        let budget = (2 * reachable + 1).saturating_mul(COPY_GROWTH).max(64);
        let mut nodes: Vec<Node> = Vec::new();
        let mut stack = vec![(root, Slot::Root, 0usize)];
        while let Some((r, slot, depth)) = stack.pop() {
            let id = nodes.len();
            link(&mut nodes, slot, id);
            let k = match r {
                Ref::Leaf(v) => {
                    nodes.push(Node::Leaf(v));
                    continue;
                }
                Ref::Branch(k) => k,
            };
            if depth > reachable {
                return Err(ONNX.invalid(
                    at(mode_name, k),
                    format!("{label} has a cycle through node position {k}"),
                ));
            }
            let Some(b) = &self.branches[k] else {
                unreachable!("a leaf position resolves to Ref::Leaf")
            };
            let limit = self.declared_width.unwrap_or(MAX_FEATURES);
            if !(0..limit as i64).contains(&b.feature) {
                return Err(ONNX.invalid(
                    at(feature_name, k),
                    format!("expected a feature index in 0..{limit}, got {}", b.feature),
                ));
            }
            *used_width = (*used_width).max(b.feature as usize + 1);
            if !b.threshold.is_finite() {
                return Err(ONNX.invalid(
                    at(threshold_name, k),
                    format!("expected a finite threshold, got {}", b.threshold),
                ));
            }
            let split = |decision, default_left| Split {
                feature: b.feature as u32,
                decision,
                missing: Missing::Nan,
                default_left,
                left: 0,
                right: 0,
            };
            let lt = Decision::LtF32(b.threshold);
            let le = super::super::le_f32(b.threshold);
            let (t, f) = (b.on_true, b.on_false);
            match b.mode {
                Mode::Leq | Mode::Lt | Mode::Gte | Mode::Gt => {
                    let (decision, true_left) = match b.mode {
                        Mode::Leq => (le, true),
                        Mode::Lt => (lt, true),
                        Mode::Gte => (lt, false),
                        _ => (le, false),
                    };
                    // NaN compares false, so it goes the true way only when tracked.
                    let nan_left = b.tracks_true == true_left;
                    nodes.push(Node::Split(split(decision, nan_left)));
                    let (left, right) = if true_left { (t, f) } else { (f, t) };
                    stack.push((right, Slot::Right(id), depth + 1));
                    stack.push((left, Slot::Left(id), depth + 1));
                }
                Mode::Eq | Mode::Neq => {
                    // EQ: x < t → false; x <= t → true; else false. NEQ the other way round.
                    // A NaN is "true" for NEQ (NaN != t) and for a tracked EQ.
                    let (inside, outside) = if b.mode == Mode::Eq { (t, f) } else { (f, t) };
                    let nan_true = b.mode == Mode::Neq || b.tracks_true;
                    let nan_inside = nan_true == (b.mode == Mode::Eq);
                    nodes.push(Node::Split(split(lt, !nan_inside)));
                    let second = nodes.len();
                    link(&mut nodes, Slot::Right(id), second);
                    nodes.push(Node::Split(split(le, nan_inside)));
                    stack.push((outside, Slot::Right(second), depth + 1));
                    stack.push((inside, Slot::Left(second), depth + 1));
                    stack.push((outside, Slot::Left(id), depth + 1));
                }
                Mode::Leaf => unreachable!("leaves are not branches"),
            }
            if nodes.len() > budget {
                return Err(ONNX.unsupported(
                    at(mode_name, k),
                    format!(
                        "{label}: copied subtrees (each BRANCH_EQ / BRANCH_NEQ copies one, as a \
                         ranker's splits compare with < and <=; a node reached from two \
                         parents is copied too) would grow the tree past {budget} nodes \
                         ({COPY_GROWTH}x its {} nodes)",
                        2 * reachable + 1
                    ),
                ));
            }
        }
        Ok(Tree { nodes })
    }
}

/// Sets the child index that `slot` names to `id`.
pub(super) fn link(nodes: &mut [Node], slot: Slot, id: usize) {
    let (parent, left) = match slot {
        Slot::Root => return,
        Slot::Left(p) => (p, true),
        Slot::Right(p) => (p, false),
    };
    if let Node::Split(s) = &mut nodes[parent] {
        if left {
            s.left = id as u32;
        } else {
            s.right = id as u32;
        }
    }
}
