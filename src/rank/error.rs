//! Errors of loading and validating rankers: every one names where (a field path such as
//! `inputs[17].upper` or `ensemble.trees[3].nodes[12].left`, or a line and column of the JSON) and
//! what was expected.

use std::borrow::Cow;

use crate::rank::freeform::FreeFormError;

/// The most characters of a client's input (a ranker or feature name) that an error quotes.
pub const QUOTED_CHARS: usize = 64;

/// `input` as an error quotes it: whole up to [`QUOTED_CHARS`] characters, else cut there with
/// its length said, so that a name of megabytes never comes back whole in a reply or a log line.
pub fn cut_input(input: &str) -> Cow<'_, str> {
    cut_to(input, QUOTED_CHARS)
}

/// `text` whole up to `chars` characters, else cut there with its length in bytes said.
pub fn cut_to(text: &str, chars: usize) -> Cow<'_, str> {
    match text.char_indices().nth(chars) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => Cow::Owned(format!("{}… ({} bytes)", &text[..cut], text.len())),
    }
}

/// Why a ranker file (native, or an import) was rejected.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RankerError {
    /// The bytes are not JSON, or not of the shape the format expects (wrong type, unknown field,
    /// missing field, unknown enum name); serde_json says what, the position says where.
    #[error("ranker JSON, line {line}, column {column}: {message}")]
    Json {
        line: usize,
        column: usize,
        message: String,
    },
    /// A field holds a value the format does not allow.
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
    /// A FreeForm expression does not parse.
    #[error("{path}: {error}")]
    FreeForm { path: String, error: FreeFormError },

    // --- Imports (owned by the `import` branch) ---
    /// A model file (LightGBM, XGBoost, CatBoost, ONNX, RankLib) was not imported (the error
    /// names the library, the field path in its file and why).
    #[error(transparent)]
    Import(#[from] crate::rank::import::ImportError),
}

impl RankerError {
    /// An [`RankerError::Invalid`] at `path` (a field path) saying `reason` (expected vs got).
    pub fn invalid(path: impl Into<String>, reason: impl Into<String>) -> Self {
        RankerError::Invalid {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// Converts a serde_json error, keeping its line and column.
    pub fn from_json(err: &serde_json::Error) -> Self {
        // serde_json appends " at line L column C" to its Display; keep only the message.
        let text = err.to_string();
        let message = match text.rfind(" at line ") {
            Some(at) => text[..at].to_string(),
            None => text,
        };
        RankerError::Json {
            line: err.line(),
            column: err.column(),
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_input_is_cut_at_a_character_boundary_with_its_length() {
        assert_eq!(cut_input("small"), "small");
        let exact = "é".repeat(QUOTED_CHARS);
        assert_eq!(cut_input(&exact), exact);
        let long = format!("{exact}x");
        assert_eq!(cut_input(&long), format!("{exact}… (129 bytes)"));
    }
}
