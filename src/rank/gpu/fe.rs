//! Feature extraction on the GPU (Tadros 2015, §3.3: streams in parallel, many documents per
//! launch): the upload of a batch's flattened hit layout ([`FeLayout`], built on the host by
//! [`super::layout`]) into reused device buffers, the `fe_extract` launch into a catalogue
//! matrix that stays on the device (documents × [`CATALOGUE_LEN`], f64, catalogue order), and
//! `fe_gather`, which writes a ranker's `V` (its [`GatherMap`](crate::rank::fe::GatherMap)) from
//! it into any device buffer: the GPU ranker's input buffer when scoring follows
//! ([`crate::rank::gpu::ranker::GpuRanker::score_hits`]: only scores cross PCIe back), or this
//! module's own for [`GpuFe::extract_batch`] (rows back to the host). [`GpuFe::download`] copies
//! the whole catalogue out, for tests and measurements.
//!
//! Every catalogue value equals the CPU's bit for bit: integer features are exact, and
//! BM25/BM25F use the CPU's f64 operation order without FMA contraction; the gather only copies
//! (tests/parity.rs checks it).

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, CudaViewMut, DeviceRepr, LaunchConfig, PinnedHostSlice,
    PushKernelArg, ValidAsZeroBits,
};

use super::layout::{
    index32, FeLayout, FeParams, GpuFeError, RealArray, Span, WordArray, REAL_ARRAYS, WORD_ARRAYS,
};
use crate::gpu::error::DriverResultExt;
use crate::gpu::pinned::{HostBuffer, Plain};
use crate::gpu::{GpuDevice, GpuError, KernelModule};
use crate::rank::fe::catalogue::{CATALOGUE_LEN, STREAMS};
use crate::rank::fe::{CorpusStats, FeatureResolver, HitDocument, QueryInfo};

/// Threads per block of `fe_extract`: 32 documents × 4 streams, a multiple of the warp.
const BLOCK: u32 = 128;
/// Threads per block of `fe_gather` (grid-stride).
const GATHER_BLOCK: u32 = 256;

// SAFETY: `FeParams` is `repr(C)` plain old data matching `struct FeParams` in fe.cu field for
// field (checked by the size assertion next to its definition and the parity tests).
unsafe impl DeviceRepr for FeParams {}

/// Device buffers of GPU feature extraction, grown to the largest batch seen and reused.
#[derive(Default)]
pub struct GpuFe {
    /// The buffers used on the device's stream.
    main: FeBuffers,
    /// The ranker's rows, for [`GpuFe::extract_batch`] (scoring gathers into its own buffer).
    rows: Option<CudaSlice<f64>>,
    /// Page-locked host copy of what is downloaded (not write-combined: the host reads it).
    staging: Option<PinnedHostSlice<f64>>,
    /// More buffers, each used on a stream of its own, for the layouts of one device batch
    /// ([`GpuFe::extract_each_into`]); made at the first batch of several layouts.
    lanes: Vec<FeLane>,
    /// Recorded on the device's stream before the lanes start (`None` until they exist).
    lanes_start: Option<CudaEvent>,
}

/// One layout's buffers: its arrays and the catalogue `fe_extract` writes from them.
#[derive(Default)]
struct FeBuffers {
    /// A layout's 32-bit arrays, as in [`FeLayout`]'s `words`.
    words: Option<CudaSlice<u32>>,
    /// Its f64 arrays.
    reals: Option<CudaSlice<f64>>,
    /// The catalogue matrix `fe_extract` writes.
    out: Option<CudaSlice<f64>>,
    /// The uploaded batch (`None`: nothing uploaded yet).
    uploaded: Option<Uploaded>,
}

/// Buffers on a stream of their own, and the event that marks the end of their work.
struct FeLane {
    stream: Arc<CudaStream>,
    buffers: FeBuffers,
    done: CudaEvent,
}

/// Streams one device batch's layouts are extracted on at once, the device's own included: a
/// 1 000-document layout's `fe_extract` runs 4 000 threads, about 32 blocks, so one at a time
/// leaves most of an H100's or H200's 132 multiprocessors idle, and a turn of several requests
/// took their extractions one after another (docs/benchmarks.md, "Several GPUs in one
/// process").
const FE_LANES: usize = 4;

/// What the kernels need to know of the uploaded batch.
#[derive(Debug, Clone, Copy)]
struct Uploaded {
    params: FeParams,
    width: u32,
    n_statics: u32,
    word_arrays: [Span; WORD_ARRAYS],
    real_arrays: [Span; REAL_ARRAYS],
}

impl std::fmt::Debug for GpuFe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuFe")
            .field("uploaded", &self.main.uploaded)
            .field("lanes", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

/// `buf`, reallocated in `stream`'s order when it holds fewer than `len` elements (at least
/// one: a zero-length allocation is not a valid pointer). The old buffer is freed in the order
/// of the stream it was allocated on, the one its users ran on.
fn reserve<'a, T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &'a mut Option<CudaSlice<T>>,
    len: usize,
    op: &'static str,
) -> Result<&'a mut CudaSlice<T>, GpuError> {
    let len = len.max(1);
    let kept = match buf.take() {
        Some(b) if b.len() >= len => b,
        old => {
            drop(old);
            stream.alloc_zeros::<T>(len).during(op)?
        }
    };
    Ok(buf.insert(kept))
}

/// Queues the copy of `host` to the front of `buf` on `stream`, growing it first when needed
/// (one value more than `host` holds: an empty array at its end still points into the
/// allocation).
fn upload_into<T: DeviceRepr + ValidAsZeroBits + Plain>(
    stream: &Arc<CudaStream>,
    buf: &mut Option<CudaSlice<T>>,
    host: &HostBuffer<T>,
) -> Result<(), GpuError> {
    const OP: &str = "feature-extraction upload";
    let dst = reserve(stream, buf, host.len() + 1, OP)?;
    host.copy_to(stream, dst)
}

impl GpuFe {
    /// No device buffers yet: the first batch allocates them.
    pub fn new() -> GpuFe {
        GpuFe::default()
    }

    /// Queues the copy of `layout` to the device (two copies: its 32-bit and its f64 arrays),
    /// growing the buffers when needed. A pinned layout must stay alive and unchanged until the
    /// stream has passed the copy (the callers' downloads wait for it).
    ///
    /// # Errors
    /// A driver error when an allocation or copy fails.
    pub fn upload(&mut self, device: &GpuDevice, layout: &FeLayout) -> Result<(), GpuError> {
        self.main.upload(device, device.stream(), layout)
    }

    /// Queues `fe_extract` over the uploaded batch (nothing when no batch, or an empty one, was
    /// uploaded).
    ///
    /// # Errors
    /// A driver error when the launch fails.
    pub fn launch(&mut self, device: &GpuDevice) -> Result<(), GpuError> {
        self.main.launch(device, device.stream())
    }

    /// Queues `fe_gather` over the uploaded batch: writes its documents' rows in the gather
    /// map's order (the layout's [`FeLayout::width`] features each) into `rows`, from the
    /// catalogue of the `fe_extract` queued before it. Nothing for an empty batch or width.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when `rows` holds fewer than documents × width values; a driver
    /// error when the launch fails.
    pub fn gather_into(
        &self,
        device: &GpuDevice,
        rows: &mut CudaViewMut<'_, f64>,
    ) -> Result<(), GpuError> {
        self.main.gather_into(device, device.stream(), rows)
    }

    /// Extracts each of one device batch's `layouts` and gathers its rows (`width` features
    /// each) into `rows`, after the rows of the layouts before it: the first on the device's
    /// stream, the others spread over [`FE_LANES`] − 1 streams of their own so that the
    /// extractions of several requests run on the device side by side. The lanes start after
    /// the work queued on the device's stream so far, and what is queued there next (the model)
    /// waits for all of them. A pinned layout must stay alive until the device's stream has
    /// passed that point (the caller's download of the scores waits for it).
    ///
    /// # Errors
    /// As [`GpuFe::upload`], [`GpuFe::launch`] and [`GpuFe::gather_into`]; a driver error when
    /// a stream or an event cannot be made, recorded or waited for. Every lane has finished
    /// when it returns an error.
    pub fn extract_each_into(
        &mut self,
        device: &GpuDevice,
        layouts: &[&FeLayout],
        rows: &mut CudaSlice<f64>,
        width: usize,
    ) -> Result<(), GpuError> {
        let lanes = layouts.len().clamp(1, FE_LANES) - 1;
        let queued = self.queue_lanes(device, layouts, rows, width, lanes);
        if queued.is_err() {
            for lane in &self.lanes {
                let _ = lane.stream.synchronize();
            }
        }
        queued
    }

    /// [`GpuFe::extract_each_into`] over the device's stream and `lanes` lanes.
    fn queue_lanes(
        &mut self,
        device: &GpuDevice,
        layouts: &[&FeLayout],
        rows: &mut CudaSlice<f64>,
        width: usize,
        lanes: usize,
    ) -> Result<(), GpuError> {
        let main = device.stream();
        let event = || {
            (device.context())
                .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .during("event creation")
        };
        if lanes > 0 {
            while self.lanes.len() < lanes {
                let stream = device.context().new_stream().during("stream creation")?;
                let (buffers, done) = (FeBuffers::default(), event()?);
                self.lanes.push(FeLane {
                    stream,
                    buffers,
                    done,
                });
            }
            let start = match self.lanes_start.take() {
                Some(start) => start,
                None => event()?,
            };
            let start = self.lanes_start.insert(start);
            start.record(main).during("event record")?;
            for lane in &self.lanes[..lanes] {
                lane.stream.wait(start).during("stream wait")?;
            }
        }
        let mut first = 0;
        for (i, layout) in layouts.iter().enumerate() {
            let (stream, buffers) = match i % (lanes + 1) {
                0 => (main, &mut self.main),
                l => {
                    let lane = &mut self.lanes[l - 1];
                    (&lane.stream, &mut lane.buffers)
                }
            };
            buffers.upload(device, stream, layout)?;
            buffers.launch(device, stream)?;
            buffers.gather_into(device, stream, &mut rows.slice_mut(first * width..))?;
            first += layout.n_docs();
        }
        for lane in &self.lanes[..lanes] {
            lane.done.record(&lane.stream).during("event record")?;
            main.wait(&lane.done).during("stream wait")?;
        }
        Ok(())
    }

    /// Copies the first `n` values of `src` to the host once the queued work is done, through a
    /// reused page-locked buffer.
    fn download_from<'a>(
        device: &GpuDevice,
        staging: &'a mut Option<PinnedHostSlice<f64>>,
        src: Option<&CudaSlice<f64>>,
        n: usize,
    ) -> Result<&'a [f64], GpuError> {
        const OP: &str = "feature-extraction download";
        device.check_fault(OP)?;
        let stream = device.stream();
        let (Some(src), true) = (src, n > 0) else {
            stream.synchronize().during("feature extraction")?;
            return Ok(&[]);
        };
        let mut buffer = match staging.take() {
            Some(buffer) if buffer.len() >= n => buffer,
            old => {
                drop(old);
                // SAFETY: the buffer's contents are uninitialised, but every f64 bit pattern
                // is valid and only the first `n` values, written by the copy below, are read.
                unsafe { device.context().alloc_pinned_with_flags::<f64>(n, 0) }.during(OP)?
            }
        };
        // Into the first `n` values only: a copy into the whole buffer would read as many values
        // from `src`, past its end when the buffer was sized for a larger batch.
        let dst = &mut buffer.as_mut_slice().during(OP)?[..n];
        stream.memcpy_dtoh(&src.slice(..n), dst).during(OP)?;
        stream.synchronize().during("feature extraction")?;
        let buffer = staging.insert(buffer);
        Ok(&buffer.as_slice().during(OP)?[..n])
    }

    /// Copies the catalogue matrix of the uploaded batch to the host once the queued work is
    /// done (row-major `n_docs × CATALOGUE_LEN`, through a reused page-locked buffer).
    ///
    /// # Errors
    /// A driver error when the allocation, the copy or the stream fails.
    pub fn download(&mut self, device: &GpuDevice) -> Result<&[f64], GpuError> {
        let n = (self.main.uploaded).map_or(0, |u| u.params.n_docs as usize) * CATALOGUE_LEN;
        GpuFe::download_from(device, &mut self.staging, self.main.out.as_ref(), n)
    }

    /// Every catalogue feature of `docs`, row-major `docs.len() × CATALOGUE_LEN`, computed on
    /// the GPU: validate and flatten, upload, launch, download. The slice lives in this
    /// `GpuFe`'s staging buffer until its next batch.
    ///
    /// # Errors
    /// [`GpuFeError::Hits`] for an invalid request (the CPU's error); [`GpuFeError::Gpu`] when
    /// the GPU fails or the batch does not fit it.
    pub fn extract_catalogue(
        &mut self,
        device: &GpuDevice,
        query: &QueryInfo,
        stats: &CorpusStats,
        docs: &[HitDocument],
    ) -> Result<&[f64], GpuFeError> {
        let layout = FeLayout::build(query, stats, docs, None)?;
        self.upload(device, &layout)?;
        self.launch(device)?;
        Ok(self.download(device)?)
    }

    /// The GPU counterpart of [`FeatureResolver::extract_batch`]: `out` is row-major
    /// `docs.len() × resolver.len()` in the ranker's order, with the same values, gathered on the
    /// device (only the ranker's features cross PCIe back).
    ///
    /// # Errors
    /// As [`GpuFe::extract_catalogue`];
    /// [`HitError::OutputLength`](crate::rank::fe::HitError::OutputLength) when `out` does not
    /// fit.
    pub fn extract_batch(
        &mut self,
        device: &GpuDevice,
        resolver: &FeatureResolver,
        query: &QueryInfo,
        stats: &CorpusStats,
        docs: &[HitDocument],
        out: &mut [f64],
    ) -> Result<(), GpuFeError> {
        resolver.check_output(docs.len(), out.len())?;
        let layout = FeLayout::build(query, stats, docs, Some(&resolver.gather_map()))?;
        self.upload(device, &layout)?;
        self.launch(device)?;
        let mut rows = self.rows.take();
        let gathered = reserve(
            device.stream(),
            &mut rows,
            out.len(),
            "feature rows allocation",
        )
        .and_then(|rows| self.gather_into(device, &mut rows.slice_mut(..)));
        self.rows = rows;
        gathered?;
        let got = GpuFe::download_from(device, &mut self.staging, self.rows.as_ref(), out.len())?;
        out.copy_from_slice(got);
        Ok(())
    }
}

impl FeBuffers {
    /// Queues the copy of `layout` to the device (two copies: its 32-bit and its f64 arrays),
    /// growing the buffers when needed. A pinned layout must stay alive and unchanged until the
    /// stream has passed the copy (the callers' downloads wait for it).
    ///
    /// # Errors
    /// A driver error when an allocation or copy fails.
    fn upload(
        &mut self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        layout: &FeLayout,
    ) -> Result<(), GpuError> {
        device.check_fault("feature-extraction upload")?;
        self.uploaded = None;
        upload_into(stream, &mut self.words, &layout.words)?;
        upload_into(stream, &mut self.reals, &layout.reals)?;
        reserve(
            stream,
            &mut self.out,
            layout.n_docs() * CATALOGUE_LEN,
            "feature-extraction output allocation",
        )?;
        self.uploaded = Some(Uploaded {
            params: layout.params,
            width: index32(layout.width(), "ranker features")?,
            n_statics: index32(layout.n_statics, "static features")?,
            word_arrays: layout.word_arrays,
            real_arrays: layout.real_arrays,
        });
        Ok(())
    }

    /// Queues `fe_extract` over the uploaded batch (nothing when no batch, or an empty one, was
    /// uploaded).
    ///
    /// # Errors
    /// A driver error when the launch fails.
    fn launch(&mut self, device: &GpuDevice, stream: &Arc<CudaStream>) -> Result<(), GpuError> {
        let function = device.function(KernelModule::Fe, "fe_extract")?;
        let Some(u) = self.uploaded.filter(|u| u.params.n_docs > 0) else {
            return Ok(());
        };
        let (Some(words), Some(reals), Some(out)) = (&self.words, &self.reals, &mut self.out)
        else {
            return Ok(());
        };
        let params = u.params;
        let word = |array: WordArray| words.slice(u.word_arrays[array as usize].range());
        let (stream_phrases, phrase_hits) =
            (word(WordArray::StreamPhrases), word(WordArray::PhraseHits));
        let (hits, stream_lengths) = (word(WordArray::Hits), word(WordArray::StreamLengths));
        let idf = reals.slice(u.real_arrays[RealArray::Idf as usize].range());
        // `build` checked that n_docs × 4 + 1 fits in u32.
        let threads = params.n_docs * STREAMS.len() as u32;
        let config = LaunchConfig {
            grid_dim: (threads.div_ceil(BLOCK), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&stream_phrases)
            .arg(&phrase_hits)
            .arg(&hits)
            .arg(&stream_lengths)
            .arg(&idf)
            .arg(&params)
            .arg(out);
        // SAFETY: the arguments follow `fe_extract`'s signature in order and type: device
        // pointers to the u32 stream-phrase offsets, phrase-hit offsets, (term, position) hit
        // pairs (read as uint2: each array starts 128-byte aligned in its 256-byte aligned
        // allocation) and stream lengths, the f64 idf, `FeParams` by value (layout asserted
        // with its definition), and the f64 output. `upload` copied a layout whose offsets index
        // only within its own arrays, with `params` and the arrays' spans from the same layout,
        // into buffers at least that long, and sized `out` for n_docs × catalogue;
        // the grid covers n_docs × 4 threads in blocks of a multiple of 32, as the kernel's
        // launch-shape comment requires.
        unsafe { launch.launch(config) }.during("fe_extract launch")?;
        Ok(())
    }

    /// Queues `fe_gather` over the uploaded batch: writes its documents' rows in the gather
    /// map's order (the layout's [`FeLayout::width`] features each) into `rows`, from the
    /// catalogue of the `fe_extract` queued before it. Nothing for an empty batch or width.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when `rows` holds fewer than documents × width values; a driver
    /// error when the launch fails.
    fn gather_into(
        &self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        rows: &mut CudaViewMut<'_, f64>,
    ) -> Result<(), GpuError> {
        let function = device.function(KernelModule::Fe, "fe_gather")?;
        let Some(u) = self.uploaded.filter(|u| u.params.n_docs > 0 && u.width > 0) else {
            return Ok(());
        };
        let n = u.params.n_docs as usize * u.width as usize;
        if rows.len() < n {
            return Err(GpuError::TooLarge {
                what: "gathered feature values",
                got: n,
                limit: rows.len(),
            });
        }
        let (Some(out), Some(words), Some(reals)) = (&self.out, &self.words, &self.reals) else {
            return Ok(());
        };
        let codes = words.slice(u.word_arrays[WordArray::Codes as usize].range());
        let statics = reals.slice(u.real_arrays[RealArray::Statics as usize].range());
        let config = LaunchConfig {
            grid_dim: (
                (n.div_ceil(GATHER_BLOCK as usize)).clamp(1, 65_535 * 8) as u32,
                1,
                1,
            ),
            block_dim: (GATHER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(function);
        launch
            .arg(out)
            .arg(&statics)
            .arg(&codes)
            .arg(&u.params.n_docs)
            .arg(&u.width)
            .arg(&u.n_statics)
            .arg(rows);
        // SAFETY: the arguments follow `fe_gather`'s signature in order and type: the f64
        // catalogue (`upload` sized it n_docs × CATALOGUE_LEN), the f64 statics (n_docs ×
        // n_statics), the i32 codes as their u32 bits (width, each a catalogue column below
        // CATALOGUE_LEN or a static column below n_statics, as `GatherMap` builds them), three
        // u32 and the f64 rows, checked above to hold n_docs × width values. The grid-stride loop
        // covers any grid.
        unsafe { launch.launch(config) }.during("fe_gather launch")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::fe::catalogue::{DocFeature, StreamFeature};
    use crate::rank::gpu::layout::MAX_TERMS;

    /// The kernel's copies of the catalogue's shape and order (its `#define`s) agree with
    /// `rank::fe::catalogue` and the layout's [`MAX_TERMS`].
    #[test]
    fn kernel_constants_follow_the_catalogue() {
        let source = KernelModule::Fe.source();
        let define = |name: &str| -> usize {
            let prefix = format!("#define {name} ");
            let line = source
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("fe.cu has no {name}"));
            line[prefix.len()..].trim().parse().unwrap_or_else(|e| {
                panic!("{name}: {e}: {line}");
            })
        };
        let macro_name = |prefix: &str, suffix: &str| {
            format!("{prefix}_{}", suffix.to_uppercase().replace('.', "_"))
        };
        assert_eq!(define("FE_STREAMS"), STREAMS.len());
        assert_eq!(define("FE_STREAM_FEATURES"), StreamFeature::ALL.len());
        assert_eq!(define("FE_DOC_FEATURES"), DocFeature::ALL.len());
        assert_eq!(define("FE_MAX_TERMS"), MAX_TERMS as usize);
        for f in StreamFeature::ALL {
            assert_eq!(define(&macro_name("SF", f.suffix())), f as usize, "{f:?}");
        }
        for f in DocFeature::ALL {
            assert_eq!(define(&macro_name("DF", f.suffix())), f as usize, "{f:?}");
        }
        assert_eq!(
            STREAMS.len() * StreamFeature::ALL.len() + DocFeature::ALL.len(),
            CATALOGUE_LEN
        );
    }
}
