//! Ranker files (native, LightGBM JSON, XGBoost JSON, CatBoost JSON) through `rank::import::load_any`, the
//! decoder behind `PUT /v1/rankers/{name}` and the store's start, and FreeForm expressions
//! through `rank::freeform::parse`. A file that loads is scored on one row of zeros and one of
//! missing values.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use rankserve::rank::cpu::score_batch;
use rankserve::rank::error::RankerError;
use rankserve::rank::freeform;
use rankserve::rank::import::{load_any, ImportError};
use serde_json::{json, Value};

use crate::support::{json_splices, mutated, run, Bound};

/// A ranker file's peak heap: the parsed file structs and the model. The most per byte is a
/// tree node written `{}` (three bytes with its comma), a file struct of about 150 bytes, in a
/// vector that grows by doubling: about 100 bytes per input byte (measured: 91).
const RANKER_BOUND: Bound = Bound {
    per_byte: 128,
    constant: 1 << 20,
};

/// A FreeForm expression's: a tree node of a few dozen bytes per character at the most.
const FREEFORM_BOUND: Bound = Bound {
    per_byte: 256,
    constant: 64 << 10,
};

fn fixture(path: &str) -> Value {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    serde_json::from_slice(&std::fs::read(&full).unwrap()).unwrap()
}

/// A small native file with every kind of input, decision and activation.
fn every_kind() -> Value {
    json!({
        "format": "rankserve-ranker", "version": 1,
        "features": ["body.bm25f", "title.first_occurrence.min", "static.rank"],
        "inputs": [
            {"type": "linear", "feature": "body.bm25f", "slope": 0.5, "intercept": 0.1},
            {"type": "loglinear", "feature": "static.rank", "slope": 2.0, "intercept": -1.0},
            {"type": "bucket", "feature": "title.first_occurrence.min", "lower": 1.0, "upper": 4.0},
            {"type": "freeform", "expr": "ln(body.bm25f + 1) * max(static.rank, 0.5) / exp(-\"static.rank\")"},
            {"type": "tree", "tree": {"nodes": [
                {"feature": 0, "decision": "le_f64", "threshold": 4.6285, "missing": "nan",
                 "default_left": true, "left": 1, "right": 2},
                {"leaf": 0.25},
                {"feature": 2, "decision": "in", "categories": [7, 1, 5],
                 "missing": "nan", "default_left": false, "left": 3, "right": 4},
                {"leaf": -1.5}, {"leaf": 3.0}]}},
            {"type": "dummy"}
        ],
        "layers": [
            {"weights": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.0], [1, 1, 1, 1, 1, 1]],
             "bias": [0.0, 1.0], "activation": "tanh"},
            {"weights": [[1.5, -2.0]], "bias": [0.25], "activation": "identity"}
        ],
        "ensemble": {"base_score": 0.5, "trees": [
            {"nodes": [{"feature": 1, "decision": "lt_f32", "threshold": 0.1, "missing": "zero",
                        "left": 2, "right": 1}, {"leaf": 1e-3}, {"leaf": -2.0}]},
            {"nodes": [{"leaf": 0.125}]}
        ]}
    })
}

fn seeds() -> Vec<Value> {
    vec![
        every_kind(),
        fixture("rankers/small.json"),
        fixture("fixtures/trees/lgb_linear.model.json"),
        fixture("fixtures/trees/lgb_multiclass.model.json"),
        fixture("fixtures/trees/lgb_lambdarank.model.json"),
        fixture("fixtures/trees/xgb_multiclass.model.json"),
        fixture("fixtures/trees/xgb_logistic.model.json"),
        fixture("fixtures/trees/cb_yetirank.model.json"),
        fixture("fixtures/trees/cb_rmse_depthwise.model.json"),
    ]
}

/// Whether a refusal names its place: a line and column of the JSON, or a field path.
fn names_its_place(err: &RankerError) -> bool {
    match err {
        RankerError::Json { line, .. } => *line >= 1,
        RankerError::Invalid { path, .. } => !path.is_empty(),
        RankerError::FreeForm { path, error } => {
            !path.is_empty() && error.to_string().starts_with("column ")
        }
        RankerError::Import(ImportError::Json { line, .. }) => *line >= 1,
        // A byte offset is always named (UBJSON).
        RankerError::Import(ImportError::Binary { .. }) => true,
        RankerError::Import(
            ImportError::Invalid { path, .. } | ImportError::Unsupported { path, .. },
        ) => !path.is_empty(),
    }
}

fn head(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned()
}

#[test]
fn ranker_files_refuse_with_a_place_and_bounded_heap() {
    let seeds = seeds();
    run(
        "ranker files",
        600,
        mutated(seeds.len(), json_splices()),
        |case, tally| {
            let bytes = case.apply(&seeds, false);
            let (loaded, peak) = crate::support::peak_of(|| {
                load_any(&bytes).map(|ranker| {
                    let width = ranker.features.len();
                    let mut rows = vec![0.0; width];
                    rows.extend(std::iter::repeat_n(f64::NAN, width));
                    score_batch(&ranker, &rows, 1)
                })
            });
            tally.count(loaded.is_ok(), bytes.len(), peak);
            RANKER_BOUND.check("ranker file", bytes.len(), peak)?;
            if let Err(err) = &loaded {
                prop_assert!(
                    names_its_place(err),
                    "the refusal names no place: {err} (input starts {:?})",
                    head(&bytes)
                );
            }
            Ok(())
        },
    );
}

/// A FreeForm expression: numbers, features (bare and quoted), operators, calls, parentheses.
fn expression() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![prop::sample::select(vec![
        "a", "b.c", "\"d-e\"", "ln", "0", "1.5", "2e3", ".5e-2", "3.4e38"
    ])
    .prop_map(str::to_string),];
    leaf.prop_recursive(6, 64, 3, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(vec!["+", "-", "*", "/"]),
                inner.clone()
            )
                .prop_map(|(a, op, b)| format!("{a} {op} {b}")),
            inner.clone().prop_map(|a| format!("-{a}")),
            inner.clone().prop_map(|a| format!("({a})")),
            (
                prop::sample::select(vec!["ln", "exp", "sqrt"]),
                inner.clone()
            )
                .prop_map(|(f, a)| format!("{f}({a})")),
            (
                prop::sample::select(vec!["min", "max"]),
                inner.clone(),
                inner
            )
                .prop_map(|(f, a, b)| format!("{f}({a}, {b})")),
        ]
    })
}

/// An expression, then text edits: cut, a character dropped or inserted, or a prefix repeated
/// many times (deep nesting: `((((`, `ln(ln(`, `----`).
fn mutated_expression() -> impl Strategy<Value = String> {
    let edit = prop_oneof![
        any::<prop::sample::Index>().prop_map(|i| (0u8, i, String::new())),
        (any::<prop::sample::Index>(), "[()+*/,.e\"a-]").prop_map(|(i, s)| (1u8, i, s)),
        (
            any::<prop::sample::Index>(),
            prop::sample::select(vec!["(", "ln(", "-", "min(a,", "a+"]),
            prop_oneof![1usize..200, 100usize..20_000]
        )
            .prop_map(|(i, s, n)| (2u8, i, s.repeat(n))),
    ];
    (expression(), prop::collection::vec(edit, 0..3)).prop_map(|(mut text, edits)| {
        for (kind, at, s) in edits {
            let chars: Vec<char> = text.chars().collect();
            let n = at.index(chars.len() + 1);
            let (before, after): (String, String) =
                (chars[..n].iter().collect(), chars[n..].iter().collect());
            text = match kind {
                0 => before,
                _ => format!("{before}{s}{after}"),
            };
        }
        text
    })
}

#[test]
fn freeform_expressions_refuse_with_a_column_and_bounded_heap() {
    let features: Vec<String> = ["a", "b.c", "d-e", "ln"].map(String::from).to_vec();
    run(
        "freeform expressions",
        1500,
        mutated_expression(),
        |text, tally| {
            let (parsed, peak) = crate::support::peak_of(|| {
                freeform::parse(&text, &features).map(|expr| {
                    [0.0, f64::NAN, 1e300, -1.0].map(|x| freeform::eval(&expr, &[x, x, x, x]))
                })
            });
            tally.count(parsed.is_ok(), text.len(), peak);
            FREEFORM_BOUND.check("freeform expression", text.len(), peak)?;
            if let Err(err) = parsed {
                let message = err.to_string();
                prop_assert!(message.starts_with("column "), "{message} for {text:?}");
            }
            Ok::<(), TestCaseError>(())
        },
    );
}
