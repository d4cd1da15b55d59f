//! `dcpserve bench-spec`: decode speed with n-gram speculation against plain decoding on
//! workloads that repeat their context (code editing, quoting), and one that does not.
//! Both engines run in the same process, alternately, on the same prompts; the output is
//! identical (greedy), so tokens per second compare directly.

use std::time::Instant;

use anyhow::{bail, Result};
use futures::StreamExt;

use dcpserve::{ChatMessage, Engine, EngineConfig, GenerationEvent, Prompt, SamplingParams};

/// A named prompt.
pub struct Workload {
    pub name: &'static str,
    pub prompt: String,
}

/// The built-in workloads.
pub fn workloads() -> Vec<Workload> {
    let code = r#"def summarize(orders):
    total = 0
    count = 0
    largest = None
    for order in orders:
        if order.status != "paid":
            continue
        total += order.amount
        count += 1
        if largest is None or order.amount > largest.amount:
            largest = order
    average = total / count if count else 0
    return {"total": total, "count": count, "average": average, "largest": largest}"#;
    let text = "The committee met on Tuesday to review the budget. It approved the road repairs \
                and postponed the library expansion until spring. Members asked the treasurer \
                for a report on water costs. The next meeting will be held on the first Monday \
                of the month.";
    vec![
        Workload {
            name: "code editing",
            prompt: format!(
                "Rename the variable `total` to `revenue` in this Python function and print the whole function:\n\n{code}"
            ),
        },
        Workload {
            name: "quoting",
            prompt: format!(
                "Repeat the following text word for word, then add one sentence that summarizes it.\n\n{text}"
            ),
        },
        Workload {
            name: "free writing (control)",
            prompt: "Write a short story about a lighthouse keeper who finds a map.".into(),
        },
    ]
}

/// What one engine did on one workload.
#[derive(Debug, Clone, Copy)]
struct Measured {
    tokens: usize,
    tok_per_s: f64,
    drafts: u64,
    drafted: u64,
    accepted: u64,
}

async fn decode(engine: &Engine, prompt: &str, max_tokens: usize) -> Result<Measured> {
    let before = engine.stats().await?.speculation;
    let mut params = SamplingParams {
        max_tokens,
        ..Default::default()
    };
    params.temperature = 0.0;
    let chat = Prompt::Chat(vec![ChatMessage {
        role: "user".into(),
        content: prompt.into(),
    }]);
    let mut s = engine.generate(chat, params)?;
    let (mut first, mut n) = (None, 0usize);
    while let Some(ev) = s.next().await {
        match ev? {
            GenerationEvent::Token { .. } => {
                n += 1;
                first.get_or_insert_with(Instant::now);
            }
            GenerationEvent::Finished { .. } => break,
        }
    }
    let Some(first) = first.filter(|_| n > 1) else {
        bail!("the model stopped after {n} token(s)");
    };
    let after = engine.stats().await?.speculation;
    Ok(Measured {
        tokens: n,
        // Decode only: the first token's prefill is excluded.
        tok_per_s: (n - 1) as f64 / first.elapsed().as_secs_f64(),
        drafts: after.num_drafts - before.num_drafts,
        drafted: after.num_draft_tokens - before.num_draft_tokens,
        accepted: after.num_accepted_tokens - before.num_accepted_tokens,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs every workload `repeats` times on a plain and a speculating engine and returns
/// the table.
pub async fn run(
    model: &std::path::Path,
    base: EngineConfig,
    speculative: dcpserve::SpeculativeConfig,
    max_tokens: usize,
    repeats: usize,
) -> Result<String> {
    let plain = Engine::builder(model).config(base.clone()).build().await?;
    let spec = Engine::builder(model)
        .config(EngineConfig {
            speculative: Some(speculative.clone()),
            ..base
        })
        .build()
        .await?;
    let mut out = format!(
        "speculative config: {}\n{:<24} {:>7} {:>11} {:>11} {:>7} {:>11} {:>10}\n",
        serde_json::to_string(&speculative)?,
        "workload",
        "tokens",
        "plain tok/s",
        "ngram tok/s",
        "ratio",
        "accept len",
        "accepted"
    );
    for w in workloads() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut last = None;
        let (mut drafts, mut drafted, mut accepted) = (0, 0, 0);
        // Warm-up of both (page faults, prefix cache), then alternate.
        decode(&plain, &w.prompt, max_tokens).await?;
        decode(&spec, &w.prompt, max_tokens).await?;
        for _ in 0..repeats.max(1) {
            let p = decode(&plain, &w.prompt, max_tokens).await?;
            let s = decode(&spec, &w.prompt, max_tokens).await?;
            if p.tokens != s.tokens {
                bail!(
                    "{}: {} tokens without speculation, {} with: greedy outputs must match",
                    w.name,
                    p.tokens,
                    s.tokens
                );
            }
            a.push(p.tok_per_s);
            b.push(s.tok_per_s);
            drafts += s.drafts;
            drafted += s.drafted;
            accepted += s.accepted;
            last = Some(s.tokens);
        }
        let (pa, sb) = (median(a), median(b));
        // Mean tokens emitted per verification step that had a draft.
        let accept_len = if drafts > 0 {
            format!("{:.2}", 1.0 + accepted as f64 / drafts as f64)
        } else {
            "-".into()
        };
        let rate = if drafted > 0 {
            format!("{:.0}%", 100.0 * accepted as f64 / drafted as f64)
        } else {
            "-".into()
        };
        out += &format!(
            "{:<24} {:>7} {:>11.1} {:>11.1} {:>7.2} {:>11} {:>10}\n",
            w.name,
            last.unwrap_or(0),
            pa,
            sb,
            sb / pa,
            accept_len,
            rate
        );
    }
    Ok(out)
}
