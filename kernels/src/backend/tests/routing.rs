//! MoE routing through the [`Backend`] trait on every backend against the host's
//! [`route_experts`](crate::route_experts): DeepSeek-V3-like (sigmoid, groups, bias)
//! and V2-like (softmax) rules, with and without renormalisation, rows full of exact
//! ties, hand-checked tie orders, edge cases and the same shape errors.

use super::*;
use crate::backend::Routing;
use crate::moe_routing::route_experts;

fn route_on<B: Backend>(
    dev: &B,
    logits: &[f32],
    p: &RouterParams,
    bias: Option<&[f32]>,
) -> Result<Routing, KernelError> {
    let lb = dev.upload(logits).unwrap();
    let bb = bias.map(|b| dev.upload(b).unwrap());
    dev.route_experts(all(dev, &lb), p, bb.as_ref().map(|b| all(dev, b)))
}

/// The backend's routing equals the host's: the same experts in the same order, and
/// weights within the device's `expf` rounding.
fn same_as_host<B: Backend>(
    dev: &B,
    what: &str,
    logits: &[f32],
    p: &RouterParams,
    bias: Option<&[f32]>,
) {
    let want = route_experts(logits, p, bias).unwrap();
    let got = route_on(dev, logits, p, bias).unwrap();
    assert_eq!(got.experts, want.experts, "{what}: experts");
    let want_w: Vec<f64> = want.weights.iter().map(|&w| w as f64).collect();
    assert_close(&format!("{what}: weights"), &got.weights, &want_w, 1e-5);
}

/// DeepSeek-V3's rule: 256 experts in 8 groups, the best 4 groups, 8 per token.
fn v3(norm: bool) -> RouterParams {
    RouterParams {
        n_experts: 256,
        experts_per_token: 8,
        n_group: 8,
        topk_group: 4,
        group_limited: true,
        scoring: RouterScoring::Sigmoid,
        norm_topk_prob: norm,
        routed_scaling_factor: 2.5,
    }
}

/// DeepSeek-V2's rule: 160 experts in 8 groups, the best 3 groups, 6 per token.
fn v2(norm: bool) -> RouterParams {
    RouterParams {
        n_experts: 160,
        experts_per_token: 6,
        n_group: 8,
        topk_group: 3,
        group_limited: true,
        scoring: RouterScoring::Softmax,
        norm_topk_prob: norm,
        routed_scaling_factor: 16.0,
    }
}

fn routing_matches_host<B: Backend>(dev: &B) {
    let mut rng = Lcg(21);
    let tokens = 16;
    for norm in [true, false] {
        let p = v3(norm);
        let logits: Vec<f32> = rng.vec(tokens * 256).iter().map(|v| 4.0 * v).collect();
        let bias: Vec<f32> = rng.vec(256).iter().map(|v| 0.1 * v).collect();
        same_as_host(dev, &format!("V3 norm={norm}"), &logits, &p, Some(&bias));
        same_as_host(dev, &format!("V3 unbiased norm={norm}"), &logits, &p, None);

        let p = v2(norm);
        let logits: Vec<f32> = rng.vec(tokens * 160).iter().map(|v| 4.0 * v).collect();
        same_as_host(dev, &format!("V2 norm={norm}"), &logits, &p, None);
        let lite = RouterParams {
            n_experts: 64,
            n_group: 1,
            topk_group: 1,
            group_limited: false,
            ..v2(norm)
        };
        same_as_host(dev, &format!("V2-Lite norm={norm}"), &logits, &lite, None);

        // Exact ties everywhere: logits and bias on a coarse grid, and a constant row.
        let mut tied: Vec<f32> = rng.vec(tokens * 256).iter().map(|v| v.round()).collect();
        tied[..256].fill(0.5);
        let bias: Vec<f32> = rng
            .vec(256)
            .iter()
            .map(|v| (v * 2.0).round() / 4.0)
            .collect();
        same_as_host(
            dev,
            &format!("V3 ties norm={norm}"),
            &tied,
            &v3(norm),
            Some(&bias),
        );
        let tied160 = &tied[..tokens * 160];
        same_as_host(
            dev,
            &format!("V2 ties norm={norm}"),
            tied160,
            &v2(norm),
            None,
        );
    }

    // Edge cases: no group kept (every choice -inf: the lowest indices win), more
    // groups asked than there are, one expert per group, no expert per token, no token.
    let logits: Vec<f32> = rng.vec(4 * 256).iter().map(|v| 4.0 * v).collect();
    let edges = [
        (
            "topk_group 0",
            RouterParams {
                topk_group: 0,
                ..v3(true)
            },
        ),
        (
            "topk_group > n_group",
            RouterParams {
                topk_group: 9,
                ..v3(true)
            },
        ),
        (
            "groups of one",
            RouterParams {
                n_group: 256,
                topk_group: 16,
                ..v3(true)
            },
        ),
        (
            "k 0",
            RouterParams {
                experts_per_token: 0,
                ..v3(true)
            },
        ),
        (
            "k = n_experts",
            RouterParams {
                experts_per_token: 256,
                ..v3(false)
            },
        ),
    ];
    for (what, p) in edges {
        same_as_host(dev, what, &logits, &p, None);
    }
    same_as_host(dev, "no tokens", &[], &v3(true), None);

    // Wider than the CUDA kernel takes: the CUDA backend routes on the host.
    let wide = RouterParams {
        n_experts: 1100,
        n_group: 11,
        topk_group: 2,
        ..v3(true)
    };
    let logits = rng.vec(2 * 1100);
    same_as_host(dev, "1100 experts", &logits, &wide, Some(&rng.vec(1100)));
}

/// Tie orders worked out by hand: equal values rank by index, and equal groups too.
fn routing_tie_rule<B: Backend>(dev: &B) {
    let softmax = RouterParams {
        n_experts: 8,
        experts_per_token: 3,
        n_group: 1,
        topk_group: 1,
        group_limited: false,
        scoring: RouterScoring::Softmax,
        norm_topk_prob: true,
        routed_scaling_factor: 1.0,
    };
    let logits = [
        1.0, 2.0, 2.0, 0.0, 2.0, 1.0, 1.0, 0.0, /**/ 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0,
    ];
    let r = route_on(dev, &logits, &softmax, None).unwrap();
    assert_eq!(r.experts, [1, 2, 4, 0, 1, 2]);
    assert_close("equal weights", &r.weights, &[1.0 / 3.0; 6], 1e-6);

    // Groups of two; groups 0, 1 and 3 tie (sigmoid(2) + sigmoid(0)) above group 2, and
    // the lower two (0 and 1) are kept. Inside them sigmoid(2) twice, then the lower
    // of the two sigmoid(0).
    let grouped = RouterParams {
        n_group: 4,
        topk_group: 2,
        group_limited: true,
        scoring: RouterScoring::Sigmoid,
        routed_scaling_factor: 2.0,
        ..softmax
    };
    let logits = [2.0, 0.0, 2.0, 0.0, -1.0, -1.0, 2.0, 0.0];
    let r = route_on(dev, &logits, &grouped, None).unwrap();
    assert_eq!(r.experts, [0, 2, 1]);
    let s2 = 1.0 / (1.0 + (-2.0f64).exp());
    let total = 2.0 * s2 + 0.5;
    let want = [2.0 * s2 / total, 2.0 * s2 / total, 2.0 * 0.5 / total];
    assert_close("grouped weights", &r.weights, &want, 1e-6);
}

/// The same shape errors as the host, and none where the host has none.
fn routing_shape_errors<B: Backend>(dev: &B) {
    let ok = v2(true);
    let cases: [(RouterParams, usize, Option<usize>); 6] = [
        (RouterParams { n_experts: 0, ..ok }, 160, None),
        (
            RouterParams {
                experts_per_token: 161,
                ..ok
            },
            160,
            None,
        ),
        (RouterParams { n_group: 7, ..ok }, 160, None),
        (ok, 161, None),
        (ok, 320, Some(159)),
        // Not group-limited: the group count need not divide the experts.
        (
            RouterParams {
                n_group: 7,
                group_limited: false,
                ..ok
            },
            160,
            Some(160),
        ),
    ];
    for (i, (p, n, bias)) in cases.into_iter().enumerate() {
        let logits = Lcg(i as u64).vec(n);
        let bias = bias.map(|b| Lcg(99).vec(b));
        let want = route_experts(&logits, &p, bias.as_deref());
        let got = route_on(dev, &logits, &p, bias.as_deref());
        assert_eq!(got.is_err(), want.is_err(), "case {i}: {got:?} vs {want:?}");
        if let (Err(g), Err(w)) = (&got, &want) {
            assert_eq!(g.to_string(), w.to_string(), "case {i}");
        }
    }
}

test_on_every_backend!(routing_matches_host, routing_tie_rule, routing_shape_errors);
