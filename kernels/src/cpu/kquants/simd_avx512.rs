//! AVX-512 decoders of one 32-element sub-block of a Q4_K, Q5_K or Q6_K super-block,
//! as two vectors of sixteen floats (the shape of the 32-element block decoders in
//! `quant::simd`). Same f32 operations in the same order as the portable decoder (see
//! `simd_avx2.rs`, whose scale and code unpacking they share), so bit-identical to it.
//!
//! Every function needs the AVX-512 kernels' features
//! (`CpuFeatures::has_avx512_kernels`); `sb` points at a whole super-block, `j < 8`,
//! and `sc` holds its scales (`simd_avx2::k4_scales` / `q6_scales`, shared by both
//! levels).

use super::simd_avx2::{bits32, q6_k_codes, SubScales};
use std::arch::x86_64::*;

/// Lane `i` holds `i as f32`: the 16 possible nibble values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn iota() -> __m512 {
    _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    )
}

/// Decodes sub-block `j` of a Q4_K super-block through a 16-entry table of decoded
/// values (entry `q` = `d1·q − m1`, computed like the portable decoder): one permute
/// per vector instead of convert, multiply and subtract.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn q4_k_sub(sb: *const u8, j: usize, sc: &SubScales) -> (__m512, __m512) {
    let (d1, m1) = (_mm512_set1_ps(sc[j]), _mm512_set1_ps(sc[8 + j]));
    let table = _mm512_sub_ps(_mm512_mul_ps(d1, iota()), m1);
    let q = sb.add(16 + 32 * (j / 2));
    // `vpermps` reads only the low 4 bits of each index: no mask after the shift.
    let sh = _mm_cvtsi32_si128(4 * (j % 2) as i32);
    let idx = |p: *const u8| {
        _mm512_srl_epi32(
            _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i)),
            sh,
        )
    };
    (
        _mm512_permutexvar_ps(idx(q), table),
        _mm512_permutexvar_ps(idx(q.add(16)), table),
    )
}

/// Decodes sub-block `j` of a Q5_K super-block: `d1·q − m1` on the 5-bit codes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn q5_k_sub(sb: *const u8, j: usize, sc: &SubScales) -> (__m512, __m512) {
    let (d1, m1) = (_mm512_set1_ps(sc[j]), _mm512_set1_ps(sc[8 + j]));
    let low = bits32(sb.add(48 + 32 * (j / 2)), 4 * (j % 2), 0xF);
    let high = bits32(sb.add(16), j, 1);
    let codes = _mm256_or_si256(low, _mm256_slli_epi16::<4>(high));
    let value = |c: __m128i| {
        let q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c));
        _mm512_sub_ps(_mm512_mul_ps(d1, q), m1)
    };
    (
        value(_mm256_castsi256_si128(codes)),
        value(_mm256_extracti128_si256::<1>(codes)),
    )
}

/// Decodes sub-block `j` of a Q6_K super-block: `(d·sc)·(q − 32)`, one int8 scale per
/// 16 elements, i.e. per vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn q6_k_sub(sb: *const u8, j: usize, sc: &SubScales) -> (__m512, __m512) {
    let (ds0, ds1) = (sc[2 * j], sc[2 * j + 1]);
    let q = q6_k_codes(sb, j);
    let value = |c: __m128i, ds: f32| {
        _mm512_mul_ps(
            _mm512_set1_ps(ds),
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c)),
        )
    };
    (
        value(_mm256_castsi256_si128(q), ds0),
        value(_mm256_extracti128_si256::<1>(q), ds1),
    )
}
