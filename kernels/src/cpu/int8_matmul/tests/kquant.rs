//! The 5-bit, K-quant and IQ4 weights on the int8 path: the same two references as
//! for Q8_0/Q4_x (the parent module's docs).

use super::*;
use crate::cpu::int8_matmul::transcode::{signed_codes, transcode_row};

/// K a multiple of 256 (K-quants), from one super-block to several, decode and prefill.
const K_SHAPES: [(usize, usize, usize); 6] = [
    (1, 7, 256),
    (1, 33, 1536),
    (3, 18, 512),
    (5, 9, 768),
    (70, 10, 256),
    (64, 5, 1536),
];

/// Reference 1 with the transcoded weights: exact integer dots per 4-element lane,
/// scales applied in f64.
fn transcoded_reference(x: &[f32], m: usize, w: &WeightMatrix) -> (Vec<f64>, Vec<f64>) {
    let (n, k) = (w.rows(), w.cols());
    let nb = k / QK;
    let a = quantize_scalar(x, m, k);
    let (mut out, mut mag) = (vec![0.0; m * n], vec![0.0; m * n]);
    let signed = signed_codes(w.format());
    for r in 0..n {
        let (mut c, mut sw, mut ow) = (vec![0u8; k], vec![0.0f32; k / 4], vec![0.0f32; k / 4]);
        transcode_row(
            w.format(),
            w.row_bytes(r).unwrap(),
            &mut c,
            &mut sw,
            &mut ow,
        );
        for i in 0..m {
            let (mut s, mut g) = (0.0f64, 0.0f64);
            for lane in 0..k / 4 {
                let dx = a.dx8[(i * nb + lane / 8) * 8] as f64;
                let (mut dot, mut abs, mut xs) = (0i64, 0i64, 0i64);
                for (e, &ce) in c.iter().enumerate().skip(4 * lane).take(4) {
                    let cw = if signed { ce as i8 as i64 } else { ce as i64 };
                    let qx = a.q[i * k + e] as i64;
                    dot += cw * qx;
                    abs += (cw * qx).abs();
                    xs += qx;
                }
                let (swl, owl) = (sw[lane] as f64, ow[lane] as f64);
                s += dx * (swl * dot as f64 + owl * xs as f64);
                g += dx.abs() * (swl.abs() * abs as f64 + (owl * xs as f64).abs());
            }
            out[i * n + r] = s;
            mag[i * n + r] = g;
        }
    }
    (out, mag)
}

/// `(m, k, n)` of one product.
type Shape = (usize, usize, usize);

/// `(formats, shapes)` pairs the transcoding kernels run: every extra format at every
/// shape, except Q4_K/Q5_K/Q6_K at `m ≤ 4`, which take the fused kernels (tested in
/// `kquant_small_m.rs`).
fn transcoded_cases() -> [(Vec<WeightFormat>, Vec<Shape>); 2] {
    let fused = |f: &WeightFormat| crate::cpu::int8_matmul::kquant_small_m::applies(*f, 1);
    let (f, t): (Vec<_>, Vec<_>) = WeightFormat::EXTRA_QUANTS.iter().partition(|f| fused(f));
    let large: Vec<_> = K_SHAPES
        .into_iter()
        .filter(|(m, _, _)| *m > crate::cpu::int8_matmul::kquant_small_m::SMALL_M)
        .collect();
    [(t, K_SHAPES.to_vec()), (f, large)]
}

#[test]
fn extra_formats_match_the_integer_reference_on_every_isa() {
    for (formats, shapes) in transcoded_cases() {
        assert_every_isa_matches(
            "extra_formats_match_the_integer_reference_on_every_isa",
            &formats,
            &shapes,
            11,
            transcoded_reference,
        );
    }
}

#[test]
fn extra_formats_are_within_the_activation_rounding_bound() {
    for (formats, shapes) in transcoded_cases() {
        assert_within_rounding_bound(
            "extra_formats_are_within_the_activation_rounding_bound",
            &formats,
            &shapes,
            12,
        );
    }
}
