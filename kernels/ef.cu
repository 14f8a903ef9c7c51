// Elias-Fano block decoding, "Para-EF" (Griffin, Liu, Wang, Swanson PPoPP'18), one thread per
// posting: the low bits are bit-unpacked in place; for the high part, warp 0 takes the block's
// high-bits words (at most 13 in a valid block) and prefix-sums their popcounts, then posting i
// finds the word holding the i-th set bit from those prefix sums and the bit itself with __fns.
// Every posting is decoded independently: no thread walks the set bits one by one.
// Byte layout: docs/index-format.md and src/index/codecs/ef.rs. kernels/packing.cuh is prepended
// by the host.

// ef_decode_blocks: decodes every block of a block table, any number of lists in one launch.
// Launch: grid (n_blocks, 1, 1), block (128, 1, 1), no dynamic shared memory; one thread block
// per table entry, thread i owns posting i (static shared: 2 × 32 u32).
// Reads:  words  the encoded blocks, as little-endian u32 words (lists copied from postings.bin)
//         table  n_blocks descriptors (BlockDesc in packing.cuh; w >> 8 = high-bits words)
// Writes: docs[b*128 + i], tfs[b*128 + i] for posting i < n of table entry b; slots i >= n are
//         left alone.
// Preconditions: the blocks passed the reader's checks at open (low width as the bounds imply,
// so at most 32 high-bits words and exactly n set bits among them).
extern "C" __global__ void ef_decode_blocks(const u32* words, const BlockDesc* table, u32* docs,
                                            u32* tfs) {
    __shared__ u32 high[32];
    __shared__ u32 ones_before[32];
    const BlockDesc d = table[blockIdx.x];
    const u32* block = words + d.x;
    const u32 i = threadIdx.x;
    const u32 l = d.z & 0xff;
    const u32 n = d.w & 0xff;
    const u32 high_words = d.w >> 8;
    const u32 high_at = 1 + packed_words(n, l);
    if (i < 32) {
        const u32 w = i < high_words ? block[high_at + i] : 0;
        const u32 ones = __popc(w);
        u32 incl = ones;
        for (u32 off = 1; off < 32; off <<= 1) {
            const u32 y = __shfl_up_sync(0xffffffffu, incl, off);
            if (i >= off) {
                incl += y;
            }
        }
        high[i] = w;
        ones_before[i] = incl - ones;
    }
    __syncthreads();
    if (i < n) {
        // The word holding the i-th set bit: the last q with ones_before[q] <= i (the prefix
        // sums never decrease, so counting them finds it; empty words are skipped over).
        u32 q = 0;
        for (u32 t = 1; t < high_words; ++t) {
            q += ones_before[t] <= i;
        }
        const u32 p = __fns(high[q], 0, (int)(i - ones_before[q] + 1));
        // The i-th set bit, at position q*32 + p, holds high part q*32 + p - i; `& 31` is the
        // CPU's wrapping_shl.
        const u32 high_part = q * 32 + p - i;
        const u32 low = unpack_pack(block + 1, i, n, l);
        docs[blockIdx.x * BLOCK_LEN + i] = d.y + ((high_part << (l & 31)) | low);
    }
    decode_tfs(block + high_at + high_words, n, d.z >> 24, tfs + blockIdx.x * BLOCK_LEN);
}
