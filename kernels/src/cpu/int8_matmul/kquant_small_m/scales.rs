//! Scale decoding shared by the 256-bit and the zmm K-quant kernels.

use std::arch::x86_64::*;

use crate::cpu::kquants::dequant::k4_scales_packed;

/// The f16 at `p` as f32.
#[inline]
#[target_feature(enable = "f16c")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The 8 (scale, min) pairs of a Q4_K / Q5_K super-block (6 bits each).
#[inline]
pub(super) fn k4_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (sc, mn) = k4_scales_packed(s);
    (sc.to_le_bytes(), mn.to_le_bytes())
}
