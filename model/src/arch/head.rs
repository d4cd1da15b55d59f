//! The last step of every decoder (dense and MLA): pick the tokens whose logits are
//! wanted, final norm, output head, and the vocabulary gathered across ranks.

use dcpserve_kernels::{Backend, Collectives, Precision, Strided};

use super::rank_io::{ForwardOutput, RankComms};
use super::weights::split_range;
use super::workspace::{grow, whole, HeadBuffers};
use crate::error::ModelError;

/// Rows `rows` of `x` (`[n, h]`, the buffer's prefix), RMS-normalized with `norm`, into
/// `bufs.normed` (its `rows.len() · h` prefix).
#[allow(clippy::too_many_arguments)]
pub(crate) fn pick_normed<B: Backend>(
    dev: &B,
    x: &B::Buffer,
    n: usize,
    h: usize,
    rows: &[usize],
    norm: &B::Buffer,
    eps: f32,
    bufs: &mut HeadBuffers<B>,
) -> Result<(), ModelError> {
    let len = rows.len() * h;
    grow(dev, &mut bufs.picked, len)?;
    grow(dev, &mut bufs.normed, len)?;
    for (j, &t) in rows.iter().enumerate() {
        if t >= n {
            return Err(ModelError::Invalid(format!(
                "row {t} requested of a {n}-token batch"
            )));
        }
        dev.copy(
            dev.view(x, t * h..(t + 1) * h)?,
            dev.view_mut(&mut bufs.picked, j * h..(j + 1) * h)?,
        )?;
    }
    dev.rms_norm(
        dev.view(&bufs.picked, 0..len)?,
        whole(dev, norm)?,
        eps,
        dev.view_mut(&mut bufs.normed, 0..len)?,
    )?;
    Ok(())
}

/// The final `norm`, then the output `head` (this rank's vocabulary slice), for the
/// tokens `rows` of `x` (`[n, h]`, the buffer's prefix); the logits are gathered over the
/// vocabulary across ranks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_logits<B: Backend>(
    dev: &B,
    comms: &RankComms<B>,
    x: &B::Buffer,
    (n, h): (usize, usize),
    rows: &[usize],
    (norm, eps): (&B::Buffer, f32),
    head: &B::Matrix,
    vocab: usize,
    bufs: &mut HeadBuffers<B>,
) -> Result<ForwardOutput<B>, ModelError> {
    let m = rows.len();
    pick_normed(dev, x, n, h, rows, norm, eps, bufs)?;
    let slice = dev.matrix_shape(head).0;
    let mut local = dev.zeros(m * slice)?;
    if m > 0 {
        dev.matmul(
            dev.view(&bufs.normed, 0..m * h)?,
            m,
            head,
            dev.view_mut(&mut local, 0..m * slice)?,
            Precision::Exact,
        )?;
    }
    let logits = if comms.world.size() == 1 {
        local
    } else {
        let local = dev.view(&local, 0..m * slice)?;
        gather_vocab(dev, comms.world.as_ref(), local, m, vocab)?
    };
    Ok(ForwardOutput {
        logits,
        vocab_size: vocab,
    })
}

/// Reassembles `[m, vocab]` logits from every rank's `[m, vocab slice]`.
fn gather_vocab<B: Backend>(
    dev: &B,
    world: &dyn Collectives<B>,
    local: B::View<'_>,
    m: usize,
    vocab: usize,
) -> Result<B::Buffer, ModelError> {
    let tp = world.size();
    let parts: Vec<std::ops::Range<usize>> = (0..tp).map(|r| split_range(vocab, tp, r)).collect();
    let counts: Vec<usize> = parts.iter().map(|p| p.len() * m).collect();
    let mut gathered = dev.alloc(m * vocab)?;
    let mut logits = dev.alloc(m * vocab)?;
    let all = dev.view_mut(&mut gathered, 0..m * vocab)?;
    world.all_gather_varying(dev, local, &counts, all)?;
    // Rank r's part is `[m, its slice]`: its rows go to columns `parts[r]` of `[m, vocab]`.
    let mut at = 0;
    for p in &parts {
        let w = p.len();
        let src = (dev.view(&gathered, at..at + w * m)?, Strided::packed(w));
        let dst = (
            dev.view_mut(&mut logits, 0..m * vocab)?,
            Strided::new(vocab, p.start),
        );
        dev.copy_strided(src, dst, m, w)?;
        at += w * m;
    }
    Ok(logits)
}
