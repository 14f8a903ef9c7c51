// Elias-Fano block decoding, "Para-EF" (Griffin, Liu, Wang, Swanson PPoPP'18): the low bits are
// bit-unpacked one thread per posting; each high-bits word is taken by one thread, which counts
// the set bits of the words before it (a prefix sum of popcounts: at most 12 words in a valid
// block) to know the rank of its first set bit, then decodes each of its set bits independently.
// Byte layout: docs/index-format.md and src/index/codecs/ef.rs. kernels/packing.cuh is prepended
// by the host.

// ef_decode: decodes every block of one posting list.
// Launch: grid (n_blocks, 1, 1), block (128, 1, 1), no dynamic shared memory; one thread block
// per posting block; thread i unpacks low bits and the tf of posting i, thread t < high words
// places the set bits of high word t (static shared: 128 u32).
// Reads:  list   the list's blocks as little-endian u32 words (the list's bytes from postings.bin)
//         skips  n_blocks skip entries, 4 u32 each (last_doc, byte offset, max_tf, min_len)
//         df     the list's postings
// Writes: docs[j*128 + i], tfs[j*128 + i] for posting i of block j (df of each).
// Preconditions: the blocks passed the reader's checks at open (low width as the bounds imply).
extern "C" __global__ void ef_decode(const u32* list, const u32* skips, u32 df, u32* docs,
                                     u32* tfs) {
    __shared__ u32 low[BLOCK_LEN];
    const u32 j = blockIdx.x;
    const u32 i = threadIdx.x;
    const BlockInfo b = block_info(skips, j, df);
    const u32* block = list + b.word;
    const u32 header = block[0];
    const u32 l = header & 0xff;
    const u32 high_word = 1 + packed_words(b.n, l);
    const u32 high_words = (((b.last - b.base) >> l) + b.n + 31) / 32;

    low[i] = i < b.n ? unpack_pack(block + 1, i, b.n, l) : 0;
    __syncthreads();
    u32* out = docs + j * BLOCK_LEN;
    for (u32 t = i; t < high_words; t += blockDim.x) {
        u32 rank = 0;
        for (u32 q = 0; q < t; ++q) {
            rank += __popc(block[high_word + q]);
        }
        u32 word = block[high_word + t];
        while (word != 0 && rank < b.n) {
            // The rank-th set bit, at position p, holds high part p - rank.
            const u32 high = t * 32 + (__ffs(word) - 1) - rank;
            out[rank] = b.base + ((high << l) | low[rank]);
            ++rank;
            word &= word - 1;
        }
    }
    decode_tfs(block, b, high_word + high_words, header >> 24, tfs + j * BLOCK_LEN);
}
