//! DeepSeek mixture-of-experts: group-limited top-k routing and the expert MLPs.
//!
//! Routing runs on every rank from the same (all-reduced) activations with the replicated
//! router, so all ranks choose the same experts; each rank then computes its slice of
//! every chosen expert's intermediate dimension, and the caller all-reduces the partial sums.

use dcpserve_kernels::{
    matmul, route_experts, silu_mul, RouterParams, RouterScoring, Routing, ThreadPool,
};

use super::weights::{MlpShard, MoeShard};
use crate::config::{MoeConfig, MoeScoring};
use crate::error::ModelError;

/// The kernels' routing rule for a model's MoE configuration.
fn router_params(cfg: &MoeConfig) -> RouterParams {
    RouterParams {
        n_experts: cfg.n_routed_experts,
        experts_per_token: cfg.num_experts_per_tok,
        n_group: cfg.n_group,
        topk_group: cfg.topk_group,
        group_limited: cfg.group_limited,
        scoring: match cfg.scoring {
            MoeScoring::Sigmoid => RouterScoring::Sigmoid,
            MoeScoring::Softmax => RouterScoring::Softmax,
        },
        norm_topk_prob: cfg.norm_topk_prob,
        routed_scaling_factor: cfg.routed_scaling_factor,
    }
}

/// The router's logits for `n` tokens, then transformers' `DeepseekV3TopkRouter` /
/// `DeepseekV2TopkRouter` choice (the kernels' [`route_experts`]).
pub fn route(
    pool: &ThreadPool,
    cfg: &MoeConfig,
    w: &MoeShard,
    x: &[f32],
    n: usize,
) -> Result<Routing, ModelError> {
    let mut logits = vec![0.0f32; n * cfg.n_routed_experts];
    matmul(pool, x, n, &w.router, &mut logits)?;
    Ok(route_experts(
        &logits,
        &router_params(cfg),
        w.correction_bias.as_deref(),
    )?)
}

/// `down(silu(gate(x)) · up(x))` for `m` rows of `x`, this rank's slice, into `out`.
pub fn mlp_forward(
    pool: &ThreadPool,
    w: &MlpShard,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) -> Result<(), ModelError> {
    let inter = w.gate.rows();
    let mut gate = vec![0.0f32; m * inter];
    let mut up = vec![0.0f32; m * inter];
    matmul(pool, x, m, &w.gate, &mut gate)?;
    matmul(pool, x, m, &w.up, &mut up)?;
    let mut act = vec![0.0f32; m * inter];
    silu_mul(&gate, &up, &mut act)?;
    matmul(pool, &act, m, &w.down, out)?;
    Ok(())
}

/// This rank's partial MoE output for `n` tokens (`[n, hidden]`, to be all-reduced):
/// routed experts weighted by the router, plus the shared experts.
pub fn moe_forward(
    pool: &ThreadPool,
    cfg: &MoeConfig,
    w: &MoeShard,
    x: &[f32],
    n: usize,
    hidden: usize,
    out: &mut [f32],
) -> Result<(), ModelError> {
    let routing = route(pool, cfg, w, x, n)?;
    out.fill(0.0);
    let k = cfg.num_experts_per_tok;
    let mut rows = Vec::new();
    let mut y = Vec::new();
    for (e, expert) in w.experts.iter().enumerate() {
        // Tokens routed to e, with their weight.
        let picks: Vec<(usize, f32)> = (0..n * k)
            .filter(|&i| routing.experts[i] == e)
            .map(|i| (i / k, routing.weights[i]))
            .collect();
        let Some(expert) = expert else { continue };
        if picks.is_empty() {
            continue;
        }
        let m = picks.len();
        rows.clear();
        for &(t, _) in &picks {
            rows.extend_from_slice(&x[t * hidden..(t + 1) * hidden]);
        }
        y.clear();
        y.resize(m * hidden, 0.0);
        mlp_forward(pool, expert, &rows, m, &mut y)?;
        for (j, &(t, wt)) in picks.iter().enumerate() {
            for (o, &v) in out[t * hidden..(t + 1) * hidden]
                .iter_mut()
                .zip(&y[j * hidden..(j + 1) * hidden])
            {
                *o += wt * v;
            }
        }
    }
    if let Some(shared) = &w.shared {
        let mut s = vec![0.0f32; n * hidden];
        mlp_forward(pool, shared, x, n, &mut s)?;
        for (o, v) in out.iter_mut().zip(&s) {
            *o += v;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dcpserve_kernels::WeightMatrix;

    /// Grouped top-k: the best group (by its top-2 sum of biased scores) wins even when
    /// the single best biased score is elsewhere; weights use the unbiased scores.
    #[test]
    fn grouped_sigmoid_routing() {
        let cfg = MoeConfig {
            n_routed_experts: 4,
            num_experts_per_tok: 2,
            moe_intermediate_size: 1,
            n_shared_experts: 0,
            n_group: 2,
            topk_group: 1,
            routed_scaling_factor: 2.0,
            norm_topk_prob: true,
            first_k_dense_replace: 0,
            scoring: MoeScoring::Sigmoid,
            group_limited: true,
            correction_bias: true,
        };
        // Router = identity on a 4-dim input, so the logits are the input.
        let mut eye = vec![0.0f32; 16];
        (0..4).for_each(|i| eye[i * 5] = 1.0);
        let w = MoeShard {
            router: WeightMatrix::from_f32(4, 4, eye).unwrap(),
            correction_bias: Some(vec![0.0, 0.0, 0.0, 0.0]),
            experts: Vec::new(),
            shared: None,
        };
        let pool = ThreadPool::new(1);
        // Group 0 = {3.0, -3.0}, group 1 = {1.0, 1.0}: group 1 has the larger top-2 sum.
        let r = route(&pool, &cfg, &w, &[3.0, -3.0, 1.0, 1.0], 1).unwrap();
        let mut chosen = r.experts.clone();
        chosen.sort();
        assert_eq!(chosen, vec![2, 3]);
        assert!((r.weights.iter().sum::<f32>() - 2.0).abs() < 1e-6);
    }
}
