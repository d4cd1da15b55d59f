//! Workloads: random requests, agentic multi-turn sessions, JSONL traces, and the arrival
//! schedule. Everything is drawn from one seeded generator, so equal flags give equal
//! workloads on every server.

use std::path::Path;

use anyhow::{bail, Context, Result};
use dcpserve_kernels::Rng;

use super::args::{BenchServeArgs, DatasetName};

/// Who says a piece of a conversation (the chat API keeps roles; completions concatenate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

/// A piece of a prompt: token ids, or text as given by a trace.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    Ids(Vec<u32>),
    Text(String),
}

/// One message of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub role: Role,
    pub content: Content,
}

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    pub segments: Vec<Segment>,
    /// Planned prompt tokens (0 when the prompt is trace text of unknown length).
    pub input_len: usize,
    /// Tokens to generate (`max_tokens`).
    pub output_len: usize,
}

/// A unit of work: one request, or the turns of a session, sent one after the other.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub requests: Vec<RequestSpec>,
    /// Seconds after the start at which a trace says the job arrives.
    pub timestamp: Option<f64>,
}

/// Fixed words of text prompts: common English words, about one token each in the usual
/// BPE vocabularies.
pub const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "year",
    "way", "day", "man", "thing", "world", "life", "hand", "part", "child", "eye", "place", "work",
    "week", "case", "point", "number", "group", "problem", "fact", "water", "city", "house",
    "state", "river", "music", "light", "paper", "table", "window", "garden", "story",
];

/// Uniform integer in [lo, hi].
fn uniform(rng: &mut Rng, lo: usize, hi: usize) -> usize {
    lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize
}

/// A length drawn from [⌊L·(1−r)⌋, ⌈L·(1+r)⌉] (vLLM's random dataset), at least `min`.
pub fn draw_len(rng: &mut Rng, len: usize, ratio: f64, min: usize) -> usize {
    let lo = ((len as f64) * (1.0 - ratio)).floor() as usize;
    let hi = ((len as f64) * (1.0 + ratio)).ceil() as usize;
    uniform(rng, lo.max(min), hi.max(min))
}

/// Builds prompts from the flags.
pub struct Generator<'a> {
    args: &'a BenchServeArgs,
    rng: Rng,
}

impl<'a> Generator<'a> {
    pub fn new(args: &'a BenchServeArgs) -> Self {
        Self {
            args,
            rng: Rng::new(args.seed),
        }
    }

    fn ids(&mut self, n: usize) -> Vec<u32> {
        let (lo, hi) = (self.args.token_id_min, self.args.token_id_max);
        (0..n)
            .map(|_| lo + (self.rng.next_u64() % u64::from(hi - lo)) as u32)
            .collect()
    }

    fn segment(&mut self, role: Role, n: usize) -> Segment {
        Segment {
            role,
            content: Content::Ids(self.ids(n)),
        }
    }

    fn input_len(&mut self) -> usize {
        let a = self.args;
        draw_len(&mut self.rng, a.random_input_len, a.random_range_ratio, 1)
    }

    fn output_len(&mut self) -> usize {
        let a = self.args;
        draw_len(&mut self.rng, a.random_output_len, a.random_range_ratio, 1)
    }

    /// `num_prompts` independent requests, all starting with the same random prefix.
    pub fn random(&mut self) -> Vec<Job> {
        let prefix = self.segment(Role::System, self.args.random_prefix_len);
        (0..self.args.num_prompts)
            .map(|_| {
                let n = self.input_len();
                let output_len = self.output_len();
                let mut segments = vec![prefix.clone()];
                segments.push(self.segment(Role::User, n));
                Job {
                    requests: vec![RequestSpec {
                        segments,
                        input_len: self.args.random_prefix_len + n,
                        output_len,
                    }],
                    timestamp: None,
                }
            })
            .collect()
    }

    /// Sessions of `agentic_turns` turns (enough sessions for `num_prompts` requests). Turn
    /// t's prompt is the shared system prefix, the session's context, and the turns before
    /// it (user message, then a stand-in reply as long as that turn's output, so prompts do
    /// not depend on what the server generated), then the new user message.
    pub fn agentic(&mut self) -> Vec<Job> {
        let a = self.args;
        let sessions = a.num_prompts.div_ceil(a.agentic_turns).max(1);
        let system = self.segment(Role::System, a.agentic_system_len);
        (0..sessions)
            .map(|_| {
                let context = self.segment(Role::System, a.agentic_context_len);
                let mut history = vec![system.clone(), context];
                let mut history_len = a.agentic_system_len + a.agentic_context_len;
                let mut requests = Vec::with_capacity(a.agentic_turns);
                for _ in 0..a.agentic_turns {
                    let n = self.input_len();
                    let output_len = self.output_len();
                    history.push(self.segment(Role::User, n));
                    history_len += n;
                    requests.push(RequestSpec {
                        segments: history.clone(),
                        input_len: history_len,
                        output_len,
                    });
                    history.push(self.segment(Role::Assistant, output_len));
                    history_len += output_len;
                }
                Job {
                    requests,
                    timestamp: None,
                }
            })
            .collect()
    }

    /// Requests of a JSONL trace: `prompt` (text) or `input_len` (random ids), optional
    /// `output_len` (default `--random-output-len`) and `timestamp` (seconds; made relative
    /// to the first line's). Only the first `num_prompts` lines are used.
    pub fn trace(&mut self, text: &str) -> Result<Vec<Job>> {
        let mut jobs = Vec::new();
        let mut first_ts = None;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            if jobs.len() == self.args.num_prompts {
                break;
            }
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("trace line {}: not JSON", i + 1))?;
            let uint = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
            let (content, input_len) = match (v.get("prompt"), uint("input_len")) {
                (Some(serde_json::Value::String(p)), _) => (Content::Text(p.clone()), 0),
                (_, Some(n)) => (Content::Ids(self.ids(n as usize)), n as usize),
                _ => bail!(
                    "trace line {}: needs `prompt` (string) or `input_len`",
                    i + 1
                ),
            };
            let output_len = uint("output_len")
                .map(|n| n as usize)
                .unwrap_or(self.args.random_output_len);
            let timestamp = v.get("timestamp").and_then(serde_json::Value::as_f64);
            let t0 = *first_ts.get_or_insert(timestamp.unwrap_or(0.0));
            jobs.push(Job {
                requests: vec![RequestSpec {
                    segments: vec![Segment {
                        role: Role::User,
                        content,
                    }],
                    input_len,
                    output_len,
                }],
                timestamp: timestamp.map(|t| (t - t0).max(0.0)),
            });
        }
        if jobs.is_empty() {
            bail!("the trace has no requests");
        }
        Ok(jobs)
    }
}

/// The workload the flags describe.
pub fn build(args: &BenchServeArgs) -> Result<Vec<Job>> {
    let mut g = Generator::new(args);
    match args.dataset_name {
        DatasetName::Random => Ok(g.random()),
        DatasetName::Agentic => Ok(g.agentic()),
        DatasetName::Trace => {
            let path = args.dataset_path.as_deref().unwrap_or(Path::new(""));
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            g.trace(&text)
        }
    }
}

/// Start offsets (seconds) of `n` jobs arriving as a Poisson process of `rate` per second
/// (exponential gaps); all zero for an infinite rate.
pub fn poisson_offsets(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    if rate.is_infinite() {
        return vec![0.0; n];
    }
    let mut rng = Rng::new(seed ^ 0x5EED_A441);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            let at = t;
            let u = f64::from(rng.next_f32()).min(1.0 - 1e-7);
            t += -(1.0 - u).ln() / rate;
            at
        })
        .collect()
}

/// Text of token ids: one fixed word per id.
pub fn words_of(ids: &[u32]) -> String {
    ids.iter()
        .map(|&id| WORDS[id as usize % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

impl Content {
    /// The content as text (ids become words).
    pub fn to_text(&self) -> String {
        match self {
            Content::Ids(ids) => words_of(ids),
            Content::Text(t) => t.clone(),
        }
    }
}

#[cfg(test)]
#[path = "dataset_tests.rs"]
mod tests;
