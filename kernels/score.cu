// BM25 on the GPU. OR queries term at a time (Ding et al. WWW'09): BM25 contributions scattered
// into a dense f64 accumulator of one entry per document; AND's candidates after intersect.cu's
// merge-path steps searched in the other lists and scored in query order; then a top-k by
// per-block candidates that the host merges. Compiled with --fmad=false (src/gpu/module.rs) so
// every f32 operation rounds exactly as src/select/bm25.rs's TermScorer::contribution does on
// the CPU: scores are bit-identical.

// An accumulator entry no term has touched: -0.0. Adding a contribution c to -0.0 gives c
// exactly (as 0.0 + c does on the CPU), and even a +0.0 contribution turns it into +0.0, so
// "matched" never depends on the score's value.
#define UNTOUCHED_BITS 0x8000000000000000ull

// A term's BM25 contribution: exactly TermScorer::contribution, operation by operation.
// p: idf, k1, k1 + 1, 1 - b, b, avgdl (TermScorer::kernel_params).
__device__ __forceinline__ float contribution(const float* p, u32 tf_count, u32 dl_count) {
    const float tf = (float)tf_count;
    const float dl = (float)dl_count;
    const float norm = p[1] * (p[3] + p[4] * (dl / p[5]));
    return p[0] * ((tf * p[2]) / (tf + norm));
}

// score_fill: marks every document untouched.
// Launch: any 1-D grid, grid-stride over n_docs; one thread per accumulator entry.
// Writes: acc[0..n_docs) = -0.0.
extern "C" __global__ void score_fill(double* acc, u32 n_docs) {
    for (u64 d = (u64)blockIdx.x * blockDim.x + threadIdx.x; d < n_docs; d += (u64)gridDim.x * blockDim.x) {
        acc[d] = __longlong_as_double((long long)UNTOUCHED_BITS);
    }
}

// score_term: adds one term's BM25 contributions to the accumulator.
// Launch: any 1-D grid, grid-stride over df; one thread per posting. One launch per query term,
// in the query's term order, on one stream: each document's sum is built in that order.
// Reads:  docs, tfs  the term's decoded postings (df each; docIDs distinct, so no two threads
//                    of a launch touch one entry and no atomics are needed)
//         doc_len    scoring length of every document
//         idf .. avgdl  TermScorer's fields for this term and query (f32)
// Writes: acc[docs[p]] += (double)contribution, for every posting p.
extern "C" __global__ void score_term(const u32* docs, const u32* tfs, u32 df, const u32* doc_len,
                                      float idf, float k1, float k1_plus_1, float one_minus_b,
                                      float b, float avgdl, double* acc) {
    const float p[6] = {idf, k1, k1_plus_1, one_minus_b, b, avgdl};
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < df; i += (u64)gridDim.x * blockDim.x) {
        const u32 d = docs[i];
        acc[d] += (double)contribution(p, tfs[i], doc_len[d]);
    }
}

// score_and_found: AND's scores after intersect.cu's merge-path steps: the lists those steps did
// not cover are searched here (binary search per candidate, Ding et al. WWW'09), in the same
// launch as the scoring, and a candidate that every list holds gets its f32 contributions summed
// in f64 in query order from 0.0, as the CPU's AND sums them.
// Launch: any 1-D grid, grid-stride over na; one thread per candidate (list 0's posting i).
// Reads:  docs, tfs   the lists' decoded postings, in SvS order (list 0 the shortest), list s's
//                     df[s] postings starting at start[s] (docIDs increasing)
//         found       `steps` arrays of na entries, one per merge-path step in launch order:
//                     candidate i's position in the step's list, NOT_FOUND when it left the
//                     intersection at or before that step (so the last array says who is left)
//         step_of     per list s ≥ 1, the index of its step's array, or NOT_FOUND: list s is
//                     searched here (in query order, up to the first list that lacks
//                     the candidate)
//         order       order[q] = the list of the query's q-th distinct term
//         params      6 f32 per list (TermScorer::kernel_params), SvS order
//         doc_len     scoring length of every document
// Writes: out[i] = the score of candidate i if every list holds it, else -0.0 (untouched), for
//         i < na.
extern "C" __global__ void score_and_found(const u32* docs, const u32* tfs, const u32* start,
                                           const u32* df, const u32* found, const u32* step_of,
                                           u32 steps, const u32* order, const float* params,
                                           u32 lists, u32 na, const u32* doc_len, double* out) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < na; i += (u64)gridDim.x * blockDim.x) {
        const u32 doc = docs[start[0] + i];
        // One pass in query order, as the kernel before the merge-path steps: a searched list
        // is sought once, and the first list without the candidate ends its work.
        bool all = steps == 0 || found[(u64)(steps - 1) * na + i] != 0xffffffffu;
        const u32 dl = all ? doc_len[doc] : 0;
        double sum = 0.0;
        for (u32 q = 0; q < lists && all; ++q) {
            const u32 s = order[q];
            u32 at = (u32)i;
            if (s != 0 && step_of[s] != 0xffffffffu) {
                at = found[(u64)step_of[s] * na + i];
            } else if (s != 0) {
                at = lower_bound(docs + start[s], df[s], doc);
                all = at < df[s] && docs[start[s] + at] == doc;
            }
            if (all) {
                sum += (double)contribution(params + 6 * s, tfs[start[s] + at], dl);
            }
        }
        out[i] = all ? sum : __longlong_as_double((long long)UNTOUCHED_BITS);
    }
}

#define TOPK_CHUNK 2048u
#define TOPK_THREADS 256u
#define NO_DOC 0xffffffffu

// Whether (sa, da) ranks before (sb, db): higher score, ties by smaller docID.
__device__ __forceinline__ bool ranks_before(double sa, u32 da, double sb, u32 db) {
    return sa > sb || (sa == sb && da < db);
}

// score_block_topk: per-block candidates for top-k.
// Launch: grid (ceil(n_docs / 2048), 1, 1), block (256, 1, 1), no dynamic shared memory (static:
// 2048 f64 + 2048 u32 = 24 KiB); block g takes entries g*2048 .. g*2048+2048, sorts them best
// first (bitonic sort in shared memory; untouched entries last) and writes its first `keep`.
// Reads:  acc[0..n_docs)  scores, -0.0 where untouched
//         ids             NULL: entry e is document e; else entry e is document ids[e], in any
//                         order (ties break by comparing docIDs). A further pass reads an earlier
//                         pass's candidates this way: their empty slots (-infinity, NO_DOC) are
//                         not untouched, rank last, and come out as empty slots again.
// Writes: out_scores[g*keep + r], out_docs[g*keep + r] for r < keep (keep <= 2048); a slot
//         without a matched document holds NO_DOC and -infinity.
// The host merges the candidates: every document of the top-k is among its block's best k.
extern "C" __global__ void score_block_topk(const double* acc, const u32* ids, u32 n_docs,
                                            u32 keep, double* out_scores, u32* out_docs) {
    __shared__ double s[TOPK_CHUNK];
    __shared__ u32 d[TOPK_CHUNK];
    const u32 start = blockIdx.x * TOPK_CHUNK;
    for (u32 t = threadIdx.x; t < TOPK_CHUNK; t += blockDim.x) {
        const u32 doc = start + t;
        const double v = doc < n_docs ? acc[doc] : 0.0;
        const bool matched =
            doc < n_docs && (u64)__double_as_longlong(v) != UNTOUCHED_BITS;
        s[t] = matched ? v : -__longlong_as_double(0x7ff0000000000000ll);
        d[t] = matched ? (ids ? ids[doc] : doc) : NO_DOC;
    }
    __syncthreads();
    for (u32 size = 2; size <= TOPK_CHUNK; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 t = threadIdx.x; t < TOPK_CHUNK; t += blockDim.x) {
                const u32 partner = t ^ stride;
                if (partner > t) {
                    const bool forward = (t & size) == 0;
                    const bool swap = forward ? ranks_before(s[partner], d[partner], s[t], d[t])
                                              : ranks_before(s[t], d[t], s[partner], d[partner]);
                    if (swap) {
                        const double ts = s[t];
                        const u32 td = d[t];
                        s[t] = s[partner];
                        d[t] = d[partner];
                        s[partner] = ts;
                        d[partner] = td;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (u32 r = threadIdx.x; r < keep; r += blockDim.x) {
        out_scores[blockIdx.x * keep + r] = s[r];
        out_docs[blockIdx.x * keep + r] = d[r];
    }
}

// Entries per thread in score_block_topk_warp (TOPK_CHUNK / TOPK_THREADS).
#define TOPK_PER_THREAD 8u
#define TOPK_WARPS (TOPK_THREADS / 32u)

// The warp's best `keep` (<= 32) of the 32 x 8 entries its lanes hold in s/d (consumed as they
// are picked), best first, into out_s/out_d by lane 0: `keep` rounds of a shuffle arg-max. A
// matched document is in one entry, found by its docID; unmatched entries (all -infinity,
// NO_DOC) tie, and a round may consume one in each of several lanes: every entry left is then
// unmatched too, so the output is the same.
__device__ __forceinline__ void warp_top(double (&s)[TOPK_PER_THREAD], u32 (&d)[TOPK_PER_THREAD],
                                         u32 keep, double* out_s, u32* out_d) {
    const u32 lane = threadIdx.x & 31u;
    for (u32 r = 0; r < keep; ++r) {
        double bs = s[0];
        u32 bd = d[0];
#pragma unroll
        for (u32 i = 1; i < TOPK_PER_THREAD; ++i) {
            if (ranks_before(s[i], d[i], bs, bd)) {
                bs = s[i];
                bd = d[i];
            }
        }
        double ws = bs;
        u32 wd = bd;
#pragma unroll
        for (u32 offset = 16; offset > 0; offset >>= 1) {
            const double os = __shfl_xor_sync(0xffffffffu, ws, offset);
            const u32 od = __shfl_xor_sync(0xffffffffu, wd, offset);
            if (ranks_before(os, od, ws, wd)) {
                ws = os;
                wd = od;
            }
        }
        if (bd == wd) {
            bool taken = false;
#pragma unroll
            for (u32 i = 0; i < TOPK_PER_THREAD; ++i) {
                if (!taken && d[i] == wd) {
                    s[i] = -__longlong_as_double(0x7ff0000000000000ll);
                    d[i] = NO_DOC;
                    taken = true;
                }
            }
        }
        if (lane == 0) {
            out_s[r] = ws;
            out_d[r] = wd;
        }
    }
}

// score_block_topk_warp: score_block_topk's contract for keep <= 32, without sorting the block.
// Launch: as score_block_topk: grid (ceil(n_docs / 2048), 1, 1), block (256, 1, 1), static shared
// memory 8 x 32 candidates (3 KiB).
// Reads, writes: as score_block_topk (slot r of block g is the block's r-th best, best first).
// Each warp picks its best `keep` of its 256 entries (8 per lane, in registers), then warp 0
// picks the block's best `keep` of those 8 x keep candidates: 2 x keep shuffle arg-max rounds
// and one barrier, where the bitonic sort takes 66 barrier stages whatever `keep` is.
extern "C" __global__ void score_block_topk_warp(const double* acc, const u32* ids, u32 n_docs,
                                                 u32 keep, double* out_scores, u32* out_docs) {
    __shared__ double cs[TOPK_WARPS * 32u];
    __shared__ u32 cd[TOPK_WARPS * 32u];
    const u32 warp = threadIdx.x / 32u;
    const u32 lane = threadIdx.x & 31u;
    const double none = -__longlong_as_double(0x7ff0000000000000ll);
    double s[TOPK_PER_THREAD];
    u32 d[TOPK_PER_THREAD];
#pragma unroll
    for (u32 i = 0; i < TOPK_PER_THREAD; ++i) {
        // Coalesced: entry i of every lane of a warp is 32 consecutive entries.
        const u32 doc = blockIdx.x * TOPK_CHUNK + warp * (32u * TOPK_PER_THREAD) + i * 32u + lane;
        const double v = doc < n_docs ? acc[doc] : 0.0;
        const bool matched = doc < n_docs && (u64)__double_as_longlong(v) != UNTOUCHED_BITS;
        s[i] = matched ? v : none;
        d[i] = matched ? (ids ? ids[doc] : doc) : NO_DOC;
    }
    warp_top(s, d, keep, cs + warp * keep, cd + warp * keep);
    __syncthreads();
    if (warp != 0) {
        return;
    }
#pragma unroll
    for (u32 i = 0; i < TOPK_PER_THREAD; ++i) {
        const u32 c = lane * TOPK_PER_THREAD + i;
        const bool have = c < TOPK_WARPS * keep;
        s[i] = have ? cs[c] : none;
        d[i] = have ? cd[c] : NO_DOC;
    }
    warp_top(s, d, keep, out_scores + blockIdx.x * keep, out_docs + blockIdx.x * keep);
}
