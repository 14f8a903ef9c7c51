//! The GPU ranker cache: device copies of rankers ([`GpuRanker`]) within a byte budget, the
//! least recently used evicted first (DESIGN §1). A miss uploads the ranker on first use; a new
//! version of a name replaces the old copy, and a batch that already holds the old copy finishes
//! on it (the cache hands out `Arc`s).
//!
//! A ranker larger than the whole budget is never kept: [`GpuRankerCache::get_or_upload`]
//! refuses it with [`GpuError::TooLarge`] before anything is uploaded when its size is known,
//! and the caller serves it on the CPU.

use std::sync::Arc;

use parking_lot::Mutex;

use super::ranker::GpuRanker;
use crate::gpu::lru::{ByteLru, LruStats};
use crate::gpu::{GpuDevice, GpuError};
use crate::rank::model::Ranker;
use crate::rank::plan::PlanOptions;

/// One resident ranker: the version it was uploaded from and its device copy.
pub struct CachedRanker {
    pub version: u64,
    pub gpu: GpuRanker,
}

/// Device copies of rankers under a byte budget; see the module docs.
pub struct GpuRankerCache {
    device: Arc<GpuDevice>,
    lru: Mutex<ByteLru<String, CachedRanker>>,
    /// Bytes of rankers known not to fit, by name and version, so a miss does not upload them
    /// again on every batch.
    too_large: Mutex<Vec<(String, u64, usize)>>,
    /// Serialises uploads, so that concurrent misses of one ranker upload it once.
    uploading: Mutex<()>,
}

impl GpuRankerCache {
    /// An empty cache on `device` holding at most `budget_bytes` of device copies.
    pub fn new(device: Arc<GpuDevice>, budget_bytes: u64) -> Self {
        GpuRankerCache {
            device,
            lru: Mutex::new(ByteLru::new(budget_bytes)),
            too_large: Mutex::new(Vec::new()),
            uploading: Mutex::new(()),
        }
    }

    /// The device the cached rankers live on.
    pub fn device(&self) -> &Arc<GpuDevice> {
        &self.device
    }

    /// The device copy of `ranker` (store name `name`, version `version`), uploading it on a
    /// miss or when the resident copy is of another version.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when the ranker's device copy exceeds the budget (it is not
    /// kept); any error of [`GpuRanker::upload`].
    pub fn get_or_upload(
        &self,
        name: &str,
        version: u64,
        ranker: &Ranker,
    ) -> Result<Arc<CachedRanker>, GpuError> {
        if let Some(hit) = self.resident(name, version) {
            return Ok(hit);
        }
        let budget = self.lru.lock().budget_bytes();
        let over_budget = |bytes: usize| GpuError::TooLarge {
            what: "ranker bytes for the GPU ranker cache",
            got: bytes,
            limit: usize::try_from(budget).unwrap_or(usize::MAX),
        };
        if let Some(&(_, _, bytes)) = self
            .too_large
            .lock()
            .iter()
            .find(|(n, v, _)| n == name && *v == version)
        {
            return Err(over_budget(bytes));
        }
        let _uploading = self.uploading.lock();
        // Uploaded by a concurrent miss while this one waited?
        if let Some(hit) = self.resident(name, version) {
            return Ok(hit);
        }
        let gpu = GpuRanker::upload(&self.device, ranker, PlanOptions::default())?;
        let bytes = gpu.bytes();
        if bytes as u64 > budget {
            let mut too_large = self.too_large.lock();
            too_large.retain(|(n, _, _)| n != name);
            too_large.push((name.to_string(), version, bytes));
            return Err(over_budget(bytes));
        }
        let cached = Arc::new(CachedRanker { version, gpu });
        let evicted = self
            .lru
            .lock()
            .insert(name.to_string(), Arc::clone(&cached), bytes as u64);
        for (evicted_name, _) in evicted {
            tracing::info!(ranker = %evicted_name, "ranker evicted from the GPU cache");
        }
        Ok(cached)
    }

    fn resident(&self, name: &str, version: u64) -> Option<Arc<CachedRanker>> {
        self.lru
            .lock()
            .get(name)
            .filter(|cached| cached.version == version)
    }

    /// Whether some version of `name` is resident (not an access).
    pub fn contains(&self, name: &str) -> bool {
        self.lru.lock().contains(name)
    }

    /// Drops the device copy of `name` (after a delete).
    pub fn remove(&self, name: &str) {
        self.lru.lock().remove(name);
    }

    /// Counters, resident bytes and budget.
    pub fn stats(&self) -> (LruStats, u64, u64) {
        let lru = self.lru.lock();
        (lru.stats(), lru.resident_bytes(), lru.budget_bytes())
    }
}
