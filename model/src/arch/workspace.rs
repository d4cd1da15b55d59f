//! The per-rank scratch of the dense forward: every activation buffer of a step,
//! allocated once through the backend for the largest step seen so far and reused.

use dcpserve_kernels::dcp::DcpAttention;
use dcpserve_kernels::{Backend, MergeExchange};

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

/// Buffers of the final norm and output head: the picked rows and their norm.
pub struct HeadBuffers<B: Backend> {
    pub(crate) picked: B::Buffer,
    pub(crate) normed: B::Buffer,
}

impl<B: Backend> HeadBuffers<B> {
    /// Empty buffers, grown on first use.
    pub fn new(dev: &B) -> Result<Self, ModelError> {
        Ok(Self {
            picked: dev.alloc(0)?,
            normed: dev.alloc(0)?,
        })
    }
}

/// Widths per token of a dense decoder's activations on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Widths {
    /// Hidden size.
    pub hidden: usize,
    /// This rank's query heads × head dim.
    pub q: usize,
    /// This rank's KV heads × head dim.
    pub kv: usize,
    /// This rank's MLP intermediate slice.
    pub inter: usize,
}

/// One forward's buffers on the backend, sized for `tokens` tokens; a step with more
/// tokens grows them (once), a smaller one uses their prefix.
pub struct Workspace<B: Backend> {
    widths: Widths,
    tokens: usize,
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
    pub(crate) head: HeadBuffers<B>,
    /// The DCP attention step's exchange buffers (host memory, like the communicators).
    pub(crate) dcp: DcpAttention,
    exchange: MergeExchange,
}

impl<B: Backend> Workspace<B> {
    /// Buffers for steps of up to `tokens` tokens.
    pub(crate) fn new(dev: &B, widths: Widths, tokens: usize) -> Result<Self, ModelError> {
        let Widths {
            hidden: h,
            q,
            kv,
            inter,
        } = widths;
        let n = tokens;
        Ok(Self {
            widths,
            tokens,
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
            head: HeadBuffers::new(dev)?,
            dcp: DcpAttention::new(MergeExchange::default()),
            exchange: MergeExchange::default(),
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
            let head = std::mem::replace(&mut self.head, HeadBuffers::new(dev)?);
            let dcp = std::mem::take(&mut self.dcp);
            *self = Self {
                head,
                dcp,
                exchange: self.exchange,
                ..Self::new(dev, self.widths, tokens)?
            };
        }
        if exchange != self.exchange {
            self.dcp = DcpAttention::new(exchange);
            self.exchange = exchange;
        }
        Ok(())
    }
}
