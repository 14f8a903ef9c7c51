// Feature extraction (FE) on the GPU: every catalogue feature of a batch of hit documents, as
// the CPU's state machines (`rank::fe::fsm`) compute them (after Tadros 2015, §3.3: the
// streams of a document are independent, so each gets its own thread, and the per-document
// aggregates and BM25F follow once every stream is done).
//
// Flattened hit layout (built by `rank::gpu::layout::FeLayout`; all indices u32):
//   stream s = doc * FE_STREAMS + slot, slot in catalogue order (title, body, anchor, url); a
//   catalogue stream absent from the document is a stream of length 0 without phrases, and
//   streams outside the catalogue are not in the layout (they publish nothing).
//   stream_phrases[n_docs * FE_STREAMS + 1]  stream s's phrases are stream_phrases[s] ..
//                                            stream_phrases[s + 1] (only non-empty phrases: the
//                                            CPU ignores empty ones)
//   phrase_hits[n_phrases + 1]               phrase p's hits are phrase_hits[p] .. phrase_hits[p + 1]
//   hits[n_hits]                             (term, position), in position order along a stream
//   stream_lengths[n_docs * FE_STREAMS]      each stream's length in tokens
//   idf[terms]                               the query's idf
// The hits were validated on the host (term < terms <= FE_MAX_TERMS, position < length,
// positions strictly increasing along the stream), so the walk trusts them.
//
// Output: out[n_docs][FE_CATALOGUE] (row-major f64) in catalogue order: per stream slot, the
// FE_STREAM_FEATURES features of `StreamFeature` at columns slot * FE_STREAM_FEATURES + f, then
// the FE_DOC_FEATURES features of `DocFeature` from column FE_DOC0.
//
// Arithmetic: counts, positions and windows are integers, so they are exact whatever the walk's
// order. BM25 and BM25F are f64 with the CPU's operation order; the one product that feeds an
// addition (the BM25 length norm, added to tf) is `__dmul_rn`, which is never contracted into an
// FMA, so every value is bit-identical with the CPU's.

#define FE_STREAMS 4
#define FE_STREAM_FEATURES 26
#define FE_DOC_FEATURES 15
#define FE_DOC0 (FE_STREAMS * FE_STREAM_FEATURES)
#define FE_CATALOGUE (FE_DOC0 + FE_DOC_FEATURES)
#define FE_MAX_TERMS 64
#define FE_NONE 0xffffffffu
#define FE_FULL_WARP 0xffffffffu

// `StreamFeature` (rank::fe::catalogue), in declaration order.
#define SF_LENGTH 0
#define SF_OCCURRENCES_SUM 1
#define SF_OCCURRENCES_MIN 2
#define SF_OCCURRENCES_MAX 3
#define SF_OCCURRENCES_MEAN 4
#define SF_OCCURRENCES_DENSITY 5
#define SF_FIRST_OCCURRENCE_MIN 6
#define SF_FIRST_OCCURRENCE_MAX 7
#define SF_FIRST_OCCURRENCE_MIN_NORM 8
#define SF_LAST_OCCURRENCE_MIN 9
#define SF_LAST_OCCURRENCE_MAX 10
#define SF_LAST_OCCURRENCE_MAX_NORM 11
#define SF_DISTINCT_TERMS 12
#define SF_DISTINCT_TERMS_FRACTION 13
#define SF_MATCHED_IDF_SUM 14
#define SF_MATCHED_IDF_FRACTION 15
#define SF_IN_ORDER_BIGRAMS 16
#define SF_IN_ORDER_LONGEST_RUN 17
#define SF_IN_ORDER_FULL_MATCHES 18
#define SF_WINDOW_STREAM 19
#define SF_WINDOW_PHRASE 20
#define SF_PHRASES_MATCHED 21
#define SF_PHRASES_MAX_DISTINCT 22
#define SF_BM25 23
#define SF_BM25_NORM 24
#define SF_BM25F 25

// `DocFeature` (rank::fe::catalogue), in declaration order.
#define DF_LENGTH 0
#define DF_OCCURRENCES_SUM 1
#define DF_OCCURRENCES_MIN 2
#define DF_OCCURRENCES_MAX 3
#define DF_DISTINCT_TERMS 4
#define DF_DISTINCT_TERMS_FRACTION 5
#define DF_MATCHED_IDF_SUM 6
#define DF_MATCHED_IDF_FRACTION 7
#define DF_STREAMS_MATCHED 8
#define DF_IN_ORDER_BIGRAMS 9
#define DF_IN_ORDER_LONGEST_RUN 10
#define DF_IN_ORDER_FULL_MATCHES 11
#define DF_BM25F 12
#define DF_BM25F_NORM 13
#define DF_QUERY_TERMS 14

// Query-level values and constants (must match `rank::gpu::layout::FeParams`, 136 bytes). The
// constants come from `rank::fe` (BM25_K1, BM25_B, BM25F_K1, BM25F_WEIGHTS, BM25F_B), so they
// are defined once.
struct FeParams {
    double idf_sum;          // Σ idf, summed on the host as the CPU sums it
    double avg_length[4];    // per slot; 0 when not given (no length normalisation)
    double bm25_k1;
    double bm25_b;
    double bm25f_k1;
    double bm25f_weight[4];  // per slot
    double bm25f_b[4];       // per slot
    unsigned terms;          // Q <= FE_MAX_TERMS
    unsigned n_docs;
};

// `num / den`, or `otherwise` when `den` is not positive (the CPU's `ratio`).
__device__ __forceinline__ double fe_ratio(double num, double den, double otherwise) {
    return den > 0.0 ? num / den : otherwise;
}

// BM25's length factor `1 − b + b·len/avg_len`, 1 without an average length (the CPU's
// `Prepared::length_factor`, same operation order).
__device__ __forceinline__ double fe_length_factor(double avg, double b, unsigned length) {
    return avg > 0.0 ? 1.0 - b + b * (double)length / avg : 1.0;
}

// Per-term state of a stream's walk is held for FE_FEW_TERMS terms when the query has no more
// (most queries): every index into it is then a compile-time one after unrolling, so the arrays
// live in registers. For longer queries (up to FE_MAX_TERMS) they are indexed at run time and
// live in local memory, a dependent load per access: the walk of a long stream (hundreds of
// hits in a long body) then sets the kernel's time.
#define FE_FEW_TERMS 8

// a[i] (i < N).
template <unsigned N>
__device__ __forceinline__ unsigned fe_get(const unsigned (&a)[N], unsigned i) {
    if constexpr (N <= FE_FEW_TERMS) {
        unsigned v = 0;
#pragma unroll
        for (unsigned k = 0; k < N; ++k) v = i == k ? a[k] : v;
        return v;
    } else {
        return a[i];
    }
}

// a[i] = v (i < N).
template <unsigned N>
__device__ __forceinline__ void fe_set(unsigned (&a)[N], unsigned i, unsigned v) {
    if constexpr (N <= FE_FEW_TERMS) {
#pragma unroll
        for (unsigned k = 0; k < N; ++k) a[k] = i == k ? v : a[k];
    } else {
        a[i] = v;
    }
}

// The earliest latest-hit position over the terms in `terms` (all below N): where the smallest
// window that ends at the newest hit and covers those terms starts.
template <unsigned N>
__device__ __forceinline__ unsigned fe_window_start(unsigned long long terms, const unsigned (&last)[N]) {
    unsigned start = FE_NONE;
    if constexpr (N <= FE_FEW_TERMS) {
#pragma unroll
        for (unsigned k = 0; k < N; ++k) {
            if ((terms >> k) & 1ull) start = min(start, last[k]);
        }
    } else {
        while (terms) {
            const int t = __ffsll((long long)terms) - 1;
            terms &= terms - 1;
            start = min(start, last[t]);
        }
    }
    return start;
}

// Sums `v` of the FE_STREAMS lanes of this thread's document in slot order, as the CPU adds a
// document's streams one after another.
__device__ __forceinline__ double fe_sum_slots(double v) {
    double sum = 0.0;
    for (int k = 0; k < FE_STREAMS; ++k) sum += __shfl_sync(FE_FULL_WARP, v, k, FE_STREAMS);
    return sum;
}

// The body of `fe_extract` for queries of at most N terms (see FE_FEW_TERMS).
template <unsigned N>
__device__ __forceinline__ void fe_extract_terms(
    const unsigned* __restrict__ stream_phrases,
    const unsigned* __restrict__ phrase_hits,
    const uint2* __restrict__ hits,
    const unsigned* __restrict__ stream_lengths,
    const double* __restrict__ idf,
    const FeParams& p,
    double* __restrict__ out)
{
    const unsigned stream = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned doc = stream / FE_STREAMS;
    const unsigned slot = stream % FE_STREAMS;
    const bool valid = doc < p.n_docs;

    unsigned length = 0, phrase0 = 0, phrase1 = 0;
    if (valid) {
        length = stream_lengths[stream];
        phrase0 = stream_phrases[stream];
        phrase1 = stream_phrases[stream + 1];
    }

    // Occurrence family: count and latest position per term, valid for terms in `seen`.
    unsigned count[N];
    unsigned last[N];
    if constexpr (N <= FE_FEW_TERMS) {
        // Registers: every one is read by the selects, set or not.
#pragma unroll
        for (unsigned k = 0; k < N; ++k) count[k] = last[k] = 0;
    }
    unsigned long long seen = 0;
    unsigned distinct = 0, first_min = 0, first_max = 0, last_max = 0;
    // Window family: best span ending at a hit, over hits after the last newly matched term.
    unsigned window_stream = FE_NONE;
    // Phrase family: most distinct terms in one phrase and the best window among those phrases.
    unsigned best_phrase_terms = 0, best_phrase_window = FE_NONE;
    // In-order family.
    unsigned bigrams = 0, longest_run = 0, full_matches = 0;

    // The walk is a chain of dependent steps, one per hit, and the longest stream of the
    // batch (a long body) sets the kernel's time: its loads are issued ahead of their use, the
    // stream's next four hits (its phrases' hits lie back to back) and the next phrase's end.
    const unsigned stream_hits_end = phrase0 < phrase1 ? phrase_hits[phrase1] : 0;
    unsigned h = phrase0 < phrase1 ? phrase_hits[phrase0] : 0;
    const auto hit_at = [&](unsigned i) { return i < stream_hits_end ? hits[i] : make_uint2(0, 0); };
    uint2 ahead0 = hit_at(h), ahead1 = hit_at(h + 1), ahead2 = hit_at(h + 2), ahead3 = hit_at(h + 3);
    unsigned next_end = phrase0 < phrase1 ? phrase_hits[phrase0 + 1] : 0;
    for (unsigned ph = phrase0; ph < phrase1; ++ph) {
        const unsigned hit_end = next_end;
        if (ph + 1 < phrase1) next_end = phrase_hits[ph + 2];
        unsigned long long seen_phrase = 0;
        unsigned phrase_terms = 0, phrase_window = FE_NONE, run = 0;
        unsigned prev_term = FE_NONE, prev_position = FE_NONE;
        for (; h < hit_end; ++h) {
            const uint2 hit = ahead0;
            ahead0 = ahead1;
            ahead1 = ahead2;
            ahead2 = ahead3;
            ahead3 = hit_at(h + 4);
            const unsigned t = hit.x, position = hit.y;
            const unsigned long long bit = 1ull << t;
            if (!(seen & bit)) {
                // Positions increase, so the first new term gives the earliest first
                // occurrence and the latest new term the latest one.
                if (distinct == 0) first_min = position;
                first_max = position;
                ++distinct;
                seen |= bit;
                fe_set(count, t, 0u);
                window_stream = FE_NONE;
            }
            fe_set(count, t, fe_get(count, t) + 1);
            fe_set(last, t, position);
            last_max = position;
            if (!(seen_phrase & bit)) {
                seen_phrase |= bit;
                ++phrase_terms;
                phrase_window = FE_NONE;
            }
            window_stream = min(window_stream, position - fe_window_start(seen, last) + 1);
            phrase_window = min(phrase_window, position - fe_window_start(seen_phrase, last) + 1);

            // A run grows when the hit is (previous term + 1, previous position + 1) in the same
            // phrase; the phrase's first hit has no previous one (FE_NONE + 1 would wrap to 0).
            if (prev_term != FE_NONE && prev_term + 1 == t && prev_position + 1 == position) {
                ++bigrams;
                ++run;
            } else {
                run = 1;
            }
            longest_run = max(longest_run, run);
            // A run only climbs through consecutive terms, so it reaches Q only from term 0.
            if (run == p.terms) ++full_matches;
            prev_term = t;
            prev_position = position;
        }
        if (phrase_terms > best_phrase_terms) {
            best_phrase_terms = phrase_terms;
            best_phrase_window = phrase_window;
        } else if (phrase_terms == best_phrase_terms) {
            best_phrase_window = min(best_phrase_window, phrase_window);
        }
    }
    const unsigned last_min = fe_window_start(seen, last);

    // Per-term pass: the stream's sums, and (slot-0 lane) the document's.
    const double avg = p.avg_length[slot];
    // The only product that feeds an addition (tf + norm): rounded on its own, as on the CPU.
    const double bm25_norm = __dmul_rn(fe_length_factor(avg, p.bm25_b, length), p.bm25_k1);
    const double bm25f_norm = fe_length_factor(avg, p.bm25f_b[slot], length);
    const double weight = p.bm25f_weight[slot];
    unsigned long long sum = 0;
    unsigned min_count = FE_NONE, max_count = 0;
    double matched_idf = 0.0, bm25 = 0.0, bm25f = 0.0;
    unsigned long long doc_sum = 0;
    unsigned doc_min = FE_NONE, doc_max = 0, doc_distinct = 0;
    double doc_matched_idf = 0.0, doc_bm25f = 0.0;
    constexpr unsigned term_unroll = N <= FE_FEW_TERMS ? N : 1;
#pragma unroll (term_unroll)
    for (unsigned t = 0; t < N; ++t) {
        // Uniform over the warp (p.terms is the launch's): the shuffles below stay converged.
        if (t >= p.terms) break;
        const unsigned c = (seen >> t) & 1ull ? count[t] : 0u;
        sum += c;
        min_count = min(min_count, c);
        max_count = max(max_count, c);
        const double idf_t = idf[t];
        double tfw = 0.0;
        if (c > 0) {
            const double tf = (double)c;
            matched_idf += idf_t;
            bm25 += idf_t * tf * (p.bm25_k1 + 1.0) / (tf + bm25_norm);
            tfw = weight * tf / bm25f_norm;
            bm25f += idf_t * tfw / (p.bm25f_k1 + tfw);
        }
        // The document's tf and tf̃ of term t: the streams that hit it, in slot order.
        unsigned doc_tf = 0;
        double doc_tfw = 0.0;
        for (int k = 0; k < FE_STREAMS; ++k) {
            const unsigned ck = __shfl_sync(FE_FULL_WARP, c, k, FE_STREAMS);
            const double wk = __shfl_sync(FE_FULL_WARP, tfw, k, FE_STREAMS);
            if (ck > 0) {
                doc_tf += ck;
                doc_tfw += wk;
            }
        }
        doc_sum += doc_tf;
        doc_min = min(doc_min, doc_tf);
        doc_max = max(doc_max, doc_tf);
        if (doc_tf > 0) {
            ++doc_distinct;
            doc_matched_idf += idf_t;
            doc_bm25f += idf_t * doc_tfw / (p.bm25f_k1 + doc_tfw);
        }
    }

    // The document's sums over its streams (every lane computes them; slot 0 writes them).
    const double doc_length = fe_sum_slots((double)length);
    const double streams_matched = fe_sum_slots(sum > 0 ? 1.0 : 0.0);
    const double doc_bigrams = fe_sum_slots((double)bigrams);
    const double doc_full_matches = fe_sum_slots((double)full_matches);
    unsigned doc_longest_run = 0;
    for (int k = 0; k < FE_STREAMS; ++k) {
        doc_longest_run = max(doc_longest_run, __shfl_sync(FE_FULL_WARP, longest_run, k, FE_STREAMS));
    }
    if (!valid) return;

    const double len = (double)length;
    const double q = (double)p.terms;
    const double sumf = (double)sum;
    const double first_min_f = distinct == 0 ? len : (double)first_min;
    const double first_max_f = distinct == 0 ? len : (double)first_max;
    const double last_min_f = distinct == 0 ? len : (double)last_min;
    const double last_max_f = distinct == 0 ? len : (double)last_max;
    const double no_window = len + 1.0;
    double* row = out + (size_t)doc * FE_CATALOGUE;
    double* f = row + slot * FE_STREAM_FEATURES;
    f[SF_LENGTH] = len;
    f[SF_OCCURRENCES_SUM] = sumf;
    f[SF_OCCURRENCES_MIN] = p.terms == 0 ? 0.0 : (double)min_count;
    f[SF_OCCURRENCES_MAX] = (double)max_count;
    f[SF_OCCURRENCES_MEAN] = fe_ratio(sumf, q, 0.0);
    f[SF_OCCURRENCES_DENSITY] = fe_ratio(sumf, len, 0.0);
    f[SF_FIRST_OCCURRENCE_MIN] = first_min_f;
    f[SF_FIRST_OCCURRENCE_MAX] = first_max_f;
    f[SF_FIRST_OCCURRENCE_MIN_NORM] = fe_ratio(first_min_f, len, 1.0);
    f[SF_LAST_OCCURRENCE_MIN] = last_min_f;
    f[SF_LAST_OCCURRENCE_MAX] = last_max_f;
    f[SF_LAST_OCCURRENCE_MAX_NORM] = fe_ratio(last_max_f, len, 1.0);
    f[SF_DISTINCT_TERMS] = (double)distinct;
    f[SF_DISTINCT_TERMS_FRACTION] = fe_ratio((double)distinct, q, 0.0);
    f[SF_MATCHED_IDF_SUM] = matched_idf;
    f[SF_MATCHED_IDF_FRACTION] = fe_ratio(matched_idf, p.idf_sum, 0.0);
    f[SF_IN_ORDER_BIGRAMS] = (double)bigrams;
    f[SF_IN_ORDER_LONGEST_RUN] = (double)longest_run;
    f[SF_IN_ORDER_FULL_MATCHES] = (double)full_matches;
    f[SF_WINDOW_STREAM] = distinct == 0 ? no_window : (double)window_stream;
    f[SF_WINDOW_PHRASE] =
        distinct > 0 && best_phrase_terms == distinct ? (double)best_phrase_window : no_window;
    f[SF_PHRASES_MATCHED] = (double)(phrase1 - phrase0);
    f[SF_PHRASES_MAX_DISTINCT] = (double)best_phrase_terms;
    f[SF_BM25] = bm25;
    f[SF_BM25_NORM] = fe_ratio(bm25, (p.bm25_k1 + 1.0) * p.idf_sum, 0.0);
    f[SF_BM25F] = bm25f;
    if (slot != 0) return;

    double* d = row + FE_DOC0;
    d[DF_LENGTH] = doc_length;
    d[DF_OCCURRENCES_SUM] = (double)doc_sum;
    d[DF_OCCURRENCES_MIN] = p.terms == 0 ? 0.0 : (double)doc_min;
    d[DF_OCCURRENCES_MAX] = (double)doc_max;
    d[DF_DISTINCT_TERMS] = (double)doc_distinct;
    d[DF_DISTINCT_TERMS_FRACTION] = fe_ratio((double)doc_distinct, q, 0.0);
    d[DF_MATCHED_IDF_SUM] = doc_matched_idf;
    d[DF_MATCHED_IDF_FRACTION] = fe_ratio(doc_matched_idf, p.idf_sum, 0.0);
    d[DF_STREAMS_MATCHED] = streams_matched;
    d[DF_IN_ORDER_BIGRAMS] = doc_bigrams;
    d[DF_IN_ORDER_LONGEST_RUN] = (double)doc_longest_run;
    d[DF_IN_ORDER_FULL_MATCHES] = doc_full_matches;
    d[DF_BM25F] = doc_bm25f;
    d[DF_BM25F_NORM] = fe_ratio(doc_bm25f, p.idf_sum, 0.0);
    d[DF_QUERY_TERMS] = q;
}

// Every catalogue feature of every document.
//
// Launch shape: grid (ceil(n_docs * FE_STREAMS / blockDim.x)), block (128) — any multiple of 32,
// so that a document's FE_STREAMS threads share a warp and every lane of every warp exists; no
// shared memory. Thread i walks stream i (document i / FE_STREAMS, slot i % FE_STREAMS) phrase
// by phrase, hit by hit, keeping per-term counts and latest positions (in registers for at most
// FE_FEW_TERMS query terms, else local arrays of FE_MAX_TERMS) and term sets as 64-bit masks, and
// writes that stream's FE_STREAM_FEATURES features. Then the per-document pass, in the same launch: for each term, the document's
// FE_STREAMS lanes exchange tf and BM25F's weighted tf by warp shuffles, and the slot-0 lane
// accumulates the doc.* aggregates and BM25F and writes them. Threads past the last document
// walk nothing and write nothing but take part in the shuffles.
//
// Reads: the flattened layout above, p. Writes: out[n_docs][FE_CATALOGUE], every element.
extern "C" __global__ void fe_extract(
    const unsigned* __restrict__ stream_phrases,
    const unsigned* __restrict__ phrase_hits,
    const uint2* __restrict__ hits,
    const unsigned* __restrict__ stream_lengths,
    const double* __restrict__ idf,
    FeParams p,
    double* __restrict__ out)
{
    if (p.terms <= FE_FEW_TERMS) {
        fe_extract_terms<FE_FEW_TERMS>(stream_phrases, phrase_hits, hits, stream_lengths, idf, p, out);
    } else {
        fe_extract_terms<FE_MAX_TERMS>(stream_phrases, phrase_hits, hits, stream_lengths, idf, p, out);
    }
}

// A ranker's feature vectors from the catalogue, on the device (the GPU counterpart of
// `FeatureResolver::gather`): element (doc, j) of the ranker's row is catalogue column
// codes[j] when codes[j] >= 0, else column -codes[j] - 1 of the document's static features
// (uploaded with the hits, NaN where the document has none). Copies only, so the values are the
// catalogue's and the host's bit for bit.
//
// Launch shape: 1-D grid-stride over n_docs * width threads, 256 per block, no shared memory;
// thread t writes element t of rows (document t / width, feature t % width).
// Reads: catalogue[n_docs][FE_CATALOGUE] (fe_extract's output), statics[n_docs][n_statics],
// codes[width]. Writes: rows[n_docs][width] (row-major f64; the ranker's input buffer when
// scoring follows), every element.
extern "C" __global__ void fe_gather(
    const double* __restrict__ catalogue,
    const double* __restrict__ statics,
    const int* __restrict__ codes,
    unsigned n_docs,
    unsigned width,
    unsigned n_statics,
    double* __restrict__ rows)
{
    const size_t total = (size_t)n_docs * width;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (size_t)gridDim.x * blockDim.x) {
        const size_t doc = t / width;
        const int code = codes[t % width];
        rows[t] = code >= 0 ? catalogue[doc * FE_CATALOGUE + code]
                            : statics[doc * n_statics + (unsigned)(-code - 1)];
    }
}
