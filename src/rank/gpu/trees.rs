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

/// Which outputs a tree evaluation produces.
#[derive(Debug, Clone, Copy, Default)]
pub struct TreeOutputs {
    /// Each tree's leaf value per document (tree inputs of a ranker).
    pub leaf_values: bool,
    /// Each tree's leaf id per document (parity tests).
    pub leaf_ids: bool,
    /// `base` plus the sum of the leaves per document (ensembles).
    pub sums: bool,
}

/// What a tree evaluation returns; each field is `Some` when asked for.
#[derive(Debug, Clone, Default)]
pub struct TreeResults {
    /// `[docs][trees]`, row-major.
    pub leaf_values: Option<Vec<f64>>,
    /// `[docs][trees]`, row-major; ids index each tree's own node array, as on the CPU.
    pub leaf_ids: Option<Vec<u32>>,
    /// `[docs]`.
    pub sums: Option<Vec<f64>>,
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
/// Threads per block the launch aims for.
const BLOCK_THREADS: usize = 256;
/// Documents per block when the feature rows fit: one warp of documents per tree lane.
const MAX_DOCS_PER_BLOCK: usize = 32;

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

    /// Evaluates every tree on every document of `features` (row-major `[docs][n_features]`).
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when one document's features do not fit in a block's shared
    /// memory; a driver error when a copy or the launch fails.
    pub fn eval(
        &self,
        device: &GpuDevice,
        features: &[f64],
        n_features: usize,
        base: f64,
        outputs: TreeOutputs,
    ) -> Result<TreeResults, GpuError> {
        device.check_fault("tree evaluation")?;
        let n_docs = if n_features == 0 {
            0
        } else {
            features.len() / n_features
        };
        let mut results = TreeResults::default();
        if n_docs == 0 || self.n_trees == 0 {
            let cells = n_docs * self.n_trees;
            results.leaf_values = outputs.leaf_values.then(|| vec![0.0; cells]);
            results.leaf_ids = outputs.leaf_ids.then(|| vec![0; cells]);
            results.sums = outputs.sums.then(|| vec![base; n_docs]);
            return Ok(results);
        }
        let row_bytes = n_features * 8;
        // Each document's row plus one partial sum per lane must fit; fewer documents per block
        // for wide feature vectors.
        let docs_per_block = (SHARED_BYTES_LIMIT / (row_bytes + 8 * BLOCK_THREADS))
            .min(MAX_DOCS_PER_BLOCK)
            .min(n_docs);
        if docs_per_block == 0 {
            return Err(GpuError::TooLarge {
                what: "feature vector bytes per document",
                got: row_bytes,
                limit: SHARED_BYTES_LIMIT - 8 * BLOCK_THREADS,
            });
        }
        let lanes = (BLOCK_THREADS / docs_per_block).max(1);
        let shared = (docs_per_block * n_features + docs_per_block * lanes) * 8;
        let config = LaunchConfig {
            grid_dim: (n_docs.div_ceil(docs_per_block) as u32, 1, 1),
            block_dim: (docs_per_block as u32, lanes as u32, 1),
            shared_mem_bytes: shared as u32,
        };
        let stream = device.stream();
        let features_dev = stream.clone_htod(features).during("feature upload")?;
        let cells = n_docs * self.n_trees;
        let mut leaf_values = match outputs.leaf_values {
            true => Some(
                stream
                    .alloc_zeros::<f64>(cells)
                    .during("output allocation")?,
            ),
            false => None,
        };
        let mut leaf_ids = match outputs.leaf_ids {
            true => Some(
                stream
                    .alloc_zeros::<u32>(cells)
                    .during("output allocation")?,
            ),
            false => None,
        };
        let mut sums = match outputs.sums {
            true => Some(
                stream
                    .alloc_zeros::<f64>(n_docs)
                    .during("output allocation")?,
            ),
            false => None,
        };
        let null: u64 = 0;
        let n_trees = self.n_trees as u32;
        let n_docs_u32 = index32(n_docs, "documents per launch")?;
        let n_features_u32 = index32(n_features, "features")?;
        let function = device.function(KernelModule::Trees, "trees_eval")?;
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&self.nodes)
            .arg(&self.roots)
            .arg(&n_trees)
            .arg(&self.categories)
            .arg(&features_dev)
            .arg(&n_docs_u32)
            .arg(&n_features_u32);
        match leaf_values.as_mut() {
            Some(buf) => launch.arg(buf),
            None => launch.arg(&null),
        };
        match leaf_ids.as_mut() {
            Some(buf) => launch.arg(buf),
            None => launch.arg(&null),
        };
        match sums.as_mut() {
            Some(buf) => launch.arg(buf),
            None => launch.arg(&null),
        };
        launch.arg(&base);
        // SAFETY: the arguments follow `trees_eval`'s signature in order and type: device
        // pointers to GpuNode/u32/u32/f64 arrays (or a null u64 for a skipped output), u32 counts
        // and an f64 base; every buffer holds the counts passed with it, and the shared memory
        // size is the one the kernel's launch-shape comment requires for this block shape.
        unsafe { launch.launch(config) }.during("trees_eval launch")?;
        results.leaf_values = match leaf_values {
            Some(buf) => Some(stream.clone_dtoh(&buf).during("result download")?),
            None => None,
        };
        results.leaf_ids = match leaf_ids {
            Some(buf) => {
                let ids = stream.clone_dtoh(&buf).during("result download")?;
                Some(ids.iter().map(|&i| self.original_ids[i as usize]).collect())
            }
            None => None,
        };
        results.sums = match sums {
            Some(buf) => Some(stream.clone_dtoh(&buf).during("result download")?),
            None => None,
        };
        stream.synchronize().during("tree evaluation")?;
        Ok(results)
    }
}

#[cfg(test)]
mod tests {
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
        let outputs = TreeOutputs {
            leaf_values: true,
            leaf_ids: true,
            sums: true,
        };
        let results = trees.eval(&device, &features, 3, 0.25, outputs).unwrap();
        let ids = results.leaf_ids.unwrap();
        let sums = results.sums.unwrap();
        for (d, (_, leaf)) in docs.iter().enumerate() {
            assert_eq!(ids[2 * d..2 * d + 2], [*leaf, *leaf], "document {d}");
            assert_eq!(sums[d], 0.25 + 2.0 * f64::from(*leaf), "document {d}");
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
