//! [`OpDiff`]: how far one op's result on the checked backend is from the CPU's.

use dcpserve_kernels::KernelError;

/// How far one op's result on the checked backend is from the CPU's.
#[derive(Debug, Clone, PartialEq)]
pub struct OpDiff {
    /// The op and its case (`"matmul Q4_1 m=1"`).
    pub op: String,
    /// Largest `|device − cpu|` over the result's elements.
    pub max_abs: f64,
    /// `max_abs` divided by the largest `|cpu|` (0 when the result is all zeros).
    pub max_rel: f64,
    /// Elements compared.
    pub elements: usize,
}

impl std::fmt::Display for OpDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<36} max abs {:.3e}  max rel {:.3e}  ({} values)",
            self.op, self.max_abs, self.max_rel, self.elements
        )
    }
}

pub(crate) fn diff(
    op: impl Into<String>,
    got: &[f32],
    want: &[f32],
) -> Result<OpDiff, KernelError> {
    if got.len() != want.len() {
        return Err(KernelError::Shape(format!(
            "compare: {} values against {}",
            got.len(),
            want.len()
        )));
    }
    let mut max_abs = 0.0f64;
    let mut scale = 0.0f64;
    for (&g, &w) in got.iter().zip(want) {
        let (g, w) = (g as f64, w as f64);
        if w.is_infinite() || g.is_infinite() {
            // -inf log-sum-exp of an empty shard must match exactly.
            if g != w {
                max_abs = f64::INFINITY;
            }
            continue;
        }
        max_abs = max_abs.max((g - w).abs());
        scale = scale.max(w.abs());
    }
    Ok(OpDiff {
        op: op.into(),
        max_abs,
        max_rel: if scale > 0.0 { max_abs / scale } else { 0.0 },
        elements: got.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_reports_the_largest_error_relative_to_the_reference_scale() {
        let d = diff(
            "x",
            &[1.0, 2.5, f32::NEG_INFINITY],
            &[1.0, 2.0, f32::NEG_INFINITY],
        )
        .unwrap();
        assert_eq!(d.max_abs, 0.5);
        assert_eq!(d.max_rel, 0.25);
        let d = diff("x", &[0.0], &[f32::NEG_INFINITY]).unwrap();
        assert!(d.max_abs.is_infinite());
        assert!(diff("x", &[0.0], &[]).is_err());
    }
}
