//! The 5-bit, K-quant and IQ4 weight blocks rewritten, one 32-element block at a time,
//! into the shape the 256-bit int8 kernels consume: 32 integer codes in element order
//! and, per group of 4 elements (one 32-bit dot-product lane), a scale `sw` and an
//! offset `ow`, so that weight `i` = `sw[i/4] · code[i] + ow[i/4]`. Every sub-block of
//! these formats is 16 or 32 elements long, so per-lane scales express them exactly.
//!
//! Codes are unsigned (`0..=63`) for the formats with an offset or a bias, so that
//! AVX2's `vpmaddubsw` cannot saturate (`63·127·2 < 32767`), and signed (`|c| ≤ 128`)
//! for Q8_K and the IQ4 codebooks, which the kernels handle with the sign trick.

// Only the x86 kernels call it; elsewhere just its tests build it.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use crate::cpu::kquants::dequant::{k4_scale_min, q3_k_scales};
use crate::cpu::kquants::IQ4_VALUES;
use crate::dtype::{DType, QK};
use half::f16;

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// True when the codes of `format` are signed bytes (no offset).
pub(crate) fn signed_codes(format: DType) -> bool {
    matches!(format, DType::Q8_K | DType::IQ4_NL | DType::IQ4_XS)
}

/// True when `format` has non-zero offsets `ow` (the kernels then also need the
/// activation code sums).
pub(crate) fn has_offsets(format: DType) -> bool {
    !signed_codes(format)
}

/// Rewrites one row (`bytes`, `k` elements of `format`) into `codes[k]`, `sw[k/4]`,
/// `ow[k/4]`.
pub(crate) fn transcode_row(
    format: DType,
    bytes: &[u8],
    codes: &mut [u8],
    sw: &mut [f32],
    ow: &mut [f32],
) {
    let (be, bb) = (format.block_elems(), format.block_bytes());
    for (blk, b) in bytes.chunks_exact(bb).enumerate().take(codes.len() / be) {
        let c = &mut codes[blk * be..(blk + 1) * be];
        let lanes = blk * be / 4..(blk + 1) * be / 4;
        let (s, o) = (&mut sw[lanes.clone()], &mut ow[lanes]);
        match format {
            DType::Q5_0 | DType::Q5_1 => {
                let (d, m, qh_at) = if format == DType::Q5_0 {
                    let d = f16_at(b, 0);
                    (d, -16.0 * d, 2)
                } else {
                    (f16_at(b, 0), f16_at(b, 2), 4)
                };
                let qh = u32::from_le_bytes([b[qh_at], b[qh_at + 1], b[qh_at + 2], b[qh_at + 3]]);
                let qs = &b[qh_at + 4..qh_at + 20];
                for j in 0..16 {
                    c[j] = (qs[j] & 0xF) | ((((qh >> j) & 1) as u8) << 4);
                    c[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                }
                s.fill(d);
                o.fill(m);
            }
            DType::IQ4_NL => {
                for j in 0..16 {
                    c[j] = IQ4_VALUES[(b[2 + j] & 0xF) as usize] as u8;
                    c[j + 16] = IQ4_VALUES[(b[2 + j] >> 4) as usize] as u8;
                }
                s.fill(f16_at(b, 0));
                o.fill(0.0);
            }
            DType::Q8_K => {
                c.copy_from_slice(&b[4..260]);
                s.fill(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                o.fill(0.0);
            }
            DType::IQ4_XS => {
                let d = f16_at(b, 0);
                let scales_h = u16::from_le_bytes([b[2], b[3]]);
                for ib in 0..8 {
                    let ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF)
                        | ((((scales_h >> (2 * ib)) & 3) as u8) << 4);
                    let qs = &b[8 + 16 * ib..8 + 16 * (ib + 1)];
                    for j in 0..16 {
                        c[32 * ib + j] = IQ4_VALUES[(qs[j] & 0xF) as usize] as u8;
                        c[32 * ib + j + 16] = IQ4_VALUES[(qs[j] >> 4) as usize] as u8;
                    }
                    s[8 * ib..8 * (ib + 1)].fill(d * (ls as i32 - 32) as f32);
                }
                o.fill(0.0);
            }
            DType::Q2_K => {
                let (scales, qs) = (&b[0..16], &b[16..80]);
                let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
                for (i, ci) in c.iter_mut().enumerate() {
                    let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
                    *ci = (qs[32 * n + l] >> (2 * j)) & 3;
                }
                for sub in 0..16 {
                    let sc = scales[sub];
                    s[4 * sub..4 * sub + 4].fill(d * (sc & 0xF) as f32);
                    o[4 * sub..4 * sub + 4].fill(-(dmin * (sc >> 4) as f32));
                }
            }
            DType::Q3_K => {
                let (hmask, qs) = (&b[0..32], &b[32..96]);
                let scales = q3_k_scales(&b[96..108]);
                let d = f16_at(b, 108);
                for (i, ci) in c.iter_mut().enumerate() {
                    let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
                    let low = (qs[32 * n + l] >> (2 * j)) & 3;
                    let high = (hmask[l] >> (4 * n + j)) & 1;
                    *ci = low | (high << 2); // q + 4
                }
                for sub in 0..16 {
                    let dl = d * scales[sub] as f32;
                    s[4 * sub..4 * sub + 4].fill(dl);
                    o[4 * sub..4 * sub + 4].fill(-4.0 * dl);
                }
            }
            DType::Q4_K | DType::Q5_K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let scales = &b[4..16];
                let five = format == DType::Q5_K;
                let (qh, qs) = if five {
                    (&b[16..48], &b[48..176])
                } else {
                    (&b[0..0], &b[16..144])
                };
                for cc in 0..4 {
                    for h in 0..2 {
                        let sub = 2 * cc + h;
                        for l in 0..32 {
                            let mut q = (qs[32 * cc + l] >> (4 * h)) & 0xF;
                            if five {
                                q |= ((qh[l] >> sub) & 1) << 4;
                            }
                            c[32 * sub + l] = q;
                        }
                        let (sc, m) = k4_scale_min(sub, scales);
                        s[8 * sub..8 * sub + 8].fill(d * sc as f32);
                        o[8 * sub..8 * sub + 8].fill(-(dmin * m as f32));
                    }
                }
            }
            DType::Q6_K => {
                let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = f16_at(b, 208);
                for n in 0..2 {
                    for l in 0..32 {
                        let (lo, hi, h) = (ql[64 * n + l], ql[64 * n + l + 32], qh[32 * n + l]);
                        c[128 * n + l] = (lo & 0xF) | ((h & 3) << 4);
                        c[128 * n + 32 + l] = (hi & 0xF) | (((h >> 2) & 3) << 4);
                        c[128 * n + 64 + l] = (lo >> 4) | (((h >> 4) & 3) << 4);
                        c[128 * n + 96 + l] = (hi >> 4) | (((h >> 6) & 3) << 4);
                    }
                }
                for sub in 0..16 {
                    let dl = d * scales[sub] as i8 as f32;
                    s[4 * sub..4 * sub + 4].fill(dl);
                    o[4 * sub..4 * sub + 4].fill(-32.0 * dl);
                }
            }
            other => unreachable!("int8 transcode of {other:?}"),
        }
    }
    debug_assert_eq!(codes.len() % QK, 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::WeightMatrix;

    /// `sw·code + ow` reproduces the decoder's values (to f32 rounding: the decoder
    /// multiplies in another order).
    #[test]
    fn transcoded_blocks_decode_to_the_same_values() {
        let k = 512;
        let x: Vec<f32> = (0..k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 400.0)
            .collect();
        for format in DType::EXTRA_QUANTS {
            let w = WeightMatrix::from_f32(1, k, x.clone())
                .unwrap()
                .to_format(format)
                .unwrap();
            let want = w.to_f32_vec();
            let (mut c, mut s, mut o) = (vec![0u8; k], vec![0.0; k / 4], vec![0.0; k / 4]);
            transcode_row(format, w.row_bytes(0).unwrap(), &mut c, &mut s, &mut o);
            for i in 0..k {
                let code = if signed_codes(format) {
                    c[i] as i8 as f32
                } else {
                    c[i] as f32
                };
                let got = s[i / 4] * code + o[i / 4];
                let scale = s[i / 4].abs() * 64.0 + o[i / 4].abs();
                assert!(
                    (got - want[i]).abs() <= 1e-6 * scale,
                    "{format} element {i}: {got} vs {}",
                    want[i]
                );
                if !signed_codes(format) {
                    assert!(c[i] <= 63, "{format}: code {}", c[i]);
                }
            }
        }
    }
}
