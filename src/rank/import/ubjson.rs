//! UBJSON (Universal Binary JSON, draft 12) → [`serde_json::Value`], for XGBoost's `.ubj` models.
//!
//! XGBoost's UBJSON is the same document as its JSON in a binary encoding, so it is decoded into
//! the value the JSON importer's structures deserialize from, and one importer serves both.
//! No maintained Rust UBJSON crate exists (`serde_ubjson` 0.2 of 2017 has no deserializer;
//! `serde_ub_json` 0.1 of 2022 has had one release), and the subset XGBoost writes is small.
//!
//! Layout (numbers big-endian):
//! ```text
//! value   = 'Z' | 'T' | 'F' | 'N' value                 null, true, false, no-op
//!         | 'i' i8 | 'U' u8 | 'I' i16 | 'l' i32 | 'L' i64
//!         | 'd' f32 | 'D' f64 | 'C' u8                  char
//!         | 'S' len bytes | 'H' len bytes               string, high-precision number
//!         | '[' container(value) | '{' container(key value)
//! len     = an integer value ('i' 'U' 'I' 'l' 'L'), >= 0
//! key     = len bytes                                   (no 'S' marker)
//! container = items ']' / '}'                           items each with their marker
//!           | '#' len items                             a count, no end marker
//!           | '$' type '#' len items                    one type, items without markers
//! ```
//! XGBoost writes its arrays as `[$d#L n` (f32), `[$l#L n` (i32), `[$U#L n` (u8).

use serde_json::{Map, Number, Value};

/// Containers nested deeper than this are refused (serde_json's own recursion limit).
const MAX_DEPTH: usize = 128;

/// Why UBJSON bytes did not decode: what was wrong at which byte offset.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UbjsonError {
    pub(crate) offset: usize,
    pub(crate) message: String,
}

/// Decodes one UBJSON value that spans all of `bytes`.
pub(crate) fn decode(bytes: &[u8]) -> Result<Value, UbjsonError> {
    let mut reader = Reader { bytes, at: 0 };
    let value = reader.value(0)?;
    if reader.at != bytes.len() {
        return Err(reader.error(format!(
            "{} bytes after the end of the document",
            bytes.len() - reader.at
        )));
    }
    Ok(value)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn error(&self, message: impl Into<String>) -> UbjsonError {
        UbjsonError {
            offset: self.at,
            message: message.into(),
        }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], UbjsonError> {
        let end = self.at.checked_add(N).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(self.error("unexpected end of data"));
        };
        let out = self.bytes[self.at..end].try_into().expect("N bytes");
        self.at = end;
        Ok(out)
    }

    fn marker(&mut self) -> Result<u8, UbjsonError> {
        Ok(self.take::<1>()?[0])
    }

    fn value(&mut self, depth: usize) -> Result<Value, UbjsonError> {
        let mut marker = self.marker()?;
        while marker == b'N' {
            marker = self.marker()?;
        }
        self.typed(marker, depth)
    }

    /// A value of type `marker`, whose marker has been read already.
    fn typed(&mut self, marker: u8, depth: usize) -> Result<Value, UbjsonError> {
        Ok(match marker {
            b'Z' => Value::Null,
            b'T' => Value::Bool(true),
            b'F' => Value::Bool(false),
            b'i' | b'U' | b'I' | b'l' | b'L' => Value::Number(self.integer(marker)?.into()),
            b'd' => {
                let v = f32::from_be_bytes(self.take()?);
                self.float(f64::from(v))?
            }
            b'D' => {
                let v = f64::from_be_bytes(self.take()?);
                self.float(v)?
            }
            b'C' => Value::String(char::from(self.marker()?).to_string()),
            b'S' => Value::String(self.string()?),
            b'H' => {
                let text = self.string()?;
                let number: Number = text
                    .parse()
                    .map_err(|_| self.error(format!("high-precision number {text:?}")))?;
                Value::Number(number)
            }
            b'[' | b'{' => {
                if depth >= MAX_DEPTH {
                    return Err(self.error(format!("containers nested deeper than {MAX_DEPTH}")));
                }
                self.container(marker == b'{', depth + 1)?
            }
            other => {
                self.at -= 1;
                return Err(self.error(format!("unknown type marker {:?}", char::from(other))));
            }
        })
    }

    fn integer(&mut self, marker: u8) -> Result<i64, UbjsonError> {
        Ok(match marker {
            b'i' => i64::from(i8::from_be_bytes(self.take()?)),
            b'U' => i64::from(u8::from_be_bytes(self.take()?)),
            b'I' => i64::from(i16::from_be_bytes(self.take()?)),
            b'l' => i64::from(i32::from_be_bytes(self.take()?)),
            b'L' => i64::from_be_bytes(self.take()?),
            other => {
                self.at -= 1;
                return Err(self.error(format!(
                    "expected an integer type marker (i U I l L), got {:?}",
                    char::from(other)
                )));
            }
        })
    }

    fn float(&self, v: f64) -> Result<Value, UbjsonError> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| self.error(format!("non-finite number {v}")))
    }

    /// A length or count: an integer value that must be non-negative and at most the bytes
    /// left; every item takes at least one byte (see `container`), so no claim allocates
    /// more items than the input has bytes.
    fn length(&mut self) -> Result<usize, UbjsonError> {
        let marker = self.marker()?;
        let n = self.integer(marker)?;
        let left = self.bytes.len() - self.at;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| self.error(format!("length {n} with {left} bytes left")))
    }

    fn string(&mut self) -> Result<String, UbjsonError> {
        let len = self.length()?;
        let start = self.at;
        self.at += len;
        String::from_utf8(self.bytes[start..self.at].to_vec()).map_err(|e| UbjsonError {
            offset: start + e.utf8_error().valid_up_to(),
            message: "string is not UTF-8".into(),
        })
    }

    fn container(&mut self, object: bool, depth: usize) -> Result<Value, UbjsonError> {
        let (end, mut item_type, mut count) = (if object { b'}' } else { b']' }, None, None);
        match self.bytes.get(self.at) {
            Some(b'$') => {
                self.at += 1;
                let t = self.marker()?;
                // Items of these types take no bytes, so a count could claim any number of
                // them; XGBoost never writes such containers.
                if matches!(t, b'Z' | b'T' | b'F' | b'N') {
                    self.at -= 1;
                    return Err(self.error(format!(
                        "a container typed {:?} (items of no bytes) is not read",
                        char::from(t)
                    )));
                }
                item_type = Some(t);
                if self.marker()? != b'#' {
                    self.at -= 1;
                    return Err(self.error("expected '#' (a count) after a container's '$' type"));
                }
                count = Some(self.length()?);
            }
            Some(b'#') => {
                self.at += 1;
                count = Some(self.length()?);
            }
            _ => {}
        }
        let mut items = Vec::with_capacity(count.unwrap_or(0));
        let mut map = Map::new();
        let mut i = 0;
        loop {
            match count {
                Some(n) if i == n => break,
                None if self.bytes.get(self.at) == Some(&end) => {
                    self.at += 1;
                    break;
                }
                _ => {}
            }
            let key = if object { Some(self.string()?) } else { None };
            let value = match item_type {
                Some(t) => self.typed(t, depth)?,
                None => self.value(depth)?,
            };
            match key {
                Some(key) => {
                    map.insert(key, value);
                }
                None => items.push(value),
            }
            i += 1;
        }
        Ok(if object {
            Value::Object(map)
        } else {
            Value::Array(items)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small UBJSON encoder for the tests: sized containers when `sized`, typed f32 arrays.
    fn encode(value: &Value, out: &mut Vec<u8>) {
        fn len(n: usize, out: &mut Vec<u8>) {
            out.push(b'L');
            out.extend((n as i64).to_be_bytes());
        }
        match value {
            Value::Null => out.push(b'Z'),
            Value::Bool(b) => out.push(if *b { b'T' } else { b'F' }),
            Value::Number(n) => match n.as_i64() {
                Some(i) => {
                    out.push(b'l');
                    out.extend((i as i32).to_be_bytes());
                }
                None => {
                    out.push(b'D');
                    out.extend(n.as_f64().unwrap().to_be_bytes());
                }
            },
            Value::String(s) => {
                out.push(b'S');
                len(s.len(), out);
                out.extend(s.as_bytes());
            }
            Value::Array(items) => {
                out.push(b'[');
                for item in items {
                    encode(item, out);
                }
                out.push(b']');
            }
            Value::Object(map) => {
                out.push(b'{');
                for (k, v) in map {
                    len(k.len(), out);
                    out.extend(k.as_bytes());
                    encode(v, out);
                }
                out.push(b'}');
            }
        }
    }

    #[test]
    fn decodes_what_the_encoder_wrote() {
        let value = serde_json::json!({"a": [1, -2, 3.5, null, true, false, "x"],
            "nested": {"k": [], "e": {}}, "s": "üñí"});
        let mut bytes = Vec::new();
        encode(&value, &mut bytes);
        assert_eq!(decode(&bytes).unwrap(), value);
    }

    #[test]
    fn decodes_typed_and_counted_containers() {
        // [$d#i2 1.5f32 -0.25f32]
        let mut bytes = b"[$d#i\x02".to_vec();
        bytes.extend(1.5f32.to_be_bytes());
        bytes.extend((-0.25f32).to_be_bytes());
        assert_eq!(decode(&bytes).unwrap(), serde_json::json!([1.5, -0.25]));
        // {#U1 i1"k" U7} and [$U#U3 1 0 1], with a no-op before the value
        assert_eq!(
            decode(b"{#U\x01i\x01kNU\x07").unwrap(),
            serde_json::json!({"k": 7})
        );
        assert_eq!(
            decode(b"[$U#U\x03\x01\x00\x01").unwrap(),
            serde_json::json!([1, 0, 1])
        );
        // Items of no bytes could be claimed in any number: such containers are refused.
        assert_eq!(
            decode(b"[$Z#U\x02").unwrap_err().message,
            "a container typed 'Z' (items of no bytes) is not read"
        );
        assert_eq!(decode(b"Hi\x031e3").unwrap(), serde_json::json!(1000.0));
    }

    #[test]
    fn errors_name_the_byte() {
        let err = |b: &[u8]| decode(b).unwrap_err();
        assert_eq!(
            err(b"[U\x01X]"),
            UbjsonError {
                offset: 3,
                message: "unknown type marker 'X'".into()
            }
        );
        assert_eq!(err(b"[$d#L\x7f\x00\x00\x00\x00\x00\x00\x00").offset, 13);
        assert!(err(b"[$d#L\x7f\x00\x00\x00\x00\x00\x00\x00")
            .message
            .starts_with("length 9151314442816847872 with 0 bytes left"));
        assert_eq!(err(b"Si\xff").message, "length -1 with 0 bytes left");
        assert_eq!(err(b"[").message, "unexpected end of data");
        assert_eq!(err(b"TT").message, "1 bytes after the end of the document");
        assert_eq!(err(b"d\x7f\xc0\x00\x00").message, "non-finite number NaN");
        assert!(err(&[b'['; 200]).message.contains("nested deeper than 128"));
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_mutated_input(
            cut in 0usize..64,
            flips in proptest::collection::vec((0usize..64, proptest::prelude::any::<u8>()), 0..4),
        ) {
            let value = serde_json::json!({"learner": {"trees": [[1, 2, 3], {"x": 0.5}],
                "name": "gbtree"}, "version": [3, 2, 0]});
            let mut bytes = Vec::new();
            encode(&value, &mut bytes);
            for (at, byte) in flips {
                let at = at % bytes.len();
                bytes[at] = byte;
            }
            bytes.truncate(bytes.len().saturating_sub(cut % 4));
            let _ = decode(&bytes);
        }

        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(
            proptest::prelude::any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }
    }
}
