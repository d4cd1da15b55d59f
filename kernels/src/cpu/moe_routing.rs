//! Mixture-of-experts routing: router logits → each token's top-k experts and weights,
//! with the scoring functions and the group-limited choice of DeepSeek-V2 / V3
//! (transformers' `DeepseekV2TopkRouter` / `DeepseekV3TopkRouter`).

use crate::backend::{RouterParams, RouterScoring, Routing};
use crate::error::{check_len, KernelError};

/// Indices of the `k` largest values (ties: the lower index first), largest first.
fn top_k(values: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Checks a routing call as every backend does: `logits_len` values of router logits,
/// an optional correction bias of `bias_len`. Returns the number of tokens (rows).
pub(crate) fn check_routing(
    logits_len: usize,
    p: &RouterParams,
    bias_len: Option<usize>,
) -> Result<usize, KernelError> {
    let e = p.n_experts;
    let k = p.experts_per_token;
    let grouped = p.group_limited && p.n_group > 1;
    if e == 0 || k > e || (grouped && !e.is_multiple_of(p.n_group)) {
        return Err(KernelError::Shape(format!(
            "routing: {e} experts in {} groups, {k} per token",
            p.n_group
        )));
    }
    if !logits_len.is_multiple_of(e) {
        return Err(KernelError::Shape(format!(
            "routing: {logits_len} logits are not rows of {e}"
        )));
    }
    if let Some(b) = bias_len {
        check_len("routing correction_bias", e, b)?;
    }
    Ok(logits_len / e)
}

/// Routes every row of `logits` (`[n_tokens, n_experts]`). `correction_bias`
/// (`[n_experts]`, V3's `e_score_correction_bias`) is added to the scores for choosing
/// only; the weights use the unbiased scores.
///
/// ```
/// use dcpserve_kernels::{route_experts, RouterParams, RouterScoring};
/// let p = RouterParams { n_experts: 3, experts_per_token: 1, n_group: 1, topk_group: 1,
///     group_limited: false, scoring: RouterScoring::Softmax, norm_topk_prob: true,
///     routed_scaling_factor: 1.0 };
/// let r = route_experts(&[0.0, 2.0, 1.0], &p, None).unwrap();
/// assert_eq!(r.experts, [1]);
/// assert!((r.weights[0] - 1.0).abs() < 1e-6);
/// ```
pub fn route_experts(
    logits: &[f32],
    p: &RouterParams,
    correction_bias: Option<&[f32]>,
) -> Result<Routing, KernelError> {
    check_routing(logits.len(), p, correction_bias.map(<[f32]>::len))?;
    let e = p.n_experts;
    let k = p.experts_per_token;
    let grouped = p.group_limited && p.n_group > 1;
    let per_group = e / p.n_group.max(1);
    let n = logits.len() / e;
    let mut experts = Vec::with_capacity(n * k);
    let mut weights = Vec::with_capacity(n * k);
    for row in logits.chunks_exact(e) {
        let scores: Vec<f32> = match p.scoring {
            RouterScoring::Sigmoid => row.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect(),
            RouterScoring::Softmax => {
                let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let ex: Vec<f32> = row.iter().map(|&l| (l - mx).exp()).collect();
                let s: f32 = ex.iter().sum();
                ex.iter().map(|v| v / s).collect()
            }
        };
        let mut choice: Vec<f32> = match correction_bias {
            Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
            None => scores.clone(),
        };
        if grouped {
            let group_scores: Vec<f32> = choice
                .chunks_exact(per_group)
                .map(|g| match p.scoring {
                    RouterScoring::Sigmoid => top_k(g, 2).iter().map(|&i| g[i]).sum(),
                    RouterScoring::Softmax => g.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                })
                .collect();
            let keep = top_k(&group_scores, p.topk_group);
            for (gi, g) in choice.chunks_exact_mut(per_group).enumerate() {
                if !keep.contains(&gi) {
                    g.fill(f32::NEG_INFINITY);
                }
            }
        }
        let chosen = top_k(&choice, k);
        let mut ws: Vec<f32> = chosen.iter().map(|&i| scores[i]).collect();
        if p.norm_topk_prob {
            let denom = ws.iter().sum::<f32>() + 1e-20;
            ws.iter_mut().for_each(|v| *v /= denom);
        }
        ws.iter_mut().for_each(|v| *v *= p.routed_scaling_factor);
        experts.extend(chosen);
        weights.extend(ws);
    }
    Ok(Routing { experts, weights })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grouped top-k: the best group (by its top-2 sum of biased scores) wins even when
    /// the single best biased score is elsewhere; weights use the unbiased scores.
    #[test]
    fn grouped_sigmoid_routing() {
        let p = RouterParams {
            n_experts: 4,
            experts_per_token: 2,
            n_group: 2,
            topk_group: 1,
            group_limited: true,
            scoring: RouterScoring::Sigmoid,
            norm_topk_prob: true,
            routed_scaling_factor: 2.0,
        };
        // Group 0 = {3.0, -3.0}, group 1 = {1.0, 1.0}: group 1 has the larger top-2 sum.
        let bias = [0.0; 4];
        let r = route_experts(&[3.0, -3.0, 1.0, 1.0], &p, Some(&bias)).unwrap();
        let mut chosen = r.experts.clone();
        chosen.sort();
        assert_eq!(chosen, vec![2, 3]);
        assert!((r.weights.iter().sum::<f32>() - 2.0).abs() < 1e-6);
    }

    #[test]
    fn rejects_inconsistent_shapes() {
        let mut p = RouterParams {
            n_experts: 4,
            experts_per_token: 2,
            n_group: 3,
            topk_group: 1,
            group_limited: true,
            scoring: RouterScoring::Softmax,
            norm_topk_prob: false,
            routed_scaling_factor: 1.0,
        };
        assert!(route_experts(&[0.0; 4], &p, None).is_err()); // 4 experts, 3 groups
        p.n_group = 2;
        assert!(route_experts(&[0.0; 5], &p, None).is_err()); // not whole rows
        assert!(route_experts(&[0.0; 4], &p, Some(&[0.0; 3])).is_err());
        assert_eq!(route_experts(&[0.0; 8], &p, None).unwrap().experts.len(), 4);
    }
}
