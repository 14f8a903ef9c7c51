//! The ranker store: ranker files `NAME.json` in one directory, and a CPU-side cache of parsed
//! rankers under a byte budget ([`ByteLru`]), loaded lazily on a miss.
//!
//! An upload is validated fully ([`load_stored`]: any format `rank::import` reads) before anything is
//! replaced, then written to a temporary file in the same directory, fsynced, renamed over the
//! old file and the directory fsynced: a crash leaves the old file or the new one, never half of
//! one, and a bad upload never replaces a good one. The cache hands out `Arc`s, so a request in
//! flight finishes on the version it started with while a replacement is swapped in.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::gpu::lru::{ByteLru, LruStats};
use crate::rank::cpu::CpuPlan;
use crate::rank::fe::{FeError, FeatureResolver};
use crate::rank::gpu::crossover::Crossover;
use crate::rank::import::{load_any, load_stored, ModelKind};
use crate::rank::model::{Ensemble, Input, Node, Ranker, Tree};
use crate::rank::RankerError;

/// A parsed ranker as the engine holds it.
#[derive(Debug)]
pub struct LoadedRanker {
    /// Its store name (the file stem).
    pub name: String,
    pub ranker: Ranker,
    /// Estimated bytes of the parsed ranker in memory (what the cache budget counts).
    pub bytes: u64,
    /// Size of its file.
    pub file_bytes: u64,
    /// Distinguishes versions of one name (a new number per load).
    pub version: u64,
    /// The ranker compiled for the CPU, once per load.
    pub plan: CpuPlan,
    /// Its CPU/GPU crossover, measured on first use when there is a GPU.
    pub crossover: OnceLock<Crossover>,
    /// Its CPU/GPU crossover for hit documents, feature extraction and scoring together,
    /// measured on first use when there is a GPU and `fe_backend` is `auto`.
    pub hits_crossover: OnceLock<Crossover>,
    /// Its feature map bound to feature extraction, once per load; the error when a feature
    /// is one FE cannot produce (the ranker then takes feature vectors only).
    pub fe: Result<FeatureResolver, FeError>,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid ranker name {name:?}: expected 1 to 64 characters of A-Z a-z 0-9 _ -")]
    BadName { name: String },
    #[error("no ranker named {name:?}")]
    NotFound { name: String },
    #[error("ranker {name:?}: {source}")]
    Invalid { name: String, source: RankerError },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One entry of [`RankerStore::list`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct StoredRanker {
    pub name: String,
    pub file_bytes: u64,
    /// Whether a parsed copy is in the CPU cache.
    pub resident_cpu: bool,
    /// Whether a device copy is in the GPU cache.
    #[serde(default)]
    pub resident_gpu: bool,
    /// The measured CPU/GPU crossover in documents per batch (`null`: not measured, or the
    /// GPU never wins).
    #[serde(default)]
    pub crossover_docs: Option<usize>,
}

/// Whether `name` is a valid store name: `[A-Za-z0-9_-]{1,64}`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Estimated heap + inline bytes of a parsed ranker (what the cache budget counts).
pub fn estimate_bytes(ranker: &Ranker) -> u64 {
    fn tree_bytes(tree: &Tree) -> usize {
        tree.nodes.len() * size_of::<Node>()
            + tree
                .nodes
                .iter()
                .map(|node| match node {
                    Node::Split(split) => match &split.decision {
                        crate::rank::model::Decision::In(categories) => categories.len() * 4,
                        _ => 0,
                    },
                    Node::Leaf(_) => 0,
                })
                .sum::<usize>()
    }
    let features: usize = ranker
        .features
        .iter()
        .map(|f| size_of::<String>() + f.len())
        .sum();
    let inputs: usize = ranker
        .inputs
        .iter()
        .map(|input| {
            size_of::<Input>()
                + match input {
                    Input::Tree(tree) => tree_bytes(tree),
                    // The expression tree is small next to the source; count the source twice.
                    Input::FreeForm(ff) => 2 * ff.source.len(),
                    _ => 0,
                }
        })
        .sum();
    let layers: usize = ranker
        .layers
        .iter()
        .map(|l| 4 * (l.weights.len() + l.bias.len()) + 64)
        .sum();
    let ensemble = ranker
        .ensemble
        .as_ref()
        .map_or(0, |Ensemble { trees, .. }| {
            trees
                .iter()
                .map(|t| size_of::<Tree>() + tree_bytes(t))
                .sum()
        });
    (size_of::<Ranker>() + features + inputs + layers + ensemble) as u64
}

/// How old an upload's temporary file must be to count as left by a crash: an upload writes and
/// renames it within a request, and another process serving the same directory may be writing
/// one now.
const STALE_UPLOAD: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes the temporary files of uploads that never finished (the process was killed between
/// writing and renaming): they are never read, and would stay for ever. Failures are logged.
fn remove_stale_uploads(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(".upload-") && name.ends_with(".tmp")) {
            continue;
        }
        let age = (entry.metadata().and_then(|m| m.modified()))
            .ok()
            .and_then(|modified| modified.elapsed().ok());
        if age.is_some_and(|age| age >= STALE_UPLOAD) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => tracing::info!(file = %entry.path().display(), "stale upload removed"),
                Err(err) => {
                    tracing::warn!(file = %entry.path().display(), error = %err, "stale upload not removed")
                }
            }
        }
    }
}

/// Rankers on disk and their CPU cache.
pub struct RankerStore {
    dir: PathBuf,
    cache: Mutex<ByteLru<String, LoadedRanker>>,
    /// Serializes writes and cache misses per store, so a miss never re-inserts a version
    /// older than one a concurrent upload just wrote.
    write_lock: Mutex<()>,
    next_version: AtomicU64,
}

impl RankerStore {
    /// A store over `dir` (created if missing) with a CPU cache of `cache_budget_bytes`.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the directory cannot be created.
    pub fn open(dir: &Path, cache_budget_bytes: u64) -> Result<RankerStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        remove_stale_uploads(dir);
        Ok(RankerStore {
            dir: dir.to_path_buf(),
            cache: Mutex::new(ByteLru::new(cache_budget_bytes)),
            write_lock: Mutex::new(()),
            next_version: AtomicU64::new(1),
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    fn check_name(name: &str) -> Result<(), StoreError> {
        if valid_name(name) {
            Ok(())
        } else {
            Err(StoreError::BadName {
                name: crate::rank::cut_input(name).into_owned(),
            })
        }
    }

    /// The rankers on disk, by name (`resident_gpu` is the caller's to fill in).
    ///
    /// # Errors
    /// [`StoreError::Io`] when the directory cannot be listed.
    pub fn list(&self) -> Result<Vec<StoredRanker>, StoreError> {
        let io = |source| StoreError::Io {
            path: self.dir.clone(),
            source,
        };
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let path = entry.path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            if !valid_name(name) {
                continue;
            }
            let file_bytes = entry.metadata().map_err(io)?.len();
            let (resident_cpu, crossover_docs) = match self.cache.lock().peek(name) {
                Some(loaded) => (true, loaded.crossover.get().and_then(|c| c.docs)),
                None => (false, None),
            };
            out.push(StoredRanker {
                name: name.to_string(),
                file_bytes,
                resident_cpu,
                resident_gpu: false,
                crossover_docs,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Whether `name` is in the CPU cache (not an access).
    pub fn is_resident(&self, name: &str) -> bool {
        self.cache.lock().contains(name)
    }

    /// The ranker `name` if it is in the cache (an access, as [`get`](Self::get)'s hit is):
    /// a lookup that never touches the disk, for callers that must not block.
    pub fn cached(&self, name: &str) -> Option<Arc<LoadedRanker>> {
        valid_name(name)
            .then(|| self.cache.lock().get(name))
            .flatten()
    }

    /// The ranker `name`, from the cache or (on a miss) parsed from its file and cached.
    ///
    /// # Errors
    /// [`StoreError::BadName`], [`StoreError::NotFound`], or the file's own [`StoreError::Invalid`]
    /// / [`StoreError::Io`].
    pub fn get(&self, name: &str) -> Result<Arc<LoadedRanker>, StoreError> {
        Self::check_name(name)?;
        if let Some(hit) = self.cached(name) {
            return Ok(hit);
        }
        let _writing = self.write_lock.lock();
        // Loaded by a concurrent miss while this one waited?
        if let Some(hit) = self.cache.lock().get(name) {
            return Ok(hit);
        }
        self.load_locked(name)
    }

    /// Re-reads `name` from its file and replaces the cached copy.
    ///
    /// # Errors
    /// As [`RankerStore::get`].
    pub fn reload(&self, name: &str) -> Result<Arc<LoadedRanker>, StoreError> {
        Self::check_name(name)?;
        let _writing = self.write_lock.lock();
        self.load_locked(name)
    }

    fn load_locked(&self, name: &str) -> Result<Arc<LoadedRanker>, StoreError> {
        let path = self.path_of(name);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound {
                    name: name.to_string(),
                })
            }
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        let ranker = load_any(&bytes).map_err(|source| StoreError::Invalid {
            name: name.to_string(),
            source,
        })?;
        Ok(self.cache_insert(name, ranker, bytes.len() as u64))
    }

    fn cache_insert(&self, name: &str, ranker: Ranker, file_bytes: u64) -> Arc<LoadedRanker> {
        let loaded = Arc::new(LoadedRanker {
            name: name.to_string(),
            // The CPU plan holds about as much again as the parsed ranker.
            bytes: 2 * estimate_bytes(&ranker),
            plan: CpuPlan::new(&ranker),
            crossover: OnceLock::new(),
            hits_crossover: OnceLock::new(),
            fe: FeatureResolver::new(&ranker.features),
            ranker,
            file_bytes,
            version: self.next_version.fetch_add(1, Ordering::Relaxed),
        });
        let evicted = self
            .cache
            .lock()
            .insert(name.to_string(), Arc::clone(&loaded), loaded.bytes);
        for (evicted_name, _) in evicted {
            tracing::info!(ranker = %evicted_name, "ranker evicted from the CPU cache");
        }
        loaded
    }

    /// Validates `bytes` (any format [`load_stored`] reads: detected, or `kind` when the client
    /// named it) and, only if valid, stores them as `name` atomically and swaps the cached copy.
    ///
    /// # Errors
    /// [`StoreError::BadName`], [`StoreError::Invalid`] (nothing was written), [`StoreError::Io`].
    pub fn put(
        &self,
        name: &str,
        bytes: &[u8],
        kind: Option<ModelKind>,
    ) -> Result<Arc<LoadedRanker>, StoreError> {
        Self::check_name(name)?;
        let ranker = load_stored(kind, bytes).map_err(|source| StoreError::Invalid {
            name: name.to_string(),
            source,
        })?;
        let _writing = self.write_lock.lock();
        let path = self.path_of(name);
        let io = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        let mut tmp = tempfile::Builder::new()
            .prefix(".upload-")
            .suffix(".tmp")
            .tempfile_in(&self.dir)
            .map_err(io)?;
        tmp.write_all(bytes).map_err(io)?;
        // The temporary file is private (0600); a stored ranker is as readable as the rest.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            (tmp.as_file())
                .set_permissions(std::fs::Permissions::from_mode(0o644))
                .map_err(io)?;
        }
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(&path).map_err(|e| io(e.error))?;
        self.sync_dir()?;
        Ok(self.cache_insert(name, ranker, bytes.len() as u64))
    }

    /// Deletes `name`'s file and cached copy (requests in flight keep theirs).
    ///
    /// # Errors
    /// [`StoreError::BadName`], [`StoreError::NotFound`], [`StoreError::Io`].
    pub fn delete(&self, name: &str) -> Result<(), StoreError> {
        Self::check_name(name)?;
        let _writing = self.write_lock.lock();
        let path = self.path_of(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound {
                    name: name.to_string(),
                })
            }
            Err(source) => return Err(StoreError::Io { path, source }),
        }
        self.cache.lock().remove(name);
        self.sync_dir()
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        let io = |source| StoreError::Io {
            path: self.dir.clone(),
            source,
        };
        std::fs::File::open(&self.dir)
            .map_err(io)?
            .sync_all()
            .map_err(io)
    }

    /// CPU cache counters, resident bytes and budget.
    pub fn cache_stats(&self) -> (LruStats, u64, u64) {
        let cache = self.cache.lock();
        (cache.stats(), cache.resident_bytes(), cache.budget_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upload's temporary file left by a crash is removed when the store opens, a fresh one
    /// (another process's upload under way) is not; a stored ranker is readable by all.
    #[test]
    fn stale_uploads_go_at_open_and_stored_rankers_are_0644() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(".upload-crashed.tmp");
        let fresh = dir.path().join(".upload-writing.tmp");
        std::fs::write(&stale, b"{").unwrap();
        std::fs::write(&fresh, b"{").unwrap();
        let old = std::time::SystemTime::now() - 2 * STALE_UPLOAD;
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let store = RankerStore::open(dir.path(), 1 << 20).unwrap();
        assert!(!stale.exists() && fresh.exists());

        let small = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers/small.json"),
        )
        .unwrap();
        store.put("small", &small, None).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("small.json"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o644);
        }
    }
}
