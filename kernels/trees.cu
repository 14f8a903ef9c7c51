// Decision trees on the GPU: tree inputs of a ranker and tree ensembles.
//
// Node layout (must match `rank::gpu::trees::GpuNode`, 32 bytes, little-endian):
//   double   value       threshold of a split (le_f64: as is; lt_f32: the f32 threshold widened
//                        exactly), or the leaf value of a leaf
//   int      feature     feature index of a split; -1 marks a leaf
//   unsigned left        index of the left child in the ensemble's node array; right = left + 1
//   unsigned flags       bits 0-1 decision (0 le_f64, 1 lt_f32, 2 in), bits 2-3 missing
//                        (0 none, 1 zero, 2 nan), bit 4 default_left
//   unsigned cat_offset  categorical splits: first category in `categories` (sorted ascending)
//   unsigned cat_len     categorical splits: number of categories
//   unsigned pad
// The decision rules are those of the CPU reference (`rank::cpu`), which the parity tests prove.

struct TreeNode {
    double value;
    int feature;
    unsigned left;
    unsigned flags;
    unsigned cat_offset;
    unsigned cat_len;
    unsigned pad;
};

#define DECISION_LE_F64 0u
#define DECISION_LT_F32 1u
#define DECISION_IN 2u
#define MISSING_NONE 0u
#define MISSING_ZERO 1u
#define MISSING_NAN 2u

// What LightGBM calls kZeroThreshold: the float 1e-35f, compared in double.
#define ZERO_THRESHOLD ((double)1e-35f)

// Whether a split sends x left. Mirrors `rank::cpu::goes_left` exactly: missing values first
// (none: NaN compared as 0; nan: NaN goes the default way; zero: NaN and |x| <= ZERO_THRESHOLD go
// the default way), then the comparison in f64 (le_f64), in f32 (lt_f32), or set membership of
// the category trunc(x), which exists when -1 < x < 2^31 (in).
__device__ __forceinline__ bool go_left(const TreeNode& n, double x, const unsigned* categories) {
    const unsigned decision = n.flags & 3u;
    const unsigned missing = (n.flags >> 2) & 3u;
    const bool default_left = (n.flags >> 4) & 1u;
    if (isnan(x)) {
        if (missing != MISSING_NONE) return default_left;
        x = 0.0;
    }
    if (missing == MISSING_ZERO && fabs(x) <= ZERO_THRESHOLD) return default_left;
    if (decision == DECISION_LE_F64) return x <= n.value;
    if (decision == DECISION_LT_F32) return (float)x < (float)n.value;
    if (!(x > -1.0 && x < 2147483648.0)) return false;
    const unsigned cat = (unsigned)(int)x;  // truncates toward zero: (-1, 0) is category 0
    unsigned lo = n.cat_offset, hi = n.cat_offset + n.cat_len;
    while (lo < hi) {
        const unsigned mid = (lo + hi) >> 1;
        const unsigned c = categories[mid];
        if (c == cat) return true;
        if (c < cat) lo = mid + 1; else hi = mid;
    }
    return false;
}

// Evaluates every tree for every document.
//
// Launch shape: grid (ceil(n_docs / blockDim.x)), block (docs_per_block, tree_lanes) with
// docs_per_block a power of two and docs_per_block * tree_lanes <= 1024; dynamic shared memory
// (docs_per_block * (n_features | 1) + docs_per_block * tree_lanes) * 8 bytes.
// Thread (x, y) takes document blockIdx.x * blockDim.x + x and trees y, y + tree_lanes, ...;
// a warp is docs_per_block consecutive documents on each of 32 / docs_per_block trees, so the
// documents read the same nodes while their paths agree. The block first stages its documents'
// feature rows in shared memory (coalesced), each row at an odd stride of doubles: a warp's
// documents reading one feature then fall in distinct banks (at 136 features, an even stride,
// they shared 2 banks; the walk of the LightGBM peer model took 7 % longer).
//
// Reads:  nodes, tree_roots[n_trees] (index of each tree's root), categories,
//         features[n_docs][n_features] (row-major f64).
// Writes (each optional, NULL to skip): inputs[n_docs][inputs_stride], columns inputs_col0 ..
//         inputs_col0 + n_trees (each tree's leaf as an f32 model input),
//         leaf_ids[n_docs][n_trees] (node index of each leaf reached),
//         sums[n_docs] = base + the leaves, summed per lane in tree order, lanes in lane order.
// Bounded to 1 024 threads so that the compiler keeps to the registers such a block needs on
// any architecture: the launch asks for blocks of that size (`rank::gpu::trees::launch_shape`).
extern "C" __global__ void __launch_bounds__(1024) trees_eval(
    const TreeNode* __restrict__ nodes,
    const unsigned* __restrict__ tree_roots,
    unsigned n_trees,
    const unsigned* __restrict__ categories,
    const double* __restrict__ features,
    unsigned n_docs,
    unsigned n_features,
    float* __restrict__ inputs,
    unsigned inputs_stride,
    unsigned inputs_col0,
    unsigned* __restrict__ leaf_ids,
    double* __restrict__ sums,
    double base)
{
    extern __shared__ double shared[];
    const unsigned docs_per_block = blockDim.x;
    const unsigned lanes = blockDim.y;
    const unsigned row_stride = n_features | 1u;
    double* doc_features = shared;                                   // [docs_per_block][row_stride]
    double* partial = shared + (size_t)docs_per_block * row_stride;  // [lanes][docs_per_block]

    const unsigned first_doc = blockIdx.x * docs_per_block;
    const unsigned docs_here = min(docs_per_block, n_docs - first_doc);
    const unsigned tid = threadIdx.y * docs_per_block + threadIdx.x;
    const unsigned threads = docs_per_block * lanes;
    const size_t row0 = (size_t)first_doc * n_features;
    for (unsigned i = tid; i < docs_here * n_features; i += threads) {
        doc_features[(i / n_features) * row_stride + i % n_features] = features[row0 + i];
    }
    __syncthreads();

    const unsigned local = threadIdx.x;
    const unsigned doc = first_doc + local;
    double sum = 0.0;
    if (local < docs_here) {
        const double* f = doc_features + (size_t)local * row_stride;
        for (unsigned t = threadIdx.y; t < n_trees; t += lanes) {
            unsigned i = tree_roots[t];
            TreeNode n = nodes[i];
            while (n.feature >= 0) {
                i = n.left + (go_left(n, f[n.feature], categories) ? 0u : 1u);
                n = nodes[i];
            }
            sum += n.value;
            if (inputs) inputs[(size_t)doc * inputs_stride + inputs_col0 + t] = (float)n.value;
            if (leaf_ids) leaf_ids[(size_t)doc * n_trees + t] = i;
        }
    }
    if (!sums) return;
    partial[threadIdx.y * docs_per_block + local] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && local < docs_here) {
        double total = base;
        for (unsigned l = 0; l < lanes; ++l) total += partial[l * docs_per_block + local];
        sums[doc] = total;
    }
}
