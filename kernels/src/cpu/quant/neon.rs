//! NEON block decoders shared by dequantization and the aarch64 matmul kernels: the
//! 128-bit twins of `quant::avx2`. Each 32-element block decodes into eight vectors of
//! four floats (elements 0..4, 4..8, …, 28..32), with the same f32 operations as the
//! portable decoder (`q·d`, `(q − 8)·d`, `fma(q, d, m)`, unfused `q·d + m`), so the
//! decoded values are bit-identical to it.
//!
//! NEON is part of the aarch64 baseline, so these need no run-time check; they are
//! `unsafe` for their raw pointers.

use super::WeightFormat;
use std::arch::aarch64::*;
use std::arch::asm;

/// One decoded 32-element block.
pub(crate) type Block4 = [float32x4_t; 8];

/// Widens four f16 (as bits) to f32.
///
/// FCVTL is base ARMv8-A Advanced SIMD, but its intrinsic (`vcvt_f32_f16`) is newer
/// than the crate's minimum Rust, hence the one instruction of assembly. It converts
/// exactly like `half::f16::to_f32` (subnormals kept, NaNs quieted with their payload).
#[inline(always)]
pub(crate) unsafe fn cvt4_f16(h: uint16x4_t) -> float32x4_t {
    let r: float32x4_t;
    // SAFETY: a register-only conversion; no memory, stack or flags touched.
    asm!(
        "fcvtl {r:v}.4s, {h:v}.4h",
        r = lateout(vreg) r,
        h = in(vreg) h,
        options(pure, nomem, nostack, preserves_flags)
    );
    r
}

/// Widens the upper four f16 of `h` to f32 (FCVTL2, see [`cvt4_f16`]).
#[inline(always)]
unsafe fn cvt4_f16_high(h: uint16x8_t) -> float32x4_t {
    let r: float32x4_t;
    // SAFETY: as in `cvt4_f16`.
    asm!(
        "fcvtl2 {r:v}.4s, {h:v}.8h",
        r = lateout(vreg) r,
        h = in(vreg) h,
        options(pure, nomem, nostack, preserves_flags)
    );
    r
}

/// Broadcasts the little-endian f16 at `p`.
#[inline(always)]
pub(crate) unsafe fn bcast_f16(p: *const u8) -> float32x4_t {
    let bits = (p as *const u16).read_unaligned();
    vdupq_laneq_f32::<0>(cvt4_f16(vdup_n_u16(bits)))
}

/// Decodes 8 f16 values (two vectors).
#[inline(always)]
pub(crate) unsafe fn load8_f16(p: *const u8) -> [float32x4_t; 2] {
    // Byte loads: rows need not be 2-byte aligned.
    let v = vreinterpretq_u16_u8(vld1q_u8(p));
    [cvt4_f16(vget_low_u16(v)), cvt4_f16_high(v)]
}

/// Decodes 8 bf16 values (two vectors): the bits shifted into the high half.
#[inline(always)]
pub(crate) unsafe fn load8_bf16(p: *const u8) -> [float32x4_t; 2] {
    let v = vreinterpretq_u16_u8(vld1q_u8(p));
    [
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v))),
        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(v)),
    ]
}

/// Sixteen small signed integers as four f32 vectors (exact).
#[inline(always)]
unsafe fn i8_to_f32(v: int8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_s8(vget_low_s8(v));
    let hi = vmovl_high_s8(v);
    [
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
        vcvtq_f32_s32(vmovl_high_s16(lo)),
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
        vcvtq_f32_s32(vmovl_high_s16(hi)),
    ]
}

/// Sixteen bytes as four f32 vectors (exact).
#[inline(always)]
unsafe fn u8_to_f32(v: uint8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_u8(vget_low_u8(v));
    let hi = vmovl_high_u8(v);
    [
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))),
        vcvtq_f32_u32(vmovl_high_u16(lo)),
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))),
        vcvtq_f32_u32(vmovl_high_u16(hi)),
    ]
}

/// The 32 nibbles at `p`: low nibbles of bytes 0..16 (elements 0..16), then high
/// nibbles (elements 16..32), as GGML's 4- and 5-bit blocks store them.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let v = vld1q_u8(p);
    (vandq_u8(v, vdupq_n_u8(0xF)), vshrq_n_u8::<4>(v))
}

/// Decodes one Q8_0 block: `q·d`.
#[inline(always)]
pub(crate) unsafe fn q8_0_block(b: *const u8) -> Block4 {
    let d = bcast_f16(b);
    let mut out = [vdupq_n_f32(0.0); 8];
    for h in 0..2 {
        let q = i8_to_f32(vreinterpretq_s8_u8(vld1q_u8(b.add(2 + 16 * h))));
        for v in 0..4 {
            out[4 * h + v] = vmulq_f32(q[v], d);
        }
    }
    out
}

/// Decodes one Q4_0 block: `(q − 8)·d`.
#[inline(always)]
pub(crate) unsafe fn q4_0_block(b: *const u8) -> Block4 {
    let d = bcast_f16(b);
    let (lo, hi) = nibbles(b.add(2));
    let eight = vdupq_n_s8(8);
    let mut out = [vdupq_n_f32(0.0); 8];
    for (h, q) in [lo, hi].into_iter().enumerate() {
        let q = i8_to_f32(vsubq_s8(vreinterpretq_s8_u8(q), eight));
        for v in 0..4 {
            out[4 * h + v] = vmulq_f32(q[v], d);
        }
    }
    out
}

/// Decodes one Q4_1 block: `fma(q, d, m)` (the portable decoder's `mul_add`).
#[inline(always)]
pub(crate) unsafe fn q4_1_block(b: *const u8) -> Block4 {
    // d and m converted together from one 32-bit load.
    let dm = cvt4_f16(vreinterpret_u16_u32(vdup_n_u32(
        (b as *const u32).read_unaligned(),
    )));
    let (d, m) = (vdupq_laneq_f32::<0>(dm), vdupq_laneq_f32::<1>(dm));
    let (lo, hi) = nibbles(b.add(4));
    let mut out = [vdupq_n_f32(0.0); 8];
    for (h, q) in [lo, hi].into_iter().enumerate() {
        let q = u8_to_f32(q);
        for v in 0..4 {
            out[4 * h + v] = vfmaq_f32(m, q[v], d);
        }
    }
    out
}

/// Bit `j % 8` of each byte lane `j` (the mask that picks element `j`'s bit out of a
/// byte of `qh` broadcast over eight lanes).
static BIT_OF_LANE: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];

/// The fifth bits of a Q5 block as 0 or 16 per element: elements 0..16 (bits 0..16 of
/// `qh`) and 16..32.
#[inline(always)]
unsafe fn fifth_bits(qh: u32) -> (uint8x16_t, uint8x16_t) {
    let bit = vld1q_u8(BIT_OF_LANE.as_ptr());
    let sixteen = vdupq_n_u8(16);
    // Lanes 0..8 hold byte 2h of qh, lanes 8..16 byte 2h + 1.
    let spread = |h: u32| {
        let (b0, b1) = ((qh >> (16 * h)) as u8, (qh >> (16 * h + 8)) as u8);
        vandq_u8(
            vtstq_u8(vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1)), bit),
            sixteen,
        )
    };
    (spread(0), spread(1))
}

/// Decodes one Q5_0 (`Q5_1 == false`: `(q − 16)·d`) or Q5_1 (`q·d + m`, unfused)
/// block: nibbles plus the fifth bits of `qh`.
#[inline(always)]
pub(crate) unsafe fn q5_block<const Q5_1: bool>(b: *const u8) -> Block4 {
    let d = bcast_f16(b);
    let at = if Q5_1 { 4 } else { 2 };
    let (hb_lo, hb_hi) = fifth_bits((b.add(at) as *const u32).read_unaligned());
    let (lo, hi) = nibbles(b.add(at + 4));
    let codes = [vorrq_u8(lo, hb_lo), vorrq_u8(hi, hb_hi)];
    let mut out = [vdupq_n_f32(0.0); 8];
    if Q5_1 {
        let m = bcast_f16(b.add(2));
        for (h, q) in codes.into_iter().enumerate() {
            let q = u8_to_f32(q);
            for v in 0..4 {
                // Multiply then add, not FMA: the portable decoder rounds twice.
                out[4 * h + v] = vaddq_f32(vmulq_f32(q[v], d), m);
            }
        }
    } else {
        let sixteen = vdupq_n_s8(16);
        for (h, q) in codes.into_iter().enumerate() {
            let q = i8_to_f32(vsubq_s8(vreinterpretq_s8_u8(q), sixteen));
            for v in 0..4 {
                out[4 * h + v] = vmulq_f32(q[v], d);
            }
        }
    }
    out
}

/// Dequantizes `n` elements from `src` into `dst`.
///
/// # Safety
/// `src` holds `format.bytes_for(n)` bytes and `dst` has room for `n` floats;
/// quantized formats need `n % 32 == 0`.
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
                vst1q_f32(dst.add(i), v[0]);
                vst1q_f32(dst.add(i + 4), v[1]);
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
                    vst1q_f32(dst.add(blk * 32 + 4 * j), *v);
                }
            }
        }
        // The K-quant and IQ4 types: the portable decoder (DType::EXTRA_QUANTS).
        other => {
            let bytes = std::slice::from_raw_parts(src, other.bytes_for(n));
            let out = std::slice::from_raw_parts_mut(dst, n);
            crate::cpu::kquants::dequant::dequantize_row(other, bytes, out);
        }
    }
}
