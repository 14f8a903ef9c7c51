//! Posting lists on the device and their decoding: one kernel launch decodes every block of any
//! number of lists (`ef_decode_blocks`, `pfor_decode_blocks`), docIDs and term frequencies
//! exactly as [`crate::index::codecs::BlockDecoder`] decodes them.
//!
//! A launch is described by a block table ([`PackedLists`]): one descriptor per 128-posting
//! block (its first word in the launch's word array, its base docID, its header word, its
//! posting count and the codec's count of high-bits words), built on the host from the skip
//! entries. Block `b` of the table writes output slots `b*128 ..`, so list `t` of a table lies
//! at slots `first_block[t]*128 .. + df[t]`, contiguous (only a list's last block is partial).

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};

use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, KernelModule};
use crate::index::codecs::ef::high_words;
use crate::index::codecs::{read_u32, Codec, BLOCK_LEN};
use crate::index::PostingList;

/// u32 words per block descriptor (`BlockDesc`, a uint4, in kernels/packing.cuh).
pub const DESC_WORDS: usize = 4;

/// The decoding kernel of each codec (the CPU decoder is [`crate::index::codecs::BlockDecoder`]).
fn decode_kernel(codec: Codec) -> (KernelModule, &'static str) {
    match codec {
        Codec::Pfor => (KernelModule::Pfor, "pfor_decode_blocks"),
        Codec::Ef => (KernelModule::Ef, "ef_decode_blocks"),
    }
}

/// Little-endian u32 words of a byte slice whose length is a multiple of 4 (posting lists always
/// are; a trailing partial word would be dropped).
pub(super) fn push_words(bytes: &[u8], out: &mut Vec<u32>) {
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
    );
}

/// Appends the descriptors of every block of `list`, whose first byte is word `word_at` of the
/// launch's word array, to `table` (`DESC_WORDS` u32 each, the layout of `BlockDesc`).
///
/// # Errors
/// [`GpuError::TooLarge`] when a block's word offset overflows a u32.
pub fn describe_list(
    list: PostingList<'_>,
    word_at: usize,
    table: &mut Vec<u32>,
) -> Result<(), GpuError> {
    for j in 0..list.n_blocks() {
        let offset = list.skip(j).offset as usize;
        let word = word_at + offset / 4;
        let word = u32::try_from(word).map_err(|_| GpuError::TooLarge {
            what: "posting words of one decode launch",
            got: word,
            limit: u32::MAX as usize,
        })?;
        let bounds = list.bounds(j);
        let header = read_u32(list.bytes(), offset);
        let codec_count = match list.codec {
            Codec::Ef => high_words(bounds.last - bounds.base, (header & 0xff) as u8, bounds.n),
            Codec::Pfor => 0,
        };
        table.extend([
            word,
            bounds.base,
            header,
            bounds.n as u32 | (codec_count as u32) << 8,
        ]);
    }
    Ok(())
}

/// Posting lists of one codec packed side by side on the host (their words and their block
/// table), ready for one upload and one decode launch.
#[derive(Debug, Clone, Default)]
pub struct PackedLists {
    /// The lists' encoded words, one list after another.
    pub words: Vec<u32>,
    /// `DESC_WORDS` u32 per block, every block of every list in order.
    pub table: Vec<u32>,
    /// Per list: its first block in the table (its postings start at slot `first_block * 128`).
    pub first_block: Vec<u32>,
    /// Per list: its postings.
    pub df: Vec<u32>,
}

impl PackedLists {
    /// Appends `list`.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when the words or the blocks overflow a u32.
    pub fn push(&mut self, list: PostingList<'_>) -> Result<(), GpuError> {
        let first_block = self.n_blocks();
        self.first_block
            .push(u32::try_from(first_block).map_err(|_| GpuError::TooLarge {
                what: "posting blocks of one decode launch",
                got: first_block,
                limit: u32::MAX as usize,
            })?);
        self.df.push(list.df);
        describe_list(list, self.words.len(), &mut self.table)?;
        push_words(list.bytes(), &mut self.words);
        Ok(())
    }

    /// Blocks in the table.
    pub fn n_blocks(&self) -> usize {
        self.table.len() / DESC_WORDS
    }

    /// Postings of every list.
    pub fn postings(&self) -> u64 {
        self.df.iter().map(|&d| d as u64).sum()
    }

    /// Copies the words and the table to the device.
    ///
    /// # Errors
    /// A driver error when allocation or the copy fails.
    pub fn upload(&self, device: &GpuDevice) -> Result<DeviceLists, GpuError> {
        device.check_fault("posting list upload")?;
        let stream = device.stream();
        // A zero-length allocation is not a valid pointer: an empty set keeps one unused word.
        let nonempty = |v: &[u32]| if v.is_empty() { vec![0] } else { v.to_vec() };
        Ok(DeviceLists {
            words: stream
                .clone_htod(&nonempty(&self.words))
                .during("posting words upload")?,
            table: stream
                .clone_htod(&nonempty(&self.table))
                .during("block table upload")?,
            n_blocks: self.n_blocks(),
        })
    }
}

/// Packed lists resident on the device: their words and block table.
pub struct DeviceLists {
    words: CudaSlice<u32>,
    table: CudaSlice<u32>,
    n_blocks: usize,
}

impl DeviceLists {
    /// Queues the decoding of every block into `out` (one launch).
    ///
    /// # Errors
    /// As [`decode_blocks`].
    pub fn decode_into(
        &self,
        device: &GpuDevice,
        codec: Codec,
        out: &mut DecodedBlocks,
    ) -> Result<(), GpuError> {
        let table = self.table.slice(..self.n_blocks * DESC_WORDS);
        decode_blocks(device, codec, &self.words, &table, out, 0)
    }
}

/// Decoded postings on the device: 128 slots per block of a table, docIDs and term frequencies.
pub struct DecodedBlocks {
    blocks: usize,
    /// DocIDs, increasing within each list.
    pub docs: CudaSlice<u32>,
    /// Term frequencies, ≥ 1.
    pub tfs: CudaSlice<u32>,
}

impl DecodedBlocks {
    /// Space on the device for `blocks` blocks.
    ///
    /// # Errors
    /// A driver error when allocation fails.
    pub fn alloc(device: &GpuDevice, blocks: usize) -> Result<DecodedBlocks, GpuError> {
        let stream = device.stream();
        // A zero-length allocation is not a valid pointer: no blocks still keeps one.
        let slots = blocks.max(1) * BLOCK_LEN;
        Ok(DecodedBlocks {
            blocks: blocks.max(1),
            docs: stream
                .alloc_zeros(slots)
                .during("decoded docIDs allocation")?,
            tfs: stream.alloc_zeros(slots).during("decoded tfs allocation")?,
        })
    }

    /// Blocks it has room for.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Copies one list's postings back: (docIDs, term frequencies) of the `df` postings from
    /// table block `first_block` on.
    ///
    /// # Errors
    /// A driver error when the copy fails.
    pub fn download(
        &self,
        device: &GpuDevice,
        first_block: u32,
        df: u32,
    ) -> Result<(Vec<u32>, Vec<u32>), GpuError> {
        let stream = device.stream();
        let at = first_block as usize * BLOCK_LEN;
        let span = at..at + df as usize;
        let docs = stream
            .clone_dtoh(&self.docs.slice(span.clone()))
            .during("decoded docIDs download")?;
        let tfs = stream
            .clone_dtoh(&self.tfs.slice(span))
            .during("decoded tfs download")?;
        Ok((docs, tfs))
    }
}

/// Queues one launch that decodes every block of `table` (descriptors over `words`) into `out`,
/// table block `b` into `out`'s block `first_block + b`.
///
/// # Errors
/// [`GpuError::TooLarge`] when `out` has room for fewer blocks than the table holds from
/// `first_block` on, or the table has more blocks than a grid; a driver error when the launch
/// fails.
pub fn decode_blocks(
    device: &GpuDevice,
    codec: Codec,
    words: &CudaSlice<u32>,
    table: &CudaView<'_, u32>,
    out: &mut DecodedBlocks,
    first_block: usize,
) -> Result<(), GpuError> {
    let n_blocks = table.len() / DESC_WORDS;
    if n_blocks == 0 {
        return Ok(());
    }
    if out.blocks < first_block + n_blocks {
        return Err(GpuError::TooLarge {
            what: "blocks to decode (the output holds fewer)",
            got: first_block + n_blocks,
            limit: out.blocks,
        });
    }
    let grid = u32::try_from(n_blocks)
        .ok()
        .filter(|&g| g < i32::MAX as u32)
        .ok_or(GpuError::TooLarge {
            what: "blocks of one decode launch",
            got: n_blocks,
            limit: i32::MAX as usize,
        })?;
    let (module, kernel) = decode_kernel(codec);
    let function = device.function(module, kernel)?;
    let config = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (BLOCK_LEN as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let from = first_block * BLOCK_LEN;
    let mut docs = out.docs.slice_mut(from..);
    let mut tfs = out.tfs.slice_mut(from..);
    let mut launch = device.stream().launch_builder(function);
    launch.arg(words).arg(table).arg(&mut docs).arg(&mut tfs);
    // SAFETY: the arguments follow `pfor_decode_blocks` / `ef_decode_blocks` in order and type
    // (u32 words, the table as uint4 descriptors, u32 docID and tf outputs). Every descriptor was
    // built by `describe_list` from a list that passed the reader's checks at open, pointing into
    // `words` as uploaded with it (or copied from such a table by `intersect_skip_blocks`, or
    // all zeros: 0 postings, which reads no word), so every word a block reads lies inside
    // `words`; the table starts 16-byte aligned (a fresh allocation, or a view at a multiple of
    // 4 words); the outputs hold 128 slots per block from `first_block` on (checked above); the
    // grid is one 128-thread block per descriptor, the shape the kernels' comments require.
    unsafe { launch.launch(config) }.during(kernel)?;
    Ok(())
}

/// Decodes a whole list on the GPU and copies it back: (docIDs, term frequencies), exactly what
/// the CPU's block decoder gives (empty for an empty list).
///
/// # Errors
/// A device error when an allocation, copy or launch fails.
pub fn decode_list(
    device: &GpuDevice,
    list: PostingList<'_>,
) -> Result<(Vec<u32>, Vec<u32>), GpuError> {
    let mut packed = PackedLists::default();
    packed.push(list)?;
    let on_device = packed.upload(device)?;
    let mut out = DecodedBlocks::alloc(device, packed.n_blocks())?;
    on_device.decode_into(device, list.codec, &mut out)?;
    out.download(device, 0, list.df)
}

/// Device time of one batched decode launch over many lists, from CUDA events.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeTiming {
    /// Lists, blocks and postings decoded by each launch.
    pub lists: usize,
    pub blocks: usize,
    pub postings: u64,
    /// Bytes the launch must read (the lists' words and the block table) and write (a docID and
    /// a tf per posting).
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Timed launches after one warm-up, and their median, fastest and slowest, in ms.
    pub reps: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl DecodeTiming {
    /// Integers (docIDs + tfs) decoded per second at the median, in billions.
    pub fn g_ints_per_s(&self) -> f64 {
        2.0 * self.postings as f64 / (self.median_ms * 1e-3) / 1e9
    }

    /// Bytes read and written per second at the median, in TB/s.
    pub fn tb_per_s(&self) -> f64 {
        (self.bytes_read + self.bytes_written) as f64 / (self.median_ms * 1e-3) / 1e12
    }
}

/// Uploads `lists` (one codec) once, then times `reps` single launches that decode every block
/// of every list, each between two CUDA events, after a warm-up launch.
///
/// # Errors
/// A device error when an allocation, copy, launch or event fails.
pub fn time_decode(
    device: &GpuDevice,
    codec: Codec,
    lists: &[PostingList<'_>],
    reps: usize,
) -> Result<DecodeTiming, GpuError> {
    let mut packed = PackedLists::default();
    for &list in lists {
        packed.push(list)?;
    }
    let on_device = packed.upload(device)?;
    let mut out = DecodedBlocks::alloc(device, packed.n_blocks())?;
    on_device.decode_into(device, codec, &mut out)?;
    let stream = device.stream();
    let event = || {
        device
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .during("decode timing event")
    };
    let (start, end) = (event()?, event()?);
    let mut times = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        start.record(stream).during("decode timing event")?;
        on_device.decode_into(device, codec, &mut out)?;
        end.record(stream).during("decode timing event")?;
        times.push(start.elapsed_ms(&end).during("decode timing event")? as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(DecodeTiming {
        lists: lists.len(),
        blocks: packed.n_blocks(),
        postings: packed.postings(),
        bytes_read: 4 * (packed.words.len() + packed.table.len()) as u64,
        bytes_written: 8 * packed.postings(),
        reps: times.len(),
        median_ms: times[times.len() / 2],
        min_ms: times[0],
        max_ms: times[times.len() - 1],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::codecs::{encode_list, SkipEntry};

    /// A list of `n` postings with d-gaps of 3 and tf 1, encoded: (bytes, skip entry bytes).
    fn encoded(codec: Codec, n: u32) -> (Vec<u8>, Vec<u8>) {
        let docs: Vec<u32> = (0..n).map(|i| 5 + 3 * i).collect();
        let tfs = vec![1; n as usize];
        let (mut bytes, mut skips) = (Vec::new(), Vec::new());
        encode_list(codec, &docs, &tfs, |_| 1, &mut bytes, &mut skips);
        let mut skip_bytes = Vec::new();
        for s in &skips {
            SkipEntry::write(s, &mut skip_bytes);
        }
        (bytes, skip_bytes)
    }

    #[test]
    fn the_block_table_places_each_list_after_the_one_before() {
        for codec in [Codec::Ef, Codec::Pfor] {
            let (a_bytes, a_skips) = encoded(codec, 300);
            let (b_bytes, b_skips) = encoded(codec, 1);
            let a = PostingList::from_parts(codec, 300, &a_bytes, &a_skips);
            let b = PostingList::from_parts(codec, 1, &b_bytes, &b_skips);
            let mut packed = PackedLists::default();
            packed.push(a).unwrap();
            packed.push(b).unwrap();
            assert_eq!(packed.first_block, vec![0, 3]);
            assert_eq!(packed.df, vec![300, 1]);
            assert_eq!(packed.n_blocks(), 4);
            assert_eq!(packed.words.len() * 4, a_bytes.len() + b_bytes.len());
            let desc = |b: usize| &packed.table[b * DESC_WORDS..(b + 1) * DESC_WORDS];
            for j in 0..3 {
                let bounds = a.bounds(j);
                let [word, base, header, counts] = desc(j).try_into().unwrap();
                assert_eq!(word as usize * 4, a.skip(j).offset as usize);
                assert_eq!(base, bounds.base);
                assert_eq!(header, read_u32(&a_bytes, word as usize * 4));
                assert_eq!(counts & 0xff, bounds.n as u32);
                let high = match codec {
                    Codec::Ef => {
                        high_words(bounds.last - bounds.base, (header & 0xff) as u8, bounds.n)
                    }
                    Codec::Pfor => 0,
                };
                assert_eq!(counts >> 8, high as u32);
            }
            // The second list's only block starts right after the first list's words.
            assert_eq!(desc(3)[0] as usize * 4, a_bytes.len());
            assert_eq!((desc(3)[1], desc(3)[3] & 0xff), (0, 1));
        }
    }
}
