//! The AVX2 kernels of the parent module: weight codes widened to i16 (`vpmovzxbw` /
//! `vpmovsxbw`), `vpmaddwd` against the int16 activations, one `vcvtdq2ps` and one FMA
//! per block and activation row; the block scales eight blocks at a time.
//!
//! Every function needs AVX2, FMA and F16C (`CpuFeatures::has_avx2_kernels`).

use std::arch::x86_64::*;

use crate::cpu::block32::{blk_bytes, codes_at, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::quant::QK;

dot_kernel!("avx2,fma,f16c");

/// The scales `dw` and offsets `mt` of blocks `b0..b0 + cnt` of a row (`cnt ≤ 8`; the
/// other lanes zero), from the blocks' first four bytes (the f16 scale, and the
/// Q4_1/Q5_1 minimum or two bytes of codes or high bits). The eight words are put
/// together in general-purpose registers and moved over in two 64-bit halves: on Zen 3
/// `vpgatherdd` took a third of a one-row Q8_0 product's time, and the integer pipes
/// are otherwise idle here.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scales8<const F: u8>(
    row: *const u8,
    b0: usize,
    cnt: usize,
) -> (__m256, __m256) {
    let bb = blk_bytes(F);
    let base = row.add(b0 * bb);
    let word = |b: usize| -> u64 {
        if b < cnt {
            (base.add(b * bb) as *const u32).read_unaligned() as u64
        } else {
            0
        }
    };
    // Four blocks' words → their four scales (low halves) and four minima (high halves).
    let quad = |b: usize| -> (i64, i64) {
        let (w0, w1, w2, w3) = (word(b), word(b + 1), word(b + 2), word(b + 3));
        let lo = |w: u64| w & 0xFFFF;
        let d = lo(w0) | lo(w1) << 16 | lo(w2) << 32 | lo(w3) << 48;
        let m = (w0 >> 16) | (w1 >> 16) << 16 | (w2 >> 16) << 32 | (w3 >> 16) << 48;
        (d as i64, m as i64)
    };
    let (d0, m0) = quad(0);
    let (d1, m1) = quad(4);
    let dv = _mm256_cvtph_ps(_mm_set_epi64x(d1, d0));
    let mt = match F {
        Q4_1 | Q5_1 => _mm256_cvtph_ps(_mm_set_epi64x(m1, m0)),
        Q4_0 => _mm256_mul_ps(dv, _mm256_set1_ps(-8.0)),
        Q5_0 => _mm256_mul_ps(dv, _mm256_set1_ps(-16.0)),
        _ => _mm256_setzero_ps(),
    };
    (dv, mt)
}

/// `v`, hidden from the optimizer: LLVM would otherwise narrow `and(zext(bytes), 15)`
/// and `zext(bytes) >> 4` into two byte operations and two widenings, 6 instructions
/// instead of 3.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn opaque(mut v: __m256i) -> __m256i {
    std::arch::asm!("/* {0} */", inout(ymm_reg) v, options(pure, nomem, nostack, preserves_flags));
    v
}

/// The 32 codes of the block at `p` as i16: elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn codes<const F: u8>(p: *const u8) -> (__m256i, __m256i) {
    let c = p.add(codes_at(F));
    if F == Q8_0 {
        return (
            _mm256_cvtepi8_epi16(_mm_loadu_si128(c as *const __m128i)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(c.add(16) as *const __m128i)),
        );
    }
    if F == Q5_0 || F == Q5_1 {
        return widen(codes5::<F>(p));
    }
    nibbles(c)
}

/// The 32 nibbles of the 16 bytes at `c` as i16, in element order: byte j holds element
/// j (low nibble) and element j + 16 (high nibble).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles(c: *const u8) -> (__m256i, __m256i) {
    let v = opaque(_mm256_cvtepu8_epi16(_mm_loadu_si128(c as *const __m128i)));
    (
        _mm256_and_si256(v, _mm256_set1_epi16(0x0F)),
        _mm256_srli_epi16::<4>(v),
    )
}

/// The 32 bytes of `v` as i16: bytes 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen(v: __m256i) -> (__m256i, __m256i) {
    (
        _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v)),
        _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(v)),
    )
}

/// The 32 five-bit codes (0..32) of the Q5_0/Q5_1 block at `p`, one per byte in element
/// order. The high bits are spread in bytes, all 32 at once (each byte of `qh` copied to
/// eight, OR-ed with every bit but its own, compared with all ones), before one
/// widening: 11 operations where testing them in 16-bit lanes took 15.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn codes5<const F: u8>(p: *const u8) -> __m256i {
    let c = _mm_loadu_si128(p.add(codes_at(F)) as *const __m128i);
    // Low nibbles (elements 0..16), then high nibbles (16..32).
    let nibbles = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(c), c),
        _mm256_set1_epi8(0x0F),
    );
    // Bit e of qh is bit 4 of element e: byte e of `spread` is qh's byte e / 8.
    let qh = _mm256_set1_epi32((p.add(codes_at(F) - 4) as *const i32).read_unaligned());
    let spread = _mm256_shuffle_epi8(
        qh,
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        ),
    );
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
    _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
}

/// [`super::quantize_row`] on AVX2 with the same results: the same `32767 / amax`
/// reciprocal, the same f32 products and `vcvtps2dq`'s round-half-to-even (for finite
/// blocks); `sx` sums the 32 values in eight lanes (another order, so it may differ in
/// the last bit).
///
/// # Safety
/// AVX2, FMA and F16C are available; `q` holds `x.len()` values, `dx` and `sx`
/// `x.len() / 32`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_row(x: &[f32], q: &mut [i16], dx: &mut [f32], sx: &mut [f32]) {
    let nb = x.len() / QK;
    debug_assert!(q.len() >= nb * QK && dx.len() >= nb && sx.len() >= nb);
    let p = x.as_ptr();
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    for b in 0..nb {
        let mut v = [_mm256_setzero_ps(); 4];
        let mut mx = _mm256_setzero_ps();
        for (j, vj) in v.iter_mut().enumerate() {
            *vj = _mm256_loadu_ps(p.add(b * QK + 8 * j));
            mx = _mm256_max_ps(mx, _mm256_and_ps(*vj, abs_mask));
        }
        let sum = _mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3]));
        let m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let s = hsum(sum);
        // NaN when the block holds a NaN or an infinity (x·0 is NaN only for those).
        let zero = _mm256_setzero_ps();
        let z = _mm256_add_ps(
            _mm256_add_ps(_mm256_mul_ps(v[0], zero), _mm256_mul_ps(v[1], zero)),
            _mm256_add_ps(_mm256_mul_ps(v[2], zero), _mm256_mul_ps(v[3], zero)),
        );
        let nonfinite = hsum(z);
        let id = if amax != 0.0 { 32767.0 / amax } else { 0.0 };
        dx[b] = amax / 32767.0 + nonfinite;
        sx[b] = s;
        let vid = _mm256_set1_ps(id);
        let qi: [__m256i; 4] = [
            _mm256_cvtps_epi32(_mm256_mul_ps(v[0], vid)),
            _mm256_cvtps_epi32(_mm256_mul_ps(v[1], vid)),
            _mm256_cvtps_epi32(_mm256_mul_ps(v[2], vid)),
            _mm256_cvtps_epi32(_mm256_mul_ps(v[3], vid)),
        ];
        // The saturating pack interleaves 128-bit lanes; the permute undoes it.
        for h in 0..2 {
            let packed = _mm256_packs_epi32(qi[2 * h], qi[2 * h + 1]);
            let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
            _mm256_storeu_si256(q.as_mut_ptr().add(b * QK + 16 * h) as *mut __m256i, ordered);
        }
    }
}
