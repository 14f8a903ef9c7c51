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
    /// [`BodyError::BadBody`] with the parser's reason and position (JSON: line and column;
    /// MessagePack: byte offset).
    pub fn decode<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T, BodyError> {
        let bad = |reason: String| BodyError::BadBody {
            format: self.name(),
            reason,
        };
        match self {
            Format::Json => serde_json::from_slice(bytes).map_err(|e| bad(e.to_string())),
            Format::Msgpack => {
                let mut de = rmp_serde::Deserializer::new(Cursor::new(bytes));
                let value = T::deserialize(&mut de)
                    .map_err(|e| bad(format!("{e} (at or before byte {})", de.position())))?;
                let read = de.position();
                if read != bytes.len() as u64 {
                    return Err(bad(format!(
                        "trailing bytes after the value at byte {read} of {}",
                        bytes.len()
                    )));
                }
                Ok(value)
            }
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
