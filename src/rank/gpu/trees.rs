//! Decision trees on the GPU: the node layout the `trees_eval` kernel reads, its upload, and the
//! launch.
//!
//! The layout renumbers each tree breadth-first so that a split's children sit side by side
//! (right = left + 1): a node needs one child index, and a 32-byte node is one aligned load.

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, KernelModule};
use crate::rank::model::{Decision, Missing, Node, Tree};

/// One tree node as `kernels/trees.cu` reads it (see the layout comment there).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuNode {
    value: f64,
    feature: i32,
    left: u32,
    flags: u32,
    cat_offset: u32,
    cat_len: u32,
    pad: u32,
}

const _: () = assert!(std::mem::size_of::<GpuNode>() == 32);

// SAFETY: `GpuNode` is `repr(C)`, plain old data, and matches `struct TreeNode` in trees.cu
// field for field (checked by the size assertion above and the parity tests).
unsafe impl DeviceRepr for GpuNode {}

const LEAF: i32 = -1;

fn flags(decision: &Decision, missing: Missing, default_left: bool) -> u32 {
    let decision = match decision {
        Decision::LeF64(_) => 0,
        Decision::LtF32(_) => 1,
        Decision::In(_) => 2,
    };
    let missing = match missing {
        Missing::None => 0,
        Missing::Zero => 1,
        Missing::Nan => 2,
    };
    decision | (missing << 2) | (u32::from(default_left) << 4)
}

/// The host-side node arrays of a list of trees, ready to upload.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TreeLayout {
    nodes: Vec<GpuNode>,
    roots: Vec<u32>,
    categories: Vec<u32>,
    /// For each entry of `nodes`, its index in its own tree's node array (the CPU's leaf id).
    original_ids: Vec<u32>,
}

impl TreeLayout {
    /// Lays out `trees` one after another, each renumbered breadth-first.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when the nodes or categories overflow 32-bit indices.
    pub fn build(trees: &[Tree]) -> Result<TreeLayout, GpuError> {
        let mut layout = TreeLayout::default();
        let mut queue = std::collections::VecDeque::new();
        for tree in trees {
            let root = index32(layout.nodes.len(), "tree nodes")?;
            layout.roots.push(root);
            layout.nodes.push(GpuNode::default());
            layout.original_ids.push(0);
            queue.push_back((0usize, root as usize));
            while let Some((original, slot)) = queue.pop_front() {
                layout.nodes[slot] = match &tree.nodes[original] {
                    Node::Leaf(value) => GpuNode {
                        value: *value,
                        feature: LEAF,
                        ..GpuNode::default()
                    },
                    Node::Split(split) => {
                        let left = layout.nodes.len();
                        index32(left + 1, "tree nodes")?;
                        layout.nodes.extend([GpuNode::default(); 2]);
                        layout.original_ids.extend([split.left, split.right]);
                        queue.push_back((split.left as usize, left));
                        queue.push_back((split.right as usize, left + 1));
                        let (value, cat_offset, cat_len) = match &split.decision {
                            Decision::LeF64(t) => (*t, 0, 0),
                            Decision::LtF32(t) => (f64::from(*t), 0, 0),
                            Decision::In(categories) => {
                                let offset = index32(layout.categories.len(), "categories")?;
                                layout.categories.extend_from_slice(categories);
                                (0.0, offset, index32(categories.len(), "categories")?)
                            }
                        };
                        GpuNode {
                            value,
                            feature: i32::try_from(split.feature).map_err(|_| {
                                GpuError::TooLarge {
                                    what: "feature index",
                                    got: split.feature as usize,
                                    limit: i32::MAX as usize,
                                }
                            })?,
                            left: left as u32,
                            flags: flags(&split.decision, split.missing, split.default_left),
                            cat_offset,
                            cat_len,
                            pad: 0,
                        }
                    }
                };
            }
        }
        Ok(layout)
    }

    /// Bytes the layout occupies on the device.
    pub fn device_bytes(&self) -> usize {
        self.nodes.len() * std::mem::size_of::<GpuNode>()
            + (self.roots.len() + self.categories.len().max(1)) * 4
    }
}

fn index32(n: usize, what: &'static str) -> Result<u32, GpuError> {
    u32::try_from(n).map_err(|_| GpuError::TooLarge {
        what,
        got: n,
        limit: u32::MAX as usize,
    })
}

/// Where a tree launch writes; each target is optional.
pub struct TreeTargets<'a> {
    /// The model-input matrix `[docs][stride]` (f32): tree `t`'s leaf goes to column `col0 + t`.
    pub inputs: Option<(&'a mut CudaSlice<f32>, usize, usize)>,
    /// `[docs][trees]` leaf node indices in the device layout; see [`GpuTrees::original_leaf_ids`].
    pub leaf_ids: Option<&'a mut CudaSlice<u32>>,
    /// `[docs]`: `base` plus the sum of the leaves (ensembles).
    pub sums: Option<&'a mut CudaSlice<f64>>,
    /// Added to every sum.
    pub base: f64,
}

/// Trees resident on the device.
pub struct GpuTrees {
    nodes: CudaSlice<GpuNode>,
    roots: CudaSlice<u32>,
    categories: CudaSlice<u32>,
    n_trees: usize,
    original_ids: Vec<u32>,
    bytes: usize,
}

/// Shared memory a block may use without opting in to more (48 KiB on every architecture).
const SHARED_BYTES_LIMIT: usize = 48 * 1024;
/// The most threads a block may have.
const MAX_BLOCK_THREADS: usize = 1024;
/// Documents per block when there are enough of them: a warp is 16 documents on two trees.
const MAX_DOCS_PER_BLOCK: usize = 16;
/// Tree lanes per document at most: thread 0 adds the lanes' partial sums one by one.
const MAX_TREE_LANES: usize = 256;

/// The block shape of a `trees_eval` launch over `n_docs` documents of `n_features` values and
/// `n_trees` trees: (documents per block, tree lanes per document), or `None` when one row does
/// not fit in shared memory.
///
/// Blocks are as large as the device allows (1 024 threads): the walks are a chain of dependent
/// node loads each, and more of them in flight per SM is what pays. Documents per block are a
/// power of two, at most 16, halved while the batch would give fewer blocks than half the SMs;
/// the lanes take the rest of the block, at most [`MAX_TREE_LANES`] and not (many) more than
/// the trees. Measured on an H200 (ME phase of `bench ranking`, µs): at 10 000 documents 16 × 64
/// took 405 (LightGBM peer model, 1 250 trees) / 112 (medium) / 321 (large) against 482 / 124 /
/// 384 for 16 × 16 and 499 / 135 / 374 for 8 × 128; at 2 500, 16 × 64 169 / 47 / 129 against
/// 202 / 47 / 130 for 8 × 128; at 1 000, 8 × 128 75 / 24 / 64 against 100 / 32 / 86 for the
/// 256-thread blocks of before.
fn launch_shape(
    n_docs: usize,
    n_features: usize,
    n_trees: usize,
    sm_count: usize,
) -> Option<(usize, usize)> {
    // The kernel keeps each row at an odd stride of doubles, and one partial sum per thread.
    let row_bytes = (n_features | 1) * 8;
    let fitting = (SHARED_BYTES_LIMIT - 8 * MAX_BLOCK_THREADS) / row_bytes;
    if fitting == 0 {
        return None;
    }
    let mut docs = MAX_DOCS_PER_BLOCK.min(1 << fitting.ilog2());
    while docs > 1 && 2 * n_docs.div_ceil(docs) < sm_count {
        docs /= 2;
    }
    let lanes = (MAX_BLOCK_THREADS / docs)
        .min(MAX_TREE_LANES)
        .min(n_trees.max(1).next_power_of_two());
    Some((docs, lanes))
}

impl GpuTrees {
    /// Copies a layout to the device.
    ///
    /// # Errors
    /// A driver error when allocation or the copy fails.
    pub fn upload(device: &GpuDevice, layout: &TreeLayout) -> Result<GpuTrees, GpuError> {
        device.check_fault("tree upload")?;
        let stream = device.stream();
        // A zero-length allocation is not a valid pointer: keep one unused category.
        let categories: &[u32] = if layout.categories.is_empty() {
            &[0]
        } else {
            &layout.categories
        };
        Ok(GpuTrees {
            nodes: stream.clone_htod(&layout.nodes).during("tree upload")?,
            roots: stream.clone_htod(&layout.roots).during("tree upload")?,
            categories: stream.clone_htod(categories).during("tree upload")?,
            n_trees: layout.roots.len(),
            original_ids: layout.original_ids.clone(),
            bytes: layout.device_bytes(),
        })
    }

    /// Bytes resident on the device.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of trees.
    pub fn n_trees(&self) -> usize {
        self.n_trees
    }

    /// Turns device-layout leaf indices (from [`TreeTargets::leaf_ids`]) into each tree's own
    /// node indices, the leaf ids of the CPU reference.
    pub fn original_leaf_ids(&self, ids: &mut [u32]) {
        for id in ids {
            *id = self.original_ids[*id as usize];
        }
    }

    /// Queues the evaluation of every tree on `n_docs` documents of `features` (row-major
    /// `[docs][n_features]` f64, on the device) on the device's stream.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when one document's features do not fit in a block's shared
    /// memory; a driver error when the launch fails.
    pub fn launch(
        &self,
        device: &GpuDevice,
        features: &CudaSlice<f64>,
        n_docs: usize,
        n_features: usize,
        targets: TreeTargets<'_>,
    ) -> Result<(), GpuError> {
        device.check_fault("tree evaluation")?;
        if n_docs == 0 || self.n_trees == 0 && targets.sums.is_none() {
            return Ok(());
        }
        let (docs_per_block, lanes) =
            launch_shape(n_docs, n_features, self.n_trees, device.sm_count()).ok_or(
                GpuError::TooLarge {
                    what: "feature vector bytes per document",
                    got: n_features * 8,
                    limit: SHARED_BYTES_LIMIT - 8 * MAX_BLOCK_THREADS,
                },
            )?;
        let shared = (docs_per_block * (n_features | 1) + docs_per_block * lanes) * 8;
        let config = LaunchConfig {
            grid_dim: (n_docs.div_ceil(docs_per_block) as u32, 1, 1),
            block_dim: (docs_per_block as u32, lanes as u32, 1),
            shared_mem_bytes: shared as u32,
        };
        let null: u64 = 0;
        let n_trees = index32(self.n_trees, "trees")?;
        let n_docs_u32 = index32(n_docs, "documents per launch")?;
        let n_features_u32 = index32(n_features, "features")?;
        let function = device.function(KernelModule::Trees, "trees_eval")?;
        let stream = device.stream();
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&self.nodes)
            .arg(&self.roots)
            .arg(&n_trees)
            .arg(&self.categories)
            .arg(features)
            .arg(&n_docs_u32)
            .arg(&n_features_u32);
        let (stride, col0) = match targets.inputs {
            Some((inputs, stride, col0)) => {
                launch.arg(inputs);
                (
                    index32(stride, "model inputs")?,
                    index32(col0, "model inputs")?,
                )
            }
            None => {
                launch.arg(&null);
                (0, 0)
            }
        };
        launch.arg(&stride).arg(&col0);
        match targets.leaf_ids {
            Some(buf) => launch.arg(buf),
            None => launch.arg(&null),
        };
        match targets.sums {
            Some(buf) => launch.arg(buf),
            None => launch.arg(&null),
        };
        launch.arg(&targets.base);
        // SAFETY: the arguments follow `trees_eval`'s signature in order and type: device
        // pointers to GpuNode/u32/u32/f64 arrays, u32 counts, the f32 input matrix (or a null
        // u64) with its u32 stride and first column, the u32 leaf-id and f64 sum outputs (or null
        // u64s) and the f64 base. Every buffer holds at least the elements the kernel indexes for
        // these counts (the caller sizes the targets for `n_docs`), and the shared memory is what
        // the kernel's launch-shape comment requires for this block shape.
        unsafe { launch.launch(config) }.during("trees_eval launch")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn blocks_are_large_and_small_batches_spread_over_the_sms() {
        // 132 SMs (H100 SXM, H200); 136 features (the LightGBM peer), 1 250 trees.
        let shape = |docs| launch_shape(docs, 136, 1250, 132).unwrap();
        assert_eq!(shape(10_000), (16, 64));
        assert_eq!(shape(2_500), (16, 64));
        assert_eq!(shape(1_000), (8, 128));
        assert_eq!(shape(100), (1, 256));
        assert_eq!(shape(1), (1, 256));
        // Few trees take few lanes; wide rows take fewer documents (5 rows of 1 001 fit).
        assert_eq!(launch_shape(10_000, 136, 10, 132), Some((16, 16)));
        assert_eq!(launch_shape(10_000, 1000, 1250, 132), Some((4, 256)));
        // A row larger than the shared memory left for rows does not fit.
        assert_eq!(launch_shape(10, 6_000, 10, 132), None);
        for docs in [1, 7, 100, 1_000, 10_000, 1_000_000] {
            let (d, l) = shape(docs);
            assert!(
                d.is_power_of_two() && d * l <= MAX_BLOCK_THREADS,
                "{docs}: {d} × {l}"
            );
        }
    }

    use super::*;
    use crate::rank::model::Split;

    fn split(feature: u32, threshold: f64, left: u32, right: u32) -> Node {
        Node::Split(Split {
            feature,
            decision: Decision::LeF64(threshold),
            missing: Missing::Nan,
            default_left: true,
            left,
            right,
        })
    }

    #[test]
    fn layout_places_children_side_by_side_and_keeps_leaf_ids() {
        // Original numbering puts the right child before the left one, and a leaf first.
        let tree = Tree {
            nodes: vec![
                split(0, 1.0, 2, 1),
                Node::Leaf(10.0),
                split(1, 2.0, 3, 4),
                Node::Leaf(20.0),
                Node::Leaf(30.0),
            ],
        };
        let layout = TreeLayout::build(&[tree.clone(), tree]).unwrap();
        assert_eq!(layout.roots, vec![0, 5]);
        let root = layout.nodes[0];
        assert_eq!((root.feature, root.left), (0, 1));
        // Left child of the root is original node 2 (a split), right is original node 1.
        assert_eq!(layout.original_ids[1..3], [2, 1]);
        assert_eq!(layout.nodes[2].feature, LEAF);
        assert_eq!(layout.nodes[2].value, 10.0);
        let inner = layout.nodes[1];
        assert_eq!(inner.left, 3);
        assert_eq!(layout.original_ids[3..5], [3, 4]);
        assert_eq!(root.flags, 0 | (2 << 2) | (1 << 4));
    }

    /// A tree over every decision rule, and documents whose leaves are worked out by hand.
    #[test]
    fn gpu_takes_the_hand_computed_leaves() {
        let Some(device) =
            crate::gpu::device::device_for_tests("gpu_takes_the_hand_computed_leaves")
        else {
            return;
        };
        let node = |feature, decision, missing, default_left, left, right| {
            Node::Split(Split {
                feature,
                decision,
                missing,
                default_left,
                left,
                right,
            })
        };
        // 0: f0 <= 0.5 (nan: default right) ? 1 : 2
        // 1: f32(f1) < f32(0.1) (none) ? 3 : 4
        // 2: f2 in {1, 5, 7} (zero: default left) ? 5 : 6
        let tree = Tree {
            nodes: vec![
                node(0, Decision::LeF64(0.5), Missing::Nan, false, 1, 2),
                node(1, Decision::LtF32(0.1), Missing::None, true, 3, 4),
                node(2, Decision::In(vec![1, 5, 7]), Missing::Zero, true, 5, 6),
                Node::Leaf(3.0),
                Node::Leaf(4.0),
                Node::Leaf(5.0),
                Node::Leaf(6.0),
            ],
        };
        let nan = f64::NAN;
        #[rustfmt::skip]
        let docs: [([f64; 3], u32); 9] = [
            ([0.5, 0.0, 0.0], 3),            // on the threshold goes left; 0 < 0.1
            ([0.5, 0.1, 0.0], 4),            // f32(0.1) is not below itself
            ([0.5, 0.099_999_999_9, 0.0], 4), // rounds to f32(0.1) first
            ([0.5, nan, 0.0], 3),            // missing none: NaN is 0
            ([nan, 0.0, 5.0], 5),            // missing nan, default right; 5 is in the set
            ([0.6, 0.0, 5.9], 5),            // categories truncate to 5
            ([0.6, 0.0, 2.0], 6),            // not in the set
            ([0.6, 0.0, -1.0], 6),           // negative: in no set
            ([0.6, 0.0, 1e-36], 5),          // missing zero: default left
        ];
        let features: Vec<f64> = docs.iter().flat_map(|(f, _)| *f).collect();
        let layout = TreeLayout::build(&[tree.clone(), tree]).unwrap();
        let trees = GpuTrees::upload(&device, &layout).unwrap();
        let stream = device.stream();
        let features_dev = stream.clone_htod(&features).unwrap();
        let n = docs.len();
        let mut inputs = stream.alloc_zeros::<f32>(n * 3).unwrap();
        let mut ids = stream.alloc_zeros::<u32>(n * 2).unwrap();
        let mut sums = stream.alloc_zeros::<f64>(n).unwrap();
        let targets = TreeTargets {
            inputs: Some((&mut inputs, 3, 1)),
            leaf_ids: Some(&mut ids),
            sums: Some(&mut sums),
            base: 0.25,
        };
        trees.launch(&device, &features_dev, n, 3, targets).unwrap();
        let mut ids = stream.clone_dtoh(&ids).unwrap();
        trees.original_leaf_ids(&mut ids);
        let sums = stream.clone_dtoh(&sums).unwrap();
        let inputs = stream.clone_dtoh(&inputs).unwrap();
        for (d, (_, leaf)) in docs.iter().enumerate() {
            assert_eq!(ids[2 * d..2 * d + 2], [*leaf, *leaf], "document {d}");
            assert_eq!(sums[d], 0.25 + 2.0 * f64::from(*leaf), "document {d}");
            assert_eq!(
                inputs[3 * d..3 * d + 3],
                [0.0, *leaf as f32, *leaf as f32],
                "document {d}"
            );
        }
    }

    #[test]
    fn categorical_splits_point_into_the_category_array() {
        let tree = Tree {
            nodes: vec![
                Node::Split(Split {
                    feature: 2,
                    decision: Decision::In(vec![1, 5, 7]),
                    missing: Missing::None,
                    default_left: false,
                    left: 1,
                    right: 2,
                }),
                Node::Leaf(1.0),
                Node::Leaf(2.0),
            ],
        };
        let layout = TreeLayout::build(&[tree]).unwrap();
        assert_eq!(layout.categories, vec![1, 5, 7]);
        assert_eq!(
            (layout.nodes[0].cat_offset, layout.nodes[0].cat_len),
            (0, 3)
        );
        assert_eq!(layout.nodes[0].flags, 2);
    }
}
