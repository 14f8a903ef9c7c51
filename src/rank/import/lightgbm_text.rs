//! LightGBM's text model (`model.txt`, what `Booster.save_model` writes by default) →
//! [`Ranker`], through the tree builder of [`super::lightgbm`], so both LightGBM formats follow
//! one reading of LightGBM's decision rules (see that module's docs).
//!
//! The file, as LightGBM 4's `GBDT::SaveModelToString` writes it:
//! ```text
//! tree                          magic line
//! version=v4                    header: key=value lines (a bare `average_output` for RF)
//! num_class=1
//! num_tree_per_iteration=1
//! max_feature_idx=5
//! feature_names=a b c ...       space-separated
//!
//! Tree=0                        one block per tree
//! num_leaves=3                  internal nodes are 0..num_leaves-1; a child < 0 is leaf ~child
//! num_cat=0
//! split_feature=0 4             per internal node
//! threshold=0.5 1               numerical: the threshold; categorical: an index into cat_boundaries
//! decision_type=2 9             bit 0 categorical, bit 1 default_left, bits 2-3 missing type
//!                               (0 None, 1 Zero, 2 NaN)
//! left_child=1 -1
//! right_child=-2 -3
//! leaf_value=...                per leaf, already multiplied by the tree's shrinkage
//! cat_boundaries=0 1            (num_cat > 0) categorical split i's words are
//! cat_threshold=82              cat_threshold[cat_boundaries[i]..cat_boundaries[i+1]], a bitset
//! is_linear=0
//! shrinkage=0.1
//!
//! end of trees                  then feature importances and parameters, not read
//! ```

use std::collections::HashMap;

use super::lightgbm::{build_tree, check_header, Header, LgbNode, Rule};
use super::{ranker_from_trees, Format, ImportError};
use crate::rank::format::{validate, MAX_FEATURES};
use crate::rank::model::{Missing, Ranker, Tree};
use crate::rank::RankerError;

const LIGHTGBM_TEXT: Format = Format("LightGBM text");

/// Imports a LightGBM text model (`booster.save_model("model.txt")`) as an ensemble-only ranker
/// whose features are the model's `feature_names`; it scores exactly as the same model's
/// `dump_model()` JSON imported by [`super::import_lightgbm`].
///
/// # Errors
/// [`RankerError::Import`] naming the header key or the tree's field (`Tree=3.threshold[2]`) and
/// why: malformed, or a model a ranker cannot represent exactly (multi-class, linear trees,
/// averaged output); or the [`validate`] error of the result.
pub fn import_lightgbm_text(bytes: &[u8]) -> Result<Ranker, RankerError> {
    let ranker = build(bytes)?;
    validate(&ranker)?;
    Ok(ranker)
}

/// `key=value` lines of one section; a bare `key` has an empty value.
struct Section<'a> {
    /// How errors name the section's fields: `""` for the header, `"Tree=3."` for a tree.
    prefix: String,
    fields: HashMap<&'a str, &'a str>,
}

impl<'a> Section<'a> {
    fn new(prefix: String, lines: &[&'a str]) -> Self {
        let fields = lines
            .iter()
            .map(|line| line.split_once('=').unwrap_or((line, "")))
            .collect();
        Section { prefix, fields }
    }

    fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn get(&self, key: &str) -> Result<&'a str, ImportError> {
        self.fields
            .get(key)
            .copied()
            .ok_or_else(|| LIGHTGBM_TEXT.invalid(self.path(key), "missing"))
    }

    fn parse<T: std::str::FromStr>(&self, key: &str, what: &str) -> Result<T, ImportError> {
        let text = self.get(key)?;
        text.trim().parse().map_err(|_| {
            LIGHTGBM_TEXT.invalid(self.path(key), format!("expected {what}, got {text:?}"))
        })
    }

    /// The space-separated list `key`, which must have `len` entries.
    fn list<T: std::str::FromStr>(
        &self,
        key: &str,
        len: usize,
        what: &str,
    ) -> Result<Vec<T>, ImportError> {
        let text = self.get(key)?;
        let items = text
            .split_ascii_whitespace()
            .enumerate()
            .map(|(i, item)| {
                item.parse().map_err(|_| {
                    LIGHTGBM_TEXT.invalid(
                        format!("{}[{i}]", self.path(key)),
                        format!("expected {what}, got {item:?}"),
                    )
                })
            })
            .collect::<Result<Vec<T>, _>>()?;
        if items.len() != len {
            return Err(LIGHTGBM_TEXT.invalid(
                self.path(key),
                format!("expected {len} entries, got {}", items.len()),
            ));
        }
        Ok(items)
    }
}

fn build(bytes: &[u8]) -> Result<Ranker, ImportError> {
    let first_line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    if first_line.trim_ascii() != b"tree" {
        return Err(LIGHTGBM_TEXT.invalid(
            "(first line)",
            "expected \"tree\", the first line of a LightGBM text model",
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        LIGHTGBM_TEXT.invalid(
            "(file)",
            format!("not UTF-8 text (byte {})", e.valid_up_to()),
        )
    })?;
    let mut lines = text.lines().map(str::trim);
    lines.next(); // "tree"
                  // Header lines up to the first tree; tree blocks up to "end of trees".
    let mut header = Vec::new();
    let mut trees: Vec<(String, Vec<&str>)> = Vec::new();
    let mut ended = false;
    for line in lines {
        if line == "end of trees" {
            ended = true;
            break;
        }
        if line.is_empty() {
            continue;
        }
        match (line.strip_prefix("Tree="), trees.last_mut()) {
            (Some(id), _) => trees.push((id.to_string(), Vec::new())),
            (None, Some((_, block))) => block.push(line),
            (None, None) => header.push(line),
        }
    }
    if !ended {
        return Err(
            LIGHTGBM_TEXT.invalid("(end)", "no \"end of trees\" line: the file is truncated")
        );
    }
    let header = Section::new(String::new(), &header);
    let max_feature_idx: i64 = header.parse("max_feature_idx", "an integer")?;
    if max_feature_idx >= MAX_FEATURES as i64 {
        return Err(LIGHTGBM_TEXT.invalid(
            "max_feature_idx",
            format!("expected fewer than {MAX_FEATURES} features, got {max_feature_idx}"),
        ));
    }
    let feature_names: Vec<String> = header
        .get("feature_names")?
        .split_ascii_whitespace()
        .map(str::to_string)
        .collect();
    let features = check_header(
        LIGHTGBM_TEXT,
        Header {
            num_class: header.parse("num_class", "an integer")?,
            num_tree_per_iteration: header.parse("num_tree_per_iteration", "an integer")?,
            max_feature_idx,
            feature_names,
            average_output: header.fields.contains_key("average_output"),
        },
    )?;
    let trees = trees
        .iter()
        .map(|(id, block)| tree(&Section::new(format!("Tree={id}."), block), features.len()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ranker_from_trees(features, trees, 0.0))
}

/// One `Tree=` block.
fn tree(section: &Section, n_features: usize) -> Result<Tree, ImportError> {
    if section
        .fields
        .get("is_linear")
        .is_some_and(|v| v.trim() != "0")
    {
        return Err(LIGHTGBM_TEXT.unsupported(
            section.path("is_linear"),
            "linear trees (linear_tree = true) have a linear model per leaf; only constant \
             leaves can be imported",
        ));
    }
    let num_leaves: usize = section.parse("num_leaves", "a leaf count >= 1")?;
    // Each leaf is written as at least two characters of `leaf_value`.
    let bound = section.get("leaf_value")?.len() / 2 + 1;
    if num_leaves == 0 || num_leaves > bound {
        return Err(LIGHTGBM_TEXT.invalid(
            section.path("num_leaves"),
            format!("expected 1 to {bound} (what leaf_value holds), got {num_leaves}"),
        ));
    }
    let leaf_value: Vec<f64> = section.list("leaf_value", num_leaves, "a number")?;
    if num_leaves == 1 {
        return build_tree(LIGHTGBM_TEXT, n_features, !0i64, |_| {
            Ok(LgbNode::Leaf(leaf_value[0]))
        });
    }
    let n = num_leaves - 1;
    let split_feature: Vec<i64> = section.list("split_feature", n, "a feature index")?;
    // A split on a feature's last bin keeps LightGBM's bin bound, ±inf, which a ranker file
    // cannot hold: read it as LightGBM's own JSON dump writes it (`Common::AvoidInf`, ±1e300),
    // so the two files of one model import to the same ranker.
    let threshold: Vec<f64> = (section.list::<f64>("threshold", n, "a number")?)
        .into_iter()
        .map(|t| {
            if t.is_infinite() {
                t.signum() * 1e300
            } else {
                t
            }
        })
        .collect();
    let decision_type: Vec<u8> = section.list("decision_type", n, "an integer 0..255")?;
    let left_child: Vec<i64> = section.list("left_child", n, "a node index")?;
    let right_child: Vec<i64> = section.list("right_child", n, "a node index")?;
    let num_cat: usize = section.parse("num_cat", "a count")?;
    let (cat_boundaries, cat_threshold): (Vec<usize>, Vec<u32>) = if num_cat > 0 {
        if num_cat > n {
            return Err(LIGHTGBM_TEXT.invalid(
                section.path("num_cat"),
                format!("expected at most {n} (one per split), got {num_cat}"),
            ));
        }
        let boundaries: Vec<usize> = section.list("cat_boundaries", num_cat + 1, "an offset")?;
        let words = section
            .get("cat_threshold")?
            .split_ascii_whitespace()
            .count();
        let bitset = section.list("cat_threshold", words, "a 32-bit word")?;
        (boundaries, bitset)
    } else {
        (Vec::new(), Vec::new())
    };
    // A child reference: an internal node `i >= 0`, or leaf `~c` for `c < 0`.
    for (key, children) in [("left_child", &left_child), ("right_child", &right_child)] {
        for (i, &child) in children.iter().enumerate() {
            let count = if child < 0 { num_leaves } else { n };
            if usize::try_from(if child < 0 { !child } else { child }).map_or(true, |c| c >= count)
            {
                return Err(LIGHTGBM_TEXT.invalid(
                    format!("{}[{i}]", section.path(key)),
                    format!(
                        "child {child} names no node (internal nodes 0..{n}, leaves -1..-{num_leaves})"
                    ),
                ));
            }
        }
    }
    // Each node may be reached once, so a malformed file cannot loop.
    let mut seen_split = vec![false; n];
    let mut seen_leaf = vec![false; num_leaves];
    let read = |child: i64| -> Result<LgbNode<i64>, ImportError> {
        let (i, seen) = if child < 0 {
            ((!child) as usize, &mut seen_leaf)
        } else {
            (child as usize, &mut seen_split)
        };
        if std::mem::replace(&mut seen[i], true) {
            return Err(LIGHTGBM_TEXT.invalid(
                section.path("left_child"),
                format!("node {child} is reached twice: the nodes do not form a tree"),
            ));
        }
        if child < 0 {
            return Ok(LgbNode::Leaf(leaf_value[i]));
        }
        let bits = decision_type[i];
        let rule = if bits & 1 == 1 {
            Rule::Categorical(categories(
                section,
                i,
                threshold[i],
                &cat_boundaries,
                &cat_threshold,
            )?)
        } else {
            let missing = match (bits >> 2) & 3 {
                0 => Missing::None,
                1 => Missing::Zero,
                2 => Missing::Nan,
                _ => {
                    return Err(LIGHTGBM_TEXT.invalid(
                        format!("{}[{i}]", section.path("decision_type")),
                        format!(
                            "missing type (bits 2-3) 3 is none of 0 None, 1 Zero, 2 NaN \
                             (decision_type {bits})"
                        ),
                    ))
                }
            };
            Rule::Numerical {
                threshold: threshold[i],
                missing,
                default_left: bits & 2 == 2,
            }
        };
        Ok(LgbNode::Split {
            feature: split_feature[i],
            feature_path: format!("{}[{i}]", section.path("split_feature")),
            rule,
            left: left_child[i],
            right: right_child[i],
        })
    };
    build_tree(LIGHTGBM_TEXT, n_features, 0i64, read)
}

/// The categories of categorical split `node`: the bits set in its words of `cat_threshold`
/// (bit `b` of word `w` is category `32 w + b`, LightGBM's `FindInBitset`).
fn categories(
    section: &Section,
    node: usize,
    threshold: f64,
    boundaries: &[usize],
    words: &[u32],
) -> Result<Vec<u32>, ImportError> {
    let path = format!("{}[{node}]", section.path("threshold"));
    // The threshold of a categorical split is an index into cat_boundaries.
    let index = (threshold >= 0.0 && threshold.fract() == 0.0)
        .then_some(threshold as usize)
        .filter(|&i| i < boundaries.len().saturating_sub(1));
    let Some(index) = index else {
        return Err(LIGHTGBM_TEXT.invalid(
            path,
            format!(
                "a categorical split's threshold indexes cat_boundaries: expected 0..{}, got \
                 {threshold}",
                boundaries.len().saturating_sub(1)
            ),
        ));
    };
    let (start, end) = (boundaries[index], boundaries[index + 1]);
    if start > end || end > words.len() {
        return Err(LIGHTGBM_TEXT.invalid(
            format!("{}[{index}]", section.path("cat_boundaries")),
            format!(
                "words {start}..{end} are not within cat_threshold's {}",
                words.len()
            ),
        ));
    }
    let mut set = Vec::new();
    for (w, &word) in words[start..end].iter().enumerate() {
        for b in (0..32).filter(|b| word >> b & 1 == 1) {
            // LightGBM's categories are C ints.
            match u32::try_from(32 * w as u64 + b)
                .ok()
                .filter(|&c| c <= i32::MAX as u32)
            {
                Some(category) => set.push(category),
                None => {
                    return Err(LIGHTGBM_TEXT.invalid(
                        format!("{}[{}]", section.path("cat_threshold"), start + w),
                        format!("bit {b} is category {}, past 2^31 - 1", 32 * w as u64 + b),
                    ))
                }
            }
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::model::{Decision, Node, Split};

    /// A two-tree model: tree 0 splits feature 1 numerically (NaN missing, default left) and
    /// then feature 0 categorically ({1, 4, 33}); tree 1 is one leaf.
    const MODEL: &str = "tree
version=v4
num_class=1
num_tree_per_iteration=1
label_index=0
max_feature_idx=1
objective=lambdarank
feature_names=a b
feature_infos=-1:1 [0:3]
tree_sizes=400 100

Tree=0
num_leaves=3
num_cat=1
split_feature=1 0
split_gain=1 1
threshold=0.5 0
decision_type=10 1
left_child=1 -1
right_child=-2 -3
leaf_value=-1.5 2.5 0.25
leaf_weight=1 1 1
leaf_count=1 1 1
internal_value=0 0
internal_weight=0 0
internal_count=3 2
cat_boundaries=0 2
cat_threshold=18 2
is_linear=0
shrinkage=0.1


Tree=1
num_leaves=1
num_cat=0
split_feature=
split_gain=
threshold=
decision_type=
left_child=
right_child=
leaf_value=0.125
leaf_weight=
leaf_count=
internal_value=
internal_weight=
internal_count=
is_linear=0
shrinkage=1


end of trees

feature_importances:
a=1
b=1

parameters:
[boosting: gbdt]
end of parameters

pandas_categorical:null
";

    #[test]
    fn trees_are_laid_out_as_the_json_import_lays_them_out() {
        let ranker = import_lightgbm_text(MODEL.as_bytes()).unwrap();
        assert_eq!(ranker.features, ["a", "b"]);
        let ensemble = ranker.ensemble.unwrap();
        assert_eq!(ensemble.base_score, 0.0);
        assert_eq!(
            ensemble.trees[0].nodes,
            vec![
                Node::Split(Split {
                    feature: 1,
                    decision: Decision::LeF64(0.5),
                    missing: Missing::Nan,
                    default_left: true,
                    left: 1,
                    right: 4,
                }),
                Node::Split(Split {
                    feature: 0,
                    decision: Decision::In(vec![1, 4, 33]),
                    missing: Missing::Nan,
                    default_left: false,
                    left: 2,
                    right: 3,
                }),
                Node::Leaf(-1.5),
                Node::Leaf(0.25),
                Node::Leaf(2.5),
            ]
        );
        assert_eq!(ensemble.trees[1].nodes, vec![Node::Leaf(0.125)]);
    }

    #[test]
    fn an_infinite_threshold_reads_as_the_json_dump_writes_it() {
        for (text, want) in [("inf", 1e300), ("-inf", -1e300)] {
            let model = MODEL.replacen("threshold=0.5 0", &format!("threshold={text} 0"), 1);
            let ensemble = import_lightgbm_text(model.as_bytes())
                .unwrap()
                .ensemble
                .unwrap();
            let Node::Split(split) = &ensemble.trees[0].nodes[0] else {
                panic!("tree 0 starts with a split")
            };
            assert_eq!(split.decision, Decision::LeF64(want));
        }
    }

    fn error_of(text: &str) -> String {
        import_lightgbm_text(text.as_bytes())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn refuses_linear_trees_naming_the_tree() {
        let err = error_of(&MODEL.replacen("is_linear=0", "is_linear=1", 1));
        assert_eq!(
            err,
            "LightGBM text model, Tree=0.is_linear: linear trees (linear_tree = true) have a \
             linear model per leaf; only constant leaves can be imported"
        );
    }

    #[test]
    fn refuses_what_the_json_import_refuses() {
        let err = error_of(&MODEL.replace("num_class=1", "num_class=3"));
        assert!(
            err.starts_with("LightGBM text model, num_class: a multi-class model (3 classes)"),
            "{err}"
        );
        let err = error_of(&MODEL.replace("objective=", "average_output\nobjective="));
        assert!(
            err.contains("average_output: a random-forest model"),
            "{err}"
        );
        let err = error_of(&MODEL.replace("split_feature=1 0", "split_feature=1 2"));
        assert_eq!(
            err,
            "LightGBM text model, Tree=0.split_feature[1]: expected a feature index in 0..2, \
             got 2"
        );
    }

    #[test]
    fn refuses_malformed_trees() {
        for (from, to, expected) in [
            (
                "left_child=1 -1",
                "left_child=0 -1",
                "node 0 is reached twice",
            ),
            (
                "right_child=-2 -3",
                "right_child=-2 -9",
                "right_child[1]: child -9 names no node",
            ),
            (
                "decision_type=10 1",
                "decision_type=14 1",
                "missing type (bits 2-3) 3",
            ),
            (
                "threshold=0.5 0",
                "threshold=0.5 1",
                "threshold[1]: a categorical split",
            ),
            (
                "threshold=0.5 0",
                "threshold=x 0",
                "Tree=0.threshold[0]: expected a number",
            ),
            (
                "cat_boundaries=0 2",
                "cat_boundaries=0 5",
                "cat_boundaries[0]: words 0..5",
            ),
            (
                "leaf_value=-1.5 2.5 0.25",
                "leaf_value=-1.5 2.5",
                "leaf_value: expected 3 entries",
            ),
            (
                "num_leaves=3",
                "num_leaves=300000000",
                "Tree=0.num_leaves: expected 1 to",
            ),
            ("\nend of trees", "", "no \"end of trees\" line"),
            (
                "max_feature_idx=1",
                "max_feature_idx=99999999999",
                "max_feature_idx: expected fewer",
            ),
        ] {
            let err = error_of(&MODEL.replacen(from, to, 1));
            assert!(err.contains(expected), "{from} -> {to}: {err}");
        }
        assert!(error_of("{}").contains("(first line): expected \"tree\""));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        /// The real fixture with whitespace-separated tokens replaced by nasty ones.
        #[test]
        fn never_panics_on_a_real_model_with_nasty_tokens(
            edits in proptest::collection::vec(
                (proptest::prelude::any::<usize>(), 0usize..super::super::test_support::NASTY.len()), 1..4),
        ) {
            let bytes = super::super::test_support::with_nasty_tokens("fixtures/trees/lgbt_lambdarank.model.txt", &edits);
            let _ = import_lightgbm_text(&bytes);
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_mutated_input(
            edits in proptest::collection::vec((0usize..2000, proptest::prelude::any::<u8>()), 0..6),
            cut in 0usize..2000,
        ) {
            let mut bytes = MODEL.as_bytes().to_vec();
            for (at, byte) in edits {
                let at = at % bytes.len();
                // Digits, signs and separators mostly, so mutations reach the tree reader.
                bytes[at] = b"0123456789- =\n.e"[usize::from(byte) % 16];
            }
            bytes.truncate(bytes.len() - cut % 200);
            let _ = import_lightgbm_text(&bytes);
        }
    }
}
