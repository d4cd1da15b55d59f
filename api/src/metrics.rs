//! Prometheus metrics through the `metrics` facade, named after vLLM's (`vllm:` becomes
//! `dcpserve:`) and labelled by `model_name` (and `rank` where it applies).
//!
//! Per-request metrics are recorded as requests run; the scheduler's gauges (running,
//! waiting, KV usage, preemptions) are read from each model when `/metrics` is rendered,
//! so an idle server costs nothing.

use std::sync::{Arc, OnceLock};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::backend::BackendStats;

pub const RUNNING: &str = "dcpserve:num_requests_running";
pub const WAITING: &str = "dcpserve:num_requests_waiting";
pub const OUTSTANDING: &str = "dcpserve:num_requests_admitted";
pub const REJECTED: &str = "dcpserve:num_requests_rejected_total";
pub const KV_USAGE: &str = "dcpserve:kv_cache_usage_perc";
pub const PREEMPTIONS: &str = "dcpserve:num_preemptions_total";
pub const PREFIX_HIT_RATE: &str = "dcpserve:prefix_cache_hit_rate";
pub const COLLECTIVES: &str = "dcpserve:time_in_collectives_seconds";
pub const SUCCESS: &str = "dcpserve:request_success_total";
pub const PROMPT_TOKENS: &str = "dcpserve:prompt_tokens_total";
pub const GENERATION_TOKENS: &str = "dcpserve:generation_tokens_total";
pub const TTFT: &str = "dcpserve:time_to_first_token_seconds";
pub const ITL: &str = "dcpserve:inter_token_latency_seconds";
pub const E2E: &str = "dcpserve:e2e_request_latency_seconds";
pub const SPEC_DRAFTS: &str = "dcpserve:spec_decode_num_drafts_total";
pub const SPEC_DRAFT_TOKENS: &str = "dcpserve:spec_decode_num_draft_tokens_total";
pub const SPEC_ACCEPTED_TOKENS: &str = "dcpserve:spec_decode_num_accepted_tokens_total";
pub const SPEC_ACCEPTANCE: &str = "dcpserve:spec_decode_drafts_by_accepted_tokens_total";

/// Latency buckets in seconds (vLLM's, trimmed).
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder once per process and returns its handle; later calls
/// (several servers in one test process) share it.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = || {
                PrometheusBuilder::new()
                    .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
                    .expect("non-empty buckets")
            };
            let handle = match builder().install_recorder() {
                Ok(h) => h,
                Err(e) => {
                    // Someone else installed a global recorder: keep a private one so that
                    // `/metrics` still renders (our series then stay empty).
                    tracing::warn!("metrics recorder not installed: {e}");
                    builder().build_recorder().handle()
                }
            };
            describe();
            handle
        })
        .clone()
}

fn describe() {
    describe_gauge!(RUNNING, "Sequences in the running batch.");
    describe_gauge!(WAITING, "Sequences waiting to be scheduled.");
    describe_gauge!(
        OUTSTANDING,
        "Sequences admitted by the HTTP layer and not yet finished."
    );
    describe_counter!(REJECTED, "Requests refused because the queue was full.");
    describe_gauge!(
        KV_USAGE,
        "Fraction of virtual KV-cache blocks in use (1 = full), per rank; block tables are \
         global, so it is the same on every rank."
    );
    describe_counter!(PREEMPTIONS, "Sequences preempted (recomputed later).");
    describe_gauge!(
        PREFIX_HIT_RATE,
        "Share of prompt tokens served from the prefix cache."
    );
    describe_gauge!(
        COLLECTIVES,
        "Seconds spent in collectives since start, per rank."
    );
    describe_counter!(
        SUCCESS,
        "Finished requests (each prompt with its n choices counts once) by finish reason."
    );
    describe_counter!(
        PROMPT_TOKENS,
        "Prompt tokens of finished requests (once per request)."
    );
    describe_counter!(
        GENERATION_TOKENS,
        "Generated tokens, summed over all choices."
    );
    describe_counter!(
        SPEC_DRAFTS,
        "Speculative verification steps with draft tokens."
    );
    describe_counter!(SPEC_DRAFT_TOKENS, "Draft tokens proposed and verified.");
    describe_counter!(SPEC_ACCEPTED_TOKENS, "Draft tokens accepted.");
    describe_counter!(
        SPEC_ACCEPTANCE,
        "Drafts by how many of their tokens were accepted (label accepted_tokens): the acceptance-length histogram."
    );
    describe_histogram!(TTFT, "Seconds from arrival to the first token.");
    describe_histogram!(ITL, "Seconds between consecutive tokens of a sequence.");
    describe_histogram!(E2E, "Seconds from arrival to the last token.");
}

/// A request refused with 429.
pub fn rejected(model: &str) {
    counter!(REJECTED, "model_name" => model.to_string()).increment(1);
}

/// Sequences admitted for `model`.
pub fn set_outstanding(model: &str, n: usize) {
    gauge!(OUTSTANDING, "model_name" => model.to_string()).set(n as f64);
}

/// Accounting of one request: one prompt and the `n` choices generated from it. Its prompt
/// tokens, the finished request and its end-to-end latency are recorded once (as vLLM counts
/// requests), when the last of its choices' [`SequenceTimer`]s is gone.
pub struct RequestTimer {
    state: std::sync::Mutex<RequestState>,
}

struct RequestState {
    model: String,
    start: std::time::Instant,
    prompt_tokens: usize,
    /// The request's reason so far: the most severe of its choices' reasons.
    reason: Option<&'static str>,
    /// When the last choice so far ended.
    ended: Option<std::time::Instant>,
}

/// Order of the finish reasons when choices of one request end differently: the request
/// reports the most severe one.
fn severity(reason: &str) -> u8 {
    match reason {
        "stop" => 0,
        "length" => 1,
        "abort" => 2,
        _ => 3,
    }
}

impl RequestTimer {
    /// Starts timing a request of `prompt_tokens` tokens at its arrival.
    pub fn new(model: &str, arrival: std::time::Instant, prompt_tokens: usize) -> Arc<Self> {
        Arc::new(Self {
            state: std::sync::Mutex::new(RequestState {
                model: model.to_string(),
                start: arrival,
                prompt_tokens,
                reason: None,
                ended: None,
            }),
        })
    }

    fn choice_finished(&self, reason: &'static str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.reason.is_none_or(|r| severity(reason) > severity(r)) {
            s.reason = Some(reason);
        }
        s.ended = Some(std::time::Instant::now());
    }
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let m = s.model.clone();
        // A request whose choices never ran (one failed to start) counts as aborted.
        let reason = s.reason.unwrap_or("abort");
        let ended = s.ended.unwrap_or_else(std::time::Instant::now);
        counter!(SUCCESS, "model_name" => m.clone(), "finished_reason" => reason).increment(1);
        counter!(PROMPT_TOKENS, "model_name" => m.clone()).increment(s.prompt_tokens as u64);
        histogram!(E2E, "model_name" => m).record((ended - s.start).as_secs_f64());
    }
}

/// Latency and token accounting of one sequence (one choice); the request it belongs to is
/// accounted by the shared [`RequestTimer`].
pub struct SequenceTimer {
    model: String,
    start: std::time::Instant,
    last: Option<std::time::Instant>,
    tokens: u64,
    request: Arc<RequestTimer>,
    finished: bool,
}

impl SequenceTimer {
    /// Starts timing a choice of `request` (timed from the request's arrival).
    pub fn new(request: Arc<RequestTimer>) -> Self {
        let (model, start) = {
            let s = request.state.lock().unwrap_or_else(|e| e.into_inner());
            (s.model.clone(), s.start)
        };
        Self {
            model,
            start,
            last: None,
            tokens: 0,
            request,
            finished: false,
        }
    }

    /// A token arrived.
    pub fn token(&mut self) {
        let now = std::time::Instant::now();
        match self.last {
            None => histogram!(TTFT, "model_name" => self.model.clone())
                .record((now - self.start).as_secs_f64()),
            Some(prev) => histogram!(ITL, "model_name" => self.model.clone())
                .record((now - prev).as_secs_f64()),
        }
        self.last = Some(now);
        self.tokens += 1;
    }

    /// The sequence ended with `reason` (`stop`, `length`, `abort`, `error`); later calls are
    /// ignored. Generation tokens count per choice; the request counts once, in
    /// [`RequestTimer`].
    pub fn finish(&mut self, reason: &'static str) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        counter!(GENERATION_TOKENS, "model_name" => self.model.clone()).increment(self.tokens);
        self.request.choice_finished(reason);
    }
}

/// One model's numbers at `/metrics` time: what its backend reports and how many of its
/// sequences are admitted. The router collects these (the router depends on this module,
/// so this module takes plain data rather than the router itself).
#[derive(Debug, Clone)]
pub struct ModelSample {
    /// The model's served name (the `model_name` label).
    pub name: String,
    /// Its backend's counters.
    pub stats: BackendStats,
    /// Sequences admitted for it.
    pub outstanding: usize,
}

/// Writes every model's counters into the gauges, then renders the text exposition.
pub fn render(models: &[ModelSample]) -> String {
    let handle = install();
    for sample in models {
        let s = &sample.stats;
        let m = sample.name.clone();
        gauge!(RUNNING, "model_name" => m.clone()).set(s.running as f64);
        gauge!(WAITING, "model_name" => m.clone()).set(s.waiting as f64);
        for (rank, u) in s.kv_cache_usage.iter().enumerate() {
            gauge!(KV_USAGE, "model_name" => m.clone(), "rank" => rank.to_string()).set(*u);
        }
        counter!(PREEMPTIONS, "model_name" => m.clone()).absolute(s.preemptions);
        if let Some(h) = s.prefix_cache_hit_rate {
            gauge!(PREFIX_HIT_RATE, "model_name" => m.clone()).set(h);
        }
        for (rank, secs) in s.collective_seconds.iter().enumerate() {
            // `metrics` counters are integers: a running total in seconds is a gauge.
            gauge!(COLLECTIVES, "model_name" => m.clone(), "rank" => rank.to_string()).set(*secs);
        }
        if let Some(sp) = &s.speculation {
            counter!(SPEC_DRAFTS, "model_name" => m.clone()).absolute(sp.num_drafts);
            counter!(SPEC_DRAFT_TOKENS, "model_name" => m.clone()).absolute(sp.num_draft_tokens);
            counter!(SPEC_ACCEPTED_TOKENS, "model_name" => m.clone())
                .absolute(sp.num_accepted_tokens);
            for (a, n) in sp.drafts_by_accepted.iter().enumerate() {
                counter!(SPEC_ACCEPTANCE, "model_name" => m.clone(), "accepted_tokens" => a.to_string())
                    .absolute(*n);
            }
        }
        set_outstanding(&sample.name, sample.outstanding);
    }
    handle.run_upkeep();
    handle.render()
}
