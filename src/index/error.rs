//! The index module's error type.

use std::path::PathBuf;

/// Everything that can go wrong reading a corpus, building an index or opening one.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// An I/O error on a named file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A corpus line that is not a valid document.
    #[error("{}, line {line}: {message}", path.display())]
    CorpusLine {
        /// The corpus file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What was wrong (expected vs got).
        message: String,
    },
    /// An index file failed a check at open (or while decoding); nothing past its end is read.
    #[error("index file {} is corrupt: {what}", path.display())]
    Corrupt {
        /// The file that failed.
        path: PathBuf,
        /// The check that failed, with expected vs got.
        what: String,
    },
    /// An index written in a layout this build does not read (an older or newer rankserve's):
    /// not damaged, but to be rebuilt.
    #[error("index file {} is from another rankserve version: {what}", path.display())]
    Version {
        /// The manifest.
        path: PathBuf,
        /// Its version, what this build reads, and what to do.
        what: String,
    },
    /// A build or query option that cannot be honoured.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// A CIFF file that is not valid protobuf or breaks CIFF's rules.
    #[error("CIFF file {}: {what}", path.display())]
    Ciff {
        /// The CIFF file.
        path: PathBuf,
        /// What was wrong and where (message index).
        what: String,
    },
}

impl IndexError {
    /// Wraps an I/O error with its path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        IndexError::Io {
            path: path.into(),
            source,
        }
    }

    /// A corruption error naming the file and the check.
    pub fn corrupt(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        IndexError::Corrupt {
            path: path.into(),
            what: what.into(),
        }
    }
}
