use crate::dtype::DType;
use crate::quant::{dequantize, quantize};

fn fixture(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/gguf_quants")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every type the `gguf` package can dequantize (all but Q8_K), on random-but-valid
/// blocks made by `scripts/make_gguf_quant_fixtures.py`: identical values.
#[test]
fn blocks_match_the_gguf_package() {
    for format in DType::EXTRA_QUANTS {
        if format == DType::Q8_K {
            continue; // gguf 0.19.0 has no Q8_K dequantizer; see `q8_k_layout`.
        }
        let blocks = fixture(&format!("{format}.blocks"));
        let want: Vec<f32> = fixture(&format!("{format}.f32"))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(blocks.len(), format.bytes_for(want.len()), "{format}");
        let mut got = vec![0.0f32; want.len()];
        dequantize(format, &blocks, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{format} element {i}: {g} vs {w}");
        }
    }
}

#[test]
fn q8_k_layout() {
    // d = 0.5 (f32), q[i] = i − 128, block sums ignored by the decoder.
    let mut b = 0.5f32.to_le_bytes().to_vec();
    b.extend((0..256).map(|i: i32| (i - 128) as i8 as u8));
    b.extend([0u8; 32]);
    let mut out = vec![0.0; 256];
    dequantize(DType::Q8_K, &b, &mut out).unwrap();
    for (i, v) in out.iter().enumerate() {
        assert_eq!(*v, (i as f32 - 128.0) * 0.5);
    }
}

/// Smooth-ish test weights with a few outliers, like real rows.
fn weights(n: usize) -> Vec<f32> {
    let mut s = 0x9E3779B97F4A7C15u64;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f32 / (1u64 << 53) as f32 - 0.5;
            let outlier = if i % 97 == 0 { 4.0 } else { 1.0 };
            0.05 * u * outlier + 0.01 * ((i % 256) as f32 / 256.0 - 0.5)
        })
        .collect()
}

/// The encoders round-trip through the (independently checked) decoders with the
/// relative RMS error expected of each bit width; printed for the record.
#[test]
fn quantizers_round_trip() {
    let x = weights(4 * 256);
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
    for format in DType::EXTRA_QUANTS {
        let mut bytes = Vec::new();
        quantize(format, &x, &mut bytes).unwrap();
        assert_eq!(bytes.len(), format.bytes_for(x.len()), "{format}");
        let mut y = vec![0.0; x.len()];
        dequantize(format, &bytes, &mut y).unwrap();
        let err = (x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            / x.len() as f32)
            .sqrt()
            / rms;
        // Measured 2026-12-01 (printed): Q2_K 0.245, Q3_K 0.145, Q4_K 0.063,
        // Q5_0 0.040, Q5_1 0.030, Q5_K 0.032, Q6_K 0.016, Q8_K 0.010, IQ4_NL/XS 0.079;
        // the bounds give 1.5–2× room (one bit less roughly doubles the error).
        let bound = match format {
            DType::Q2_K => 0.40,
            DType::Q3_K => 0.25,
            DType::Q4_K => 0.11,
            DType::IQ4_NL | DType::IQ4_XS => 0.14,
            DType::Q5_0 => 0.07,
            DType::Q5_1 | DType::Q5_K => 0.06,
            DType::Q6_K => 0.03,
            _ => 0.02,
        };
        println!("{format}: relative RMS error {err:.4}");
        assert!(err < bound, "{format}: relative RMS error {err} ≥ {bound}");
    }
}

/// Embedding gather and row slicing work on the quantized storage of every type
/// (token embeddings of K-quant files are often Q4_K/Q6_K).
#[test]
fn gather_and_slices_on_quantized_storage() {
    use crate::weights::WeightMatrix;
    let (rows, cols) = (5, 512);
    let x = weights(rows * cols);
    for format in DType::EXTRA_QUANTS {
        let w = WeightMatrix::from_f32(rows, cols, x.clone())
            .unwrap()
            .to_format(format)
            .unwrap();
        assert_eq!(w.format(), format);
        assert_eq!(w.row_stride(), format.bytes_for(cols));
        let full = w.to_f32_vec();
        let mut out = vec![0.0; 2 * cols];
        w.gather_rows(&[3, 1], &mut out).unwrap();
        assert_eq!(out[..cols], full[3 * cols..4 * cols], "{format}");
        assert_eq!(out[cols..], full[cols..2 * cols], "{format}");
        assert!(w.gather_rows(&[5], &mut out[..cols]).is_err());
        // A block-aligned column cut is a view; an unaligned one decodes to f32.
        let be = format.block_elems();
        let view = w.slice_cols(be, 2 * be).unwrap();
        assert_eq!(view.format(), format);
        let cut = w.slice_cols(100, 300).unwrap();
        assert_eq!(cut.format(), DType::F32);
        let (vf, cf) = (view.to_f32_vec(), cut.to_f32_vec());
        for r in 0..rows {
            assert_eq!(
                vf[r * be..(r + 1) * be],
                full[r * cols + be..r * cols + 2 * be]
            );
            assert_eq!(
                cf[r * 200..(r + 1) * 200],
                full[r * cols + 100..r * cols + 300]
            );
        }
    }
}
