//! GGML's 5-bit, K-quant and IQ4 block formats: the quantizations most GGUF files in
//! the wild use (a `Q4_K_M` file is mostly Q4_K/Q5_0 with Q6_K for some tensors).
//!
//! Layouts along a row (all little endian, `f16` = IEEE half):
//!
//! | type | elems | bytes | layout | value |
//! |------|-------|-------|--------|-------|
//! | Q5_0 | 32 | 22 | `d`, `qh: u32`, `qs[16]` | `(q − 16)·d`, `q` = nibble + bit of `qh` |
//! | Q5_1 | 32 | 24 | `d`, `m`, `qh: u32`, `qs[16]` | `q·d + m` |
//! | IQ4_NL | 32 | 18 | `d`, `qs[16]` | `d·K[q]` (16-entry codebook `K`) |
//! | Q2_K | 256 | 84 | `scales[16]`, `qs[64]`, `d`, `dmin` | 16 sub-blocks of 16: `d·sc·q − dmin·m` (4-bit `sc`, `m`), 2-bit `q` |
//! | Q3_K | 256 | 110 | `hmask[32]`, `qs[64]`, `scales[12]`, `d` | 16 sub-blocks: `d·(sc − 32)·(q − 4)`, 6-bit `sc`, 3-bit `q` |
//! | Q4_K | 256 | 144 | `d`, `dmin`, `scales[12]`, `qs[128]` | 8 sub-blocks of 32: `d·sc·q − dmin·m`, 6-bit `sc`, `m` |
//! | Q5_K | 256 | 176 | `d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]` | as Q4_K with 5-bit `q` |
//! | Q6_K | 256 | 210 | `ql[128]`, `qh[64]`, `scales[16]: i8`, `d` | 16 sub-blocks: `d·sc·(q − 32)`, 6-bit `q` |
//! | Q8_K | 256 | 292 | `d: f32`, `qs[256]: i8`, `bsums[16]: i16` | `d·q` |
//! | IQ4_XS | 256 | 136 | `d`, `scales_h: u16`, `scales_l[4]`, `qs[128]` | 8 sub-blocks: `d·(ls − 32)·K[q]`, 6-bit `ls` |
//!
//! Within a 32-element group of 4-bit codes, element `j` is the low nibble of byte `j`
//! and element `j + 16` the high one (Q5_0/Q5_1/IQ4); the K-quants pack 64-element
//! chunks as low nibbles = first 32, high nibbles = next 32. The exact bit positions
//! are in `dequant.rs`; `fixtures/gguf_quants` (made by `scripts/make_gguf_quant_fixtures.py`
//! with the `gguf` Python package's dequantizer) checks every type.

pub(crate) mod dequant;
pub(crate) mod quantize;
#[cfg(target_arch = "x86_64")]
pub(crate) mod simd_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod simd_avx512;

#[cfg(test)]
mod tests;

/// IQ4_NL / IQ4_XS codebook: the 16 values a 4-bit code stands for (before the scale).
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
