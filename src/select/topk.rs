//! Top-k selection with a bounded heap: higher score first, ties broken by smaller docID.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::index::DocId;

#[derive(Debug, Clone, Copy)]
struct Entry {
    score: f64,
    doc: DocId,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// "Greater" means *worse*, so the max-heap's top is the entry to evict.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .score
            .total_cmp(&self.score)
            .then(self.doc.cmp(&other.doc))
    }
}

/// The best `k` (doc, score) pairs seen so far.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Entry>,
}

impl TopK {
    /// An empty top-k (k = 0 keeps nothing).
    pub fn new(k: usize) -> Self {
        Self {
            k,
            heap: BinaryHeap::with_capacity(k.min(1 << 16) + 1),
        }
    }

    /// Whether (score, doc) ranks above (other_score, other_doc).
    #[inline]
    pub fn better(score: f64, doc: DocId, other_score: f64, other_doc: DocId) -> bool {
        score > other_score || (score == other_score && doc < other_doc)
    }

    /// Offers a document; returns whether it was kept.
    #[inline]
    pub fn push(&mut self, doc: DocId, score: f64) -> bool {
        if self.heap.len() < self.k {
            self.heap.push(Entry { score, doc });
            return true;
        }
        match self.heap.peek() {
            Some(worst) if Self::better(score, doc, worst.score, worst.doc) => {
                self.heap.pop();
                self.heap.push(Entry { score, doc });
                true
            }
            _ => false,
        }
    }

    /// The score a document must beat once `k` are held (a later, larger docID must be
    /// strictly above it); `None` while fewer than `k` are held.
    #[inline]
    pub fn threshold(&self) -> Option<f64> {
        if self.heap.len() == self.k {
            self.heap.peek().map(|e| e.score)
        } else {
            None
        }
    }

    /// Number held.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// The held documents, best first.
    pub fn into_sorted(self) -> Vec<(DocId, f64)> {
        // BinaryHeap::into_sorted_vec is ascending by Ord, i.e. best first here.
        self.heap
            .into_sorted_vec()
            .into_iter()
            .map(|e| (e.doc, e.score))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The heap keeps exactly what sorting everything and truncating keeps.
        #[test]
        fn matches_sort_and_truncate(scores in proptest::collection::vec(0u8..20, 0..300), k in 0usize..40) {
            let mut t = TopK::new(k);
            for (d, &s) in scores.iter().enumerate() {
                t.push(d as DocId, s as f64 / 4.0);
            }
            let mut all: Vec<(DocId, f64)> = scores.iter().enumerate().map(|(d, &s)| (d as DocId, s as f64 / 4.0)).collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            all.truncate(k);
            prop_assert_eq!(t.into_sorted(), all);
        }
    }
}
