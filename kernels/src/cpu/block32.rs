//! The 32-element block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) as the x86 kernels with
//! quantized activations (`int8_matmul`, `int16_matmul`) name them: one `u8` code per
//! format for const generics, and where each block keeps its parts (GGML's layouts:
//! an f16 scale, the Q4_1/Q5_1 f16 minimum, the Q5 high bits, then the codes).

use crate::quant::WeightFormat;

/// Q8_0: `d`, 32 × i8.
pub(crate) const Q8_0: u8 = 0;
/// Q4_0: `d`, 16 bytes of nibbles.
pub(crate) const Q4_0: u8 = 1;
/// Q4_1: `d`, `m`, 16 bytes of nibbles.
pub(crate) const Q4_1: u8 = 2;
/// Q5_0: `d`, 32 high bits, 16 bytes of nibbles.
pub(crate) const Q5_0: u8 = 3;
/// Q5_1: `d`, `m`, 32 high bits, 16 bytes of nibbles.
pub(crate) const Q5_1: u8 = 4;

/// Bytes per 32-element block of format `F`.
pub(crate) const fn blk_bytes(f: u8) -> usize {
    match f {
        Q8_0 => 34,
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        _ => 24,
    }
}

/// Byte offset of the codes in a block of format `F` (the 5-bit formats keep their 32
/// high bits in the 4 bytes before).
pub(crate) const fn codes_at(f: u8) -> usize {
    match f {
        Q8_0 | Q4_0 => 2,
        Q4_1 => 4,
        Q5_0 => 6,
        _ => 8,
    }
}

/// The code of `format`, if it is one of these formats.
pub(crate) fn code_of(format: WeightFormat) -> Option<u8> {
    Some(match format {
        WeightFormat::Q8_0 => Q8_0,
        WeightFormat::Q4_0 => Q4_0,
        WeightFormat::Q4_1 => Q4_1,
        WeightFormat::Q5_0 => Q5_0,
        WeightFormat::Q5_1 => Q5_1,
        _ => return None,
    })
}
