//! NEON primitives for the generic attention body ([`attend_body`]) on aarch64: the
//! 128-bit twins of `avx2.rs`.
//!
//! NEON is part of the aarch64 baseline, so the body compiles with it enabled and the
//! intrinsics inline into it without a `target_feature` wrapper. Narrow caches are
//! decoded by the body's own `KvRef::decode`.

// Register-array loops index several arrays in lockstep; iterators would obscure them.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use super::{attend_body, Item, Math};

/// Runs [`attend_body`] with the NEON primitives.
pub(super) fn attend_body_neon(it: &Item, out: &mut [f32], lse: &mut [f32], scratch: &mut [f32]) {
    attend_body::<Neon>(it, out, lse, scratch)
}

/// NEON implementation of [`Math`].
pub(super) struct Neon;

/// `[Σa, Σb, Σc, Σd]`: pairwise adds shared by the four reductions.
#[inline(always)]
unsafe fn hsum4(a: float32x4_t, b: float32x4_t, c: float32x4_t, d: float32x4_t) -> float32x4_t {
    vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d))
}

/// `exp(x)` on 4 lanes with the Cephes polynomial of `avx2::exp8` (≈1 ulp).
///
/// 2ⁿ is built in the exponent bits, so `x` is clamped to where n is a normal exponent
/// (the attention only passes `x <= 0`); below `ln(f32::MIN_POSITIVE)` (and at -inf)
/// the result is 0, whose error is under 1.2e-38. NaN stays NaN (FMIN/FMAX propagate
/// it, and the final mask keeps it).
#[inline(always)]
unsafe fn exp4(x: float32x4_t) -> float32x4_t {
    const LO: f32 = -87.336_55;
    const HI: f32 = 88.376_26;
    let xc = vmaxq_f32(vdupq_n_f32(LO), vminq_f32(vdupq_n_f32(HI), x));
    // Round to nearest even, as the AVX2 path's `_MM_FROUND_TO_NEAREST_INT`.
    let n = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(std::f32::consts::LOG2_E)));
    // r = x − n·ln 2 in two steps (Cody–Waite), each fused.
    let r = vfmsq_f32(xc, n, vdupq_n_f32(0.693_359_4));
    let r = vfmsq_f32(r, n, vdupq_n_f32(-2.121_944_4e-4));
    let mut p = vdupq_n_f32(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3f32,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = vfmaq_f32(vdupq_n_f32(c), p, r);
    }
    let r2 = vmulq_f32(r, r);
    let y = vaddq_f32(vfmaq_f32(r, p, r2), vdupq_n_f32(1.0));
    // n ∈ [-126, 127]: 2ⁿ is the float with biased exponent n + 127.
    let pow2 = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
    let y = vmulq_f32(y, vreinterpretq_f32_s32(pow2));
    let under = vcltq_f32(x, vdupq_n_f32(LO));
    vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), under))
}

/// `acc[..4·NV] += Σ_j p[j] · v[offs[j]..][..4·NV]` with the `NV` output vectors held
/// in registers for the whole chunk (each V row loaded once per block).
///
/// # Safety
/// `offs.len() >= p.len()`, `v + offs[j]` valid for `4·NV` floats, `acc` for `4·NV`.
#[inline(always)]
unsafe fn pv_block<const NV: usize>(p: &[f32], offs: &[usize], v: *const f32, acc: *mut f32) {
    let c = p.len();
    let (pp, op) = (p.as_ptr(), offs.as_ptr());
    let mut a = [[vdupq_n_f32(0.0); NV]; 2];
    for x in 0..NV {
        a[0][x] = vld1q_f32(acc.add(4 * x));
    }
    let mut j = 0;
    // Short rows give few independent FMA chains per key: alternate two sets of
    // accumulators between even and odd keys so the chains overlap.
    if NV <= 8 {
        while j + 2 <= c {
            let (p0, p1) = (vdupq_n_f32(*pp.add(j)), vdupq_n_f32(*pp.add(j + 1)));
            let (v0, v1) = (v.add(*op.add(j)), v.add(*op.add(j + 1)));
            for x in 0..NV {
                a[0][x] = vfmaq_f32(a[0][x], p0, vld1q_f32(v0.add(4 * x)));
                a[1][x] = vfmaq_f32(a[1][x], p1, vld1q_f32(v1.add(4 * x)));
            }
            j += 2;
        }
    }
    while j < c {
        let pj = vdupq_n_f32(*pp.add(j));
        let vj = v.add(*op.add(j));
        for x in 0..NV {
            a[0][x] = vfmaq_f32(a[0][x], pj, vld1q_f32(vj.add(4 * x)));
        }
        j += 1;
    }
    for x in 0..NV {
        let s = if NV <= 8 {
            vaddq_f32(a[0][x], a[1][x])
        } else {
            a[0][x]
        };
        vst1q_f32(acc.add(4 * x), s);
    }
}

// SAFETY (every `unsafe` block below): NEON is always present on aarch64; pointer
// accesses stay within the lengths asserted on entry.
impl Math for Neon {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        assert!(b.len() >= n);
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        // SAFETY: see the impl.
        unsafe {
            let mut s = [vdupq_n_f32(0.0); 4];
            let mut i = 0;
            while i + 16 <= n {
                for c in 0..4 {
                    let (x, y) = (vld1q_f32(pa.add(i + 4 * c)), vld1q_f32(pb.add(i + 4 * c)));
                    s[c] = vfmaq_f32(s[c], x, y);
                }
                i += 16;
            }
            while i + 4 <= n {
                s[0] = vfmaq_f32(s[0], vld1q_f32(pa.add(i)), vld1q_f32(pb.add(i)));
                i += 4;
            }
            let mut t = vaddvq_f32(vaddq_f32(vaddq_f32(s[0], s[1]), vaddq_f32(s[2], s[3])));
            while i < n {
                t += *pa.add(i) * *pb.add(i);
                i += 1;
            }
            t
        }
    }

    #[inline(always)]
    fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        let n = q.len();
        assert!(k.iter().all(|x| x.len() >= n));
        // Indexed, not `k.map`: keeps the loop free of closure calls.
        let pk = [k[0].as_ptr(), k[1].as_ptr(), k[2].as_ptr(), k[3].as_ptr()];
        let pq = q.as_ptr();
        // SAFETY: see the impl.
        unsafe {
            // Four keys × two column halves: 8 independent FMA chains, each q vector
            // loaded once for the four keys.
            let mut a = [vdupq_n_f32(0.0); 4];
            let mut b = [vdupq_n_f32(0.0); 4];
            let mut i = 0;
            while i + 8 <= n {
                let (q0, q1) = (vld1q_f32(pq.add(i)), vld1q_f32(pq.add(i + 4)));
                for x in 0..4 {
                    a[x] = vfmaq_f32(a[x], q0, vld1q_f32(pk[x].add(i)));
                    b[x] = vfmaq_f32(b[x], q1, vld1q_f32(pk[x].add(i + 4)));
                }
                i += 8;
            }
            if i + 4 <= n {
                let q0 = vld1q_f32(pq.add(i));
                for x in 0..4 {
                    a[x] = vfmaq_f32(a[x], q0, vld1q_f32(pk[x].add(i)));
                }
                i += 4;
            }
            for x in 0..4 {
                a[x] = vaddq_f32(a[x], b[x]);
            }
            let mut r = [0.0f32; 4];
            vst1q_f32(r.as_mut_ptr(), hsum4(a[0], a[1], a[2], a[3]));
            while i < n {
                for x in 0..4 {
                    r[x] += *pq.add(i) * *pk[x].add(i);
                }
                i += 1;
            }
            r
        }
    }

    #[inline(always)]
    fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = y.len().min(x.len());
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        // SAFETY: see the impl.
        unsafe {
            let al = vdupq_n_f32(alpha);
            let mut i = 0;
            while i + 4 <= n {
                let s = vfmaq_f32(vld1q_f32(py.add(i)), al, vld1q_f32(px.add(i)));
                vst1q_f32(py.add(i), s);
                i += 4;
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
            let al = vdupq_n_f32(alpha);
            let mut i = 0;
            while i + 4 <= n {
                vst1q_f32(py.add(i), vmulq_f32(al, vld1q_f32(py.add(i))));
                i += 4;
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
            let m = vdupq_n_f32(mx);
            let mut sum = vdupq_n_f32(0.0);
            let mut i = 0;
            while i + 4 <= n {
                let e = exp4(vsubq_f32(vld1q_f32(ps.add(i)), m));
                vst1q_f32(ps.add(i), e);
                sum = vaddq_f32(sum, e);
                i += 4;
            }
            if i < n {
                // Padding lanes hold -inf, whose exp is 0: they add nothing.
                let mut buf = [f32::NEG_INFINITY; 4];
                buf[..n - i].copy_from_slice(&s[i..]);
                let e = exp4(vsubq_f32(vld1q_f32(buf.as_ptr()), m));
                vst1q_f32(buf.as_mut_ptr(), e);
                s[i..].copy_from_slice(&buf[..n - i]);
                sum = vaddq_f32(sum, e);
            }
            vaddvq_f32(sum)
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
            // Blocks of up to 16 vectors (64 columns) stay in registers across the
            // chunk's keys: 128-wide heads take two passes over the V rows (in L1).
            let full = hd / 4;
            let mut col = 0;
            while col < full * 4 {
                let (vc, ac) = (vp.add(col), ap.add(col));
                let nb = (full - col / 4).min(16);
                macro_rules! go {
                    ($($n:literal)*) => {
                        match nb {
                            $($n => pv_block::<$n>(p, offs, vc, ac),)*
                            _ => pv_block::<1>(p, offs, vc, ac),
                        }
                    };
                }
                go!(16 15 14 13 12 11 10 9 8 7 6 5 4 3 2);
                col += nb * 4;
            }
            // The last hd % 4 columns.
            for (&pj, &off) in p.iter().zip(offs) {
                for x in col..hd {
                    *ap.add(x) += pj * *vp.add(off + x);
                }
            }
        }
    }
}
