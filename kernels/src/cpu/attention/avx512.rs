//! AVX-512 tile kernel: the query rows of one KV head (all `r = n_q_heads / n_kv_heads`
//! heads of a few consecutive tokens of one sequence) against a KV range.
//!
//! Per chunk of 16 keys: the 16 K rows are transposed once into `kt[d][key]`, so each
//! query row gets its 16 scores in one zmm from `head_dim` broadcast FMAs (no horizontal
//! reduction per key); the online softmax runs on those zmm with a vector `exp`; then
//! every V row is loaded once and FMA'd into the register-resident output rows of all
//! query rows. The work per KV byte is thus one transpose plus `rows` FMAs, and
//! K/V are streamed from memory exactly once per tile.

// Register-array loops index several arrays in lockstep; iterators would obscure them.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::kv_store::KvRef;
use crate::kv_dtype::{fp8_scale_value, KvCacheDType};

/// Keys per chunk (one zmm of scores per query row).
const KC: usize = 16;
/// Software prefetch distance (bytes of K, and as much V, ahead of the chunk being
/// computed) and granularity. Blocks are scattered 4 KiB pages as far as the hardware
/// is concerned; touching each upcoming page once, well ahead, warms its TLB entry and
/// restarts the stream prefetcher early, which on Zen 4 roughly doubled the DRAM rate
/// of 4:1 GQA decode (prefetching every line instead made it slower).
const PF_BYTES: usize = 65536;
const PF_STEP: usize = 4096;

/// One work item for [`attend_tile`]: `groups` consecutive KV heads, each with `r`
/// query heads, for a few tokens. All KV heads of a slot row are handled in the same
/// pass so the cache is streamed sequentially once.
pub(super) struct Tile<'a> {
    /// Query head `h` (`0..groups·r`, of KV head `h / r`) of token `tt` of the tile is
    /// at `q + tt * q_tok_stride + h * hd`.
    pub q: *const f32,
    pub q_tok_stride: usize,
    /// Query heads per KV head.
    pub r: usize,
    /// KV heads (at `kc + g * hd` within a slot row).
    pub groups: usize,
    /// Tokens in the tile; their kv lengths.
    pub kv_len: &'a [u32],
    pub hd: usize,
    pub scale: f32,
    /// f32 caches offset to the first KV head; `slot_stride` elements per slot
    /// (null when the caches are narrower, see `packed`).
    pub kc: *const f32,
    pub vc: *const f32,
    /// Caches in a narrower type, with the offset of the first KV head: each chunk's
    /// slot rows are decoded into the tile's scratch just before use.
    pub packed: Option<(KvRef<'a>, KvRef<'a>, usize)>,
    pub slot_stride: usize,
    pub bt: &'a [u32],
    pub bs: usize,
    /// Key range of this item (clamped to each row's kv length).
    pub start: usize,
    pub end: usize,
    /// Output of query head `h` of token `tt` is `out + (tt * out_tok_stride + h) * hd`,
    /// its LSE `lse + tt * out_tok_stride + h`.
    pub out: *mut f32,
    pub lse: *mut f32,
    pub out_tok_stride: usize,
}

#[inline]
fn mask(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// Decodes elements `start..start + n` of a narrow cache to f32 at `dst`, 16 per step:
/// bf16 by widening and shifting, E5M2 as the top byte of an f16, E4M3 by rebasing its
/// exponent, FP8 times its row's power-of-two scale (all exact; the tests compare with
/// the scalar decoder).
///
/// # Safety
/// AVX-512F/BW/VL must be available, the elements in bounds, `dst` valid for `n` floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn decode_row(src: &KvRef<'_>, start: usize, dst: *mut f32, n: usize) {
    match src {
        KvRef::Bf16(v) => {
            debug_assert!(start + n <= v.len());
            let p = v.as_ptr().add(start) as *const i16;
            let mut i = 0;
            while i < n {
                let m = mask(n - i);
                let h = _mm256_maskz_loadu_epi16(m, p.add(i));
                let w = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
                _mm512_mask_storeu_ps(dst.add(i), m, _mm512_castsi512_ps(w));
                i += 16;
            }
        }
        KvRef::Fp8 {
            codes,
            scales,
            row_len,
            dtype,
        } => {
            debug_assert!(start + n <= codes.len());
            let p = codes.as_ptr().add(start) as *const i8;
            let e5m2 = *dtype == KvCacheDType::Fp8E5M2;
            // Row by row (one KV head's row, usually), each with its own scale.
            let mut i = 0;
            while i < n {
                let row = (start + i) / row_len;
                let stop = ((row + 1) * row_len - start).min(n);
                let sc = _mm512_set1_ps(fp8_scale_value(*scales.get_unchecked(row)));
                while i < stop {
                    let m = mask(stop - i);
                    let c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, p.add(i)));
                    let x = if e5m2 {
                        // E5M2 is the top byte of an IEEE half: exact via vcvtph2ps.
                        let h = _mm512_cvtepi32_epi16(_mm512_slli_epi32::<8>(c));
                        _mm512_mul_ps(_mm512_cvtph_ps(h), sc)
                    } else {
                        _mm512_mul_ps(e4m3_to_f32(c), sc)
                    };
                    _mm512_mask_storeu_ps(dst.add(i), m, x);
                    i += 16;
                }
                i = stop;
            }
        }
        KvRef::F32(_) => src.decode(start, std::slice::from_raw_parts_mut(dst, n)),
    }
}

/// The values of 16 E4M3 codes (zero-extended to i32 lanes), unscaled: normal codes
/// by rebasing the exponent from bias 7 to 127 with the mantissa on top (an exact f32),
/// subnormal codes (exponent 0) as m · 2⁻⁹, `S.1111.111` as NaN. No arithmetic on f32
/// subnormals, which can be slow.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn e4m3_to_f32(c: __m512i) -> __m512 {
    let mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    let normal = _mm512_add_epi32(_mm512_slli_epi32::<20>(mag), _mm512_set1_epi32(120 << 23));
    let sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(2f32.powi(-9)));
    let is_sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
    let v = _mm512_mask_mov_ps(_mm512_castsi512_ps(normal), is_sub, sub);
    let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(c, _mm512_set1_epi32(0x80)));
    let v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
    let nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
    _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(f32::NAN))
}

/// Cephes-style `exp` (≈1 ulp) with `vscalefps` for the 2^n step.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
pub(super) unsafe fn exp16(x: __m512) -> __m512 {
    let x = _mm512_max_ps(
        _mm512_min_ps(x, _mm512_set1_ps(88.7)),
        _mm512_set1_ps(-104.0),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3f32,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0));
    _mm512_scalef_ps(y, n)
}

/// Transposes 16 rows of 16 floats (`x[key]`) into `dst[col * 16 + key]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn transpose16(x: &[__m512; 16], dst: *mut f32) {
    let mut t = [_mm512_setzero_ps(); 16];
    for b in 0..4 {
        let (r0, r1, r2, r3) = (x[4 * b], x[4 * b + 1], x[4 * b + 2], x[4 * b + 3]);
        let a0 = _mm512_castps_pd(_mm512_unpacklo_ps(r0, r1));
        let a1 = _mm512_castps_pd(_mm512_unpackhi_ps(r0, r1));
        let a2 = _mm512_castps_pd(_mm512_unpacklo_ps(r2, r3));
        let a3 = _mm512_castps_pd(_mm512_unpackhi_ps(r2, r3));
        // t[4b + c], 128-bit lane k: rows 4b..4b+4 at column 4k + c.
        t[4 * b] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
        t[4 * b + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
        t[4 * b + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
        t[4 * b + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
    }
    for c in 0..4 {
        let x01 = _mm512_shuffle_f32x4::<0x88>(t[c], t[4 + c]);
        let y01 = _mm512_shuffle_f32x4::<0xDD>(t[c], t[4 + c]);
        let x23 = _mm512_shuffle_f32x4::<0x88>(t[8 + c], t[12 + c]);
        let y23 = _mm512_shuffle_f32x4::<0xDD>(t[8 + c], t[12 + c]);
        // Column 4k + c collects lane k of t[c], t[4 + c], t[8 + c], t[12 + c].
        _mm512_store_ps(dst.add(c * 16), _mm512_shuffle_f32x4::<0x88>(x01, x23));
        _mm512_store_ps(
            dst.add((4 + c) * 16),
            _mm512_shuffle_f32x4::<0x88>(y01, y23),
        );
        _mm512_store_ps(
            dst.add((8 + c) * 16),
            _mm512_shuffle_f32x4::<0xDD>(x01, x23),
        );
        _mm512_store_ps(
            dst.add((12 + c) * 16),
            _mm512_shuffle_f32x4::<0xDD>(y01, y23),
        );
    }
}

/// Scores of `G` query rows (`q + g * hdp`) against the transposed chunk:
/// `s[g * 16 + key] = scale · Σ_d q[g][d] · kt[d][key]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn qk<const G: usize>(
    q: *const f32,
    hdp: usize,
    hd: usize,
    kt: *const f32,
    s: *mut f32,
    scale: f32,
) {
    let mut a0 = [_mm512_setzero_ps(); G];
    let mut a1 = [_mm512_setzero_ps(); G];
    let mut d = 0;
    while d + 2 <= hd {
        let k0 = _mm512_load_ps(kt.add(d * KC));
        let k1 = _mm512_load_ps(kt.add((d + 1) * KC));
        for g in 0..G {
            let qg = q.add(g * hdp + d);
            a0[g] = _mm512_fmadd_ps(_mm512_set1_ps(*qg), k0, a0[g]);
            a1[g] = _mm512_fmadd_ps(_mm512_set1_ps(*qg.add(1)), k1, a1[g]);
        }
        d += 2;
    }
    if d < hd {
        let k0 = _mm512_load_ps(kt.add(d * KC));
        for g in 0..G {
            a0[g] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(g * hdp + d)), k0, a0[g]);
        }
    }
    let sc = _mm512_set1_ps(scale);
    for g in 0..G {
        _mm512_store_ps(
            s.add(g * KC),
            _mm512_mul_ps(_mm512_add_ps(a0[g], a1[g]), sc),
        );
    }
}

/// Horizontal sums of 16 vectors: `out[j] = Σ_lanes x[j]` (15 adds, 30 shuffles).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn reduce16(x: &[__m512; 16]) -> __m512 {
    // Pairs: each 128-bit lane holds [a, b, a, b] partials.
    let mut c = [_mm512_setzero_ps(); 8];
    for k in 0..8 {
        let (a, b) = (x[2 * k], x[2 * k + 1]);
        c[k] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    // Quads: each 128-bit lane holds partials of keys 4m..4m + 4.
    let mut d = [_mm512_setzero_ps(); 4];
    for m in 0..4 {
        let (a, b) = (_mm512_castps_pd(c[2 * m]), _mm512_castps_pd(c[2 * m + 1]));
        d[m] = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        );
    }
    let h0 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x44>(d[0], d[1]),
        _mm512_shuffle_f32x4::<0xEE>(d[0], d[1]),
    );
    let h1 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x44>(d[2], d[3]),
        _mm512_shuffle_f32x4::<0xEE>(d[2], d[3]),
    );
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x88>(h0, h1),
        _mm512_shuffle_f32x4::<0xDD>(h0, h1),
    )
}

/// Scores of one query row (`q`, `NV` vectors, zero-padded) against the chunk's key
/// rows directly (per-key dot products, then one transpose-reduce): cheaper than
/// transposing K when few query rows share the chunk.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn qk_direct<const NV: usize>(
    q: *const f32,
    krows: &[*const f32; KC],
    c: usize,
    tail: __mmask16,
    s: *mut f32,
    scale: f32,
) {
    let mut qv = [_mm512_setzero_ps(); NV];
    for (v, x) in qv.iter_mut().enumerate() {
        *x = _mm512_load_ps(q.add(v * 16));
    }
    let mut a = [_mm512_setzero_ps(); KC];
    for (j, aj) in a.iter_mut().enumerate() {
        if j < c {
            let k = krows[j];
            let mut x = _mm512_mul_ps(
                qv[0],
                _mm512_maskz_loadu_ps(if NV == 1 { tail } else { 0xFFFF }, k),
            );
            for v in 1..NV {
                let mk = if v + 1 == NV { tail } else { 0xFFFF };
                x = _mm512_fmadd_ps(qv[v], _mm512_maskz_loadu_ps(mk, k.add(v * 16)), x);
            }
            *aj = x;
        }
    }
    _mm512_store_ps(s, _mm512_mul_ps(reduce16(&a), _mm512_set1_ps(scale)));
}

/// `acc[g][col..col + 16·CB] = alpha[g] · acc[g][..] + Σ_key p[g][key] · v[key][..]` for
/// `G` rows; the last vector of the block loads V with `last` as mask.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv<const G: usize, const CB: usize>(
    vrows: &[*const f32; KC],
    c: usize,
    p: *const f32,
    alpha: *const f32,
    acc: *mut f32,
    hdp: usize,
    col: usize,
    last: __mmask16,
) {
    let mut a = [[_mm512_setzero_ps(); CB]; G];
    for g in 0..G {
        let al = _mm512_set1_ps(*alpha.add(g));
        for v in 0..CB {
            a[g][v] = _mm512_mul_ps(_mm512_load_ps(acc.add(g * hdp + col + v * 16)), al);
        }
    }
    for (key, &vr) in vrows.iter().enumerate().take(c) {
        let vp = vr.add(col);
        let mut x = [_mm512_setzero_ps(); CB];
        for (v, xv) in x.iter_mut().enumerate() {
            let m = if v + 1 == CB { last } else { 0xFFFF };
            *xv = _mm512_maskz_loadu_ps(m, vp.add(v * 16));
        }
        for g in 0..G {
            let pg = _mm512_set1_ps(*p.add(g * KC + key));
            for v in 0..CB {
                a[g][v] = _mm512_fmadd_ps(pg, x[v], a[g][v]);
            }
        }
    }
    for g in 0..G {
        for v in 0..CB {
            _mm512_store_ps(acc.add(g * hdp + col + v * 16), a[g][v]);
        }
    }
}

/// [`pv`] over all `rows`, for one column block of `CB` vectors.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_rows<const CB: usize>(
    vrows: &[*const f32; KC],
    c: usize,
    p: *const f32,
    alpha: *const f32,
    acc: *mut f32,
    rows: usize,
    hdp: usize,
    col: usize,
    last: __mmask16,
) {
    let mut i = 0;
    macro_rules! go {
        ($g:literal) => {
            pv::<$g, CB>(
                vrows,
                c,
                p.add(i * KC),
                alpha.add(i),
                acc.add(i * hdp),
                hdp,
                col,
                last,
            );
            #[allow(unused_assignments)]
            {
                i += $g;
            }
        };
    }
    if CB < 4 {
        while rows - i >= 8 {
            go!(8);
        }
    }
    while rows - i >= 4 {
        go!(4);
    }
    if rows - i >= 2 {
        go!(2);
    }
    if rows - i >= 1 {
        go!(1);
    }
}

/// Slot offsets (in floats) of keys `j..j + n`.
#[inline(always)]
fn offsets(t: &Tile, j: usize, n: usize, off: &mut [usize; KC]) {
    let (mut blk, mut w) = (j / t.bs, j % t.bs);
    for o in off.iter_mut().take(n) {
        *o = (t.bt[blk] as usize * t.bs + w) * t.slot_stride;
        w += 1;
        if w == t.bs {
            w = 0;
            blk += 1;
        }
    }
}

/// Prefetches the K and V slot rows of keys `j..e` (whole rows: every KV head of a
/// slot is used), one contiguous span per block, every `step`-th cache line.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn prefetch(t: &Tile, mut j: usize, e: usize, step: usize) {
    while j < e {
        let (blk, w) = (j / t.bs, j % t.bs);
        let n = (t.bs - w).min(e - j);
        let o = (t.bt[blk] as usize * t.bs + w) * t.slot_stride;
        let (kp, vp, eb) = match t.packed {
            Some((k, v, h)) => (
                k.byte_ptr().add((o + h) * k.dtype().bytes()) as *const i8,
                v.byte_ptr().add((o + h) * k.dtype().bytes()) as *const i8,
                k.dtype().bytes(),
            ),
            None => (t.kc.add(o) as *const i8, t.vc.add(o) as *const i8, 4),
        };
        let bytes = n * t.slot_stride * eb;
        let mut b = 0;
        while b < bytes {
            _mm_prefetch::<_MM_HINT_T0>(kp.add(b));
            _mm_prefetch::<_MM_HINT_T0>(vp.add(b));
            b += step;
        }
        j += n;
    }
}

/// Attends the tile's query rows to keys `start..end` (each row clamped to its own kv
/// length) and writes normalized outputs and LSEs.
///
/// # Safety
/// AVX-512F/BW/VL and FMA must be available; all pointers valid for the described
/// rows, `bt` must cover every key below the tile's largest kv length, the cache rows
/// it names must be in bounds, and no other thread may write the output rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
pub(super) unsafe fn attend_tile(t: &Tile, scratch: &mut Vec<f32>) {
    let (hd, r, ng) = (t.hd, t.r, t.groups);
    let nt = t.kv_len.len();
    let nv = hd.div_ceil(16);
    let hdp = nv * 16;
    // Scratch rows are group-major: row i = g·gr + tt·r + hh, so each KV head's query
    // rows are contiguous.
    let gr = nt * r;
    let rows = ng * gr;
    let rp = rows.next_multiple_of(16);
    let ss = t.slot_stride;
    let decoded = if t.packed.is_some() { 2 * KC * ss } else { 0 };
    let need = 2 * rows * hdp + hdp * KC + 2 * rows * KC + 2 * rp + decoded + 16;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let base = scratch.as_mut_ptr();
    let base = base.add(base.align_offset(64));
    let qs = base;
    let acc = qs.add(rows * hdp);
    let kt = acc.add(rows * hdp);
    let p = kt.add(hdp * KC);
    let lv = p.add(rows * KC);
    let m = lv.add(rows * KC);
    let alpha = m.add(rp);
    // Decoded K and V slot rows of the current chunk (narrow caches).
    let dk = alpha.add(rp);
    let dv = dk.add(KC * ss);
    let tail = if hd % 16 == 0 { 0xFFFF } else { mask(hd % 16) };
    // (token, head within the tile's heads) of scratch row i.
    let who = |i: usize| {
        let (g, w) = (i / gr, i % gr);
        (w / r, g * r + w % r)
    };

    // Query rows, zero-padded to hdp; accumulators cleared.
    for i in 0..rows {
        let (tt, h) = who(i);
        let src = t.q.add(tt * t.q_tok_stride + h * hd);
        let dst = qs.add(i * hdp);
        for v in 0..nv {
            let mk = if v + 1 == nv { tail } else { 0xFFFF };
            _mm512_store_ps(dst.add(v * 16), _mm512_maskz_loadu_ps(mk, src.add(v * 16)));
            _mm512_store_ps(acc.add(i * hdp + v * 16), _mm512_setzero_ps());
        }
        _mm512_store_ps(lv.add(i * KC), _mm512_setzero_ps());
        *m.add(i) = f32::NEG_INFINITY;
    }
    let tile_end = t
        .kv_len
        .iter()
        .map(|&l| l as usize)
        .max()
        .unwrap_or(0)
        .min(t.end);
    // Prefetch distance in keys: about PF_BYTES of K (and as much V) ahead.
    let row_bytes = t.slot_stride * t.packed.map_or(4, |(k, _, _)| k.dtype().bytes());
    let pf = (PF_BYTES / row_bytes).next_multiple_of(KC).max(KC);
    let step = PF_STEP;
    // With few query rows per KV head (MHA-like decode) there is little compute per
    // byte to hide latency behind; prefetching every line two chunks ahead helps there
    // (~+25% on 1:1), while with GQA it measured 2x slower (it competes with the
    // hardware prefetcher for fill buffers).
    let near = if gr <= 2 { 2 * KC } else { 0 };
    prefetch(t, t.start, (t.start + pf).min(tile_end), step);

    // Direct dot products + transpose-reduce cost ~45 shuffles/adds per query row and
    // chunk; transposing K costs ~64 per 16 columns of head_dim, shared by all rows.
    let direct = nv <= 8 && 45 * gr < 64 * nv;
    let mut off = [0usize; KC];
    let mut j0 = t.start;
    while j0 < tile_end {
        let c = KC.min(tile_end - j0);
        offsets(t, j0, c, &mut off);
        prefetch(
            t,
            (j0 + pf).min(tile_end),
            (j0 + c + pf).min(tile_end),
            step,
        );
        if near > 0 {
            prefetch(
                t,
                (j0 + near).min(tile_end),
                (j0 + c + near).min(tile_end),
                64,
            );
        }
        let (kbase, vbase) = match t.packed {
            None => (t.kc, t.vc),
            Some((kr, vr, h)) => {
                for (key, o) in off.iter_mut().enumerate().take(c) {
                    let (kd, vd) = (dk.add(key * ss), dv.add(key * ss));
                    // The tile's KV heads only (all of the row when it covers all).
                    decode_row(&kr, *o + h, kd, ng * hd);
                    decode_row(&vr, *o + h, vd, ng * hd);
                    *o = key * ss;
                }
                (dk as *const f32, dv as *const f32)
            }
        };
        for g in 0..ng {
            let (kc, vc) = (kbase.add(g * hd), vbase.add(g * hd));
            let (qs, acc) = (qs.add(g * gr * hdp), acc.add(g * gr * hdp));
            let (p, lv, m, alpha) = (
                p.add(g * gr * KC),
                lv.add(g * gr * KC),
                m.add(g * gr),
                alpha.add(g * gr),
            );
            if direct {
                let mut krows = [kc; KC];
                for (kr, &o) in krows.iter_mut().zip(&off).take(c) {
                    *kr = kc.add(o);
                }
                for i in 0..gr {
                    let (q, s) = (qs.add(i * hdp), p.add(i * KC));
                    match nv {
                        1 => qk_direct::<1>(q, &krows, c, tail, s, t.scale),
                        2 => qk_direct::<2>(q, &krows, c, tail, s, t.scale),
                        3 => qk_direct::<3>(q, &krows, c, tail, s, t.scale),
                        4 => qk_direct::<4>(q, &krows, c, tail, s, t.scale),
                        5 => qk_direct::<5>(q, &krows, c, tail, s, t.scale),
                        6 => qk_direct::<6>(q, &krows, c, tail, s, t.scale),
                        7 => qk_direct::<7>(q, &krows, c, tail, s, t.scale),
                        _ => qk_direct::<8>(q, &krows, c, tail, s, t.scale),
                    }
                }
            } else {
                // K chunk → kt[d][key] (keys past c are zero).
                for v in 0..nv {
                    let mk = if v + 1 == nv { tail } else { 0xFFFF };
                    let mut x = [_mm512_setzero_ps(); KC];
                    for (key, xk) in x.iter_mut().enumerate().take(c) {
                        *xk = _mm512_maskz_loadu_ps(mk, kc.add(off[key] + v * 16));
                    }
                    transpose16(&x, kt.add(v * 16 * KC));
                }
                // Scores.
                let mut i = 0;
                while gr - i >= 8 {
                    qk::<8>(qs.add(i * hdp), hdp, hd, kt, p.add(i * KC), t.scale);
                    i += 8;
                }
                if gr - i >= 4 {
                    qk::<4>(qs.add(i * hdp), hdp, hd, kt, p.add(i * KC), t.scale);
                    i += 4;
                }
                if gr - i >= 2 {
                    qk::<2>(qs.add(i * hdp), hdp, hd, kt, p.add(i * KC), t.scale);
                    i += 2;
                }
                if gr - i >= 1 {
                    qk::<1>(qs.add(i * hdp), hdp, hd, kt, p.add(i * KC), t.scale);
                }
            }
            // Online softmax: p = exp(s − m_new) on valid keys, rescale factors alpha.
            for i in 0..gr {
                let lim = (t.kv_len[i / r] as usize).min(t.end);
                let n_valid = lim.saturating_sub(j0).min(c);
                let pi = p.add(i * KC);
                *alpha.add(i) = 1.0;
                if n_valid == 0 {
                    _mm512_store_ps(pi, _mm512_setzero_ps());
                    continue;
                }
                let km = mask(n_valid);
                let s =
                    _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), km, _mm512_load_ps(pi));
                let mo = *m.add(i);
                let mn = mo.max(_mm512_reduce_max_ps(s));
                if mn == f32::NEG_INFINITY {
                    _mm512_store_ps(pi, _mm512_setzero_ps());
                    continue; // all scores -inf so far: nothing to accumulate
                }
                let a = if mn > mo { (mo - mn).exp() } else { 1.0 };
                let e = _mm512_maskz_mov_ps(km, exp16(_mm512_sub_ps(s, _mm512_set1_ps(mn))));
                let l = _mm512_load_ps(lv.add(i * KC));
                _mm512_store_ps(lv.add(i * KC), _mm512_fmadd_ps(l, _mm512_set1_ps(a), e));
                _mm512_store_ps(pi, e);
                *m.add(i) = mn;
                *alpha.add(i) = a;
            }
            // P·V: each V row streamed once for all rows of this KV head.
            let mut vrows = [vc; KC];
            for (vr, &o) in vrows.iter_mut().zip(&off).take(c) {
                *vr = vc.add(o);
            }
            let mut v = 0;
            while v < nv {
                let left = nv - v;
                let last = |cb: usize| if v + cb == nv { tail } else { 0xFFFF };
                let col = v * 16;
                if left >= 4 {
                    pv_rows::<4>(&vrows, c, p, alpha, acc, gr, hdp, col, last(4));
                    v += 4;
                } else if left >= 2 {
                    pv_rows::<2>(&vrows, c, p, alpha, acc, gr, hdp, col, last(2));
                    v += 2;
                } else {
                    pv_rows::<1>(&vrows, c, p, alpha, acc, gr, hdp, col, last(1));
                    v += 1;
                }
            }
        }
        j0 += c;
    }

    // Normalize and write out.
    for i in 0..rows {
        let (tt, h) = who(i);
        let o = t.out.add((tt * t.out_tok_stride + h) * hd);
        let l = _mm512_reduce_add_ps(_mm512_load_ps(lv.add(i * KC)));
        let (w, lse) = if l > 0.0 {
            (1.0 / l, *m.add(i) + l.ln())
        } else {
            (0.0, f32::NEG_INFINITY)
        };
        let wv = _mm512_set1_ps(w);
        for v in 0..nv {
            let mk = if v + 1 == nv { tail } else { 0xFFFF };
            let x = _mm512_mul_ps(_mm512_load_ps(acc.add(i * hdp + v * 16)), wv);
            // An empty row gives exact zeros even if acc were non-finite.
            let x = if l > 0.0 { x } else { _mm512_setzero_ps() };
            _mm512_mask_storeu_ps(o.add(v * 16), mk, x);
        }
        *t.lse.add(tt * t.out_tok_stride + h) = lse;
    }
}
