//! [`KvCacheDType`]: how the KV cache stores one value, and the element conversions.
//!
//! The KV cache is the one large buffer whose elements need not be f32: attention reads
//! it once per step and per token, so storing it narrower both multiplies the tokens a
//! memory budget holds and divides the bytes long-context decode streams. The formats
//! are vLLM's `--kv-cache-dtype` choices:
//!
//! * `F32`: 4 bytes, exact.
//! * `BF16`: 2 bytes, the top half of the f32 (8 exponent bits, 7 mantissa bits;
//!   relative rounding error at most 2⁻⁸), rounded to nearest even.
//! * `Fp8E4M3` (OCP "E4M3FN", vLLM's `fp8` / `fp8_e4m3`): 1 byte, bias 7, no infinities,
//!   `S.1111.111` is NaN, largest finite 448, smallest normal 2⁻⁶, subnormals down to
//!   2⁻⁹; relative error at most 2⁻⁴ for normal values.
//! * `Fp8E5M2` (`fp8_e5m2`): 1 byte, IEEE-like with bias 15, infinities and NaNs,
//!   largest finite 57344, smallest normal 2⁻¹⁴, subnormals down to 2⁻¹⁶; relative
//!   error at most 2⁻³.
//!
//! FP8 values carry a **scale per cached row** (one KV head of one token for GQA's K and
//! V, one token's latent row for MLA), computed when the row is written: the power of two
//! `2^e` that brings the row's largest magnitude just under the format's largest finite
//! value (`max|x| / 2^e ∈ (max/2, max]`), stored as one byte beside the row (OCP's E8M0:
//! `e + 127`, see [`KvCacheDType::fp8_row_exponent`]). A value is stored as the code of
//! `x / 2^e` and read back as `code · 2^e`; both multiplications by a power of two are
//! exact, so the only rounding is the FP8 one, and every value of the row down to
//! `max|x|·2⁻¹³` (E5M2: `2⁻²⁸`) stays a normal number, within the type's relative
//! error. With vLLM's one per-tensor scale of 1.0 instead, values under 2⁻⁶ became
//! subnormals (or zero) and values over 448 saturated. Row scales need no calibration,
//! follow their rows wherever a layout stores them, and cost one byte per row
//! ([`KvCacheDType::row_bytes`]: 1/64 more for a 64-wide head). Encoding rounds to
//! nearest even and saturates (only an infinite input reaches the saturation); NaN
//! stays NaN.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Element type of a KV cache.
///
/// ```
/// use dcpserve_kernels::KvCacheDType;
/// assert_eq!(KvCacheDType::BF16.bytes(), 2);
/// assert_eq!("fp8".parse::<KvCacheDType>().unwrap(), KvCacheDType::Fp8E4M3);
/// let x = 0.3f32;
/// let code = KvCacheDType::Fp8E4M3.encode_fp8(x);
/// assert_eq!(KvCacheDType::Fp8E4M3.decode_fp8(code), 0.3125); // 1.25 · 2⁻²
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum KvCacheDType {
    /// IEEE single precision (the reference).
    #[default]
    #[serde(rename = "float32")]
    F32,
    /// bfloat16.
    #[serde(rename = "bfloat16")]
    BF16,
    /// OCP FP8 E4M3 (finite-only), with a power-of-two scale per cached row.
    #[serde(rename = "fp8_e4m3", alias = "fp8")]
    Fp8E4M3,
    /// OCP FP8 E5M2, with a power-of-two scale per cached row.
    #[serde(rename = "fp8_e5m2")]
    Fp8E5M2,
}

/// The three numbers that define an FP8 format.
struct Fp8Format {
    mantissa_bits: u32,
    bias: i32,
    max: f32,
    nan: u8,
}

const E4M3: Fp8Format = Fp8Format {
    mantissa_bits: 3,
    bias: 7,
    max: 448.0,
    nan: 0x7F,
};
const E5M2: Fp8Format = Fp8Format {
    mantissa_bits: 2,
    bias: 15,
    max: 57344.0,
    nan: 0x7F,
};

impl KvCacheDType {
    /// Every storage type.
    pub const ALL: [KvCacheDType; 4] = [
        KvCacheDType::F32,
        KvCacheDType::BF16,
        KvCacheDType::Fp8E4M3,
        KvCacheDType::Fp8E5M2,
    ];

    /// Bytes per stored value.
    pub const fn bytes(self) -> usize {
        match self {
            KvCacheDType::F32 => 4,
            KvCacheDType::BF16 => 2,
            KvCacheDType::Fp8E4M3 | KvCacheDType::Fp8E5M2 => 1,
        }
    }

    /// True for the FP8 formats (which carry a scale).
    pub const fn is_fp8(self) -> bool {
        matches!(self, KvCacheDType::Fp8E4M3 | KvCacheDType::Fp8E5M2)
    }

    /// vLLM's name of the type (`float32`, `bfloat16`, `fp8_e4m3`, `fp8_e5m2`).
    pub const fn name(self) -> &'static str {
        match self {
            KvCacheDType::F32 => "float32",
            KvCacheDType::BF16 => "bfloat16",
            KvCacheDType::Fp8E4M3 => "fp8_e4m3",
            KvCacheDType::Fp8E5M2 => "fp8_e5m2",
        }
    }

    /// Bytes of the scale stored with each cached row: 1 for the FP8 types (an E8M0
    /// exponent), 0 for the others.
    pub const fn scale_bytes(self) -> usize {
        if self.is_fp8() {
            1
        } else {
            0
        }
    }

    /// Bytes one cached row of `row_len` values occupies: the values and, for FP8, the
    /// row's scale. Every capacity computation counts through this.
    ///
    /// ```
    /// use dcpserve_kernels::KvCacheDType;
    /// assert_eq!(KvCacheDType::BF16.row_bytes(64), 128);
    /// assert_eq!(KvCacheDType::Fp8E4M3.row_bytes(64), 65);
    /// ```
    pub const fn row_bytes(self, row_len: usize) -> usize {
        row_len * self.bytes() + self.scale_bytes()
    }

    /// The E8M0 byte `e + 127` of the scale `2^e` of an FP8 row whose largest magnitude
    /// is `max_abs`: the smallest `e` in `[-126, 126]` with `max_abs / 2^e` ≤ the
    /// format's largest finite value, so the row's largest value lands in the top binade
    /// of the format and nothing saturates. Rows of zeros (or tiny values) get `e = -126`;
    /// an infinite `max_abs` gets 126. Meaningful for the FP8 types only.
    ///
    /// ```
    /// use dcpserve_kernels::{fp8_scale_value, KvCacheDType};
    /// let b = KvCacheDType::Fp8E4M3.fp8_row_exponent(0.01);
    /// // 0.01 / 2⁻¹⁵ = 327.68 ≤ 448, and 0.01 / 2⁻¹⁶ > 448.
    /// assert_eq!(fp8_scale_value(b), 2f32.powi(-15));
    /// ```
    pub fn fp8_row_exponent(self, max_abs: f32) -> u8 {
        const LO: i32 = -126;
        const HI: i32 = 126;
        let f = self.fp8_format();
        let q = max_abs / f.max;
        if q.is_infinite() {
            // (Not settled below: the format's maximum · 2^e overflows to +inf there.)
            return (HI + 127) as u8;
        }
        let mut e = if q.is_nan() || q < pow2(LO) {
            LO
        } else {
            // ⌈log₂ q⌉ from the bits of q (a normal f32 here).
            let bits = q.to_bits();
            let exp = ((bits >> 23) & 0xFF) as i32 - 127;
            (exp + i32::from(bits & 0x7F_FFFF != 0)).clamp(LO, HI)
        };
        // `q` was rounded: settle on the smallest fitting e by exact comparisons
        // (max · 2^e is exact, or +inf).
        while e < HI && max_abs > f.max * pow2(e) {
            e += 1;
        }
        while e > LO && max_abs <= f.max * pow2(e - 1) {
            e -= 1;
        }
        (e + 127) as u8
    }

    /// Encodes one row for the cache: the FP8 codes of `src / 2^e` into `codes` and
    /// the row's scale byte (see [`KvCacheDType::fp8_row_exponent`]) as the result.
    /// The CUDA kernels (`kv.cu`) do the same step by step. Panics when the lengths
    /// differ.
    ///
    /// ```
    /// use dcpserve_kernels::{fp8_scale_value, KvCacheDType};
    /// let dt = KvCacheDType::Fp8E4M3;
    /// let mut codes = [0u8; 2];
    /// // Unscaled, 1000 would saturate at 448.
    /// let s = fp8_scale_value(dt.encode_fp8_row(&[1000.0, -0.1], &mut codes));
    /// assert_eq!((s, dt.decode_fp8(codes[0]) * s), (4.0, 1024.0));
    /// // Unscaled, 0.001 would round to E4M3's smallest subnormal 2⁻⁹ ≈ 0.00195.
    /// let s = fp8_scale_value(dt.encode_fp8_row(&[0.003, -0.001], &mut codes));
    /// assert!((dt.decode_fp8(codes[1]) * s + 0.001).abs() <= 0.001 / 16.0);
    /// ```
    pub fn encode_fp8_row(self, src: &[f32], codes: &mut [u8]) -> u8 {
        assert_eq!(src.len(), codes.len(), "FP8 row lengths");
        let max_abs = src.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let b = self.fp8_row_exponent(max_abs);
        let inv = pow2(127 - b as i32);
        for (c, &x) in codes.iter_mut().zip(src) {
            *c = self.encode_fp8(x * inv);
        }
        b
    }

    /// Largest relative rounding error of one stored normal value: 0 for f32, 2⁻⁸ for
    /// bf16, 2⁻⁴ for E4M3, 2⁻³ for E5M2 (half a unit in the last place).
    pub fn relative_precision(self) -> f32 {
        match self {
            KvCacheDType::F32 => 0.0,
            KvCacheDType::BF16 => 2f32.powi(-8),
            KvCacheDType::Fp8E4M3 => 2f32.powi(-4),
            KvCacheDType::Fp8E5M2 => 2f32.powi(-3),
        }
    }

    fn fp8_format(self) -> &'static Fp8Format {
        match self {
            KvCacheDType::Fp8E5M2 => &E5M2,
            _ => &E4M3,
        }
    }

    /// The FP8 code of `x` (nearest, ties to even; saturating to ± the largest finite
    /// value; NaN stays NaN). Meaningful for the FP8 types only (E4M3 otherwise).
    pub fn encode_fp8(self, x: f32) -> u8 {
        let f = self.fp8_format();
        let sign = ((x.to_bits() >> 24) & 0x80) as u8;
        let a = x.abs();
        if a.is_nan() {
            return sign | f.nan;
        }
        let a = a.min(f.max);
        let m = f.mantissa_bits as i32;
        // Exponent of the binade (f32 subnormals are far below every FP8 subnormal).
        let e = (((a.to_bits() >> 23) & 0xFF) as i32 - 127).max(1 - f.bias);
        // Quantum of that binade: a power of two, so the division is exact.
        let quantum = f32::from_bits(((e - m + 127) as u32) << 23);
        let q = (a / quantum).round_ties_even() as i32;
        // q in [0, 2^(m+1)]: subnormals have q < 2^m and exponent field 0; a carry to
        // 2^(m+1) moves into the next binade by the same addition.
        sign | (((e + f.bias - 1) << m) + q) as u8
    }

    /// The value of FP8 code `code` (see the module docs for the two formats).
    pub fn decode_fp8(self, code: u8) -> f32 {
        let f = self.fp8_format();
        let m = f.mantissa_bits;
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp_field = ((code & 0x7F) >> m) as i32;
        let mant = (code & ((1 << m) - 1)) as f32;
        let max_field = (1 << (7 - m)) - 1;
        match self {
            KvCacheDType::Fp8E4M3 if code & 0x7F == 0x7F => return f32::NAN,
            KvCacheDType::Fp8E5M2 if exp_field == max_field => {
                return if mant == 0.0 {
                    sign * f32::INFINITY
                } else {
                    f32::NAN
                };
            }
            _ => {}
        }
        let scale = |p: i32| f32::from_bits(((p + 127) as u32) << 23);
        let v = if exp_field == 0 {
            mant * scale(1 - f.bias - m as i32)
        } else {
            (1.0 + mant / (1 << m) as f32) * scale(exp_field - f.bias)
        };
        sign * v
    }

    /// The 256 values of the FP8 codes (a lookup table for decoding).
    pub fn fp8_table(self) -> [f32; 256] {
        std::array::from_fn(|c| self.decode_fp8(c as u8))
    }
}

/// `2^p` for `p` in f32's normal exponent range `[-126, 127]`.
#[inline(always)]
fn pow2(p: i32) -> f32 {
    f32::from_bits(((p + 127) as u32) << 23)
}

/// The value of an FP8 row's scale byte (E8M0: `2^(b − 127)`). The byte 0, which a
/// zeroed cache holds for rows never written, reads as 0 (their codes are 0 too).
///
/// ```
/// use dcpserve_kernels::fp8_scale_value;
/// assert_eq!(fp8_scale_value(127), 1.0);
/// assert_eq!(fp8_scale_value(120), 2f32.powi(-7));
/// assert_eq!(fp8_scale_value(0), 0.0);
/// ```
#[inline(always)]
pub fn fp8_scale_value(b: u8) -> f32 {
    f32::from_bits((b as u32) << 23)
}

/// bf16 bits of `x`, rounded to nearest even (NaN stays a quiet NaN).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of bf16 bits (exact: a shift).
#[inline(always)]
pub fn bf16_to_f32(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

impl fmt::Display for KvCacheDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvCacheDType {
    type Err = String;
    /// vLLM's names (`float32`, `bfloat16`, `fp8` = `fp8_e4m3`, `fp8_e5m2`) and the
    /// short `f32` / `bf16`. `auto` is a setting, not a type: the engine config
    /// resolves it.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "float32" | "f32" | "float" => Ok(KvCacheDType::F32),
            "bfloat16" | "bf16" => Ok(KvCacheDType::BF16),
            "fp8" | "fp8_e4m3" => Ok(KvCacheDType::Fp8E4M3),
            "fp8_e5m2" => Ok(KvCacheDType::Fp8E5M2),
            other => Err(format!(
                "Unknown KV-cache dtype `{other}`: expected one of float32, bfloat16, fp8, fp8_e4m3, fp8_e5m2."
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OCP 8-bit floating point spec, written out independently in f64.
    fn ocp_value(dt: KvCacheDType, code: u8) -> Option<f64> {
        let (eb, mb, bias) = match dt {
            KvCacheDType::Fp8E4M3 => (4u32, 3u32, 7i32),
            _ => (5, 2, 15),
        };
        let s = if code >> 7 == 1 { -1.0 } else { 1.0 };
        let e = ((code >> mb) & ((1 << eb) - 1) as u8) as i32;
        let m = (code & ((1 << mb) - 1) as u8) as f64;
        let e_max = (1 << eb) - 1;
        if dt == KvCacheDType::Fp8E4M3 && e == e_max && m == 7.0 {
            return None; // NaN
        }
        if dt == KvCacheDType::Fp8E5M2 && e == e_max {
            return if m == 0.0 {
                Some(s * f64::INFINITY)
            } else {
                None
            };
        }
        Some(if e == 0 {
            s * m / 2f64.powi(mb as i32) * 2f64.powi(1 - bias)
        } else {
            s * (1.0 + m / 2f64.powi(mb as i32)) * 2f64.powi(e - bias)
        })
    }

    #[test]
    fn fp8_decoding_matches_the_ocp_formula_on_all_256_codes() {
        for dt in [KvCacheDType::Fp8E4M3, KvCacheDType::Fp8E5M2] {
            for c in 0..=255u8 {
                let got = dt.decode_fp8(c);
                match ocp_value(dt, c) {
                    None => assert!(got.is_nan(), "{dt} {c:#04x}"),
                    Some(v) => assert_eq!(got as f64, v, "{dt} {c:#04x}"),
                }
            }
        }
        assert_eq!(KvCacheDType::Fp8E4M3.decode_fp8(0x7E), 448.0);
        assert_eq!(KvCacheDType::Fp8E4M3.decode_fp8(0x01), 2f32.powi(-9));
        assert_eq!(KvCacheDType::Fp8E5M2.decode_fp8(0x7B), 57344.0);
        assert_eq!(KvCacheDType::Fp8E5M2.decode_fp8(0x01), 2f32.powi(-16));
    }

    /// Encoding is the nearest finite code by brute force over the table, ties to the
    /// even code, saturating; every finite code round-trips.
    #[test]
    fn fp8_encoding_is_nearest_even_against_a_search() {
        for dt in [KvCacheDType::Fp8E4M3, KvCacheDType::Fp8E5M2] {
            let finite: Vec<(u8, f64)> = (0..=255u8)
                .filter_map(|c| ocp_value(dt, c).filter(|v| v.is_finite()).map(|v| (c, v)))
                .collect();
            let max = finite.iter().map(|&(_, v)| v).fold(0.0, f64::max);
            let nearest = |x: f64| -> f64 {
                let x = x.clamp(-max, max);
                let mut best = (f64::INFINITY, 0u8, 0.0);
                for &(c, v) in &finite {
                    let d = (v - x).abs();
                    if d < best.0 || (d == best.0 && c & 1 == 0 && best.1 & 1 == 1) {
                        best = (d, c, v);
                    }
                }
                best.2
            };
            for &(c, v) in &finite {
                assert_eq!(
                    dt.decode_fp8(dt.encode_fp8(v as f32)) as f64,
                    v,
                    "{dt} {c:#04x}"
                );
            }
            // Midpoints (exact ties), points just off them, and a sweep of magnitudes.
            let mut xs = Vec::new();
            for w in finite.windows(2) {
                let (a, b) = (w[0].1, w[1].1);
                let mid = (a + b) / 2.0;
                xs.extend([mid, mid * (1.0 + 1e-6), mid * (1.0 - 1e-6)]);
            }
            let mut x = 1e-7f64;
            while x < 1e6 {
                xs.extend([x, -x]);
                x *= 1.037;
            }
            for x in xs {
                let xf = x as f32;
                let got = dt.decode_fp8(dt.encode_fp8(xf)) as f64;
                let want = nearest(xf as f64);
                assert_eq!(got, want, "{dt} x={xf}"); // 0.0 == -0.0
            }
            assert!(dt.decode_fp8(dt.encode_fp8(f32::NAN)).is_nan());
            assert_eq!(dt.decode_fp8(dt.encode_fp8(f32::INFINITY)) as f64, max);
            assert_eq!(dt.decode_fp8(dt.encode_fp8(-1e30)) as f64, -max);
        }
    }

    /// Row scales against an f64 reference: the exponent is the smallest that fits the
    /// row's largest magnitude under the format's maximum, every value is the nearest
    /// code of `x / 2^e` (searched in f64) times `2^e`, and values down to
    /// `max·2^-(normal range)` keep the format's relative precision.
    #[test]
    fn fp8_rows_are_scaled_by_the_smallest_fitting_power_of_two() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for dt in [KvCacheDType::Fp8E4M3, KvCacheDType::Fp8E5M2] {
            let finite: Vec<f64> = (0..=255u8)
                .filter_map(|c| ocp_value(dt, c).filter(|v| v.is_finite()))
                .collect();
            let fmax = finite.iter().fold(0.0, |m: f64, v| m.max(*v));
            let nearest_value = |x: f64| {
                let mut best = (f64::INFINITY, 0.0);
                for &v in &finite {
                    if (v - x).abs() < best.0 {
                        best = ((v - x).abs(), v);
                    }
                }
                best.1
            };
            // The scaled maximum is over half the format's; normals reach down to 2⁻⁶ (E4M3)
            // and 2⁻¹⁴ (E5M2).
            let normal_range = if dt == KvCacheDType::Fp8E4M3 { 13 } else { 28 };
            for case in 0..400 {
                // Magnitudes from 1e-30 to 1e30, including exact powers of two and the
                // format's maximum times a power of two (the boundary of the exponent).
                let top = 10f64.powf(rnd() * 60.0 - 30.0);
                let row: Vec<f32> = (0..16)
                    .map(|i| match (case % 4, i) {
                        (1, 0) => (2f64.powi((rnd() * 80.0) as i32 - 40)) as f32,
                        (2, 0) => (fmax * 2f64.powi((rnd() * 80.0) as i32 - 40)) as f32,
                        _ => ((rnd() * 2.0 - 1.0) * top) as f32,
                    })
                    .collect();
                let mut codes = [0u8; 16];
                let b = dt.encode_fp8_row(&row, &mut codes);
                let e = b as i32 - 127;
                let max = row.iter().fold(0.0f64, |m, x| m.max(x.abs() as f64));
                assert!(
                    max / 2f64.powi(e) <= fmax,
                    "{dt} row {case}: e={e} too small"
                );
                if e > -126 {
                    assert!(
                        max / 2f64.powi(e - 1) > fmax,
                        "{dt} row {case}: e={e} too big"
                    );
                }
                let s = fp8_scale_value(b) as f64;
                assert_eq!(s, 2f64.powi(e));
                for (&x, &c) in row.iter().zip(&codes) {
                    let x = x as f64;
                    let got = dt.decode_fp8(c) as f64 * s;
                    let want = nearest_value(x / s).abs().copysign(x) * s;
                    assert_eq!(got.abs(), want.abs(), "{dt} row {case}: x={x}");
                    if x.abs() >= max * 2f64.powi(-normal_range) {
                        let rel = ((got - x) / x).abs();
                        assert!(rel <= dt.relative_precision() as f64, "{dt} x={x}: {rel}");
                    }
                }
            }
            // Zeros, infinities and NaN do not break the row.
            let mut codes = [0u8; 3];
            let b = dt.encode_fp8_row(&[0.0, -0.0, 0.0], &mut codes);
            assert_eq!((b, codes.map(|c| dt.decode_fp8(c))), (1, [0.0; 3]));
            let b = dt.encode_fp8_row(&[f32::INFINITY, 1.0, f32::NAN], &mut codes);
            assert_eq!(b, 253);
            assert_eq!(dt.decode_fp8(codes[0]) * fp8_scale_value(b), f32::INFINITY);
            assert!(dt.decode_fp8(codes[2]).is_nan());
        }
        assert_eq!(KvCacheDType::Fp8E4M3.row_bytes(64), 65);
        assert_eq!(KvCacheDType::F32.row_bytes(64), 256);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0)), 1.0);
        // 1 + 2⁻⁸ is a tie between 1 and 1 + 2⁻⁷: to even (1).
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 2f32.powi(-8))), 1.0);
        assert_eq!(
            bf16_to_f32(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8))),
            1.0 + 2.0 * 2f32.powi(-7)
        );
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        let mut x = 1e-20f32;
        while x < 1e20 {
            let r = bf16_to_f32(f32_to_bf16(x));
            assert!(((r - x) / x).abs() <= KvCacheDType::BF16.relative_precision());
            x *= 1.0123;
        }
    }

    #[test]
    fn names_parse_as_vllm_spells_them() {
        for d in KvCacheDType::ALL {
            assert_eq!(d.name().parse::<KvCacheDType>().unwrap(), d);
        }
        assert_eq!(
            "fp8".parse::<KvCacheDType>().unwrap(),
            KvCacheDType::Fp8E4M3
        );
        assert!("auto".parse::<KvCacheDType>().is_err());
        assert!("int8".parse::<KvCacheDType>().is_err());
    }
}
