//! `GET /v1/engine/status`: a live view of every served model's engine as JSON — KV
//! blocks per rank, how each sequence's KV is spread over the DCP ranks, requests running
//! and waiting, tokens per second, preemptions. The web page (`GET /`) polls it; scripts
//! can too (it requires the API key like every `/v1` route).
//!
//! The backend reports raw numbers ([`KvStatus`]); this module turns them into the JSON
//! ([`EngineStatus`]): the per-DCP-rank split of each sequence follows the placement rule
//! of [`dcpserve_actors::Placement`] (position `p` lives on DCP rank `floor(p / I) mod N`).
//!
//! ```
//! use dcpserve_api::engine_status::{model_status, KvLayout, KvStatus, SequenceKv};
//! use dcpserve_api::BackendStats;
//! let layout = KvLayout {
//!     tensor_parallel_size: 2,
//!     decode_context_parallel_size: 2,
//!     prefill_context_parallel_size: 1,
//!     cp_kv_cache_interleave_size: 1,
//!     block_size: 4,
//! };
//! let kv = KvStatus {
//!     layout,
//!     total_blocks: 10,
//!     free_blocks: 8,
//!     generated_tokens: 3,
//!     sequences: vec![SequenceKv {
//!         id: 7, running: true, prompt_tokens: 9, output_tokens: 3, kv_tokens: 11, kv_blocks: 2,
//!     }],
//! };
//! let m = model_status("tiny", &BackendStats::default(), Some(&kv), 1, None);
//! // 11 positions over 2 DCP ranks, one position at a time: 6 on rank 0, 5 on rank 1.
//! assert_eq!(m.sequences[0].dcp_tokens, vec![6, 5]);
//! assert_eq!(m.ranks.len(), 2);
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::BackendStats;

pub use crate::kv_status::{KvLayout, KvStatus, SequenceKv};

/// The body of `GET /v1/engine/status`.
#[derive(Debug, Clone, Serialize)]
pub struct EngineStatus {
    /// Always `engine.status`.
    pub object: &'static str,
    /// Every served model, in the configured order.
    pub models: Vec<ModelStatus>,
}

/// One model's engine.
#[derive(Debug, Clone, Serialize)]
pub struct ModelStatus {
    /// The served name.
    pub model: String,
    /// `false` when the model cannot serve (`error` says why) or cannot report.
    pub available: bool,
    pub error: Option<String>,
    /// The KV layout; `null` when the model does not report one.
    pub layout: Option<LayoutJson>,
    pub requests: RequestCounts,
    /// Sequences preempted (to be recomputed) since start.
    pub preemptions: u64,
    /// Tokens generated since start.
    pub generated_tokens: u64,
    /// Generated tokens per second over the last few seconds of reads (see
    /// [`TokenRate`]); `null` on the first read.
    pub tokens_per_second: Option<f64>,
    /// Virtual blocks of the whole model.
    pub kv: KvTotals,
    /// One entry per TP rank.
    pub ranks: Vec<RankKv>,
    /// The sequences held, running ones first.
    pub sequences: Vec<SequenceStatus>,
}

/// [`KvLayout`] with the derived block unit.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LayoutJson {
    #[serde(flatten)]
    pub layout: KvLayout,
    /// Positions per virtual block: `block_size × decode_context_parallel_size`.
    pub tokens_per_virtual_block: usize,
}

/// Requests of one model.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RequestCounts {
    /// In the running batch.
    pub running: usize,
    /// Waiting for admission (preempted ones included).
    pub waiting: usize,
    /// Admitted by the HTTP layer and not finished (running + waiting + being set up).
    pub admitted: usize,
}

/// The model's virtual KV blocks.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct KvTotals {
    pub blocks_total: usize,
    pub blocks_used: usize,
    pub blocks_free: usize,
    /// Positions the cache can hold: `blocks_total × tokens_per_virtual_block`.
    pub tokens_capacity: usize,
}

/// One rank's KV cache.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RankKv {
    pub rank: usize,
    /// Its index in its context-parallel group (`rank mod dcp`, plus `(rank / tp)·dcp`
    /// with prefill context parallelism): which positions it stores.
    pub dcp_rank: usize,
    /// Physical blocks in use and free on this rank (equal on all ranks: a virtual block
    /// is allocated on every rank at once).
    pub blocks_used: usize,
    pub blocks_free: usize,
    /// Positions stored on this rank, over all sequences.
    pub tokens_stored: usize,
    /// Positions this rank can store: `blocks_total × block_size`.
    pub tokens_capacity: usize,
}

/// One sequence and where its KV lives.
#[derive(Debug, Clone, Serialize)]
pub struct SequenceStatus {
    /// The engine's request id.
    pub id: u64,
    /// `running` or `waiting`.
    pub state: &'static str,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// Positions whose KV is stored.
    pub kv_tokens: usize,
    /// Virtual blocks held (one physical block on every rank each).
    pub kv_blocks: usize,
    /// Positions stored on each DCP rank, in DCP-rank order; sums to `kv_tokens`.
    pub dcp_tokens: Vec<usize>,
}

/// Builds one model's status from its backend's counters, its KV report (`None`: the
/// model reports none), its admitted count and its token rate.
pub fn model_status(
    name: &str,
    stats: &BackendStats,
    kv: Option<&KvStatus>,
    admitted: usize,
    tokens_per_second: Option<f64>,
) -> ModelStatus {
    let requests = RequestCounts {
        running: stats.running,
        waiting: stats.waiting,
        admitted,
    };
    let Some(kv) = kv else {
        return ModelStatus {
            model: name.to_string(),
            available: false,
            error: Some(
                stats
                    .unavailable
                    .clone()
                    .unwrap_or_else(|| "the model reports no KV status".into()),
            ),
            layout: None,
            requests,
            preemptions: stats.preemptions,
            generated_tokens: 0,
            tokens_per_second: None,
            kv: KvTotals {
                blocks_total: 0,
                blocks_used: 0,
                blocks_free: 0,
                tokens_capacity: 0,
            },
            ranks: Vec::new(),
            sequences: Vec::new(),
        };
    };
    let l = kv.layout;
    let cp = l.cp_size();
    let used = kv.total_blocks.saturating_sub(kv.free_blocks);
    let sequences: Vec<SequenceStatus> = kv
        .sequences
        .iter()
        .map(|s| SequenceStatus {
            id: s.id,
            state: if s.running { "running" } else { "waiting" },
            prompt_tokens: s.prompt_tokens,
            output_tokens: s.output_tokens,
            kv_tokens: s.kv_tokens,
            kv_blocks: s.kv_blocks,
            dcp_tokens: l.split(s.kv_tokens),
        })
        .collect();
    let mut per_dcp = vec![0usize; cp];
    for s in &sequences {
        for (acc, n) in per_dcp.iter_mut().zip(&s.dcp_tokens) {
            *acc += n;
        }
    }
    // TP rank r is DCP rank r mod dcp (vLLM's layout; `dcpserve_kernels::dcp::dcp_rank_of`),
    // of context-parallel rank (r / tp)·dcp + r mod dcp with prefill context parallelism.
    let world = l.tensor_parallel_size.max(1) * l.prefill_context_parallel_size.max(1);
    let ranks = (0..world)
        .map(|rank| RankKv {
            rank,
            dcp_rank: l.cp_rank(rank),
            blocks_used: used,
            blocks_free: kv.free_blocks,
            tokens_stored: per_dcp[l.cp_rank(rank)],
            tokens_capacity: kv.total_blocks * l.block_size,
        })
        .collect();
    ModelStatus {
        model: name.to_string(),
        available: stats.unavailable.is_none(),
        error: stats.unavailable.clone(),
        layout: Some(LayoutJson {
            layout: l,
            tokens_per_virtual_block: l.tokens_per_virtual_block(),
        }),
        requests,
        preemptions: stats.preemptions,
        generated_tokens: kv.generated_tokens,
        tokens_per_second,
        kv: KvTotals {
            blocks_total: kv.total_blocks,
            blocks_used: used,
            blocks_free: kv.free_blocks,
            tokens_capacity: kv.total_blocks * l.tokens_per_virtual_block(),
        },
        ranks,
        sequences,
    }
}

/// Generated-token rates per model, from the counters seen by successive status reads:
/// the rate is taken since the oldest read of the last [`TokenRate::WINDOW`] (or since
/// the previous read, when that is older), so it needs no timer in the engine.
#[derive(Default)]
pub struct TokenRate {
    samples: Mutex<HashMap<String, VecDeque<(Instant, u64)>>>,
}

impl TokenRate {
    /// How far back the rate looks.
    pub const WINDOW: Duration = Duration::from_secs(5);

    /// Records `total` for `model` at `now` and returns the rate since the oldest read
    /// kept, or `None` when there is no earlier read.
    pub fn observe(&self, model: &str, now: Instant, total: u64) -> Option<f64> {
        let mut all = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let q = all.entry(model.to_string()).or_default();
        // Reads older than the window go, but the newest one stays: slow polling still
        // has a base.
        while q.len() > 1 && now.duration_since(q[0].0) > Self::WINDOW {
            q.pop_front();
        }
        let rate = q.front().and_then(|&(t, n)| {
            let dt = now.duration_since(t).as_secs_f64();
            (dt > 0.0).then(|| total.saturating_sub(n) as f64 / dt)
        });
        q.push_back((now, total));
        rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(tp: usize, dcp: usize, i: usize, b: usize) -> KvLayout {
        KvLayout {
            tensor_parallel_size: tp,
            decode_context_parallel_size: dcp,
            prefill_context_parallel_size: 1,
            cp_kv_cache_interleave_size: i,
            block_size: b,
        }
    }

    /// The split counts positions one by one with the placement rule written out here.
    #[test]
    fn split_matches_counting_owners() {
        for (dcp, i, b) in [(1, 1, 16), (2, 1, 4), (2, 2, 4), (4, 1, 8), (3, 2, 4)] {
            let l = layout(dcp, dcp, i, b);
            for len in 0..70 {
                let mut want = vec![0; dcp];
                for p in 0..len {
                    want[(p / i) % dcp] += 1;
                }
                assert_eq!(l.split(len), want, "dcp={dcp} i={i} len={len}");
            }
        }
    }

    #[test]
    fn ranks_share_blocks_and_split_tokens() {
        let kv = KvStatus {
            layout: layout(4, 2, 2, 4),
            total_blocks: 20,
            free_blocks: 15,
            generated_tokens: 9,
            sequences: vec![
                SequenceKv {
                    id: 1,
                    running: true,
                    prompt_tokens: 5,
                    output_tokens: 4,
                    kv_tokens: 9,
                    kv_blocks: 2,
                },
                SequenceKv {
                    id: 2,
                    running: false,
                    prompt_tokens: 3,
                    output_tokens: 0,
                    kv_tokens: 0,
                    kv_blocks: 0,
                },
            ],
        };
        let m = model_status("m", &BackendStats::default(), Some(&kv), 2, Some(1.5));
        // 9 positions in runs of 2 over 2 ranks: 0,1 | 2,3 | 4,5 | 6,7 | 8 -> 5 and 4.
        assert_eq!(m.sequences[0].dcp_tokens, vec![5, 4]);
        assert_eq!(m.sequences[1].state, "waiting");
        let stored: Vec<usize> = m.ranks.iter().map(|r| r.tokens_stored).collect();
        assert_eq!(stored, vec![5, 4, 5, 4]);
        assert!(m
            .ranks
            .iter()
            .all(|r| r.blocks_used == 5 && r.blocks_free == 15));
        assert_eq!(m.kv.tokens_capacity, 20 * 8);
        assert_eq!(m.ranks[0].tokens_capacity, 20 * 4);
    }

    #[test]
    fn a_model_without_a_report_is_unavailable() {
        let m = model_status("m", &BackendStats::default(), None, 0, None);
        assert!(!m.available);
        assert!(m.error.unwrap().contains("no KV status"));
    }

    #[test]
    fn rate_over_successive_reads() {
        let r = TokenRate::default();
        let t0 = Instant::now();
        assert_eq!(r.observe("a", t0, 100), None);
        let got = r.observe("a", t0 + Duration::from_secs(2), 140).unwrap();
        assert!((got - 20.0).abs() < 1e-9, "{got}");
        // Another model has its own history.
        assert_eq!(r.observe("b", t0, 5), None);
        // Reads older than the window are dropped; the newest is kept as the base.
        let got = r.observe("a", t0 + Duration::from_secs(10), 300).unwrap();
        assert!((got - 20.0).abs() < 1e-9, "{got}");
        let got = r.observe("a", t0 + Duration::from_secs(11), 310).unwrap();
        assert!((got - 10.0).abs() < 1e-9, "{got}");
    }
}
