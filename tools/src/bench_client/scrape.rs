//! Reading a server's Prometheus `/metrics` during a point: KV-cache usage per rank,
//! running and waiting requests, preemptions. Knows our names (`dcpserve:`), vLLM's
//! (`vllm:`) and llama-server's (`llamacpp:`, with `--metrics`); missing series are fine.

use serde::{Deserialize, Serialize};

/// One sample of the text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses `{k="v",...}` (quoted values with `\\`, `\"`, `\n` escapes).
fn parse_labels(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while matches!(chars.peek(), Some(' ' | ',')) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                c => value.push(c),
            }
        }
        out.push((key.trim().to_string(), value));
    }
}

/// Samples of a text exposition; comments and malformed lines are skipped.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let Some(close) = line.rfind('}') else {
                    continue;
                };
                let Some(labels) = parse_labels(&line[open + 1..close]) else {
                    continue;
                };
                (&line[..open], labels, &line[close + 1..])
            }
            None => match line.split_once(char::is_whitespace) {
                Some((n, r)) => (n, Vec::new(), r),
                None => continue,
            },
        };
        // The value, then an optional timestamp.
        let Some(value) = rest.split_whitespace().next().and_then(parse_value) else {
            continue;
        };
        out.push(Sample {
            name: name.trim().to_string(),
            labels,
            value,
        });
    }
    out
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

const KV_USAGE: &[&str] = &[
    "dcpserve:kv_cache_usage_perc",
    "vllm:kv_cache_usage_perc",
    "llamacpp:kv_cache_usage_ratio",
];
const RUNNING: &[&str] = &[
    "dcpserve:num_requests_running",
    "vllm:num_requests_running",
    "llamacpp:requests_processing",
];
const WAITING: &[&str] = &[
    "dcpserve:num_requests_waiting",
    "vllm:num_requests_waiting",
    "llamacpp:requests_deferred",
];
const PREEMPTIONS: &[&str] = &[
    "dcpserve:num_preemptions_total",
    "vllm:num_preemptions_total",
];

/// The server's state at one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// KV-cache usage (fraction, 0..=1) per rank, ordered by the `rank` label.
    pub kv_usage: Vec<f64>,
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    /// Preemptions since the server started.
    pub preemptions: Option<f64>,
}

/// The series of `model` (samples without a `model_name` label count for every model).
pub fn snapshot(samples: &[Sample], model: &str) -> Snapshot {
    let of = |names: &[&str]| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|s| {
                names
                    .iter()
                    .any(|n| s.name == *n || s.name == format!("{n}_total"))
            })
            .filter(|s| s.label("model_name").is_none_or(|m| m == model))
            .collect()
    };
    let sum = |names: &[&str]| {
        let v = of(names);
        (!v.is_empty()).then(|| v.iter().map(|s| s.value).sum::<f64>())
    };
    let mut kv: Vec<(usize, f64)> = of(KV_USAGE)
        .iter()
        .map(|s| {
            let rank = s.label("rank").and_then(|r| r.parse().ok()).unwrap_or(0);
            (rank, s.value)
        })
        .collect();
    kv.sort_by_key(|&(r, _)| r);
    Snapshot {
        kv_usage: kv.into_iter().map(|(_, v)| v).collect(),
        running: sum(RUNNING),
        waiting: sum(WAITING),
        preemptions: sum(PREEMPTIONS),
    }
}

/// What the scrapes of one point add up to (absent where the server has no such series).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerStats {
    /// Scrapes that answered.
    pub scrapes: usize,
    /// Ranks seen in the KV-usage series.
    pub ranks: Option<usize>,
    /// Highest KV usage of any rank at any scrape (fraction).
    pub kv_usage_max: Option<f64>,
    /// Mean over scrapes of the mean over ranks.
    pub kv_usage_mean: Option<f64>,
    pub running_max: Option<f64>,
    pub waiting_max: Option<f64>,
    /// Preemptions during the point (last scrape minus first).
    pub preemptions: Option<f64>,
}

/// Folds snapshots into [`ServerStats`].
#[derive(Debug, Default)]
pub struct Accumulator {
    stats: ServerStats,
    kv_mean_sum: f64,
    kv_scrapes: usize,
    first_preemptions: Option<f64>,
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

impl Accumulator {
    pub fn add(&mut self, s: &Snapshot) {
        let st = &mut self.stats;
        st.scrapes += 1;
        if !s.kv_usage.is_empty() {
            let n = s.kv_usage.len();
            st.ranks = Some(st.ranks.unwrap_or(0).max(n));
            let max = s.kv_usage.iter().copied().fold(f64::MIN, f64::max);
            st.kv_usage_max = max_opt(st.kv_usage_max, Some(max));
            self.kv_mean_sum += s.kv_usage.iter().sum::<f64>() / n as f64;
            self.kv_scrapes += 1;
            st.kv_usage_mean = Some(self.kv_mean_sum / self.kv_scrapes as f64);
        }
        st.running_max = max_opt(st.running_max, s.running);
        st.waiting_max = max_opt(st.waiting_max, s.waiting);
        if let Some(p) = s.preemptions {
            let first = *self.first_preemptions.get_or_insert(p);
            st.preemptions = Some(p - first);
        }
    }

    pub fn finish(self) -> ServerStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = r#"# HELP dcpserve:kv_cache_usage_perc Fraction of virtual KV-cache blocks in use
# TYPE dcpserve:kv_cache_usage_perc gauge
dcpserve:kv_cache_usage_perc{model_name="smol",rank="1"} 0.5
dcpserve:kv_cache_usage_perc{model_name="smol",rank="0"} 0.25
dcpserve:kv_cache_usage_perc{model_name="other",rank="0"} 0.9
dcpserve:num_requests_running{model_name="smol"} 7
dcpserve:num_requests_waiting{model_name="smol"} 2
dcpserve:num_preemptions_total{model_name="smol"} 3
dcpserve:ttft_seconds_bucket{model_name="smol",le="+Inf"} 12
"#;

    #[test]
    fn parses_names_labels_and_values() {
        let s = parse_exposition(OURS);
        assert_eq!(s.len(), 7);
        assert_eq!(s[0].name, "dcpserve:kv_cache_usage_perc");
        assert_eq!(
            s[0].labels,
            vec![
                ("model_name".into(), "smol".into()),
                ("rank".into(), "1".into())
            ]
        );
        assert_eq!(s[0].value, 0.5);
        assert_eq!(s[6].labels[1].1, "+Inf");
    }

    #[test]
    fn escapes_timestamps_and_junk() {
        let s = parse_exposition(
            "a{x=\"q\\\"uo,te\",y=\"b\\\\s\"} 1.5 1700000000\nplain 2\nbroken{x=1} 3\nnovalue\nc NaN\n",
        );
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].labels[0].1, "q\"uo,te");
        assert_eq!(s[0].labels[1].1, "b\\s");
        assert_eq!((s[0].value, s[1].value), (1.5, 2.0));
        assert!(s[2].value.is_nan());
    }

    #[test]
    fn our_snapshot_by_model_and_rank() {
        let snap = snapshot(&parse_exposition(OURS), "smol");
        assert_eq!(snap.kv_usage, vec![0.25, 0.5]);
        assert_eq!((snap.running, snap.waiting), (Some(7.0), Some(2.0)));
        assert_eq!(snap.preemptions, Some(3.0));
    }

    #[test]
    fn llama_cpp_snapshot_without_preemptions() {
        let text = "llamacpp:kv_cache_usage_ratio 0.125\nllamacpp:requests_processing 4\nllamacpp:requests_deferred 0\n";
        let snap = snapshot(&parse_exposition(text), "anything");
        assert_eq!(snap.kv_usage, vec![0.125]);
        assert_eq!(
            (snap.running, snap.waiting, snap.preemptions),
            (Some(4.0), Some(0.0), None)
        );
    }

    #[test]
    fn accumulates_max_mean_and_preemption_delta() {
        let mut acc = Accumulator::default();
        let snap = |kv: Vec<f64>, running, pre| Snapshot {
            kv_usage: kv,
            running: Some(running),
            waiting: None,
            preemptions: Some(pre),
        };
        acc.add(&snap(vec![0.2, 0.4], 3.0, 10.0));
        acc.add(&snap(vec![0.6, 0.8], 5.0, 14.0));
        acc.add(&Snapshot::default());
        let s = acc.finish();
        assert_eq!(s.scrapes, 3);
        assert_eq!(s.ranks, Some(2));
        assert_eq!(s.kv_usage_max, Some(0.8));
        assert!((s.kv_usage_mean.unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(s.running_max, Some(5.0));
        assert_eq!(s.waiting_max, None);
        assert_eq!(s.preemptions, Some(4.0));
    }
}
