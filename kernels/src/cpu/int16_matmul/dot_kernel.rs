//! The dot-product kernel (one to four activation rows) as a macro, instantiated once per
//! CPU level with that level's target features: the levels differ only in how a block's
//! codes are built (`codes::<F>(p)` of the instantiating module, two ymm of i16:
//! elements 0..16 and 16..32), and a generic function could not inline a callee compiled
//! for more features than its own.
//!
//! The instantiating module has `codes` and `scales8` (`avx2.rs`) in scope and gets
//! `task`, the entry point (see its safety contract).

macro_rules! dot_kernel {
    ($features:literal) => {
        /// Columns `n0..n1` of `out = x · wᵀ` for the `m` quantized rows in `acts`.
        ///
        /// # Safety
        /// The features this kernel was compiled for are available; `w` is Q8_0, Q4_0,
        /// Q4_1, Q5_0 or Q5_1 with `acts.k` columns; `1 ≤ m ≤ 4`; `out` is
        /// `[m, w.rows()]` and columns `n0..n1` are written by this call only.
        pub(super) unsafe fn task(
            acts: &super::ActsI16,
            m: usize,
            w: &crate::weights::WeightMatrix,
            out: *mut f32,
            n0: usize,
            n1: usize,
        ) {
            use crate::cpu::block32::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
            use crate::quant::WeightFormat;
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
        #[target_feature(enable = $features)]
        unsafe fn cols<const F: u8, const M: usize>(
            acts: &super::ActsI16,
            w: &crate::weights::WeightMatrix,
            out: *mut f32,
            n0: usize,
            n1: usize,
        ) {
            use crate::matmul::PREFETCH_ROWS;
            let (n, ws, base) = (w.rows(), w.row_stride(), w.base_ptr());
            // The first rows have no earlier row to prefetch them: ask for them all at
            // once rather than one miss after another.
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
        #[target_feature(enable = $features)]
        unsafe fn hsum(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }

        /// `NR` consecutive weight rows (the first at `row`, `ws` bytes apart) against the
        /// `M` activation rows; the same rows at `ahead` are prefetched alongside.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn rows_dot<const F: u8, const M: usize, const NR: usize>(
            acts: &super::ActsI16,
            row: *const u8,
            ws: usize,
            ahead: *const u8,
        ) -> [[f32; M]; NR] {
            use crate::cpu::block32::{blk_bytes, Q8_0};
            let nb = acts.k / crate::quant::QK;
            let nbp = acts.nbp;
            // Two chains per output (one FMA per block would otherwise wait on the last
            // one) when there is one row; two rows are two chains already.
            let mut acc = [[[_mm256_setzero_ps(); 2]; M]; NR];
            let mut b0 = 0;
            while b0 < nb {
                let cnt = 8.min(nb - b0);
                let bytes = cnt * blk_bytes(F);
                for r in 0..NR {
                    crate::matmul::prefetch_bytes(
                        ahead.wrapping_add(r * ws + b0 * blk_bytes(F)),
                        bytes,
                    );
                }
                // dw·dx of each block, row and activation row, read back one broadcast at
                // a time; the offsets' share `mt·sx` straight into the accumulators.
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

        /// Block `blk` of the `NR` rows, the `j`-th of its group of eight (whose `dw·dx`
        /// are `dd`), into the accumulators.
        #[inline]
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn block<const F: u8, const M: usize, const NR: usize>(
            acts: &super::ActsI16,
            row: *const u8,
            ws: usize,
            blk: usize,
            dd: &[[[f32; 8]; M]; NR],
            j: usize,
            acc: &mut [[[__m256; 2]; M]; NR],
        ) {
            use crate::cpu::block32::blk_bytes;
            use crate::quant::QK;
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
    };
}
