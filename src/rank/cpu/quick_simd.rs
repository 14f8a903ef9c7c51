//! The scan of [`super::quick`] in AVX2 and AVX-512: a cut's threshold compared with the block's
//! 8 values at once, the reachable-leaf bitvectors of the lanes that go right ANDed in one
//! (AVX-512: masked) operation. Same decisions as `scan_portable`, lane for lane: `x > t`
//! ordered (false for NaN) in NaN-left runs, `!(x <= t)` unordered (true for NaN) in NaN-right
//! runs.

use std::arch::x86_64::*;

use super::quick::{Bits, Cut, Run, Values};

/// # Safety
/// The CPU must have AVX2; every cut's `slot` must index `bits`, every run's feature `values`
/// (and `zeroed` for zeroed runs), every run's cut range `cuts`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn scan_avx2(
    runs: &[Run],
    cuts: &[Cut],
    values: &[Values],
    zeroed: &[Values],
    bits: &mut [Bits],
) {
    for run in runs {
        let x = &if run.zeroed { zeroed } else { values }[run.feature as usize];
        let cuts = cuts.get_unchecked(run.cuts.start as usize..run.cuts.end as usize);
        if run.nan_right {
            run_avx2::<_CMP_NLE_UQ>(x, cuts, bits);
        } else {
            run_avx2::<_CMP_GT_OQ>(x, cuts, bits);
        }
    }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn run_avx2<const PREDICATE: i32>(x: &Values, cuts: &[Cut], bits: &mut [Bits]) {
    let x0 = _mm256_load_pd(x.0.as_ptr());
    let x1 = _mm256_load_pd(x.0.as_ptr().add(4));
    let base = bits.as_mut_ptr();
    for cut in cuts {
        let t = _mm256_set1_pd(cut.threshold);
        let right0 = _mm256_castpd_si256(_mm256_cmp_pd::<PREDICATE>(x0, t));
        let right1 = _mm256_castpd_si256(_mm256_cmp_pd::<PREDICATE>(x1, t));
        if _mm256_testz_si256(right0, right0) & _mm256_testz_si256(right1, right1) == 1 {
            break;
        }
        let left = _mm256_set1_epi64x(cut.left as i64);
        debug_assert!((cut.slot as usize) < bits.len());
        let p = base.add(cut.slot as usize) as *mut __m256i;
        let b0 = _mm256_load_si256(p);
        let b1 = _mm256_load_si256(p.add(1));
        _mm256_store_si256(p, _mm256_andnot_si256(_mm256_and_si256(right0, left), b0));
        _mm256_store_si256(
            p.add(1),
            _mm256_andnot_si256(_mm256_and_si256(right1, left), b1),
        );
    }
}

/// # Safety
/// The CPU must have AVX-512F; otherwise as [`scan_avx2`].
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn scan_avx512(
    runs: &[Run],
    cuts: &[Cut],
    values: &[Values],
    zeroed: &[Values],
    bits: &mut [Bits],
) {
    for run in runs {
        let x = &if run.zeroed { zeroed } else { values }[run.feature as usize];
        let cuts = cuts.get_unchecked(run.cuts.start as usize..run.cuts.end as usize);
        if run.nan_right {
            run_avx512::<_CMP_NLE_UQ>(x, cuts, bits);
        } else {
            run_avx512::<_CMP_GT_OQ>(x, cuts, bits);
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn run_avx512<const PREDICATE: i32>(x: &Values, cuts: &[Cut], bits: &mut [Bits]) {
    let x = _mm512_load_pd(x.0.as_ptr());
    let base = bits.as_mut_ptr();
    for cut in cuts {
        let right = _mm512_cmp_pd_mask::<PREDICATE>(x, _mm512_set1_pd(cut.threshold));
        if right == 0 {
            break;
        }
        debug_assert!((cut.slot as usize) < bits.len());
        let p = base.add(cut.slot as usize) as *mut __m512i;
        let b = _mm512_load_si512(p);
        let left = _mm512_set1_epi64(cut.left as i64);
        _mm512_store_si512(p, _mm512_mask_andnot_epi64(b, right, left, b));
    }
}
