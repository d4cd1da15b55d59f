//! The log-sum-exp merge of attention partials computed over disjoint KV shards (DCP
//! ranks, or splits of one long sequence inside a kernel): the one implementation of
//! the math, `m = max_i LSE_i`, `LSE = m + ln Σ_i exp(LSE_i − m)`,
//! `w_i = exp(LSE_i − LSE)`, `O = Σ_i w_i·O_i`. An empty shard has `LSE_i = −inf` and
//! weight 0, never NaN.

use crate::error::{check_len, KernelError};
use crate::shape_checks::check_merge;

/// Merges attention partials computed over disjoint KV shards.
///
/// Row `i` of part `p` is `partial_out[p][i*head_dim..]` with `partial_lse[p][i]`.
/// `lse = m + ln Σ exp(lse_p − m)` with `m = max_p lse_p`, and
/// `out = Σ exp(lse_p − lse) · out_p`. Rows empty in every part give zeros and `-inf`.
///
/// ```
/// use dcpserve_kernels::dcp::merge_partials;
/// let (a, b) = ([1.0f32, 2.0], [3.0f32, 4.0]);
/// let (la, lb) = ([0.0f32], [f32::NEG_INFINITY]); // second shard is empty
/// let (mut out, mut lse) = ([0.0; 2], [0.0; 1]);
/// merge_partials(&[&a, &b], &[&la, &lb], 1, 2, &mut out, &mut lse).unwrap();
/// assert_eq!(out, [1.0, 2.0]);
/// assert_eq!(lse, [0.0]);
/// ```
pub fn merge_partials(
    partial_out: &[&[f32]],
    partial_lse: &[&[f32]],
    n_rows: usize,
    head_dim: usize,
    out: &mut [f32],
    lse_out: &mut [f32],
) -> Result<(), KernelError> {
    check_merge(
        (partial_out.len(), partial_lse.len()),
        partial_out
            .iter()
            .zip(partial_lse)
            .map(|(o, l)| (o.len(), l.len())),
        n_rows,
        head_dim,
        (out.len(), lse_out.len()),
    )?;
    merge_rows(
        partial_out.len(),
        |i| partial_out[i],
        |i| partial_lse[i],
        n_rows,
        head_dim,
        out,
        lse_out,
    );
    Ok(())
}

/// The merged log-sum-exp of one row's shard LSEs: `m + ln Σ exp(lse_i − m)` with
/// `m = max_i lse_i`. NaN LSEs are skipped; `−inf` when every shard is empty.
pub fn merged_lse(lses: impl Iterator<Item = f32> + Clone) -> f32 {
    let m = lses
        .clone()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return m;
    }
    let sum: f32 = lses.filter(|v| !v.is_nan()).map(|v| (v - m).exp()).sum();
    m + sum.ln()
}

/// The weight `exp(lse_i − merged)` of a shard's partial output; 0 for an empty shard
/// (`lse_i = −inf`), a NaN one, or a row empty everywhere, so an empty shard's output
/// never leaks NaN into the sum.
pub fn shard_weight(lse_i: f32, merged: f32) -> f32 {
    if lse_i.is_nan() || lse_i == f32::NEG_INFINITY || merged == f32::NEG_INFINITY {
        0.0
    } else {
        (lse_i - merged).exp()
    }
}

/// Scales each `head_dim`-wide row `i` of `out` by its shard's weight
/// `exp(lse[i] − LSE_i)`, `LSE_i` merging `all_lse[p·n + i]` over `parts` shards
/// (`n = lse.len()`): the partials then sum to the merged output (the all-gather +
/// reduce-scatter form of the DCP merge).
///
/// ```
/// use dcpserve_kernels::dcp::merge::scale_by_lse_share;
/// // Two shards with equal LSEs: each weighs one half.
/// let mut out = [2.0f32, 4.0];
/// scale_by_lse_share(&mut out, &[0.0], &[0.0, 0.0], 2, 2).unwrap();
/// assert_eq!(out, [1.0, 2.0]);
/// ```
pub fn scale_by_lse_share(
    out: &mut [f32],
    lse: &[f32],
    all_lse: &[f32],
    parts: usize,
    head_dim: usize,
) -> Result<(), KernelError> {
    let n = lse.len();
    check_len("scale_by_lse_share out", n * head_dim, out.len())?;
    check_len("scale_by_lse_share all_lse", parts * n, all_lse.len())?;
    for (i, row) in out.chunks_exact_mut(head_dim.max(1)).enumerate().take(n) {
        let merged = merged_lse((0..parts).map(|p| all_lse[p * n + i]));
        let w = shard_weight(lse[i], merged);
        row.iter_mut().for_each(|x| *x *= w);
    }
    Ok(())
}

/// [`merge_partials`] over parts reached by index, without the length checks.
pub(crate) fn merge_rows<'a>(
    n_parts: usize,
    get_out: impl Fn(usize) -> &'a [f32],
    get_lse: impl Fn(usize) -> &'a [f32],
    n_rows: usize,
    hd: usize,
    out: &mut [f32],
    lse_out: &mut [f32],
) {
    for row in 0..n_rows {
        let lse = merged_lse((0..n_parts).map(|p| get_lse(p)[row]));
        lse_out[row] = lse;
        let o = &mut out[row * hd..(row + 1) * hd];
        o.fill(0.0);
        for p in 0..n_parts {
            let w = shard_weight(get_lse(p)[row], lse);
            if w == 0.0 {
                continue;
            }
            for (a, v) in o.iter_mut().zip(&get_out(p)[row * hd..(row + 1) * hd]) {
                *a += w * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_shards_weigh_nothing_and_never_give_nan() {
        let ninf = f32::NEG_INFINITY;
        // Shard 1 is empty and its output garbage (NaN): it must not leak.
        let (a, b, c) = ([1.0f32, 2.0], [f32::NAN, f32::NAN], [3.0f32, 4.0]);
        let (la, lb, lc) = ([0.5f32], [ninf], [0.5f32]);
        let (mut out, mut lse) = ([0.0; 2], [0.0; 1]);
        merge_partials(&[&a, &b, &c], &[&la, &lb, &lc], 1, 2, &mut out, &mut lse).unwrap();
        assert_eq!(out, [2.0, 3.0]);
        assert!((lse[0] - (0.5 + 2f32.ln())).abs() < 1e-6);
        // Every shard empty: zeros and −inf.
        merge_partials(&[&a, &c], &[&[ninf], &[ninf]], 1, 2, &mut out, &mut lse).unwrap();
        assert_eq!(out, [0.0, 0.0]);
        assert_eq!(lse, [ninf]);
        assert_eq!(shard_weight(ninf, ninf), 0.0);
        assert_eq!(merged_lse([ninf, ninf].into_iter()), ninf);
    }

    #[test]
    fn merging_shards_equals_attention_over_the_whole() {
        // Scores of one query against 5 keys split 2 + 0 + 3: the merged softmax average
        // of values equals the softmax over all 5.
        let scores = [0.3f32, -1.2, 2.0, 0.7, -0.1];
        let values = [1.0f32, -2.0, 0.5, 3.0, 4.0];
        let part = |r: std::ops::Range<usize>| -> ([f32; 1], [f32; 1]) {
            let lse = merged_lse(scores[r.clone()].iter().copied());
            let o = r.map(|i| (scores[i] - lse).exp() * values[i]).sum::<f32>();
            ([if lse == f32::NEG_INFINITY { 0.0 } else { o }], [lse])
        };
        let (p0, p1, p2) = (part(0..2), part(2..2), part(2..5));
        let (mut out, mut lse) = ([0.0; 1], [0.0; 1]);
        merge_partials(
            &[&p0.0, &p1.0, &p2.0],
            &[&p0.1, &p1.1, &p2.1],
            1,
            1,
            &mut out,
            &mut lse,
        )
        .unwrap();
        let whole = part(0..5);
        assert!(
            (out[0] - whole.0[0]).abs() < 1e-5,
            "{out:?} vs {:?}",
            whole.0
        );
        assert!((lse[0] - whole.1[0]).abs() < 1e-6);
    }
}
