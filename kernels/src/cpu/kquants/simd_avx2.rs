//! AVX2 + FMA decoders of one 32-element sub-block of a Q4_K, Q5_K or Q6_K
//! super-block: the fused matmul treats each 256-element super-block as eight 32-element
//! blocks, so these return the same four vectors as the 32-element block decoders in
//! `quant::avx2` (elements 0..8, 8..16, 16..24, 24..32 of the sub-block).
//!
//! Exactness: every value comes from the same f32 operations, in the same order, as
//! the portable decoder in `dequant.rs` (Q4_K/Q5_K: `d·sc` and `dmin·m` first, then
//! `d1·q − m1` as a multiply and a separate subtract; Q6_K: `(d·sc)·(q − 32)`), so the
//! results are bit-identical to it. The integer codes are unpacked 32 bytes at a time.
//!
//! Every function needs AVX2, FMA and F16C (`CpuFeatures::has_avx2_kernels`); `sb`
//! points at a whole super-block, `j < 8` is the sub-block and `sc` the super-block's
//! [`SubScales`] (decoded once for all eight sub-blocks: unpacking the 6-bit scales
//! per sub-block cost more than decoding its 32 codes).

use crate::cpu::quant::avx2::Block8;
use crate::dtype::DType;
use std::arch::x86_64::*;

/// The scales of one super-block's sub-blocks, decoded once per super-block (row by
/// row) and shared by its eight sub-blocks: for Q4_K/Q5_K `d·sc` of sub-block `j` at
/// `j` and `dmin·m` at `8 + j` ([`k4_scales`]); for Q6_K `d·sc` of each 16 elements
/// ([`q6_scales`]).
pub(crate) type SubScales = [f32; 16];

/// [`SubScales`] of the Q4_K/Q5_K super-block at `sb`: `d`, `dmin` (f16), then the
/// twelve bytes of 6-bit scales and mins, unpacked four sub-blocks at a time (the
/// bit layout of `k4_scale_min`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn k4_scales(sb: *const u8) -> SubScales {
    let (sc, m) = super::dequant::k4_scales_packed(std::slice::from_raw_parts(sb.add(4), 12));
    // d and dmin converted together; `d·sc` and `dmin·m` are the portable decoder's
    // f32 products, eight lanes at a time.
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((sb as *const i32).read_unaligned()));
    let (d, dmin) = (
        _mm256_broadcastss_ps(dm),
        _mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
    );
    // (Written out, not a closure: a closure would not inherit the target features.)
    let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64)));
    let m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(m as i64)));
    let mut out = [0.0; 16];
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(d, sc));
    _mm256_storeu_ps(out.as_mut_ptr().add(8), _mm256_mul_ps(dmin, m));
    out
}

/// [`SubScales`] of the Q6_K super-block at `sb`: `d·sc` for its sixteen int8 scales
/// (bytes 192..208; `d` is the f16 at 208).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_scales(sb: *const u8) -> SubScales {
    let bits = (sb.add(208) as *const u16).read_unaligned();
    let d = _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))));
    let sc = _mm_loadu_si128(sb.add(192) as *const __m128i);
    let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc));
    let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc)));
    let mut out = [0.0; 16];
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(d, lo));
    _mm256_storeu_ps(out.as_mut_ptr().add(8), _mm256_mul_ps(d, hi));
    out
}

/// The 32 bytes at `p`, each shifted right by `sh` (< 8) bits and masked with `mask`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn bits32(p: *const u8, sh: usize, mask: u8) -> __m256i {
    // A 16-bit shift drags bits of the neighbouring byte into the top `sh` bits of
    // each byte; the mask (at most 8 − sh bits wide) drops them.
    let v = _mm256_srl_epi16(
        _mm256_loadu_si256(p as *const __m256i),
        _mm_cvtsi32_si128(sh as i32),
    );
    _mm256_and_si256(v, _mm256_set1_epi8(mask as i8))
}

/// The 32 bytes of `v` widened to four vectors of eight i32 (zero extension, or sign
/// extension when `SIGNED`).
// Written out rather than with `array::map`: a closure of intrinsics passed to `map`
// is not inlined (it has target features `map` lacks), which made decoding ~10× slower.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen<const SIGNED: bool>(v: __m256i) -> [__m256i; 4] {
    let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let (lo2, hi2) = (_mm_unpackhi_epi64(lo, lo), _mm_unpackhi_epi64(hi, hi));
    if SIGNED {
        [
            _mm256_cvtepi8_epi32(lo),
            _mm256_cvtepi8_epi32(lo2),
            _mm256_cvtepi8_epi32(hi),
            _mm256_cvtepi8_epi32(hi2),
        ]
    } else {
        [
            _mm256_cvtepu8_epi32(lo),
            _mm256_cvtepu8_epi32(lo2),
            _mm256_cvtepu8_epi32(hi),
            _mm256_cvtepu8_epi32(hi2),
        ]
    }
}

/// `d1·q − m1` for the 32 unsigned codes in `codes` (a multiply, then a subtract).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_min(codes: __m256i, d1: f32, m1: f32) -> Block8 {
    let (d1, m1) = (_mm256_set1_ps(d1), _mm256_set1_ps(m1));
    let q = widen::<false>(codes);
    let mut out = [_mm256_setzero_ps(); 4];
    for (o, q) in out.iter_mut().zip(q) {
        *o = _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(q)), m1);
    }
    out
}

/// Decodes sub-block `j` of a Q4_K super-block: its nibbles are the low (even `j`) or
/// high (odd `j`) halves of the 32 bytes of 64-element chunk `j / 2`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_k_sub(sb: *const u8, j: usize, sc: &SubScales) -> Block8 {
    let codes = bits32(sb.add(16 + 32 * (j / 2)), 4 * (j % 2), 0xF);
    scale_min(codes, sc[j], sc[8 + j])
}

/// Decodes sub-block `j` of a Q5_K super-block: Q4_K's nibbles (at byte 48) plus bit
/// `j` of the 32 `qh` bytes as the fifth bit.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_k_sub(sb: *const u8, j: usize, sc: &SubScales) -> Block8 {
    let low = bits32(sb.add(48 + 32 * (j / 2)), 4 * (j % 2), 0xF);
    let high = bits32(sb.add(16), j, 1);
    // The high bits are 0 or 1 in each byte, so a 16-bit shift cannot cross bytes.
    let codes = _mm256_or_si256(low, _mm256_slli_epi16::<4>(high));
    scale_min(codes, sc[j], sc[8 + j])
}

/// The 32 signed codes `q − 32` of Q6_K sub-block `j` (elements 32j..32j + 32).
/// Sub-block `j = 4n + t`: low nibbles from `ql[64n + 32(t & 1)..]` (high halves when
/// `t >= 2`), two high bits from bits `2t..2t + 2` of `qh[32n..]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k_codes(sb: *const u8, j: usize) -> __m256i {
    let (n, t) = (j / 4, j % 4);
    let low = bits32(sb.add(64 * n + 32 * (t & 1)), 4 * (t / 2), 0xF);
    let high = bits32(sb.add(128 + 32 * n), 2 * t, 3);
    // Codes are 0..64, so `q − 32` fits an i8 and bytes never carry into each other.
    let q = _mm256_or_si256(low, _mm256_slli_epi16::<4>(high));
    _mm256_sub_epi8(q, _mm256_set1_epi8(32))
}

/// Decodes sub-block `j` of a Q6_K super-block: `(d·sc)·(q − 32)`, one int8 scale per
/// 16 elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k_sub(sb: *const u8, j: usize, sc: &SubScales) -> Block8 {
    let (ds0, ds1) = (_mm256_set1_ps(sc[2 * j]), _mm256_set1_ps(sc[2 * j + 1]));
    let q = widen::<true>(q6_k_codes(sb, j));
    [
        _mm256_mul_ps(ds0, _mm256_cvtepi32_ps(q[0])),
        _mm256_mul_ps(ds0, _mm256_cvtepi32_ps(q[1])),
        _mm256_mul_ps(ds1, _mm256_cvtepi32_ps(q[2])),
        _mm256_mul_ps(ds1, _mm256_cvtepi32_ps(q[3])),
    ]
}

/// Decodes the `n / 256` super-blocks of a Q4_K, Q5_K or Q6_K row at `src` into `dst`,
/// bit-identical to the portable decoder (decoding the f32 matmul's panels through that
/// one took ~5% of a Q4_K_M prefill).
///
/// # Safety
/// AVX2, FMA and F16C are available; `format` is Q4_K, Q5_K or Q6_K, `src` holds
/// `format.bytes_for(n)` bytes and `dst` has room for `n` floats (`n % 256 == 0`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dequant_row(format: DType, src: *const u8, n: usize, dst: *mut f32) {
    let bb = format.block_bytes();
    for (s, o) in (0..n / 256).map(|s| (src.add(s * bb), dst.add(s * 256))) {
        let sc = if format == DType::Q6_K {
            q6_scales(s)
        } else {
            k4_scales(s)
        };
        for j in 0..8 {
            let v = match format {
                DType::Q4_K => q4_k_sub(s, j, &sc),
                DType::Q5_K => q5_k_sub(s, j, &sc),
                _ => q6_k_sub(s, j, &sc),
            };
            for (i, v) in v.iter().enumerate() {
                _mm256_storeu_ps(o.add(32 * j + 8 * i), *v);
            }
        }
    }
}
