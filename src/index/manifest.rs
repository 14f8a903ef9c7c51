//! `index.json`, the index manifest: what the binary files hold, its checksum, and the checks
//! made of it alone when an index opens (the cross-checks with the files are the reader's).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::codecs::Codec;
use super::reader::MANIFEST_FILE;
use super::IndexError;

/// The manifest's version: 2 since `index.json` carries its own checksum (the binary files'
/// container is still [`FORMAT_VERSION`] 1), 3 since `blockmax.bin` exists, 4 since
/// `forward.bin` holds term codes ([`super::forward`]). A version 2 index still opens: its lists
/// are bounded by their skip entries alone (looser, so selection prunes less, with the same
/// answers). An index before version 4 opens only without a forward index (a CIFF import):
/// its `forward.bin` is in the older layout, which this build no longer reads.
pub const MANIFEST_VERSION: u32 = 4;

/// The first manifest version whose `forward.bin` this build reads.
pub const FORWARD_CODES_VERSION: u32 = 4;

/// The oldest manifest version this build opens.
pub const OLDEST_MANIFEST_VERSION: u32 = 2;

/// `index.json`: what the binary files hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always `rankserve-index`.
    pub format: String,
    /// The manifest version ([`MANIFEST_VERSION`]).
    pub version: u32,
    /// The docID codec.
    pub codec: Codec,
    /// The scoring stream's name, or `all`.
    pub scoring: String,
    /// Stream names in index order (forward-index stream numbers index this list).
    pub streams: Vec<String>,
    /// Static feature names in index order.
    pub static_features: Vec<String>,
    /// Number of documents N.
    pub num_docs: u64,
    /// Number of terms.
    pub num_terms: u64,
    /// Postings in the scoring stream (sum of df).
    pub num_postings: u64,
    /// Sum of the scoring lengths (avgdl = this / N).
    pub total_scoring_length: u64,
    /// Sum of each stream's lengths, in `streams` order.
    pub stream_total_lengths: Vec<u64>,
    /// Whether `forward.bin` exists.
    pub has_forward: bool,
    /// Where the index came from (free text).
    pub source: String,
    /// `crc32:` and the CRC-32 (8 hex digits) of the manifest written with this field empty
    /// (compact JSON, fields in this order); set by [`Manifest::write`].
    #[serde(default)]
    pub checksum: String,
}

impl Manifest {
    /// The `format` value.
    pub const FORMAT: &'static str = "rankserve-index";

    /// Writes `index.json` into `dir`.
    ///
    /// # Errors
    /// [`IndexError::Io`].
    pub fn write(&self, dir: &Path) -> Result<(), IndexError> {
        let path = dir.join(MANIFEST_FILE);
        let manifest = Manifest {
            checksum: self.checksum(),
            ..self.clone()
        };
        let text = serde_json::to_string_pretty(&manifest).expect("manifest serializes");
        std::fs::write(&path, text).map_err(|e| IndexError::io(&path, e))
    }

    /// What [`Manifest::checksum`](field@Manifest::checksum) should hold for the other fields.
    pub fn checksum(&self) -> String {
        let unsummed = Manifest {
            checksum: String::new(),
            ..self.clone()
        };
        let bytes = serde_json::to_vec(&unsummed).expect("manifest serializes");
        format!("crc32:{:08x}", crc32fast::hash(&bytes))
    }

    pub(super) fn read(dir: &Path) -> Result<Self, IndexError> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read(&path).map_err(|e| IndexError::io(&path, e))?;
        let m: Manifest = serde_json::from_slice(&text).map_err(|e| {
            IndexError::corrupt(
                &path,
                format!("line {} column {}: {e}", e.line(), e.column()),
            )
        })?;
        let bad = |what: String| Err(IndexError::corrupt(&path, what));
        let outdated = |what: String| {
            Err(IndexError::Version {
                path: path.clone(),
                what,
            })
        };
        if m.format != Self::FORMAT {
            return bad(format!(
                "format {:?}, expected {:?}",
                m.format,
                Self::FORMAT
            ));
        }
        if !(OLDEST_MANIFEST_VERSION..=MANIFEST_VERSION).contains(&m.version) {
            return outdated(format!(
                "manifest version {}, this build reads versions {OLDEST_MANIFEST_VERSION} to \
                 {MANIFEST_VERSION} (version 1 manifests carry no checksum): rebuild the index \
                 with `rankserve index build`",
                m.version
            ));
        }
        if m.has_forward && m.version < FORWARD_CODES_VERSION {
            return outdated(format!(
                "manifest version {}: its forward.bin holds one term id per position, a layout \
                 this build no longer reads (version {FORWARD_CODES_VERSION} on): rebuild the \
                 index with `rankserve index build`",
                m.version
            ));
        }
        let checksum = m.checksum();
        if m.checksum != checksum {
            return bad(format!(
                "checksum {:?} does not match its content ({checksum}): the manifest was edited \
                 or damaged; rebuild the index",
                crate::rank::cut_input(&m.checksum)
            ));
        }
        if m.scoring != "all" && !m.streams.contains(&m.scoring) {
            return bad(format!(
                "scoring stream {:?} is neither \"all\" nor one of the streams {:?}",
                crate::rank::cut_input(&m.scoring),
                m.streams
            ));
        }
        if m.num_docs >= u32::MAX as u64 {
            return bad(format!("num_docs {} does not fit a u32 docID", m.num_docs));
        }
        // Term ids are u32 too, and `num_terms + 1` offsets are expected of terms.bin.
        if m.num_terms >= u32::MAX as u64 {
            return bad(format!(
                "num_terms {} does not fit a u32 term id",
                m.num_terms
            ));
        }
        if m.stream_total_lengths.len() != m.streams.len() {
            return bad(format!(
                "{} stream totals for {} streams",
                m.stream_total_lengths.len(),
                m.streams.len()
            ));
        }
        Ok(m)
    }
}
