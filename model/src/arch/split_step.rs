//! A step as one prefill-context-parallel copy of the TP group computes it: its own
//! tokens through every linear layer, the whole group's tokens through attention, and
//! the rows whose logits are wanted gathered from the copies that computed them.

use dcpserve_kernels::dcp::PrefillSplit;
use dcpserve_kernels::{Backend, Strided};

use super::batch_input::BatchInput;
use super::head::head_logits;
use super::rank_io::RankComms;
use super::workspace::HeadBuffers;
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

/// Rows of the whole step wanted on every rank (the logits' rows, the hidden states'
/// rows), and where each comes from.
struct WantedRows {
    /// For each wanted row, in the step's order: (copy, its index among that copy's
    /// wanted rows).
    src: Vec<(usize, usize)>,
    /// This copy's own-row indices of its wanted rows, in the step's order.
    own: Vec<usize>,
    /// The most wanted rows any copy holds.
    per_part: usize,
}

impl WantedRows {
    /// `wanted` (step indices) mapped through `row_in_part` (step index → (copy, own row)).
    fn new(
        wanted: &[usize],
        row_in_part: &[(usize, usize)],
        parts: usize,
        mine: usize,
    ) -> Result<Self, ModelError> {
        let mut per_part = vec![0usize; parts];
        let mut src = Vec::with_capacity(wanted.len());
        let mut own = Vec::new();
        for &j in wanted {
            let (p, k) = *row_in_part
                .get(j)
                .ok_or_else(|| ModelError::Invalid(format!("row {j} asked for beyond the step")))?;
            src.push((p, per_part[p]));
            per_part[p] += 1;
            if p == mine {
                own.push(k);
            }
        }
        Ok(Self {
            src,
            own,
            per_part: per_part.into_iter().max().unwrap_or(0),
        })
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
    att_seq: Vec<u32>,
    att_kv_lens: Vec<u32>,
    logits: WantedRows,
    hidden: WantedRows,
}

impl SplitStep {
    /// Splits `input` (the whole step, with this rank's slots and local KV lengths) as
    /// `split` says; `hidden_for` are the rows whose hidden states the step returns.
    pub(crate) fn new(
        input: &BatchInput,
        hidden_for: &[usize],
        split: PrefillSplit,
    ) -> Result<Self, ModelError> {
        input.checked_len()?;
        let parts = split.pcp.max(1);
        let mine = split.pcp_rank.min(parts - 1);
        let assigned = split.assign(input.positions);
        let per_part = assigned.iter().map(Vec::len).max().unwrap_or(0);
        let own = &assigned[mine];
        let pick = |v: &[u32]| own.iter().map(|&j| v[j]).collect::<Vec<_>>();
        // Index of each step token within its copy's rows.
        let mut row_in_part = vec![(0, 0); input.tokens.len()];
        for (p, rows) in assigned.iter().enumerate() {
            for (k, &j) in rows.iter().enumerate() {
                row_in_part[j] = (p, k);
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
            att_seq,
            att_kv_lens,
            logits: WantedRows::new(input.logits_for, &row_in_part, parts, mine)?,
            hidden: WantedRows::new(hidden_for, &row_in_part, parts, mine)?,
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
            logits_for: &self.logits.own,
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
        self.logits.src.len()
    }

    /// The rows whose hidden states the step returns, gathered like
    /// [`SplitStep::gather_rows`] gathers the logits' rows (`[hidden_for.len(), h]`).
    pub(crate) fn gather_hidden_rows<B: Backend>(
        &self,
        dev: &B,
        comms: &RankComms<B>,
        x: &B::Buffer,
        h: usize,
    ) -> Result<B::Buffer, ModelError> {
        self.gather(dev, comms, x, h, &self.hidden)
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
        self.gather(dev, comms, x, h, &self.logits)
    }

    /// The output head (`norm`, then `head` of `vocab` rows split over the TP group) over
    /// the wanted rows of the whole step, gathered from the copies that computed them
    /// ([`SplitStep::gather_rows`]; `x` holds this copy's rows of `h` values): the logits
    /// of the step's `logits_for`, in its order, into `bufs`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn head_logits<B: Backend>(
        &self,
        dev: &B,
        comms: &RankComms<B>,
        (x, h): (&B::Buffer, usize),
        norm: (&B::Buffer, f32),
        head: &B::Matrix,
        vocab: usize,
        bufs: &mut HeadBuffers<B>,
    ) -> Result<(), ModelError> {
        let rows = self.gather_rows(dev, comms, x, h)?;
        let all: Vec<usize> = (0..self.logits_len()).collect();
        head_logits(
            dev,
            comms,
            &rows,
            (all.len(), h),
            &all,
            norm,
            head,
            vocab,
            bufs,
        )
    }

    fn gather<B: Backend>(
        &self,
        dev: &B,
        comms: &RankComms<B>,
        x: &B::Buffer,
        h: usize,
        rows: &WantedRows,
    ) -> Result<B::Buffer, ModelError> {
        let m = rows.per_part;
        let mut out = dev.zeros((rows.src.len() * h).max(1))?;
        if m == 0 {
            return Ok(out);
        }
        let mut send = dev.zeros(m * h)?;
        for (k, &j) in rows.own.iter().enumerate() {
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
        for (i, &(p, k)) in rows.src.iter().enumerate() {
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
