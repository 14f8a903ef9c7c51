// PForDelta block decoding (Ding et al. WWW'09): slots bit-unpacked in parallel, exceptions
// patched from the side arrays (one thread per exception), then a block-wide prefix sum turns
// the gaps into docIDs. Byte layout: docs/index-format.md and src/index/codecs/pfor.rs.
// kernels/packing.cuh is prepended by the host.

// pfor_decode: decodes every block of one posting list.
// Launch: grid (n_blocks, 1, 1), block (128, 1, 1), no dynamic shared memory; one thread block
// per posting block, thread i owns posting i (static shared: 128 u32).
// Reads:  list   the list's blocks as little-endian u32 words (the list's bytes from postings.bin)
//         skips  n_blocks skip entries, 4 u32 each (last_doc, byte offset, max_tf, min_len)
//         df     the list's postings
// Writes: docs[j*128 + i], tfs[j*128 + i] for posting i of block j (df of each).
// Preconditions: the blocks passed the reader's checks at open (header fields consistent with
// the bounds, exception positions increasing below n, slot width + exception width <= 32).
extern "C" __global__ void pfor_decode(const u32* list, const u32* skips, u32 df, u32* docs,
                                       u32* tfs) {
    __shared__ u32 v[BLOCK_LEN];
    const u32 j = blockIdx.x;
    const u32 i = threadIdx.x;
    const BlockInfo b = block_info(skips, j, df);
    const u32* block = list + b.word;
    const u32 header = block[0];
    const u32 bw = header & 0xff;
    const u32 ne = (header >> 8) & 0xff;
    const u32 ew = (header >> 16) & 0xff;
    const u32 pos_word = 1 + packed_words(b.n, bw);
    const u32 high_word = pos_word + (ne + 3) / 4;
    const u32 tf_word = high_word + seq_words(ne, ew);

    v[i] = i < b.n ? unpack_pack(block + 1, i, b.n, bw) : 0;
    __syncthreads();
    if (i < ne) {
        const u32 pos = (block[pos_word + i / 4] >> (8 * (i & 3))) & 0xff;
        // Positions are distinct, so no two threads patch one slot. `& 31` is Rust's
        // wrapping_shl (bw < 32 whenever there are exceptions).
        v[pos] |= unpack_seq(block + high_word, i, ew) << (bw & 31);
    }
    __syncthreads();
    // Inclusive scan of the gaps (Hillis-Steele; wrapping u32 like the CPU's wrapping_add).
    for (u32 off = 1; off < BLOCK_LEN; off <<= 1) {
        const u32 add = i >= off ? v[i - off] : 0;
        __syncthreads();
        v[i] += add;
        __syncthreads();
    }
    if (i < b.n) {
        docs[j * BLOCK_LEN + i] = b.base + i + v[i];
    }
    decode_tfs(block, b, tf_word, header >> 24, tfs + j * BLOCK_LEN);
}
