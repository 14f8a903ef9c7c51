//! The two body formats (JSON, MessagePack) and how a body becomes a request: decoding with the
//! parser's position in every error, and the `/v1/rank` body's fast MessagePack reader
//! ([`super::msgpack_rank`]) behind [`Format::decode_rank_request`].
//!
//! MessagePack is written with named fields (`rmp_serde::to_vec_named`) so that Python and
//! JavaScript clients get maps.

use std::io::Cursor;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::RankRequest;
use crate::rank::{cut_input, cut_to};

/// The most characters of a parser's message kept in an error (serde quotes a wrongly typed
/// string whole).
const MESSAGE_CHARS: usize = 256;

/// The largest MessagePack body whose type error is explained by serde's words.
const TRANSCODED_BYTES: usize = 1 << 20;

/// `message` prefixed with the field it concerns (`documents[3].features: ...`), both cut to
/// a bounded length.
fn at_path(path: &serde_path_to_error::Path, message: &str) -> String {
    let message = cut_to(message, MESSAGE_CHARS);
    if path.iter().next().is_none() {
        return message.into_owned();
    }
    format!("{}: {message}", cut_input(&path.to_string()))
}

/// Why a MessagePack body does not decode: the field, what was wrong, and the position.
fn msgpack_reason<T: DeserializeOwned>(
    bytes: &[u8],
    err: &serde_path_to_error::Error<rmp_serde::decode::Error>,
    position: u64,
) -> String {
    use rmp_serde::decode::Error;
    let message = match err.inner() {
        Error::TypeMismatch(marker) => msgpack_mismatch::<T>(bytes).unwrap_or_else(|| {
            format!("a value of the wrong type (MessagePack marker {marker:?})")
        }),
        Error::InvalidMarkerRead(e) | Error::InvalidDataRead(e)
            if e.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            "the body ends inside a value (truncated)".to_string()
        }
        other => other.to_string(),
    };
    format!(
        "{} (at or before byte {position})",
        at_path(err.path(), &message)
    )
}

/// Why a MessagePack body whose value has the wrong type does not decode, as serde says it
/// ("invalid type: map, expected usize"): rmp-serde says only which marker it found. The body
/// is decoded into a JSON value and that is decoded as `T`; `None` when the body is not
/// representable as JSON (binary, non-string keys) or decodes that way, and for a body over
/// [`TRANSCODED_BYTES`] (a JSON value can take 30 times the bytes of the MessagePack it came
/// from: a hostile body must not make its error cost gigabytes).
fn msgpack_mismatch<T: DeserializeOwned>(bytes: &[u8]) -> Option<String> {
    if bytes.len() > TRANSCODED_BYTES {
        return None;
    }
    let value: serde_json::Value = rmp_serde::from_slice(bytes).ok()?;
    serde_path_to_error::deserialize::<_, T>(value)
        .err()
        .map(|e| e.inner().to_string())
}

/// Why a request body was refused: it does not parse, or it parses into a request that is
/// invalid (the message names the document and field).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BodyError {
    #[error("{format} body does not parse: {reason}")]
    BadBody {
        format: &'static str,
        reason: String,
    },
    #[error("{0}")]
    Invalid(String),
}

/// A body format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Msgpack,
}

impl Format {
    /// The format of a media type (parameters such as `; charset=utf-8` ignored).
    pub fn from_media_type(value: &str) -> Option<Format> {
        let essence = value
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/json" => Some(Format::Json),
            "application/msgpack" | "application/x-msgpack" | "application/vnd.msgpack" => {
                Some(Format::Msgpack)
            }
            _ => None,
        }
    }

    /// The media type written in responses.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Msgpack => "application/msgpack",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "JSON",
            Format::Msgpack => "MessagePack",
        }
    }

    /// Encodes `value` (MessagePack maps with named fields).
    ///
    /// # Errors
    /// Only when `value`'s `Serialize` fails, which the API's types do not.
    pub fn encode<T: Serialize>(self, value: &T) -> Result<Vec<u8>, String> {
        match self {
            Format::Json => serde_json::to_vec(value).map_err(|e| e.to_string()),
            Format::Msgpack => rmp_serde::to_vec_named(value).map_err(|e| e.to_string()),
        }
    }

    /// Decodes one value from `bytes`, which must hold nothing else.
    ///
    /// # Errors
    /// [`BodyError::BadBody`] with the parser's reason, the field it failed in (a path such as
    /// `documents[3].features[1]`) and the position (JSON: line and column; MessagePack: byte
    /// offset). Client text the reason quotes is cut ([`cut_input`]).
    pub fn decode<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T, BodyError> {
        let bad = |reason: String| BodyError::BadBody {
            format: self.name(),
            reason,
        };
        if bytes.is_empty() {
            return Err(bad(format!("the body is empty: expected {}", self.a_map())));
        }
        // Decoded first without tracking the field path (it costs on every value); a body
        // that fails is decoded again with it, to say where.
        match self {
            Format::Json => serde_json::from_slice(bytes).map_err(|plain| {
                let mut de = serde_json::Deserializer::from_slice(bytes);
                let Err(err) = serde_path_to_error::deserialize::<_, T>(&mut de) else {
                    // Trailing characters after a whole value.
                    return bad(plain.to_string());
                };
                let inner = err.inner();
                let position = format!(" at line {} column {}", inner.line(), inner.column());
                let message = inner.to_string();
                let message = message.strip_suffix(&position).unwrap_or(&message);
                bad(format!("{}{position}", at_path(err.path(), message)))
            }),
            Format::Msgpack => {
                let mut de = rmp_serde::Deserializer::new(Cursor::new(bytes));
                match T::deserialize(&mut de) {
                    Ok(value) => {
                        let read = de.position();
                        if read != bytes.len() as u64 {
                            return Err(bad(format!(
                                "trailing bytes after the value at byte {read} of {}",
                                bytes.len()
                            )));
                        }
                        Ok(value)
                    }
                    Err(plain) => {
                        let mut de = rmp_serde::Deserializer::new(Cursor::new(bytes));
                        let Err(err) = serde_path_to_error::deserialize::<_, T>(&mut de) else {
                            return Err(bad(plain.to_string()));
                        };
                        Err(bad(msgpack_reason::<T>(bytes, &err, de.position())))
                    }
                }
            }
        }
    }

    /// What every request body is, for errors.
    fn a_map(self) -> &'static str {
        match self {
            Format::Json => "a JSON object",
            Format::Msgpack => "a MessagePack map",
        }
    }

    /// Decodes a `/v1/rank` request: MessagePack through [`super::msgpack_rank`]'s reader,
    /// falling back to [`Format::decode`] on any body that reader leaves to rmp-serde (so
    /// errors are exactly those of [`Format::decode`]); JSON through [`Format::decode`].
    ///
    /// # Errors
    /// As [`Format::decode`].
    pub fn decode_rank_request(self, bytes: &[u8]) -> Result<RankRequest, BodyError> {
        match self {
            Format::Msgpack => match super::msgpack_rank::decode(bytes) {
                Some(request) => Ok(request),
                None => self.decode(bytes),
            },
            Format::Json => self.decode(bytes),
        }
    }

    /// The format of a request log by its extension: `.jsonl` is JSON Lines, anything else
    /// concatenated MessagePack objects.
    pub fn of_log(path: &std::path::Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") => Format::Json,
            _ => Format::Msgpack,
        }
    }
}
