//! `dcpserve kl-divergence`: how far the int8-activation matmul (`--cpu-matmul int8`)
//! moves a model's next-token distributions from the f32 path on the same weights,
//! measured the way llama.cpp's `llama-perplexity --kl-divergence` measures a quantized
//! model against its base: the text is cut into chunks of `ctx` tokens, each chunk is
//! one prefill, and the second half of every chunk is scored (the first half is its
//! context). `scripts/int8-accuracy.py` sets the two side by side, for the rule that
//! decides what `--cpu-matmul auto` means.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use dcpserve_kernels::{log_softmax, CpuBackend, CpuMatmul, KvCacheDType};
use dcpserve_model::arch::{BatchInput, DecoderModel, ForwardOptions, RankComms, WeightPrecision};
use dcpserve_model::ModelFiles;

/// What to measure.
pub struct KlSpec {
    /// Tokens per chunk (llama-perplexity's `-c`).
    pub ctx: usize,
    /// Most chunks scored (llama-perplexity's `--chunks`).
    pub chunks: usize,
    /// Tokens per forward pass: `ctx` scores each chunk in one prefill (as llama.cpp
    /// does), 1 to 4 as decode steps (the int8 path's one-row kernels for the K-quants
    /// quantize activations per 256 values, the batched ones per 32).
    pub step: usize,
    /// The path compared with f32: `Int8`, or `Auto` (per product, when
    /// `DCPSERVE_CPU_MATMUL` is unset).
    pub against: CpuMatmul,
    /// Compute threads.
    pub threads: usize,
}

/// Loads `model` twice (f32 and int8 matmul), scores `text`, and returns one JSON line:
/// positions scored, mean / 99th percentile / max KL(f32 ‖ int8) in nats, and the share
/// of positions whose most likely token is the same.
pub fn run(model: &Path, text: &Path, spec: &KlSpec) -> Result<String> {
    if spec.ctx < 4 || spec.chunks == 0 || spec.step == 0 {
        bail!("kl-divergence needs --ctx >= 4, --chunks >= 1 and --step >= 1");
    }
    let files = ModelFiles::open(model).with_context(|| format!("open {}", model.display()))?;
    let text = std::fs::read_to_string(text).with_context(|| format!("read {}", text.display()))?;
    let ids = files.tokenizer.encode(&text, false)?;
    let n_chunks = (ids.len() / spec.ctx).min(spec.chunks);
    if n_chunks == 0 {
        bail!(
            "the text has {} tokens, fewer than one chunk of {}",
            ids.len(),
            spec.ctx
        );
    }
    let load = |mode: CpuMatmul| -> Result<DecoderModel<CpuBackend>> {
        let dev = CpuBackend::new(spec.threads).with_cpu_matmul(mode);
        let m = DecoderModel::load(
            dev,
            files.config.clone(),
            files.tensors.as_ref(),
            WeightPrecision::Auto,
        )?;
        if m.backend().cpu_matmul() != mode {
            bail!(
                "this CPU has no {mode:?} matmul path (int8 needs AVX2; auto per product \
                 also needs DCPSERVE_CPU_MATMUL unset)"
            );
        }
        Ok(m)
    };
    let base = load(CpuMatmul::F32)?;
    let int8 = load(spec.against)?;
    let mut klds = Vec::new();
    let mut same_top1 = 0usize;
    for c in 0..n_chunks {
        let chunk = &ids[c * spec.ctx..(c + 1) * spec.ctx];
        let p = chunk_logprobs(&base, chunk, spec.step)?;
        let q = chunk_logprobs(&int8, chunk, spec.step)?;
        for pos in spec.ctx / 2..spec.ctx - 1 {
            let (lp, lq) = (&p[pos], &q[pos]);
            let kl: f64 = lp
                .iter()
                .zip(lq)
                .filter(|(a, _)| a.is_finite())
                .map(|(&a, &b)| (a as f64).exp() * (a as f64 - b as f64))
                .sum();
            klds.push(kl.max(0.0));
            same_top1 += usize::from(dcpserve_kernels::argmax(lp) == dcpserve_kernels::argmax(lq));
        }
    }
    let n = klds.len();
    let mean = klds.iter().sum::<f64>() / n as f64;
    klds.sort_by(f64::total_cmp);
    let p99 = klds[((n as f64 * 0.99) as usize).min(n - 1)];
    let max = klds[n - 1];
    Ok(format!(
        "{{\"positions\": {n}, \"mean_kld\": {mean:.6}, \"p99_kld\": {p99:.6}, \"max_kld\": {max:.6}, \
         \"same_top1\": {:.4}, \"cpu_isa\": \"{}\", \"int8_isa\": \"{:?}\"}}",
        same_top1 as f64 / n as f64,
        dcpserve_kernels::cpu::isa(),
        dcpserve_kernels::Int8Isa::detect()
            .ok_or_else(|| anyhow!("no int8 path on this CPU"))?
    ))
}

/// Log-probabilities of every position of one chunk, `step` tokens per forward pass
/// (f32 KV cache).
fn chunk_logprobs(
    model: &DecoderModel<CpuBackend>,
    ids: &[u32],
    step: usize,
) -> Result<Vec<Vec<f32>>> {
    let n = ids.len();
    let block = 16;
    let mut cache = model.new_kv_cache(n.div_ceil(block), block, KvCacheDType::F32)?;
    let table: Vec<u32> = (0..n.div_ceil(block) as u32).collect();
    let mut logprobs = Vec::with_capacity(n);
    for s in (0..n).step_by(step) {
        let e = (s + step).min(n);
        let positions: Vec<usize> = (s..e).collect();
        let kv_lens: Vec<u32> = (s as u32 + 1..=e as u32).collect();
        let rows: Vec<usize> = (0..e - s).collect();
        let out = model.forward(
            &RankComms::single(),
            &BatchInput {
                tokens: &ids[s..e],
                positions: &positions,
                token_seq: &vec![0; e - s],
                slots: &positions,
                kv_lens: &kv_lens,
                block_tables: &[table.as_slice()],
                logits_for: &rows,
            },
            &mut cache,
            &ForwardOptions::default(),
        )?;
        let v = out.vocab_size;
        logprobs.extend(
            rows.iter()
                .map(|r| log_softmax(&out.logits[r * v..(r + 1) * v])),
        );
    }
    Ok(logprobs)
}
