// OR queries term at a time (Ding et al. WWW'09): BM25 contributions scattered into a dense f64
// accumulator of one entry per document, then a top-k by per-block candidates that the host
// merges. Compiled with --fmad=false (src/gpu/module.rs) so every f32 operation rounds exactly
// as src/select/bm25.rs's TermScorer::contribution does on the CPU: scores are bit-identical.

typedef unsigned int u32;
typedef unsigned long long u64;

// An accumulator entry no term has touched: -0.0. Adding a contribution c to -0.0 gives c
// exactly (as 0.0 + c does on the CPU), and even a +0.0 contribution turns it into +0.0, so
// "matched" never depends on the score's value.
#define UNTOUCHED_BITS 0x8000000000000000ull

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
    for (u64 p = (u64)blockIdx.x * blockDim.x + threadIdx.x; p < df; p += (u64)gridDim.x * blockDim.x) {
        const u32 d = docs[p];
        const float tf = (float)tfs[p];
        const float dl = (float)doc_len[d];
        // Exactly TermScorer::contribution, operation by operation.
        const float norm = k1 * (one_minus_b + b * (dl / avgdl));
        const float c = idf * ((tf * k1_plus_1) / (tf + norm));
        acc[d] += (double)c;
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
// 2048 f64 + 2048 u32 = 24 KiB); block g takes documents g*2048 .. g*2048+2048, sorts them best
// first (bitonic sort in shared memory; untouched documents last) and writes its first `keep`.
// Reads:  acc[0..n_docs)
// Writes: out_scores[g*keep + r], out_docs[g*keep + r] for r < keep (keep <= 2048); a slot
//         without a matched document holds NO_DOC and -infinity.
// The host merges the candidates: every document of the top-k is among its block's best k.
extern "C" __global__ void score_block_topk(const double* acc, u32 n_docs, u32 keep,
                                            double* out_scores, u32* out_docs) {
    __shared__ double s[TOPK_CHUNK];
    __shared__ u32 d[TOPK_CHUNK];
    const u32 start = blockIdx.x * TOPK_CHUNK;
    for (u32 t = threadIdx.x; t < TOPK_CHUNK; t += blockDim.x) {
        const u32 doc = start + t;
        const double v = doc < n_docs ? acc[doc] : 0.0;
        const bool matched =
            doc < n_docs && (u64)__double_as_longlong(v) != UNTOUCHED_BITS;
        s[t] = matched ? v : -__longlong_as_double(0x7ff0000000000000ll);
        d[t] = matched ? doc : NO_DOC;
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
