//! The GPU posting cache: an index's hot posting lists resident in device memory under a byte
//! budget, the rest copied per query through a pinned staging buffer, and the per-index state
//! every GPU query needs (document lengths, the OR accumulator, the decode output).
//!
//! Admission follows Wang et al.'s pruned list caching ("visiting-frequency-based block
//! admission"): blocks are admitted by how many queries of a log visit them, most visited first,
//! ties by the term's frequency in the log, until the budget is full, and none visited fewer
//! than `min_visits` times. The GPU paths here evaluate exhaustively (OR term at a time, AND
//! decoding whole lists), so every block of a list is visited by every query holding its term:
//! a block's visiting frequency is its term's query frequency, and whole lists are admitted
//! (the seed's maximum admission ratio λ is 1).
//!
//! Without a log ([`PostingCache::longest_first`], what the server uses: it has no log at start),
//! the longest lists are admitted first until the budget is full. Those are the lists whose copy
//! per query would cost most, and the ones the scheduler sends to the GPU (a query over short
//! lists runs on the CPU); the choice is made once per index, so serving never re-uploads lists
//! or takes a lock to count visits.
//!
//! Device memory is one word array: the resident lists, then a staging region into which each
//! batch of queries copies everything it needs (its lists' slots and lengths, the caller's
//! per-query words such as BM25 parameters, its block table and the lists that are not
//! resident) in one copy from a pinned host buffer; one decode launch then covers every list of
//! the batch that the caller wants whole ([`Decode`]; an AND's skip-entry steps decode only their candidates' blocks of
//! the others, later, from the same block table). Every other
//! buffer a query touches (decode output, accumulator, top-k candidates) is kept here and reused,
//! so the query path allocates nothing once the cache has seen a query as large. A query whose table and
//! staged lists exceed the staging region fails with [`GpuError::TooLarge`] (the caller runs it
//! on the CPU); the device never needs to hold the whole index.
//!
//! The cache belongs to one index, recognised by [`Index::generation`] (a number no other open
//! index has): given another index, it drops everything and admits again from the same log, so
//! a replaced index is never served stale lists.

use std::collections::HashMap;

use cudarc::driver::result::memcpy_htod_async;
use cudarc::driver::{CudaSlice, CudaView, DevicePtrMut, PinnedHostSlice};

use super::decode::{
    decode_blocks, describe_list, push_words, DecodedBlocks, PackedLists, DESC_WORDS,
};
use super::phases::{self, Mark, QueryEvents};
use super::topk::{PendingTopK, TopKBuffers};
use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, MappedHost};
use crate::index::codecs::{Codec, BLOCK_LEN};
use crate::index::{DocId, Index, PostingList, TermId};
use crate::select::{dedup_terms, Query};

/// Sizes and admission rule of a [`PostingCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostingCacheConfig {
    /// Device bytes for resident posting lists (0: every list is copied per query).
    pub budget_bytes: u64,
    /// Lists whose term is in fewer queries of the log are never admitted.
    pub min_visits: u64,
    /// Device (and pinned host) bytes for one query's block table and non-resident lists.
    pub staging_bytes: u64,
}

impl Default for PostingCacheConfig {
    fn default() -> Self {
        PostingCacheConfig {
            budget_bytes: 1 << 30,
            min_visits: 2,
            staging_bytes: 64 << 20,
        }
    }
}

/// Counters since the cache was made (the resident figures are the current index's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PostingCacheStats {
    /// Queries staged.
    pub queries: u64,
    /// Batches staged (each query is staged in one, alone or with others).
    pub batches: u64,
    /// Query lists found resident.
    pub hits: u64,
    /// Query lists copied per query.
    pub misses: u64,
    /// Bytes copied host → device by queries (block tables and non-resident lists).
    pub bytes_copied: u64,
    /// Bytes copied by the last batch (its one query's, when it was alone).
    pub last_query_bytes_copied: u64,
    /// Lists and bytes resident on the device.
    pub resident_lists: u64,
    pub resident_bytes: u64,
    /// Times the cache was rebuilt for another index.
    pub rebuilds: u64,
}

/// A resident list: where its descriptors lie in the resident table.
#[derive(Debug, Clone, Copy)]
struct Resident {
    first_desc: usize,
    n_blocks: usize,
}

/// State on the device for the index the cache was built for.
struct Loaded {
    generation: u64,
    resident: HashMap<TermId, Resident>,
    /// Host copy of the resident lists' descriptors (word offsets into `words`).
    resident_table: Vec<u32>,
    /// Resident words, padded to a multiple of 4, then the staging region.
    words: CudaSlice<u32>,
    staging_at: usize,
    doc_len: CudaSlice<u32>,
    acc: CudaSlice<f64>,
    /// Words of per-query scratch (AND's intersection steps), grown to the largest query's need.
    scratch: CudaSlice<u32>,
    decoded: DecodedBlocks,
    /// Host words that kernels write through the device mapping (AND's skip-entry steps' counts
    /// of the blocks they decoded), grown to the largest query's need.
    mapped: MappedHost<u32>,
}

/// Top-k candidate host words a cache starts with: the last pass of a top-k with k ≤ 1 024
/// writes at most 2 048 candidates (3 072 words), so 21 such queries of a batch; a batch that
/// needs more grows them once.
const INITIAL_TOPK_WORDS: usize = 1 << 16;

/// How much of a list the batch's one decode launch decodes ([`PostingCache::stage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decode {
    /// Every block.
    Whole,
    /// None: the caller decodes the blocks it needs later, from the list's descriptors in the
    /// query's block table, into the `blocks` blocks of room kept for it at its slot.
    Later { blocks: u32 },
}

/// A query's lists on the device, decoded (those the caller wanted [`Decode::Whole`]), and what
/// scoring them needs.
pub struct QueryPostings<'a> {
    /// Decoded postings (docIDs and tfs, 128 slots per block): list `t` of the query at slots
    /// `slot[t] .. slot[t] + df[t]`, or, for a [`Decode::Later`] list, the room kept for it
    /// from `slot[t]` on.
    pub decoded: &'a mut DecodedBlocks,
    pub slot: Vec<u32>,
    /// The query's block table on the device (`DESC_WORDS` per block): list `t`'s descriptors
    /// from descriptor `first_desc[t]` on, over `words`.
    pub table: CudaView<'a, u32>,
    pub first_desc: Vec<u32>,
    /// The posting words every descriptor points into.
    pub words: &'a CudaSlice<u32>,
    /// The index's codec (which decode kernel reads the words).
    pub codec: Codec,
    /// On the device: `slot` then every list's df (2 × lists words).
    pub slots_and_dfs: CudaView<'a, u32>,
    /// On the device: the query's `extra` words ([`StageRequest::extra`]).
    pub extra: CudaView<'a, u32>,
    /// Reusable top-k candidate buffers.
    pub topk: &'a mut TopKBuffers,
    /// The query's timing events, when the cache times queries.
    pub events: Option<&'a QueryEvents>,
    /// Every document's scoring length (BM25's dl).
    pub doc_len: &'a CudaSlice<u32>,
    /// One f64 per document, for OR's term-at-a-time accumulation (contents undefined).
    pub acc: &'a mut CudaSlice<f64>,
    /// At least the scratch words the caller asked for (contents undefined).
    pub scratch: &'a mut CudaSlice<u32>,
    /// Mapped host words, the query's `mapped_words` from word `mapped_at` on (contents
    /// undefined).
    pub mapped: &'a MappedHost<u32>,
    pub mapped_at: usize,
    /// The query's top-k candidates' first host word ([`super::topk::launch_top_k`]'s `at`).
    pub topk_at: usize,
}

/// One query's part of a batch that [`PostingCache::stage`] stages.
pub struct StageRequest<'l> {
    /// The query's lists, in the order its kernels index them, and how much of each to decode.
    pub lists: Vec<(TermId, PostingList<'l>, Decode)>,
    /// Words its kernels read (per-query parameters such as BM25's).
    pub extra: Vec<u32>,
    /// Device scratch words it needs (shared by the batch: its queries run one after another
    /// on the stream).
    pub scratch_words: usize,
    /// Mapped host words it needs, its own until the batch's wait.
    pub mapped_words: usize,
    /// Top-k candidate host words it needs ([`super::topk::host_words`]), its own likewise.
    pub topk_words: usize,
}

/// Where a staged query's parts lie (see [`StagedBatch::query`]).
struct StagedQuery {
    slot: Vec<u32>,
    first_desc: Vec<u32>,
    /// Staging word of its slots, then dfs, then extra words.
    meta_at: usize,
    lists: usize,
    extra: usize,
    mapped_at: usize,
    topk_at: usize,
}

/// A batch of queries staged and decoded by [`PostingCache::stage`]: their device work queues
/// after it on the one stream, one query after another.
pub struct StagedBatch<'a> {
    loaded: &'a mut Loaded,
    topk: &'a mut TopKBuffers,
    events: Option<&'a QueryEvents>,
    codec: Codec,
    /// The batch's block table, words of `loaded.words`.
    table: std::ops::Range<usize>,
    queries: Vec<StagedQuery>,
}

impl StagedBatch<'_> {
    /// The hits of a top-k that query's launches queued, once the stream has passed it.
    ///
    /// # Errors
    /// A driver error when the host buffer cannot be read.
    pub fn top_k(&self, pending: &PendingTopK) -> Result<Vec<(DocId, f64)>, GpuError> {
        self.topk.collect(pending)
    }

    /// The sum of query `q`'s first `words` mapped words, once the stream has passed the
    /// kernels that write them.
    ///
    /// # Errors
    /// A driver error when the host buffer cannot be read.
    pub fn mapped_sum(&self, q: usize, words: usize) -> Result<u64, GpuError> {
        if words == 0 {
            return Ok(0);
        }
        let at = self.queries[q].mapped_at;
        let host = (self.loaded.mapped.host.as_slice()).during("mapped words read")?;
        Ok(host[at..at + words].iter().map(|&c| c as u64).sum())
    }

    /// Query `q`'s lists and buffers (`q` in the order of the requests staged).
    pub fn query(&mut self, q: usize) -> QueryPostings<'_> {
        let staged = &self.queries[q];
        let loaded = &mut *self.loaded;
        let at = loaded.staging_at + staged.meta_at;
        let meta = at + 2 * staged.lists;
        QueryPostings {
            decoded: &mut loaded.decoded,
            slot: staged.slot.clone(),
            table: loaded.words.slice(self.table.clone()),
            first_desc: staged.first_desc.clone(),
            words: &loaded.words,
            codec: self.codec,
            slots_and_dfs: loaded.words.slice(at..meta),
            extra: loaded.words.slice(meta..meta + staged.extra),
            topk: &mut *self.topk,
            events: self.events,
            doc_len: &loaded.doc_len,
            acc: &mut loaded.acc,
            scratch: &mut loaded.scratch,
            mapped: &loaded.mapped,
            mapped_at: staged.mapped_at,
            topk_at: staged.topk_at,
        }
    }
}

/// How lists are chosen to be resident.
enum Admission {
    /// By query frequency of each term in an admission log.
    Visits(HashMap<String, u64>),
    /// Longest lists first.
    LongestFirst,
}

/// The GPU posting cache of one index at a time (see the module docs).
pub struct PostingCache {
    device: std::sync::Arc<GpuDevice>,
    config: PostingCacheConfig,
    admission: Admission,
    staging: PinnedHostSlice<u32>,
    topk: TopKBuffers,
    loaded: Option<Loaded>,
    stats: PostingCacheStats,
    events: Option<QueryEvents>,
}

impl PostingCache {
    /// A cache that admits lists by their terms' frequency in `log` (each query's distinct terms
    /// count once); it loads an index on first use.
    ///
    /// # Errors
    /// A driver error when the pinned staging buffer cannot be allocated.
    pub fn new(
        device: std::sync::Arc<GpuDevice>,
        config: PostingCacheConfig,
        log: &[Query],
    ) -> Result<PostingCache, GpuError> {
        let mut visits = HashMap::new();
        for q in log {
            for t in dedup_terms(&q.terms) {
                *visits.entry(t.to_string()).or_insert(0u64) += 1;
            }
        }
        PostingCache::with_admission(device, config, Admission::Visits(visits))
    }

    /// A cache that admits the longest lists first (no log; `min_visits` is not used); it
    /// loads an index on first use or [`PostingCache::prepare`].
    ///
    /// # Errors
    /// A driver error when the pinned staging buffer cannot be allocated.
    pub fn longest_first(
        device: std::sync::Arc<GpuDevice>,
        config: PostingCacheConfig,
    ) -> Result<PostingCache, GpuError> {
        PostingCache::with_admission(device, config, Admission::LongestFirst)
    }

    fn with_admission(
        device: std::sync::Arc<GpuDevice>,
        config: PostingCacheConfig,
        admission: Admission,
    ) -> Result<PostingCache, GpuError> {
        let staging_words = (config.staging_bytes as usize / 4).max(DESC_WORDS);
        // SAFETY: the buffer is written only once the stream is idle (`stage` waits for
        // it), so never while a copy reads it; write-combined suits host writes that the device
        // then reads.
        let staging = unsafe { device.context().alloc_pinned::<u32>(staging_words) }
            .during("pinned staging allocation")?;
        let topk = TopKBuffers::alloc(&device, INITIAL_TOPK_WORDS)?;
        Ok(PostingCache {
            device,
            config,
            admission,
            staging,
            topk,
            loaded: None,
            stats: PostingCacheStats::default(),
            events: None,
        })
    }

    /// Times each query's steps on the stream with CUDA events from now on (`true`) or stops
    /// (`false`); read them with [`take_phases`](Self::take_phases).
    ///
    /// # Errors
    /// A driver error when the events cannot be created.
    pub fn time_phases(&mut self, on: bool) -> Result<(), GpuError> {
        self.events = match on {
            true => Some(QueryEvents::new(&self.device)?),
            false => None,
        };
        Ok(())
    }

    /// The steps of the last query run since the previous call, when timing is on and that
    /// query went through every step.
    ///
    /// # Errors
    /// A driver error when an event's time cannot be read.
    pub fn take_phases(&self) -> Result<Option<phases::SelectPhases>, GpuError> {
        self.events.as_ref().map_or(Ok(None), QueryEvents::take)
    }

    /// The device the cache lives on.
    pub fn device(&self) -> &std::sync::Arc<GpuDevice> {
        &self.device
    }

    /// Counters so far.
    pub fn stats(&self) -> PostingCacheStats {
        self.stats
    }

    /// Whether `term`'s list of `index` is resident, so that a query reads it without a copy
    /// (false until the cache has loaded `index`).
    pub fn is_resident(&self, index: &Index, term: TermId) -> bool {
        self.loaded
            .as_ref()
            .is_some_and(|l| l.generation == index.generation() && l.resident.contains_key(&term))
    }

    /// Loads `index` unless it is the one loaded: admits its lists, copies them and the
    /// document lengths to the device.
    ///
    /// # Errors
    /// A device error when an allocation or copy fails (the cache is then empty).
    pub fn prepare(&mut self, index: &Index) -> Result<(), GpuError> {
        if self
            .loaded
            .as_ref()
            .is_some_and(|l| l.generation == index.generation())
        {
            return Ok(());
        }
        self.loaded = None;
        self.stats.resident_lists = 0;
        self.stats.resident_bytes = 0;
        let admitted = self.admit(index);
        let mut packed = PackedLists::default();
        let mut resident = HashMap::new();
        for &(id, list) in &admitted {
            resident.insert(
                id,
                Resident {
                    first_desc: packed.n_blocks(),
                    n_blocks: list.n_blocks(),
                },
            );
            packed.push(list)?;
        }
        let resident_words = packed.words.len();
        let staging_at = resident_words.next_multiple_of(DESC_WORDS);
        // The resident lists (up to the budget, 1 GiB by default) move into the upload buffer.
        let mut words = std::mem::take(&mut packed.words);
        words.resize(staging_at + self.staging.len(), 0);
        let stream = self.device.stream();
        let device_words = stream
            .clone_htod(&words)
            .during("resident posting lists upload")?;
        let mut lengths: Vec<u32> = (0..index.num_docs())
            .map(|d| index.scoring_length(d))
            .collect();
        // A zero-length allocation is not a valid pointer: an empty index keeps one entry.
        lengths.resize(lengths.len().max(1), 0);
        let doc_len = stream
            .clone_htod(&lengths)
            .during("document lengths upload")?;
        let acc = stream
            .alloc_zeros::<f64>(lengths.len())
            .during("accumulator allocation")?;
        self.stats.rebuilds += 1;
        self.stats.resident_lists = admitted.len() as u64;
        self.stats.resident_bytes = 4 * resident_words as u64;
        self.loaded = Some(Loaded {
            generation: index.generation(),
            resident,
            resident_table: packed.table,
            words: device_words,
            staging_at,
            doc_len,
            acc,
            // SAFETY: a query writes the scratch words it reads (contents undefined, as
            // documented on `QueryPostings::scratch`).
            scratch: unsafe { stream.alloc::<u32>(1) }.during("query scratch allocation")?,
            decoded: DecodedBlocks::alloc(&self.device, 1)?,
            mapped: MappedHost::alloc(&self.device, 1)?,
        });
        Ok(())
    }

    /// The lists to keep resident: by visits (most first, at least `min_visits`; without a log
    /// every list counts 0 visits), ties by more postings, then term id (so the choice is
    /// deterministic), while they fit the budget.
    fn admit<'a>(&self, index: &'a Index) -> Vec<(TermId, PostingList<'a>)> {
        let mut candidates: Vec<(u64, TermId, PostingList<'a>)> = match &self.admission {
            Admission::Visits(visits) => visits
                .iter()
                .filter(|&(_, &v)| v >= self.config.min_visits)
                .filter_map(|(term, &v)| Some((v, index.term_id(term)?)))
                .map(|(v, id)| (v, id, index.postings(id)))
                .collect(),
            Admission::LongestFirst => (0..index.num_terms() as usize)
                .map(|i| index.term_at(i).1)
                .map(|id| (0, id, index.postings(id)))
                .collect(),
        };
        candidates.retain(|&(_, _, list)| list.df > 0);
        candidates.sort_by_key(|&(v, id, list)| (std::cmp::Reverse((v, list.df)), id));
        let mut left = self.config.budget_bytes;
        let mut admitted = Vec::new();
        for (_, id, list) in candidates {
            let bytes = list.bytes().len() as u64;
            if bytes <= left {
                left -= bytes;
                admitted.push((id, list));
            }
        }
        admitted
    }

    /// Stages a batch of queries and decodes, with one copy and one launch for the whole batch,
    /// every list a request marks [`Decode::Whole`]: resident lists from device memory, the
    /// others (and the block table of every list) copied through the staging buffer, in the
    /// same copy as each query's slots, dfs and `extra` words. Scratch is sized for the largest
    /// request, mapped and top-k host words for all of them together.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when what the batch stages exceeds the staging region or its
    /// decoded slots overflow a u32; a device error when a copy, allocation or the launch fails.
    pub fn stage(
        &mut self,
        index: &Index,
        requests: &[StageRequest<'_>],
    ) -> Result<StagedBatch<'_>, GpuError> {
        self.prepare(index)?;
        let Some(loaded) = self.loaded.as_mut() else {
            unreachable!("prepare loads the index or fails")
        };
        let all_lists = || requests.iter().flat_map(|r| &r.lists);
        // Staging layout: per query its slots, dfs and extra words; padded to a descriptor (the
        // kernels read the table as uint4), the block table (every list decoded whole first, so
        // that the launch takes one contiguous run of it, then the others), then the
        // non-resident lists.
        let meta_words: usize = (requests.iter())
            .map(|r| 2 * r.lists.len() + r.extra.len())
            .sum();
        let table_at = meta_words.next_multiple_of(DESC_WORDS);
        let n_blocks: usize = all_lists().map(|(_, l, _)| l.n_blocks()).sum();
        let whole_blocks: usize = all_lists()
            .filter(|(_, _, decode)| *decode == Decode::Whole)
            .map(|(_, l, _)| l.n_blocks())
            .sum();
        let table_words = n_blocks * DESC_WORDS;
        let lists_at = table_at + table_words;
        let mut queries: Vec<StagedQuery> = Vec::with_capacity(requests.len());
        let (mut meta_at, mut mapped_at, mut topk_at) = (0, 0, 0);
        for r in requests {
            queries.push(StagedQuery {
                slot: vec![0; r.lists.len()],
                first_desc: vec![0; r.lists.len()],
                meta_at,
                lists: r.lists.len(),
                extra: r.extra.len(),
                mapped_at,
                topk_at,
            });
            meta_at += 2 * r.lists.len() + r.extra.len();
            mapped_at += r.mapped_words;
            topk_at += r.topk_words;
        }
        let mut table = Vec::with_capacity(table_words);
        let mut staged = Vec::new();
        let (mut hits, mut misses) = (0, 0);
        // Decoded blocks: the whole lists' in table order, then each later list's room.
        let mut room_at = whole_blocks;
        let to_u32 = |what, got: usize| {
            u32::try_from(got).map_err(|_| GpuError::TooLarge {
                what,
                got,
                limit: u32::MAX as usize,
            })
        };
        let as_slot =
            |block: usize| to_u32("decoded posting slots of one batch", block * BLOCK_LEN);
        for whole in [true, false] {
            for (r, query) in requests.iter().zip(&mut queries) {
                for (t, &(id, list, decode)) in r.lists.iter().enumerate() {
                    if (decode == Decode::Whole) != whole {
                        continue;
                    }
                    let desc = table.len() / DESC_WORDS;
                    query.first_desc[t] = to_u32("block descriptors of one batch", desc)?;
                    query.slot[t] = match decode {
                        Decode::Whole => as_slot(desc)?,
                        Decode::Later { blocks } => {
                            room_at += blocks as usize;
                            as_slot(room_at - blocks as usize)?
                        }
                    };
                    match loaded.resident.get(&id) {
                        Some(r) => {
                            hits += 1;
                            table.extend_from_slice(
                                &loaded.resident_table[r.first_desc * DESC_WORDS
                                    ..(r.first_desc + r.n_blocks) * DESC_WORDS],
                            );
                        }
                        None => {
                            misses += 1;
                            let word_at = loaded.staging_at + lists_at + staged.len();
                            describe_list(list, word_at, &mut table)?;
                            push_words(list.bytes(), &mut staged);
                        }
                    }
                }
            }
        }
        as_slot(room_at)?;
        let copy_words = lists_at + staged.len();
        if copy_words > self.staging.len() {
            return Err(GpuError::TooLarge {
                what: "bytes a batch stages (block tables and non-resident lists)",
                got: 4 * copy_words,
                limit: 4 * self.staging.len(),
            });
        }
        if loaded.decoded.blocks() < room_at {
            loaded.decoded = DecodedBlocks::alloc(&self.device, room_at.next_power_of_two())?;
        }
        let stream = self.device.stream();
        let scratch_words = requests.iter().map(|r| r.scratch_words).max().unwrap_or(0);
        if loaded.scratch.len() < scratch_words {
            // SAFETY: as at `prepare`: the query writes what it reads.
            loaded.scratch = unsafe { stream.alloc::<u32>(scratch_words.next_power_of_two()) }
                .during("query scratch allocation")?;
        }
        // Every batch ends by waiting for the stream, but one that failed midway may have left
        // its copy (or kernels writing mapped words) in flight: wait before rewriting the pinned
        // buffer or replacing a mapped one (a few µs when the stream is idle, as it is after a
        // successful batch).
        self.device.synchronize()?;
        if loaded.mapped.host.len() < mapped_at {
            loaded.mapped = MappedHost::alloc(&self.device, mapped_at.next_power_of_two())?;
        }
        self.topk.reserve(&self.device, topk_at)?;
        let host = self
            .staging
            .as_mut_slice()
            .during("pinned staging buffer")?;
        for (r, query) in requests.iter().zip(&queries) {
            let dfs = r.lists.iter().map(|(_, l, _)| l.df);
            let meta = &mut host[query.meta_at..query.meta_at + 2 * query.lists + query.extra];
            for (word, value) in meta.iter_mut().zip(query.slot.iter().copied().chain(dfs)) {
                *word = value;
            }
            meta[2 * query.lists..].copy_from_slice(&r.extra);
        }
        host[table_at..lists_at].copy_from_slice(&table);
        host[lists_at..copy_words].copy_from_slice(&staged);
        let at = loaded.staging_at;
        let events = self.events.as_ref();
        phases::mark(events, Mark::Start, stream)?;
        {
            let mut target = loaded.words.slice_mut(at..at + copy_words);
            let (target_ptr, _record) = target.device_ptr_mut(stream);
            // SAFETY: `host[..copy_words]` is pinned memory, written again only once the stream
            // is idle (above); the target holds copy_words words. (cudarc's `memcpy_htod` of a
            // host slice waits for the copy at once; its pinned-buffer copy takes no prefix.)
            unsafe { memcpy_htod_async(target_ptr, &host[..copy_words], stream.cu_stream()) }
                .during("query staging copy")?;
        }
        phases::mark(events, Mark::Staged, stream)?;
        self.stats.queries += requests.len() as u64;
        self.stats.batches += 1;
        self.stats.hits += hits;
        self.stats.misses += misses;
        self.stats.last_query_bytes_copied = 4 * copy_words as u64;
        self.stats.bytes_copied += 4 * copy_words as u64;
        let codec = index.codec();
        let whole_table = loaded
            .words
            .slice(at + table_at..at + table_at + whole_blocks * DESC_WORDS);
        decode_blocks(
            &self.device,
            codec,
            &loaded.words,
            &whole_table,
            &mut loaded.decoded,
            0,
        )?;
        phases::mark(events, Mark::Decoded, stream)?;
        Ok(StagedBatch {
            loaded,
            topk: &mut self.topk,
            events,
            codec,
            table: at + table_at..at + lists_at,
            queries,
        })
    }
}
