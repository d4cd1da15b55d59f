//! A step as one prefill-context-parallel copy of the TP group computes it: its own
//! tokens through every linear layer, the whole group's tokens through attention, and
//! the rows whose logits are wanted gathered from the copies that computed them.

use dcpserve_kernels::dcp::PrefillSplit;
use dcpserve_kernels::{Backend, Strided};

use super::forward::BatchInput;
use super::rank_io::RankComms;
use crate::error::ModelError;

/// The tokens attention runs over on this rank: the step's own tokens, or with prefill
/// context parallelism every copy's tokens, `per_part` per copy (padding rows attend to
/// nothing: their KV length is 0).
pub(crate) struct AttendBatch<'a> {
    pub token_seq: &'a [u32],
    pub kv_lens: &'a [u32],
    /// Copies whose tokens are stacked (1 without prefill context parallelism).
    pub parts: usize,
    /// Rows per copy.
    pub per_part: usize,
}

impl<'a> AttendBatch<'a> {
    /// Attention over the step's own tokens.
    pub(crate) fn of(input: &'a BatchInput<'a>) -> Self {
        Self {
            token_seq: input.token_seq,
            kv_lens: input.kv_lens,
            parts: 1,
            per_part: input.tokens.len(),
        }
    }

    /// Rows attended on this rank (every copy's).
    pub(crate) fn len(&self) -> usize {
        self.parts * self.per_part
    }
}

/// A step's tokens split over the copies ([`PrefillSplit`]): this copy's share as a
/// [`BatchInput`] of its own, and what attention and the output head need of the rest.
pub(crate) struct SplitStep {
    parts: usize,
    per_part: usize,
    tokens: Vec<u32>,
    positions: Vec<usize>,
    token_seq: Vec<u32>,
    slots: Vec<usize>,
    kv_lens: Vec<u32>,
    /// Own-row indices of this copy's tokens whose logits are wanted, in step order.
    own_logits: Vec<usize>,
    att_seq: Vec<u32>,
    att_kv_lens: Vec<u32>,
    /// For each wanted row of the step: (copy, its index among that copy's wanted rows).
    logits_src: Vec<(usize, usize)>,
    logits_per_part: usize,
}

impl SplitStep {
    /// Splits `input` (the whole step, with this rank's slots and local KV lengths) as
    /// `split` says.
    pub(crate) fn new(input: &BatchInput, split: PrefillSplit) -> Result<Self, ModelError> {
        input.checked_len()?;
        let parts = split.pcp.max(1);
        let assigned = split.assign(input.positions);
        let per_part = assigned.iter().map(Vec::len).max().unwrap_or(0);
        let own = &assigned[split.pcp_rank.min(parts - 1)];
        let pick = |v: &[u32]| own.iter().map(|&j| v[j]).collect::<Vec<_>>();
        // Index of each step token within its copy's rows.
        let mut row_in_part = vec![(0, 0); input.tokens.len()];
        for (p, rows) in assigned.iter().enumerate() {
            for (k, &j) in rows.iter().enumerate() {
                row_in_part[j] = (p, k);
            }
        }
        let mut wanted_per_part = vec![0usize; parts];
        let mut logits_src = Vec::with_capacity(input.logits_for.len());
        let mut own_logits = Vec::new();
        for &j in input.logits_for {
            let (p, k) = *row_in_part.get(j).ok_or_else(|| {
                ModelError::Invalid(format!("logits asked for token {j} beyond the step"))
            })?;
            logits_src.push((p, wanted_per_part[p]));
            wanted_per_part[p] += 1;
            if p == split.pcp_rank {
                own_logits.push(k);
            }
        }
        let mut att_seq = Vec::with_capacity(parts * per_part);
        let mut att_kv_lens = Vec::with_capacity(parts * per_part);
        for rows in &assigned {
            att_seq.extend(rows.iter().map(|&j| input.token_seq[j]));
            att_kv_lens.extend(rows.iter().map(|&j| input.kv_lens[j]));
            let pad = per_part - rows.len();
            att_seq.extend(std::iter::repeat_n(0, pad));
            att_kv_lens.extend(std::iter::repeat_n(0, pad));
        }
        Ok(Self {
            parts,
            per_part,
            tokens: pick(input.tokens),
            positions: own.iter().map(|&j| input.positions[j]).collect(),
            token_seq: pick(input.token_seq),
            slots: own.iter().map(|&j| input.slots[j]).collect(),
            kv_lens: pick(input.kv_lens),
            own_logits,
            att_seq,
            att_kv_lens,
            logits_src,
            logits_per_part: wanted_per_part.into_iter().max().unwrap_or(0),
        })
    }

    /// This copy's tokens as a step of their own (the block tables of the whole step).
    pub(crate) fn input<'a>(&'a self, whole: &BatchInput<'a>) -> BatchInput<'a> {
        BatchInput {
            tokens: &self.tokens,
            positions: &self.positions,
            token_seq: &self.token_seq,
            slots: &self.slots,
            kv_lens: &self.kv_lens,
            block_tables: whole.block_tables,
            logits_for: &self.own_logits,
        }
    }

    /// Every copy's tokens, as attention runs over them.
    pub(crate) fn attend(&self) -> AttendBatch<'_> {
        AttendBatch {
            token_seq: &self.att_seq,
            kv_lens: &self.att_kv_lens,
            parts: self.parts,
            per_part: self.per_part,
        }
    }

    /// Rows whose logits the whole step wants.
    pub(crate) fn logits_len(&self) -> usize {
        self.logits_src.len()
    }

    /// The wanted rows of the step's residual stream (`[logits_len, h]`, in the step's
    /// order), gathered from the copies that computed them; `x` holds this copy's rows.
    /// Every rank of the context-parallel group must call it.
    pub(crate) fn gather_rows<B: Backend>(
        &self,
        dev: &B,
        comms: &RankComms<B>,
        x: &B::Buffer,
        h: usize,
    ) -> Result<B::Buffer, ModelError> {
        let m = self.logits_per_part;
        let mut out = dev.zeros((self.logits_len() * h).max(1))?;
        if m == 0 {
            return Ok(out);
        }
        let mut send = dev.zeros(m * h)?;
        for (k, &j) in self.own_logits.iter().enumerate() {
            copy_row(dev, x, j, &mut send, k, h)?;
        }
        let group = comms.dcp.as_ref();
        let ranks = group.size();
        let mut recv = dev.zeros(ranks * m * h)?;
        group.all_gather(
            dev,
            dev.view(&send, 0..m * h)?,
            dev.view_mut(&mut recv, 0..ranks * m * h)?,
        )?;
        // Ranks of one copy hold the same rows (the residual stream is whole on every
        // TP rank): take each copy's first.
        let per_copy = ranks / self.parts;
        for (i, &(p, k)) in self.logits_src.iter().enumerate() {
            copy_row(dev, &recv, p * per_copy * m + k, &mut out, i, h)?;
        }
        Ok(out)
    }
}

/// Row `from` of `src` into row `to` of `dst`, rows of `h` values.
fn copy_row<B: Backend>(
    dev: &B,
    src: &B::Buffer,
    from: usize,
    dst: &mut B::Buffer,
    to: usize,
    h: usize,
) -> Result<(), ModelError> {
    let s = dev.view(src, from * h..(from + 1) * h)?;
    let d = dev.view_mut(dst, to * h..(to + 1) * h)?;
    dev.copy_strided((s, Strided::packed(h)), (d, Strided::packed(h)), 1, h)?;
    Ok(())
}
