// AND on the GPU, one intersection step at a time (SvS: the shortest list's postings are the
// candidates, and every step finds them in one more list, shortest first). A step writes, for
// each candidate, where the list's decoded postings hold it (or NOT_FOUND); a candidate missing
// from one list stays NOT_FOUND in every later step, so the last step's array says which
// candidates survived.
// Scoring (score.cu's score_and_found) reads those positions; when the scheduler hands the rest
// of the query to the CPU, intersect_gather packs the survivors for it.
//
// Three ways to run a step, chosen per step by the host from the list's length
// (src/select/gpu/and.rs; select::schedule::DEFAULT_MERGE_PATH_MIN_DF and
// DEFAULT_SKIP_ENTRY_MIN_RATIO say why):
// - intersect_merge_path: the merge of the candidates and the list is cut into tiles of equal
//   length (merge path: every block does the same work however the values fall), and each block
//   finds its candidates in its slice of the list, staged in shared memory. Every posting of
//   both lists is read once, coalesced, by as many blocks as the merge has tiles.
// - intersect_search: a binary search per candidate over the whole list (Ding et al. WWW'09),
//   log2(n) dependent reads per candidate. When the GPU finishes the query, score.cu's
//   score_and_found runs these searches itself; this kernel serves a hand-over to the CPU.
// - skip entries, for a list much longer than the candidates (Ding et al. WWW'09): the list is
//   not decoded whole; intersect_skip_blocks finds each candidate's block by binary search over
//   the list's block bases (its skip entries) and builds a decode table of those blocks only,
//   which pfor.cu / ef.cu decode, then intersect_skip_seek finds each candidate in its block.
//   At most one block per candidate is decoded, where the list holds df / 128 blocks.


#define NOT_FOUND 0xffffffffu
// Merge elements (candidates + list postings) per intersect_merge_path block, and its threads.
#define MERGE_TILE 2048u
#define MERGE_THREADS 256u

// How many of a's elements are among the first d of the merge of a[0..na) and b[0..nb) (both
// increasing), ties taking a's element first: the merge path's crossing of diagonal d.
__device__ __forceinline__ u32 merge_split(const u32* a, u32 na, const u32* b, u32 nb, u32 d) {
    u32 lo = d > nb ? d - nb : 0;
    u32 hi = d < na ? d : na;
    while (lo < hi) {
        const u32 mid = lo + (hi - lo) / 2;
        if (a[mid] <= b[d - 1 - mid]) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// intersect_merge_path: one SvS step by merge path.
// Launch: grid (ceil((na + nb) / 2048), 1, 1), block (256, 1, 1), static shared memory 2 049 u32;
// the host keeps na + nb below 2^32. Block g takes the merge's elements g*2048 .. g*2048+2048:
// candidates a[a0..a1) and postings b[b0..b1) (its two merge-path splits), stages b[b0..b1] (one
// past the slice, or a sentinel at the end of b) in shared memory and looks each of its
// candidates up there by binary search. With ties taking a's element first, every posting merged
// before a candidate is smaller than it and the next one is not, so the candidate's equal, if b
// has one, is in that staged slice.
// Reads:  a      the candidates' docIDs, increasing (the shortest list's decoded postings)
//         alive  NULL, or the previous step's output: candidate i is out when alive[i] == NOT_FOUND
//         b      the step's list, decoded docIDs, increasing
// Writes: found[i] = j when alive and b[j] == a[i], else NOT_FOUND, for every i < na.
extern "C" __global__ void intersect_merge_path(const u32* a, const u32* alive, u32 na,
                                                const u32* b, u32 nb, u32* found) {
    __shared__ u32 sb[MERGE_TILE + 1];
    __shared__ u32 split[2];
    const u32 d0 = blockIdx.x * MERGE_TILE;
    const u32 d1 = min(d0 + MERGE_TILE, na + nb);
    if (threadIdx.x < 2) {
        split[threadIdx.x] = merge_split(a, na, b, nb, threadIdx.x == 0 ? d0 : d1);
    }
    __syncthreads();
    const u32 a0 = split[0];
    const u32 a1 = split[1];
    const u32 b0 = d0 - a0;
    const u32 b1 = d1 - a1;
    // b[b0..b1] with the entry after the slice; past b's end, a value no docID takes.
    for (u32 t = threadIdx.x; t <= b1 - b0; t += blockDim.x) {
        sb[t] = b0 + t < nb ? b[b0 + t] : NOT_FOUND;
    }
    __syncthreads();
    const u32 staged = b1 - b0 + 1;
    for (u32 i = a0 + threadIdx.x; i < a1; i += blockDim.x) {
        u32 out = NOT_FOUND;
        if (alive == 0 || alive[i] != NOT_FOUND) {
            const u32 doc = a[i];
            const u32 j = lower_bound(sb, staged, doc);
            if (j < staged && sb[j] == doc) {
                out = b0 + j;
            }
        }
        found[i] = out;
    }
}

// intersect_search: one SvS step by binary search over the whole list.
// Launch: any 1-D grid, grid-stride over na; one thread per candidate.
// Reads, writes: as intersect_merge_path.
extern "C" __global__ void intersect_search(const u32* a, const u32* alive, u32 na,
                                            const u32* b, u32 nb, u32* found) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < na;
         i += (u64)gridDim.x * blockDim.x) {
        u32 out = NOT_FOUND;
        if (alive == 0 || alive[i] != NOT_FOUND) {
            const u32 doc = a[i];
            const u32 j = lower_bound(b, nb, doc);
            if (j < nb && b[j] == doc) {
                out = j;
            }
        }
        found[i] = out;
    }
}

// The block of a list that may hold doc: the last j < n_blocks with skips[j].y (its base, the
// previous block's last docID + 1) <= doc. Block 0's base is 0, so there always is one.
__device__ __forceinline__ u32 skip_block(const BlockDesc* skips, u32 n_blocks, u32 doc) {
    u32 lo = 1;
    u32 hi = n_blocks;
    while (lo < hi) {
        const u32 mid = lo + (hi - lo) / 2;
        if (skips[mid].y <= doc) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo - 1;
}

// intersect_skip_blocks: a skip-entry step's first half: which block of the step's list may hold
// each candidate, and the decode table of those blocks. Block j goes to the table once, at the
// slot of the first candidate at or above its base (o below: a binary search over the
// candidates), so the table depends only on which candidates are alive, not on thread order;
// every alive candidate of block j writes the same descriptor there.
// Launch: any 1-D grid, grid-stride over na; one thread per candidate.
// Reads:  a, alive, na  as intersect_search
//         skips     the list's n_blocks descriptors (BlockDesc, packing.cuh; .y: a block's base)
//         last      the list's last docID (a candidate above it is in no block)
// Writes: slot_of[i] = o for each alive candidate i with a[i] <= last (o <= i: the first
//         candidate >= base of the block j that may hold a[i]), else NOT_FOUND;
//         table[o] = skips[j] for each such i (the entries no block takes keep their zeros).
// Preconditions: table[0..na) zeroed before the launch (a descriptor of 0 postings decodes
// nothing: the decode kernels read no word of it but the descriptor).
extern "C" __global__ void intersect_skip_blocks(const u32* a, const u32* alive, u32 na,
                                                 const BlockDesc* skips, u32 n_blocks, u32 last,
                                                 u32* slot_of, BlockDesc* table) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < na;
         i += (u64)gridDim.x * blockDim.x) {
        u32 slot = NOT_FOUND;
        const u32 doc = a[i];
        if ((alive == 0 || alive[i] != NOT_FOUND) && doc <= last) {
            const u32 j = skip_block(skips, n_blocks, doc);
            slot = lower_bound(a, (u32)i, skips[j].y);
            table[slot] = skips[j];
        }
        slot_of[i] = slot;
    }
}

// intersect_skip_seek: a skip-entry step's second half, once the table intersect_skip_blocks
// wrote is decoded (slot o's block at docs[o*128 .. o*128 + n]): each candidate sought in its
// block, and the blocks decoded counted for the host.
// Launch: grid (ceil(na / 256), 1, 1), block (256, 1, 1): one thread per candidate, no grid
// stride (every thread of a block takes part in its count).
// Reads:  a, na     as intersect_search
//         slot_of   intersect_skip_blocks's output
//         table     its table of na descriptors (n, the block's postings: .w & 0xff; 0 if none)
//         docs      the decoded table: slot o's postings at docs[o*128 ..]
// Writes: found[i] = o*128 + k when docs[o*128 + k] == a[i] (o = slot_of[i]), else NOT_FOUND;
//         decoded[blockIdx.x] = the table entries among this block's candidates' slots that hold
//         a block (summed over the grid: the blocks decoded; written through a host mapping).
extern "C" __global__ void intersect_skip_seek(const u32* a, u32 na, const u32* slot_of,
                                               const BlockDesc* table, const u32* docs,
                                               u32* found, u32* decoded) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    bool holds_block = false;
    if (i < na) {
        holds_block = (table[i].w & 0xffu) != 0;
        u32 out = NOT_FOUND;
        const u32 o = slot_of[i];
        if (o != NOT_FOUND) {
            const u32* block = docs + (u64)o * BLOCK_LEN;
            const u32 n = table[o].w & 0xffu;
            const u32 k = lower_bound(block, n, a[i]);
            if (k < n && block[k] == a[i]) {
                out = o * BLOCK_LEN + k;
            }
        }
        found[i] = out;
    }
    const int blocks = __syncthreads_count(holds_block);
    if (threadIdx.x == 0) {
        decoded[blockIdx.x] = (u32)blocks;
    }
}

// intersect_gather: the survivors of the GPU's steps, packed for the CPU to finish the query.
// Launch: any 1-D grid of whole warps, grid-stride over na; one thread per candidate. Rows are
// claimed a warp at a time (one atomic per warp), so their order is not the candidates' order:
// the host sorts them by docID.
// Reads:  a      the candidates' docIDs (the shortest list's decoded postings, list 0)
//         tfs    every list's decoded term frequencies; list s's start at start[s]
//         found  steps - 1 arrays of na entries (step s's at found + (s - 1) * na): candidate i's
//                position in list s, NOT_FOUND when it left the intersection at or before step s
//         steps  lists intersected (1: every candidate survives)
// Writes: out[0] = rows written; row r at out[1 + r * (1 + steps)]: the docID, then its tf in
//         lists 0 .. steps - 1. out[0] must be 0 before the launch.
extern "C" __global__ void intersect_gather(const u32* a, const u32* tfs, const u32* start,
                                            const u32* found, u32 steps, u32 na, u32* out) {
    const u32 lane = threadIdx.x & 31u;
    // Whole warps loop together, so the ballot below sees every lane.
    for (u64 base = (u64)blockIdx.x * blockDim.x; base < na; base += (u64)gridDim.x * blockDim.x) {
        const u64 i = base + threadIdx.x;
        const bool keep =
            i < na && (steps == 1 || found[(u64)(steps - 2) * na + i] != NOT_FOUND);
        const u32 ballot = __ballot_sync(0xffffffffu, keep);
        u32 first = 0;
        if (lane == 0 && ballot != 0) {
            first = atomicAdd(out, (u32)__popc(ballot));
        }
        first = __shfl_sync(0xffffffffu, first, 0);
        if (keep) {
            const u32 r = first + (u32)__popc(ballot & ((1u << lane) - 1u));
            u32* row = out + 1 + (u64)r * (1 + steps);
            row[0] = a[i];
            row[1] = tfs[start[0] + i];
            for (u32 s = 1; s < steps; ++s) {
                row[1 + s] = tfs[start[s] + found[(u64)(s - 1) * na + i]];
            }
        }
    }
}
