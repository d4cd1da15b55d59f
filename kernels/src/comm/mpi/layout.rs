//! How an MPI group's members are spread over processes: each process's members are one
//! block of the group order, and MPI phases move data per process.

use std::ops::Range;

use crate::error::KernelError;

/// How a group's members are spread over processes.
pub(super) struct Layout {
    /// Members in the group.
    pub(super) size: usize,
    /// Group ranks hosted by each distinct process, in order of first appearance.
    pub(super) spans: Vec<Range<usize>>,
    /// This process's index in `spans`.
    pub(super) me: usize,
}

impl Layout {
    pub(super) fn mine(&self) -> Range<usize> {
        self.spans[self.me].clone()
    }

    pub(super) fn multi(&self) -> bool {
        self.spans.len() > 1
    }

    /// Values per process when each member holds `per_member`.
    pub(super) fn proc_counts(&self, per_member: usize) -> Vec<usize> {
        self.spans.iter().map(|s| s.len() * per_member).collect()
    }
}

/// The distinct processes of `processes` in order of first appearance, with the group
/// ranks each hosts; fails unless each process's members are contiguous.
pub(super) fn spans(processes: &[usize]) -> Result<Vec<(usize, Range<usize>)>, KernelError> {
    let mut out: Vec<(usize, Range<usize>)> = Vec::new();
    for (i, &p) in processes.iter().enumerate() {
        match out.last_mut() {
            Some((q, span)) if *q == p => span.end = i + 1,
            _ => {
                if out.iter().any(|(q, _)| *q == p) {
                    return Err(KernelError::Comm(format!(
                        "MPI group layout {processes:?}: the members of process {p} are not contiguous in group order (hierarchical collectives need each process's members in one block)"
                    )));
                }
                out.push((p, i..i + 1));
            }
        }
    }
    Ok(out)
}

/// `n` values split into `parts` near-equal blocks (the first `n % parts` one longer).
pub(super) fn split(n: usize, parts: usize) -> Vec<usize> {
    (0..parts)
        .map(|q| n / parts + usize::from(q < n % parts))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_need_contiguous_members_per_process() {
        let s = spans(&[0, 0, 1]).unwrap();
        assert_eq!(s, vec![(0, 0..2), (1, 2..3)]);
        let s = spans(&[2, 0, 0, 1]).unwrap();
        assert_eq!(s, vec![(2, 0..1), (0, 1..3), (1, 3..4)]);
        let err = spans(&[0, 1, 0]).unwrap_err();
        assert!(err.to_string().contains("not contiguous"), "{err}");
    }

    #[test]
    fn blocks_split_evenly() {
        assert_eq!(split(7, 3), vec![3, 2, 2]);
        assert_eq!(split(1, 3), vec![1, 0, 0]);
        assert_eq!(split(0, 2), vec![0, 0]);
    }
}
