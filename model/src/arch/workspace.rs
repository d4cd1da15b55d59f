//! The per-rank scratch of a forward pass: every activation buffer of a step, allocated
//! once through the backend for the largest step seen so far and reused. One
//! [`Workspace`] shape serves every model kind; what differs is the set of per-token
//! buffers ([`TokenBuffers`]: [`DenseBuffers`] here, the MLA model's in `mla/`).

use std::sync::Mutex;

use dcpserve_kernels::dcp::DcpAttention;
use dcpserve_kernels::{Backend, MergeExchange};

use super::cache_access::lock;
use crate::error::ModelError;

/// Grows `buf` to at least `len` elements (contents are not kept).
pub(crate) fn grow<B: Backend>(dev: &B, buf: &mut B::Buffer, len: usize) -> Result<(), ModelError> {
    if dev.len(buf) < len {
        *buf = dev.alloc(len)?;
    }
    Ok(())
}

/// All of `buf`, read-only.
pub(crate) fn whole<'a, B: Backend>(
    dev: &B,
    buf: &'a B::Buffer,
) -> Result<B::View<'a>, ModelError> {
    Ok(dev.view(buf, 0..dev.len(buf))?)
}

/// Buffers of the final norm and output head: the picked rows and their norm, this
/// rank's logits slice, the gathered slices and the assembled logits. They persist
/// across steps, so a decode step allocates nothing (a CUDA graph may replay it).
pub struct HeadBuffers<B: Backend> {
    pub(crate) picked: B::Buffer,
    pub(crate) normed: B::Buffer,
    pub(crate) local: B::Buffer,
    pub(crate) gathered: B::Buffer,
    pub(crate) logits: B::Buffer,
}

impl<B: Backend> HeadBuffers<B> {
    /// Empty buffers, grown on first use.
    pub fn new(dev: &B) -> Result<Self, ModelError> {
        Ok(Self {
            picked: dev.alloc(0)?,
            normed: dev.alloc(0)?,
            local: dev.alloc(0)?,
            gathered: dev.alloc(0)?,
            logits: dev.alloc(0)?,
        })
    }
}

/// A model kind's per-token activation buffers: allocated for a number of tokens and
/// replaced, larger, when a step has more.
pub trait TokenBuffers<B: Backend>: Sized + Send {
    /// The widths per token the buffers are sized from.
    type Widths: Copy + Send;
    /// Buffers for steps of up to `tokens` tokens.
    fn alloc(dev: &B, widths: Self::Widths, tokens: usize) -> Result<Self, ModelError>;
}

/// One forward's buffers on the backend, sized for `tokens` tokens; a step with more
/// tokens grows them (once), a smaller one uses their prefix. The output head's buffers
/// and the DCP step's exchange buffers grow on their own and survive that.
pub struct Workspace<B: Backend, T: TokenBuffers<B>> {
    widths: T::Widths,
    tokens: usize,
    /// The per-token activation buffers.
    pub(crate) t: T,
    pub(crate) head: HeadBuffers<B>,
    /// The DCP attention step, with its exchange buffers on the backend.
    pub(crate) dcp: DcpAttention<B>,
}

impl<B: Backend, T: TokenBuffers<B>> Workspace<B, T> {
    /// Buffers for steps of up to `tokens` tokens.
    pub(crate) fn new(dev: &B, widths: T::Widths, tokens: usize) -> Result<Self, ModelError> {
        Ok(Self {
            widths,
            tokens,
            t: T::alloc(dev, widths, tokens)?,
            head: HeadBuffers::new(dev)?,
            dcp: DcpAttention::new(MergeExchange::default()),
        })
    }

    /// Tokens a step may have without the buffers growing.
    pub fn capacity_tokens(&self) -> usize {
        self.tokens
    }

    /// Makes room for a step of `tokens` tokens whose DCP partials travel by `exchange`.
    pub(crate) fn prepare(
        &mut self,
        dev: &B,
        tokens: usize,
        exchange: MergeExchange,
    ) -> Result<(), ModelError> {
        if tokens > self.tokens {
            self.t = T::alloc(dev, self.widths, tokens)?;
            self.tokens = tokens;
        }
        if exchange != self.dcp.exchange() {
            self.dcp = DcpAttention::new(exchange);
        }
        Ok(())
    }
}

/// The workspaces of one model: one per forward that may run at the same time (the
/// rank's micro-batches), taken for a step and given back after it. Each is tagged
/// with the micro-batch ([`micro_batch`](dcpserve_kernels::StepQueues::micro_batch)) whose queue allocated and last used
/// it and is only taken by that micro-batch again: on a GPU two micro-batches run on
/// two streams that do not order with each other, so a workspace handed across could
/// still be in use by the other stream's kernels.
pub(crate) struct WorkspacePool<B: Backend, T: TokenBuffers<B>> {
    free: Mutex<Vec<(usize, Workspace<B, T>)>>,
}

impl<B: Backend, T: TokenBuffers<B>> WorkspacePool<B, T> {
    pub(crate) fn new() -> Self {
        Self {
            free: Mutex::new(Vec::new()),
        }
    }

    /// Drops every free workspace (their sizes no longer fit the model).
    pub(crate) fn clear(&self) {
        lock(&self.free).clear();
    }

    /// Allocates a workspace for steps of up to `max_tokens` tokens now, for the
    /// calling thread's micro-batch.
    pub(crate) fn reserve(
        &self,
        dev: &B,
        widths: T::Widths,
        max_tokens: usize,
    ) -> Result<(), ModelError> {
        let ws = Workspace::new(dev, widths, max_tokens)?;
        lock(&self.free).push((dev.micro_batch(), ws));
        Ok(())
    }

    /// Runs `f` in a free workspace of the calling thread's micro-batch (or a new one,
    /// grown by the step itself), then returns the workspace to the pool.
    pub(crate) fn run<R>(
        &self,
        dev: &B,
        widths: T::Widths,
        f: impl FnOnce(&mut Workspace<B, T>) -> Result<R, ModelError>,
    ) -> Result<R, ModelError> {
        let mb = dev.micro_batch();
        let taken = {
            let mut free = lock(&self.free);
            let mine = free.iter().rposition(|(tag, _)| *tag == mb);
            mine.map(|i| free.swap_remove(i).1)
        };
        let mut ws = match taken {
            Some(ws) => ws,
            None => Workspace::new(dev, widths, 0)?,
        };
        let out = f(&mut ws);
        lock(&self.free).push((mb, ws));
        out
    }
}

/// Widths per token of a dense decoder's activations on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Widths {
    /// Hidden size.
    pub hidden: usize,
    /// This rank's query heads × head dim.
    pub q: usize,
    /// This rank's KV heads × head dim.
    pub kv: usize,
    /// This rank's MLP intermediate slice.
    pub inter: usize,
}

/// A dense decoder step's per-token buffers.
pub struct DenseBuffers<B: Backend> {
    pub(crate) x: B::Buffer,
    pub(crate) normed: B::Buffer,
    pub(crate) q: B::Buffer,
    pub(crate) k: B::Buffer,
    pub(crate) v: B::Buffer,
    pub(crate) attn: B::Buffer,
    pub(crate) proj: B::Buffer,
    pub(crate) gate: B::Buffer,
    pub(crate) up: B::Buffer,
    pub(crate) act: B::Buffer,
}

impl<B: Backend> TokenBuffers<B> for DenseBuffers<B> {
    type Widths = Widths;

    fn alloc(dev: &B, widths: Widths, n: usize) -> Result<Self, ModelError> {
        let Widths {
            hidden: h,
            q,
            kv,
            inter,
        } = widths;
        Ok(Self {
            x: dev.alloc(n * h)?,
            normed: dev.alloc(n * h)?,
            q: dev.alloc(n * q)?,
            k: dev.alloc(n * kv)?,
            v: dev.alloc(n * kv)?,
            attn: dev.alloc(n * q)?,
            proj: dev.alloc(n * h)?,
            gate: dev.alloc(n * inter)?,
            up: dev.alloc(n * inter)?,
            act: dev.alloc(n * inter)?,
        })
    }
}

/// A dense decoder's workspace.
pub type DenseWorkspace<B> = Workspace<B, DenseBuffers<B>>;
