//! Step 5: writing `postings.bin`, `skips.bin`, `terms.bin` and `docs.bin`, and the temporary
//! build directory renamed into place once complete.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::encode::RangeOut;
use crate::index::format::{write_file, SectionWriter};
use crate::index::reader::{
    TermInfo, BLOCK_MAX_FILE, DOCS_FILE, KIND_BLOCK_MAX, KIND_DOCS, KIND_POSTINGS, KIND_SKIPS,
    KIND_TERMS, POSTINGS_FILE, SKIPS_FILE, TERMS_FILE,
};
use crate::index::IndexError;

/// Little-endian bytes of a u64 slice.
pub(crate) fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes of a u32 slice.
pub(crate) fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes `postings.bin`, `skips.bin` and `blockmax.bin` from encoded ranges (in term order);
/// returns every term's info with file-absolute offsets, and the first two files' payload sizes.
pub(crate) fn write_postings(
    dir: &Path,
    ranges: Vec<RangeOut>,
) -> Result<(Vec<TermInfo>, u64, u64), IndexError> {
    let mut post = SectionWriter::create(&dir.join(POSTINGS_FILE), KIND_POSTINGS)?;
    let mut skips = SectionWriter::create(&dir.join(SKIPS_FILE), KIND_SKIPS)?;
    let mut maxes = SectionWriter::create(&dir.join(BLOCK_MAX_FILE), KIND_BLOCK_MAX)?;
    let mut infos = Vec::new();
    let mut skip_bytes = Vec::new();
    let (mut list_ids, mut list_maxes) = (Vec::new(), Vec::new());
    let (mut at, mut sk) = (0u64, 0u64);
    for r in ranges {
        post.write(&r.bytes)?;
        skip_bytes.clear();
        for s in &r.skips {
            s.write(&mut skip_bytes);
        }
        skips.write(&skip_bytes)?;
        skip_bytes.clear();
        for m in &r.maxes {
            m.write(&mut skip_bytes);
        }
        maxes.write(&skip_bytes)?;
        for (i, m) in &r.list_maxes {
            list_ids.push(infos.len() as u32 + i);
            m.write(&mut list_maxes);
        }
        infos.extend(r.infos.into_iter().map(|mut i| {
            i.postings_offset += at;
            i.skip_start += sk;
            i
        }));
        at += r.bytes.len() as u64;
        sk += r.skips.len() as u64;
    }
    let (pb, sb) = (post.section_len(), skips.section_len());
    post.end_section()?;
    post.finish()?;
    skips.end_section()?;
    skips.finish()?;
    maxes.end_section()?;
    maxes.write(&u32s(&list_ids))?;
    maxes.end_section()?;
    maxes.write(&list_maxes)?;
    maxes.end_section()?;
    maxes.finish()?;
    Ok((infos, pb, sb))
}

/// Writes `terms.bin`: the dictionary sorted by term, and each term id's info.
pub(crate) fn write_terms<'t>(
    dir: &Path,
    n_terms: usize,
    term: impl Fn(u32) -> &'t str + Sync,
    infos: &[TermInfo],
) -> Result<(), IndexError> {
    let mut order: Vec<u32> = (0..n_terms as u32).collect();
    order.par_sort_unstable_by(|&a, &b| term(a).cmp(term(b)));
    let mut offsets = Vec::with_capacity(n_terms + 1);
    let mut bytes = Vec::new();
    for &t in &order {
        offsets.push(bytes.len() as u64);
        bytes.extend_from_slice(term(t).as_bytes());
    }
    offsets.push(bytes.len() as u64);
    let mut info_bytes = Vec::with_capacity(infos.len() * TermInfo::BYTES);
    for i in infos {
        i.write(&mut info_bytes);
    }
    write_file(
        &dir.join(TERMS_FILE),
        KIND_TERMS,
        &[&u64s(&offsets), &bytes, &u32s(&order), &info_bytes],
    )
}

/// Writes `docs.bin`.
pub(crate) fn write_docs(
    dir: &Path,
    scoring_len: &[u32],
    stream_lengths: &[Vec<u32>],
    static_values: &[Vec<f64>],
    id_offsets: &[u64],
    ids: &[u8],
) -> Result<(), IndexError> {
    let lengths: Vec<u8> = stream_lengths.iter().flat_map(|c| u32s(c)).collect();
    let statics: Vec<u8> = static_values
        .iter()
        .flat_map(|c| c.iter().flat_map(|v| v.to_le_bytes()))
        .collect();
    write_file(
        &dir.join(DOCS_FILE),
        KIND_DOCS,
        &[
            &u32s(scoring_len),
            &lengths,
            &statics,
            &u64s(id_offsets),
            ids,
        ],
    )
}

/// A build directory next to the destination, removed unless committed.
pub(crate) struct TempDir {
    pub(crate) path: PathBuf,
    committed: bool,
}

impl TempDir {
    /// Creates `.NAME.building-PID` next to `out`; refuses when `out` exists.
    pub(crate) fn create(out: &Path) -> Result<Self, IndexError> {
        if out.exists() {
            return Err(IndexError::InvalidOption(format!(
                "{} already exists; remove it or choose another output directory",
                out.display()
            )));
        }
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "index".into());
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| IndexError::io(parent, e))?;
        let path = parent.join(format!(".{name}.building-{}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(|e| IndexError::io(&path, e))?;
        }
        std::fs::create_dir(&path).map_err(|e| IndexError::io(&path, e))?;
        Ok(Self {
            path,
            committed: false,
        })
    }

    /// Renames the finished directory to `out`.
    pub(crate) fn commit(mut self, out: &Path) -> Result<(), IndexError> {
        std::fs::rename(&self.path, out).map_err(|e| IndexError::io(out, e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
