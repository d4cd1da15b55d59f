//! The AVX-512 dot-product kernels of the parent module (one to four activation rows):
//! a block's 32 codes as one zmm of i16 in element order, one `vpmaddwd` against the
//! int16 activations, one `vcvtdq2ps` and one FMA per block and activation row.
//!
//! What AVX-512BW saves over the AVX2 kernels is the code building: the Q5 high bits go
//! straight from the block into a mask register and set bit 4 with one masked add (the
//! AVX2 kernel spreads them through bytes in six operations and widens in three), and
//! the nibbles of both halves are split in one variable shift. A Q5 block costs about 9
//! instructions against 21.
//!
//! Every function needs AVX-512F/BW/VL, AVX2, FMA and F16C
//! (`CpuFeatures::has_avx512_kernels`).

use std::arch::x86_64::*;

use super::avx2::scales8;
use super::ActsI16;
use crate::cpu::block32::{blk_bytes, codes_at, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::matmul::PREFETCH_ROWS;
use crate::quant::{WeightFormat, QK};
use crate::weights::WeightMatrix;

/// Columns `n0..n1` of `out = x · wᵀ` for the `m` quantized rows in `acts`.
///
/// # Safety
/// AVX-512F/BW/VL, AVX2, FMA and F16C are available; `w` is Q8_0, Q4_0, Q4_1, Q5_0 or
/// Q5_1 with `acts.k` columns; `1 ≤ m ≤ 4`; `out` is `[m, w.rows()]` and columns
/// `n0..n1` are written by this call only.
pub(super) unsafe fn task(
    acts: &ActsI16,
    m: usize,
    w: &WeightMatrix,
    out: *mut f32,
    n0: usize,
    n1: usize,
) {
    macro_rules! by_m {
        ($f:expr) => {
            match m {
                1 => cols::<{ $f }, 1>(acts, w, out, n0, n1),
                2 => cols::<{ $f }, 2>(acts, w, out, n0, n1),
                3 => cols::<{ $f }, 3>(acts, w, out, n0, n1),
                _ => cols::<{ $f }, 4>(acts, w, out, n0, n1),
            }
        };
    }
    match w.format() {
        WeightFormat::Q8_0 => by_m!(Q8_0),
        WeightFormat::Q4_0 => by_m!(Q4_0),
        WeightFormat::Q4_1 => by_m!(Q4_1),
        WeightFormat::Q5_0 => by_m!(Q5_0),
        WeightFormat::Q5_1 => by_m!(Q5_1),
        other => unreachable!("int16 matmul of {other:?}"),
    }
}

/// Weight rows `n0..n1` against the `M` activation rows, two rows at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn cols<const F: u8, const M: usize>(
    acts: &ActsI16,
    w: &WeightMatrix,
    out: *mut f32,
    n0: usize,
    n1: usize,
) {
    let (n, ws, base) = (w.rows(), w.row_stride(), w.base_ptr());
    let first = PREFETCH_ROWS.min(n1 - n0);
    crate::matmul::prefetch_bytes(base.add(n0 * ws), first * ws);
    let mut j = n0;
    while j < n1 {
        let row = base.add(j * ws);
        let ahead = row.wrapping_add(PREFETCH_ROWS * ws);
        let done = if j + 1 < n1 {
            let r = rows_dot::<F, M, 2>(acts, row, ws, ahead);
            for (d, rr) in r.iter().enumerate() {
                for (i, v) in rr.iter().enumerate() {
                    *out.add(i * n + j + d) = *v;
                }
            }
            2
        } else {
            let [r] = rows_dot::<F, M, 1>(acts, row, ws, ahead);
            for (i, v) in r.iter().enumerate() {
                *out.add(i * n + j) = *v;
            }
            1
        };
        j += done;
    }
}

/// The 32 codes of the block at `p` as i16, in element order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn codes<const F: u8>(p: *const u8) -> __m512i {
    let c = p.add(codes_at(F));
    if F == Q8_0 {
        return _mm512_cvtepi8_epi16(_mm256_loadu_si256(c as *const __m256i));
    }
    // Byte j holds element j (low nibble) and element j + 16 (high nibble): the 16
    // bytes twice, the second copy shifted down by four, then masked.
    let twice = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128(
        c as *const __m128i,
    )));
    let shift = _mm512_set_epi64(
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
        0,
        0,
    );
    let nib = _mm512_and_si512(_mm512_srlv_epi16(twice, shift), _mm512_set1_epi16(0x0F));
    if F == Q5_0 || F == Q5_1 {
        // Bit e of qh is bit 4 of element e: a mask register, one masked add.
        let qh: __mmask32 = (p.add(codes_at(F) - 4) as *const u32).read_unaligned();
        return _mm512_mask_add_epi16(nib, qh, nib, _mm512_set1_epi16(0x10));
    }
    nib
}

/// `NR` consecutive weight rows (the first at `row`, `ws` bytes apart) against the `M`
/// activation rows; the same rows at `ahead` are prefetched alongside.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn rows_dot<const F: u8, const M: usize, const NR: usize>(
    acts: &ActsI16,
    row: *const u8,
    ws: usize,
    ahead: *const u8,
) -> [[f32; M]; NR] {
    let nb = acts.k / QK;
    let nbp = acts.nbp;
    // Two chains per output when there is one row, as the AVX2 kernel.
    let mut acc = [[[_mm512_setzero_ps(); 2]; M]; NR];
    // The offsets' share `mt·sx`, eight blocks at a time.
    let mut off = [[_mm256_setzero_ps(); M]; NR];
    let mut b0 = 0;
    while b0 < nb {
        let cnt = 8.min(nb - b0);
        let bytes = cnt * blk_bytes(F);
        for r in 0..NR {
            crate::matmul::prefetch_bytes(ahead.wrapping_add(r * ws + b0 * blk_bytes(F)), bytes);
        }
        let mut dd = [[[0.0f32; 8]; M]; NR];
        for r in 0..NR {
            let (dv, mt) = scales8::<F>(row.add(r * ws), b0, cnt);
            for i in 0..M {
                let dx = _mm256_loadu_ps(acts.dx.as_ptr().add(i * nbp + b0));
                _mm256_storeu_ps(dd[r][i].as_mut_ptr(), _mm256_mul_ps(dv, dx));
                if F != Q8_0 {
                    let sx = _mm256_loadu_ps(acts.sx.as_ptr().add(i * nbp + b0));
                    off[r][i] = _mm256_fmadd_ps(mt, sx, off[r][i]);
                }
            }
        }
        if cnt == 8 {
            for b in 0..8 {
                block::<F, M, NR>(acts, row, ws, b0 + b, &dd, b, &mut acc);
            }
        } else {
            for b in 0..cnt {
                block::<F, M, NR>(acts, row, ws, b0 + b, &dd, b, &mut acc);
            }
        }
        b0 += cnt;
    }
    let mut out = [[0.0f32; M]; NR];
    for r in 0..NR {
        for i in 0..M {
            let s = _mm512_add_ps(acc[r][i][0], acc[r][i][1]);
            let lanes = _mm256_add_ps(
                _mm512_castps512_ps256(s),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s))),
            );
            out[r][i] = hsum(_mm256_add_ps(lanes, off[r][i]));
        }
    }
    out
}

/// Sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Block `blk` of the `NR` rows, the `j`-th of its group of eight (whose `dw·dx` are
/// `dd`), into the accumulators.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const F: u8, const M: usize, const NR: usize>(
    acts: &ActsI16,
    row: *const u8,
    ws: usize,
    blk: usize,
    dd: &[[[f32; 8]; M]; NR],
    j: usize,
    acc: &mut [[[__m512; 2]; M]; NR],
) {
    let chain = if NR == 1 { j & 1 } else { 0 };
    for r in 0..NR {
        let c = codes::<F>(row.add(r * ws + blk * blk_bytes(F)));
        for i in 0..M {
            let xq = acts.q.as_ptr().add(i * acts.k + blk * QK);
            let p = _mm512_madd_epi16(c, _mm512_loadu_si512(xq as *const _));
            let a = &mut acc[r][i][chain];
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(dd[r][i][j]), *a);
        }
    }
}
