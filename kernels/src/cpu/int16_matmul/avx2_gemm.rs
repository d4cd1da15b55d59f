//! The AVX2 kernel of the parent module past four activation rows (`auto` takes it up
//! to eight: small decode batches, speculative verification): an outer-product tile
//! like the f32 blocked path's (`matmul/avx2_gemm.rs`), in integers.
//!
//! The activation rows are packed once per product in 8-row tiles of int16 pairs
//! ([`PackedActs`]: lane `l` of pair `p` holds `(qx[r, 2p], qx[r, 2p + 1])` as one i32),
//! each block's `dx` and `Σx` beside them. A task decodes a panel of [`PANEL_ROWS`]
//! weight rows to i16 codes and per-block `dw`, `mt` once ([`Panel`]), then runs tiles of
//! 8 activation rows × 6 weight rows: per pair along K one load of `x`, six broadcast
//! code pairs and six `vpmaddwd` + `vpaddd` chains (16 products per instruction, an FMA's
//! twice). After each 32-element block the six exact i32 sums are folded into six f32
//! accumulators, `cvt(Σ)·(dx·dw) + Σx·mt` — all twelve in registers. K is walked
//! [`KB`] blocks at a time so that a panel's codes and a tile's pairs stay in L1.
//!
//! Every function needs AVX2, FMA and F16C (`CpuFeatures::has_avx2_kernels`).

use std::arch::x86_64::*;

use super::avx2::{codes, scales8};
use super::ActsI16;
use crate::cpu::block32::{blk_bytes, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::quant::{WeightFormat, QK};
use crate::weights::WeightMatrix;

/// Activation rows per tile (one ymm of i32 pairs).
pub(super) const TM: usize = 8;
/// Weight rows per tile.
const TN: usize = 6;
/// Weight rows a task decodes at a time (four tiles).
pub(super) const PANEL_ROWS: usize = 4 * TN;
/// Activation rows per task at most.
pub(super) const MAX_ROWS: usize = 64;
/// Blocks per step along K: a panel's codes (24 × 512 B) and a tile's pairs (4 KiB).
const KB: usize = 8;
/// Pairs of K per 32-element block.
const PAIRS: usize = QK / 2;
/// f32 values of one tile's accumulators.
const TILE: usize = TM * TN;

/// A product's activation rows in tiles of [`TM`], zero past the last row.
#[derive(Default)]
pub(super) struct PackedActs {
    /// `[tile][k/2][TM]` int16 pairs.
    q: Vec<i32>,
    /// `[tile][block][TM]` block scales `dx`.
    dx: Vec<f32>,
    /// `[tile][block][TM]` block sums `Σx`.
    sx: Vec<f32>,
    k: usize,
}

impl PackedActs {
    /// Packs the `m` rows of `acts`.
    pub(super) fn pack(&mut self, acts: &ActsI16, m: usize) {
        let (k, nb, np) = (acts.k, acts.k / QK, acts.k / 2);
        let tiles = m.div_ceil(TM);
        self.k = k;
        self.q.clear();
        self.q.resize(tiles * np * TM, 0);
        self.dx.clear();
        self.dx.resize(tiles * nb * TM, 0.0);
        self.sx.clear();
        self.sx.resize(tiles * nb * TM, 0.0);
        for i in 0..m {
            let (t, l) = (i / TM, i % TM);
            let row = &acts.q[i * k..(i + 1) * k];
            let q = &mut self.q[t * np * TM..(t + 1) * np * TM];
            for (p, pair) in row.chunks_exact(2).enumerate() {
                q[p * TM + l] = (pair[0] as u16 as u32 | (pair[1] as u16 as u32) << 16) as i32;
            }
            for b in 0..nb {
                self.dx[(t * nb + b) * TM + l] = acts.dx[i * acts.nbp + b];
                self.sx[(t * nb + b) * TM + l] = acts.sx[i * acts.nbp + b];
            }
        }
    }
}

/// A panel of weight rows decoded for the tiles: codes `[row][k]` as i16, and each
/// block's scale `dw` and offset `mt` (`[row][nbp]`, `nbp` the blocks rounded up to 8).
#[derive(Default)]
pub(super) struct Panel {
    codes: Vec<i16>,
    dw: Vec<f32>,
    mt: Vec<f32>,
    nbp: usize,
}

/// Columns `n0..n1` of `out = x · wᵀ` for activation rows `m0..m1` of `acts`.
///
/// # Safety
/// AVX2, FMA and F16C are available; `w` is Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 with
/// `acts.k` columns; `m0` is a multiple of [`TM`] and `m1 − m0 ≤ MAX_ROWS`; `out` is
/// `[m, w.rows()]` and rows `m0..m1` of columns `n0..n1` are written by this call only.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn task(
    acts: &PackedActs,
    m0: usize,
    m1: usize,
    w: &WeightMatrix,
    out: *mut f32,
    n0: usize,
    n1: usize,
    panel: &mut Panel,
) {
    // Only the decoding depends on the format; the tiles read decoded panels.
    let decode: unsafe fn(&WeightMatrix, usize, usize, &mut Panel) = match w.format() {
        WeightFormat::Q8_0 => decode_panel::<Q8_0>,
        WeightFormat::Q4_0 => decode_panel::<Q4_0>,
        WeightFormat::Q4_1 => decode_panel::<Q4_1>,
        WeightFormat::Q5_0 => decode_panel::<Q5_0>,
        WeightFormat::Q5_1 => decode_panel::<Q5_1>,
        other => unreachable!("int16 matmul of {other:?}"),
    };
    assert!(m0.is_multiple_of(TM) && m1 - m0 <= MAX_ROWS && acts.k == w.cols());
    let n = w.rows();
    let mut pn0 = n0;
    while pn0 < n1 {
        let pn = PANEL_ROWS.min(n1 - pn0);
        decode(w, pn0, pn, panel);
        panel_product(acts, m0, m1, panel, pn, out.add(m0 * n + pn0), n);
        pn0 += pn;
    }
}

/// Decodes weight rows `r0..r0 + pn` into `panel`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_panel<const F: u8>(w: &WeightMatrix, r0: usize, pn: usize, panel: &mut Panel) {
    let k = w.cols();
    let nb = k / QK;
    let nbp = nb.next_multiple_of(8);
    panel.nbp = nbp;
    if panel.codes.len() < PANEL_ROWS * k {
        panel.codes.resize(PANEL_ROWS * k, 0);
    }
    if panel.dw.len() < PANEL_ROWS * nbp {
        panel.dw.resize(PANEL_ROWS * nbp, 0.0);
        panel.mt.resize(PANEL_ROWS * nbp, 0.0);
    }
    for r in 0..pn {
        let row = w.base_ptr().add((r0 + r) * w.row_stride());
        let dst = panel.codes.as_mut_ptr().add(r * k) as *mut __m256i;
        for b in 0..nb {
            let (lo, hi) = codes::<F>(row.add(b * blk_bytes(F)));
            _mm256_storeu_si256(dst.add(2 * b), lo);
            _mm256_storeu_si256(dst.add(2 * b + 1), hi);
        }
        for b0 in (0..nb).step_by(8) {
            let (dv, mt) = scales8::<F>(row, b0, (nb - b0).min(8));
            _mm256_storeu_ps(panel.dw.as_mut_ptr().add(r * nbp + b0), dv);
            _mm256_storeu_ps(panel.mt.as_mut_ptr().add(r * nbp + b0), mt);
        }
    }
}

/// The 32 bits at `p` in every lane, by `vbroadcastss`: a load alone, where LLVM's
/// choice for an integer, `vpbroadcastd`, also takes a vector ALU slot on Zen — the
/// slots this kernel is short of.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn broadcast32(p: *const i32) -> __m256i {
    let v: __m256;
    std::arch::asm!(
        "vbroadcastss {v}, dword ptr [{p}]",
        v = out(ymm_reg) v,
        p = in(reg) p,
        options(pure, readonly, nostack, preserves_flags)
    );
    _mm256_castps_si256(v)
}

/// `out[i, j] = Σ_kk x[m0 + i, kk] · w[j, kk]` for `i < m1 − m0`, `j < pn`, the weight
/// rows from `panel`; `out` points at `(m0, first column)` with row stride `n`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_product(
    acts: &PackedActs,
    m0: usize,
    m1: usize,
    panel: &Panel,
    pn: usize,
    out: *mut f32,
    n: usize,
) {
    let (k, nbp) = (acts.k, panel.nbp);
    let (nb, np) = (k / QK, k / 2);
    let (t0, m_tiles, n_tiles) = (m0 / TM, (m1 - m0).div_ceil(TM), pn.div_ceil(TN));
    // Tile (it, jt) sums at acc[(it·n_tiles + jt)·TILE + r·TM + l]: row m0 + 8·it + l,
    // weight row 6·jt + r.
    let mut acc = [0.0f32; MAX_ROWS / TM * PANEL_ROWS / TN * TILE];
    let mut b0 = 0;
    while b0 < nb {
        let b1 = (b0 + KB).min(nb);
        for it in 0..m_tiles {
            let t = t0 + it;
            let xq = acts.q.as_ptr().add(t * np * TM);
            let (dx, sx) = (
                acts.dx.as_ptr().add(t * nb * TM),
                acts.sx.as_ptr().add(t * nb * TM),
            );
            for jt in 0..n_tiles {
                let j0 = jt * TN;
                let nr = TN.min(pn - j0);
                // A narrow last tile repeats its last row (computed, never stored).
                let jr: [usize; TN] = std::array::from_fn(|r| j0 + r.min(nr - 1));
                let wq: [*const i32; TN] =
                    std::array::from_fn(|r| panel.codes.as_ptr().add(jr[r] * k) as *const i32);
                let a = acc.as_mut_ptr().add((it * n_tiles + jt) * TILE);
                let mut f = [_mm256_setzero_ps(); TN];
                if b0 > 0 {
                    for (r, fr) in f.iter_mut().enumerate() {
                        *fr = _mm256_loadu_ps(a.add(r * TM));
                    }
                }
                for b in b0..b1 {
                    let mut s = [_mm256_setzero_si256(); TN];
                    let xb = xq.add(b * PAIRS * TM);
                    for p in 0..PAIRS {
                        let xv = _mm256_loadu_si256(xb.add(p * TM) as *const __m256i);
                        let pp = b * PAIRS + p;
                        for (r, sr) in s.iter_mut().enumerate() {
                            let wv = broadcast32(wq[r].add(pp));
                            *sr = _mm256_add_epi32(*sr, _mm256_madd_epi16(xv, wv));
                        }
                    }
                    let dxv = _mm256_loadu_ps(dx.add(b * TM));
                    let sxv = _mm256_loadu_ps(sx.add(b * TM));
                    for r in 0..TN {
                        let dw = _mm256_set1_ps(*panel.dw.get_unchecked(jr[r] * nbp + b));
                        let mt = _mm256_set1_ps(*panel.mt.get_unchecked(jr[r] * nbp + b));
                        let scale = _mm256_mul_ps(dxv, dw);
                        f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), scale, f[r]);
                        f[r] = _mm256_fmadd_ps(sxv, mt, f[r]);
                    }
                }
                for (r, fr) in f.iter().enumerate() {
                    _mm256_storeu_ps(a.add(r * TM), *fr);
                }
            }
        }
        b0 = b1;
    }
    let rows = m1 - m0;
    for it in 0..m_tiles {
        let valid = (rows - it * TM).min(TM);
        for j in 0..pn {
            let a = &acc[(it * n_tiles + j / TN) * TILE + (j % TN) * TM..][..valid];
            for (l, v) in a.iter().enumerate() {
                *out.add((it * TM + l) * n + j) = *v;
            }
        }
    }
}
