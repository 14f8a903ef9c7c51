//! RankLib LambdaMART / MART ensembles (the XML that `-save` writes and Elasticsearch LTR's
//! `model/ranklib` loads) → [`Ranker`].
//!
//! The file:
//! ```text
//! ## LambdaMART                  `##` comment lines; the first names the model kind
//! ## No. of trees = 2
//! <ensemble>
//!   <tree id="1" weight="0.1">   weight: the learning rate, a float
//!     <split>
//!       <feature> 2 </feature>   a feature id, from 1
//!       <threshold> 0.45 </threshold>
//!       <split pos="left"> <output> -2.0 </output> </split>
//!       <split pos="right"> ... </split>
//!     </split>
//!   </tree>
//! </ensemble>
//! ```
//! RankLib's own rules (`LambdaMART.loadFromString`, `Ensemble(String)`, `Split.eval`,
//! `DenseDataPoint.getFeatureValue`), reproduced here:
//! - Feature values are floats; a missing one (NaN) is read as `0`. Feature id `i` is the
//!   ranker's feature named `"i"`; ids start at 1 (RankLib's id 0 is never a feature).
//! - At a split, left when `value <= threshold` in f32 (thresholds are read by
//!   `Float.parseFloat`; a threshold must be finite), `le_f32` as for CatBoost and ONNX.
//! - A split's children are its third and fourth elements, whatever `pos` says (here `pos`, when
//!   present, must agree); a leaf's value is its `<output>`, read as a float.
//! - The score is the sum over trees of `output × weight` (the product of two floats, exact in
//!   f64, is the imported leaf value). RankLib adds in f32; the ranker adds in f64, so scores
//!   agree to f32 rounding of the running sum (relative 1e-7 on the fixtures).
//!
//! Refused: other RankLib models (Coordinate Ascent, RankNet, Random Forests, ...), elements
//! other than those above, NaN thresholds and feature id 0.

use quick_xml::events::Event;

use super::{le_f32, ranker_from_trees, Format, ImportError};
use crate::rank::format::{validate, MAX_FEATURES};
use crate::rank::model::{FeatureIdx, Missing, Node, Ranker, Split, Tree};
use crate::rank::RankerError;

const RANKLIB: Format = Format("RankLib");

/// Elements nested deeper than this are refused (a tree this deep has no use in ranking).
const MAX_DEPTH: usize = 512;

/// The model kinds in a RankLib header that are ensembles of regression trees.
const ENSEMBLES: [&str; 2] = ["LambdaMART", "MART"];

/// Imports a RankLib LambdaMART or MART model file as an ensemble-only ranker whose features
/// are named `"1"` to the highest feature id used.
///
/// # Errors
/// [`RankerError::Import`] naming the element (`tree[3].split.left.threshold`) and why: not XML,
/// another RankLib model kind, an element RankLib's ensembles do not have, a number that does
/// not parse; or the [`validate`] error of the result.
pub fn import_ranklib(bytes: &[u8]) -> Result<Ranker, RankerError> {
    let ranker = build(bytes)?;
    validate(&ranker)?;
    Ok(ranker)
}

/// The `##` lines are stripped (RankLib skips them too); what is left must be XML.
fn build(bytes: &[u8]) -> Result<Ranker, ImportError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        RANKLIB.invalid(
            "(file)",
            format!("not UTF-8 text (byte {})", e.valid_up_to()),
        )
    })?;
    let mut xml = String::with_capacity(text.len());
    let mut kind = None;
    for line in text.lines() {
        match line.trim().strip_prefix("##") {
            Some(comment) => {
                kind.get_or_insert_with(|| comment.trim().to_string());
            }
            None => {
                xml.push_str(line);
                xml.push('\n');
            }
        }
    }
    if let Some(kind) = kind.filter(|k| !ENSEMBLES.contains(&k.as_str())) {
        return Err(RANKLIB.unsupported(
            "(header)",
            format!(
                "a {kind:?} model; only tree ensembles (\"## LambdaMART\", \"## MART\") can be \
                 imported"
            ),
        ));
    }
    let root = parse_xml(&xml)?;
    if root.name != "ensemble" {
        return Err(RANKLIB.invalid(
            "(root)",
            format!("expected <ensemble>, got <{}>", root.name),
        ));
    }
    no_stray_text(&root, "(root)")?;
    let mut max_id = 0;
    let mut trees = Vec::with_capacity(root.children.len());
    for (t, tree) in root.children.iter().enumerate() {
        let path = format!("tree[{t}]");
        if tree.name != "tree" {
            return Err(unknown(
                &path,
                &tree.name,
                "<ensemble> holds <tree> elements",
            ));
        }
        let weight: f32 = float(
            tree.attr("weight")
                .ok_or_else(|| RANKLIB.invalid(&path, "missing its weight attribute"))?,
            &format!("{path}.weight"),
        )?;
        no_stray_text(tree, &path)?;
        let [root_split] = tree.children.as_slice() else {
            return Err(RANKLIB.invalid(
                &path,
                format!("expected one <split>, got {} elements", tree.children.len()),
            ));
        };
        let mut nodes = Vec::new();
        convert(
            root_split,
            &format!("{path}.split"),
            f64::from(weight),
            &mut nodes,
            &mut max_id,
        )?;
        trees.push(Tree { nodes });
    }
    let features = (1..=max_id.max(1)).map(|id| id.to_string()).collect();
    Ok(ranker_from_trees(features, trees, 0.0))
}

/// An XML element: its name, attributes, child elements and the text directly inside it.
struct Element {
    name: String,
    attrs: Vec<(String, String)>,
    children: Vec<Element>,
    text: String,
}

impl Element {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the document's one root element with quick-xml.
fn parse_xml(xml: &str) -> Result<Element, ImportError> {
    let mut reader = quick_xml::Reader::from_str(xml);
    reader.config_mut().trim_text(true);
    let xml_error = |reader: &quick_xml::Reader<&[u8]>, message: String| {
        RANKLIB.invalid(
            "(XML)",
            format!(
                "{message} at byte {} (after the ## lines)",
                reader.error_position()
            ),
        )
    };
    let element = |start: &quick_xml::events::BytesStart| -> Result<Element, String> {
        let name = start.name().as_ref().to_string();
        let attrs = start
            .attributes()
            .map(|a| {
                let a = a.map_err(|e| e.to_string())?;
                let value = a
                    .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                    .map_err(|e| e.to_string())?;
                Ok((a.key.as_ref().to_string(), value.into_owned()))
            })
            .collect::<Result<_, String>>()?;
        Ok(Element {
            name,
            attrs,
            children: Vec::new(),
            text: String::new(),
        })
    };
    let mut open: Vec<Element> = Vec::new();
    let mut root = None;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| xml_error(&reader, e.to_string()))?;
        let done = match event {
            Event::Start(start) => {
                if root.is_some() {
                    return Err(xml_error(&reader, "a second root element".into()));
                }
                if open.len() >= MAX_DEPTH {
                    return Err(xml_error(
                        &reader,
                        format!("elements nested deeper than {MAX_DEPTH}"),
                    ));
                }
                open.push(element(&start).map_err(|m| xml_error(&reader, m))?);
                None
            }
            Event::Empty(start) => Some(element(&start).map_err(|m| xml_error(&reader, m))?),
            Event::End(_) => open.pop(),
            Event::Text(text) => {
                let Some(parent) = open.last_mut() else {
                    return Err(xml_error(&reader, "text outside the root element".into()));
                };
                parent.text.push_str(&text.into_inner());
                None
            }
            Event::CData(_) | Event::GeneralRef(_) => {
                return Err(xml_error(
                    &reader,
                    "CDATA or an entity reference; RankLib models hold plain numbers".into(),
                ))
            }
            Event::Eof => break,
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) | Event::DocType(_) => None,
        };
        if let Some(done) = done {
            match open.last_mut() {
                Some(parent) => parent.children.push(done),
                None if root.is_none() => root = Some(done),
                None => return Err(xml_error(&reader, "a second root element".into())),
            }
        }
    }
    if !open.is_empty() {
        return Err(xml_error(
            &reader,
            format!("<{}> is not closed", open[open.len() - 1].name),
        ));
    }
    root.ok_or_else(|| RANKLIB.invalid("(XML)", "no <ensemble> element"))
}

/// Refuses text directly inside a structural element (RankLib would misread it as a node).
fn no_stray_text(element: &Element, path: &str) -> Result<(), ImportError> {
    if element.text.is_empty() {
        Ok(())
    } else {
        Err(RANKLIB.invalid(
            path,
            format!(
                "text {:?} inside <{}>: only <feature>, <threshold> and <output> hold text",
                crate::rank::cut_input(&element.text),
                element.name
            ),
        ))
    }
}

fn unknown(path: &str, name: &str, expected: &str) -> ImportError {
    RANKLIB.unsupported(path, format!("unknown element <{name}>: {expected}"))
}

/// A float as Java's `Float.parseFloat` reads RankLib's numbers (decimal, correctly rounded).
fn float(text: &str, path: &str) -> Result<f32, ImportError> {
    text.trim()
        .parse::<f32>()
        .map_err(|_| RANKLIB.invalid(path, format!("expected a number, got {text:?}")))
}

/// Appends the `<split>` `split` and its subtree to `nodes` in pre-order; leaf values are
/// multiplied by the tree's `weight`.
fn convert(
    split: &Element,
    path: &str,
    weight: f64,
    nodes: &mut Vec<Node>,
    max_id: &mut usize,
) -> Result<u32, ImportError> {
    const SPLIT_HOLDS: &str =
        "a <split> holds <feature>, <threshold> and two <split>s, or one <output>";
    if split.name != "split" {
        return Err(unknown(path, &split.name, SPLIT_HOLDS));
    }
    no_stray_text(split, path)?;
    for value in &split.children {
        if value.name != "split" && !value.children.is_empty() {
            return Err(RANKLIB.invalid(
                format!("{path}.{}", value.name),
                format!("<{}> holds a number, not elements", value.name),
            ));
        }
    }
    let id = nodes.len() as u32;
    let names: Vec<&str> = split.children.iter().map(|c| c.name.as_str()).collect();
    match names.as_slice() {
        ["output"] => {
            let output = float(&split.children[0].text, &format!("{path}.output"))?;
            nodes.push(Node::Leaf(f64::from(output) * weight));
            Ok(id)
        }
        ["feature", "threshold", "split", "split"] => {
            let [feature, threshold, left, right] = &split.children[..] else {
                unreachable!("four children matched above")
            };
            let feature_path = format!("{path}.feature");
            let fid: usize = feature.text.trim().parse().map_err(|_| {
                RANKLIB.invalid(
                    &feature_path,
                    format!("expected a feature id (from 1), got {:?}", feature.text),
                )
            })?;
            if fid == 0 || fid > MAX_FEATURES {
                return Err(RANKLIB.invalid(
                    feature_path,
                    format!(
                        "expected a feature id in 1..={MAX_FEATURES} (ids start at 1), got {fid}"
                    ),
                ));
            }
            *max_id = (*max_id).max(fid);
            let threshold_path = format!("{path}.threshold");
            let t = float(&threshold.text, &threshold_path)?;
            if !t.is_finite() {
                return Err(RANKLIB.invalid(
                    threshold_path,
                    format!("expected a finite threshold, got {t}"),
                ));
            }
            let decision = le_f32(t);
            for (child, pos) in [(left, "left"), (right, "right")] {
                if child.attr("pos").is_some_and(|p| p != pos) {
                    return Err(RANKLIB.invalid(
                        format!("{path}.{pos}"),
                        format!(
                            "pos={:?} on the {pos} child (RankLib takes children by position)",
                            child.attr("pos").unwrap_or_default()
                        ),
                    ));
                }
            }
            nodes.push(Node::Leaf(0.0)); // replaced below, once the children have indices
            let left = convert(left, &format!("{path}.left"), weight, nodes, max_id)?;
            let right = convert(right, &format!("{path}.right"), weight, nodes, max_id)?;
            nodes[id as usize] = Node::Split(Split {
                feature: (fid - 1) as FeatureIdx,
                decision,
                // RankLib reads a missing value as 0 and compares it.
                missing: Missing::None,
                default_left: false,
                left,
                right,
            });
            Ok(id)
        }
        _ => match names
            .iter()
            .find(|n| !["feature", "threshold", "split", "output"].contains(n))
        {
            Some(name) => Err(unknown(path, name, SPLIT_HOLDS)),
            None => Err(RANKLIB.invalid(
                path,
                format!("{SPLIT_HOLDS} in that order, got <{}>", names.join("> <")),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::cpu::goes_left;

    const MODEL: &str = "## LambdaMART
## No. of trees = 2
## No. of leaves = 3
<ensemble>
\t<tree id=\"1\" weight=\"0.1\">
\t\t<split>
\t\t\t<feature> 2 </feature>
\t\t\t<threshold> 0.5 </threshold>
\t\t\t<split pos=\"left\">
\t\t\t\t<output> -2.0 </output>
\t\t\t</split>
\t\t\t<split pos=\"right\">
\t\t\t\t<feature> 3 </feature>
\t\t\t\t<threshold> -1.25 </threshold>
\t\t\t\t<split pos=\"left\">
\t\t\t\t\t<output> 0.75 </output>
\t\t\t\t</split>
\t\t\t\t<split pos=\"right\">
\t\t\t\t\t<output> 1.5 </output>
\t\t\t\t</split>
\t\t\t</split>
\t\t</split>
\t</tree>
\t<tree id=\"2\" weight=\"0.1\">
\t\t<split>
\t\t\t<output> 0.125 </output>
\t\t</split>
\t</tree>
</ensemble>
";

    #[test]
    fn splits_and_leaves_become_nodes() {
        let ranker = import_ranklib(MODEL.as_bytes()).unwrap();
        assert_eq!(ranker.features, ["1", "2", "3"]);
        let ensemble = ranker.ensemble.unwrap();
        let split = |feature, t: f32, left, right| {
            Node::Split(Split {
                feature,
                decision: le_f32(t),
                missing: Missing::None,
                default_left: false,
                left,
                right,
            })
        };
        let w = f64::from(0.1f32);
        assert_eq!(
            ensemble.trees[0].nodes,
            vec![
                split(1, 0.5, 1, 2),
                Node::Leaf(-2.0 * w),
                split(2, -1.25, 3, 4),
                Node::Leaf(0.75 * w),
                Node::Leaf(1.5 * w),
            ]
        );
        assert_eq!(ensemble.trees[1].nodes, vec![Node::Leaf(0.125 * w)]);
    }

    #[test]
    fn the_rule_is_less_or_equal_in_f32_with_missing_as_zero() {
        let at = |t: f32| Split {
            feature: 0,
            decision: le_f32(t),
            missing: Missing::None,
            default_left: false,
            left: 1,
            right: 2,
        };
        for t in [0.5f32, -1.25, 0.0, -0.0, 1e-30, f32::MAX, -f32::MAX] {
            for x in [
                f64::from(t),
                f64::from(t) + 1e-12,
                f64::NAN,
                0.0,
                f64::INFINITY,
                f64::NEG_INFINITY,
                1e300,
            ] {
                let value = if x.is_nan() { 0.0 } else { x as f32 };
                assert_eq!(goes_left(&at(t), x), value <= t, "x = {x:e}, t = {t:e}");
            }
        }
    }

    fn error_of(text: &str) -> String {
        import_ranklib(text.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn refuses_unknown_elements_and_other_models() {
        let err = error_of(&MODEL.replacen("<output> 0.75 </output>", "<leaf> 0.75 </leaf>", 1));
        assert_eq!(
            err,
            "RankLib model, tree[0].split.right.left: unknown element <leaf>: a <split> holds \
             <feature>, <threshold> and two <split>s, or one <output>"
        );
        let err = error_of(&MODEL.replace("## LambdaMART", "## Coordinate Ascent"));
        assert_eq!(
            err,
            "RankLib model, (header): a \"Coordinate Ascent\" model; only tree ensembles \
             (\"## LambdaMART\", \"## MART\") can be imported"
        );
        let err = error_of(
            &MODEL
                .replacen("<tree id=\"2\"", "<forest id=\"2\"", 1)
                .replacen("</tree>\n</ensemble>", "</forest>\n</ensemble>", 1),
        );
        assert!(err.contains("tree[1]: unknown element <forest>"), "{err}");
    }

    #[test]
    fn refuses_bad_values() {
        for (from, to, expected) in [
            (
                "<feature> 2 </feature>",
                "<feature> 0 </feature>",
                "tree[0].split.feature: expected a feature id in 1..=",
            ),
            (
                "<feature> 2 </feature>",
                "<feature> x </feature>",
                "tree[0].split.feature: expected a feature id (from 1)",
            ),
            (
                "<threshold> 0.5 </threshold>",
                "<threshold> NaN </threshold>",
                "tree[0].split.threshold: expected a finite threshold, got NaN",
            ),
            (
                "weight=\"0.1\"",
                "weight=\"heavy\"",
                "tree[0].weight: expected a number, got \"heavy\"",
            ),
            (
                "weight=\"0.1\"",
                "w=\"0.1\"",
                "tree[0]: missing its weight attribute",
            ),
            (
                "<split pos=\"left\">",
                "<split pos=\"right\">",
                "tree[0].split.left: pos=\"right\"",
            ),
            ("</ensemble>", "", "<ensemble> is not closed"),
            (
                "<output> -2.0 </output>",
                "<output> -2.0 </output><output>1</output>",
                "in that order, got <output> <output>",
            ),
        ] {
            let err = error_of(&MODEL.replacen(from, to, 1));
            assert!(err.contains(expected), "{from} -> {to}: {err}");
        }
        let err = error_of(&MODEL.replace("ensemble>", "trees>"));
        assert!(
            err.contains("(root): expected <ensemble>, got <trees>"),
            "{err}"
        );
        assert!(error_of(&"<split>".repeat(600)).contains("nested deeper than 512"));
    }

    #[test]
    fn a_file_without_header_lines_imports() {
        let bare = MODEL
            .lines()
            .filter(|l| !l.starts_with("##"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            import_ranklib(bare.as_bytes()).unwrap(),
            import_ranklib(MODEL.as_bytes()).unwrap()
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        /// The real fixture with whitespace-separated tokens replaced by nasty ones.
        #[test]
        fn never_panics_on_a_real_model_with_nasty_tokens(
            edits in proptest::collection::vec(
                (proptest::prelude::any::<usize>(), 0usize..super::super::test_support::NASTY.len()), 1..4),
        ) {
            let bytes = super::super::test_support::with_nasty_tokens("fixtures/trees/ranklib_lambdamart.model.xml", &edits);
            let _ = import_ranklib(&bytes);
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_mutated_input(
            edits in proptest::collection::vec((0usize..1000, proptest::prelude::any::<u8>()), 0..6),
            cut in 0usize..700,
        ) {
            let mut bytes = MODEL.as_bytes().to_vec();
            for (at, byte) in edits {
                let at = at % bytes.len();
                bytes[at] = b"0123456789-<>/.e \"=ts"[usize::from(byte) % 21];
            }
            bytes.truncate(bytes.len() - cut % bytes.len());
            let _ = import_ranklib(&bytes);
        }
    }
}
