//! Paged attention over a block-table KV cache, returning output and log-sum-exp.
//!
//! The LSE lets decode context parallelism merge partial results computed on
//! different KV shards ([`merge_partials`]). Inside one call, a long sequence with few
//! query tokens is also split along the KV axis so every thread has work, and the
//! splits are merged the same way.
//!
//! One work item is a *tile*: all query heads of one KV head for a few consecutive
//! tokens of the same sequence (one token in decode), optionally restricted to one
//! split of the KV range. Each K/V row is then streamed from memory once per tile and
//! reused from L1 for every query row of the tile (see `avx512`).

use crate::error::{check_len, KernelError};
use crate::pool::ThreadPool;
use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
mod avx512;

/// Keys processed per online-softmax step (scalar path).
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
    let row = n_kv_heads * head_dim;
    check_len("write_kv k", slots.len() * row, k.len())?;
    check_len("write_kv v", slots.len() * row, v.len())?;
    check_len("write_kv v_cache", k_cache.len(), v_cache.len())?;
    if row == 0 {
        return Ok(());
    }
    let n_slots = k_cache.len() / row;
    for (t, &s) in slots.iter().enumerate() {
        if s == usize::MAX {
            continue;
        }
        if s >= n_slots {
            return Err(KernelError::OutOfRange {
                what: "kv slot",
                value: s,
                limit: n_slots,
            });
        }
        k_cache[s * row..(s + 1) * row].copy_from_slice(&k[t * row..(t + 1) * row]);
        v_cache[s * row..(s + 1) * row].copy_from_slice(&v[t * row..(t + 1) * row]);
    }
    Ok(())
}

/// One batch of query tokens for [`paged_attention`].
#[derive(Debug, Clone, Copy)]
pub struct AttentionBatch<'a> {
    /// Queries, `[n_tokens, n_q_heads, head_dim]`.
    pub q: &'a [f32],
    /// Query heads.
    pub n_q_heads: usize,
    /// KV heads (query head `h` uses KV head `h / (n_q_heads / n_kv_heads)`).
    pub n_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Score scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Sequence index (into `block_tables`) of each token.
    pub token_seq: &'a [u32],
    /// Cached tokens (local indices `0..kv_len`) each token attends to; the caller
    /// has already applied the causal mask.
    pub token_kv_len: &'a [u32],
    /// Per sequence: local token `j` lives in slot
    /// `block_tables[s][j / block_size] * block_size + j % block_size`.
    pub block_tables: &'a [&'a [u32]],
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
/// use dcpserve_kernels::{paged_attention, AttentionBatch, ThreadPool};
/// let pool = ThreadPool::new(1);
/// let (k, v) = (vec![1.0, 0.0], vec![3.0, 4.0]); // one block of one slot, 1 head, dim 2
/// let bt: &[u32] = &[0];
/// let b = AttentionBatch { q: &[1.0, 0.0], n_q_heads: 1, n_kv_heads: 1, head_dim: 2,
///     block_size: 1, scale: 1.0, token_seq: &[0], token_kv_len: &[1], block_tables: &[bt] };
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
    paged_attention_impl(
        pool,
        b,
        k_cache,
        v_cache,
        out,
        lse,
        crate::cpu::use_avx512(),
    )
}

/// [`paged_attention`] with an explicit kernel choice (`simd` = AVX-512).
pub(crate) fn paged_attention_impl(
    pool: &ThreadPool,
    b: &AttentionBatch,
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
    lse: &mut [f32],
    simd: bool,
) -> Result<(), KernelError> {
    validate(b, k_cache, v_cache, out, lse)?;
    let n_tokens = b.token_seq.len();
    let (nq, nkv, hd) = (b.n_q_heads, b.n_kv_heads, b.head_dim);
    if n_tokens == 0 || hd == 0 || nkv == 0 {
        lse.fill(f32::NEG_INFINITY);
        return Ok(());
    }
    if nq == 0 {
        return Ok(());
    }
    let r = nq / nkv;
    #[cfg(not(target_arch = "x86_64"))]
    let simd = {
        let _ = simd;
        false
    };
    // Tiles: runs of consecutive tokens of one sequence (prefill). Query rows per KV
    // head per tile: enough to amortize each K/V chunk (read from L2/L3 once per tile)
    // over many rows; measured best at 32 for head_dim 64 and 64 for head_dim 128.
    let tile_rows = (hd / 2).clamp(16, 64);
    let tile_tokens = if simd {
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
            while t1 < n_tokens && t1 - t0 < tile_tokens && b.token_seq[t1] == b.token_seq[t0] {
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
        let max_kv = b.token_kv_len.iter().copied().max().unwrap_or(0) as usize;
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
                let lens = &b.token_kv_len[t0..t0 + nt];
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
                        b, k_cache, v_cache, t0, nt, g, groups, start, end, op, lp, row0, simd,
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
    k_cache: &[f32],
    v_cache: &[f32],
    out: &[f32],
    lse: &[f32],
) -> Result<(), KernelError> {
    let n_tokens = b.token_seq.len();
    let (nq, nkv, hd) = (b.n_q_heads, b.n_kv_heads, b.head_dim);
    if nkv == 0 || nq % nkv != 0 || b.block_size == 0 {
        return Err(KernelError::Shape(format!(
            "n_q_heads={nq} must be a multiple of n_kv_heads={nkv} > 0, block_size={} > 0",
            b.block_size
        )));
    }
    check_len("attention token_kv_len", n_tokens, b.token_kv_len.len())?;
    check_len("attention q", n_tokens * nq * hd, b.q.len())?;
    check_len("attention out", n_tokens * nq * hd, out.len())?;
    check_len("attention lse", n_tokens * nq, lse.len())?;
    check_len("attention v_cache", k_cache.len(), v_cache.len())?;
    let row = nkv * hd;
    let n_blocks = if row == 0 {
        0
    } else {
        k_cache.len() / (row * b.block_size)
    };
    // Check each sequence's table once, up to the longest kv_len any token uses.
    let mut need = vec![0usize; b.block_tables.len()];
    for (&s, &l) in b.token_seq.iter().zip(b.token_kv_len) {
        let slot = need.get_mut(s as usize).ok_or(KernelError::OutOfRange {
            what: "token_seq",
            value: s as usize,
            limit: b.block_tables.len(),
        })?;
        *slot = (*slot).max((l as usize).div_ceil(b.block_size));
    }
    for (bt, &nb) in b.block_tables.iter().zip(&need) {
        if nb > bt.len() {
            return Err(KernelError::OutOfRange {
                what: "kv_len blocks",
                value: nb,
                limit: bt.len() + 1,
            });
        }
        if let Some(&bad) = bt[..nb].iter().find(|&&id| id as usize >= n_blocks) {
            return Err(KernelError::OutOfRange {
                what: "block id",
                value: bad as usize,
                limit: n_blocks,
            });
        }
    }
    Ok(())
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
    kc: &[f32],
    vc: &[f32],
    t0: usize,
    nt: usize,
    g: usize,
    groups: usize,
    start: usize,
    end: usize,
    out: SyncPtr,
    lse: SyncPtr,
    row0: usize,
    simd: bool,
) {
    let (nq, nkv, hd) = (b.n_q_heads, b.n_kv_heads, b.head_dim);
    let r = nq / nkv;
    let bt = b.block_tables[b.token_seq[t0] as usize];
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        #[cfg(target_arch = "x86_64")]
        if simd {
            let tile = avx512::Tile {
                q: b.q.as_ptr().add((t0 * nq + g * r) * hd),
                q_tok_stride: nq * hd,
                r,
                groups,
                kv_len: &b.token_kv_len[t0..t0 + nt],
                hd,
                scale: b.scale,
                kc: kc.as_ptr().add(g * hd),
                vc: vc.as_ptr().add(g * hd),
                slot_stride: nkv * hd,
                bt,
                bs: b.block_size,
                start,
                end,
                out: out.0.add(row0 * hd),
                lse: lse.0.add(row0),
                out_tok_stride: nq,
            };
            avx512::attend_tile(&tile, &mut s);
            return;
        }
        let _ = (simd, groups);
        let need = r * (CH + 2);
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
                scale: b.scale,
                kc: &kc[g * hd..],
                vc: &vc[g * hd..],
                nkv,
                bt,
                bs: b.block_size,
                start,
                end: end.min(b.token_kv_len[t] as usize).max(start),
            };
            attend_body::<Scalar>(&it, o, l, &mut s);
        }
    });
}

struct Item<'a> {
    q: &'a [f32],
    nq: usize,
    r: usize,
    hd: usize,
    scale: f32,
    kc: &'a [f32],
    vc: &'a [f32],
    nkv: usize,
    bt: &'a [u32],
    bs: usize,
    start: usize,
    end: usize,
}

/// Vector primitives of the scalar attention loop.
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
    let (m, l) = rest.split_at_mut(nq);
    let l = &mut l[..nq];
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    out.fill(0.0);
    let mut offs = [0usize; CH];
    let mut j0 = it.start;
    while j0 < it.end {
        let c = CH.min(it.end - j0);
        for (jj, off) in offs[..c].iter_mut().enumerate() {
            let j = j0 + jj;
            let slot = it.bt[j / it.bs] as usize * it.bs + j % it.bs;
            *off = slot * it.nkv * hd;
        }
        for h in 0..nq {
            // GQA: query head h reads KV head h / r, at offset g*hd inside each slot row.
            let g = h / it.r;
            let (kc, vc) = (&it.kc[g * hd..], &it.vc[g * hd..]);
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

/// Merges attention partials computed over disjoint KV shards.
///
/// Row `i` of part `p` is `partial_out[p][i*head_dim..]` with `partial_lse[p][i]`.
/// `lse = m + ln Σ exp(lse_p − m)` with `m = max_p lse_p`, and
/// `out = Σ exp(lse_p − lse) · out_p`. Rows empty in every part give zeros and `-inf`.
///
/// ```
/// use dcpserve_kernels::merge_partials;
/// let (a, b) = ([1.0f32, 2.0], [3.0f32, 4.0]);
/// let (la, lb) = ([0.0f32], [f32::NEG_INFINITY]); // second shard is empty
/// let (mut out, mut lse) = ([0.0; 2], [0.0; 1]);
/// merge_partials(&[&a, &b], &[&la, &lb], 1, 2, &mut out, &mut lse).unwrap();
/// assert_eq!(out, [1.0, 2.0]);
/// assert_eq!(lse, [0.0]);
/// ```
pub fn merge_partials(
    partial_out: &[&[f32]],
    partial_lse: &[&[f32]],
    n_rows: usize,
    head_dim: usize,
    out: &mut [f32],
    lse_out: &mut [f32],
) -> Result<(), KernelError> {
    check_len(
        "merge_partials partial_lse count",
        partial_out.len(),
        partial_lse.len(),
    )?;
    for (o, l) in partial_out.iter().zip(partial_lse) {
        check_len("merge_partials partial_out", n_rows * head_dim, o.len())?;
        check_len("merge_partials partial_lse", n_rows, l.len())?;
    }
    check_len("merge_partials out", n_rows * head_dim, out.len())?;
    check_len("merge_partials lse_out", n_rows, lse_out.len())?;
    merge_rows(
        partial_out.len(),
        |i| partial_out[i],
        |i| partial_lse[i],
        n_rows,
        head_dim,
        out,
        lse_out,
    );
    Ok(())
}

fn merge_rows<'a>(
    n_parts: usize,
    get_out: impl Fn(usize) -> &'a [f32],
    get_lse: impl Fn(usize) -> &'a [f32],
    n_rows: usize,
    hd: usize,
    out: &mut [f32],
    lse_out: &mut [f32],
) {
    for row in 0..n_rows {
        let m = (0..n_parts)
            .map(|p| get_lse(p)[row])
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        let o = &mut out[row * hd..(row + 1) * hd];
        o.fill(0.0);
        if m == f32::NEG_INFINITY {
            lse_out[row] = f32::NEG_INFINITY;
            continue;
        }
        let sum: f32 = (0..n_parts)
            .map(|p| get_lse(p)[row])
            .filter(|v| !v.is_nan())
            .map(|v| (v - m).exp())
            .sum();
        let lse = m + sum.ln();
        lse_out[row] = lse;
        for p in 0..n_parts {
            let lp = get_lse(p)[row];
            if lp.is_nan() || lp == f32::NEG_INFINITY {
                continue; // empty shard: weight 0, and its output must not leak NaN
            }
            let w = (lp - lse).exp();
            for (a, v) in o.iter_mut().zip(&get_out(p)[row * hd..(row + 1) * hd]) {
                *a += w * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lcg(u64);
    impl Lcg {
        fn u(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn f(&mut self) -> f32 {
            (self.u() % 20001) as f32 / 10000.0 - 1.0
        }
    }

    /// A cache holding `lens[s]` tokens per sequence in shuffled blocks.
    struct Setup {
        k: Vec<f32>,
        v: Vec<f32>,
        tables: Vec<Vec<u32>>,
        dense_k: Vec<Vec<f32>>, // per sequence [len, nkv, hd]
        dense_v: Vec<Vec<f32>>,
    }

    fn setup(g: &mut Lcg, lens: &[usize], nkv: usize, hd: usize, bs: usize) -> Setup {
        let row = nkv * hd;
        let total_blocks: usize = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 3;
        let mut ids: Vec<u32> = (0..total_blocks as u32).collect();
        for i in (1..ids.len()).rev() {
            let j = (g.u() as usize) % (i + 1);
            ids.swap(i, j);
        }
        let mut k = vec![f32::NAN; total_blocks * bs * row]; // unused slots are NaN
        let mut v = k.clone();
        let mut tables = Vec::new();
        let (mut dk, mut dv) = (Vec::new(), Vec::new());
        let mut next = 0;
        for &len in lens {
            let nb = len.div_ceil(bs);
            let t: Vec<u32> = ids[next..next + nb].to_vec();
            next += nb;
            let kk: Vec<f32> = (0..len * row).map(|_| g.f()).collect();
            let vv: Vec<f32> = (0..len * row).map(|_| g.f()).collect();
            let slots: Vec<usize> = (0..len).map(|j| t[j / bs] as usize * bs + j % bs).collect();
            write_kv(&mut k, &mut v, nkv, hd, &slots, &kk, &vv).unwrap();
            tables.push(t);
            dk.push(kk);
            dv.push(vv);
        }
        Setup {
            k,
            v,
            tables,
            dense_k: dk,
            dense_v: dv,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reference(
        q: &[f32],
        nq: usize,
        nkv: usize,
        hd: usize,
        scale: f32,
        dk: &[f32],
        dv: &[f32],
        kv_len: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let r = nq / nkv;
        let mut o = vec![0.0; nq * hd];
        let mut lse = vec![f64::NEG_INFINITY; nq];
        for h in 0..nq {
            let g = h / r;
            let s: Vec<f64> = (0..kv_len)
                .map(|j| {
                    (0..hd)
                        .map(|d| q[h * hd + d] as f64 * dk[(j * nkv + g) * hd + d] as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            if kv_len == 0 {
                continue;
            }
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            lse[h] = m + z.ln();
            for j in 0..kv_len {
                let p = (s[j] - m).exp() / z;
                for d in 0..hd {
                    o[h * hd + d] += p * dv[(j * nkv + g) * hd + d] as f64;
                }
            }
        }
        (o, lse)
    }

    fn run_case(
        nq: usize,
        nkv: usize,
        hd: usize,
        bs: usize,
        lens: &[usize],
        threads: usize,
        seed: u64,
    ) {
        // Tokens: for each sequence the last 3 positions (causal), plus kv_len 0 tokens.
        let mut tokens = Vec::new();
        for (s, &len) in lens.iter().enumerate() {
            for back in 0..3usize {
                tokens.push((s as u32, len.saturating_sub(back) as u32));
            }
        }
        check(nq, nkv, hd, bs, lens, &tokens, threads, seed, 2.0);
    }

    /// Runs `tokens` (`(seq, kv_len)`) through both kernels; compares each with the
    /// f64 reference (1e-4) and the SIMD kernel with the scalar one (2e-5).
    #[allow(clippy::too_many_arguments)]
    fn check(
        nq: usize,
        nkv: usize,
        hd: usize,
        bs: usize,
        lens: &[usize],
        tokens: &[(u32, u32)],
        threads: usize,
        seed: u64,
        qscale: f32,
    ) {
        let mut g = Lcg(seed);
        let su = setup(&mut g, lens, nkv, hd, bs);
        let tseq: Vec<u32> = tokens.iter().map(|t| t.0).collect();
        let tlen: Vec<u32> = tokens.iter().map(|t| t.1).collect();
        let n = tseq.len();
        let q: Vec<f32> = (0..n * nq * hd).map(|_| g.f() * qscale).collect();
        let tables: Vec<&[u32]> = su.tables.iter().map(|t| t.as_slice()).collect();
        let b = AttentionBatch {
            q: &q,
            n_q_heads: nq,
            n_kv_heads: nkv,
            head_dim: hd,
            block_size: bs,
            scale: 1.0 / (hd as f32).sqrt(),
            token_seq: &tseq,
            token_kv_len: &tlen,
            block_tables: &tables,
        };
        let pool = ThreadPool::new(threads);
        let mut results = Vec::new();
        for simd in [false, crate::cpu::use_avx512()] {
            let mut out = vec![f32::NAN; n * nq * hd];
            let mut lse = vec![f32::NAN; n * nq];
            paged_attention_impl(&pool, &b, &su.k, &su.v, &mut out, &mut lse, simd).unwrap();
            for t in 0..n {
                let s = tseq[t] as usize;
                let (ro, rl) = reference(
                    &q[t * nq * hd..(t + 1) * nq * hd],
                    nq,
                    nkv,
                    hd,
                    b.scale,
                    &su.dense_k[s],
                    &su.dense_v[s],
                    tlen[t] as usize,
                );
                for h in 0..nq {
                    let got = lse[t * nq + h];
                    if rl[h] == f64::NEG_INFINITY {
                        assert_eq!(got, f32::NEG_INFINITY);
                    } else {
                        assert!((got as f64 - rl[h]).abs() < 1e-4, "lse {got} vs {}", rl[h]);
                    }
                }
                for (a, e) in out[t * nq * hd..(t + 1) * nq * hd].iter().zip(&ro) {
                    assert!((*a as f64 - e).abs() < 1e-4, "out {a} vs {e}");
                }
            }
            results.push((out, lse));
        }
        let ((so, sl), (vo, vl)) = (&results[0], &results[1]);
        for (a, e) in vo.iter().zip(so).chain(vl.iter().zip(sl)) {
            assert!(
                a == e || (a - e).abs() < 2e-5,
                "simd {a} vs scalar {e} (nq={nq} nkv={nkv} hd={hd} bs={bs})"
            );
        }
    }

    #[test]
    fn prefill_tiles_and_odd_head_dims() {
        // Causal prefill chunks (tiles of several tokens of one sequence), decode tokens
        // of other sequences and empty tokens in one batch.
        for &(nq, nkv, hd, bs) in &[
            (4, 1, 64, 16),
            (4, 1, 128, 16),
            (8, 2, 20, 5),
            (3, 3, 72, 16),
            (2, 1, 136, 7),
            (16, 1, 8, 16),
            (1, 1, 48, 3),
        ] {
            let lens = [300usize, 90, 17];
            let mut tokens = Vec::new();
            for i in 0..40u32 {
                tokens.push((0, 261 + i)); // last 40 positions of sequence 0
            }
            tokens.push((1, 90));
            tokens.push((2, 0));
            tokens.push((2, 17));
            for i in 0..9u32 {
                tokens.push((1, 1 + i * 10)); // sparse, non-monotone within a tile
            }
            for threads in [1, 2] {
                check(nq, nkv, hd, bs, &lens, &tokens, threads, 5 + hd as u64, 2.0);
            }
        }
    }

    #[test]
    fn large_scores_and_splits() {
        // Scores of magnitude ~30 move the running max often; long contexts split.
        for &(nq, nkv, hd) in &[(4, 1, 64), (8, 1, 64), (4, 4, 128), (2, 2, 16)] {
            let lens = [2500usize];
            let tokens = [(0u32, 2500u32), (0, 2499), (0, 1)];
            for threads in [1, 2, 3] {
                check(nq, nkv, hd, 16, &lens, &tokens, threads, 77, 30.0);
            }
            check(nq, nkv, hd, 16, &lens, &[(0, 2500)], 2, 78, 30.0);
        }
    }

    #[test]
    fn matches_dense_reference() {
        for &(nq, nkv) in &[(4, 4), (9, 3), (8, 2)] {
            for &bs in &[1, 16] {
                run_case(nq, nkv, 16, bs, &[0, 1, 37, 70], 2, (nq * 100 + bs) as u64);
            }
        }
        run_case(9, 3, 64, 16, &[5, 130], 1, 7);
    }

    #[test]
    fn long_sequence_split_matches() {
        run_case(3, 1, 64, 16, &[3000], 2, 11);
        run_case(4, 2, 32, 16, &[2100], 3, 12);
    }

    #[test]
    fn sharded_kv_merge_equals_full() {
        // DCP-style: position p lives on shard p % n_shards; attend each shard, merge.
        let (nq, nkv, hd, bs, len) = (6, 2, 32, 4, 45usize);
        for n_shards in [1usize, 2, 3, 8] {
            let mut g = Lcg(99 + n_shards as u64);
            let full = setup(&mut g, &[len], nkv, hd, bs);
            let q: Vec<f32> = (0..nq * hd).map(|_| g.f()).collect();
            let scale = 0.2;
            let pool = ThreadPool::new(2);
            let mut outs = vec![vec![0.0f32; nq * hd]; n_shards];
            let mut lses = vec![vec![0.0f32; nq]; n_shards];
            for sh in 0..n_shards {
                let pos: Vec<usize> = (sh..len).step_by(n_shards).collect();
                let row = nkv * hd;
                let kk: Vec<f32> = pos
                    .iter()
                    .flat_map(|&p| full.dense_k[0][p * row..(p + 1) * row].to_vec())
                    .collect();
                let vv: Vec<f32> = pos
                    .iter()
                    .flat_map(|&p| full.dense_v[0][p * row..(p + 1) * row].to_vec())
                    .collect();
                let nb = pos.len().div_ceil(bs).max(1);
                let table: Vec<u32> = (0..nb as u32).rev().collect();
                let mut kc = vec![0.0; nb * bs * row];
                let mut vc = kc.clone();
                let slots: Vec<usize> = (0..pos.len())
                    .map(|j| table[j / bs] as usize * bs + j % bs)
                    .collect();
                write_kv(&mut kc, &mut vc, nkv, hd, &slots, &kk, &vv).unwrap();
                let tables: [&[u32]; 1] = [&table];
                let b = AttentionBatch {
                    q: &q,
                    n_q_heads: nq,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    block_size: bs,
                    scale,
                    token_seq: &[0],
                    token_kv_len: &[pos.len() as u32],
                    block_tables: &tables,
                };
                paged_attention(&pool, &b, &kc, &vc, &mut outs[sh], &mut lses[sh]).unwrap();
            }
            let po: Vec<&[f32]> = outs.iter().map(|v| v.as_slice()).collect();
            let pl: Vec<&[f32]> = lses.iter().map(|v| v.as_slice()).collect();
            let mut out = vec![0.0; nq * hd];
            let mut lse = vec![0.0; nq];
            merge_partials(&po, &pl, nq, hd, &mut out, &mut lse).unwrap();
            let (ro, rl) = reference(
                &q,
                nq,
                nkv,
                hd,
                scale,
                &full.dense_k[0],
                &full.dense_v[0],
                len,
            );
            for (a, e) in out.iter().zip(&ro) {
                assert!((*a as f64 - e).abs() < 1e-5);
            }
            for (a, e) in lse.iter().zip(&rl) {
                assert!((*a as f64 - e).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn merge_all_empty_and_errors() {
        let nan = [f32::NAN; 2];
        let (mut out, mut lse) = ([1.0; 2], [1.0; 1]);
        merge_partials(&[&nan], &[&[f32::NEG_INFINITY]], 1, 2, &mut out, &mut lse).unwrap();
        assert_eq!(out, [0.0, 0.0]);
        assert_eq!(lse, [f32::NEG_INFINITY]);
        assert!(merge_partials(&[&nan], &[&[0.0, 0.0]], 1, 2, &mut out, &mut lse).is_err());
        let bt: [&[u32]; 1] = [&[5]];
        let b = AttentionBatch {
            q: &[0.0; 2],
            n_q_heads: 1,
            n_kv_heads: 1,
            head_dim: 2,
            block_size: 1,
            scale: 1.0,
            token_seq: &[0],
            token_kv_len: &[1],
            block_tables: &bt,
        };
        let pool = ThreadPool::new(1);
        assert!(paged_attention(&pool, &b, &[0.0; 4], &[0.0; 4], &mut out, &mut lse).is_err());
    }
}
