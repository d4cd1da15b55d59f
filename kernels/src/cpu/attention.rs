//! Paged attention over a block-table KV cache, returning output and log-sum-exp.
//!
//! The LSE lets decode context parallelism merge partial results computed on
//! different KV shards ([`crate::dcp::merge`]). Inside one call, a long sequence with few
//! query tokens is also split along the KV axis so every thread has work, and the
//! splits are merged the same way.
//!
//! One work item is a *tile*: all query heads of one KV head for a few consecutive
//! tokens of the same sequence (one token in decode), optionally restricted to one
//! split of the KV range. Each K/V row is then streamed from memory once per tile and
//! reused from L1 for every query row of the tile (see `avx512`; AVX2 tiles prefill
//! the same way for head sizes that are a multiple of 8, see `avx2_tile`). Otherwise an
//! item is one token's query heads of one KV head, run by the generic `attend_body` with
//! scalar, AVX2 + FMA (see `avx2`) or aarch64 NEON (see `neon`) primitives; the level
//! comes from [`crate::cpu::isa`].

use crate::backend::PagedAttentionParams;
use crate::cpu::kv_store::{KvMut, KvRef};
use crate::cpu::matmul::prefetch_bytes;
use crate::cpu::CpuIsa;
use crate::dcp::merge::merge_rows;
use crate::shape_checks::{check_fp8_row, check_paged_attention, check_write_kv};
// The attention tests check the merge of split partials through it.
#[cfg(test)]
use crate::dcp::merge::merge_partials;
use crate::error::{check_len, KernelError};
use crate::pool::ThreadPool;
use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_tile;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

/// Keys processed per online-softmax step (scalar and AVX2 paths).
const CH: usize = 32;
/// Minimum keys per split when splitting one sequence across threads.
const SPLIT_MIN: usize = 256;
/// Most tokens in one tile.
const TILE_TOKENS: usize = 16;

/// Stores the K/V rows of new tokens into the paged cache.
///
/// Caches are `[num_blocks, block_size, n_kv_heads, head_dim]`, i.e. one
/// `n_kv_heads * head_dim` row per slot; `k`/`v` are `[slots.len(), n_kv_heads, head_dim]`.
/// A slot of `usize::MAX` skips that token (e.g. tokens another DCP rank stores).
pub fn write_kv(
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    n_kv_heads: usize,
    head_dim: usize,
    slots: &[usize],
    k: &[f32],
    v: &[f32],
) -> Result<(), KernelError> {
    write_kv_typed(
        k_cache.into(),
        v_cache.into(),
        n_kv_heads,
        head_dim,
        slots,
        k,
        v,
    )
}

/// [`write_kv`] into caches of any [`KvCacheDType`](crate::KvCacheDType): rows are
/// converted as they are stored.
pub fn write_kv_typed(
    mut k_cache: KvMut<'_>,
    mut v_cache: KvMut<'_>,
    n_kv_heads: usize,
    head_dim: usize,
    slots: &[usize],
    k: &[f32],
    v: &[f32],
) -> Result<(), KernelError> {
    let caches = (k_cache.len(), v_cache.len());
    let row = check_write_kv(caches, n_kv_heads, head_dim, slots, (k.len(), v.len()))?;
    check_fp8_row("write_kv K cache", k_cache.fp8_row_len(), head_dim)?;
    check_fp8_row("write_kv V cache", v_cache.fp8_row_len(), head_dim)?;
    if row == 0 {
        return Ok(());
    }
    for (t, &s) in slots.iter().enumerate() {
        if s == usize::MAX {
            continue;
        }
        k_cache.encode(s * row, &k[t * row..(t + 1) * row]);
        v_cache.encode(s * row, &v[t * row..(t + 1) * row]);
    }
    Ok(())
}

/// One batch of query tokens for [`paged_attention`]: the queries and the call's
/// [`PagedAttentionParams`] (heads, scale and where the cached keys live).
#[derive(Debug, Clone, Copy)]
pub struct AttentionBatch<'a> {
    /// Queries, `[n_tokens, n_q_heads, head_dim]`.
    pub q: &'a [f32],
    /// The shape, the score scale and the paged-cache metadata of the tokens.
    pub params: PagedAttentionParams<'a>,
}

impl<'a> AttentionBatch<'a> {
    /// The tokens `range` of the batch (their queries, sequences and lengths).
    pub fn tokens(&self, range: std::ops::Range<usize>) -> AttentionBatch<'a> {
        let row = self.params.n_q_heads * self.params.head_dim;
        AttentionBatch {
            q: &self.q[range.start * row..range.end * row],
            params: PagedAttentionParams {
                batch: self.params.batch.tokens(range),
                ..self.params
            },
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Caller-side reuse: split partials (`[split][row][hd]` then `[split][row]`) and
    /// the tile list, so a decode step does not allocate.
    static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static TILES: RefCell<Vec<(u32, u32)>> = const { RefCell::new(Vec::new()) };
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: work items write disjoint rows.
unsafe impl Sync for SyncPtr {}
unsafe impl Send for SyncPtr {}

/// Paged attention: `out[t, h] = softmax(scale · q·Kᵀ) · V` and
/// `lse[t, h] = ln Σ exp(scale · q·k)` over the token's cached keys.
/// Tokens with `kv_len == 0` get zeros and `lse = -inf`.
///
/// ```
/// use dcpserve_kernels::{
///     paged_attention, AttentionBatch, PagedAttentionParams, PagedBatch, ThreadPool,
/// };
/// let pool = ThreadPool::new(1);
/// let (k, v) = (vec![1.0, 0.0], vec![3.0, 4.0]); // one block of one slot, 1 head, dim 2
/// let bt: &[u32] = &[0];
/// let batch = PagedBatch { block_size: 1, token_seq: &[0], token_kv_len: &[1],
///     block_tables: &[bt] };
/// let params = PagedAttentionParams { n_q_heads: 1, n_kv_heads: 1, head_dim: 2, scale: 1.0,
///     batch };
/// let b = AttentionBatch { q: &[1.0, 0.0], params };
/// let (mut out, mut lse) = (vec![0.0; 2], vec![0.0; 1]);
/// paged_attention(&pool, &b, &k, &v, &mut out, &mut lse).unwrap();
/// assert_eq!(out, [3.0, 4.0]);
/// assert_eq!(lse, [1.0]);
/// ```
pub fn paged_attention(
    pool: &ThreadPool,
    b: &AttentionBatch,
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<(), KernelError> {
    paged_attention_typed(pool, b, k_cache.into(), v_cache.into(), out, lse)
}

/// [`paged_attention`] against caches of any [`KvCacheDType`](crate::KvCacheDType).
/// A narrow cache is read in place: each chunk of keys is converted to f32 into a
/// per-thread scratch of a few rows just before use, never the whole cache.
pub fn paged_attention_typed(
    pool: &ThreadPool,
    b: &AttentionBatch,
    k_cache: KvRef<'_>,
    v_cache: KvRef<'_>,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<(), KernelError> {
    paged_attention_impl(pool, b, k_cache, v_cache, out, lse, crate::cpu::isa())
}

/// [`paged_attention_typed`] at an explicit kernel level (capped to what the CPU runs).
pub(crate) fn paged_attention_impl(
    pool: &ThreadPool,
    b: &AttentionBatch,
    k_cache: KvRef<'_>,
    v_cache: KvRef<'_>,
    out: &mut [f32],
    lse: &mut [f32],
    isa: CpuIsa,
) -> Result<(), KernelError> {
    validate(b, k_cache, v_cache, out, lse)?;
    let n_tokens = b.params.batch.token_seq.len();
    let (nq, nkv, hd) = (b.params.n_q_heads, b.params.n_kv_heads, b.params.head_dim);
    if n_tokens == 0 || hd == 0 || nkv == 0 {
        lse.fill(f32::NEG_INFINITY);
        return Ok(());
    }
    if nq == 0 {
        return Ok(());
    }
    let r = nq / nkv;
    // Never above the CPU's level: the SIMD paths below rely on it for safety.
    let isa = isa.min(crate::cpu::features().best_isa());
    // The AVX-512 kernel works on tiles; so does AVX2's for prefill (head sizes that
    // are a multiple of 8); the other levels on one token per item.
    let simd = isa == CpuIsa::Avx512;
    let avx2_tiles = isa == CpuIsa::Avx2 && hd % 8 == 0;
    // Tiles: runs of consecutive tokens of one sequence (prefill). Query rows per KV
    // head per tile: enough to amortize each K/V chunk (read from L2/L3 once per tile)
    // over many rows; measured best at 32 for head_dim 64 and 64 for head_dim 128.
    let tile_rows = (hd / 2).clamp(16, 64);
    let tile_tokens = if simd || avx2_tiles {
        (tile_rows / r).clamp(1, TILE_TOKENS)
    } else {
        1
    };
    TILES.with(|tiles| {
        let mut tiles_buf = tiles.borrow_mut();
        tiles_buf.clear();
        let mut t0 = 0;
        while t0 < n_tokens {
            let mut t1 = t0 + 1;
            while t1 < n_tokens
                && t1 - t0 < tile_tokens
                && b.params.batch.token_seq[t1] == b.params.batch.token_seq[t0]
            {
                t1 += 1;
            }
            tiles_buf.push((t0 as u32, (t1 - t0) as u32));
            t0 = t1;
        }
        let tiles: &[(u32, u32)] = &tiles_buf;
        // SIMD items cover all KV heads of a tile (whole slot rows streamed once).
        let groups = if simd { nkv } else { 1 };
        let n_items = tiles.len() * (nkv / groups);
        let threads = pool.n_threads();
        let max_kv = b
            .params
            .batch
            .token_kv_len
            .iter()
            .copied()
            .max()
            .unwrap_or(0) as usize;
        // Split along KV only when there are too few items for the threads; one thread
        // never splits (that would only add merges).
        let n_splits = if threads > 1 && n_items < 2 * threads && max_kv >= 2 * SPLIT_MIN {
            (2 * threads)
                .div_ceil(n_items)
                .min(max_kv / SPLIT_MIN)
                .max(2)
        } else {
            1
        };
        let run = |op: SyncPtr, lp: SyncPtr, split_rows: usize| {
            pool.run(n_items * n_splits, |it| {
                let (tile, s) = (it / n_splits, it % n_splits);
                let (ti, g) = (tile / (nkv / groups), tile % (nkv / groups) * groups);
                let (t0, nt) = (tiles[ti].0 as usize, tiles[ti].1 as usize);
                let lens = &b.params.batch.token_kv_len[t0..t0 + nt];
                let tile_kv = lens.iter().copied().max().unwrap_or(0) as usize;
                let (start, end) = if n_splits == 1 {
                    (0, tile_kv)
                } else {
                    let chunk = tile_kv.div_ceil(n_splits).next_multiple_of(CH);
                    ((s * chunk).min(tile_kv), ((s + 1) * chunk).min(tile_kv))
                };
                let row0 = s * split_rows + t0 * nq + g * r;
                // SAFETY: item (tile, g, s) owns rows (t, g·r..(g+1)·r) of its tokens in
                // output buffer s; validate() checked the block tables and lengths.
                unsafe {
                    attend_item(
                        b, k_cache, v_cache, t0, nt, g, groups, start, end, op, lp, row0, isa,
                    )
                };
            });
        };
        if n_splits == 1 {
            run(SyncPtr(out.as_mut_ptr()), SyncPtr(lse.as_mut_ptr()), 0);
            return;
        }
        // Split each tile's KV range; partials go to scratch, then merge.
        let rows = n_tokens * nq;
        PARTIALS.with(|buf| {
            let mut buf = buf.borrow_mut();
            let need = n_splits * rows * (hd + 1);
            if buf.len() < need {
                buf.resize(need, 0.0);
            }
            let (pout, plse) = buf[..need].split_at_mut(n_splits * rows * hd);
            // Every partial row is written by exactly one item.
            run(SyncPtr(pout.as_mut_ptr()), SyncPtr(plse.as_mut_ptr()), rows);
            merge_rows(
                n_splits,
                |i| &pout[i * rows * hd..(i + 1) * rows * hd],
                |i| &plse[i * rows..(i + 1) * rows],
                rows,
                hd,
                out,
                lse,
            );
        });
    });
    Ok(())
}

fn validate(
    b: &AttentionBatch,
    k_cache: KvRef<'_>,
    v_cache: KvRef<'_>,
    out: &[f32],
    lse: &[f32],
) -> Result<(), KernelError> {
    let n_tokens = b.params.batch.token_seq.len();
    check_len(
        "attention token_kv_len",
        n_tokens,
        b.params.batch.token_kv_len.len(),
    )?;
    check_paged_attention(
        &b.params,
        (b.q.len(), out.len(), lse.len()),
        (k_cache.len(), k_cache.dtype(), k_cache.fp8_row_len()),
        (v_cache.len(), v_cache.dtype(), v_cache.fp8_row_len()),
    )
}

/// Attends query heads `g·r..(g + groups)·r` (KV heads `g..g + groups`) of tokens
/// `t0..t0 + nt` (one sequence) to keys
/// `start..end` (clamped per token to its kv length), writing rows starting at `row0`
/// (token stride `n_q_heads`) of `out` / `lse`.
///
/// # Safety
/// `out`/`lse` must be valid for those rows and no other thread may write them;
/// the batch must have passed `validate`.
#[allow(clippy::too_many_arguments)]
unsafe fn attend_item(
    b: &AttentionBatch,
    kc: KvRef<'_>,
    vc: KvRef<'_>,
    t0: usize,
    nt: usize,
    g: usize,
    groups: usize,
    start: usize,
    end: usize,
    out: SyncPtr,
    lse: SyncPtr,
    row0: usize,
    isa: CpuIsa,
) {
    let (nq, nkv, hd) = (b.params.n_q_heads, b.params.n_kv_heads, b.params.head_dim);
    let r = nq / nkv;
    let bt = b.params.batch.block_tables[b.params.batch.token_seq[t0] as usize];
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        #[cfg(target_arch = "x86_64")]
        if isa == CpuIsa::Avx512 {
            // f32 caches are read in place; narrower ones through the tile's decoder.
            let (kp, vp) = match (kc.as_f32(), vc.as_f32()) {
                (Some(k), Some(v)) => (k.as_ptr().add(g * hd), v.as_ptr().add(g * hd)),
                _ => (std::ptr::null(), std::ptr::null()),
            };
            let packed = kc.as_f32().is_none().then_some((kc, vc, g * hd));
            let tile = avx512::Tile {
                q: b.q.as_ptr().add((t0 * nq + g * r) * hd),
                q_tok_stride: nq * hd,
                r,
                groups,
                kv_len: &b.params.batch.token_kv_len[t0..t0 + nt],
                hd,
                scale: b.params.scale,
                kc: kp,
                vc: vp,
                packed,
                slot_stride: nkv * hd,
                bt,
                bs: b.params.batch.block_size,
                start,
                end,
                out: out.0.add(row0 * hd),
                lse: lse.0.add(row0),
                out_tok_stride: nq,
            };
            // SAFETY: `isa` is capped by the CPU's best level, so the AVX-512 kernel
            // features are present; the tile's rows are this item's (see above).
            avx512::attend_tile(&tile, &mut s);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if isa == CpuIsa::Avx2 && nt > 1 && hd % 8 == 0 {
            let tile = avx2_tile::Tile {
                q: b.q.as_ptr().add((t0 * nq + g * r) * hd),
                q_tok_stride: nq * hd,
                r,
                kv_len: &b.params.batch.token_kv_len[t0..t0 + nt],
                hd,
                scale: b.params.scale,
                kc,
                vc,
                head_off: g * hd,
                slot_stride: nkv * hd,
                bt,
                bs: b.params.batch.block_size,
                start,
                end,
                out: out.0.add(row0 * hd),
                lse: lse.0.add(row0),
                out_tok_stride: nq,
            };
            // SAFETY: `isa` is capped by the CPU's best level, so AVX2, FMA and F16C
            // are present; the tile's rows are this item's (see above).
            avx2_tile::attend_tile(&tile, &mut s);
            return;
        }
        let _ = (isa, groups);
        let need = r * (CH + 2) + 2 * CH * hd;
        if s.len() < need {
            s.resize(need, 0.0);
        }
        for tt in 0..nt {
            let t = t0 + tt;
            let row = row0 + tt * nq;
            let o = std::slice::from_raw_parts_mut(out.0.add(row * hd), r * hd);
            let l = std::slice::from_raw_parts_mut(lse.0.add(row), r);
            let it = Item {
                q: &b.q[(t * nq + g * r) * hd..(t * nq + (g + 1) * r) * hd],
                nq: r,
                r,
                hd,
                scale: b.params.scale,
                kc,
                vc,
                head_off: g * hd,
                nkv,
                bt,
                bs: b.params.batch.block_size,
                start,
                end: end.min(b.params.batch.token_kv_len[t] as usize).max(start),
            };
            #[cfg(target_arch = "x86_64")]
            if isa == CpuIsa::Avx2 {
                // SAFETY: `isa` is capped by the CPU's best level
                // (`paged_attention_impl`), so AVX2, FMA and F16C are present.
                avx2::attend_body_avx2(&it, o, l, &mut s);
                continue;
            }
            #[cfg(target_arch = "aarch64")]
            if isa == CpuIsa::Neon {
                neon::attend_body_neon(&it, o, l, &mut s);
                continue;
            }
            attend_body::<Scalar>(&it, o, l, &mut s);
        }
    });
}

/// One KV head's query rows of one token (`nq == r`) against keys `start..end`.
struct Item<'a> {
    q: &'a [f32],
    nq: usize,
    r: usize,
    hd: usize,
    scale: f32,
    kc: KvRef<'a>,
    vc: KvRef<'a>,
    /// Offset of the KV head within a slot row.
    head_off: usize,
    nkv: usize,
    bt: &'a [u32],
    bs: usize,
    start: usize,
    end: usize,
}

/// Vector primitives of the per-token attention loop (`Scalar`, `avx2::Avx2`,
/// `neon::Neon`).
trait Math {
    /// `Σ a[i]·b[i]` over `a.len()` elements (`b` at least as long).
    fn dot(a: &[f32], b: &[f32]) -> f32;
    /// `y += alpha·x`.
    fn axpy(alpha: f32, x: &[f32], y: &mut [f32]);
    /// `y *= alpha`.
    fn scale(alpha: f32, y: &mut [f32]);
    /// `s[i] = exp(s[i] − mx)`, returning the sum.
    fn exp_sum(s: &mut [f32], mx: f32) -> f32;
    /// Scores of `q` against four keys.
    #[inline(always)]
    fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        k.map(|k| Self::dot(q, k))
    }
    /// `acc += Σ_j p[j] · v[offs[j]..offs[j] + acc.len()]`.
    #[inline(always)]
    fn pv(p: &[f32], offs: &[usize], v: &[f32], acc: &mut [f32]) {
        let hd = acc.len();
        for (&pj, &off) in p.iter().zip(offs) {
            Self::axpy(pj, &v[off..off + hd], acc);
        }
    }
}

struct Scalar;

impl Math for Scalar {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0.0f32; 8];
        let ca = a.chunks_exact(8);
        let cb = b[..a.len()].chunks_exact(8);
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for i in 0..8 {
                acc[i] += x[i] * y[i];
            }
        }
        let mut s = 0.0;
        for (x, y) in ra.iter().zip(rb) {
            s += x * y;
        }
        acc.iter().sum::<f32>() + s
    }
    #[inline(always)]
    fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        for (a, v) in y.iter_mut().zip(x) {
            *a += alpha * v;
        }
    }
    #[inline(always)]
    fn scale(alpha: f32, y: &mut [f32]) {
        y.iter_mut().for_each(|v| *v *= alpha);
    }
    #[inline(always)]
    fn exp_sum(s: &mut [f32], mx: f32) -> f32 {
        let mut sum = 0.0;
        for v in s.iter_mut() {
            *v = (*v - mx).exp();
            sum += *v;
        }
        sum
    }
}

/// Chunked online softmax (flash-decoding style), f32 throughout.
#[inline(always)]
fn attend_body<M: Math>(it: &Item, out: &mut [f32], lse: &mut [f32], scratch: &mut [f32]) {
    let (nq, hd) = (it.nq, it.hd);
    let (scores, rest) = scratch.split_at_mut(nq * CH);
    let (m, rest) = rest.split_at_mut(nq);
    let (l, rest) = rest.split_at_mut(nq);
    // Decoded K and V rows of the chunk (narrow caches only).
    let (kbuf, vbuf) = rest[..2 * CH * hd].split_at_mut(CH * hd);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    out.fill(0.0);
    let mut offs = [0usize; CH];
    let mut j0 = it.start;
    prefetch_rows(it, j0, (j0 + 2 * CH).min(it.end));
    while j0 < it.end {
        let c = CH.min(it.end - j0);
        for (jj, off) in offs[..c].iter_mut().enumerate() {
            let j = j0 + jj;
            let slot = it.bt[j / it.bs] as usize * it.bs + j % it.bs;
            *off = slot * it.nkv * hd + it.head_off;
        }
        prefetch_rows(it, j0 + 2 * CH, (j0 + 3 * CH).min(it.end));
        let (kc, vc): (&[f32], &[f32]) = match (it.kc.as_f32(), it.vc.as_f32()) {
            (Some(k), Some(v)) => (k, v),
            _ => {
                for (jj, off) in offs[..c].iter_mut().enumerate() {
                    it.kc.decode(*off, &mut kbuf[jj * hd..(jj + 1) * hd]);
                    it.vc.decode(*off, &mut vbuf[jj * hd..(jj + 1) * hd]);
                    *off = jj * hd;
                }
                (kbuf, vbuf)
            }
        };
        debug_assert_eq!(nq, it.r, "an item is one KV head's query rows");
        for h in 0..nq {
            let qh = &it.q[h * hd..(h + 1) * hd];
            let s = &mut scores[h * CH..h * CH + c];
            let mut mx = m[h];
            let mut jj = 0;
            while jj + 4 <= c {
                let k = |x: usize| &kc[offs[jj + x]..offs[jj + x] + hd];
                let d = M::dot4(qh, [k(0), k(1), k(2), k(3)]);
                for x in 0..4 {
                    s[jj + x] = d[x] * it.scale;
                }
                jj += 4;
            }
            for (sv, &off) in s[jj..].iter_mut().zip(&offs[jj..c]) {
                *sv = M::dot(qh, &kc[off..off + hd]) * it.scale;
            }
            for &sv in s.iter() {
                mx = mx.max(sv);
            }
            if mx == f32::NEG_INFINITY {
                continue; // all scores -inf so far: nothing to accumulate
            }
            let alpha = if m[h] == f32::NEG_INFINITY {
                0.0
            } else {
                (m[h] - mx).exp()
            };
            let sum = M::exp_sum(s, mx);
            l[h] = l[h] * alpha + sum;
            m[h] = mx;
            let acc = &mut out[h * hd..(h + 1) * hd];
            if alpha != 1.0 {
                M::scale(alpha, acc);
            }
            M::pv(s, &offs[..c], vc, acc);
        }
        j0 += c;
    }
    for h in 0..nq {
        let acc = &mut out[h * hd..(h + 1) * hd];
        if l[h] > 0.0 {
            M::scale(1.0 / l[h], acc);
            lse[h] = m[h] + l[h].ln();
        } else {
            acc.fill(0.0);
            lse[h] = f32::NEG_INFINITY;
        }
    }
}

/// Prefetches the K and V rows of keys `a..b` of `it`'s KV head. An item reads one KV
/// head's slice of each slot row, a strided pattern the hardware prefetcher picks up
/// late; one chunk ahead hides most of that (batched decode, many short items).
#[inline]
fn prefetch_rows(it: &Item, a: usize, b: usize) {
    let eb = it.kc.dtype().bytes();
    let (kp, vp) = (it.kc.byte_ptr(), it.vc.byte_ptr());
    for j in a..b {
        let slot = it.bt[j / it.bs] as usize * it.bs + j % it.bs;
        let o = (slot * it.nkv * it.hd + it.head_off) * eb;
        prefetch_bytes(kp.wrapping_add(o), it.hd * eb);
        prefetch_bytes(vp.wrapping_add(o), it.hd * eb);
    }
}

#[cfg(test)]
mod tests;
