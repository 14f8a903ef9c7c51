//! Writing a [`Ranker`] as a native file, one item per line.

use std::fmt::Write as _;

use super::{FORMAT_NAME, FORMAT_VERSION};
use crate::rank::model::{
    Activation, Decision, FeatureIdx, Input, Layer, Missing, Node, Ranker, Tree,
};

/// Writes `ranker` as a native file: one item per line (features, inputs, tree nodes, weight
/// rows), numbers printed shortest-round-trip (f64 as f64, f32 as f32), fields equal to their
/// defaults left out. [`parse_native`](super::parse_native) of the result gives back an equal ranker.
pub fn to_native_json(ranker: &Ranker) -> String {
    let mut out = String::new();
    out.push_str("{\n");
    let _ = writeln!(out, "  \"format\": {},", json_str(FORMAT_NAME));
    let _ = writeln!(out, "  \"version\": {FORMAT_VERSION},");
    out.push_str("  \"features\": [");
    push_list(
        &mut out,
        "    ",
        ranker.features.iter().map(|f| json_str(f)),
    );
    out.push(']');
    if !ranker.inputs.is_empty() {
        out.push_str(",\n  \"inputs\": [");
        let names = &ranker.features;
        let inputs: Vec<String> = ranker.inputs.iter().map(|i| input_json(i, names)).collect();
        push_list(&mut out, "    ", inputs.into_iter());
        out.push(']');
    }
    if !ranker.layers.is_empty() {
        out.push_str(",\n  \"layers\": [");
        let layers: Vec<String> = ranker.layers.iter().map(layer_json).collect();
        push_list(&mut out, "    ", layers.into_iter());
        out.push(']');
    }
    if let Some(e) = &ranker.ensemble {
        let _ = write!(
            out,
            ",\n  \"ensemble\": {{\"base_score\": {}, \"trees\": [",
            f64_str(e.base_score)
        );
        let trees: Vec<String> = e.trees.iter().map(tree_json).collect();
        push_list(&mut out, "    ", trees.into_iter());
        out.push_str("]}");
    }
    out.push_str("\n}\n");
    out
}

/// Pushes items one per line at `indent`, comma-separated, with a closing newline at the
/// indentation two less (the caller closes the bracket).
fn push_list(out: &mut String, indent: &str, items: impl Iterator<Item = String>) {
    let mut any = false;
    for (k, item) in items.enumerate() {
        out.push_str(if k == 0 { "\n" } else { ",\n" });
        out.push_str(indent);
        out.push_str(&item);
        any = true;
    }
    if any {
        out.push('\n');
        out.push_str(&indent[2..]);
    }
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn f64_str(v: f64) -> String {
    serde_json::Value::from(v).to_string()
}

fn f32_str(v: f32) -> String {
    // serde_json prints an f32 with the shortest digits that read back as the same f32.
    serde_json::to_string(&v).unwrap_or_else(|_| f64_str(f64::from(v)))
}

fn input_json(input: &Input, names: &[String]) -> String {
    let name = |f: &FeatureIdx| json_str(&names[*f as usize]);
    match input {
        Input::Linear {
            feature,
            slope,
            intercept,
        } => format!(
            "{{\"type\": \"linear\", \"feature\": {}, \"slope\": {}, \"intercept\": {}}}",
            name(feature),
            f32_str(*slope),
            f32_str(*intercept)
        ),
        Input::LogLinear {
            feature,
            slope,
            intercept,
        } => format!(
            "{{\"type\": \"loglinear\", \"feature\": {}, \"slope\": {}, \"intercept\": {}}}",
            name(feature),
            f32_str(*slope),
            f32_str(*intercept)
        ),
        Input::Bucket {
            feature,
            lower,
            upper,
        } => format!(
            "{{\"type\": \"bucket\", \"feature\": {}, \"lower\": {}, \"upper\": {}}}",
            name(feature),
            f64_str(*lower),
            f64_str(*upper)
        ),
        Input::FreeForm(ff) => format!(
            "{{\"type\": \"freeform\", \"expr\": {}}}",
            json_str(&ff.source)
        ),
        Input::Tree(tree) => format!("{{\"type\": \"tree\", \"tree\": {}}}", tree_json(tree)),
        Input::Dummy => "{\"type\": \"dummy\"}".to_string(),
    }
}

/// A tree on one line, nodes without spaces: production-sized rankers have 10⁵ nodes.
fn tree_json(tree: &Tree) -> String {
    let nodes: Vec<String> = tree.nodes.iter().map(node_json).collect();
    format!("{{\"nodes\": [{}]}}", nodes.join(","))
}

fn node_json(node: &Node) -> String {
    let s = match node {
        Node::Leaf(v) => return format!("{{\"leaf\":{}}}", f64_str(*v)),
        Node::Split(s) => s,
    };
    let mut out = format!("{{\"feature\":{}", s.feature);
    match &s.decision {
        Decision::LeF64(t) => {
            let _ = write!(out, ",\"threshold\":{}", f64_str(*t));
        }
        Decision::LtF32(t) => {
            let _ = write!(
                out,
                ",\"decision\":\"lt_f32\",\"threshold\":{}",
                f32_str(*t)
            );
        }
        Decision::In(set) => {
            let cats: Vec<String> = set.iter().map(u32::to_string).collect();
            let _ = write!(
                out,
                ",\"decision\":\"in\",\"categories\":[{}]",
                cats.join(",")
            );
        }
    }
    match s.missing {
        Missing::None => {}
        Missing::Zero => out.push_str(",\"missing\":\"zero\""),
        Missing::Nan => out.push_str(",\"missing\":\"nan\""),
    }
    if s.default_left {
        out.push_str(",\"default_left\":true");
    }
    let _ = write!(out, ",\"left\":{},\"right\":{}}}", s.left, s.right);
    out
}

fn layer_json(layer: &Layer) -> String {
    let activation = match layer.activation {
        Activation::Identity => "identity",
        Activation::Relu => "relu",
        Activation::Tanh => "tanh",
        Activation::Sigmoid => "sigmoid",
    };
    let row_str = |row: &[f32]| {
        row.iter()
            .map(|w| f32_str(*w))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = format!(
        "{{\"activation\": \"{activation}\", \"bias\": [{}], \"weights\": [",
        row_str(&layer.bias)
    );
    let rows = layer
        .weights
        .chunks(layer.inputs.max(1))
        .map(|r| format!("[{}]", row_str(r)));
    push_list(&mut out, "      ", rows);
    out.push_str("]}");
    out
}
