//! Imports of models trained elsewhere: LightGBM `dump_model()` JSON ([`import_lightgbm`]) and
//! text model ([`import_lightgbm_text`]), XGBoost `save_model()` JSON ([`import_xgboost`]) and
//! UBJSON ([`import_xgboost_ubj`]), CatBoost JSON ([`import_catboost`]) and RankLib
//! LambdaMART/MART XML ([`import_ranklib`]), each into a [`Ranker`] whose [`Ranker::ensemble`]
//! holds the trees (no inputs, no layers), and ONNX tree ensembles or small MLPs
//! ([`import_onnx`]; MLPs into NN layers), reproducing the library's own decision rules (see each
//! module's docs). [`detect`] tells the formats apart by their bytes, and [`load_any`] loads
//! whichever it is.
//!
//! Models a ranker cannot represent exactly are refused, never approximated: multi-class and
//! multi-target models (a ranker has one output), LightGBM linear trees and averaged (random
//! forest) outputs, XGBoost categorical splits, DART and linear boosters, objectives whose link
//! function is not known here, CatBoost categorical, text and embedding features, ONNX graphs
//! beyond one chain of the supported ops.

pub mod catboost;
pub mod lightgbm;
pub mod lightgbm_text;
pub mod onnx;
pub mod ranklib;
mod ubjson;
pub mod xgboost;

pub use catboost::import_catboost;
pub use lightgbm::import_lightgbm;
pub use lightgbm_text::import_lightgbm_text;
pub use onnx::import_onnx;
pub use ranklib::import_ranklib;
pub use xgboost::{import_xgboost, import_xgboost_ubj};

use crate::rank::format::parse_native;
use crate::rank::model::{Decision, Ranker};
use crate::rank::RankerError;

/// Why a model file was not imported.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImportError {
    /// The bytes are not JSON, or a field has the wrong JSON type or is absent.
    #[error("{format} model JSON, line {line}, column {column}: {message}")]
    Json {
        format: &'static str,
        line: usize,
        column: usize,
        message: String,
    },
    /// The bytes are not valid in a binary encoding (UBJSON): what was wrong at which byte.
    #[error("{format} model {encoding}, byte {offset}: {message}")]
    Binary {
        format: &'static str,
        encoding: &'static str,
        offset: usize,
        message: String,
    },
    /// A field holds a value the importer cannot accept (`path` is the field's path in the
    /// model file, such as `tree_info[3].tree_structure.left_child.threshold`).
    #[error("{format} model, {path}: {reason}")]
    Invalid {
        format: &'static str,
        path: String,
        reason: String,
    },
    /// The model is well formed but of a kind a ranker cannot represent exactly.
    #[error("{format} model, {path}: {reason}")]
    Unsupported {
        format: &'static str,
        path: String,
        reason: String,
    },
}

/// Which library wrote a model file (for error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Format(pub(crate) &'static str);

impl Format {
    pub(crate) fn json(self, err: &serde_json::Error) -> ImportError {
        // serde_json appends " at line L column C" to its Display; the variant carries those.
        let text = err.to_string();
        let message = match text.rfind(" at line ") {
            Some(at) => text[..at].to_string(),
            None => text,
        };
        ImportError::Json {
            format: self.0,
            line: err.line(),
            column: err.column(),
            message,
        }
    }

    pub(crate) fn invalid(self, path: impl Into<String>, reason: impl Into<String>) -> ImportError {
        ImportError::Invalid {
            format: self.0,
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(
        self,
        path: impl Into<String>,
        reason: impl Into<String>,
    ) -> ImportError {
        ImportError::Unsupported {
            format: self.0,
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// Checks that feature names are unique (the ranker's feature map requires it).
pub(crate) fn check_unique_names(
    format: Format,
    path: &str,
    names: &[String],
) -> Result<(), ImportError> {
    let mut seen = std::collections::HashMap::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        if let Some(first) = seen.insert(name.as_str(), i) {
            return Err(format.invalid(
                format!("{path}[{i}]"),
                format!("feature name {name:?} repeats {path}[{first}]; names must be unique"),
            ));
        }
    }
    Ok(())
}

/// The decision "left when `f32(x) <= t`" (CatBoost's false branch, ONNX's `BRANCH_LEQ`) for a
/// finite f32 `t`: `f32(x) < next_up(t)`, the ranker's `lt_f32`, exactly. For `t = f32::MAX`,
/// which has no finite successor, it is the f64 comparison with the largest double that does
/// not round to +inf as an f32 (below the midpoint 2^128 − 2^103, which rounds to even: +inf).
pub(crate) fn le_f32(t: f32) -> Decision {
    if t == f32::MAX {
        let midpoint = 2f64.powi(128) - 2f64.powi(103);
        return Decision::LeF64(f64::from_bits(midpoint.to_bits() - 1));
    }
    // The next f32 up: for ±0 the least subnormal, else one step of the bit pattern toward +inf.
    let up = if t == 0.0 {
        f32::from_bits(1)
    } else if t > 0.0 {
        f32::from_bits(t.to_bits() + 1)
    } else {
        f32::from_bits(t.to_bits() - 1)
    };
    Decision::LtF32(up)
}

/// A model file's kind, told from its bytes by [`detect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A rankserve ranker file (`"format": "rankserve-ranker"`).
    Native,
    /// LightGBM `dump_model()` JSON (`tree_info`).
    LightGbm,
    /// XGBoost `save_model()` JSON (`learner`).
    XgBoost,
    /// LightGBM's text model, `save_model("model.txt")` (first line `tree`).
    LightGbmText,
    /// XGBoost `save_model("model.ubj")` UBJSON (`{` then a UBJSON length or count marker).
    XgBoostUbj,
    /// A RankLib LambdaMART/MART ensemble (`##` lines, then `<ensemble>`).
    RankLib,
    /// CatBoost `save_model(format="json")` (`features_info` beside `oblivious_trees` or `trees`).
    CatBoost,
    /// An ONNX `ModelProto` (protobuf with `ir_version` and a graph).
    Onnx,
}

impl ModelKind {
    /// Each kind and the name it goes by on the CLI (`--format`) and over HTTP (`?format=`).
    pub const NAMES: [(&'static str, ModelKind); 8] = [
        ("native", ModelKind::Native),
        ("lightgbm", ModelKind::LightGbm),
        ("lightgbm-text", ModelKind::LightGbmText),
        ("xgboost", ModelKind::XgBoost),
        ("xgboost-ubj", ModelKind::XgBoostUbj),
        ("ranklib", ModelKind::RankLib),
        ("catboost", ModelKind::CatBoost),
        ("onnx", ModelKind::Onnx),
    ];

    /// The kind named `name` (one of [`ModelKind::NAMES`]).
    pub fn from_name(name: &str) -> Option<ModelKind> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, kind)| kind)
    }

    /// Its name in [`ModelKind::NAMES`].
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, k)| *k == self)
            .map(|&(n, _)| n)
            .expect("every kind is named")
    }
}

/// What [`detect`] tells apart, for its error.
const KNOWN_FORMATS: &str = "JSON (a rankserve ranker, LightGBM dump_model, XGBoost \
    save_model, CatBoost), XGBoost UBJSON, a LightGBM text model (first line \"tree\"), a \
    RankLib ensemble (\"##\" lines, then <ensemble>) or an ONNX model (protobuf)";

/// Tells a model file's kind from its bytes without building anything: the binary and text
/// formats by how they start (ONNX, which has no magic number, by a decode), the JSON ones by
/// their top-level fields.
///
/// # Errors
/// [`ImportError`] when the bytes start as none of the formats, or are JSON of no known shape.
pub fn detect(bytes: &[u8]) -> Result<ModelKind, ImportError> {
    // UBJSON opens an object with '{' then a key's length marker (or a '$' type / '#' count);
    // JSON's '{' is followed by whitespace, '"' or '}'.
    if bytes.first() == Some(&b'{') && bytes.get(1).is_some_and(|b| b"iUIlL$#".contains(b)) {
        return Ok(ModelKind::XgBoostUbj);
    }
    let mut lines = bytes
        .split(|&b| b == b'\n')
        .map(|line| line.trim_ascii())
        .filter(|line| !line.is_empty());
    if lines.clone().next() == Some(b"tree".as_slice()) {
        return Ok(ModelKind::LightGbmText);
    }
    if lines
        .find(|line| !line.starts_with(b"##"))
        .is_some_and(|line| line.starts_with(b"<ensemble") || line.starts_with(b"<?xml"))
    {
        return Ok(ModelKind::RankLib);
    }
    let any = Format("rankserve/LightGBM/XGBoost/CatBoost");
    if !matches!(bytes.trim_ascii_start().first(), Some(b'{' | b'[')) {
        // A protobuf has no magic number: ONNX is what decodes as a model with a graph.
        if onnx::is_onnx(bytes) {
            return Ok(ModelKind::Onnx);
        }
        return Err(any.invalid(
            "(start of file)",
            format!("not a model file rankserve reads: expected {KNOWN_FORMATS}"),
        ));
    }
    // Only the top-level keys are kept; values are skipped without being built.
    let top: std::collections::HashMap<String, serde::de::IgnoredAny> =
        serde_json::from_slice(bytes).map_err(|e| any.json(&e))?;
    let has = |key: &str| top.contains_key(key);
    match (
        has("format"),
        has("tree_info"),
        has("learner"),
        has("features_info"),
    ) {
        (true, false, false, false) => Ok(ModelKind::Native),
        (false, true, false, false) => Ok(ModelKind::LightGbm),
        (false, false, true, false) => Ok(ModelKind::XgBoost),
        (false, false, false, true) => Ok(ModelKind::CatBoost),
        _ => Err(any.invalid(
            "(top level)",
            "expected exactly one of \"format\" (rankserve ranker), \"tree_info\" (LightGBM \
             dump_model JSON), \"learner\" (XGBoost save_model JSON) or \"features_info\" \
             (CatBoost JSON); an ONNX model is a protobuf, not JSON",
        )),
    }
}

/// Loads a ranker from any file [`detect`] knows, with the loader of its kind.
///
/// # Errors
/// The error of [`detect`] or of the loader it picks.
pub fn load_any(bytes: &[u8]) -> Result<Ranker, RankerError> {
    load_as(detect(bytes)?, bytes)
}

/// Loads a ranker from `bytes` read as `kind`.
///
/// # Errors
/// The error of `kind`'s loader.
pub fn load_as(kind: ModelKind, bytes: &[u8]) -> Result<Ranker, RankerError> {
    match kind {
        ModelKind::Native => parse_native(bytes),
        ModelKind::LightGbm => import_lightgbm(bytes),
        ModelKind::XgBoost => import_xgboost(bytes),
        ModelKind::CatBoost => import_catboost(bytes),
        ModelKind::Onnx => import_onnx(bytes),
        ModelKind::LightGbmText => import_lightgbm_text(bytes),
        ModelKind::XgBoostUbj => import_xgboost_ubj(bytes),
        ModelKind::RankLib => import_ranklib(bytes),
    }
}

/// Loads a ranker from `bytes` named as `kind` by the client (`None`: detected), for a file
/// that is stored as given and re-read later by [`load_any`]: a named kind must also be what
/// [`detect`] reads, so the stored file loads the same way again.
///
/// # Errors
/// The error of `kind`'s loader, or [`ImportError::Invalid`] when the bytes import as `kind`
/// but are detected as another kind or as none.
pub fn load_stored(kind: Option<ModelKind>, bytes: &[u8]) -> Result<Ranker, RankerError> {
    let Some(kind) = kind else {
        return load_any(bytes);
    };
    let ranker = load_as(kind, bytes)?;
    match detect(bytes) {
        Ok(detected) if detected == kind => Ok(ranker),
        detected => Err(Format(kind.name())
            .invalid(
                "(format)",
                format!(
                    "the file was named {:?} but its bytes read as {}; a stored ranker is \
                     re-read by detection, so the two must agree",
                    kind.name(),
                    match detected {
                        Ok(other) => format!("{:?}", other.name()),
                        Err(_) => "no known format".to_string(),
                    }
                ),
            )
            .into()),
    }
}

/// An ensemble-only ranker: what both imports produce.
pub(crate) fn ranker_from_trees(
    features: Vec<String>,
    trees: Vec<crate::rank::model::Tree>,
    base_score: f64,
) -> Ranker {
    Ranker {
        features,
        inputs: Vec::new(),
        layers: Vec::new(),
        ensemble: Some(crate::rank::model::Ensemble { trees, base_score }),
    }
}

/// What the importers' property tests share.
#[cfg(test)]
pub(crate) mod test_support {
    /// Tokens that stress a reader's numbers and indices.
    pub(crate) const NASTY: [&str; 12] = [
        "-1",
        "0",
        "1e300",
        "-1e300",
        "nan",
        "inf",
        "-9223372036854775808",
        "4294967296",
        "99999999999999999999",
        "",
        "2147483648",
        "<split>",
    ];

    /// The committed fixture at `path` (from the crate root) with its space-separated tokens at
    /// `edits` (position, modulo the token count; index into [`NASTY`]) replaced.
    pub(crate) fn with_nasty_tokens(path: &str, edits: &[(usize, usize)]) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        let text = std::fs::read_to_string(path).unwrap();
        let mut tokens: Vec<&str> = text.split(' ').collect();
        for &(at, nasty) in edits {
            let at = at % tokens.len();
            tokens[at] = NASTY[nasty];
        }
        tokens.join(" ").into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detect_tells_the_formats_apart() {
        let kind = |text: &str| detect(text.as_bytes());
        assert_eq!(
            kind(r#"{"format":"rankserve-ranker","version":1}"#),
            Ok(ModelKind::Native)
        );
        assert_eq!(
            kind(r#"{"name":"tree","tree_info":[]}"#),
            Ok(ModelKind::LightGbm)
        );
        assert_eq!(
            kind(r#"{"learner":{},"version":[3,2,0]}"#),
            Ok(ModelKind::XgBoost)
        );
    }

    #[test]
    fn detect_rejects_a_document_of_no_known_shape() {
        let err = detect(br#"{"trees":[]}"#).unwrap_err().to_string();
        assert!(err.contains("expected exactly one of \"format\""), "{err}");
        let both = detect(br#"{"tree_info":[],"learner":{}}"#).unwrap_err();
        assert!(matches!(both, ImportError::Invalid { .. }));
        let err = detect(b"[1, 2]").unwrap_err().to_string();
        assert!(
            err.contains("JSON, line 1, column 0: invalid type: sequence"),
            "{err}"
        );
        let err = detect(b"PK\x03\x04").unwrap_err().to_string();
        assert!(
            err.contains("(start of file): not a model file rankserve reads"),
            "{err}"
        );
    }

    #[test]
    fn detect_tells_the_binary_and_text_formats_apart() {
        assert_eq!(
            detect(b"{L\x00\x00\x00\x00\x00\x00\x00\x07learner{}}"),
            Ok(ModelKind::XgBoostUbj)
        );
        assert_eq!(detect(b"{i\x07learner{}}"), Ok(ModelKind::XgBoostUbj));
        assert_eq!(detect(b"tree\nversion=v4\n"), Ok(ModelKind::LightGbmText));
        assert_eq!(
            detect(b"tree\r\nversion=v4\r\n"),
            Ok(ModelKind::LightGbmText)
        );
        assert_eq!(
            detect(b"## LambdaMART\n## No. of trees = 1\n<ensemble>"),
            Ok(ModelKind::RankLib)
        );
        assert_eq!(detect(b"\n<ensemble>\n</ensemble>"), Ok(ModelKind::RankLib));
        assert_eq!(detect(b"{ \"tree_info\": []}"), Ok(ModelKind::LightGbm));
        assert!(matches!(detect(b"{}"), Err(ImportError::Invalid { .. })));
    }

    #[test]
    fn every_kind_has_one_name() {
        for (name, kind) in ModelKind::NAMES {
            assert_eq!(ModelKind::from_name(name), Some(kind));
            assert_eq!(kind.name(), name);
        }
        assert_eq!(ModelKind::from_name("onnx"), Some(ModelKind::Onnx));
        assert_eq!(ModelKind::from_name("tensorflow"), None);
    }

    #[test]
    fn load_any_reads_a_native_file() {
        let text = r#"{"format":"rankserve-ranker","version":1,"features":["a"],
            "ensemble":{"trees":[{"nodes":[{"leaf":0.5}]}],"base_score":0.25}}"#;
        let ranker = load_any(text.as_bytes()).unwrap();
        assert_eq!(ranker.features, ["a"]);
        assert_eq!(ranker.ensemble.unwrap().base_score, 0.25);
    }

    /// Whether the ranker's split built by [`le_f32`] sends `x` left.
    fn le_f32_left(t: f32, x: f64) -> bool {
        let split = crate::rank::model::Split {
            feature: 0,
            decision: le_f32(t),
            missing: crate::rank::model::Missing::None,
            default_left: false,
            left: 1,
            right: 2,
        };
        crate::rank::cpu::goes_left(&split, x)
    }

    #[test]
    fn le_f32_is_f32_less_or_equal_at_the_edges() {
        let m = f64::from(f32::MAX);
        let half_ulp = 2f64.powi(103);
        for (t, x) in [
            (0.5f32, 0.5f64),
            (0.5, 0.5 + 1e-12),
            (0.5, f64::from(f32::from_bits(0.5f32.to_bits() + 1))),
            (0.0, -0.0),
            (-0.0, 0.0),
            (0.0, 1e-46),
            (0.0, f64::from(f32::from_bits(1))),
            (-1.5, -1.5),
            (-1.5, -1.4999999),
            (f32::MAX, m),
            (f32::MAX, m + half_ulp),
            (f32::MAX, m + half_ulp - 2f64.powi(75)),
            (f32::MAX, f64::INFINITY),
            (f32::MIN, f64::NEG_INFINITY),
            (f32::MIN, -1e300),
        ] {
            assert_eq!(le_f32_left(t, x), (x as f32) <= t, "t = {t:e}, x = {x:e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn le_f32_is_f32_less_or_equal(t in proptest::prelude::any::<f32>(), dx in -1e-6f64..1e-6, x in proptest::prelude::any::<f64>()) {
            proptest::prop_assume!(t.is_finite());
            for x in [f64::from(t), f64::from(t) * (1.0 + dx), x] {
                if !x.is_nan() {
                    proptest::prop_assert_eq!(le_f32_left(t, x), (x as f32) <= t, "t = {:e}, x = {:e}", t, x);
                }
            }
        }
    }
}
