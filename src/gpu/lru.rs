//! A byte-budgeted LRU cache, generic over its keys and values.
//!
//! Values are held behind [`Arc`], so a caller that got a value keeps it alive (and unchanged)
//! after the entry is replaced or evicted: a request in flight finishes on the version it
//! started with. Each entry carries a byte size given by the caller; inserting past the budget
//! evicts least-recently-used entries until the total fits.
//!
//! Recency is a monotonically increasing tick per access, ordered in a `BTreeMap`, so `get`,
//! `insert` and `remove` are `O(log n)`; caches here hold tens to thousands of entries.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

/// Counters of a cache since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LruStats {
    /// `get` calls that found their key.
    pub hits: u64,
    /// `get` calls that did not.
    pub misses: u64,
    /// Entries removed to make room (not counting [`ByteLru::remove`] or replacements).
    pub evictions: u64,
}

struct Slot<V> {
    value: Arc<V>,
    bytes: u64,
    tick: u64,
}

/// A cache of `Arc<V>` keyed by `K`, holding at most `budget_bytes` of entries.
pub struct ByteLru<K, V> {
    budget_bytes: u64,
    resident_bytes: u64,
    slots: HashMap<K, Slot<V>>,
    /// tick → key, oldest first.
    recency: BTreeMap<u64, K>,
    next_tick: u64,
    stats: LruStats,
}

impl<K: Eq + Hash + Clone, V> ByteLru<K, V> {
    /// An empty cache that holds at most `budget_bytes`.
    pub fn new(budget_bytes: u64) -> Self {
        ByteLru {
            budget_bytes,
            resident_bytes: 0,
            slots: HashMap::new(),
            recency: BTreeMap::new(),
            next_tick: 0,
            stats: LruStats::default(),
        }
    }

    /// The value under `key`, marked most recently used; counts a hit or a miss.
    pub fn get<Q>(&mut self, key: &Q) -> Option<Arc<V>>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let tick = self.next_tick;
        match self.slots.get_mut(key) {
            Some(slot) => {
                self.next_tick += 1;
                let owned = self.recency.remove(&slot.tick);
                slot.tick = tick;
                if let Some(owned) = owned {
                    self.recency.insert(tick, owned);
                }
                self.stats.hits += 1;
                Some(Arc::clone(&slot.value))
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// The value under `key` without marking it used or counting a hit or miss.
    pub fn peek<Q>(&self, key: &Q) -> Option<&Arc<V>>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.slots.get(key).map(|slot| &slot.value)
    }

    /// Whether `key` is resident; does not count as an access.
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.slots.contains_key(key)
    }

    /// Inserts (or replaces) `key` with a value of `bytes` bytes, marked most recently used,
    /// and returns the entries evicted to make room, oldest first.
    ///
    /// An entry larger than the whole budget is not kept: it is returned as its own eviction
    /// (after any older entry under the same key is removed), and the caller still holds it.
    pub fn insert(&mut self, key: K, value: Arc<V>, bytes: u64) -> Vec<(K, Arc<V>)> {
        self.remove(&key);
        if bytes > self.budget_bytes {
            self.stats.evictions += 1;
            return vec![(key, value)];
        }
        let mut evicted = Vec::new();
        while self.resident_bytes + bytes > self.budget_bytes {
            let Some((_, oldest)) = self.recency.pop_first() else {
                break;
            };
            if let Some(slot) = self.slots.remove(&oldest) {
                self.resident_bytes -= slot.bytes;
                self.stats.evictions += 1;
                evicted.push((oldest, slot.value));
            }
        }
        let tick = self.next_tick;
        self.next_tick += 1;
        self.recency.insert(tick, key.clone());
        self.slots.insert(key, Slot { value, bytes, tick });
        self.resident_bytes += bytes;
        evicted
    }

    /// Removes `key`, returning its value if it was resident.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<Arc<V>>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let slot = self.slots.remove(key)?;
        self.recency.remove(&slot.tick);
        self.resident_bytes -= slot.bytes;
        Some(slot.value)
    }

    /// Total bytes of the resident entries.
    pub fn resident_bytes(&self) -> u64 {
        self.resident_bytes
    }

    /// The byte budget.
    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Number of resident entries.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no entry is resident.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Hit, miss and eviction counters.
    pub fn stats(&self) -> LruStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn evicts_least_recently_used_first() {
        let mut lru = ByteLru::new(30);
        assert!(lru.insert("a", Arc::new(1), 10).is_empty());
        assert!(lru.insert("b", Arc::new(2), 10).is_empty());
        assert!(lru.insert("c", Arc::new(3), 10).is_empty());
        assert_eq!(lru.peek("b").map(|v| **v), Some(2)); // not an access: b stays the oldest
        assert_eq!(lru.get("a").as_deref(), Some(&1)); // b is now the oldest
        let evicted = lru.insert("d", Arc::new(4), 15);
        let keys: Vec<_> = evicted.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["b", "c"]);
        assert_eq!(lru.resident_bytes(), 25);
        assert!(lru.contains("a") && lru.contains("d"));
        assert_eq!(
            lru.stats(),
            LruStats {
                hits: 1,
                misses: 0,
                evictions: 2
            }
        );
    }

    #[test]
    fn replacement_keeps_old_arc_alive_and_adjusts_bytes() {
        let mut lru = ByteLru::new(100);
        lru.insert("r", Arc::new("v1"), 40);
        let in_flight = lru.get("r").unwrap();
        assert!(lru.insert("r", Arc::new("v2"), 60).is_empty());
        assert_eq!(*in_flight, "v1");
        assert_eq!(*lru.get("r").unwrap(), "v2");
        assert_eq!(lru.resident_bytes(), 60);
        assert_eq!(lru.len(), 1);
        assert_eq!(lru.stats().evictions, 0);
    }

    #[test]
    fn oversized_entry_is_returned_not_kept() {
        let mut lru = ByteLru::new(10);
        lru.insert("small", Arc::new(0), 5);
        let evicted = lru.insert("huge", Arc::new(1), 11);
        assert_eq!(evicted.len(), 1);
        assert_eq!(evicted[0].0, "huge");
        assert!(lru.contains("small") && !lru.contains("huge"));
        assert_eq!(lru.resident_bytes(), 5);
    }

    #[test]
    fn remove_and_miss_counters() {
        let mut lru: ByteLru<String, u32> = ByteLru::new(10);
        assert!(lru.get("x").is_none());
        lru.insert("x".to_string(), Arc::new(7), 4);
        assert_eq!(lru.remove("x").as_deref(), Some(&7));
        assert!(lru.remove("x").is_none());
        assert!(lru.is_empty());
        assert_eq!(lru.resident_bytes(), 0);
        assert_eq!(lru.stats().misses, 1);
    }

    /// The naive reference: a Vec in recency order (oldest first), evicting from the front.
    struct NaiveLru {
        budget: u64,
        entries: Vec<(u8, u64)>,
    }

    impl NaiveLru {
        fn get(&mut self, key: u8) -> bool {
            match self.entries.iter().position(|e| e.0 == key) {
                Some(i) => {
                    let e = self.entries.remove(i);
                    self.entries.push(e);
                    true
                }
                None => false,
            }
        }
        fn insert(&mut self, key: u8, bytes: u64) -> Vec<u8> {
            self.entries.retain(|e| e.0 != key);
            if bytes > self.budget {
                return vec![key];
            }
            let mut evicted = Vec::new();
            while self.entries.iter().map(|e| e.1).sum::<u64>() + bytes > self.budget {
                evicted.push(self.entries.remove(0).0);
            }
            self.entries.push((key, bytes));
            evicted
        }
    }

    proptest! {
        #[test]
        fn matches_naive_reference(ops in proptest::collection::vec((0u8..3, 0u8..8, 0u64..40), 0..200)) {
            let mut lru = ByteLru::new(64);
            let mut naive = NaiveLru { budget: 64, entries: Vec::new() };
            for (op, key, bytes) in ops {
                match op {
                    0 => prop_assert_eq!(lru.get(&key).is_some(), naive.get(key)),
                    1 => {
                        let got: Vec<u8> = lru.insert(key, Arc::new(()), bytes).into_iter().map(|e| e.0).collect();
                        prop_assert_eq!(got, naive.insert(key, bytes));
                    }
                    _ => {
                        let was = naive.entries.iter().any(|e| e.0 == key);
                        naive.entries.retain(|e| e.0 != key);
                        prop_assert_eq!(lru.remove(&key).is_some(), was);
                    }
                }
                prop_assert_eq!(lru.resident_bytes(), naive.entries.iter().map(|e| e.1).sum::<u64>());
                prop_assert!(lru.resident_bytes() <= lru.budget_bytes());
            }
        }
    }
}
