//! The fused Q4_K / Q5_K / Q6_K kernels on zmm with AVX-512 VNNI: 64 codes (two
//! sub-blocks of Q4_K/Q5_K, four of Q6_K) per `vpdpbusd`, then `vpmulld` by the
//! sub-blocks' scales (as in `x86.rs`, at half the instruction count).

use std::arch::x86_64::*;

use super::scales::{f16_at, k4_scales};
use super::{ActsK, QK_K};
use crate::quant::WeightFormat;
use crate::weights::WeightMatrix;

/// The 16-bit lanes of the low / high 256 bits of a zmm.
const LOW16: __mmask32 = 0x0000_FFFF;
const HIGH16: __mmask32 = 0xFFFF_0000;

/// Columns `n0..n1` of the product.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C are available; otherwise as `x86::task`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn task(
    acts: &ActsK,
    m: usize,
    w: &WeightMatrix,
    out: *mut f32,
    n0: usize,
    n1: usize,
) {
    match (w.format(), m) {
        (WeightFormat::Q4_K, 1) => cols::<4, 1>(acts, w, out, n0, n1),
        (WeightFormat::Q4_K, 2) => cols::<4, 2>(acts, w, out, n0, n1),
        (WeightFormat::Q4_K, 3) => cols::<4, 3>(acts, w, out, n0, n1),
        (WeightFormat::Q4_K, 4) => cols::<4, 4>(acts, w, out, n0, n1),
        (WeightFormat::Q5_K, 1) => cols::<5, 1>(acts, w, out, n0, n1),
        (WeightFormat::Q5_K, 2) => cols::<5, 2>(acts, w, out, n0, n1),
        (WeightFormat::Q5_K, 3) => cols::<5, 3>(acts, w, out, n0, n1),
        (WeightFormat::Q5_K, 4) => cols::<5, 4>(acts, w, out, n0, n1),
        (WeightFormat::Q6_K, 1) => cols::<6, 1>(acts, w, out, n0, n1),
        (WeightFormat::Q6_K, 2) => cols::<6, 2>(acts, w, out, n0, n1),
        (WeightFormat::Q6_K, 3) => cols::<6, 3>(acts, w, out, n0, n1),
        (WeightFormat::Q6_K, 4) => cols::<6, 4>(acts, w, out, n0, n1),
        (f, m) => unreachable!("fused int8 K-quant kernel for {f:?}, m = {m}"),
    }
}

/// Weight rows `n0..n1` (`BITS` = 4, 5, 6: Q4_K, Q5_K, Q6_K) against `M` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn cols<const BITS: u8, const M: usize>(
    acts: &ActsK,
    w: &WeightMatrix,
    out: *mut f32,
    n0: usize,
    n1: usize,
) {
    let n = w.rows();
    for j in n0..n1 {
        let row = w.base_ptr().add(j * w.row_stride());
        let r = match BITS {
            4 => q45_k::<false, M>(acts, row, w.cols()),
            5 => q45_k::<true, M>(acts, row, w.cols()),
            _ => q6_k::<M>(acts, row, w.cols()),
        };
        for (i, v) in r.iter().enumerate() {
            *out.add(i * n + j) = *v;
        }
    }
}

/// Each lane's dot product of 4 codes and 4 activations, times its lane of `scales`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_scaled(codes: __m512i, x: __m512i, scales: __m512i) -> __m512i {
    _mm512_mullo_epi32(
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, x),
        scales,
    )
}

/// One Q4_K (`FIVE = false`) or Q5_K row against `M` activation rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q45_k<const FIVE: bool, const M: usize>(
    acts: &ActsK,
    row: *const u8,
    k: usize,
) -> [f32; M] {
    let nsb = k / QK_K;
    let sb_bytes = if FIVE { 176 } else { 144 };
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); M];
    let mut acc_min = [_mm_setzero_ps(); M];
    for sb in 0..nsb {
        let b = row.add(sb * sb_bytes);
        let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
        let (sc, mn) = k4_scales(std::slice::from_raw_parts(b.add(4), 12));
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr() as *const __m128i));
        let sc32 = _mm512_cvtepu8_epi32(_mm_loadl_epi64(sc.as_ptr() as *const __m128i));
        let qs = b.add(if FIVE { 48 } else { 16 });
        let qh = if FIVE {
            _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(16) as *const __m256i))
        } else {
            _mm512_setzero_si512()
        };
        // Pair cc: sub-block 2cc (low nibbles) in the low half, 2cc + 1 (high) above.
        let mut codes = [_mm512_setzero_si512(); 4];
        let mut scales = [_mm512_setzero_si512(); 4];
        for cc in 0..4 {
            let v = _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.add(32 * cc) as *const __m256i));
            let v = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(v, HIGH16, v), low);
            codes[cc] = if FIVE {
                // Bit `sub` of each qh byte is bit 4 of sub-block `sub`'s code.
                let bits = _mm512_inserti64x4::<1>(
                    _mm512_set1_epi8(1 << (2 * cc)),
                    _mm256_set1_epi8(1 << (2 * cc + 1)),
                );
                let set = _mm512_test_epi8_mask(qh, bits);
                // (Codes below 16: adding 16 sets bit 4.)
                _mm512_mask_add_epi8(v, set, v, _mm512_set1_epi8(0x10))
            } else {
                v
            };
            let idx = _mm512_inserti64x4::<1>(
                _mm512_set1_epi32(2 * cc as i32),
                _mm256_set1_epi32(2 * cc as i32 + 1),
            );
            scales[cc] = _mm512_permutexvar_epi32(idx, sc32);
        }
        for i in 0..M {
            let xq = acts.q.as_ptr().add(i * k + sb * QK_K);
            let mut sumi = _mm512_setzero_si512();
            for cc in 0..4 {
                let xv = _mm512_loadu_si512(xq.add(64 * cc) as *const _);
                sumi = _mm512_add_epi32(sumi, dot_scaled(codes[cc], xv, scales[cc]));
            }
            let dx = *acts.d.get_unchecked(i * nsb + sb);
            acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(d * dx), _mm512_cvtepi32_ps(sumi), acc[i]);
            // Σqx per 32 from the per-16 sums, times the mins.
            let bs = acts.bsums.as_ptr().add((i * nsb + sb) * 16) as *const __m128i;
            let pairs = _mm_hadd_epi16(_mm_loadu_si128(bs), _mm_loadu_si128(bs.add(1)));
            let prod = _mm_madd_epi16(mins, pairs);
            acc_min[i] = _mm_fmadd_ps(_mm_set1_ps(dmin * dx), _mm_cvtepi32_ps(prod), acc_min[i]);
        }
    }
    let mut r = [0.0f32; M];
    for i in 0..M {
        let s = _mm_sub_ps(_mm_setzero_ps(), acc_min[i]);
        r[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i], _mm512_zextps128_ps512(s)));
    }
    r
}

/// One Q6_K row against `M` activation rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k<const M: usize>(acts: &ActsK, row: *const u8, k: usize) -> [f32; M] {
    let nsb = k / QK_K;
    let low = _mm512_set1_epi8(0x0F);
    let two = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); M];
    for sb in 0..nsb {
        let b = row.add(sb * 210);
        let (ql, qh) = (b, b.add(128));
        let sc = b.add(192);
        let d = f16_at(b.add(208));
        let sc32 = _mm512_cvtepi8_epi32(_mm_loadu_si128(sc as *const __m128i));
        // Four chunks of 64 codes (0..=63) in element order: per 128-element half,
        // [ql & 0xF | qh bits 0-1, 2-3] and [ql >> 4 | qh bits 4-5, 6-7].
        let mut codes = [_mm512_setzero_si512(); 4];
        let mut scales = [_mm512_setzero_si512(); 4];
        for n in 0..2 {
            let l = _mm512_loadu_si512(ql.add(64 * n) as *const _);
            let h = _mm512_broadcast_i64x4(_mm256_loadu_si256(qh.add(32 * n) as *const __m256i));
            let t = _mm512_slli_epi16::<2>(h);
            let ha = _mm512_and_si512(_mm512_mask_slli_epi16::<2>(t, LOW16, t), two);
            let hb = _mm512_and_si512(_mm512_mask_srli_epi16::<2>(h, HIGH16, h), two);
            codes[2 * n] = _mm512_or_si512(_mm512_and_si512(l, low), ha);
            codes[2 * n + 1] =
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(l), low), hb);
        }
        for (t, s) in scales.iter_mut().enumerate() {
            // Lanes 4q..4q + 3 take the scale of sub-block 4t + q.
            let base = 4 * t as i32;
            let idx = _mm512_setr_epi32(
                base,
                base,
                base,
                base,
                base + 1,
                base + 1,
                base + 1,
                base + 1,
                base + 2,
                base + 2,
                base + 2,
                base + 2,
                base + 3,
                base + 3,
                base + 3,
                base + 3,
            );
            *s = _mm512_permutexvar_epi32(idx, sc32);
        }
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc as *const __m128i));
        for (i, a) in acc.iter_mut().enumerate() {
            let xq = acts.q.as_ptr().add(i * k + sb * QK_K);
            let mut sumi = _mm512_setzero_si512();
            for t in 0..4 {
                let xv = _mm512_loadu_si512(xq.add(64 * t) as *const _);
                sumi = _mm512_add_epi32(sumi, dot_scaled(codes[t], xv, scales[t]));
            }
            // The codes are q + 32: take 32·Σ sc·Σqx per 16.
            let bs =
                _mm256_loadu_si256(acts.bsums.as_ptr().add((i * nsb + sb) * 16) as *const __m256i);
            let bias = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs));
            sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(bias));
            let dx = *acts.d.get_unchecked(i * nsb + sb);
            *a = _mm512_fmadd_ps(_mm512_set1_ps(d * dx), _mm512_cvtepi32_ps(sumi), *a);
        }
    }
    let mut r = [0.0f32; M];
    for i in 0..M {
        r[i] = _mm512_reduce_add_ps(acc[i]);
    }
    r
}
