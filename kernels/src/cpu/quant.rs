//! Weight element formats (GGML block layouts) and (de)quantization of flat buffers.

use crate::cpu::CpuIsa;
use crate::dtype::DType;
use crate::error::{check_len, KernelError};
use half::{bf16, f16};

pub use crate::dtype::QK;

/// Storage format of weight elements: the crate's one element type, [`DType`].
pub type WeightFormat = DType;

/// Dequantizes `bytes` (in `format`) into `out`; `out.len()` elements are decoded.
///
/// ```
/// use dcpserve_kernels::{dequantize, WeightFormat};
/// let bytes: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
/// let mut out = [0.0f32; 2];
/// dequantize(WeightFormat::F32, &bytes, &mut out).unwrap();
/// assert_eq!(out, [1.5, -2.0]);
/// ```
pub fn dequantize(format: WeightFormat, bytes: &[u8], out: &mut [f32]) -> Result<(), KernelError> {
    format.check_elems(out.len())?;
    check_len("dequantize bytes", format.bytes_for(out.len()), bytes.len())?;
    dequantize_unchecked(format, bytes, out, crate::cpu::isa());
    Ok(())
}

/// Like [`dequantize`] without validation, at kernel level `isa` (which the CPU must
/// support: callers pass [`crate::cpu::isa`] or a level from `CpuIsa::available`).
pub(crate) fn dequantize_unchecked(
    format: WeightFormat,
    bytes: &[u8],
    out: &mut [f32],
    isa: CpuIsa,
) {
    debug_assert_eq!(bytes.len(), format.bytes_for(out.len()));
    debug_assert!(isa <= crate::cpu::features().best_isa());
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: the CPU supports `isa` (above), and the lengths were checked by the
        // caller.
        CpuIsa::Avx512 => {
            unsafe { simd::dequant_row(format, bytes.as_ptr(), out.len(), out.as_mut_ptr()) };
            return;
        }
        CpuIsa::Avx2 => {
            let (src, n, dst) = (bytes.as_ptr(), out.len(), out.as_mut_ptr());
            match format {
                WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K => unsafe {
                    crate::cpu::kquants::simd_avx2::dequant_row(format, src, n, dst)
                },
                _ => unsafe { avx2::dequant_row(format, src, n, dst) },
            }
            return;
        }
        CpuIsa::Scalar | CpuIsa::Neon => {}
    }
    #[cfg(target_arch = "aarch64")]
    if isa == CpuIsa::Neon {
        // SAFETY: NEON is part of the aarch64 baseline, and the lengths were checked
        // by the caller.
        unsafe { neon::dequant_row(format, bytes.as_ptr(), out.len(), out.as_mut_ptr()) };
        return;
    }
    dequantize_scalar(format, bytes, out);
}

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Portable dequantization.
pub(crate) fn dequantize_scalar(format: WeightFormat, bytes: &[u8], out: &mut [f32]) {
    match format {
        WeightFormat::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightFormat::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        WeightFormat::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        WeightFormat::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for j in 0..QK {
                    o[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
        WeightFormat::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    o[j] = ((q & 0xF) as i32 - 8) as f32 * d;
                    o[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        WeightFormat::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(20)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                for j in 0..16 {
                    let q = b[4 + j];
                    o[j] = ((q & 0xF) as f32).mul_add(d, m);
                    o[j + 16] = ((q >> 4) as f32).mul_add(d, m);
                }
            }
        }
        // The 5-bit, K-quant and IQ4 types (DType::EXTRA_QUANTS).
        other => crate::cpu::kquants::dequant::dequantize_row(other, bytes, out),
    }
}

/// Encodes `src` into `format`, appending to `out`. Quantized formats follow GGML's
/// reference quantizers. `src.len()` must be a whole number of blocks.
pub fn quantize(format: WeightFormat, src: &[f32], out: &mut Vec<u8>) -> Result<(), KernelError> {
    format.check_elems(src.len())?;
    out.reserve(format.bytes_for(src.len()));
    match format {
        WeightFormat::F32 => src
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        WeightFormat::F16 => src
            .iter()
            .for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        WeightFormat::BF16 => src
            .iter()
            .for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes())),
        WeightFormat::Q8_0 => {
            for blk in src.chunks_exact(QK) {
                let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend(
                    blk.iter()
                        .map(|v| ((v * id).round() as i32).clamp(-128, 127) as i8 as u8),
                );
            }
        }
        WeightFormat::Q4_0 => {
            for blk in src.chunks_exact(QK) {
                let mut max = 0.0f32;
                for &v in blk {
                    if v.abs() > max.abs() {
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
                out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
            }
        }
        WeightFormat::Q4_1 => {
            for blk in src.chunks_exact(QK) {
                let min = blk.iter().copied().fold(f32::INFINITY, f32::min);
                let max = blk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
                let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
            }
        }
        // The 5-bit, K-quant and IQ4 types (DType::EXTRA_QUANTS).
        other => crate::cpu::kquants::quantize::quantize_row(other, src, out),
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;

#[cfg(target_arch = "x86_64")]
pub(crate) mod simd {
    //! AVX-512 block decoders shared by dequantization and the matmul kernels.
    use super::WeightFormat;
    use std::arch::x86_64::*;

    /// Broadcasts the little-endian f16 at `p`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(crate) unsafe fn bcast_f16(p: *const u8) -> __m512 {
        let bits = (p as *const u16).read_unaligned();
        _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))))
    }

    /// Decodes 16 f16 values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(crate) unsafe fn load16_f16(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }

    /// Decodes 16 bf16 values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(crate) unsafe fn load16_bf16(p: *const u8) -> __m512 {
        let v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v))
    }

    /// Decodes one 32-element quantized block at `b` into two vectors.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(crate) unsafe fn q8_0_block(b: *const u8) -> (__m512, __m512) {
        let d = bcast_f16(b);
        let q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2) as *const __m128i));
        let q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(18) as *const __m128i));
        (
            _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d),
            _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d),
        )
    }

    // The 16 nibble values, shared with the K-quant decoders (which this module calls).
    use crate::cpu::kquants::simd_avx512::iota;

    /// Looks the 32 nibbles at `p` up in a 16-entry table of decoded values.
    /// `vpermps` only reads the low 4 bits of each index, so the low nibbles need no
    /// masking; this replaces mask + int→float + FMA per vector with one permute.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn lookup_nibbles(p: *const u8, table: __m512) -> (__m512, __m512) {
        let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
        (
            _mm512_permutexvar_ps(v, table),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), table),
        )
    }

    /// Decodes one Q4_0 block (table entry `q` = `(q − 8)·d`, exact like the scalar path).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(crate) unsafe fn q4_0_block(b: *const u8) -> (__m512, __m512) {
        let d = bcast_f16(b);
        let table = _mm512_mul_ps(_mm512_sub_ps(iota(), _mm512_set1_ps(8.0)), d);
        lookup_nibbles(b.add(2), table)
    }

    /// Decodes one Q4_1 block (table entry `q` = `fma(q, d, m)`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(crate) unsafe fn q4_1_block(b: *const u8) -> (__m512, __m512) {
        // d and m converted together from one 32-bit load.
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((b as *const i32).read_unaligned()));
        let d = _mm512_broadcastss_ps(dm);
        let m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
        lookup_nibbles(b.add(4), _mm512_fmadd_ps(iota(), d, m))
    }

    /// Decodes one Q5_0 (`q5_1 == false`) or Q5_1 block: nibbles plus the fifth bits
    /// of `qh` (added through mask registers); the same f32 operations as the portable
    /// decoder (`(q − 16)·d`, or `q·d + m` unfused), so results are identical.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(crate) unsafe fn q5_block<const Q5_1: bool>(b: *const u8) -> (__m512, __m512) {
        let d = bcast_f16(b);
        let at = if Q5_1 { 4 } else { 2 };
        let qh = (b.add(at) as *const u32).read_unaligned();
        let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(at + 4) as *const __m128i));
        let sixteen = _mm512_set1_epi32(16);
        let lo = _mm512_and_si512(v, _mm512_set1_epi32(0xF));
        let hi = _mm512_srli_epi32::<4>(v);
        let lo = _mm512_mask_add_epi32(lo, qh as u16, lo, sixteen);
        let hi = _mm512_mask_add_epi32(hi, (qh >> 16) as u16, hi, sixteen);
        if Q5_1 {
            let m = bcast_f16(b.add(2));
            (
                _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(lo), d), m),
                _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(hi), d), m),
            )
        } else {
            (
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(lo, sixteen)), d),
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(hi, sixteen)), d),
            )
        }
    }

    /// Dequantizes `n` elements from `src` into `dst`.
    ///
    /// # Safety
    /// AVX-512 kernels must be supported; `src` holds `format.bytes_for(n)` bytes and
    /// `dst` has room for `n` floats; quantized formats need whole blocks of `n`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(crate) unsafe fn dequant_row(
        format: WeightFormat,
        src: *const u8,
        n: usize,
        dst: *mut f32,
    ) {
        match format {
            // Byte copy: the weight bytes need not be 4-byte aligned (a `*const f32` would have
            // to be; found by the quant_blocks fuzzer).
            WeightFormat::F32 => std::ptr::copy_nonoverlapping(src, dst as *mut u8, n * 4),
            WeightFormat::F16 | WeightFormat::BF16 => {
                let mut i = 0;
                while i + 16 <= n {
                    let v = if format == WeightFormat::F16 {
                        load16_f16(src.add(2 * i))
                    } else {
                        load16_bf16(src.add(2 * i))
                    };
                    _mm512_storeu_ps(dst.add(i), v);
                    i += 16;
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
                    let (v0, v1) = match format {
                        WeightFormat::Q8_0 => q8_0_block(b),
                        WeightFormat::Q4_0 => q4_0_block(b),
                        WeightFormat::Q5_0 => q5_block::<false>(b),
                        WeightFormat::Q5_1 => q5_block::<true>(b),
                        _ => q4_1_block(b),
                    };
                    _mm512_storeu_ps(dst.add(blk * 32), v0);
                    _mm512_storeu_ps(dst.add(blk * 32 + 16), v1);
                }
            }
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K => {
                use crate::cpu::kquants::simd_avx2::{k4_scales, q6_scales};
                use crate::cpu::kquants::simd_avx512::{q4_k_sub, q5_k_sub, q6_k_sub};
                let bb = format.block_bytes();
                for (s, o) in (0..n / 256).map(|s| (src.add(s * bb), dst.add(s * 256))) {
                    let sc = if format == WeightFormat::Q6_K {
                        q6_scales(s)
                    } else {
                        k4_scales(s)
                    };
                    for j in 0..8 {
                        let (v0, v1) = match format {
                            WeightFormat::Q4_K => q4_k_sub(s, j, &sc),
                            WeightFormat::Q5_K => q5_k_sub(s, j, &sc),
                            _ => q6_k_sub(s, j, &sc),
                        };
                        _mm512_storeu_ps(o.add(32 * j), v0);
                        _mm512_storeu_ps(o.add(32 * j + 16), v1);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [WeightFormat; 8] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::BF16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
    ];

    fn data(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 % 113) as f32 - 56.0) / 17.0)
            .collect()
    }

    #[test]
    fn roundtrip_and_simd_matches_scalar() {
        let src = data(96);
        for f in ALL {
            let mut bytes = Vec::new();
            quantize(f, &src, &mut bytes).unwrap();
            assert_eq!(bytes.len(), f.bytes_for(96));
            let mut a = vec![0.0; 96];
            dequantize_unchecked(f, &bytes, &mut a, CpuIsa::Scalar);
            // Every SIMD decoder gives the portable decoder's values bit for bit.
            for isa in CpuIsa::available() {
                let mut b = vec![0.0; 96];
                dequantize_unchecked(f, &bytes, &mut b, isa);
                assert_eq!(a, b, "{f:?} at {isa}");
            }
            let tol = match f {
                WeightFormat::F32 => 0.0,
                WeightFormat::F16 | WeightFormat::BF16 => 0.02,
                WeightFormat::Q8_0 => 0.03,
                WeightFormat::Q5_0 | WeightFormat::Q5_1 => 0.25,
                _ => 0.45,
            };
            for (x, y) in src.iter().zip(&a) {
                assert!((x - y).abs() <= tol, "{f:?}: {x} vs {y}");
            }
        }
    }

    /// Every SIMD decoder against the portable one on arbitrary bytes: all nibble and
    /// fifth-bit patterns, f16 subnormals, infinities and NaNs, and float rows whose
    /// length is not a multiple of the vector width.
    #[test]
    fn simd_decoders_match_scalar_on_any_bytes() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut byte = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        };
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for f in ALL {
            let lens: &[usize] = if f.block_elems() == 1 {
                &[37, 256]
            } else {
                &[256]
            };
            for &n in lens {
                let bytes: Vec<u8> = (0..f.bytes_for(n)).map(|_| byte()).collect();
                let mut a = vec![0.0; n];
                dequantize_unchecked(f, &bytes, &mut a, CpuIsa::Scalar);
                for isa in CpuIsa::available() {
                    let mut b = vec![0.0; n];
                    dequantize_unchecked(f, &bytes, &mut b, isa);
                    for (j, (x, y)) in a.iter().zip(&b).enumerate() {
                        assert!(same(*x, *y), "{f:?} at {isa}, element {j}: {x} vs {y}");
                    }
                }
            }
        }
    }

    /// The SIMD sub-block decoders of the K-quants give the portable decoder's values
    /// bit for bit on any super-block: random bytes, with finite (possibly subnormal or
    /// negative) f16 scales.
    #[test]
    fn k_quant_simd_decoders_match_portable() {
        let mut s = 0x2545F4914F6CDD1Du64;
        let mut byte = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 32) as u8
        };
        for (f, f16_at) in [
            (WeightFormat::Q4_K, &[0usize, 2][..]),
            (WeightFormat::Q5_K, &[0, 2]),
            (WeightFormat::Q6_K, &[208]),
        ] {
            let n = 16 * 256;
            let mut bytes: Vec<u8> = (0..f.bytes_for(n)).map(|_| byte()).collect();
            for sb in bytes.chunks_exact_mut(f.block_bytes()) {
                for &at in f16_at {
                    // An all-ones exponent (inf/NaN) becomes a finite one.
                    if sb[at + 1] & 0x7C == 0x7C {
                        sb[at + 1] &= !0x40;
                    }
                }
            }
            let mut want = vec![0.0; n];
            dequantize_unchecked(f, &bytes, &mut want, CpuIsa::Scalar);
            assert!(want.iter().all(|v| v.is_finite()), "{f:?}");
            for isa in CpuIsa::available() {
                let mut got = vec![f32::NAN; n];
                dequantize_unchecked(f, &bytes, &mut got, isa);
                for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{f:?} at {isa}, element {i}");
                }
            }
        }
    }

    #[test]
    fn q4_0_layout() {
        // d = 1.0, byte j = low nibble j, high nibble 15-j.
        let mut b = f16::from_f32(1.0).to_le_bytes().to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0.0; 32];
        dequantize(WeightFormat::Q4_0, &b, &mut out).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], j as f32 - 8.0);
            assert_eq!(out[j + 16], (15 - j) as f32 - 8.0);
        }
    }

    #[test]
    fn bad_lengths_are_errors() {
        let mut out = [0.0; 31];
        assert!(dequantize(WeightFormat::Q8_0, &[0; 34], &mut out).is_err());
        let mut out = [0.0; 32];
        assert!(dequantize(WeightFormat::Q8_0, &[0; 33], &mut out).is_err());
    }
}
