//! The documents in parallel: the full decode's documents decoded on rayon's pool once framed,
//! the framing walks (the true walk chained along helpers' walks from guessed document starts),
//! and the guess, from the body's end, of where the fields after the documents start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use rayon::prelude::*;

use super::reader::Reader;
use super::{Read, Unhandled};
use crate::api::RankDocument;

impl Reader<'_> {
    pub(super) fn documents(&mut self) -> Read<Vec<RankDocument>> {
        let start = self.pos;
        let len = self.documents_len()?;
        let tasks = (len / self.min_task).min(rayon::current_num_threads());
        if tasks < 2 {
            let mut documents = Vec::with_capacity(self.capacity(len));
            for _ in 0..len {
                documents.push(self.rank_document()?);
            }
            return Ok(documents);
        }
        // Decoding builds values (allocations, maps) and costs several times what finding a
        // document's end does: find every document's start on this thread, then decode them
        // on the pool, each reader checked to stop exactly where the next document starts.
        self.pos = start;
        let starts = self.frame_documents()?;
        let failed = AtomicBool::new(false);
        let mut documents = Vec::new();
        starts
            .par_windows(2)
            .with_min_len(len.div_ceil(tasks))
            .map(|span| {
                let mut reader = Reader {
                    pos: span[0],
                    ..*self
                };
                match reader.rank_document() {
                    Ok(document) if reader.pos == span[1] => document,
                    _ => {
                        failed.store(true, Ordering::Relaxed);
                        RankDocument::default()
                    }
                }
            })
            .collect_into_vec(&mut documents);
        if failed.into_inner() {
            return Err(Unhandled);
        }
        Ok(documents)
    }

    /// Moves past an array of values, checking only their framing: where each value starts,
    /// then where the last one ends.
    pub(super) fn frame_documents(&mut self) -> Read<Vec<usize>> {
        let len = self.array_len()?;
        let bounds = chain_walks(self.bytes, self.pos, len, usize::MAX, &[])?;
        self.pos = *bounds.last().expect("the end of the array");
        Ok(bounds)
    }
}

/// Where each of the `len` values from `first` starts, then where the last one ends (as the
/// sequential walk of [`Reader::frame_documents`] finds them), walked by this thread with the
/// help of `tasks` − 1 walks on rayon's pool over equal shares of the bytes from `first` to the
/// end of `body`.
///
/// MessagePack cannot be read from the middle, so every helper starts at a guess: the first
/// byte of its share that looks like the start of a `/v1/rank` document (a map of one to three
/// entries whose first key is `id`, `features` or `hits`). A guess can be wrong (the same bytes
/// inside a string or a float, a hit document's own map), and the walk from it is garbage until
/// it lands on a real value boundary; from there on it is the true walk, since each step only
/// skips the value where the last one ended. [`chain_walks`] follows the true walk and jumps
/// along a helper's walk wherever it passes through a bound known to be true, so a wrong guess
/// costs time, never a wrong bound. The true walk runs on the calling thread, and a helper the
/// pool has not run or finished by the time it reaches the helper's share is walked past, not
/// waited for: on a loaded machine (every core busy with other requests) this costs about the
/// sequential walk, where waiting for the helpers measured 2.6× slower on the H100 host with
/// four clients (449 -> 1 168 µs).
pub(super) fn frame_in_parallel(
    body: &Bytes,
    first: usize,
    len: usize,
    tasks: usize,
) -> Read<Vec<usize>> {
    let share = (body.len() - first).div_ceil(tasks).max(1);
    let walks: Arc<[OnceLock<Vec<usize>>]> = (0..tasks).map(|_| OnceLock::new()).collect();
    let finished = Arc::new(AtomicBool::new(false));
    for task in 1..tasks {
        let (body, walks, finished) = (body.clone(), Arc::clone(&walks), Arc::clone(&finished));
        rayon::spawn(move || {
            if let Some(walk) = share_walk(&body, first, len, share, task, &finished) {
                let _ = walks[task].set(walk);
            }
        });
    }
    let bounds = chain_walks(body, first, len, share, &walks);
    // Helpers still queued or walking stop at once.
    finished.store(true, Ordering::Relaxed);
    bounds
}

/// The true walk of `len` values from `first` (as [`frame_in_parallel`]), jumping along the
/// walks in `walks` (one per share of `share` bytes, the first unused; an unset one is not
/// ready) wherever they pass through the bound reached.
pub(super) fn chain_walks(
    bytes: &[u8],
    first: usize,
    len: usize,
    share: usize,
    walks: &[OnceLock<Vec<usize>>],
) -> Read<Vec<usize>> {
    let mut reader = Reader {
        bytes,
        pos: first,
        min_task: usize::MAX,
    };
    // A forged length cannot make a huge reservation.
    let mut bounds = Vec::with_capacity(reader.capacity(len) + 1);
    bounds.push(first);
    // The share the walk has reached, and where the next one starts (no division per value).
    let (mut reached, mut next_share) = (0, first.saturating_add(share));
    while bounds.len() <= len {
        while reader.pos >= next_share {
            reached += 1;
            next_share = next_share.saturating_add(share);
        }
        let walk = walks.get(reached).and_then(OnceLock::get);
        let joined = walk.and_then(|walk| Some((walk, walk.binary_search(&reader.pos).ok()?)));
        match joined {
            Some((walk, at)) if at + 1 < walk.len() => {
                let take = (len + 1 - bounds.len()).min(walk.len() - at - 1);
                bounds.extend_from_slice(&walk[at + 1..at + 1 + take]);
                reader.pos = *bounds.last().expect("took at least one bound");
            }
            _ => {
                reader.skip_value()?;
                bounds.push(reader.pos);
            }
        }
    }
    Ok(bounds)
}

/// The helper walk of share `task` (of `share` bytes from `first`) of [`frame_in_parallel`]:
/// from the guessed document start to the first bound at or past the share's end; `None`
/// where nothing in the share looks like a document's start.
pub(super) fn share_walk(
    bytes: &[u8],
    first: usize,
    len: usize,
    share: usize,
    task: usize,
    finished: &AtomicBool,
) -> Option<Vec<usize>> {
    let from = first + task * share;
    let to = (from + share).min(bytes.len());
    let start = guess_document_start(bytes, from, to)?;
    Some(walk_values(bytes, start, to, len + 1, finished))
}

/// The first position from `from` up to `to` that looks like the start of a `/v1/rank`
/// document: a map of one to three entries whose first key is `features` or `hits`, or `id`
/// then (if there is more) `features` or `hits` — not a hit document's own map, whose `id` is
/// followed by `streams` or `static` (a guess there costs a layout run read again).
pub(super) fn guess_document_start(bytes: &[u8], from: usize, to: usize) -> Option<usize> {
    (from..to).find(|&pos| {
        let entries = match bytes[pos] {
            marker @ 0x81..=0x83 => marker - 0x80,
            _ => return false,
        };
        let mut reader = Reader {
            bytes,
            pos: pos + 1,
            min_task: usize::MAX,
        };
        let rows_or_hits = |key: &[u8]| key == b"features" || key == b"hits";
        match reader.str_bytes() {
            Ok(b"id") if entries == 1 => true,
            Ok(b"id") => {
                // The id, a string or nil, skipped by its header alone: a guess reads a few
                // bytes per position, whatever the body holds.
                let id = match bytes.get(reader.pos) {
                    Some(0xc0) => {
                        reader.pos += 1;
                        true
                    }
                    _ => reader.str_bytes().is_ok(),
                };
                id && reader.str_bytes().is_ok_and(rows_or_hits)
            }
            Ok(key) => rows_or_hits(key),
            Err(_) => false,
        }
    })
}

/// The value boundaries from `start`: where each value starts, walking one after the other,
/// until one ends at or past `to`, one does not parse, `max` bounds are found, or `finished`
/// is set.
fn walk_values(
    bytes: &[u8],
    start: usize,
    to: usize,
    max: usize,
    finished: &AtomicBool,
) -> Vec<usize> {
    let mut reader = Reader {
        bytes,
        pos: start,
        min_task: usize::MAX,
    };
    let mut bounds = vec![start];
    while reader.pos < to
        && bounds.len() < max
        && !finished.load(Ordering::Relaxed)
        && reader.skip_value().is_ok()
    {
        bounds.push(reader.pos);
    }
    bounds
}

/// How far back from the body's end [`guess_tail`] looks for the fields after the documents.
const TAIL_SEARCH_BYTES: usize = 64 << 10;

/// The names of the fields that may follow `documents`.
const TAIL_FIELDS: [&[u8]; 7] = [
    b"ranker",
    b"query",
    b"stats",
    b"k",
    b"backend",
    b"explain",
    b"timeout_ms",
];

/// The most bytes [`guess_tail`] reads over all the positions it tries: a body can put many
/// field-like names before one long value, each try reading to the end; past it, the body is
/// decoded in full instead. A body that reaches the bound cost 0.18 ms of the async worker
/// (release build, development machine; 570 ms without it:
/// `a_tail_of_nested_field_names_is_not_read_once_per_name`).
const TAIL_READ_BYTES: usize = 2 * TAIL_SEARCH_BYTES;

/// Where the `fields` fields after a request's documents (which start at `first`) begin, found
/// from the end of `bytes`: the last position, within the last [`TAIL_SEARCH_BYTES`], from
/// which `fields` values named as request fields read exactly to the end. Bytes inside the
/// last of them can also read that way (a stream named `k` in `stats`), so this is a guess
/// until the documents are walked ([`Framed::frame_documents`]). `None` past
/// [`TAIL_READ_BYTES`] of reading.
///
/// [`Framed::frame_documents`]: super::Framed::frame_documents
pub(super) fn guess_tail(bytes: &[u8], first: usize, fields: usize) -> Option<usize> {
    let lowest = first.max(bytes.len().saturating_sub(TAIL_SEARCH_BYTES));
    let mut read = 0;
    for pos in (lowest..=bytes.len()).rev() {
        let mut reader = Reader {
            bytes,
            pos,
            min_task: usize::MAX,
        };
        let fits = (0..fields).all(|_| {
            matches!(reader.str_bytes(), Ok(name) if TAIL_FIELDS.contains(&name))
                && reader.skip_value().is_ok()
        }) && reader.pos == bytes.len();
        if fits {
            return Some(pos);
        }
        read += 1 + reader.pos - pos;
        if read > TAIL_READ_BYTES {
            return None;
        }
    }
    None
}
