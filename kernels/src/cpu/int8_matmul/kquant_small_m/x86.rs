//! The fused Q4_K / Q5_K / Q6_K kernels of the parent module, 256 bits wide, stamped out
//! by [`kquant_small_m_256!`] for three integer dot products, each returning a 32-element
//! chunk's dot products times their sub-block scales as 8 i32 lanes:
//! * AVX2: `vpmaddubsw` (codes ≤ 63, |qx| ≤ 127: a pair ≤ 16002, no saturation) then
//!   `vpmaddwd` against the scales as i16;
//! * AVX-VNNI / AVX-512 VNNI + VL: `vpdpbusd`, then `vpmulld` by the scales as i32.

use std::arch::x86_64::*;

use super::scales::f16_at;
use super::{ActsK, QK_K};
use crate::cpu::int8_matmul::Int8Isa;
use crate::cpu::kquants::dequant::k4_scales_packed;
use crate::matmul::{prefetch_bytes, PREFETCH_ROWS};
use crate::quant::WeightFormat;
use crate::weights::WeightMatrix;

/// Runs columns `n0..n1` of the product on `isa`'s kernel.
///
/// # Safety
/// `isa` is available; `out` is `[m, w.rows()]`, columns `n0..n1` written by this call
/// only; `acts` holds `m ≤ 4` rows of `w.cols()` values; `w` is Q4_K, Q5_K or Q6_K.
pub(super) unsafe fn task(
    isa: Int8Isa,
    acts: &ActsK,
    m: usize,
    w: &WeightMatrix,
    out: *mut f32,
    n0: usize,
    n1: usize,
) {
    match isa {
        Int8Isa::Avx2 => avx2::task(acts, m, w, out, n0, n1),
        Int8Isa::AvxVnni => avxvnni::task(acts, m, w, out, n0, n1),
        Int8Isa::Avx512Vnni => super::avx512::task(acts, m, w, out, n0, n1),
        Int8Isa::Avx512Vnni256 => evex::task(acts, m, w, out, n0, n1),
    }
}

macro_rules! kquant_small_m_256 {
    ($module:ident, $features:literal, $scales:ident, $dot:ident) => {
        mod $module {
            use super::*;

            /// See [`super::task`].
            pub(super) unsafe fn task(
                acts: &ActsK,
                m: usize,
                w: &WeightMatrix,
                out: *mut f32,
                n0: usize,
                n1: usize,
            ) {
                match (w.format(), m) {
                    (WeightFormat::Q4_K, 1) => cols::<Q4K, 1>(acts, w, out, n0, n1),
                    (WeightFormat::Q4_K, 2) => cols::<Q4K, 2>(acts, w, out, n0, n1),
                    (WeightFormat::Q4_K, 3) => cols::<Q4K, 3>(acts, w, out, n0, n1),
                    (WeightFormat::Q4_K, 4) => cols::<Q4K, 4>(acts, w, out, n0, n1),
                    (WeightFormat::Q5_K, 1) => cols::<Q5K, 1>(acts, w, out, n0, n1),
                    (WeightFormat::Q5_K, 2) => cols::<Q5K, 2>(acts, w, out, n0, n1),
                    (WeightFormat::Q5_K, 3) => cols::<Q5K, 3>(acts, w, out, n0, n1),
                    (WeightFormat::Q5_K, 4) => cols::<Q5K, 4>(acts, w, out, n0, n1),
                    (WeightFormat::Q6_K, 1) => cols::<Q6K, 1>(acts, w, out, n0, n1),
                    (WeightFormat::Q6_K, 2) => cols::<Q6K, 2>(acts, w, out, n0, n1),
                    (WeightFormat::Q6_K, 3) => cols::<Q6K, 3>(acts, w, out, n0, n1),
                    (WeightFormat::Q6_K, 4) => cols::<Q6K, 4>(acts, w, out, n0, n1),
                    (f, m) => unreachable!("fused int8 K-quant kernel for {f:?}, m = {m}"),
                }
            }

            const Q4K: u8 = 4;
            const Q5K: u8 = 5;
            const Q6K: u8 = 6;

            /// Horizontal sum of 8 floats.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn hsum(v: __m256) -> f32 {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
            }

            /// Weight rows `n0..n1` against the `M` activation rows.
            #[target_feature(enable = $features)]
            unsafe fn cols<const F: u8, const M: usize>(
                acts: &ActsK,
                w: &WeightMatrix,
                out: *mut f32,
                n0: usize,
                n1: usize,
            ) {
                let (n, ws) = (w.rows(), w.row_stride());
                for j in n0..n1 {
                    let row = w.base_ptr().add(j * ws);
                    // The weights stream from memory once: ask for a later row now.
                    prefetch_bytes(row.wrapping_add(PREFETCH_ROWS * ws), ws);
                    let r = match F {
                        Q4K => q45_k::<false, M>(acts, row, w.cols()),
                        Q5K => q45_k::<true, M>(acts, row, w.cols()),
                        _ => q6_k::<M>(acts, row, w.cols()),
                    };
                    for (i, v) in r.iter().enumerate() {
                        *out.add(i * n + j) = *v;
                    }
                }
            }

            /// One Q4_K (`FIVE = false`, 144-byte super-blocks) or Q5_K (176 bytes) row
            /// against `M` activation rows.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q45_k<const FIVE: bool, const M: usize>(
                acts: &ActsK,
                row: *const u8,
                k: usize,
            ) -> [f32; M] {
                let nsb = k / QK_K;
                let sb_bytes = if FIVE { 176 } else { 144 };
                let low = _mm256_set1_epi8(0x0F);
                let bit4 = _mm256_set1_epi8(0x10);
                let mut acc = [_mm256_setzero_ps(); M];
                let mut acc_min = [_mm_setzero_ps(); M];
                for sb in 0..nsb {
                    let b = row.add(sb * sb_bytes);
                    let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
                    let (sc, mn) = k4_scales_packed(std::slice::from_raw_parts(b.add(4), 12));
                    let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
                    let qs = b.add(if FIVE { 48 } else { 16 });
                    // The 8 sub-blocks' codes, in element order.
                    let mut codes = [_mm256_setzero_si256(); 8];
                    let qh = if FIVE {
                        _mm256_loadu_si256(b.add(16) as *const __m256i)
                    } else {
                        _mm256_setzero_si256()
                    };
                    let mut hbit = _mm256_set1_epi8(1);
                    for cc in 0..4 {
                        let v = _mm256_loadu_si256(qs.add(32 * cc) as *const __m256i);
                        codes[2 * cc] = _mm256_and_si256(v, low);
                        codes[2 * cc + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                    }
                    if FIVE {
                        // Bit `sub` of each qh byte is bit 4 of sub-block `sub`'s code.
                        for c in codes.iter_mut() {
                            let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, hbit), hbit);
                            *c = _mm256_or_si256(*c, _mm256_and_si256(set, bit4));
                            hbit = _mm256_add_epi8(hbit, hbit);
                        }
                    }
                    // Each sub-block's scale for both of its halves (all ≤ 63).
                    let sc = _mm_cvtsi64_si128(sc as i64);
                    let scales = $scales(_mm_unpacklo_epi8(sc, sc));
                    for i in 0..M {
                        let xq = acts.q.as_ptr().add(i * k + sb * QK_K);
                        let mut sumi = _mm256_setzero_si256();
                        for (s, c) in codes.iter().enumerate() {
                            let xv = _mm256_loadu_si256(xq.add(32 * s) as *const __m256i);
                            sumi = _mm256_add_epi32(sumi, $dot(*c, xv, scales[s]));
                        }
                        let dx = *acts.d.get_unchecked(i * nsb + sb);
                        acc[i] = _mm256_fmadd_ps(
                            _mm256_set1_ps(d * dx),
                            _mm256_cvtepi32_ps(sumi),
                            acc[i],
                        );
                        // Σqx per 32 from the per-16 sums, times the mins.
                        let bs = acts.bsums.as_ptr().add((i * nsb + sb) * 16) as *const __m128i;
                        let pairs = _mm_hadd_epi16(_mm_loadu_si128(bs), _mm_loadu_si128(bs.add(1)));
                        let prod = _mm_madd_epi16(mins, pairs);
                        acc_min[i] =
                            _mm_fmadd_ps(_mm_set1_ps(dmin * dx), _mm_cvtepi32_ps(prod), acc_min[i]);
                    }
                }
                let mut r = [0.0f32; M];
                for i in 0..M {
                    let mv = _mm256_castps128_ps256(acc_min[i]);
                    let mv = _mm256_insertf128_ps::<1>(mv, _mm_setzero_ps());
                    r[i] = hsum(_mm256_sub_ps(acc[i], mv));
                }
                r
            }

            /// One Q6_K row (210-byte super-blocks) against `M` activation rows.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q6_k<const M: usize>(acts: &ActsK, row: *const u8, k: usize) -> [f32; M] {
                let nsb = k / QK_K;
                let low = _mm256_set1_epi8(0x0F);
                let two = _mm256_set1_epi8(0x30);
                let mut acc = [_mm256_setzero_ps(); M];
                for sb in 0..nsb {
                    let b = row.add(sb * 210);
                    let (ql, qh) = (b, b.add(128));
                    let sc = std::slice::from_raw_parts(b.add(192) as *const i8, 16);
                    let d = f16_at(b.add(208));
                    // The 8 chunks of 32 codes (0..=63), in element order.
                    let mut codes = [_mm256_setzero_si256(); 8];
                    for n in 0..2 {
                        let a = _mm256_loadu_si256(ql.add(64 * n) as *const __m256i);
                        let c = _mm256_loadu_si256(ql.add(64 * n + 32) as *const __m256i);
                        let h = _mm256_loadu_si256(qh.add(32 * n) as *const __m256i);
                        let h0 = _mm256_and_si256(_mm256_slli_epi16::<4>(h), two);
                        let h1 = _mm256_and_si256(_mm256_slli_epi16::<2>(h), two);
                        let h2 = _mm256_and_si256(h, two);
                        let h3 = _mm256_and_si256(_mm256_srli_epi16::<2>(h), two);
                        codes[4 * n] = _mm256_or_si256(_mm256_and_si256(a, low), h0);
                        codes[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(c, low), h1);
                        codes[4 * n + 2] =
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(a), low), h2);
                        codes[4 * n + 3] =
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(c), low), h3);
                    }
                    let sc = _mm_loadu_si128(sc.as_ptr() as *const __m128i);
                    let scales = $scales(sc);
                    let sc16 = _mm256_cvtepi8_epi16(sc);
                    for i in 0..M {
                        let xq = acts.q.as_ptr().add(i * k + sb * QK_K);
                        let mut sumi = _mm256_setzero_si256();
                        for (t, c) in codes.iter().enumerate() {
                            let xv = _mm256_loadu_si256(xq.add(32 * t) as *const __m256i);
                            sumi = _mm256_add_epi32(sumi, $dot(*c, xv, scales[t]));
                        }
                        // The codes are q + 32: take 32·Σ sc·Σqx per 16.
                        let bs = _mm256_loadu_si256(
                            acts.bsums.as_ptr().add((i * nsb + sb) * 16) as *const __m256i
                        );
                        let bias = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs));
                        sumi = _mm256_sub_epi32(sumi, bias);
                        let dx = *acts.d.get_unchecked(i * nsb + sb);
                        acc[i] = _mm256_fmadd_ps(
                            _mm256_set1_ps(d * dx),
                            _mm256_cvtepi32_ps(sumi),
                            acc[i],
                        );
                    }
                }
                let mut r = [0.0f32; M];
                for i in 0..M {
                    r[i] = hsum(acc[i]);
                }
                r
            }
        }
    };
}

/// The scales of the 8 chunks of 32 elements as the i16 pairs `vpmaddwd` multiplies by:
/// `pairs` holds 16 int8 scales, bytes `2t` and `2t + 1` for the first and last 16
/// elements of chunk `t`. One in-lane shuffle per chunk (the scalar broadcasts and
/// inserts this replaced were half of a one-row Q4_K product's instructions).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scales_i16(pairs: __m128i) -> [__m256i; 8] {
    // Both lanes hold scales 0..8 (then 8..16) as i16; chunk t's mask takes word 2t mod
    // 8 in the low lane and word 2t + 1 mod 8 in the high one.
    let lo = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(pairs));
    let hi = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128::<8>(pairs)));
    // (No closures here: they would not inherit this function's target features.)
    let m = [
        _mm256_setr_epi8(
            0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2,
            3, 2, 3,
        ),
        _mm256_setr_epi8(
            4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6,
            7, 6, 7,
        ),
        _mm256_setr_epi8(
            8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11,
            10, 11, 10, 11, 10, 11,
        ),
        _mm256_setr_epi8(
            12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15,
            14, 15, 14, 15, 14, 15, 14, 15, 14, 15,
        ),
    ];
    let mut out = [_mm256_setzero_si256(); 8];
    for t in 0..4 {
        out[t] = _mm256_shuffle_epi8(lo, m[t]);
        out[t + 4] = _mm256_shuffle_epi8(hi, m[t]);
    }
    out
}

/// The same scales as the i32 lanes `vpmulld` multiplies by: one cross-lane permute per
/// chunk.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scales_i32(pairs: __m128i) -> [__m256i; 8] {
    let lo = _mm256_cvtepi8_epi32(pairs);
    let hi = _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(pairs));
    let mut out = [_mm256_setzero_si256(); 8];
    for t in 0..4 {
        let (a, b) = (2 * t as i32, 2 * t as i32 + 1);
        let idx = _mm256_setr_epi32(a, a, a, a, b, b, b, b);
        out[t] = _mm256_permutevar8x32_epi32(lo, idx);
        out[t + 4] = _mm256_permutevar8x32_epi32(hi, idx);
    }
    out
}

/// Scaled dot products of 32 codes and 32 activations, AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_maddubs(c: __m256i, x: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(c, x), s)
}

/// Scaled dot products, AVX-VNNI.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn dot_avxvnni(c: __m256i, x: __m256i, s: __m256i) -> __m256i {
    _mm256_mullo_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), c, x), s)
}

/// Scaled dot products, AVX-512 VNNI + VL on ymm.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
unsafe fn dot_evex(c: __m256i, x: __m256i, s: __m256i) -> __m256i {
    _mm256_mullo_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), c, x), s)
}

kquant_small_m_256!(avx2, "avx2,fma,f16c", scales_i16, dot_maddubs);
kquant_small_m_256!(avxvnni, "avx2,fma,f16c,avxvnni", scales_i32, dot_avxvnni);
kquant_small_m_256!(
    evex,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    scales_i32,
    dot_evex
);
