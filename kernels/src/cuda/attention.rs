//! Attention on the device (`kernels/attention.cu`): paged GQA and MLA latent attention
//! with output and log-sum-exp, split along the keys for long contexts and merged by
//! LSE, and the LSE merge and share ops of decode context parallelism.

use crate::shape_checks::{check_block_tables, check_fp8_row, check_merge, check_paged_attention};
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::backend::{LatentAttentionParams, PagedAttentionParams, PagedBatch};
use crate::cuda::memory::{dtype_code, CudaKvRef, CudaRef};
use crate::cuda::staging::bytes_of;
use crate::cuda::{per_row, CudaBackend};
use crate::error::{check_len, KernelError};

/// Threads per attention block (`ATT_WARPS · 32` in the kernel).
const ATT_THREADS: u32 = 128;
/// Widest key or value row the kernel holds in registers (`32 · ATT_PER_LANE`).
const ATT_MAX_DIM: usize = 640;
/// Fewest keys per split worth a block of its own.
const SPLIT_MIN: usize = 256;
/// Blocks that keep an H200's 132 SMs busy.
const TARGET_BLOCKS: usize = 264;
/// Most splits of one token's keys.
const MAX_SPLITS: usize = 64;

/// `n` rounded up to a multiple of an eighth of its highest power of two (at least
/// 64): at most 12.5% more, and the same value for many consecutive `n`, so a decode
/// step's launch arguments (split plan, staged table size) stay put while contexts grow
/// and a captured CUDA graph keeps matching (`step_graph`).
pub(crate) fn bucket(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let top = 1usize << (usize::BITS - 1 - n.leading_zeros());
    n.next_multiple_of((top / 8).max(64))
}

/// Flash-decoding's split of the keys: `(splits, keys per split)`, planned for the
/// bucketed longest context ([`bucket`]). Keys are split only when the query rows alone
/// leave SMs idle and each split keeps at least `SPLIT_MIN` keys; every token's keys
/// `[s·chunk, (s+1)·chunk)` go to split `s` (splits past a token's keys are empty).
fn split_plan(rows: usize, max_kv: usize) -> (usize, usize) {
    let max_kv = bucket(max_kv);
    let splits = if rows > 0 && rows < TARGET_BLOCKS && max_kv >= 2 * SPLIT_MIN {
        TARGET_BLOCKS
            .div_ceil(rows)
            .min(max_kv / SPLIT_MIN)
            .clamp(1, MAX_SPLITS)
    } else {
        1
    };
    (splits, max_kv.div_ceil(splits).max(1))
}

/// One attention launch, GQA or latent, after validation.
struct Job<'a> {
    q: CudaRef<'a>,
    k: CudaKvRef<'a>,
    v: CudaKvRef<'a>,
    kv_row_stride: usize,
    n_heads: usize,
    heads_per_kv: usize,
    d: usize,
    dv: usize,
    scale: f32,
    batch: PagedBatch<'a>,
}

impl CudaBackend {
    pub(crate) fn paged_attention_op(
        &self,
        q: CudaRef<'_>,
        p: &PagedAttentionParams<'_>,
        k_cache: CudaKvRef<'_>,
        v_cache: CudaKvRef<'_>,
        out: &mut CudaViewMut<'_, f32>,
        lse: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        let n = p.batch.token_seq.len();
        check_paged_attention(
            p,
            (q.len(), out.len(), lse.len()),
            (k_cache.len(), k_cache.dtype(), k_cache.fp8_row_len()),
            (v_cache.len(), v_cache.dtype(), v_cache.fp8_row_len()),
        )?;
        let (nq, nkv, hd) = (p.n_q_heads, p.n_kv_heads, p.head_dim);
        let row = nkv * hd;
        if n == 0 || hd == 0 || nq == 0 {
            return self.fill_op(lse, f32::NEG_INFINITY);
        }
        self.attend(
            Job {
                q,
                k: k_cache,
                v: v_cache,
                kv_row_stride: row,
                n_heads: nq,
                heads_per_kv: nq / nkv,
                d: hd,
                dv: hd,
                scale: p.scale,
                batch: p.batch,
            },
            out,
            lse,
        )
    }

    pub(crate) fn latent_attention_op(
        &self,
        q: CudaRef<'_>,
        p: &LatentAttentionParams<'_>,
        cache: CudaKvRef<'_>,
        out: &mut CudaViewMut<'_, f32>,
        lse: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        let n = p.batch.token_seq.len();
        let bad = |what: String| Err(KernelError::Shape(format!("latent attention: {what}")));
        if p.dim == 0 || p.v_dim > p.dim || p.batch.block_size == 0 {
            return bad(format!(
                "dim {} / v_dim {} / block_size {}",
                p.dim, p.v_dim, p.batch.block_size
            ));
        }
        if p.batch.token_kv_len.len() != n
            || q.len() != n * p.n_heads * p.dim
            || out.len() != n * p.n_heads * p.v_dim
            || lse.len() != n * p.n_heads
        {
            return bad(format!(
                "buffer sizes disagree for {n} tokens of {} heads",
                p.n_heads
            ));
        }
        check_fp8_row("latent attention", cache.fp8_row_len(), p.dim)?;
        let n_blocks = cache.len() / (p.dim * p.batch.block_size);
        check_block_tables(
            p.batch.token_seq,
            p.batch.token_kv_len,
            p.batch.block_tables,
            p.batch.block_size,
            n_blocks,
        )
        .map_err(|e| KernelError::Shape(format!("latent attention: {e}")))?;
        if n == 0 || p.n_heads == 0 {
            return Ok(());
        }
        self.attend(
            Job {
                q,
                k: cache,
                v: cache,
                kv_row_stride: p.dim,
                n_heads: p.n_heads,
                heads_per_kv: p.n_heads,
                d: p.dim,
                dv: p.v_dim,
                scale: p.scale,
                batch: p.batch,
            },
            out,
            lse,
        )
    }

    /// Launches the attention kernel (and the merge of its splits).
    fn attend(
        &self,
        job: Job<'_>,
        out: &mut CudaViewMut<'_, f32>,
        lse: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        if job.d > ATT_MAX_DIM || job.dv > ATT_MAX_DIM {
            return Err(KernelError::Shape(format!(
                "CUDA attention handles rows up to {ATT_MAX_DIM} wide, got {} / {}",
                job.d, job.dv
            )));
        }
        let rows = job.batch.token_seq.len() * job.n_heads;
        let max_kv = job.batch.token_kv_len.iter().copied().max().unwrap_or(0) as usize;
        let (splits, chunk) = split_plan(rows, max_kv);
        let chunk = u32::try_from(chunk)
            .map_err(|_| KernelError::Shape("attention: context too long".into()))?;

        // Step metadata: one flat block table with per-sequence offsets.
        let mut offsets = Vec::with_capacity(job.batch.block_tables.len());
        let mut flat = Vec::new();
        for bt in job.batch.block_tables {
            offsets.push(flat.len() as u64);
            flat.extend_from_slice(bt);
        }
        // A bucketed size, so the staged copy's size changes only now and then as
        // tables grow (the padding is never read).
        flat.resize(bucket(flat.len()), 0);
        let [seq, lens, flat, offsets] = self.stage_meta([
            bytes_of(job.batch.token_seq),
            bytes_of(job.batch.token_kv_len),
            bytes_of(&flat),
            bytes_of(&offsets),
        ])?;

        let (kb, vb) = (job.k.bytes(), job.v.bytes());
        let (ks, vs) = (job.k.scales(), job.v.scales());
        let dt = dtype_code(job.k.dtype());
        let qv = job.q.cuda();
        let dims = [
            job.n_heads,
            job.heads_per_kv,
            job.d,
            job.dv,
            job.batch.block_size,
        ]
        .map(|v| v as u32);
        let stride = job.kv_row_stride as u64;
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(rows)
                    .map_err(|_| KernelError::Shape("attention: too many rows".into()))?,
                splits as u32,
                1,
            ),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let launch = |op: u64, lp: u64, split_rows: u64| {
            let mut b = self.launch_of("attention_partial")?;
            b.ptr(&qv).ptr(&kb).ptr(&vb).ptr(&ks).ptr(&vs);
            b.i32(dt).u64(stride);
            b.u64(seq).u64(lens).u64(flat).u64(offsets);
            for &d in &dims {
                b.u32(d);
            }
            b.f32(job.scale).u32(chunk).u64(op).u64(lp).u64(split_rows);
            // SAFETY: tables and lengths were validated against the caches; each block
            // writes its own output row of its split.
            unsafe { b.launch(cfg) }
        };
        if splits == 1 {
            let (op, _so) = out.device_ptr_mut(self.stream());
            let (lp, _sl) = lse.device_ptr_mut(self.stream());
            return launch(op, lp, 0);
        }
        // Partials in the lane's scratch: split s's outputs at [s·rows·dv, (s+1)·rows·dv)
        // of the first part, its LSEs at [s·rows, (s+1)·rows) of the second (the
        // kernel's layout for `split_rows = rows`).
        let out_len = splits * rows * job.dv;
        let base = self.scratch_f32(out_len + splits * rows)?;
        let f = std::mem::size_of::<f32>() as u64;
        let (pout, plse) = (base, base + out_len as u64 * f);
        launch(pout, plse, rows as u64)?;
        let oaddr: Vec<u64> = (0..splits)
            .map(|s| pout + (s * rows * job.dv) as u64 * f)
            .collect();
        let laddr: Vec<u64> = (0..splits).map(|s| plse + (s * rows) as u64 * f).collect();
        self.merge_addrs(&oaddr, &laddr, rows, job.dv, out, lse)
    }

    /// The LSE merge of partials given as cudarc views (pointer arrays on the device).
    pub(crate) fn merge_views(
        &self,
        partial_out: &[CudaView<'_, f32>],
        partial_lse: &[CudaView<'_, f32>],
        n_rows: usize,
        head_dim: usize,
        out: &mut CudaViewMut<'_, f32>,
        lse: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        check_merge(
            (partial_out.len(), partial_lse.len()),
            partial_out
                .iter()
                .zip(partial_lse)
                .map(|(o, l)| (o.len(), l.len())),
            n_rows,
            head_dim,
            (out.len(), lse.len()),
        )?;
        if n_rows == 0 {
            return Ok(());
        }
        let optrs: Vec<_> = partial_out
            .iter()
            .map(|v| v.device_ptr(self.stream()))
            .collect();
        let lptrs: Vec<_> = partial_lse
            .iter()
            .map(|v| v.device_ptr(self.stream()))
            .collect();
        let oaddr: Vec<u64> = optrs.iter().map(|(p, _)| *p).collect();
        let laddr: Vec<u64> = lptrs.iter().map(|(p, _)| *p).collect();
        self.merge_addrs(&oaddr, &laddr, n_rows, head_dim, out, lse)?;
        drop((optrs, lptrs));
        Ok(())
    }

    /// The LSE merge of `oaddr.len()` parts at device addresses, each `n_rows` rows of
    /// `head_dim` outputs (`oaddr`) and `n_rows` LSEs (`laddr`): the caller has checked
    /// those sizes (`merge_views`) or laid the parts out itself (`attend`).
    fn merge_addrs(
        &self,
        oaddr: &[u64],
        laddr: &[u64],
        n_rows: usize,
        head_dim: usize,
        out: &mut CudaViewMut<'_, f32>,
        lse: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        check_len("merge LSE parts", oaddr.len(), laddr.len())?;
        check_len("merge output", n_rows * head_dim, out.len())?;
        check_len("merge LSE", n_rows, lse.len())?;
        if n_rows == 0 {
            return Ok(());
        }
        let [oaddr_dev, laddr_dev] = self.stage_meta([bytes_of(oaddr), bytes_of(laddr)])?;
        let (parts, rows, hd) = (oaddr.len() as u32, n_rows as u64, head_dim as u32);
        let mut b = self.launch_of("merge_lse_f32")?;
        b.u64(oaddr_dev).u64(laddr_dev).u32(parts).u64(rows);
        b.u32(hd).ptr_mut(out).ptr_mut(lse);
        // SAFETY: every part holds n_rows rows (checked by the caller).
        unsafe { b.launch(per_row(n_rows, 128)?) }?;
        Ok(())
    }

    pub(crate) fn merge_lse_op(
        &self,
        partial_out: &[CudaRef<'_>],
        partial_lse: &[CudaRef<'_>],
        n_rows: usize,
        head_dim: usize,
        out: &mut CudaViewMut<'_, f32>,
        lse: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        let outs: Vec<_> = partial_out.iter().map(|v| v.cuda()).collect();
        let lses: Vec<_> = partial_lse.iter().map(|v| v.cuda()).collect();
        self.merge_views(&outs, &lses, n_rows, head_dim, out, lse)
    }

    pub(crate) fn scale_by_lse_share_op(
        &self,
        out: &mut CudaViewMut<'_, f32>,
        lse: CudaRef<'_>,
        all_lse: CudaRef<'_>,
        parts: usize,
        head_dim: usize,
    ) -> Result<(), KernelError> {
        let n = lse.len();
        check_len("scale_by_lse_share out", n * head_dim, out.len())?;
        check_len("scale_by_lse_share all_lse", parts * n, all_lse.len())?;
        if n == 0 || head_dim == 0 {
            return Ok(());
        }
        let (lv, av) = (lse.cuda(), all_lse.cuda());
        let mut b = self.launch_of("scale_by_lse_share_f32")?;
        let (parts, n64, hd) = (parts as u32, n as u64, head_dim as u32);
        b.ptr_mut(out).ptr(&lv).ptr(&av).u32(parts).u64(n64).u32(hd);
        // SAFETY: lengths checked.
        unsafe { b.launch(per_row(n, 128)?) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_every_key_and_only_when_sms_idle() {
        // Decode of one sequence: split, each split at least SPLIT_MIN keys.
        for (rows, kv) in [(1, 600), (4, 100_000), (32, 4096), (9, 600)] {
            let (s, chunk) = split_plan(rows, kv);
            assert!(s > 1 && s <= MAX_SPLITS, "{rows} {kv}: {s}");
            assert!(
                s * chunk >= kv && (s - 1) * chunk < bucket(kv),
                "{rows} {kv}: {s}·{chunk}"
            );
            assert!(chunk >= SPLIT_MIN);
        }
        // Short contexts and busy grids: one pass.
        assert_eq!(split_plan(1, 300), (1, 320));
        assert_eq!(split_plan(TARGET_BLOCKS, 100_000).0, 1);
        assert_eq!(split_plan(0, 0), (1, 1));
    }

    #[test]
    fn buckets_round_up_by_at_most_an_eighth_and_hold_still() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 64);
        assert_eq!(bucket(64), 64);
        assert_eq!(bucket(65), 128);
        assert_eq!(bucket(33_000), 36_864);
        for n in 1..5000usize {
            let b = bucket(n);
            assert!(b >= n && (b - n) * 8 <= n.max(512), "{n} -> {b}");
        }
        // 4096 consecutive 32k-ish contexts share one bucket.
        assert!((32_769..=36_864).all(|n| bucket(n) == 36_864));
    }

    #[test]
    fn split_plans_cover_every_key_and_stay_put_within_a_bucket() {
        for rows in [1, 8, 32, 300] {
            for max_kv in [1, 100, 511, 512, 4000, 33_000, 131_072] {
                let (splits, chunk) = split_plan(rows, max_kv);
                assert!((1..=MAX_SPLITS).contains(&splits));
                assert!(splits * chunk >= max_kv, "{rows} {max_kv}");
                assert_eq!(split_plan(rows, bucket(max_kv)), (splits, chunk));
            }
        }
    }
}
