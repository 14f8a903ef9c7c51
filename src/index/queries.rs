//! Synthetic queries for benchmarks (`rankserve queries synth`).
//!
//! Query lengths follow Griffin et al.'s mix: 27 % two terms, 33 % three, 24 % four, 16 % five.
//! Each query takes its terms from one random document's scoring stream (through the forward
//! index), so an AND query always has at least that document as a result, as real queries
//! usually do. Terms in more than half of the documents (stop words) are avoided unless the
//! document has nothing else.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Index, IndexError, TermId};

/// Draws a query length from the 27/33/24/16 % mix.
pub fn query_length(rng: &mut impl Rng) -> usize {
    match rng.random_range(0..100u32) {
        0..27 => 2,
        27..60 => 3,
        60..84 => 4,
        _ => 5,
    }
}

/// `count` queries (terms joined by single spaces), deterministic for (index, seed).
///
/// # Errors
/// [`IndexError::InvalidOption`] when the index has no forward index or no documents;
/// [`IndexError::Corrupt`] from the forward index.
pub fn synth_queries(index: &Index, count: usize, seed: u64) -> Result<Vec<String>, IndexError> {
    if !index.has_forward() || index.num_docs() == 0 {
        return Err(IndexError::InvalidOption(format!(
            "queries synth needs an index with documents and a forward index ({} has {} documents, forward index: {})",
            index.dir().display(),
            index.num_docs(),
            index.has_forward()
        )));
    }
    let scoring = &index.manifest().scoring;
    let streams = &index.manifest().streams;
    let n = index.num_docs();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut names = Vec::new();
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let want = query_length(&mut rng);
        let mut best: Vec<TermId> = Vec::new();
        for _ in 0..20 {
            let d = rng.random_range(0..n);
            let doc = index.forward_doc(d)?.unwrap_or_default();
            let mut terms: Vec<TermId> = doc
                .iter()
                .filter(|s| scoring == "all" || streams[s.stream as usize] == *scoring)
                .flat_map(|s| s.terms.iter().copied())
                .collect();
            terms.sort_unstable();
            terms.dedup();
            let (rare, common): (Vec<TermId>, Vec<TermId>) = terms
                .into_iter()
                .partition(|&t| index.term_info(t).df <= n / 2);
            let mut pick = Vec::with_capacity(want);
            let mut pool = rare;
            while pick.len() < want && !pool.is_empty() {
                pick.push(pool.swap_remove(rng.random_range(0..pool.len())));
            }
            let mut pool = common;
            while pick.len() < want && !pool.is_empty() {
                pick.push(pool.swap_remove(rng.random_range(0..pool.len())));
            }
            if pick.len() > best.len() {
                best = pick;
            }
            if best.len() == want {
                break;
            }
        }
        if best.is_empty() {
            continue;
        }
        if names.is_empty() {
            names = vec![String::new(); index.num_terms() as usize];
            for i in 0..index.num_terms() as usize {
                let (s, id) = index.term_at(i);
                names[id as usize] = s.to_string();
            }
        }
        out.push(
            best.iter()
                .map(|&t| names[t as usize].as_str())
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_mix_is_close_to_griffins() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = [0usize; 6];
        for _ in 0..100_000 {
            counts[query_length(&mut rng)] += 1;
        }
        let pct: Vec<f64> = counts[2..].iter().map(|&c| c as f64 / 1000.0).collect();
        for (got, want) in pct.iter().zip([27.0, 33.0, 24.0, 16.0]) {
            assert!((got - want).abs() < 1.0, "{pct:?}");
        }
    }
}
