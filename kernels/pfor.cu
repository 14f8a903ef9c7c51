// PForDelta block decoding (Ding et al. WWW'09): slots bit-unpacked in parallel, exceptions
// patched from the side arrays (one thread per exception), then a block-wide prefix sum (warp
// shuffles, then the four warp totals) turns the gaps into docIDs.
// Byte layout: docs/index-format.md and src/index/codecs/pfor.rs. kernels/packing.cuh is
// prepended by the host.

// pfor_decode_blocks: decodes every block of a block table, any number of lists in one launch.
// Launch: grid (n_blocks, 1, 1), block (128, 1, 1), no dynamic shared memory; one thread block
// per table entry, thread i owns posting i (static shared: 128 + 4 u32).
// Reads:  words  the encoded blocks, as little-endian u32 words (lists copied from postings.bin)
//         table  n_blocks descriptors (BlockDesc in packing.cuh; w >> 8 unused)
// Writes: docs[b*128 + i], tfs[b*128 + i] for posting i < n of table entry b; slots i >= n are
//         left alone.
// Preconditions: the blocks passed the reader's checks at open (header fields consistent with
// the bounds, exception positions increasing below n, slot width + exception width <= 32).
extern "C" __global__ void pfor_decode_blocks(const u32* words, const BlockDesc* table, u32* docs,
                                              u32* tfs) {
    __shared__ u32 v[BLOCK_LEN];
    __shared__ u32 warp_total[BLOCK_LEN / 32];
    const BlockDesc d = table[blockIdx.x];
    const u32* block = words + d.x;
    const u32 i = threadIdx.x;
    const u32 lane = i & 31;
    const u32 warp = i >> 5;
    const u32 n = d.w & 0xff;
    const u32 bw = d.z & 0xff;
    const u32 ne = (d.z >> 8) & 0xff;
    const u32 ew = (d.z >> 16) & 0xff;
    const u32 pos_word = 1 + packed_words(n, bw);
    const u32 high_word = pos_word + (ne + 3) / 4;
    const u32 tf_word = high_word + seq_words(ne, ew);

    v[i] = i < n ? unpack_pack(block + 1, i, n, bw) : 0;
    __syncthreads();
    if (i < ne) {
        const u32 pos = (block[pos_word + i / 4] >> (8 * (i & 3))) & 0xff;
        // Positions are distinct, so no two threads patch one slot. `& 31` is Rust's
        // wrapping_shl (bw < 32 whenever there are exceptions).
        v[pos] |= unpack_seq(block + high_word, i, ew) << (bw & 31);
    }
    __syncthreads();
    // Inclusive scan of the gaps, wrapping u32 like the CPU's wrapping_add: within the warp by
    // shuffles, then each warp adds the totals of the warps before it.
    u32 gap_sum = v[i];
    for (u32 off = 1; off < 32; off <<= 1) {
        const u32 y = __shfl_up_sync(0xffffffffu, gap_sum, off);
        if (lane >= off) {
            gap_sum += y;
        }
    }
    if (lane == 31) {
        warp_total[warp] = gap_sum;
    }
    __syncthreads();
    for (u32 w = 0; w < warp; ++w) {
        gap_sum += warp_total[w];
    }
    if (i < n) {
        docs[blockIdx.x * BLOCK_LEN + i] = d.y + i + gap_sum;
    }
    decode_tfs(block + tf_word, n, d.z >> 24, tfs + blockIdx.x * BLOCK_LEN);
}
