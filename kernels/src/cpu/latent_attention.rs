//! Paged attention against the latent cache, where a value is the `v_dim`-wide prefix of
//! its key row (MLA with absorbed weights: keys `[c_kv, k_pe]`, values `c_kv`). Returns
//! the output and the log-sum-exp per (token, head) like [`crate::paged_attention`], so
//! partial results over KV shards merge exactly (decode context parallelism).

use crate::backend::LatentAttentionParams;
use crate::cpu::kv_store::KvRef;
use crate::dcp::merge_partials;
use crate::error::KernelError;
use crate::pool::ThreadPool;
use crate::shape_checks::check_fp8_row;

/// Keys scored per online-softmax step.
const CH: usize = 32;
/// Minimum keys per split when one token's keys are split across threads.
const SPLIT_MIN: usize = 256;

/// One batch of absorbed queries for [`latent_attention`]: the queries and the call's
/// [`LatentAttentionParams`] (heads, key and value widths, scale, paged metadata).
#[derive(Clone, Copy)]
pub struct LatentBatch<'a> {
    /// Queries, `[n_tokens, n_heads, dim]`.
    pub q: &'a [f32],
    /// The shape, the score scale and the paged-cache metadata of the tokens.
    pub params: LatentAttentionParams<'a>,
}

impl<'a> LatentBatch<'a> {
    /// The tokens `range` of the batch (their queries, sequences and lengths).
    pub fn tokens(&self, range: std::ops::Range<usize>) -> LatentBatch<'a> {
        let row = self.params.n_heads * self.params.dim;
        LatentBatch {
            q: &self.q[range.start * row..range.end * row],
            params: LatentAttentionParams {
                batch: self.params.batch.tokens(range),
                ..self.params
            },
        }
    }
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: every work item writes its own rows only.
unsafe impl Sync for SyncPtr {}
unsafe impl Send for SyncPtr {}

/// `out[t, h] = softmax(scale · q·Kᵀ) · V` with `V = K[.., ..v_dim]`, and
/// `lse[t, h] = ln Σ exp(scale · q·k)`; tokens without keys get zeros and `-inf`.
/// `out` is `[n_tokens, n_heads, v_dim]`, `lse` `[n_tokens, n_heads]`.
pub fn latent_attention(
    pool: &ThreadPool,
    b: &LatentBatch,
    cache: &[f32],
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<(), KernelError> {
    latent_attention_typed(pool, b, cache.into(), out, lse)
}

/// [`latent_attention`] against a latent cache of any
/// [`KvCacheDType`](crate::KvCacheDType): each chunk's rows are converted to f32 just
/// before use (a few rows per thread), so a narrow cache is read in its narrow form.
pub fn latent_attention_typed(
    pool: &ThreadPool,
    b: &LatentBatch,
    cache: KvRef<'_>,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<(), KernelError> {
    validate(b, cache, out, lse)?;
    let n = b.params.batch.token_seq.len();
    let rows = n * b.params.n_heads;
    if n == 0 {
        return Ok(());
    }
    let threads = pool.n_threads();
    let max_kv = b
        .params
        .batch
        .token_kv_len
        .iter()
        .copied()
        .max()
        .unwrap_or(0) as usize;
    // Few tokens over long contexts (decode): split the keys too, so every thread works.
    let splits = if n < 2 * threads && max_kv >= 2 * SPLIT_MIN {
        (4 * threads).div_ceil(n).min(max_kv / SPLIT_MIN).max(2)
    } else {
        1
    };
    let simd = simd_available();
    if splits == 1 {
        let (op, lp) = (SyncPtr(out.as_mut_ptr()), SyncPtr(lse.as_mut_ptr()));
        pool.run(n, |t| {
            let len = b.params.batch.token_kv_len[t] as usize;
            // SAFETY: item t owns rows t·n_heads.. of out and lse.
            unsafe { attend(b, cache, t, 0, len, op, lp, t * b.params.n_heads, simd) };
        });
        return Ok(());
    }
    let mut pout = vec![0.0f32; splits * rows * b.params.v_dim];
    let mut plse = vec![f32::NEG_INFINITY; splits * rows];
    let (op, lp) = (SyncPtr(pout.as_mut_ptr()), SyncPtr(plse.as_mut_ptr()));
    pool.run(n * splits, |it| {
        let (t, s) = (it / splits, it % splits);
        let len = b.params.batch.token_kv_len[t] as usize;
        let chunk = len.div_ceil(splits).next_multiple_of(CH);
        let (start, end) = ((s * chunk).min(len), ((s + 1) * chunk).min(len));
        // SAFETY: split s of token t owns its rows of partial buffer s.
        unsafe {
            attend(
                b,
                cache,
                t,
                start,
                end,
                op,
                lp,
                s * rows + t * b.params.n_heads,
                simd,
            )
        };
    });
    let outs: Vec<&[f32]> = pout.chunks_exact(rows * b.params.v_dim).collect();
    let lses: Vec<&[f32]> = plse.chunks_exact(rows).collect();
    merge_partials(&outs, &lses, rows, b.params.v_dim, out, lse)
}

fn validate(
    b: &LatentBatch,
    cache: KvRef<'_>,
    out: &[f32],
    lse: &[f32],
) -> Result<(), KernelError> {
    let n = b.params.batch.token_seq.len();
    let bad = |what: String| Err(KernelError::Shape(format!("latent attention: {what}")));
    if b.params.dim == 0 || b.params.v_dim > b.params.dim || b.params.batch.block_size == 0 {
        return bad(format!(
            "dim {} / v_dim {} / block_size {}",
            b.params.dim, b.params.v_dim, b.params.batch.block_size
        ));
    }
    if b.params.batch.token_kv_len.len() != n
        || b.q.len() != n * b.params.n_heads * b.params.dim
        || out.len() != n * b.params.n_heads * b.params.v_dim
        || lse.len() != n * b.params.n_heads
    {
        return bad(format!(
            "buffer sizes disagree for {n} tokens of {} heads",
            b.params.n_heads
        ));
    }
    check_fp8_row("latent attention", cache.fp8_row_len(), b.params.dim)?;
    let n_blocks = cache.len() / (b.params.dim * b.params.batch.block_size);
    for (&s, &l) in b
        .params
        .batch
        .token_seq
        .iter()
        .zip(b.params.batch.token_kv_len)
    {
        let Some(table) = b.params.batch.block_tables.get(s as usize) else {
            return bad(format!("sequence {s} has no block table"));
        };
        let need = (l as usize).div_ceil(b.params.batch.block_size);
        if need > table.len() {
            return bad(format!(
                "{l} keys need {need} blocks, the table has {}",
                table.len()
            ));
        }
        if let Some(&id) = table[..need].iter().find(|&&id| id as usize >= n_blocks) {
            return bad(format!(
                "block id {id} is outside the cache ({n_blocks} blocks)"
            ));
        }
    }
    Ok(())
}

/// The AVX2 kernel runs at level AVX2 and above (`crate::cpu::isa`, capped by
/// `DCPSERVE_CPU_ISA`).
fn simd_available() -> bool {
    crate::cpu::use_avx2()
}

/// Attends all heads of token `t` to its keys `start..end`, writing `n_heads` rows of
/// `out` / `lse` from `row0`.
///
/// # Safety
/// Those rows must be in bounds and written by no other thread.
#[allow(clippy::too_many_arguments)]
unsafe fn attend(
    b: &LatentBatch,
    cache: KvRef<'_>,
    t: usize,
    start: usize,
    end: usize,
    out: SyncPtr,
    lse: SyncPtr,
    row0: usize,
    simd: bool,
) {
    let (h, vd) = (b.params.n_heads, b.params.v_dim);
    let o = std::slice::from_raw_parts_mut(out.0.add(row0 * vd), h * vd);
    let l = std::slice::from_raw_parts_mut(lse.0.add(row0), h);
    #[cfg(target_arch = "x86_64")]
    if simd {
        attend_avx2(b, cache, t, start, end, o, l);
        return;
    }
    let _ = simd;
    attend_body::<Scalar>(b, cache, t, start, end, o, l);
}

/// [`attend_body`] with AVX2 + FMA vector primitives.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(
    b: &LatentBatch,
    cache: KvRef<'_>,
    t: usize,
    start: usize,
    end: usize,
    out: &mut [f32],
    lse: &mut [f32],
) {
    attend_body::<avx2::Avx2>(b, cache, t, start, end, out, lse)
}

/// Vector primitives of the attention loop.
trait Math {
    /// `Σ a[i]·b[i]` over `a.len()` elements (`b` at least as long).
    fn dot(a: &[f32], b: &[f32]) -> f32;
    /// `y += alpha·x` over `y.len()` elements (`x` at least as long).
    fn axpy(alpha: f32, x: &[f32], y: &mut [f32]);
}

struct Scalar;

impl Math for Scalar {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let b = &b[..a.len()];
        let mut acc = [0.0f32; 8];
        let n8 = a.len() / 8 * 8;
        let mut i = 0;
        while i < n8 {
            for l in 0..8 {
                acc[l] += a[i + l] * b[i + l];
            }
            i += 8;
        }
        let mut s: f32 = acc.iter().sum();
        while i < a.len() {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    #[inline(always)]
    fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        let x = &x[..y.len()];
        for i in 0..y.len() {
            y[i] += alpha * x[i];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// AVX2 + FMA primitives; only called from `#[target_feature(enable = "avx2,fma")]` code.
    pub struct Avx2;

    impl super::Math for Avx2 {
        #[inline(always)]
        fn dot(a: &[f32], b: &[f32]) -> f32 {
            let n = a.len();
            assert!(b.len() >= n);
            let n8 = n / 8 * 8;
            // SAFETY: loads stay below n ≤ len of both; the caller enabled AVX2 + FMA.
            unsafe {
                let mut acc = _mm256_setzero_ps();
                let mut i = 0;
                while i < n8 {
                    let x = _mm256_loadu_ps(a.as_ptr().add(i));
                    let y = _mm256_loadu_ps(b.as_ptr().add(i));
                    acc = _mm256_fmadd_ps(x, y, acc);
                    i += 8;
                }
                let hi = _mm256_extractf128_ps(acc, 1);
                let lo = _mm256_castps256_ps128(acc);
                let s4 = _mm_add_ps(hi, lo);
                let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
                let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
                let mut s = _mm_cvtss_f32(s1);
                while i < n {
                    s += a[i] * b[i];
                    i += 1;
                }
                s
            }
        }

        #[inline(always)]
        fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
            let n = y.len();
            assert!(x.len() >= n);
            let n8 = n / 8 * 8;
            // SAFETY: as in `dot`.
            unsafe {
                let a = _mm256_set1_ps(alpha);
                let mut i = 0;
                while i < n8 {
                    let xv = _mm256_loadu_ps(x.as_ptr().add(i));
                    let yv = _mm256_loadu_ps(y.as_ptr().add(i));
                    _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(a, xv, yv));
                    i += 8;
                }
                while i < n {
                    y[i] += alpha * x[i];
                    i += 1;
                }
            }
        }
    }
}

/// Online softmax over keys in chunks of [`CH`]: score the chunk for every head, then
/// rescale each head's accumulator once and add the chunk's weighted value prefixes.
#[inline(always)]
fn attend_body<M: Math>(
    b: &LatentBatch,
    cache: KvRef<'_>,
    t: usize,
    start: usize,
    end: usize,
    out: &mut [f32],
    lse: &mut [f32],
) {
    let (h, d, vd, bs) = (
        b.params.n_heads,
        b.params.dim,
        b.params.v_dim,
        b.params.batch.block_size,
    );
    let q = &b.q[t * h * d..(t + 1) * h * d];
    let table = b.params.batch.block_tables[b.params.batch.token_seq[t] as usize];
    out.fill(0.0);
    let mut m = vec![f32::NEG_INFINITY; h];
    let mut sum = vec![0.0f32; h];
    let mut scores = vec![0.0f32; h * CH];
    // The chunk's rows as f32, for caches stored narrower.
    let mut decoded = match cache.as_f32() {
        Some(_) => Vec::new(),
        None => vec![0.0f32; CH * d],
    };
    let mut offs = [0usize; CH];
    let mut j0 = start;
    while j0 < end {
        let c = (end - j0).min(CH);
        for (jj, off) in offs.iter_mut().enumerate().take(c) {
            let j = j0 + jj;
            *off = (table[j / bs] as usize * bs + j % bs) * d;
        }
        let cache: &[f32] = match cache.as_f32() {
            Some(rows) => rows,
            None => {
                for (jj, off) in offs.iter_mut().enumerate().take(c) {
                    cache.decode(*off, &mut decoded[jj * d..(jj + 1) * d]);
                    *off = jj * d;
                }
                &decoded
            }
        };
        for jj in 0..c {
            let key = &cache[offs[jj]..offs[jj] + d];
            for hh in 0..h {
                scores[hh * CH + jj] = M::dot(&q[hh * d..(hh + 1) * d], key) * b.params.scale;
            }
        }
        for hh in 0..h {
            let s = &mut scores[hh * CH..hh * CH + c];
            let mut cmax = f32::NEG_INFINITY;
            for &v in s.iter() {
                cmax = cmax.max(v);
            }
            let new_m = m[hh].max(cmax);
            let acc = &mut out[hh * vd..(hh + 1) * vd];
            if m[hh] != new_m && m[hh] != f32::NEG_INFINITY {
                let corr = (m[hh] - new_m).exp();
                sum[hh] *= corr;
                for a in acc.iter_mut() {
                    *a *= corr;
                }
            }
            m[hh] = new_m;
            // A separate pass so the exponentials vectorize.
            for v in s.iter_mut() {
                *v = exp(*v - new_m);
            }
            for jj in 0..c {
                let p = s[jj];
                sum[hh] += p;
                M::axpy(p, &cache[offs[jj]..offs[jj] + vd], acc);
            }
        }
        j0 += c;
    }
    for hh in 0..h {
        let acc = &mut out[hh * vd..(hh + 1) * vd];
        if sum[hh] > 0.0 {
            let inv = 1.0 / sum[hh];
            for a in acc.iter_mut() {
                *a *= inv;
            }
            lse[hh] = m[hh] + sum[hh].ln();
        } else {
            acc.fill(0.0);
            lse[hh] = f32::NEG_INFINITY;
        }
    }
}

/// `e^x` for `x ≤ 0` (scores minus their running maximum) to about 2e-7 relative error,
/// in straight-line f32 code that vectorizes (the scalar `exp` is a call per score).
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.0, 0.0);
    let k = (x * LOG2E + 0.5).floor();
    let r = x - k * LN2_HI - k * LN2_LO;
    // Taylor polynomial on |r| ≤ ln2/2 (Horner form).
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r / 5040.0))))));
    p * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PagedBatch;

    /// Against a naive softmax over expanded keys/values, split or not, scalar or SIMD.
    #[test]
    fn fast_exp_is_accurate() {
        for i in 0..=20000 {
            let x = -(i as f32) * 0.004;
            let (a, b) = (exp(x) as f64, (x as f64).exp());
            assert!(
                (a - b).abs() <= 3e-7 * b + 1e-38,
                "exp({x}) = {a}, want {b}"
            );
        }
    }

    #[test]
    fn matches_naive_attention() {
        let (h, d, vd, bs) = (3, 12, 8, 4);
        let n_keys = 600;
        let n_blocks = n_keys / bs + 2;
        let mut seed = 7u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let cache: Vec<f32> = (0..n_blocks * bs * d).map(|_| rnd()).collect();
        let table: Vec<u32> = (0..n_blocks as u32).rev().collect();
        let q: Vec<f32> = (0..2 * h * d).map(|_| 2.0 * rnd()).collect();
        let kv = [n_keys as u32, 0];
        let tables = [table.as_slice()];
        let b = LatentBatch {
            q: &q,
            params: LatentAttentionParams {
                n_heads: h,
                dim: d,
                v_dim: vd,
                scale: 0.7,
                batch: PagedBatch {
                    block_size: bs,
                    token_seq: &[0, 0],
                    token_kv_len: &kv,
                    block_tables: &tables,
                },
            },
        };
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let (mut out, mut lse) = (vec![0.0; 2 * h * vd], vec![0.0; 2 * h]);
            latent_attention(&pool, &b, &cache, &mut out, &mut lse).unwrap();
            for hh in 0..h {
                let qh = &q[hh * d..(hh + 1) * d];
                let rows: Vec<&[f32]> = (0..n_keys)
                    .map(|j| {
                        let s = table[j / bs] as usize * bs + j % bs;
                        &cache[s * d..(s + 1) * d]
                    })
                    .collect();
                let sc: Vec<f64> = rows
                    .iter()
                    .map(|r| 0.7 * qh.iter().zip(*r).map(|(a, b)| (a * b) as f64).sum::<f64>())
                    .collect();
                let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|s| (s - mx).exp()).sum();
                assert!((lse[hh] as f64 - (mx + z.ln())).abs() < 1e-4);
                for i in 0..vd {
                    let want: f64 = rows
                        .iter()
                        .zip(&sc)
                        .map(|(r, s)| (s - mx).exp() / z * r[i] as f64)
                        .sum();
                    assert!((out[hh * vd + i] as f64 - want).abs() < 1e-5);
                }
                assert_eq!(lse[h + hh], f32::NEG_INFINITY);
                assert!(out[(h + hh) * vd..(h + hh + 1) * vd]
                    .iter()
                    .all(|&x| x == 0.0));
            }
        }
    }
}
