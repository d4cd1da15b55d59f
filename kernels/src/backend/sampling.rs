//! [`SamplingOps`]: the choices made from a step's results whose answers come back to
//! the host (MoE routing, greedy and sampled tokens with their log-probabilities), and
//! what they are asked and answer ([`RouterParams`] and [`Routing`], [`Rng`],
//! [`RowDraw`] and [`RowDrawn`]).

use super::memory::DeviceMemory;
use crate::error::KernelError;
use crate::sampling_params::SamplingParams;

/// How router logits become expert scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterScoring {
    /// DeepSeek-V3: sigmoid, groups ranked by the sum of their top-2 biased scores.
    Sigmoid,
    /// DeepSeek-V2: softmax, groups ranked by their best score.
    Softmax,
}

/// The routing rule of one MoE layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterParams {
    /// Routed experts (`n_routed_experts`), the width of a logits row.
    pub n_experts: usize,
    /// Experts chosen per token (`num_experts_per_tok`).
    pub experts_per_token: usize,
    /// Expert groups (`n_group`); experts are split into equal contiguous groups.
    pub n_group: usize,
    /// Groups a token may choose from when `group_limited` (`topk_group`).
    pub topk_group: usize,
    /// Restrict the choice to the best `topk_group` groups.
    pub group_limited: bool,
    /// Scoring function.
    pub scoring: RouterScoring,
    /// Renormalize the chosen weights to sum to 1 (before scaling).
    pub norm_topk_prob: bool,
    /// Factor applied to every chosen weight.
    pub routed_scaling_factor: f32,
}

/// Each token's chosen experts and their weights, `[n_tokens, experts_per_token]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Expert index of each choice.
    pub experts: Vec<usize>,
    /// Weight of each choice.
    pub weights: Vec<f32>,
}

/// Small, fast, seedable PRNG (xoshiro256**, seeded through splitmix64).
///
/// Serializable: a request's sampler state travels with its plan when the request is
/// (re)admitted, so its stream of draws continues on whichever rank samples it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// Creates a generator; equal seeds give equal sequences.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in `[0, 1)` with 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// One draw: which row, how, with which uniform number, and which log-probabilities.
#[derive(Debug, Clone, Copy)]
pub struct RowDraw<'a> {
    /// Row of the logits matrix (`vocab` values wide).
    pub row: usize,
    /// Temperature, top-k, top-p and min-p (penalties and stop rules are the caller's:
    /// rows that need them are not drawn this way).
    pub params: &'a SamplingParams,
    /// A uniform number in `[0, 1)`; `None` only when `params.is_greedy()` (nothing is
    /// drawn then).
    pub uniform: Option<f64>,
    /// Return the chosen token's log-probability and this many most likely tokens with
    /// theirs; `None`: no log-probabilities.
    pub top_logprobs: Option<usize>,
}

/// The answer to one [`RowDraw`].
#[derive(Debug, Clone, PartialEq)]
pub struct RowDrawn {
    /// The chosen token.
    pub token: u32,
    /// Whether the draw used [`RowDraw::uniform`] (exactly when
    /// the host sampler takes a number from its [`Rng`]: the support left
    /// more than one token).
    pub used_uniform: bool,
    /// The token's log-probability under the row's log-softmax, when asked for.
    pub logprob: Option<f32>,
    /// The most likely tokens and their log-probabilities, most likely first, ties by
    /// lower id (empty unless asked for).
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Routing and sampling: each op reads device logits and returns only its choices.
pub trait SamplingOps: DeviceMemory {
    /// MoE routing of router logits `[n_tokens, n_experts]` by the rule `p`; a
    /// `correction_bias` (`[n_experts]`) steers the choice, not the weights.
    fn route_experts(
        &self,
        logits: Self::View<'_>,
        p: &RouterParams,
        correction_bias: Option<Self::View<'_>>,
    ) -> Result<Routing, KernelError>;
    /// The most likely token of each `vocab`-wide row of `logits`.
    fn argmax(&self, logits: Self::View<'_>, vocab: usize) -> Result<Vec<u32>, KernelError>;
    /// One token drawn from one row of `logits` with `params` (greedy below temperature
    /// 1e-5) and the sequence's `rng`.
    fn sample(
        &self,
        logits: Self::View<'_>,
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<u32, KernelError>;
    /// One draw per entry of `draws` from the `vocab`-wide rows of `logits` (see the
    /// `row_sampling` module): the chosen token, whether the draw used
    /// its uniform number, and the log-probabilities asked for, in the order of `draws`.
    /// Only these come back to the host, not the logits.
    ///
    /// `Some` answers equal `row_sampling::draw_row_on_host` on the row (the CPU backend's bit for bit; a device's except when a draw or a
    /// top-p cut falls within rounding of a boundary, its exponentials and parallel
    /// sums rounding differently in the last bits). `None`: this backend cannot draw
    /// that row exactly (see the backend's limits); the caller draws it on the host,
    /// its stream untouched. Errors: `vocab == 0`, `logits` not whole rows, a row out
    /// of range, a sampling draw without a uniform number in `[0, 1)`.
    ///
    /// ```
    /// use dcpserve_kernels::row_sampling::RowDraw;
    /// use dcpserve_kernels::{CpuBackend, DeviceMemory, SamplingOps, SamplingParams};
    /// let dev = CpuBackend::new(1);
    /// let logits = dev.upload(&[0.0, 3.0, 1.0, 5.0, 0.0, 0.0]).unwrap();
    /// let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
    /// let draws = [
    ///     RowDraw { row: 1, params: &greedy, uniform: None, top_logprobs: Some(0) },
    ///     RowDraw { row: 0, params: &SamplingParams::default(), uniform: Some(0.5), top_logprobs: None },
    /// ];
    /// let got = dev.sample_rows(dev.view(&logits, 0..6).unwrap(), 3, &draws).unwrap();
    /// let first = got[0].as_ref().unwrap();
    /// assert_eq!((first.token, first.used_uniform), (0, false));
    /// assert!(first.logprob.unwrap() < 0.0 && first.top_logprobs.is_empty());
    /// assert!(got[1].as_ref().unwrap().used_uniform);
    /// ```
    fn sample_rows(
        &self,
        logits: Self::View<'_>,
        vocab: usize,
        draws: &[RowDraw<'_>],
    ) -> Result<Vec<Option<RowDrawn>>, KernelError>;
}
