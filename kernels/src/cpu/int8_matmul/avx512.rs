//! AVX-512 VNNI kernels: two 32-element blocks per `vpdpbusd` on zmm.
//!
//! Every function here is `#[target_feature]` and only reached after
//! [`Int8Isa::Avx512Vnni`](super::Int8Isa) was found available (the activation
//! quantizer after `use_avx512()`), which is what makes calling them sound.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::{padded_blocks, ActsView};
use crate::cpu::block32::{blk_bytes, codes_at, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::matmul::avx512::hsum4;
use crate::matmul::{prefetch_bytes, PREFETCH_ROWS};
use crate::quant::{WeightFormat, QK};
use crate::weights::WeightMatrix;

thread_local! {
    /// Per-task block scales of the current 4 weight rows (see [`task`]).
    static SCALES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Quantizes one row (a multiple of 32 values) to int8 per block: same results as
/// `quantize_row_scalar` (`vcvtps2dq` rounds half to even under the default MXCSR).
///
/// # Safety
/// AVX-512 F/BW/VL must be available; buffers as for `quantize_row_scalar`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(super) unsafe fn quantize_row(x: &[f32], q: *mut i8, dx8: *mut f32, sx: *mut f32) {
    let nb = x.len() / QK;
    let p = x.as_ptr();
    for b in 0..nb {
        let v0 = _mm512_loadu_ps(p.add(b * QK));
        let v1 = _mm512_loadu_ps(p.add(b * QK + 16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let d = amax / 127.0;
        let vid = _mm512_set1_ps(id);
        let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        // |q| <= 127, so the truncating 32 -> 8 bit narrowing is exact.
        _mm_storeu_si128(q.add(b * QK) as *mut __m128i, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128(q.add(b * QK + 16) as *mut __m128i, _mm512_cvtepi32_epi8(q1));
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        _mm256_storeu_ps(dx8.add(b * 8), _mm256_set1_ps(d));
        *sx.add(b) = d * sum as f32;
    }
    for b in nb..padded_blocks(nb) {
        *sx.add(b) = 0.0;
    }
}

/// Writes one weight row's block scales to `dw[0..nbp]` and its per-block offset
/// factors to `mt[0..nbp]` (Q4_1/Q5_1: the min `m`; Q4_0: `−8·d`; Q5_0: `−16·d`; Q8_0:
/// 0), zero past `nb`.
/// Sixteen blocks at a time with one masked gather.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn weight_scales<const F: u8>(row: *const u8, nb: usize, dw: *mut f32, mt: *mut f32) {
    let bb = blk_bytes(F);
    let idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(bb as i32),
    );
    let mut b = 0;
    while b < nb {
        let rem = nb - b;
        let mask: __mmask16 = if rem >= 16 { 0xFFFF } else { (1u16 << rem) - 1 };
        // Lane l: the first 4 bytes of block b + l (d, and m for Q4_1); masked-off
        // lanes read nothing and stay 0.
        let g = _mm512_mask_i32gather_epi32::<1>(
            _mm512_setzero_si512(),
            mask,
            idx,
            row.add(b * bb) as *const i32,
        );
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
        _mm512_storeu_ps(dw.add(b), d);
        let t = match F {
            Q4_1 | Q5_1 => _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(g))),
            Q4_0 => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
            Q5_0 => _mm512_mul_ps(d, _mm512_set1_ps(-16.0)),
            _ => _mm512_setzero_ps(),
        };
        _mm512_storeu_ps(mt.add(b), t);
        b += 16;
    }
}

/// Blocks `b` and `b + 1` of a weight row as 64 bytes in element order: Q8_0 as
/// signed int8, Q4_x as the unsigned nibbles 0..15, Q5_x as the codes 0..31. `TAIL`: only block `b` exists
/// (the upper 32 bytes are zero).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn load_pair<const F: u8, const TAIL: bool>(row: *const u8, b: usize) -> __m512i {
    let p = row.add(b * blk_bytes(F));
    if F == Q8_0 {
        let a = _mm256_loadu_si256(p.add(2) as *const __m256i);
        if TAIL {
            return _mm512_zextsi256_si512(a);
        }
        let c = _mm256_loadu_si256(p.add(34 + 2) as *const __m256i);
        return _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), c);
    }
    let off = codes_at(F);
    let a = _mm_loadu_si128(p.add(off) as *const __m128i);
    let c = if TAIL {
        _mm_setzero_si128()
    } else {
        _mm_loadu_si128(p.add(blk_bytes(F) + off) as *const __m128i)
    };
    // [A, B] -> 128-bit lanes [A, A, B, B]; the high nibbles (elements 16..31 of each
    // block) come from shifting lanes 1 and 3 right by 4.
    let z = _mm512_castsi256_si512(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), c));
    let z = _mm512_shuffle_i64x2::<0x50>(z, z);
    let z = _mm512_mask_srli_epi16::<4>(z, 0xFF00_FF00, z);
    let z = _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
    if F == Q5_0 || F == Q5_1 {
        // Bit e of a block's qh is bit 4 of its element e: one byte mask for both.
        let qh = |at: *const u8| (at.add(off - 4) as *const u32).read_unaligned() as u64;
        let high = qh(p)
            | if TAIL {
                0
            } else {
                qh(p.add(blk_bytes(F))) << 32
            };
        // (The nibbles are below 16: adding 16 sets bit 4.)
        return _mm512_mask_add_epi8(z, _cvtu64_mask64(high), z, _mm512_set1_epi8(0x10));
    }
    z
}

/// One pair of blocks (`2p`, `2p + 1`) of an `MR × NR` tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn pair_step<const F: u8, const MR: usize, const NR: usize, const TAIL: bool>(
    acc: &mut [[__m512; NR]; MR],
    acts: ActsView,
    i0: usize,
    w: *const u8,
    ws: usize,
    dw: *const f32,
    ss: usize,
    p: usize,
) {
    let (k, nb) = (acts.k, acts.nb());
    let b = 2 * p;
    let zero = _mm512_setzero_si512();
    // Lanes 0..7 (block b's dot products) take scale 0, lanes 8..15 scale 1.
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let mut wv = [zero; NR];
    let mut neg = [0u64; NR];
    let mut sc = [_mm512_setzero_ps(); NR];
    for r in 0..NR {
        let v = load_pair::<F, TAIL>(w.add(r * ws), b);
        if F == Q8_0 {
            // vpdpbusd multiplies unsigned by signed bytes: |w| times x with w's sign
            // (|−128| = 128 still fits an unsigned byte).
            neg[r] = _mm512_movepi8_mask(v);
            wv[r] = _mm512_abs_epi8(v);
        } else {
            wv[r] = v;
        }
        sc[r] = _mm512_permutexvar_ps(idx, _mm512_loadu_ps(dw.add(r * ss + b)));
    }
    let (xmask, dmask): (__mmask64, __mmask16) = if TAIL {
        (0xFFFF_FFFF, 0x00FF)
    } else {
        (!0, !0)
    };
    for (i, a) in acc.iter_mut().enumerate() {
        let row = i0 + i;
        let xv = _mm512_maskz_loadu_epi8(xmask, acts.q.add(row * k + b * QK));
        let dxv = _mm512_maskz_loadu_ps(dmask, acts.dx8.add((row * nb + b) * 8));
        for r in 0..NR {
            let xs = if F == Q8_0 {
                _mm512_mask_sub_epi8(xv, neg[r], zero, xv)
            } else {
                xv
            };
            let dot = _mm512_dpbusd_epi32(zero, wv[r], xs);
            let f = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), dxv);
            a[r] = _mm512_fmadd_ps(f, sc[r], a[r]);
        }
    }
}

/// `MR × NR` outputs: rows `i0..i0 + MR` of the activations against `NR` weight rows
/// at `w` (stride `ws`) whose scales are at `dw` / `mt` (row stride `ss`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const F: u8, const MR: usize, const NR: usize>(
    acts: ActsView,
    i0: usize,
    w: *const u8,
    ws: usize,
    dw: *const f32,
    mt: *const f32,
    ss: usize,
    out: *mut f32,
    os: usize,
) {
    let nb = acts.nb();
    let nbp = padded_blocks(nb);
    let mut acc = [[_mm512_setzero_ps(); NR]; MR];
    if F != Q8_0 {
        // The offset terms Σ_b mt[b] · sx[b], started in the accumulators.
        for (i, a) in acc.iter_mut().enumerate() {
            let sx = acts.sx.add((i0 + i) * nbp);
            for (r, ar) in a.iter_mut().enumerate() {
                let mut b = 0;
                while b < nbp {
                    let t = _mm512_loadu_ps(mt.add(r * ss + b));
                    *ar = _mm512_fmadd_ps(t, _mm512_loadu_ps(sx.add(b)), *ar);
                    b += 16;
                }
            }
        }
    }
    for p in 0..nb / 2 {
        pair_step::<F, MR, NR, false>(&mut acc, acts, i0, w, ws, dw, ss, p);
    }
    if nb % 2 == 1 {
        pair_step::<F, MR, NR, true>(&mut acc, acts, i0, w, ws, dw, ss, nb / 2);
    }
    for (i, a) in acc.iter().enumerate() {
        if NR == 4 {
            _mm_storeu_ps(out.add(i * os), hsum4(a[0], a[1], a[2], a[3]));
        } else {
            for (r, v) in a.iter().enumerate() {
                *out.add(i * os + r) = _mm512_reduce_add_ps(*v);
            }
        }
    }
}

/// Rows `m0..m1` × weight rows `n0..n1`: for each group of 4 weight rows, their
/// scales once, then tiles of up to 4 activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn task_f<const F: u8>(
    acts: ActsView,
    m0: usize,
    m1: usize,
    w: *const u8,
    ws: usize,
    out: *mut f32,
    n: usize,
    n0: usize,
    n1: usize,
    scr: *mut f32,
    ss: usize,
) {
    let nb = acts.nb();
    let (dw, mt) = (scr, scr.add(4 * ss));
    let mut j = n0;
    while j < n1 {
        let nr = 4.min(n1 - j);
        for r in 0..nr {
            if j + r + PREFETCH_ROWS < n {
                prefetch_bytes(w.wrapping_add((j + r + PREFETCH_ROWS) * ws), ws);
            }
            weight_scales::<F>(w.add((j + r) * ws), nb, dw.add(r * ss), mt.add(r * ss));
        }
        let wj = w.add(j * ws);
        let mut i = m0;
        while i < m1 {
            let mr = 4.min(m1 - i);
            let o = out.add(i * n + j);
            macro_rules! go {
                ($($m:literal $n:literal),*) => {
                    match (mr, nr) {
                        $(($m, $n) => tile::<F, $m, $n>(acts, i, wj, ws, dw, mt, ss, o, n),)*
                        _ => unreachable!("tile {mr}x{nr}"),
                    }
                };
            }
            go!(1 1, 1 2, 1 3, 1 4, 2 1, 2 2, 2 3, 2 4, 3 1, 3 2, 3 3, 3 4, 4 1, 4 2, 4 3, 4 4);
            i += mr;
        }
        j += nr;
    }
}

/// One task of [`super::matmul_int8`] on AVX-512 VNNI.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, FMA and F16C are available; `acts` holds rows `m0..m1`
/// quantized from `w.cols()` values each; `out` is `[m, w.rows()]` and no other task
/// writes rows `m0..m1` × columns `n0..n1`; `w` is Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1.
pub(super) unsafe fn task(
    acts: ActsView,
    m0: usize,
    m1: usize,
    w: &WeightMatrix,
    out: *mut f32,
    n0: usize,
    n1: usize,
) {
    let ss = padded_blocks(acts.nb()) + 16;
    SCALES.with_borrow_mut(|s| {
        if s.len() < 8 * ss {
            s.resize(8 * ss, 0.0);
        }
        let (wp, ws, n, scr) = (w.base_ptr(), w.row_stride(), w.rows(), s.as_mut_ptr());
        match w.format() {
            WeightFormat::Q8_0 => task_f::<Q8_0>(acts, m0, m1, wp, ws, out, n, n0, n1, scr, ss),
            WeightFormat::Q4_0 => task_f::<Q4_0>(acts, m0, m1, wp, ws, out, n, n0, n1, scr, ss),
            WeightFormat::Q4_1 => task_f::<Q4_1>(acts, m0, m1, wp, ws, out, n, n0, n1, scr, ss),
            WeightFormat::Q5_0 => task_f::<Q5_0>(acts, m0, m1, wp, ws, out, n, n0, n1, scr, ss),
            WeightFormat::Q5_1 => task_f::<Q5_1>(acts, m0, m1, wp, ws, out, n, n0, n1, scr, ss),
            other => unreachable!("int8 matmul of {other:?}"),
        }
    });
}
