//! Posting lists on the device and their decoding: one thread block per posting block
//! (`pfor_decode`, `ef_decode`), docIDs and term frequencies exactly as
//! [`crate::index::codecs::BlockDecoder`] decodes them.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, KernelModule};
use crate::index::codecs::{Codec, BLOCK_LEN};
use crate::index::PostingList;

/// The decoding kernel of each codec (the CPU decoder is [`crate::index::codecs::BlockDecoder`]).
fn decode_kernel(codec: Codec) -> (KernelModule, &'static str) {
    match codec {
        Codec::Pfor => (KernelModule::Pfor, "pfor_decode"),
        Codec::Ef => (KernelModule::Ef, "ef_decode"),
    }
}

/// Little-endian u32 words of a byte slice whose length is a multiple of 4 (posting lists and
/// skip entries always are; a trailing partial word would be dropped).
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

/// A posting list resident on the device: its encoded blocks and skip entries, as in the index
/// files. The unit a GPU posting cache will hold.
pub struct DeviceList {
    codec: Codec,
    df: u32,
    n_blocks: u32,
    blocks: CudaSlice<u32>,
    skips: CudaSlice<u32>,
}

/// A list's decoded postings on the device: `df` docIDs and term frequencies, in docID order.
pub struct DecodedList {
    df: usize,
    /// DocIDs, increasing.
    pub docs: CudaSlice<u32>,
    /// Term frequencies, ≥ 1.
    pub tfs: CudaSlice<u32>,
}

impl DecodedList {
    /// Space on the device for `df` postings.
    ///
    /// # Errors
    /// A driver error when allocation fails.
    pub fn alloc(device: &GpuDevice, df: usize) -> Result<DecodedList, GpuError> {
        let stream = device.stream();
        // A zero-length allocation is not a valid pointer: an empty list keeps one unused slot.
        let len = df.max(1);
        Ok(DecodedList {
            df,
            docs: stream
                .alloc_zeros(len)
                .during("decoded docIDs allocation")?,
            tfs: stream.alloc_zeros(len).during("decoded tfs allocation")?,
        })
    }

    /// Number of postings.
    pub fn df(&self) -> usize {
        self.df
    }

    /// Copies the postings back: (docIDs, term frequencies).
    ///
    /// # Errors
    /// A driver error when the copy fails.
    pub fn download(&self, device: &GpuDevice) -> Result<(Vec<u32>, Vec<u32>), GpuError> {
        let stream = device.stream();
        let mut docs = stream
            .clone_dtoh(&self.docs)
            .during("decoded docIDs download")?;
        let mut tfs = stream
            .clone_dtoh(&self.tfs)
            .during("decoded tfs download")?;
        docs.truncate(self.df);
        tfs.truncate(self.df);
        Ok((docs, tfs))
    }
}

impl DeviceList {
    /// Copies a list's blocks and skip entries to the device.
    ///
    /// # Errors
    /// A driver error when allocation or the copy fails.
    pub fn upload(device: &GpuDevice, list: PostingList<'_>) -> Result<DeviceList, GpuError> {
        device.check_fault("posting list upload")?;
        let n_blocks = list.n_blocks();
        // A zero-length allocation is not a valid pointer: an empty list keeps one unused word.
        let mut blocks = words(list.bytes());
        let mut skips: Vec<u32> = (0..n_blocks)
            .flat_map(|j| {
                let s = list.skip(j);
                [s.last_doc, s.offset, s.max_tf, s.min_len]
            })
            .collect();
        blocks.resize(blocks.len().max(1), 0);
        skips.resize(skips.len().max(1), 0);
        let stream = device.stream();
        Ok(DeviceList {
            codec: list.codec,
            df: list.df,
            n_blocks: u32::try_from(n_blocks).map_err(|_| GpuError::TooLarge {
                what: "posting blocks in one list",
                got: n_blocks,
                limit: u32::MAX as usize,
            })?,
            blocks: stream.clone_htod(&blocks).during("posting blocks upload")?,
            skips: stream.clone_htod(&skips).during("skip entries upload")?,
        })
    }

    /// Number of postings.
    pub fn df(&self) -> usize {
        self.df as usize
    }

    /// Number of blocks.
    pub fn n_blocks(&self) -> usize {
        self.n_blocks as usize
    }

    /// Queues the decoding of every block into `out`, from posting `at` on (several lists can
    /// lie side by side in one buffer), on the device's stream.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when `out` holds fewer than `at + df` postings; a driver error
    /// when the launch fails.
    pub fn decode_into(
        &self,
        device: &GpuDevice,
        out: &mut DecodedList,
        at: usize,
    ) -> Result<(), GpuError> {
        let end = at + self.df as usize;
        if out.df < end {
            return Err(GpuError::TooLarge {
                what: "postings to decode (the output holds fewer)",
                got: end,
                limit: out.df,
            });
        }
        if self.n_blocks == 0 {
            return Ok(());
        }
        let (module, kernel) = decode_kernel(self.codec);
        let function = device.function(module, kernel)?;
        let config = LaunchConfig {
            grid_dim: (self.n_blocks, 1, 1),
            block_dim: (BLOCK_LEN as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut docs = out.docs.slice_mut(at..end);
        let mut tfs = out.tfs.slice_mut(at..end);
        let mut launch = device.stream().launch_builder(function);
        launch
            .arg(&self.blocks)
            .arg(&self.skips)
            .arg(&self.df)
            .arg(&mut docs)
            .arg(&mut tfs);
        // SAFETY: the arguments follow `pfor_decode` / `ef_decode` in order and type (u32 words of
        // the list, u32 skip entries, u32 df, u32 docID and tf outputs). The blocks and skips are
        // a whole list that passed the reader's checks at open, so every word a block's header
        // points at lies inside `blocks`; the output views hold exactly df postings; the grid is
        // one 128-thread block per posting block, the shape the kernels' comments require.
        unsafe { launch.launch(config) }.during(kernel)?;
        Ok(())
    }

    /// Decodes the list into fresh device buffers.
    ///
    /// # Errors
    /// As [`DecodedList::alloc`] and [`DeviceList::decode_into`].
    pub fn decode(&self, device: &GpuDevice) -> Result<DecodedList, GpuError> {
        let mut out = DecodedList::alloc(device, self.df as usize)?;
        self.decode_into(device, &mut out, 0)?;
        Ok(out)
    }
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
    DeviceList::upload(device, list)?
        .decode(device)?
        .download(device)
}
