//! Results: one JSON file per run (a run is one `dcpserve bench` invocation, its sweep
//! points inside), the tables printed to the terminal, and reading a folder of runs back.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::args::{BenchServeArgs, DatasetName};
use super::scrape::ServerStats;
use super::stats::LatencySummary;

/// How many error messages a point keeps.
pub const KEPT_ERRORS: usize = 5;

/// The workload, as the flags described it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub dataset: DatasetName,
    pub num_prompts: usize,
    pub input_len: usize,
    pub output_len: usize,
    pub range_ratio: f64,
    pub prefix_len: usize,
    pub agentic_system_len: usize,
    pub agentic_context_len: usize,
    pub agentic_turns: usize,
    pub ignore_eos: bool,
    pub seed: u64,
}

/// One point of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointResult {
    /// Concurrency limit (None: unlimited).
    pub max_concurrency: Option<usize>,
    /// Arrivals per second (None: all at once).
    pub request_rate: Option<f64>,
    /// Most requests (sessions) in flight as the client saw it.
    pub max_in_flight: usize,
    pub summary: LatencySummary,
    pub server: ServerStats,
    pub error_count: usize,
    /// The first few error messages.
    pub errors: Vec<String>,
}

/// One run: the server, the workload and every point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub label: String,
    pub base_url: String,
    pub model: String,
    pub endpoint: String,
    /// Ranks the per-rank numbers divide by.
    pub num_ranks: usize,
    /// Seconds since the Unix epoch at the start of the run.
    pub started_at: u64,
    pub workload: Workload,
    pub points: Vec<PointResult>,
}

impl Workload {
    pub fn from_args(a: &BenchServeArgs) -> Self {
        Self {
            dataset: a.dataset_name,
            num_prompts: a.num_prompts,
            input_len: a.random_input_len,
            output_len: a.random_output_len,
            range_ratio: a.random_range_ratio,
            prefix_len: a.random_prefix_len,
            agentic_system_len: a.agentic_system_len,
            agentic_context_len: a.agentic_context_len,
            agentic_turns: a.agentic_turns,
            ignore_eos: a.ignore_eos,
            seed: a.seed,
        }
    }
}

/// Keeps letters, digits, `.`, `_` and `-` (a label becomes a file name).
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The default label: model, server address and workload, e.g.
/// `smollm2_127.0.0.1_8000-random-in128-out128`.
pub fn default_label(a: &BenchServeArgs, model: &str) -> String {
    let host = a
        .base_url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let data = match a.dataset_name {
        DatasetName::Random => {
            format!("random-in{}-out{}", a.random_input_len, a.random_output_len)
        }
        DatasetName::Agentic => format!(
            "agentic-ctx{}-turns{}",
            a.agentic_context_len, a.agentic_turns
        ),
        DatasetName::Trace => "trace".to_string(),
    };
    sanitize(&format!("{model}_{host}-{data}"))
}

/// Writes `run` as `DIR/<label>.json` (replacing an earlier run of that label).
pub fn write_run(dir: &Path, run: &RunResult) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{}.json", sanitize(&run.label)));
    std::fs::write(&path, serde_json::to_string_pretty(run)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Every run in `dir` (files that are not runs are skipped), ordered by label.
pub fn load_runs(dir: &Path) -> Result<Vec<RunResult>> {
    let mut runs = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            if let Ok(run) = std::fs::read_to_string(&path)
                .map_err(anyhow::Error::from)
                .and_then(|t| Ok(serde_json::from_str::<RunResult>(&t)?))
            {
                runs.push(run);
            }
        }
    }
    runs.sort_by(|a, b| a.label.cmp(&b.label));
    Ok(runs)
}

fn opt(v: Option<f64>, scale: f64, digits: usize) -> String {
    v.map_or("-".to_string(), |x| format!("{:.*}", digits, x * scale))
}

/// The header of the per-point table.
pub fn table_header() -> String {
    format!(
        "{:>6} {:>6} {:>6} {:>5} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>5}",
        "conc", "rate", "done", "err", "out tok/s", "tot tok/s", "tok/s/rk", "tok/s/u", "TTFT p50",
        "TTFT p99", "TPOT50", "ITL p99", "E2E p50", "KV max%", "KVavg%", "run", "pre"
    )
}

/// One line of the per-point table (latencies in ms).
pub fn table_row(p: &PointResult) -> String {
    let s = &p.summary;
    let conc = p.max_concurrency.map_or("inf".into(), |c| c.to_string());
    let rate = p.request_rate.map_or("inf".into(), |r| format!("{r:.1}"));
    format!(
        "{:>6} {:>6} {:>6} {:>5} {:>9.1} {:>9.1} {:>9.1} {:>8.1} {:>8.0} {:>8.0} {:>7.1} {:>7.1} {:>7.0} {:>7} {:>6} {:>6} {:>5}",
        conc,
        rate,
        s.completed,
        p.error_count,
        s.output_throughput,
        s.total_token_throughput,
        s.output_throughput_per_rank,
        s.tok_s_per_user,
        s.ttft_ms.p50,
        s.ttft_ms.p99,
        s.tpot_ms.p50,
        s.itl_ms.p99,
        s.e2el_ms.p50,
        opt(p.server.kv_usage_max, 100.0, 1),
        opt(p.server.kv_usage_mean, 100.0, 1),
        opt(p.server.running_max, 1.0, 0),
        opt(p.server.preemptions, 1.0, 0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_client::test_args;

    fn run(label: &str) -> RunResult {
        let a = test_args(&["--random-input-len", "64"]);
        RunResult {
            label: label.into(),
            base_url: a.base_url.clone(),
            model: "m".into(),
            endpoint: a.endpoint.clone(),
            num_ranks: 3,
            started_at: 1,
            workload: Workload::from_args(&a),
            points: vec![PointResult {
                max_concurrency: Some(8),
                request_rate: None,
                max_in_flight: 8,
                summary: LatencySummary {
                    completed: 16,
                    output_throughput: 123.5,
                    ..Default::default()
                },
                server: ServerStats {
                    kv_usage_max: Some(0.75),
                    preemptions: Some(2.0),
                    ..Default::default()
                },
                error_count: 1,
                errors: vec!["HTTP 500: x".into()],
            }],
        }
    }

    #[test]
    fn json_round_trip_through_a_folder() {
        let dir = std::env::temp_dir().join(format!("bench-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let b = run("b/run");
        let a = run("a");
        let path = write_run(&dir, &b).unwrap();
        assert_eq!(path.file_name().unwrap(), "b_run.json");
        write_run(&dir, &a).unwrap();
        std::fs::write(dir.join("other.json"), "{\"not\": \"a run\"}").unwrap();
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        let runs = load_runs(&dir).unwrap();
        assert_eq!(runs, vec![a, b]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn labels_are_file_names() {
        let a = test_args(&[
            "--base-url",
            "http://127.0.0.1:8000/",
            "--random-output-len",
            "32",
        ]);
        assert_eq!(
            default_label(&a, "smol/x"),
            "smol_x_127.0.0.1_8000-random-in1024-out32"
        );
    }

    #[test]
    fn table_row_shows_missing_as_dash() {
        let row = table_row(&run("a").points[0]);
        assert!(row.contains("123.5"), "{row}");
        assert!(row.contains("75.0"), "{row}");
        assert!(row.contains(" - "), "{row}");
    }
}
