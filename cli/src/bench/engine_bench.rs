//! `dcpserve bench-engine`: prefill and decode throughput of the engine on one model, in the
//! shapes llama-bench / llama-batched-bench measure, printed as one JSON line.

use std::time::Instant;

use anyhow::{bail, Result};
use futures::StreamExt;

use dcpserve::{Engine, GenerationEvent, SamplingParams};

/// What one bench run measures.
pub struct BenchSpec {
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    pub batch: usize,
    pub repeats: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A prompt of `n` ordinary token ids, different per `salt` so no cache can help.
fn synthetic_prompt(engine: &Engine, n: usize, salt: usize) -> Vec<u32> {
    let vocab = engine.files().config.vocab_size;
    // Skip the low ids, where special tokens live.
    let low = if vocab > 2000 { 1000 } else { 3 };
    (0..n)
        .map(|i| (low + (i * 7919 + salt * 104_729) % (vocab - low)) as u32)
        .collect()
}

fn greedy(max_tokens: usize) -> SamplingParams {
    let mut p = SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    };
    p.temperature = 0.0;
    p
}

/// Seconds from submission to the first token (a prefill of the whole prompt).
async fn prefill_once(engine: &Engine, prompt: Vec<u32>) -> Result<f64> {
    let t = Instant::now();
    let mut s = engine.generate_ids(prompt, greedy(1))?;
    while let Some(ev) = s.next().await {
        if let GenerationEvent::Token { .. } = ev? {
            return Ok(t.elapsed().as_secs_f64());
        }
    }
    bail!("no token produced")
}

/// Aggregate decode tokens/s of `batch` sequences generating `n` tokens each, timed from
/// the moment every sequence has its first token (prefill excluded).
pub(crate) async fn decode_once(
    engine: &Engine,
    batch: usize,
    prompt_len: usize,
    n: usize,
    salt: usize,
) -> Result<f64> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    let mut tasks = Vec::new();
    for b in 0..batch {
        let mut s = engine.generate_ids(
            synthetic_prompt(engine, prompt_len, salt * 1000 + b),
            greedy(n),
        )?;
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut count = 0usize;
            let mut first = None;
            while let Some(ev) = s.next().await {
                match ev? {
                    GenerationEvent::Token { .. } => {
                        count += 1;
                        if count == 1 {
                            first = Some(Instant::now());
                            let _ = tx.send((0, Instant::now()));
                        }
                    }
                    GenerationEvent::Finished { .. } => break,
                }
            }
            anyhow::Ok((count, first, Instant::now()))
        }));
    }
    drop(tx);
    // Decode timing starts once every sequence has produced its first token.
    let mut started = 0;
    let mut start = Instant::now();
    while let Some((_, at)) = rx.recv().await {
        started += 1;
        start = at;
        if started == batch {
            break;
        }
    }
    let mut tokens_after_start = 0usize;
    let mut end = start;
    for t in tasks {
        let (count, _first, finished) = t.await??;
        tokens_after_start += count.saturating_sub(1);
        end = end.max(finished);
    }
    Ok(tokens_after_start as f64 / (end - start).as_secs_f64())
}

/// Runs the three measurements and returns a JSON object as text.
pub async fn run(engine: &Engine, spec: &BenchSpec) -> Result<String> {
    // Warm-up: page in weights, grow scratch buffers.
    prefill_once(engine, synthetic_prompt(engine, 64, 999)).await?;
    let mut prefill = Vec::new();
    for r in 0..spec.repeats {
        let secs = prefill_once(engine, synthetic_prompt(engine, spec.prompt_tokens, r)).await?;
        prefill.push(spec.prompt_tokens as f64 / secs);
    }
    let mut decode1 = Vec::new();
    let mut decode_n = Vec::new();
    for r in 0..spec.repeats {
        decode1.push(decode_once(engine, 1, 16, spec.decode_tokens, 100 + r).await?);
        decode_n.push(decode_once(engine, spec.batch, 16, spec.decode_tokens, 200 + r).await?);
    }
    Ok(format!(
        "{{\"prefill_tok_s\": {:.1}, \"decode_1_tok_s\": {:.1}, \"decode_batch_tok_s\": {:.1}, \"batch\": {}, \"prompt_tokens\": {}, \"decode_tokens\": {}, \"repeats\": {}, \"cpu_isa\": \"{}\"}}",
        median(prefill),
        median(decode1),
        median(decode_n),
        spec.batch,
        spec.prompt_tokens,
        spec.decode_tokens,
        spec.repeats,
        dcpserve_kernels::cpu::isa()
    ))
}
