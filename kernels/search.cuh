// What intersect.cu and score.cu share (src/gpu/module.rs prepends it to both: NVRTC sees no
// files): a binary search over a sorted array of docIDs.

typedef unsigned int u32;
typedef unsigned long long u64;

// The first index i of s[0..n) with s[i] >= x (n when there is none).
__device__ __forceinline__ u32 lower_bound(const u32* s, u32 n, u32 x) {
    u32 lo = 0;
    u32 hi = n;
    while (lo < hi) {
        const u32 mid = lo + (hi - lo) / 2;
        if (s[mid] < x) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

