//! Where the rows of a [`GpuRanker`](super::ranker::GpuRanker) device batch come from
//! ([`ChunkRows`]): host feature rows left in the callers' blocks, cut into device batches and
//! overlap parts by index and read only when staged ([`HostRows`]), or hit layouts whose rows are
//! extracted on the device. Kept apart from the ranker's device copy and launches: this is
//! host-side bookkeeping, with no device state.

use super::layout::FeLayout;

/// Where one device batch's feature rows come from.
pub(super) enum ChunkRows<'a> {
    /// Rows on the host: staged and copied in.
    Host(HostRows<'a>),
    /// Hit documents: each layout copied in, its features extracted and gathered on the device
    /// after the layout before's, into one batch.
    Hits(&'a [&'a FeLayout]),
}

impl ChunkRows<'_> {
    pub(super) fn n_docs(&self) -> usize {
        match self {
            ChunkRows::Host(rows) => rows.n_docs(),
            ChunkRows::Hits(layouts) => layouts.iter().map(|l| l.n_docs()).sum(),
        }
    }
}

/// Some of the documents of host feature rows given as row-major blocks of the ranker's width
/// (a block's values past its last whole row are not read). A batch of requests keeps each
/// request's rows where they are: staging gathers a device batch's documents from the blocks,
/// so the batch is not first copied into one matrix.
#[derive(Clone, Copy)]
pub(super) struct HostRows<'a> {
    blocks: &'a [&'a [f64]],
    width: usize,
    /// The documents in view, `start..end` over the blocks' concatenation.
    start: usize,
    end: usize,
}

impl<'a> HostRows<'a> {
    /// Every whole row of `blocks`.
    pub(super) fn new(blocks: &'a [&'a [f64]], width: usize) -> HostRows<'a> {
        let docs = blocks
            .iter()
            .map(|b| b.len().checked_div(width).unwrap_or(0));
        HostRows {
            blocks,
            width,
            start: 0,
            end: docs.sum(),
        }
    }

    pub(super) fn n_docs(&self) -> usize {
        self.end - self.start
    }

    /// Documents `from..to` of this view.
    pub(super) fn part(&self, from: usize, to: usize) -> HostRows<'a> {
        HostRows {
            start: self.start + from,
            end: self.start + to.min(self.n_docs()),
            ..*self
        }
    }

    /// The values of the documents in view, as slices of the blocks, in order.
    pub(super) fn pieces(self) -> impl Iterator<Item = &'a [f64]> {
        let mut block_start = 0;
        self.blocks.iter().filter_map(move |block| {
            let docs = block.len().checked_div(self.width).unwrap_or(0);
            let (first, block_end) = (block_start, block_start + docs);
            block_start = block_end;
            let (from, to) = (self.start.max(first), self.end.min(block_end));
            (from < to).then(|| &block[(from - first) * self.width..(to - first) * self.width])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::HostRows;

    fn gathered(rows: HostRows<'_>) -> Vec<f64> {
        rows.pieces().flatten().copied().collect()
    }

    #[test]
    fn host_rows_gather_a_part_across_blocks_in_order() {
        // Width 2: block a holds documents 0–2, b none, c 3–4 (and a stray value past its last
        // whole row, never read).
        let (a, b, c) = ([0., 0.5, 1., 1.5, 2., 2.5], [], [3., 3.5, 4., 4.5, 9.]);
        let blocks: [&[f64]; 3] = [&a, &b, &c];
        let rows = HostRows::new(&blocks, 2);
        assert_eq!(rows.n_docs(), 5);
        assert_eq!(
            gathered(rows),
            [0., 0.5, 1., 1.5, 2., 2.5, 3., 3.5, 4., 4.5]
        );
        let middle = rows.part(1, 4);
        assert_eq!(middle.n_docs(), 3);
        assert_eq!(gathered(middle), [1., 1.5, 2., 2.5, 3., 3.5]);
        assert_eq!(gathered(middle.part(2, 10)), [3., 3.5]);
        assert_eq!(gathered(rows.part(3, 5)), [3., 3.5, 4., 4.5]);
        assert_eq!(rows.part(5, 9).n_docs(), 0);
        assert_eq!(gathered(rows.part(5, 9)), Vec::<f64>::new());
    }
}
