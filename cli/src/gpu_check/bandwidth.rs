//! Long-context decode attention as a memory-bandwidth figure: one decode token per
//! sequence reads every cached key and value once, so bytes read / time is the
//! achieved bandwidth, compared with a device-to-device copy measured in the same run.

use std::time::Instant;

use anyhow::{Context, Result};
use dcpserve_kernels::{Backend, KvCacheDType, PagedAttentionParams, PagedBatch};

/// The attention shape measured: a Llama-3-8B-like layer (32 query heads, 8 KV heads
/// of 128) with a bf16 cache in blocks of 16 tokens.
const NQ: usize = 32;
const NKV: usize = 8;
const HD: usize = 128;
const BS: usize = 16;

/// Median seconds of `reps` runs of `f`, each ended by `sync` (a device backend
/// queues work; a small download waits for it).
fn median_secs(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm-up: module loading, first allocations
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        t.push(t0.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn sync<B: Backend>(dev: &B, buf: &B::Buffer) -> Result<()> {
    let mut one = [0.0f32];
    dev.download(dev.view(buf, 0..1)?, &mut one)?;
    Ok(())
}

/// Device-to-device copy bandwidth in GB/s (bytes read + bytes written), over a
/// buffer of `bytes` bytes.
pub fn copy_gb_s<B: Backend>(dev: &B, bytes: usize) -> Result<f64> {
    copy_gb_s_reps(dev, bytes, 9)
}

fn copy_gb_s_reps<B: Backend>(dev: &B, bytes: usize, reps: usize) -> Result<f64> {
    let n = bytes / 4;
    let src = dev.zeros(n)?;
    let mut dst = dev.alloc(n)?;
    let secs = median_secs(reps, || {
        dev.copy(dev.view(&src, 0..n)?, dev.view_mut(&mut dst, 0..n)?)?;
        sync(dev, &dst)
    })?;
    Ok(2.0 * (n * 4) as f64 / secs / 1e9)
}

/// One decode step's attention over `context` cached tokens per sequence, `seqs`
/// sequences: achieved GB/s (KV bytes read / median time) and the median time in ms.
pub fn decode_attention_gb_s<B: Backend>(
    dev: &B,
    context: usize,
    seqs: usize,
) -> Result<(f64, f64)> {
    decode_attention_gb_s_reps(dev, context, seqs, 7)
}

fn decode_attention_gb_s_reps<B: Backend>(
    dev: &B,
    context: usize,
    seqs: usize,
    reps: usize,
) -> Result<(f64, f64)> {
    let dtype = KvCacheDType::BF16;
    let blocks_per = context.div_ceil(BS);
    let row = NKV * HD;
    let elems = seqs * blocks_per * BS * row;
    // The cache's contents do not change the work; zeros avoid a multi-GB upload.
    let kc = dev
        .kv_zeros(dtype, elems, HD)
        .with_context(|| format!("a {context}-token bf16 cache"))?;
    let vc = dev.kv_zeros(dtype, elems, HD)?;
    let tables: Vec<Vec<u32>> = (0..seqs)
        .map(|s| ((s * blocks_per) as u32..((s + 1) * blocks_per) as u32).collect())
        .collect();
    let refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
    let token_seq: Vec<u32> = (0..seqs as u32).collect();
    let token_kv_len = vec![context as u32; seqs];
    let p = PagedAttentionParams {
        n_q_heads: NQ,
        n_kv_heads: NKV,
        head_dim: HD,
        scale: 1.0 / (HD as f32).sqrt(),
        batch: PagedBatch {
            block_size: BS,
            token_seq: &token_seq,
            token_kv_len: &token_kv_len,
            block_tables: &refs,
        },
    };
    let q = dev.upload(&vec![0.01; seqs * NQ * HD])?;
    let mut out = dev.zeros(seqs * NQ * HD)?;
    let mut lse = dev.zeros(seqs * NQ)?;
    let (kn, vn) = (dev.kv_len(&kc), dev.kv_len(&vc));
    let secs = median_secs(reps, || {
        dev.paged_attention(
            dev.view(&q, 0..seqs * NQ * HD)?,
            &p,
            dev.kv_view(&kc, 0..kn)?,
            dev.kv_view(&vc, 0..vn)?,
            dev.view_mut(&mut out, 0..seqs * NQ * HD)?,
            dev.view_mut(&mut lse, 0..seqs * NQ)?,
        )?;
        sync(dev, &lse)
    })?;
    let bytes = 2 * seqs * context * row * dtype.bytes();
    Ok((bytes as f64 / secs / 1e9, secs * 1e3))
}

/// The report's bandwidth section: the copy, then each context length.
pub fn report<B: Backend>(dev: &B, contexts: &[usize], copy_bytes: usize) -> Result<String> {
    let copy = copy_gb_s(dev, copy_bytes)?;
    let mut s = format!(
        "device-to-device copy ({} MiB): {copy:.1} GB/s (read + write)\n",
        copy_bytes >> 20
    );
    for &c in contexts {
        let (gb_s, ms) = decode_attention_gb_s(dev, c, 1)?;
        s += &format!(
            "decode attention, 1 sequence of {c} tokens, {NQ} query / {NKV} KV heads of {HD}, bf16 cache: \
             {ms:.3} ms, {gb_s:.1} GB/s = {:.0}% of the copy\n",
            100.0 * gb_s / copy
        );
    }
    Ok(s)
}

/// Runs the copy and the decode attention of [`report`] once each, without timing them
/// (for a device whose timings mean nothing, such as the emulated one).
pub fn run_once<B: Backend>(dev: &B, contexts: &[usize], copy_bytes: usize) -> Result<()> {
    copy_gb_s_reps(dev, copy_bytes, 1)?;
    for &c in contexts {
        decode_attention_gb_s_reps(dev, c, 1, 1)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dcpserve_kernels::CpuBackend;

    #[test]
    fn the_cpu_backend_reports_positive_bandwidths() {
        let dev = CpuBackend::new(2);
        let s = report(&dev, &[512], 8 << 20).unwrap();
        assert!(s.contains("GB/s = "), "{s}");
        let (gb_s, ms) = decode_attention_gb_s(&dev, 300, 2).unwrap();
        assert!(gb_s > 0.0 && ms > 0.0);
        run_once(&dev, &[300], 1 << 20).unwrap();
    }
}
