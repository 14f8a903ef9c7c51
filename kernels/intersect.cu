// AND on the GPU, one intersection step at a time (SvS: the shortest list's postings are the
// candidates, and every step finds them in one more list, shortest first). A step writes, for
// each candidate, where the list holds it (or NOT_FOUND); a candidate missing from one list stays
// NOT_FOUND in every later step, so the last step's array says which candidates survived.
// Scoring (score.cu's score_and_found) reads those positions; when the scheduler hands the rest
// of the query to the CPU, intersect_gather packs the survivors for it.
//
// Two ways to run a step, chosen per step by the host from the list's length
// (src/select/gpu/and.rs, select::schedule::DEFAULT_MERGE_PATH_MIN_DF says why):
// - intersect_merge_path: the merge of the candidates and the list is cut into tiles of equal
//   length (merge path: every block does the same work however the values fall), and each block
//   finds its candidates in its slice of the list, staged in shared memory. Every posting of
//   both lists is read once, coalesced, by as many blocks as the merge has tiles.
// - intersect_search: a binary search per candidate over the whole list (Ding et al. WWW'09),
//   log2(n) dependent reads per candidate. When the GPU finishes the query, score.cu's
//   score_and_found runs these searches itself; this kernel serves a hand-over to the CPU.


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
