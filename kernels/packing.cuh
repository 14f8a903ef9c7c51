// Bit-unpacking shared by pfor.cu and ef.cu: the PACK and SEQ layouts of docs/index-format.md.
// src/gpu/module.rs prepends this file to each of them (NVRTC sees no files, only the embedded
// source), so neither includes it.
//
// - SEQ: value i occupies bits i*w .. i*w+w of the words in order, least significant bit first.
// - PACK: SEQ when n < 128; for full blocks the bitpacking crate's BitPacker4x layout: value i in
//   lane i % 4 at lane offset (i / 4)*w bits, lane word k stored as word 4k + lane.

typedef unsigned int u32;
typedef unsigned long long u64;

#define BLOCK_LEN 128u

// The `width`-bit value at bit `bit` of the lane `lane` of `stride` interleaved lanes.
__device__ __forceinline__ u32 unpack_lane(const u32* words, u32 lane, u32 stride, u32 bit,
                                           u32 width) {
    if (width == 0) {
        return 0;
    }
    const u32 k = bit >> 5;
    const u32 s = bit & 31;
    u64 v = (u64)(words[k * stride + lane] >> s);
    if (s + width > 32) {
        v |= (u64)words[(k + 1) * stride + lane] << (32 - s);
    }
    return width == 32 ? (u32)v : (u32)v & ((1u << width) - 1);
}

// Value i of SEQ-packed values of `width` bits starting at words[0].
__device__ __forceinline__ u32 unpack_seq(const u32* words, u32 i, u32 width) {
    return unpack_lane(words, 0, 1, i * width, width);
}

// Value i of n PACK-packed values of `width` bits starting at words[0].
__device__ __forceinline__ u32 unpack_pack(const u32* words, u32 i, u32 n, u32 width) {
    if (n == BLOCK_LEN) {
        return unpack_lane(words, i & 3, 4, (i >> 2) * width, width);
    }
    return unpack_seq(words, i, width);
}

// Words taken by n values of `width` bits: PACK (16*w bytes for a full block) or SEQ.
__device__ __forceinline__ u32 packed_words(u32 n, u32 width) {
    return n == BLOCK_LEN ? 4 * width : (n * width + 31) / 32;
}

__device__ __forceinline__ u32 seq_words(u32 n, u32 width) {
    return (n * width + 31) / 32;
}

// One posting block of a decode launch: the host's block table (src/select/gpu/decode.rs,
// `describe_list`) holds one per block, in launch order; block b of the launch writes postings
// b*128 .. b*128+n of the outputs.
//   x: the block's first word (its header) in the launch's word array
//   y: base, the smallest docID the block may hold (previous block's last + 1, or 0)
//   z: the block's header word (a copy, so the header's fields arrive with the descriptor)
//   w: n (bits 0..8, 1..=128 postings) | codec-specific count << 8 (EF: high-bits words)
typedef uint4 BlockDesc;

// Writes the block's term frequencies (stored as tf - 1, `tfw` bits, PACK, from `tf_words`):
// thread i < n writes posting i.
__device__ __forceinline__ void decode_tfs(const u32* tf_words, u32 n, u32 tfw, u32* tfs_out) {
    const u32 i = threadIdx.x;
    if (i < n) {
        tfs_out[i] = unpack_pack(tf_words, i, n, tfw) + 1;
    }
}
