//! The AVX-512 dot-product kernels of the parent module (one to four activation rows),
//! at ymm width: the AVX2 kernels (`dot_kernel.rs`) with the Q5 high bits set through mask
//! registers. Each half's 16 high bits go straight from the block into a mask register
//! and set bit 4 with one masked `vpaddw`, where the AVX2 kernel spreads them through
//! bytes in six operations and widens in three: about 12 instructions per Q5 block
//! against 21.
//!
//! Why not zmm: a block's 32 codes as one zmm (nibbles split by one `vpsrlvw`, one masked
//! add for the high bits) is about 9 instructions, but Zen 4 runs each 512-bit operation
//! as two 256-bit halves; measured there (one thread, fastest call, 576-wide shapes) it
//! was slower than this kernel on Q5_0 (32–35 against 39–41 GFLOP/s) and Q4_1 (36–39
//! against 42–49), even on Q5_1, 5% faster on Q8_0 only.
//!
//! Every function needs AVX-512F/BW/VL, AVX2, FMA and F16C
//! (`CpuFeatures::has_avx512_kernels`).

use std::arch::x86_64::*;

use super::avx2::scales8;
use crate::cpu::block32::{codes_at, Q5_0, Q5_1};

dot_kernel!("avx512f,avx512bw,avx512vl,avx2,fma,f16c");

/// The 32 codes of the block at `p` as i16: elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn codes<const F: u8>(p: *const u8) -> (__m256i, __m256i) {
    if F != Q5_0 && F != Q5_1 {
        return super::avx2::codes::<F>(p);
    }
    let (lo, hi) = super::avx2::nibbles(p.add(codes_at(F)));
    // Bit e of qh is bit 4 of element e.
    let qh = (p.add(codes_at(F) - 4) as *const u32).read_unaligned();
    let bit4 = _mm256_set1_epi16(0x10);
    (
        _mm256_mask_add_epi16(lo, qh as __mmask16, lo, bit4),
        _mm256_mask_add_epi16(hi, (qh >> 16) as __mmask16, hi, bit4),
    )
}
