//! The AVX2 kernels of the parent module: weight codes widened to i16 (`vpmovzxbw` /
//! `vpmovsxbw`), `vpmaddwd` against the int16 activations, one `vcvtdq2ps` and one FMA
//! per block and activation row; the block scales eight blocks at a time.
//!
//! Every function needs AVX2, FMA and F16C (`CpuFeatures::has_avx2_kernels`).

use std::arch::x86_64::*;

use super::ActsI16;
use crate::cpu::block32::{blk_bytes, codes_at, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::matmul::PREFETCH_ROWS;
use crate::quant::{WeightFormat, QK};
use crate::weights::WeightMatrix;

/// Columns `n0..n1` of `out = x · wᵀ` for the `m` quantized rows in `acts`.
///
/// # Safety
/// AVX2, FMA and F16C are available; `w` is Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 with
/// `acts.k` columns; `1 ≤ m ≤ 4`; `out` is `[m, w.rows()]` and columns `n0..n1` are
/// written by this call only.
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

/// Weight rows `n0..n1` against the `M` activation rows, two rows at a time (two
/// independent chains, and the per-row work of short rows shared).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cols<const F: u8, const M: usize>(
    acts: &ActsI16,
    w: &WeightMatrix,
    out: *mut f32,
    n0: usize,
    n1: usize,
) {
    let (n, ws, base) = (w.rows(), w.row_stride(), w.base_ptr());
    // The first rows have no earlier row to prefetch them: ask for them all at once
    // rather than one miss after another.
    let first = PREFETCH_ROWS.min(n1 - n0);
    crate::matmul::prefetch_bytes(base.add(n0 * ws), first * ws);
    let mut j = n0;
    while j < n1 {
        let row = base.add(j * ws);
        // The weights stream from memory once: ask for later rows' bytes now.
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

/// Sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The scales `dw` and offsets `mt` of blocks `b0..b0 + cnt` of a row (`cnt ≤ 8`; the
/// other lanes zero), from the blocks' first four bytes (the f16 scale, and the
/// Q4_1/Q5_1 minimum or two bytes of codes or high bits). The eight words are put
/// together in general-purpose registers and moved over in two 64-bit halves: on Zen 3
/// `vpgatherdd` took a third of a one-row Q8_0 product's time, and the integer pipes
/// are otherwise idle here.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scales8<const F: u8>(
    row: *const u8,
    b0: usize,
    cnt: usize,
) -> (__m256, __m256) {
    let bb = blk_bytes(F);
    let base = row.add(b0 * bb);
    let word = |b: usize| -> u64 {
        if b < cnt {
            (base.add(b * bb) as *const u32).read_unaligned() as u64
        } else {
            0
        }
    };
    // Four blocks' words → their four scales (low halves) and four minima (high halves).
    let quad = |b: usize| -> (i64, i64) {
        let (w0, w1, w2, w3) = (word(b), word(b + 1), word(b + 2), word(b + 3));
        let lo = |w: u64| w & 0xFFFF;
        let d = lo(w0) | lo(w1) << 16 | lo(w2) << 32 | lo(w3) << 48;
        let m = (w0 >> 16) | (w1 >> 16) << 16 | (w2 >> 16) << 32 | (w3 >> 16) << 48;
        (d as i64, m as i64)
    };
    let (d0, m0) = quad(0);
    let (d1, m1) = quad(4);
    let dv = _mm256_cvtph_ps(_mm_set_epi64x(d1, d0));
    let mt = match F {
        Q4_1 | Q5_1 => _mm256_cvtph_ps(_mm_set_epi64x(m1, m0)),
        Q4_0 => _mm256_mul_ps(dv, _mm256_set1_ps(-8.0)),
        Q5_0 => _mm256_mul_ps(dv, _mm256_set1_ps(-16.0)),
        _ => _mm256_setzero_ps(),
    };
    (dv, mt)
}

/// `v`, hidden from the optimizer: LLVM would otherwise narrow `and(zext(bytes), 15)`
/// and `zext(bytes) >> 4` into two byte operations and two widenings, 6 instructions
/// instead of 3.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn opaque(mut v: __m256i) -> __m256i {
    std::arch::asm!("/* {0} */", inout(ymm_reg) v, options(pure, nomem, nostack, preserves_flags));
    v
}

/// The 32 codes of the block at `p` as i16: elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn codes<const F: u8>(p: *const u8) -> (__m256i, __m256i) {
    let c = p.add(codes_at(F));
    if F == Q8_0 {
        return (
            _mm256_cvtepi8_epi16(_mm_loadu_si128(c as *const __m128i)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(c.add(16) as *const __m128i)),
        );
    }
    if F == Q5_0 || F == Q5_1 {
        return widen(codes5::<F>(p));
    }
    // Byte j holds element j (low nibble) and element j + 16 (high nibble).
    let v = opaque(_mm256_cvtepu8_epi16(_mm_loadu_si128(c as *const __m128i)));
    (
        _mm256_and_si256(v, _mm256_set1_epi16(0x0F)),
        _mm256_srli_epi16::<4>(v),
    )
}

/// The 32 bytes of `v` as i16: bytes 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen(v: __m256i) -> (__m256i, __m256i) {
    (
        _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v)),
        _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(v)),
    )
}

/// The 32 five-bit codes (0..32) of the Q5_0/Q5_1 block at `p`, one per byte in element
/// order. The high bits are spread in bytes, all 32 at once (each byte of `qh` copied to
/// eight, OR-ed with every bit but its own, compared with all ones), before one
/// widening: 11 operations where testing them in 16-bit lanes took 15.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn codes5<const F: u8>(p: *const u8) -> __m256i {
    let c = _mm_loadu_si128(p.add(codes_at(F)) as *const __m128i);
    // Low nibbles (elements 0..16), then high nibbles (16..32).
    let nibbles = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(c), c),
        _mm256_set1_epi8(0x0F),
    );
    // Bit e of qh is bit 4 of element e: byte e of `spread` is qh's byte e / 8.
    let qh = _mm256_set1_epi32((p.add(codes_at(F) - 4) as *const i32).read_unaligned());
    let spread = _mm256_shuffle_epi8(
        qh,
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        ),
    );
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
    _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
}

/// `NR` consecutive weight rows (the first at `row`, `ws` bytes apart) against the `M`
/// activation rows; the same rows at `ahead` are prefetched alongside.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_dot<const F: u8, const M: usize, const NR: usize>(
    acts: &ActsI16,
    row: *const u8,
    ws: usize,
    ahead: *const u8,
) -> [[f32; M]; NR] {
    let nb = acts.k / QK;
    let nbp = acts.nbp;
    // Two chains per output (one FMA per block would otherwise wait on the last one)
    // when there is one row; two rows are two chains already.
    let mut acc = [[[_mm256_setzero_ps(); 2]; M]; NR];
    let mut b0 = 0;
    while b0 < nb {
        let cnt = 8.min(nb - b0);
        let bytes = cnt * blk_bytes(F);
        for r in 0..NR {
            crate::matmul::prefetch_bytes(ahead.wrapping_add(r * ws + b0 * blk_bytes(F)), bytes);
        }
        // dw·dx of each block, row and activation row, read back one broadcast at a
        // time; the offsets' share `mt·sx` straight into the accumulators.
        let mut dd = [[[0.0f32; 8]; M]; NR];
        for r in 0..NR {
            let (dv, mt) = scales8::<F>(row.add(r * ws), b0, cnt);
            for i in 0..M {
                let dx = _mm256_loadu_ps(acts.dx.as_ptr().add(i * nbp + b0));
                _mm256_storeu_ps(dd[r][i].as_mut_ptr(), _mm256_mul_ps(dv, dx));
                if F != Q8_0 {
                    let sx = _mm256_loadu_ps(acts.sx.as_ptr().add(i * nbp + b0));
                    acc[r][i][1] = _mm256_fmadd_ps(mt, sx, acc[r][i][1]);
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
            out[r][i] = hsum(_mm256_add_ps(acc[r][i][0], acc[r][i][1]));
        }
    }
    out
}

/// Block `blk` of the `NR` rows, the `j`-th of its group of eight (whose `dw·dx` are
/// `dd`), into the accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const F: u8, const M: usize, const NR: usize>(
    acts: &ActsI16,
    row: *const u8,
    ws: usize,
    blk: usize,
    dd: &[[[f32; 8]; M]; NR],
    j: usize,
    acc: &mut [[[__m256; 2]; M]; NR],
) {
    let chain = if NR == 1 { j & 1 } else { 0 };
    for r in 0..NR {
        let (lo, hi) = codes::<F>(row.add(r * ws + blk * blk_bytes(F)));
        for i in 0..M {
            let xq = acts.q.as_ptr().add(i * acts.k + blk * QK);
            let p = _mm256_add_epi32(
                _mm256_madd_epi16(lo, _mm256_loadu_si256(xq as *const __m256i)),
                _mm256_madd_epi16(hi, _mm256_loadu_si256(xq.add(16) as *const __m256i)),
            );
            let a = &mut acc[r][i][chain];
            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dd[r][i][j]), *a);
        }
    }
}

/// [`super::quantize_row`] on AVX2 with the same results: the same `32767 / amax`
/// reciprocal, the same f32 products and `vcvtps2dq`'s round-half-to-even (for finite
/// blocks); `sx` sums the 32 values in eight lanes (another order, so it may differ in
/// the last bit).
///
/// # Safety
/// AVX2, FMA and F16C are available; `q` holds `x.len()` values, `dx` and `sx`
/// `x.len() / 32`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_row(x: &[f32], q: &mut [i16], dx: &mut [f32], sx: &mut [f32]) {
    let nb = x.len() / QK;
    debug_assert!(q.len() >= nb * QK && dx.len() >= nb && sx.len() >= nb);
    let p = x.as_ptr();
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    for b in 0..nb {
        let mut v = [_mm256_setzero_ps(); 4];
        let mut mx = _mm256_setzero_ps();
        for (j, vj) in v.iter_mut().enumerate() {
            *vj = _mm256_loadu_ps(p.add(b * QK + 8 * j));
            mx = _mm256_max_ps(mx, _mm256_and_ps(*vj, abs_mask));
        }
        let sum = _mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3]));
        let m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let s = hsum(sum);
        // NaN when the block holds a NaN or an infinity (x·0 is NaN only for those).
        let zero = _mm256_setzero_ps();
        let z = _mm256_add_ps(
            _mm256_add_ps(_mm256_mul_ps(v[0], zero), _mm256_mul_ps(v[1], zero)),
            _mm256_add_ps(_mm256_mul_ps(v[2], zero), _mm256_mul_ps(v[3], zero)),
        );
        let nonfinite = hsum(z);
        let id = if amax != 0.0 { 32767.0 / amax } else { 0.0 };
        dx[b] = amax / 32767.0 + nonfinite;
        sx[b] = s;
        let vid = _mm256_set1_ps(id);
        let qi: [__m256i; 4] = [
            _mm256_cvtps_epi32(_mm256_mul_ps(v[0], vid)),
            _mm256_cvtps_epi32(_mm256_mul_ps(v[1], vid)),
            _mm256_cvtps_epi32(_mm256_mul_ps(v[2], vid)),
            _mm256_cvtps_epi32(_mm256_mul_ps(v[3], vid)),
        ];
        // The saturating pack interleaves 128-bit lanes; the permute undoes it.
        for h in 0..2 {
            let packed = _mm256_packs_epi32(qi[2 * h], qi[2 * h + 1]);
            let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
            _mm256_storeu_si256(q.as_mut_ptr().add(b * QK + 16 * h) as *mut __m256i, ordered);
        }
    }
}
