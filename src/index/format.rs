//! The container every binary index file uses: a 128-byte header (magic, kind, version,
//! payload length, CRC-32 of the payload, section lengths) followed by up to eight sections.
//! `docs/index-format.md` draws it; this module writes it (streaming, header last) and opens it
//! through mmap with every length checked before anything is read.
//!
//! ```text
//! offset size  field
//!   0     8    magic  b"RSINDEX\0"
//!   8     4    kind   b"TERM" | b"POST" | b"SKIP" | b"DOCS" | b"FWDX"
//!  12     4    version (u32 LE) = FORMAT_VERSION
//!  16     8    payload length in bytes (u64 LE) = file length − 128
//!  24     4    CRC-32 (IEEE, crc32fast) of the payload
//!  28     4    number of sections (u32 LE), ≤ 8
//!  32    64    section lengths, 8 × u64 LE (unused ones 0)
//!  96    32    reserved, zero
//! 128     …    payload: the sections back to back, each zero-padded to a multiple of 8 bytes
//! ```

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::IndexError;

/// The file magic.
pub const MAGIC: [u8; 8] = *b"RSINDEX\0";
/// The on-disk format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// Header size in bytes.
pub const HEADER_BYTES: usize = 128;
/// Most sections a file may have.
pub const MAX_SECTIONS: usize = 8;

/// Writes one container file: sections in order, then the header.
pub struct SectionWriter {
    path: PathBuf,
    kind: [u8; 4],
    out: BufWriter<File>,
    crc: crc32fast::Hasher,
    lengths: Vec<u64>,
    current: u64,
}

impl SectionWriter {
    /// Creates `path` (truncating it) with a placeholder header.
    ///
    /// # Errors
    /// [`IndexError::Io`].
    pub fn create(path: &Path, kind: [u8; 4]) -> Result<Self, IndexError> {
        let file = File::create(path).map_err(|e| IndexError::io(path, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&[0u8; HEADER_BYTES])
            .map_err(|e| IndexError::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            kind,
            out,
            crc: crc32fast::Hasher::new(),
            lengths: Vec::new(),
            current: 0,
        })
    }

    /// Appends bytes to the current section.
    ///
    /// # Errors
    /// [`IndexError::Io`].
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), IndexError> {
        self.crc.update(bytes);
        self.current += bytes.len() as u64;
        self.out
            .write_all(bytes)
            .map_err(|e| IndexError::io(&self.path, e))
    }

    /// Bytes written to the current section so far.
    pub fn section_len(&self) -> u64 {
        self.current
    }

    /// Ends the current section (padding it to 8 bytes) and starts the next.
    ///
    /// # Errors
    /// [`IndexError::Io`]; [`IndexError::InvalidOption`] past [`MAX_SECTIONS`].
    pub fn end_section(&mut self) -> Result<(), IndexError> {
        if self.lengths.len() == MAX_SECTIONS {
            return Err(IndexError::InvalidOption(format!(
                "{}: more than {MAX_SECTIONS} sections",
                self.path.display()
            )));
        }
        let pad = (8 - self.current % 8) % 8;
        let len = self.current;
        self.write(&[0u8; 8][..pad as usize])?;
        self.lengths.push(len);
        self.current = 0;
        Ok(())
    }

    /// Writes the header and closes the file.
    ///
    /// # Errors
    /// [`IndexError::Io`].
    pub fn finish(mut self) -> Result<(), IndexError> {
        let payload: u64 = self.lengths.iter().map(|l| l.div_ceil(8) * 8).sum();
        let mut header = [0u8; HEADER_BYTES];
        header[0..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&self.kind);
        header[12..16].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        header[16..24].copy_from_slice(&payload.to_le_bytes());
        header[24..28].copy_from_slice(&self.crc.clone().finalize().to_le_bytes());
        header[28..32].copy_from_slice(&(self.lengths.len() as u32).to_le_bytes());
        for (i, l) in self.lengths.iter().enumerate() {
            header[32 + 8 * i..40 + 8 * i].copy_from_slice(&l.to_le_bytes());
        }
        let io = |e| IndexError::io(&self.path, e);
        self.out.flush().map_err(io)?;
        let mut file = self
            .out
            .into_inner()
            .map_err(|e| IndexError::io(&self.path, e.into_error()))?;
        file.seek(SeekFrom::Start(0))
            .map_err(|e| IndexError::io(&self.path, e))?;
        file.write_all(&header)
            .map_err(|e| IndexError::io(&self.path, e))?;
        Ok(())
    }
}

/// Writes a whole file from in-memory sections.
///
/// # Errors
/// [`IndexError::Io`].
pub fn write_file(path: &Path, kind: [u8; 4], sections: &[&[u8]]) -> Result<(), IndexError> {
    let mut w = SectionWriter::create(path, kind)?;
    for s in sections {
        w.write(s)?;
        w.end_section()?;
    }
    w.finish()
}

/// An opened, checked container file.
#[derive(Debug)]
pub struct MappedFile {
    path: PathBuf,
    map: Mmap,
    sections: Vec<Range<usize>>,
}

impl MappedFile {
    /// Maps `path` and checks the header: magic, kind, version, section count, that the
    /// lengths add up to the file's length, and the payload's CRC-32.
    ///
    /// # Errors
    /// [`IndexError::Io`] if it cannot be opened; [`IndexError::Corrupt`] naming the file and
    /// the failed check otherwise.
    pub fn open(path: &Path, kind: [u8; 4], sections: usize) -> Result<Self, IndexError> {
        let file = File::open(path).map_err(|e| IndexError::io(path, e))?;
        let len = file.metadata().map_err(|e| IndexError::io(path, e))?.len();
        let corrupt = |what: String| IndexError::corrupt(path, what);
        if len < HEADER_BYTES as u64 {
            return Err(corrupt(format!(
                "file is {len} bytes, shorter than the {HEADER_BYTES}-byte header"
            )));
        }
        // SAFETY: the index directory is immutable once renamed into place; nothing in this
        // process writes to it, and a concurrent rebuild writes a new directory.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| IndexError::io(path, e))?;
        let h = &map[..HEADER_BYTES];
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
        if h[0..8] != MAGIC {
            return Err(corrupt(format!(
                "bad magic {:?}, expected {:?}",
                &h[0..8],
                MAGIC
            )));
        }
        if h[8..12] != kind {
            return Err(corrupt(format!(
                "file kind {:?}, expected {:?}",
                String::from_utf8_lossy(&h[8..12]),
                String::from_utf8_lossy(&kind)
            )));
        }
        let version = u32_at(12);
        if version != FORMAT_VERSION {
            return Err(corrupt(format!(
                "format version {version}, this build reads version {FORMAT_VERSION}"
            )));
        }
        let payload = u64_at(16);
        if payload != len - HEADER_BYTES as u64 {
            return Err(corrupt(format!(
                "header says {payload} payload bytes, file has {} (truncated or extended)",
                len - HEADER_BYTES as u64
            )));
        }
        let n = u32_at(28) as usize;
        if n != sections {
            return Err(corrupt(format!("{n} sections, expected {sections}")));
        }
        let mut ranges = Vec::with_capacity(n);
        let mut at = HEADER_BYTES as u64;
        for i in 0..n {
            let l = u64_at(32 + 8 * i);
            // Checked: a forged length near u64::MAX must not wrap around to a small end.
            let padded = l
                .checked_add(7)
                .map(|x| x / 8 * 8)
                .filter(|&p| at.checked_add(p).is_some_and(|end| end <= len));
            let Some(padded) = padded else {
                return Err(corrupt(format!(
                    "section {i} of {l} bytes runs past the end of the file"
                )));
            };
            ranges.push(at as usize..(at + l) as usize);
            at += padded;
        }
        if at != len {
            return Err(corrupt(format!(
                "sections end at byte {at}, file has {len}"
            )));
        }
        let crc = crc32fast::hash(&map[HEADER_BYTES..]);
        if crc != u32_at(24) {
            return Err(corrupt(format!(
                "payload CRC-32 {crc:#010x}, header says {:#010x}",
                u32_at(24)
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            map,
            sections: ranges,
        })
    }

    /// Section `i`'s bytes.
    pub fn section(&self, i: usize) -> &[u8] {
        &self.map[self.sections[i].clone()]
    }

    /// The file's path (for error messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A corruption error for this file.
    pub fn corrupt(&self, what: impl Into<String>) -> IndexError {
        IndexError::corrupt(&self.path, what)
    }

    /// Checks that section `i` holds exactly `count` records of `size` bytes.
    ///
    /// # Errors
    /// [`IndexError::Corrupt`] naming the section.
    pub fn expect_len(
        &self,
        i: usize,
        name: &str,
        count: u64,
        size: u64,
    ) -> Result<(), IndexError> {
        let got = self.sections[i].len() as u64;
        match count.checked_mul(size) {
            Some(want) if want == got => Ok(()),
            _ => Err(self.corrupt(format!(
                "section {i} ({name}) is {got} bytes, expected {count} × {size}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_header_check_fires() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        write_file(&p, *b"TEST", &[b"hello", b"", b"0123456789"]).unwrap();
        let f = MappedFile::open(&p, *b"TEST", 3).unwrap();
        assert_eq!(f.section(0), b"hello");
        assert_eq!(f.section(1), b"");
        assert_eq!(f.section(2), b"0123456789");
        let good = std::fs::read(&p).unwrap();
        let check = |bytes: &[u8], kind: &[u8; 4], n: usize, want: &str| {
            std::fs::write(&p, bytes).unwrap();
            let err = MappedFile::open(&p, *kind, n).unwrap_err().to_string();
            assert!(
                err.contains("f.bin") && err.contains(want),
                "{err} lacks {want}"
            );
        };
        check(&good, b"NOPE", 3, "file kind");
        check(&good, b"TEST", 2, "3 sections, expected 2");
        check(&good[..good.len() - 1], b"TEST", 3, "truncated");
        check(&good[..100], b"TEST", 3, "shorter than");
        let mut bad = good.clone();
        bad[HEADER_BYTES + 1] ^= 1;
        check(&bad, b"TEST", 3, "CRC-32");
        let mut bad = good.clone();
        bad[12] = 9;
        check(&bad, b"TEST", 3, "format version 9");
        let mut bad = good.clone();
        bad[0] = b'X';
        check(&bad, b"TEST", 3, "bad magic");
        let mut bad = good.clone();
        bad[32] = 200;
        check(&bad, b"TEST", 3, "past the end");
        // A length near u64::MAX (the CRC-32 still matches: the header is not covered by it)
        // used to wrap the end around and pass.
        let mut bad = good.clone();
        bad[40..48].copy_from_slice(&(u64::MAX - 7).to_le_bytes());
        check(
            &bad,
            b"TEST",
            3,
            "section 1 of 18446744073709551608 bytes runs past the end",
        );
    }
}
