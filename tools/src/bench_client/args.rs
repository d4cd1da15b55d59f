//! Command-line flags of `dcpserve bench`, named as `vllm bench serve` names them where the
//! two overlap.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

/// Which workload to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetName {
    /// Independent requests of fixed or uniformly distributed lengths.
    Random,
    /// Multi-turn sessions: a long per-session context, each turn appends to the history.
    Agentic,
    /// Requests read from a JSONL file.
    Trace,
}

/// Flags of `dcpserve bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchServeArgs {
    /// The server, e.g. http://127.0.0.1:8000.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    /// API path: /v1/completions or /v1/chat/completions.
    #[arg(long, default_value = "/v1/completions")]
    pub endpoint: String,
    /// Model name sent in each request (default: the first one /v1/models lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer token sent as `Authorization`.
    #[arg(long)]
    pub api_key: Option<String>,

    /// Workload.
    #[arg(long, value_enum, default_value = "random")]
    pub dataset_name: DatasetName,
    /// JSONL trace for `--dataset-name trace`: one object a line with `prompt` or
    /// `input_len`, and optional `output_len` and `timestamp` (seconds).
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// Requests per benchmark point (agentic: turns summed over sessions).
    #[arg(long, default_value_t = 200)]
    pub num_prompts: usize,
    /// Scale the requests with the concurrency: each point sends
    /// max(--num-prompts, K × its concurrency) requests (agentic: turns).
    #[arg(long, value_name = "K")]
    pub prompts_per_concurrency: Option<usize>,
    /// Input tokens per request (random) or per turn (agentic: the user message).
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: usize,
    /// Output tokens per request or turn.
    #[arg(long, default_value_t = 128)]
    pub random_output_len: usize,
    /// Lengths are drawn uniformly from [L·(1−R), L·(1+R)].
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Tokens of a prefix every random request shares.
    #[arg(long, default_value_t = 0)]
    pub random_prefix_len: usize,
    /// Agentic: tokens of the system prefix shared by all sessions.
    #[arg(long, default_value_t = 0)]
    pub agentic_system_len: usize,
    /// Agentic: tokens of each session's own long context (documents, repository, ...).
    #[arg(long, default_value_t = 2048)]
    pub agentic_context_len: usize,
    /// Agentic: turns per session.
    #[arg(long, default_value_t = 4)]
    pub agentic_turns: usize,
    /// Smallest token id of random prompts (skips special tokens).
    #[arg(long, default_value_t = 1000)]
    pub token_id_min: u32,
    /// One past the largest token id of random prompts (at most the vocabulary size).
    #[arg(long, default_value_t = 20000)]
    pub token_id_max: u32,
    /// Send prompts as text (random words) instead of token ids; always text for chat.
    #[arg(long)]
    pub text_prompts: bool,

    /// Closed-loop sweep: most requests (agentic: sessions) in flight, e.g. 1,8,32.
    #[arg(long, value_delimiter = ',')]
    pub max_concurrency: Vec<usize>,
    /// Open-loop arrivals per second (Poisson), a comma-separated list; `inf` sends all
    /// at once.
    #[arg(long, value_delimiter = ',', default_value = "inf")]
    pub request_rate: Vec<String>,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Ask the server to ignore end-of-sequence so each request makes exactly its output length.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Constrain every request to this JSON schema (`response_format` of type
    /// `json_schema`): the schema's JSON text, or `@PATH` of a file holding it. Measures
    /// what structured outputs cost.
    #[arg(long, value_name = "SCHEMA")]
    pub json_schema: Option<String>,
    /// Seed of the workload (prompts, lengths, arrival times).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Seconds before a request is abandoned as an error.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
    /// Requests sent (and not measured) before each point.
    #[arg(long, default_value_t = 0)]
    pub num_warmups: usize,

    /// Ranks serving the model, to report per-rank throughput (default: the number of
    /// `rank` labels in the server's KV-usage metric, else 1).
    #[arg(long)]
    pub num_ranks: Option<usize>,
    /// Seconds between two scrapes of /metrics during a point.
    #[arg(long, default_value_t = 0.5)]
    pub metrics_interval: f64,

    /// Folder of the JSON results and plots (nothing is written without it).
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
    /// Name of this run in the result folder and the plots' legends.
    #[arg(long)]
    pub label: Option<String>,
    /// Only redraw the plots of the runs already in --result-dir (no requests are sent).
    #[arg(long)]
    pub replot: bool,
    /// Do not draw the plots.
    #[arg(long)]
    pub no_plots: bool,
    /// Hide the progress bar.
    #[arg(long)]
    pub disable_tqdm: bool,
}

/// One point of the sweep: a concurrency limit and an arrival rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepPoint {
    /// Most requests in flight (None: unlimited).
    pub max_concurrency: Option<usize>,
    /// Arrivals per second (infinite: all at once).
    pub request_rate: f64,
}

/// Parses a request rate: a positive number or `inf`.
pub fn parse_rate(s: &str) -> Result<f64> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("inf") {
        return Ok(f64::INFINITY);
    }
    let r: f64 = s
        .parse()
        .with_context(|| format!("--request-rate {s:?}: not a number or `inf`"))?;
    if r.is_nan() || r <= 0.0 {
        bail!("--request-rate must be positive, got {s}");
    }
    Ok(r)
}

impl BenchServeArgs {
    /// The sweep: every concurrency (or unlimited) crossed with every rate.
    pub fn sweep(&self) -> Result<Vec<SweepPoint>> {
        let rates = self
            .request_rate
            .iter()
            .map(|s| parse_rate(s))
            .collect::<Result<Vec<_>>>()?;
        let limits: Vec<Option<usize>> = if self.max_concurrency.is_empty() {
            vec![None]
        } else {
            self.max_concurrency.iter().map(|&c| Some(c)).collect()
        };
        if limits.contains(&Some(0)) {
            bail!("--max-concurrency values must be at least 1");
        }
        let mut out = Vec::new();
        for &max_concurrency in &limits {
            for &request_rate in &rates {
                out.push(SweepPoint {
                    max_concurrency,
                    request_rate,
                });
            }
        }
        Ok(out)
    }

    /// Requests of a point at `max_concurrency`.
    pub fn prompts_for(&self, max_concurrency: Option<usize>) -> usize {
        match (self.prompts_per_concurrency, max_concurrency) {
            (Some(k), Some(c)) => self.num_prompts.max(k * c),
            _ => self.num_prompts,
        }
    }

    /// Whether the endpoint is the chat API.
    pub fn is_chat(&self) -> bool {
        self.endpoint.contains("chat")
    }

    /// Checks flags that clap cannot.
    pub fn validate(&self) -> Result<()> {
        if self.dataset_name == DatasetName::Trace && self.dataset_path.is_none() {
            bail!("--dataset-name trace needs --dataset-path");
        }
        if !(0.0..=1.0).contains(&self.random_range_ratio) {
            bail!("--random-range-ratio must be in [0, 1]");
        }
        if self.token_id_min >= self.token_id_max {
            bail!("--token-id-min must be below --token-id-max");
        }
        if self.agentic_turns == 0 {
            bail!("--agentic-turns must be at least 1");
        }
        for (name, v) in [
            ("--metrics-interval", self.metrics_interval),
            ("--request-timeout", self.request_timeout),
        ] {
            if v.is_nan() || v <= 0.0 || v.is_infinite() {
                bail!("{name} must be a positive number of seconds");
            }
        }
        self.sweep().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_client::test_args as parse;

    #[test]
    fn concurrency_list_crossed_with_rates() {
        let a = parse(&["--max-concurrency", "1,8", "--request-rate", "2,inf"]);
        let s = a.sweep().unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].max_concurrency, Some(1));
        assert_eq!(s[0].request_rate, 2.0);
        assert!(s[1].request_rate.is_infinite());
        assert_eq!(s[3].max_concurrency, Some(8));
    }

    #[test]
    fn default_is_one_unlimited_burst() {
        let s = parse(&[]).sweep().unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].max_concurrency, None);
        assert!(s[0].request_rate.is_infinite());
    }

    #[test]
    fn prompts_scale_with_concurrency_when_asked() {
        let a = parse(&["--num-prompts", "8", "--prompts-per-concurrency", "2"]);
        assert_eq!(a.prompts_for(Some(1)), 8);
        assert_eq!(a.prompts_for(Some(32)), 64);
        assert_eq!(a.prompts_for(None), 8);
        assert_eq!(parse(&["--num-prompts", "8"]).prompts_for(Some(32)), 8);
    }

    #[test]
    fn bad_rates_and_limits_are_refused() {
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("-1").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse(&["--max-concurrency", "0"]).validate().is_err());
        assert!(parse(&["--dataset-name", "trace"]).validate().is_err());
        assert!(parse(&["--random-range-ratio", "1.5"]).validate().is_err());
    }
}
