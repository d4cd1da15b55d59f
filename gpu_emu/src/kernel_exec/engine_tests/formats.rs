//! bf16 / fp16 / fp8 conversions: the device intrinsics of the stand-in headers and
//! `common.cu`'s own bit-level conversions against exhaustive references.

use super::{arg, launch, load, rand_f32, COMMON};

/// Nearest fp8 code by exhaustive search (ties to the even code), saturating to the
/// largest finite value: an independent reference for both conversions.
fn reference_fp8(x: f32, e5m2: bool) -> u8 {
    let (m, bias, max_code) = if e5m2 {
        (2, 15, 0x7Bu8)
    } else {
        (3, 7, 0x7Eu8)
    };
    let value = |c: u8| -> f64 {
        let (e, f) = (i32::from(c >> m), f64::from(c & ((1 << m) - 1)));
        if e == 0 {
            f * 2f64.powi(1 - bias - m)
        } else {
            (1.0 + f / f64::from(1u8 << m)) * 2f64.powi(e - bias)
        }
    };
    let a = f64::from(x.abs());
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    if a >= value(max_code) {
        return max_code | sign;
    }
    let mut best = 0u8;
    for c in 0..=max_code {
        let (d, db) = ((value(c) - a).abs(), (value(best) - a).abs());
        if d < db || (d == db && c & 1 == 0) {
            best = c;
        }
    }
    best | sign
}

#[test]
fn bf16_and_fp8_conversions_round_as_the_device() {
    let m = load(&format!(
        "#include <cuda_bf16.h>\n#include <cuda_fp8.h>\n{COMMON}\n{}",
        r#"
extern "C" __global__ void convert(const float* x, unsigned n, unsigned short* bf, unsigned char* fp8) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        bf[2 * i] = __bfloat16_as_ushort(__float2bfloat16(v));
        bf[2 * i + 1] = f32_to_bf16(v);
        unsigned char* o = fp8 + 6 * i;
        o[0] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
        o[1] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
        o[2] = encode_fp8(v, 0);
        o[3] = encode_fp8(v, 1);
        o[4] = __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E4M3);
        o[5] = __nv_fp8_e5m2(v).__x;
    }
}
extern "C" __global__ void decode(float* out) {
    unsigned c = threadIdx.x;
    out[4 * c] = decode_fp8((u8)c, 0);
    __nv_fp8_e4m3 a; a.__x = (u8)c;
    __nv_fp8_e5m2 b; b.__x = (u8)c;
    out[4 * c + 1] = (float)a;
    out[4 * c + 2] = decode_fp8((u8)c, 1);
    out[4 * c + 3] = (float)b;
}
"#
    ));
    let mut x: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        1.0 + 1.0 / 128.0 + 1.0 / 512.0,
        f32::MAX,
        3.389_531_4e38,
        1e-40,
        -1e-40,
        f32::MIN_POSITIVE,
        f32::INFINITY,
        f32::NEG_INFINITY,
        448.0,
        464.0,
        465.0,
        479.0,
        480.0,
        1e9,
        -464.0,
        57344.0,
        61439.0,
        61440.0,
        65536.0,
        2f32.powi(-9),
        2f32.powi(-10),
        3.0 * 2f32.powi(-11),
        2f32.powi(-16),
        2f32.powi(-17),
        1.5 * 2f32.powi(-17),
        0.0625 + 0.0625 / 16.0,
        240.0,
        248.0,
        0.1,
        -0.3,
        3.0e-3,
    ];
    let mut seed = 77;
    for _ in 0..20_000 {
        let mant = rand_f32(&mut seed);
        let exp = (rand_f32(&mut seed) * 24.0) as i32;
        x.push(mant * 2f32.powi(exp));
    }
    let n = x.len();
    let mut bf = vec![0u16; 2 * n];
    let mut fp8 = vec![0u8; 6 * n];
    let (mut xp, mut nn, mut bp, mut fp) =
        (x.as_ptr(), n as u32, bf.as_mut_ptr(), fp8.as_mut_ptr());
    launch(
        &m.function("convert").unwrap(),
        16,
        256,
        0,
        &mut [arg(&mut xp), arg(&mut nn), arg(&mut bp), arg(&mut fp)],
    )
    .unwrap();
    for (i, &v) in x.iter().enumerate() {
        let want = half::bf16::from_f32(v).to_bits();
        assert_eq!(bf[2 * i], want, "__float2bfloat16({v:e})");
        assert_eq!(bf[2 * i + 1], want, "common.cu f32_to_bf16({v:e})");
        let o = &fp8[6 * i..6 * i + 6];
        let (e4, e5) = (reference_fp8(v, false), reference_fp8(v, true));
        assert_eq!(
            [o[0], o[1], o[2], o[3], o[5]],
            [e4, e5, e4, e5, e5],
            "fp8 of {v:e}"
        );
        let nosat = if v.abs() > 448.0 {
            0x7F | (e4 & 0x80)
        } else {
            e4
        };
        assert_eq!(o[4], nosat, "E4M3 without saturation of {v:e}");
    }
    // NaN: the device's canonical NaNs; the engine keeps the sign with the all-ones code.
    let mut nan = [f32::NAN];
    let (mut np, mut one) = (nan.as_mut_ptr(), 1u32);
    launch(
        &m.function("convert").unwrap(),
        1,
        32,
        0,
        &mut [arg(&mut np), arg(&mut one), arg(&mut bp), arg(&mut fp)],
    )
    .unwrap();
    assert_eq!(bf[0], 0x7FFF);
    assert!(half::bf16::from_bits(bf[1]).is_nan());
    assert_eq!(&fp8[..4], &[0x7F, 0x7E, 0x7F, 0x7F]);
    // Every code decodes to the same value both ways.
    let mut dec = vec![0f32; 4 * 256];
    let mut dp = dec.as_mut_ptr();
    launch(
        &m.function("decode").unwrap(),
        1,
        256,
        0,
        &mut [arg(&mut dp)],
    )
    .unwrap();
    for c in 0..256 {
        let d = &dec[4 * c..4 * c + 4];
        assert!(
            d[0].to_bits() == d[1].to_bits() || (d[0].is_nan() && d[1].is_nan()),
            "e4m3 code {c:#x}: {d:?}"
        );
        assert!(
            d[2].to_bits() == d[3].to_bits() || (d[2].is_nan() && d[3].is_nan()),
            "e5m2 code {c:#x}: {d:?}"
        );
        if c & 0x7F <= 0x7E {
            assert_eq!(
                reference_fp8(d[1], false),
                c as u8,
                "e4m3 round trip {c:#x}"
            );
        }
        if c & 0x7F <= 0x7B {
            assert_eq!(reference_fp8(d[3], true), c as u8, "e5m2 round trip {c:#x}");
        }
    }
}
