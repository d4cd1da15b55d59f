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
/// vocabulary across ranks into the prefix of `bufs.logits` (`[rows.len(), vocab]`). No
/// allocation once the buffers have grown ([`take_logits`] copies them out).
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
) -> Result<(), ModelError> {
    let m = rows.len();
    pick_normed(dev, x, n, h, rows, norm, eps, bufs)?;
    let slice = dev.matrix_shape(head).0;
    let alone = comms.world.size() == 1;
    grow(dev, &mut bufs.logits, m * vocab)?;
    if !alone {
        grow(dev, &mut bufs.local, m * slice)?;
    }
    if m > 0 {
        let local = if alone {
            &mut bufs.logits
        } else {
            &mut bufs.local
        };
        dev.matmul(
            dev.view(&bufs.normed, 0..m * h)?,
            m,
            head,
            dev.view_mut(local, 0..m * slice)?,
            Precision::Exact,
        )?;
    }
    if !alone {
        let world = comms.world.as_ref();
        gather_vocab(dev, world, m, vocab, slice, bufs)?;
    }
    Ok(())
}

/// The first `m` rows of logits [`head_logits`] left in `bufs`, as the step's output (a
/// buffer of their own: the workspace is reused by the next step).
pub(crate) fn take_logits<B: Backend>(
    dev: &B,
    bufs: &HeadBuffers<B>,
    m: usize,
    vocab: usize,
) -> Result<ForwardOutput<B>, ModelError> {
    Ok(ForwardOutput {
        logits: copy_out(dev, &bufs.logits, m * vocab)?,
        vocab_size: vocab,
        hidden: None,
    })
}

/// A new buffer holding the first `len` values of `src` (a step's result that outlives
/// the workspace).
pub(crate) fn copy_out<B: Backend>(
    dev: &B,
    src: &B::Buffer,
    len: usize,
) -> Result<B::Buffer, ModelError> {
    let mut out = dev.alloc(len)?;
    dev.copy(dev.view(src, 0..len)?, dev.view_mut(&mut out, 0..len)?)?;
    Ok(out)
}

/// Reassembles `[m, vocab]` logits in `bufs.logits` from every rank's `[m, vocab
/// slice]` (this rank's in `bufs.local`, `slice` wide).
fn gather_vocab<B: Backend>(
    dev: &B,
    world: &dyn Collectives<B>,
    m: usize,
    vocab: usize,
    slice: usize,
    bufs: &mut HeadBuffers<B>,
) -> Result<(), ModelError> {
    let tp = world.size();
    let parts: Vec<std::ops::Range<usize>> = (0..tp).map(|r| split_range(vocab, tp, r)).collect();
    let counts: Vec<usize> = parts.iter().map(|p| p.len() * m).collect();
    grow(dev, &mut bufs.gathered, m * vocab)?;
    let local = dev.view(&bufs.local, 0..m * slice)?;
    let all = dev.view_mut(&mut bufs.gathered, 0..m * vocab)?;
    world.all_gather_varying(dev, local, &counts, all)?;
    // Rank r's part is `[m, its slice]`: its rows go to columns `parts[r]` of `[m, vocab]`.
    let mut at = 0;
    for p in &parts {
        let w = p.len();
        let src = (
            dev.view(&bufs.gathered, at..at + w * m)?,
            Strided::packed(w),
        );
        let dst = (
            dev.view_mut(&mut bufs.logits, 0..m * vocab)?,
            Strided::new(vocab, p.start),
        );
        dev.copy_strided(src, dst, m, w)?;
        at += w * m;
    }
    Ok(())
}
