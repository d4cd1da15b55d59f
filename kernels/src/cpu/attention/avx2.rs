//! AVX2 + FMA primitives for the generic attention body ([`attend_body`]).
//!
//! The body and these primitives are `#[inline(always)]`, so [`attend_body_avx2`]
//! compiles the whole loop with AVX2/FMA/F16C enabled and the intrinsics inline into
//! it (in a function without those features each intrinsic would be a call). Narrow
//! caches are decoded by the body's own `KvRef::decode`, vectorized here for free.

// Register-array loops index several arrays in lockstep; iterators would obscure them.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{attend_body, Item, Math};

/// Runs [`attend_body`] on AVX2 + FMA.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (`features().has_avx2_kernels()`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_body_avx2(
    it: &Item,
    out: &mut [f32],
    lse: &mut [f32],
    scratch: &mut [f32],
) {
    attend_body::<Avx2>(it, out, lse, scratch)
}

/// AVX2 + FMA implementation of [`Math`]. Its methods may only run where those
/// features exist: they are reached only through [`attend_body_avx2`].
pub(super) struct Avx2;

/// `TAIL[8 - n..16 - n]` masks the first `n` of 8 lanes.
static TAIL: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

/// Mask of the first `n` lanes (`1 <= n <= 8`).
#[inline(always)]
unsafe fn first(n: usize) -> __m256i {
    debug_assert!((1..=8).contains(&n));
    _mm256_loadu_si256(TAIL.as_ptr().add(8 - n) as *const __m256i)
}

/// Sum of the 8 lanes.
#[inline(always)]
pub(super) unsafe fn hsum(a: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// `[Σa, Σb, Σc, Σd]`: one reduction (3 `hadd` + 1 add) for four vectors.
#[inline(always)]
unsafe fn hsum4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    // Per 128-bit half: [a01 a23 b01 b23], [c01 c23 d01 d23], then [Σa Σb Σc Σd].
    let abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_add_ps(
        _mm256_castps256_ps128(abcd),
        _mm256_extractf128_ps::<1>(abcd),
    )
}

/// `exp(x)` on 8 lanes with the Cephes polynomial of `avx512::exp16` (≈1 ulp).
///
/// AVX2 has no `vscalefps`, so 2ⁿ is built in the exponent bits; `x` is clamped to
/// where n is a normal exponent (results up to ~2.4e38: the attention only passes
/// `x <= 0`), and below `ln(f32::MIN_POSITIVE)` (and at -inf) the result is 0, whose
/// error is under 1.2e-38. NaN stays NaN.
#[inline(always)]
pub(super) unsafe fn exp8(x: __m256) -> __m256 {
    const LO: f32 = -87.336_55;
    const HI: f32 = 88.376_26;
    // `x` as second operand: min/max then return a NaN `x` unchanged.
    let xc = _mm256_max_ps(_mm256_set1_ps(LO), _mm256_min_ps(_mm256_set1_ps(HI), x));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3f32,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    // n ∈ [-126, 127]: 2ⁿ is the float with biased exponent n + 127.
    let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let y = _mm256_mul_ps(y, _mm256_castsi256_ps(pow2));
    _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(LO)), y)
}

/// `acc[..8·NV] += Σ_j p[j] · v[offs[j]..][..8·NV]` with the `NV` output vectors held
/// in registers for the whole chunk (each V row loaded once per block).
///
/// # Safety
/// AVX2 + FMA; `offs.len() >= p.len()`, `v + offs[j]` valid for `8·NV` floats, `acc`
/// for `8·NV`.
#[inline(always)]
unsafe fn pv_block<const NV: usize>(p: &[f32], offs: &[usize], v: *const f32, acc: *mut f32) {
    let c = p.len();
    let (pp, op) = (p.as_ptr(), offs.as_ptr());
    let mut a = [[_mm256_setzero_ps(); NV]; 2];
    for x in 0..NV {
        a[0][x] = _mm256_loadu_ps(acc.add(8 * x));
    }
    let mut j = 0;
    // Short rows give few independent FMA chains per key: alternate two sets of
    // accumulators between even and odd keys so the chains overlap.
    if NV <= 4 {
        while j + 2 <= c {
            let (p0, p1) = (_mm256_set1_ps(*pp.add(j)), _mm256_set1_ps(*pp.add(j + 1)));
            let (v0, v1) = (v.add(*op.add(j)), v.add(*op.add(j + 1)));
            for x in 0..NV {
                a[0][x] = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0.add(8 * x)), a[0][x]);
                a[1][x] = _mm256_fmadd_ps(p1, _mm256_loadu_ps(v1.add(8 * x)), a[1][x]);
            }
            j += 2;
        }
    }
    while j < c {
        let pj = _mm256_set1_ps(*pp.add(j));
        let vj = v.add(*op.add(j));
        for x in 0..NV {
            a[0][x] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj.add(8 * x)), a[0][x]);
        }
        j += 1;
    }
    for x in 0..NV {
        let s = if NV <= 4 {
            _mm256_add_ps(a[0][x], a[1][x])
        } else {
            a[0][x]
        };
        _mm256_storeu_ps(acc.add(8 * x), s);
    }
}

/// [`pv_block`] for the last `hd % 8` columns, loaded and stored under mask `m`.
///
/// # Safety
/// As for [`pv_block`], with the lanes of `m` in place of `8·NV` floats.
#[inline(always)]
unsafe fn pv_tail(p: &[f32], offs: &[usize], v: *const f32, acc: *mut f32, m: __m256i) {
    let c = p.len();
    let (pp, op) = (p.as_ptr(), offs.as_ptr());
    let (mut a0, mut a1) = (_mm256_maskload_ps(acc, m), _mm256_setzero_ps());
    let mut j = 0;
    while j + 2 <= c {
        let v0 = _mm256_maskload_ps(v.add(*op.add(j)), m);
        let v1 = _mm256_maskload_ps(v.add(*op.add(j + 1)), m);
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(*pp.add(j)), v0, a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(*pp.add(j + 1)), v1, a1);
        j += 2;
    }
    if j < c {
        let vj = _mm256_maskload_ps(v.add(*op.add(j)), m);
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(*pp.add(j)), vj, a0);
    }
    _mm256_maskstore_ps(acc, m, _mm256_add_ps(a0, a1));
}

// SAFETY (every `unsafe` block below): `Avx2` is only used by `attend_body_avx2`, which
// requires AVX2 + FMA; pointer accesses stay within the lengths asserted on entry
// (masked lanes of `maskload` are not accessed).
impl Math for Avx2 {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        assert!(b.len() >= n);
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        // SAFETY: see the impl.
        unsafe {
            let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i + 16 <= n {
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
                let (x, y) = (pa.add(i + 8), pb.add(i + 8));
                s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(y), s1);
                i += 16;
            }
            if i + 8 <= n {
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
                i += 8;
            }
            if i < n {
                let m = first(n - i);
                let (x, y) = (
                    _mm256_maskload_ps(pa.add(i), m),
                    _mm256_maskload_ps(pb.add(i), m),
                );
                s1 = _mm256_fmadd_ps(x, y, s1);
            }
            hsum(_mm256_add_ps(s0, s1))
        }
    }

    #[inline(always)]
    fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        let n = q.len();
        assert!(k.iter().all(|x| x.len() >= n));
        // Indexed, not `k.map`: `array::map` was left as an out-of-line call.
        let pk = [k[0].as_ptr(), k[1].as_ptr(), k[2].as_ptr(), k[3].as_ptr()];
        let pq = q.as_ptr();
        // SAFETY: see the impl.
        unsafe {
            // Four keys × two column halves: 8 independent FMA chains, each q vector
            // loaded once for the four keys.
            let mut a = [_mm256_setzero_ps(); 4];
            let mut b = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 16 <= n {
                let (q0, q1) = (_mm256_loadu_ps(pq.add(i)), _mm256_loadu_ps(pq.add(i + 8)));
                for x in 0..4 {
                    a[x] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(pk[x].add(i)), a[x]);
                    b[x] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(pk[x].add(i + 8)), b[x]);
                }
                i += 16;
            }
            if i + 8 <= n {
                let q0 = _mm256_loadu_ps(pq.add(i));
                for x in 0..4 {
                    a[x] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(pk[x].add(i)), a[x]);
                }
                i += 8;
            }
            if i < n {
                let m = first(n - i);
                let q0 = _mm256_maskload_ps(pq.add(i), m);
                for x in 0..4 {
                    b[x] = _mm256_fmadd_ps(q0, _mm256_maskload_ps(pk[x].add(i), m), b[x]);
                }
            }
            for x in 0..4 {
                a[x] = _mm256_add_ps(a[x], b[x]);
            }
            let mut r = [0.0f32; 4];
            _mm_storeu_ps(r.as_mut_ptr(), hsum4(a[0], a[1], a[2], a[3]));
            r
        }
    }

    #[inline(always)]
    fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = y.len().min(x.len());
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        // SAFETY: see the impl.
        unsafe {
            let al = _mm256_set1_ps(alpha);
            let mut i = 0;
            while i + 8 <= n {
                let s = _mm256_fmadd_ps(al, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(py.add(i), s);
                i += 8;
            }
            while i < n {
                *py.add(i) += alpha * *px.add(i);
                i += 1;
            }
        }
    }

    #[inline(always)]
    fn scale(alpha: f32, y: &mut [f32]) {
        let n = y.len();
        let py = y.as_mut_ptr();
        // SAFETY: see the impl.
        unsafe {
            let al = _mm256_set1_ps(alpha);
            let mut i = 0;
            while i + 8 <= n {
                _mm256_storeu_ps(py.add(i), _mm256_mul_ps(al, _mm256_loadu_ps(py.add(i))));
                i += 8;
            }
            while i < n {
                *py.add(i) *= alpha;
                i += 1;
            }
        }
    }

    #[inline(always)]
    fn exp_sum(s: &mut [f32], mx: f32) -> f32 {
        let n = s.len();
        let ps = s.as_mut_ptr();
        // SAFETY: see the impl.
        unsafe {
            let m = _mm256_set1_ps(mx);
            let mut sum = _mm256_setzero_ps();
            let mut i = 0;
            while i + 8 <= n {
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(ps.add(i)), m));
                _mm256_storeu_ps(ps.add(i), e);
                sum = _mm256_add_ps(sum, e);
                i += 8;
            }
            if i < n {
                // Padding lanes hold -inf, whose exp is 0: they add nothing.
                let mut buf = [f32::NEG_INFINITY; 8];
                buf[..n - i].copy_from_slice(&s[i..]);
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), m));
                _mm256_storeu_ps(buf.as_mut_ptr(), e);
                s[i..].copy_from_slice(&buf[..n - i]);
                sum = _mm256_add_ps(sum, e);
            }
            hsum(sum)
        }
    }

    #[inline(always)]
    fn pv(p: &[f32], offs: &[usize], v: &[f32], acc: &mut [f32]) {
        let (c, hd) = (p.len().min(offs.len()), acc.len());
        // Checked once per chunk so the blocks below can read V unchecked.
        assert!(offs[..c].iter().all(|&o| o <= v.len() && v.len() - o >= hd));
        let (p, offs, vp, ap) = (&p[..c], &offs[..c], v.as_ptr(), acc.as_mut_ptr());
        // SAFETY: see the impl.
        unsafe {
            // Blocks of up to 8 vectors (64 columns) stay in registers across the
            // chunk's keys: 128-wide heads take two passes over the V rows (in L1).
            let full = hd / 8;
            let mut col = 0;
            while col < full * 8 {
                let (vc, ac) = (vp.add(col), ap.add(col));
                let nb = (full - col / 8).min(8);
                match nb {
                    8 => pv_block::<8>(p, offs, vc, ac),
                    7 => pv_block::<7>(p, offs, vc, ac),
                    6 => pv_block::<6>(p, offs, vc, ac),
                    5 => pv_block::<5>(p, offs, vc, ac),
                    4 => pv_block::<4>(p, offs, vc, ac),
                    3 => pv_block::<3>(p, offs, vc, ac),
                    2 => pv_block::<2>(p, offs, vc, ac),
                    _ => pv_block::<1>(p, offs, vc, ac),
                }
                col += nb * 8;
            }
            if col < hd {
                pv_tail(p, offs, vp.add(col), ap.add(col), first(hd - col));
            }
        }
    }
}
