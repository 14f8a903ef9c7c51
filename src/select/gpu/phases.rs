//! Where a GPU query's time goes on the stream: CUDA events recorded between its steps when the
//! posting cache is asked to time queries ([`super::PostingCache::time_phases`]); off by default,
//! since five event records cost a few microseconds of host time per query.

use std::cell::Cell;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use serde::Serialize;

use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError};

/// A point in a query's work on the stream, in the order the stream reaches them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Before the staging copy.
    Start = 0,
    /// After the staging copy (block table, non-resident lists, query parameters).
    Staged,
    /// After the decode launch (of the lists decoded whole).
    Decoded,
    /// After scoring (AND: its intersection steps, a skip-entry step's decoding included, and
    /// `score_and_found`; OR: `score_fill` and one `score_term` per term).
    Scored,
    /// After the top-k launch, which writes its candidates into host memory.
    Selected,
}

const MARKS: usize = Mark::Selected as usize + 1;

/// Stream time between a query's marks, microseconds (CUDA events: each interval also holds
/// whatever time the stream sat idle waiting for the host to launch its next step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SelectPhases {
    pub copy_in_us: f64,
    pub decode_us: f64,
    pub score_us: f64,
    /// The top-k, its candidates' writes to host memory included.
    pub topk_us: f64,
}

impl SelectPhases {
    /// From the first mark to the last.
    pub fn stream_us(&self) -> f64 {
        self.copy_in_us + self.decode_us + self.score_us + self.topk_us
    }
}

/// One event per [`Mark`], and which were recorded since the last [`QueryEvents::take`].
pub struct QueryEvents {
    events: [CudaEvent; MARKS],
    recorded: Cell<u32>,
}

impl QueryEvents {
    /// # Errors
    /// A driver error when an event cannot be created.
    pub fn new(device: &GpuDevice) -> Result<QueryEvents, GpuError> {
        let event = || {
            device
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .during("selection timing event")
        };
        Ok(QueryEvents {
            events: [event()?, event()?, event()?, event()?, event()?],
            recorded: Cell::new(0),
        })
    }

    /// Records `mark` on `stream` ([`Mark::Start`] forgets the marks of an earlier query).
    ///
    /// # Errors
    /// A driver error when the record fails.
    pub fn mark(&self, mark: Mark, stream: &CudaStream) -> Result<(), GpuError> {
        let bit = 1 << mark as u32;
        let before = if mark == Mark::Start {
            0
        } else {
            self.recorded.get()
        };
        self.events[mark as usize]
            .record(stream)
            .during("selection timing event")?;
        self.recorded.set(before | bit);
        Ok(())
    }

    /// The phases of the last query if it recorded every mark (once the stream has passed
    /// them), and forgets them; `None` when a query stopped early (no lists, k = 0).
    ///
    /// # Errors
    /// A driver error when an event's time cannot be read.
    pub fn take(&self) -> Result<Option<SelectPhases>, GpuError> {
        let complete = self.recorded.replace(0) == (1 << MARKS) - 1;
        if !complete {
            return Ok(None);
        }
        let us = |from: Mark| -> Result<f64, GpuError> {
            let ms = self.events[from as usize]
                .elapsed_ms(&self.events[from as usize + 1])
                .during("selection timing event")?;
            Ok(f64::from(ms) * 1e3)
        };
        Ok(Some(SelectPhases {
            copy_in_us: us(Mark::Start)?,
            decode_us: us(Mark::Staged)?,
            score_us: us(Mark::Decoded)?,
            topk_us: us(Mark::Scored)?,
        }))
    }
}

/// Records `mark` when `events` is given.
///
/// # Errors
/// As [`QueryEvents::mark`].
pub fn mark(events: Option<&QueryEvents>, mark: Mark, stream: &CudaStream) -> Result<(), GpuError> {
    events.map_or(Ok(()), |e| e.mark(mark, stream))
}
