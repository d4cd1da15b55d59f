//! The plan as a text table.

use std::fmt::Write;

use dcpserve_model::ModelConfig;

use super::dtype::KvDtype;
use super::hardware::Hardware;
use super::model_shape::describe;
use super::plan::{LayoutRow, PlanOptions};

/// `1234567` → `1,234,567`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

const HEADER: [&str; 13] = [
    "layout",
    "dp",
    "weights/rank",
    "KV B/token/rank",
    "KV tokens/rank",
    "KV tokens total",
    "max conc",
    "conc",
    "KV used",
    "read/step W+KV",
    "coll/step",
    "step ms",
    "tok/s/rank",
];

/// The header lines (model, machine, formats, workload, the roofline model) and the table.
pub fn render(cfg: &ModelConfig, hw: &Hardware, o: &PlanOptions, rows: &[LayoutRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "model:     {}", describe(cfg));
    let _ = writeln!(s, "hardware:  {}", hw.describe());
    let _ = writeln!(
        s,
        "formats:   weights {} (attention {}; embeddings, norms, router 16-bit), KV cache {}; block size {}, interleave {}, max-num-seqs {}",
        o.weight_dtype.name(),
        o.attention_dtype.name(),
        KvDtype::of(o.kv_cache_dtype()).name(),
        o.block_size,
        o.interleave,
        o.max_num_seqs
    );
    let _ = writeln!(
        s,
        "workload:  {} (median prompt {}, mean decode context {:.0}){}",
        o.workload.description,
        o.workload.median_input(),
        o.workload.mean_decode_context(),
        o.concurrency
            .map(|c| format!("; evaluated at concurrency {c}"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        s,
        "roofline:  step = max(FLOPs / peak, (weights read + KV shard read) / memory bw) + collective bytes / link bw + collectives × latency; tok/s/rank = running / step / tp"
    );
    let _ = writeln!(
        s,
        "           max conc = requests that fit at their final length (prompt + output, in blocks of block size × dcp); conc = requests the roofline runs (--concurrency, at most max conc); KV used = the share of the cache --concurrency needs (over 100%: the rest waits)"
    );
    let mut table: Vec<[String; 13]> = vec![HEADER.map(String::from)];
    let mut invalid = Vec::new();
    for row in rows {
        let name = format!("tp{} dcp{}", row.layout.tp, row.layout.dcp);
        match &row.outcome {
            Ok(e) => table.push([
                name,
                row.replicas.to_string(),
                format!("{:.2} GB", e.weight_bytes_per_rank / 1e9),
                thousands(e.capacity.bytes_per_token_per_rank),
                thousands(e.capacity.tokens_per_rank),
                thousands(e.capacity.tokens_total),
                thousands(e.max_concurrency),
                thousands(e.running),
                format!("{:.0}%", e.kv_fraction * 100.0),
                format!(
                    "{:.2}+{:.2} GB",
                    e.step.weight_bytes / 1e9,
                    e.step.kv_bytes / 1e9
                ),
                format!("{:.1} MB", e.step.collective_bytes / 1e6),
                format!("{:.2}", e.step.step_s * 1e3),
                format!("{:.0}", e.step.tokens_per_s_per_rank),
            ]),
            Err(msg) => invalid.push(format!("  {name}: {msg}")),
        }
    }
    let widths: Vec<usize> = (0..HEADER.len())
        .map(|c| {
            table
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let _ = writeln!(s);
    for r in &table {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, w))| {
                if c == 0 {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        let _ = writeln!(s, "{}", cells.join("  ").trim_end());
    }
    if !invalid.is_empty() {
        let _ = writeln!(s, "\nlayouts that cannot run:");
        for line in invalid {
            let _ = writeln!(s, "{line}");
        }
    }
    s
}
