//! 256-bit kernels, one 32-element block per vector, stamped out three times by
//! [`kernels_256!`] with different integer dot products:
//! * AVX2: `vpmaddubsw` + `vpmaddwd` (no saturation: |w| ≤ 128, |x| ≤ 127, so a pair
//!   sums to at most 2·128·127 = 32512 < 32767);
//! * AVX-VNNI: the VEX `vpdpbusd`;
//! * AVX-512 VNNI + VL: the EVEX `vpdpbusd` on ymm (tests the same structure on CPUs
//!   with AVX-512 but no AVX-VNNI).
//!
//! Each variant's functions carry the features of its dot product, so the dot product
//! inlines; they are reached only after the matching [`Int8Isa`](super::Int8Isa) was
//! found available.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::{padded_blocks, ActsView};
use crate::cpu::block32::{blk_bytes, codes_at, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::matmul::{prefetch_bytes, PREFETCH_ROWS};
use crate::quant::{WeightFormat, QK};
use crate::weights::WeightMatrix;

/// True for the formats this module multiplies: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.
pub(super) fn handles(format: WeightFormat) -> bool {
    crate::cpu::block32::code_of(format).is_some()
}

/// Byte `e` of the result is 0xFF where bit `e` of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bytes_from_bits(bits: u32) -> __m256i {
    // Byte e takes byte e/8 of `bits`, then all bits but bit e%8 are forced on.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let others = _mm256_set1_epi64x(0x7FBF_DFEF_F7FB_FDFE);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1))
}

thread_local! {
    /// Per-task block scales of the current 4 weight rows.
    static SCALES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Σ of `u·s` over each group of 4 bytes (unsigned `u`, signed `s`), AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_maddubs(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Σ of `u·s` over each group of 4 bytes, AVX-VNNI.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
pub(super) unsafe fn dot_avxvnni(u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
}

/// Σ of `u·s` over each group of 4 bytes, AVX-512 VNNI + VL on ymm.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_evex(u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
}

macro_rules! kernels_256 {
    ($task:ident, $features:literal, $dot:ident) => {
        /// One task of [`super::matmul_int8`] with this module's 256-bit kernels.
        ///
        /// # Safety
        /// The features this variant is compiled for are available; `acts` holds rows
        /// `m0..m1` quantized from `w.cols()` values each; `out` is `[m, w.rows()]` and
        /// no other task writes rows `m0..m1` × columns `n0..n1`; [`handles`] holds for
        /// `w`'s format.
        pub(super) unsafe fn $task(
            acts: ActsView,
            m0: usize,
            m1: usize,
            w: &WeightMatrix,
            out: *mut f32,
            n0: usize,
            n1: usize,
        ) {
            /// Block `b` of a weight row in element order (Q4_x: nibbles 0..15).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn load_blk<const F: u8>(row: *const u8, b: usize) -> __m256i {
                let p = row.add(b * blk_bytes(F));
                if F == Q8_0 {
                    return _mm256_loadu_si256(p.add(2) as *const __m256i);
                }
                let a = _mm_loadu_si128(p.add(codes_at(F)) as *const __m128i);
                let v = _mm256_set_m128i(_mm_srli_epi16::<4>(a), a);
                let v = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
                if F == Q5_0 || F == Q5_1 {
                    // Bit e of qh is bit 4 of element e.
                    let qh = (p.add(codes_at(F) - 4) as *const u32).read_unaligned();
                    let high = _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10));
                    return _mm256_or_si256(v, high);
                }
                v
            }

            /// The row's block scales `dw` and offset factors `mt` (see avx512.rs).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn weight_scales<const F: u8>(
                row: *const u8,
                nb: usize,
                dw: *mut f32,
                mt: *mut f32,
            ) {
                let h = |p: *const u8| {
                    let bits = (p as *const u16).read_unaligned();
                    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
                };
                for b in 0..nb {
                    let p = row.add(b * blk_bytes(F));
                    let d = h(p);
                    *dw.add(b) = d;
                    *mt.add(b) = match F {
                        Q4_1 | Q5_1 => h(p.add(2)),
                        Q4_0 => -8.0 * d,
                        Q5_0 => -16.0 * d,
                        _ => 0.0,
                    };
                }
            }

            /// Horizontal sum of 8 floats.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn hsum(v: __m256) -> f32 {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
            }

            /// `MR × NR` outputs (see avx512.rs `tile`).
            #[inline]
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn tile<const F: u8, const MR: usize, const NR: usize>(
                acts: ActsView,
                i0: usize,
                w: *const u8,
                ws: usize,
                dw: *const f32,
                mt: *const f32,
                ss: usize,
                out: *mut f32,
                os: usize,
            ) {
                let (k, nb) = (acts.k, acts.nb());
                let nbp = padded_blocks(nb);
                let mut acc = [[_mm256_setzero_ps(); NR]; MR];
                for b in 0..nb {
                    let mut wv = [_mm256_setzero_si256(); NR];
                    let mut sign = [_mm256_setzero_si256(); NR];
                    for r in 0..NR {
                        let v = load_blk::<F>(w.add(r * ws), b);
                        if F == Q8_0 {
                            // |w| as the unsigned operand, x takes w's sign.
                            sign[r] = v;
                            wv[r] = _mm256_sign_epi8(v, v);
                        } else {
                            wv[r] = v;
                        }
                    }
                    for (i, a) in acc.iter_mut().enumerate() {
                        let row = i0 + i;
                        let xv = _mm256_loadu_si256(acts.q.add(row * k + b * QK) as *const __m256i);
                        let dxv = _mm256_loadu_ps(acts.dx8.add((row * nb + b) * 8));
                        for r in 0..NR {
                            let xs = if F == Q8_0 {
                                _mm256_sign_epi8(xv, sign[r])
                            } else {
                                xv
                            };
                            let f = _mm256_mul_ps(_mm256_cvtepi32_ps($dot(wv[r], xs)), dxv);
                            a[r] = _mm256_fmadd_ps(f, _mm256_set1_ps(*dw.add(r * ss + b)), a[r]);
                        }
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    let sx = acts.sx.add((i0 + i) * nbp);
                    for (r, v) in a.iter().enumerate() {
                        let mut c = hsum(*v);
                        if F != Q8_0 {
                            for b in 0..nb {
                                c += *mt.add(r * ss + b) * *sx.add(b);
                            }
                        }
                        *out.add(i * os + r) = c;
                    }
                }
            }

            /// Rows `m0..m1` × weight rows `n0..n1` in 2 × 4 tiles.
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn task_f<const F: u8>(
                acts: ActsView,
                m0: usize,
                m1: usize,
                w: *const u8,
                ws: usize,
                out: *mut f32,
                n: usize,
                n0: usize,
                n1: usize,
                scr: *mut f32,
                ss: usize,
            ) {
                let nb = acts.nb();
                let (dw, mt) = (scr, scr.add(4 * ss));
                let mut j = n0;
                while j < n1 {
                    let nr = 4.min(n1 - j);
                    for r in 0..nr {
                        if j + r + PREFETCH_ROWS < n {
                            prefetch_bytes(w.wrapping_add((j + r + PREFETCH_ROWS) * ws), ws);
                        }
                        weight_scales::<F>(w.add((j + r) * ws), nb, dw.add(r * ss), mt.add(r * ss));
                    }
                    let wj = w.add(j * ws);
                    let mut i = m0;
                    while i < m1 {
                        let mr = 2.min(m1 - i);
                        let o = out.add(i * n + j);
                        match (mr, nr) {
                            (1, 1) => tile::<F, 1, 1>(acts, i, wj, ws, dw, mt, ss, o, n),
                            (1, 2) => tile::<F, 1, 2>(acts, i, wj, ws, dw, mt, ss, o, n),
                            (1, 3) => tile::<F, 1, 3>(acts, i, wj, ws, dw, mt, ss, o, n),
                            (1, 4) => tile::<F, 1, 4>(acts, i, wj, ws, dw, mt, ss, o, n),
                            (2, 1) => tile::<F, 2, 1>(acts, i, wj, ws, dw, mt, ss, o, n),
                            (2, 2) => tile::<F, 2, 2>(acts, i, wj, ws, dw, mt, ss, o, n),
                            (2, 3) => tile::<F, 2, 3>(acts, i, wj, ws, dw, mt, ss, o, n),
                            (2, 4) => tile::<F, 2, 4>(acts, i, wj, ws, dw, mt, ss, o, n),
                            _ => unreachable!("tile {mr}x{nr}"),
                        }
                        i += mr;
                    }
                    j += nr;
                }
            }

            let ss = padded_blocks(acts.nb()) + 16;
            SCALES.with_borrow_mut(|s| {
                if s.len() < 8 * ss {
                    s.resize(8 * ss, 0.0);
                }
                let (wp, ws, n, scr) = (w.base_ptr(), w.row_stride(), w.rows(), s.as_mut_ptr());
                match w.format() {
                    WeightFormat::Q8_0 => {
                        task_f::<Q8_0>(acts, m0, m1, wp, ws, out, n, n0, n1, scr, ss)
                    }
                    WeightFormat::Q4_0 => {
                        task_f::<Q4_0>(acts, m0, m1, wp, ws, out, n, n0, n1, scr, ss)
                    }
                    WeightFormat::Q4_1 => {
                        task_f::<Q4_1>(acts, m0, m1, wp, ws, out, n, n0, n1, scr, ss)
                    }
                    WeightFormat::Q5_0 => {
                        task_f::<Q5_0>(acts, m0, m1, wp, ws, out, n, n0, n1, scr, ss)
                    }
                    WeightFormat::Q5_1 => {
                        task_f::<Q5_1>(acts, m0, m1, wp, ws, out, n, n0, n1, scr, ss)
                    }
                    other => unreachable!("int8 matmul of {other:?}"),
                }
            });
        }
    };
}

kernels_256!(task_avx2, "avx2,fma,f16c", dot_maddubs);
kernels_256!(task_avxvnni, "avx2,fma,f16c,avxvnni", dot_avxvnni);
kernels_256!(
    task_avx512vnni256,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    dot_evex
);

/// `quantize_row_scalar` on AVX2 with identical results: the same `127 / amax`
/// reciprocal, the same f32 products, and `vcvtps2dq`'s round-half-to-even.
///
/// # Safety
/// AVX2 kernels must be available; buffers as for `quantize_row_scalar`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_row(x: &[f32], q: *mut i8, dx8: *mut f32, sx: *mut f32) {
    use std::arch::x86_64::*;
    let nb = x.len() / QK;
    let p = x.as_ptr();
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    for b in 0..nb {
        let mut v = [_mm256_setzero_ps(); 4];
        let mut m = _mm256_setzero_ps();
        for (j, vj) in v.iter_mut().enumerate() {
            *vj = _mm256_loadu_ps(p.add(b * QK + 8 * j));
            m = _mm256_max_ps(m, _mm256_and_ps(*vj, abs_mask));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let d = amax / 127.0;
        let vid = _mm256_set1_ps(id);
        let mut qi = [_mm256_setzero_si256(); 4];
        for j in 0..4 {
            qi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vid));
        }
        // |q| <= 127: the saturating packs are exact; they interleave 128-bit lanes,
        // which the final permute undoes.
        let w01 = _mm256_packs_epi32(qi[0], qi[1]);
        let w23 = _mm256_packs_epi32(qi[2], qi[3]);
        let bytes = _mm256_packs_epi16(w01, w23);
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.add(b * QK) as *mut __m256i, bytes);
        let s = _mm256_add_epi32(
            _mm256_add_epi32(qi[0], qi[1]),
            _mm256_add_epi32(qi[2], qi[3]),
        );
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b01_00_11_10>(s4));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<0b10_11_00_01>(s2)));
        _mm256_storeu_ps(dx8.add(b * 8), _mm256_set1_ps(d));
        *sx.add(b) = d * sum as f32;
    }
    for b in nb..super::padded_blocks(nb) {
        *sx.add(b) = 0.0;
    }
}
