//! 256-bit int8 kernels for the 5-bit, K-quant and IQ4 weights, stamped out for the
//! three integer dot products of `avx2.rs` (AVX2, AVX-VNNI, AVX-512 VNNI on ymm).
//!
//! Each task rewrites 4 weight rows at a time into codes + per-lane scales/offsets
//! ([`super::transcode`]) in a thread-local scratch, then every activation row meets
//! them: per 32-element block, `dx · (sw ⊙ Σ code·qx + ow ⊙ Σ qx)` over the 8 lanes
//! of 4 elements. The activations are the same per-32-block int8 quantization as for
//! Q8_0/Q4_x (finer than llama.cpp's per-256 Q8_K for the K-quants: the rounding error
//! bound is the per-32 one, `Σ_blocks amax/254 · Σ|w|`).

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::avx2::{dot_avxvnni, dot_evex, dot_maddubs};
use super::transcode::{has_offsets, signed_codes, transcode_row};
use super::ActsView;
use crate::quant::QK;
use crate::weights::WeightMatrix;

/// The current 4 weight rows, transcoded: codes `[4, k]`, scales and offsets `[4, k/4]`.
#[derive(Default)]
struct Transcoded {
    codes: Vec<u8>,
    sw: Vec<f32>,
    ow: Vec<f32>,
}

thread_local! {
    static ROWS: RefCell<Transcoded> = RefCell::new(Transcoded::default());
}

macro_rules! kquant_kernels_256 {
    ($task:ident, $features:literal, $dot:ident) => {
        /// One task of [`super::matmul_int8`] for a 5-bit / K-quant / IQ4 weight.
        ///
        /// # Safety
        /// The features of this variant are available; `acts` holds rows `m0..m1`
        /// quantized from `w.cols()` values each; `out` is `[m, w.rows()]` and no
        /// other task writes rows `m0..m1` × columns `n0..n1`; `w`'s format is one of
        /// `DType::EXTRA_QUANTS`.
        pub(super) unsafe fn $task(
            acts: ActsView,
            m0: usize,
            m1: usize,
            w: &WeightMatrix,
            out: *mut f32,
            n0: usize,
            n1: usize,
        ) {
            /// Horizontal sum of 8 floats.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn hsum(v: __m256) -> f32 {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
            }

            /// Activation row `i` against `NR` transcoded weight rows; writes `NR`
            /// outputs at `out`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn row<const SIGNED: bool, const NR: usize>(
                acts: ActsView,
                i: usize,
                t: &Transcoded,
                out: *mut f32,
            ) {
                let (k, nb) = (acts.k, acts.nb());
                let lanes = k / 4;
                let (codes, sw, ow) = (t.codes.as_ptr(), t.sw.as_ptr(), t.ow.as_ptr());
                let ones = _mm256_set1_epi8(1);
                let mut acc = [_mm256_setzero_ps(); NR];
                for b in 0..nb {
                    let xv = _mm256_loadu_si256(acts.q.add(i * k + b * QK) as *const __m256i);
                    let dxv = _mm256_loadu_ps(acts.dx8.add((i * nb + b) * 8));
                    let xsum = if SIGNED {
                        _mm256_setzero_ps()
                    } else {
                        _mm256_cvtepi32_ps($dot(ones, xv))
                    };
                    for (r, a) in acc.iter_mut().enumerate() {
                        let cv = _mm256_loadu_si256(codes.add(r * k + b * QK) as *const __m256i);
                        let d = if SIGNED {
                            $dot(_mm256_sign_epi8(cv, cv), _mm256_sign_epi8(xv, cv))
                        } else {
                            $dot(cv, xv)
                        };
                        let lane = r * lanes + b * 8;
                        let mut v =
                            _mm256_mul_ps(_mm256_cvtepi32_ps(d), _mm256_loadu_ps(sw.add(lane)));
                        if !SIGNED {
                            v = _mm256_fmadd_ps(_mm256_loadu_ps(ow.add(lane)), xsum, v);
                        }
                        *a = _mm256_fmadd_ps(v, dxv, *a);
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    *out.add(r) = hsum(*a);
                }
            }

            let (n, k) = (w.rows(), w.cols());
            let format = w.format();
            let signed = signed_codes(format);
            debug_assert_eq!(signed, !has_offsets(format));
            ROWS.with_borrow_mut(|t| {
                if t.codes.len() < 4 * k {
                    t.codes.resize(4 * k, 0);
                    t.sw.resize(k, 0.0);
                    t.ow.resize(k, 0.0);
                }
                let mut j = n0;
                while j < n1 {
                    let nr = 4.min(n1 - j);
                    for r in 0..nr {
                        let Transcoded { codes, sw, ow } = &mut *t;
                        transcode_row(
                            format,
                            w.row_bytes(j + r).unwrap_or_default(),
                            &mut codes[r * k..(r + 1) * k],
                            &mut sw[r * k / 4..(r + 1) * k / 4],
                            &mut ow[r * k / 4..(r + 1) * k / 4],
                        );
                    }
                    for i in m0..m1 {
                        let o = out.add(i * n + j);
                        match (signed, nr) {
                            (false, 1) => row::<false, 1>(acts, i, t, o),
                            (false, 2) => row::<false, 2>(acts, i, t, o),
                            (false, 3) => row::<false, 3>(acts, i, t, o),
                            (false, 4) => row::<false, 4>(acts, i, t, o),
                            (true, 1) => row::<true, 1>(acts, i, t, o),
                            (true, 2) => row::<true, 2>(acts, i, t, o),
                            (true, 3) => row::<true, 3>(acts, i, t, o),
                            (true, 4) => row::<true, 4>(acts, i, t, o),
                            _ => unreachable!("tile of {nr} rows"),
                        }
                    }
                    j += nr;
                }
            });
        }
    };
}

kquant_kernels_256!(task_avx2, "avx2,fma,f16c", dot_maddubs);
kquant_kernels_256!(task_avxvnni, "avx2,fma,f16c,avxvnni", dot_avxvnni);
kquant_kernels_256!(
    task_avx512vnni256,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    dot_evex
);
