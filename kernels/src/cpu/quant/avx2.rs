//! AVX2 + FMA block decoders shared by dequantization and the matmul kernels: the
//! 256-bit twins of `quant::simd`. Each 32-element block decodes into four vectors of
//! eight floats (elements 0..8, 8..16, 16..24, 24..32), with the same f32 operations
//! as the portable decoder, so the decoded values are bit-identical to it.
//!
//! Every function needs AVX2, FMA and F16C (`CpuFeatures::has_avx2_kernels`).
use super::WeightFormat;
use std::arch::x86_64::*;

/// One decoded 32-element block.
pub(crate) type Block8 = [__m256; 4];

/// Broadcasts the little-endian f16 at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn bcast_f16(p: *const u8) -> __m256 {
    let bits = (p as *const u16).read_unaligned();
    _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))))
}

/// Decodes 8 f16 values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_f16(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// Decodes 8 bf16 values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_bf16(p: *const u8) -> __m256 {
    let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
}

/// The 32 nibbles at `p` as i32 lanes: low nibbles of bytes 0..16 (elements 0..16),
/// then high nibbles (elements 16..32), as GGML's 4- and 5-bit blocks store them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> [__m256i; 4] {
    let a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
    let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i));
    let low = _mm256_set1_epi32(0xF);
    [
        _mm256_and_si256(a, low),
        _mm256_and_si256(b, low),
        _mm256_srli_epi32::<4>(a),
        _mm256_srli_epi32::<4>(b),
    ]
}

/// Decodes one Q8_0 block: `q·d`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0_block(b: *const u8) -> Block8 {
    let d = bcast_f16(b);
    let mut out = [_mm256_setzero_ps(); 4];
    for (v, o) in out.iter_mut().enumerate() {
        let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(2 + 8 * v) as *const __m128i));
        *o = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
    }
    out
}

/// Decodes one Q4_0 block: `(q − 8)·d`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_0_block(b: *const u8) -> Block8 {
    let d = bcast_f16(b);
    let eight = _mm256_set1_epi32(8);
    let q = nibbles(b.add(2));
    let mut out = [_mm256_setzero_ps(); 4];
    // Index loops, not `array::map`: a closure called from core's (not inlined) map
    // loses this function's target features and runs out of line, 20× slower.
    for v in 0..4 {
        out[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[v], eight)), d);
    }
    out
}

/// Decodes one Q4_1 block: `fma(q, d, m)` (the portable decoder's `mul_add`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_1_block(b: *const u8) -> Block8 {
    // d and m converted together from one 32-bit load.
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((b as *const i32).read_unaligned()));
    let d = _mm256_broadcastss_ps(dm);
    let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    let q = nibbles(b.add(4));
    let mut out = [_mm256_setzero_ps(); 4];
    for v in 0..4 {
        out[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[v]), d, m);
    }
    out
}

/// Decodes one Q5_0 (`Q5_1 == false`: `(q − 16)·d`) or Q5_1 (`q·d + m`, unfused)
/// block: nibbles plus the fifth bits of `qh`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_block<const Q5_1: bool>(b: *const u8) -> Block8 {
    let d = bcast_f16(b);
    let at = if Q5_1 { 4 } else { 2 };
    let qh = _mm256_set1_epi32((b.add(at) as *const i32).read_unaligned());
    let q = nibbles(b.add(at + 4));
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let one = _mm256_set1_epi32(1);
    let mut out = [_mm256_setzero_ps(); 4];
    let m = if Q5_1 {
        bcast_f16(b.add(2))
    } else {
        _mm256_setzero_ps()
    };
    for v in 0..4 {
        // Element 8·v + lane takes bit 8·v + lane of qh.
        let shift = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * v as i32));
        let bit = _mm256_and_si256(_mm256_srlv_epi32(qh, shift), one);
        let code = _mm256_or_si256(q[v], _mm256_slli_epi32::<4>(bit));
        out[v] = if Q5_1 {
            _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(code), d), m)
        } else {
            let c = _mm256_sub_epi32(code, _mm256_set1_epi32(16));
            _mm256_mul_ps(_mm256_cvtepi32_ps(c), d)
        };
    }
    out
}

/// Dequantizes `n` elements from `src` into `dst`.
///
/// # Safety
/// AVX2 kernels must be supported; `src` holds `format.bytes_for(n)` bytes and `dst`
/// has room for `n` floats; quantized formats need `n % 32 == 0`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dequant_row(format: WeightFormat, src: *const u8, n: usize, dst: *mut f32) {
    match format {
        // Byte copy: the weight bytes need not be 4-byte aligned (a `*const f32` would have
        // to be; found by the quant_blocks fuzzer).
        WeightFormat::F32 => std::ptr::copy_nonoverlapping(src, dst as *mut u8, n * 4),
        WeightFormat::F16 | WeightFormat::BF16 => {
            let mut i = 0;
            while i + 8 <= n {
                let v = if format == WeightFormat::F16 {
                    load8_f16(src.add(2 * i))
                } else {
                    load8_bf16(src.add(2 * i))
                };
                _mm256_storeu_ps(dst.add(i), v);
                i += 8;
            }
            let s = std::slice::from_raw_parts(src.add(2 * i), 2 * (n - i));
            let d = std::slice::from_raw_parts_mut(dst.add(i), n - i);
            super::dequantize_scalar(format, s, d);
        }
        WeightFormat::Q8_0
        | WeightFormat::Q4_0
        | WeightFormat::Q4_1
        | WeightFormat::Q5_0
        | WeightFormat::Q5_1 => {
            let bb = format.block_bytes();
            for blk in 0..n / 32 {
                let b = src.add(blk * bb);
                let v = match format {
                    WeightFormat::Q8_0 => q8_0_block(b),
                    WeightFormat::Q4_0 => q4_0_block(b),
                    WeightFormat::Q5_0 => q5_block::<false>(b),
                    WeightFormat::Q5_1 => q5_block::<true>(b),
                    _ => q4_1_block(b),
                };
                for (j, v) in v.iter().enumerate() {
                    _mm256_storeu_ps(dst.add(blk * 32 + 8 * j), *v);
                }
            }
        }
        // The other K-quant and IQ4 types: the portable decoder (DType::EXTRA_QUANTS).
        other => {
            let bytes = std::slice::from_raw_parts(src, other.bytes_for(n));
            let out = std::slice::from_raw_parts_mut(dst, n);
            crate::cpu::kquants::dequant::dequantize_row(other, bytes, out);
        }
    }
}
