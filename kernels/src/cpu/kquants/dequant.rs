//! Portable decoders of the 5-bit, K-quant and IQ4 blocks (see the layout table in
//! [`super`]). Products are plain f32 multiplications in the order ggml's reference
//! dequantizers use (scale·sub-scale first), so the results match them exactly.

use super::IQ4_VALUES;
use crate::dtype::{DType, QK_K};
use half::f16;

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Decodes `out.len()` elements of `format` (one of [`DType::EXTRA_QUANTS`]) from
/// `bytes` (exactly `format.bytes_for(out.len())` of them).
///
/// # Panics
/// On a format that is not one of [`DType::EXTRA_QUANTS`] (callers dispatch the
/// others elsewhere).
pub(crate) fn dequantize_row(format: DType, bytes: &[u8], out: &mut [f32]) {
    let (be, bb) = (format.block_elems(), format.block_bytes());
    let blocks = out.chunks_exact_mut(be).zip(bytes.chunks_exact(bb));
    match format {
        DType::Q5_0 => blocks.for_each(|(o, b)| q5_0(b, o)),
        DType::Q5_1 => blocks.for_each(|(o, b)| q5_1(b, o)),
        DType::IQ4_NL => blocks.for_each(|(o, b)| iq4_nl(b, o)),
        DType::Q2_K => blocks.for_each(|(o, b)| q2_k(b, o)),
        DType::Q3_K => blocks.for_each(|(o, b)| q3_k(b, o)),
        DType::Q4_K => blocks.for_each(|(o, b)| q4_k(b, o)),
        DType::Q5_K => blocks.for_each(|(o, b)| q5_k(b, o)),
        DType::Q6_K => blocks.for_each(|(o, b)| q6_k(b, o)),
        DType::Q8_K => blocks.for_each(|(o, b)| q8_k(b, o)),
        DType::IQ4_XS => blocks.for_each(|(o, b)| iq4_xs(b, o)),
        other => unreachable!("kquants::dequantize_row of {other:?}"),
    }
}

/// The 5-bit codes of a Q5_0/Q5_1 block: nibbles at `qs`, fifth bits in the u32 `qh`.
fn five_bit_codes(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0xF) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

fn q5_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, q) in o.iter_mut().zip(five_bit_codes(&b[2..6], &b[6..22])) {
        *y = (q as i32 - 16) as f32 * d;
    }
}

fn q5_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (y, q) in o.iter_mut().zip(five_bit_codes(&b[4..8], &b[8..24])) {
        *y = q as f32 * d + m;
    }
}

fn iq4_nl(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        o[j] = d * IQ4_VALUES[(b[2 + j] & 0xF) as usize] as f32;
        o[j + 16] = d * IQ4_VALUES[(b[2 + j] >> 4) as usize] as f32;
    }
}

fn q2_k(b: &[u8], o: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (i, y) in o.iter_mut().enumerate().take(QK_K) {
        // Element 128n + 32j + l is bits 2j..2j+2 of qs[32n + l]; sub-block i / 16.
        let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
        let sc = scales[i / 16];
        let q = (qs[32 * n + l] >> (2 * j)) & 3;
        let dl = d * (sc & 0xF) as f32;
        let ml = dmin * (sc >> 4) as f32;
        *y = dl * q as f32 - ml;
    }
}

/// The sixteen 6-bit scales of a Q3_K block, unpacked from its 12 bytes: low nibbles
/// in bytes 0..8 (low then high nibble halves), top two bits in bytes 8..12.
pub(crate) fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, v) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *v = ((low | (high << 4)) as i32 - 32) as i8;
    }
    out
}

fn q3_k(b: &[u8], o: &mut [f32]) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let scales = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    for (i, y) in o.iter_mut().enumerate().take(QK_K) {
        let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
        let low = ((qs[32 * n + l] >> (2 * j)) & 3) as i32;
        let high = (hmask[l] >> (4 * n + j)) & 1;
        let q = low - if high != 0 { 0 } else { 4 };
        let dl = d * scales[i / 16] as f32;
        *y = dl * q as f32;
    }
}

/// Scale and min (6 bits each) of sub-block `j` of a Q4_K/Q5_K block's 12 scale bytes.
pub(crate) fn k4_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The 8 scales and the 8 mins of a Q4_K/Q5_K block's 12 scale bytes, byte `j` of each
/// word being sub-block `j`'s ([`k4_scale_min`]'s layout, four sub-blocks at a time).
/// Only the x86 kernels use it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline]
pub(crate) fn k4_scales_packed(s: &[u8]) -> (u64, u64) {
    let word = |o: usize| u32::from_le_bytes([s[o], s[o + 1], s[o + 2], s[o + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    // Sub-blocks 0..4: low 6 bits of bytes 0..4 (scales) and 4..8 (mins). Sub-blocks
    // 4..8: nibbles of bytes 8..12, plus the top two bits of bytes 0..4 (scales) and
    // 4..8 (mins) as bits 4 and 5. Byte lanes never mix: every shift is masked.
    let (lo6, lo4, hi2) = (0x3F3F_3F3Fu32, 0x0F0F_0F0Fu32, 0x0303_0303u32);
    let sc = (a & lo6) as u64 | (((c & lo4) | ((a >> 6) & hi2) << 4) as u64) << 32;
    let m = (b & lo6) as u64 | ((((c >> 4) & lo4) | ((b >> 6) & hi2) << 4) as u64) << 32;
    (sc, m)
}

fn q4_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for c in 0..4 {
        for h in 0..2 {
            let (sc, m) = k4_scale_min(2 * c + h, scales);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            for l in 0..32 {
                let q = (qs[32 * c + l] >> (4 * h)) & 0xF;
                o[64 * c + 32 * h + l] = d1 * q as f32 - m1;
            }
        }
    }
}

fn q5_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for c in 0..4 {
        for h in 0..2 {
            let sub = 2 * c + h;
            let (sc, m) = k4_scale_min(sub, scales);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            for l in 0..32 {
                let q = ((qs[32 * c + l] >> (4 * h)) & 0xF) | (((qh[l] >> sub) & 1) << 4);
                o[64 * c + 32 * h + l] = d1 * q as f32 - m1;
            }
        }
    }
}

fn q6_k(b: &[u8], o: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for n in 0..2 {
        for l in 0..32 {
            let (lo, hi, h) = (ql[64 * n + l], ql[64 * n + l + 32], qh[32 * n + l]);
            let q = [
                (lo & 0xF) | ((h & 3) << 4),
                (hi & 0xF) | (((h >> 2) & 3) << 4),
                (lo >> 4) | (((h >> 4) & 3) << 4),
                (hi >> 4) | (((h >> 6) & 3) << 4),
            ];
            for (t, &qt) in q.iter().enumerate() {
                let i = 128 * n + 32 * t + l;
                let sc = scales[i / 16] as i8;
                o[i] = d * sc as f32 * (qt as i32 - 32) as f32;
            }
        }
    }
}

fn q8_k(b: &[u8], o: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in o.iter_mut().zip(&b[4..260]) {
        *y = d * (q as i8) as f32;
    }
}

fn iq4_xs(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let (scales_l, qs) = (&b[4..8], &b[8..136]);
    for ib in 0..8 {
        let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF)
            | ((((scales_h >> (2 * ib)) & 3) as u8) << 4);
        let dl = d * (ls as i32 - 32) as f32;
        for j in 0..16 {
            let q = qs[16 * ib + j];
            o[32 * ib + j] = dl * IQ4_VALUES[(q & 0xF) as usize] as f32;
            o[32 * ib + j + 16] = dl * IQ4_VALUES[(q >> 4) as usize] as f32;
        }
    }
}
