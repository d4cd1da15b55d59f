//! DeepSeek mixture-of-experts: group-limited top-k routing and the expert MLPs, computed
//! through the rank's [`Backend`].
//!
//! Routing runs on every rank from the same (all-reduced) activations with the replicated
//! router, so all ranks choose the same experts; each rank then computes its slice of
//! every chosen expert's intermediate dimension, and the caller all-reduces the partial sums.

use dcpserve_kernels::{Backend, Precision, RouterParams, RouterScoring, Routing};

use super::device_weights::{DeviceMlp, DeviceMoe};
use super::workspace::{MlpBuffers, MoeBuffers};
use crate::arch::workspace::whole;
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

/// The router's logits for the `n` tokens of `x` (into `logits`), then transformers'
/// `DeepseekV3TopkRouter` / `DeepseekV2TopkRouter` choice (the backend's
/// [`route_experts`](dcpserve_kernels::SamplingOps::route_experts)).
pub(crate) fn route<B: Backend>(
    dev: &B,
    cfg: &MoeConfig,
    w: &DeviceMoe<B>,
    (x, n): (B::View<'_>, usize),
    logits: &mut B::Buffer,
) -> Result<Routing, ModelError> {
    let len = n * cfg.n_routed_experts;
    dev.matmul(
        x,
        n,
        &w.router,
        dev.view_mut(logits, 0..len)?,
        Precision::Exact,
    )?;
    let bias = w
        .correction_bias
        .as_ref()
        .map(|b| whole(dev, b))
        .transpose()?;
    Ok(dev.route_experts(dev.view(logits, 0..len)?, &router_params(cfg), bias)?)
}

/// `down(silu(gate(x)) · up(x))` for the `m` rows of `x`, this rank's slice, into `out`.
pub(crate) fn mlp_forward<B: Backend>(
    dev: &B,
    w: &DeviceMlp<B>,
    (x, m): (B::View<'_>, usize),
    bufs: &mut MlpBuffers<B>,
    out: B::ViewMut<'_>,
) -> Result<(), ModelError> {
    let mi = m * dev.matrix_shape(&w.gate).0;
    let exact = Precision::Exact;
    dev.matmul(x, m, &w.gate, dev.view_mut(&mut bufs.gate, 0..mi)?, exact)?;
    dev.matmul(x, m, &w.up, dev.view_mut(&mut bufs.up, 0..mi)?, exact)?;
    let (gate, up) = (dev.view(&bufs.gate, 0..mi)?, dev.view(&bufs.up, 0..mi)?);
    dev.silu_mul(gate, up, dev.view_mut(&mut bufs.act, 0..mi)?)?;
    let act = dev.view(&bufs.act, 0..mi)?;
    dev.matmul(act, m, &w.down, out, exact)?;
    Ok(())
}

/// This rank's partial MoE output for the `n` tokens of `x` (`[n, hidden]`, the
/// buffer's prefix) into `out`'s prefix (to be all-reduced): routed experts weighted by
/// the router, plus the shared experts.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_forward<B: Backend>(
    dev: &B,
    cfg: &MoeConfig,
    w: &DeviceMoe<B>,
    (x, n, hidden): (&B::Buffer, usize, usize),
    mlp: &mut MlpBuffers<B>,
    moe: &mut MoeBuffers<B>,
    out: &mut B::Buffer,
) -> Result<(), ModelError> {
    let nh = n * hidden;
    let xs = dev.view(x, 0..nh)?;
    let routing = route(dev, cfg, w, (xs, n), &mut moe.logits)?;
    dev.fill(dev.view_mut(out, 0..nh)?, 0.0)?;
    let k = cfg.num_experts_per_tok;
    for (e, expert) in w.experts.iter().enumerate() {
        let Some(expert) = expert else { continue };
        // Tokens routed to e, with their weight.
        moe.picked.clear();
        moe.weights.clear();
        for i in (0..n * k).filter(|&i| routing.experts[i] == e) {
            moe.picked.push(i / k);
            moe.weights.push(routing.weights[i]);
        }
        if moe.picked.is_empty() {
            continue;
        }
        let mh = moe.picked.len() * hidden;
        let rows = dev.view_mut(&mut moe.rows, 0..mh)?;
        dev.gather_rows(xs, hidden, &moe.picked, rows)?;
        let rows = dev.view(&moe.rows, 0..mh)?;
        let y = dev.view_mut(&mut moe.out, 0..mh)?;
        mlp_forward(dev, expert, (rows, moe.picked.len()), mlp, y)?;
        let y = dev.view(&moe.out, 0..mh)?;
        let sum = dev.view_mut(out, 0..nh)?;
        dev.scatter_add_rows(y, hidden, &moe.picked, &moe.weights, sum)?;
    }
    if let Some(shared) = &w.shared {
        mlp_forward(
            dev,
            shared,
            (xs, n),
            mlp,
            dev.view_mut(&mut moe.out, 0..nh)?,
        )?;
        dev.add(dev.view_mut(out, 0..nh)?, dev.view(&moe.out, 0..nh)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dcpserve_kernels::{CpuBackend, WeightMatrix};

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
        let w = DeviceMoe::<CpuBackend> {
            router: WeightMatrix::from_f32(4, 4, eye).unwrap(),
            correction_bias: Some(vec![0.0, 0.0, 0.0, 0.0]),
            experts: Vec::new(),
            shared: None,
        };
        let dev = CpuBackend::new(1);
        let mut logits = vec![0.0; 4];
        // Group 0 = {3.0, -3.0}, group 1 = {1.0, 1.0}: group 1 has the larger top-2 sum.
        let x = [3.0, -3.0, 1.0, 1.0];
        let r = route(&dev, &cfg, &w, (&x[..], 1), &mut logits).unwrap();
        let mut chosen = r.experts.clone();
        chosen.sort();
        assert_eq!(chosen, vec![2, 3]);
        assert!((r.weights.iter().sum::<f32>() - 2.0).abs() < 1e-6);
    }
}
