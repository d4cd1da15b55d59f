//! The latent KV cache of one rank: per layer, one row of `kv_lora_rank + qk_rope_head_dim`
//! values per slot (`[num_blocks, block_size, 1, latent_dim]`), the normalized latent `c_kv`
//! followed by the roped shared key `k_pe`. Keys and values are both read from these rows
//! (values are the `c_kv` prefix), so there is no separate V cache. Values are stored in
//! the chosen [`KvCacheDType`].

use dcpserve_kernels::dcp::kv_bytes_per_token;
use dcpserve_kernels::{Backend, CpuBackend, KvCacheDType};

use crate::error::ModelError;

/// Paged latent storage for all layers of one rank, owned as backend buffers.
pub struct LatentCache<B: Backend = CpuBackend> {
    pub num_blocks: usize,
    pub block_size: usize,
    /// Values per token per layer (`kv_lora_rank + qk_rope_head_dim`).
    pub latent_dim: usize,
    /// How each value is stored.
    pub dtype: KvCacheDType,
    layers: Vec<B::KvBuffer>,
    /// Token rows written per layer since allocation (diagnostic: what DCP left on this rank).
    written: Vec<usize>,
}

impl<B: Backend> LatentCache<B> {
    /// Allocates `num_blocks` blocks for `n_layers` layers on `dev`, values stored as
    /// `dtype` (zeroed, so on the CPU untouched pages cost no RAM).
    pub fn new(
        dev: &B,
        dtype: KvCacheDType,
        n_layers: usize,
        num_blocks: usize,
        block_size: usize,
        latent_dim: usize,
    ) -> Result<Self, ModelError> {
        let per_layer = num_blocks * block_size * latent_dim;
        Ok(Self {
            num_blocks,
            block_size,
            latent_dim,
            dtype,
            layers: (0..n_layers)
                .map(|_| dev.kv_zeros(dtype, per_layer, latent_dim))
                .collect::<Result<_, _>>()?,
            written: vec![0; n_layers],
        })
    }

    /// Token rows written to each layer since allocation; a slot written twice (a
    /// recomputed sequence) counts twice. Tokens another DCP rank stores are not counted.
    pub fn tokens_written(&self) -> &[usize] {
        &self.written
    }

    /// Bytes one token occupies on one rank across all layers (one latent row each, with
    /// FP8's scale byte).
    pub fn bytes_per_token(&self) -> usize {
        kv_bytes_per_token(self.num_layers(), 1, self.latent_dim, self.dtype)
    }

    /// Bytes the cache occupies (all layers).
    pub fn bytes(&self) -> usize {
        self.capacity_tokens() * self.bytes_per_token()
    }

    /// Layers the cache holds.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Number of token slots.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }

    fn layer_len(&self) -> usize {
        self.capacity_tokens() * self.latent_dim
    }

    /// Layer `layer`'s rows.
    pub fn layer<'a>(&'a self, dev: &B, layer: usize) -> Result<B::KvView<'a>, ModelError> {
        let len = self.layer_len();
        match self.layers.get(layer) {
            Some(l) => Ok(dev.kv_view(l, 0..len)?),
            None => Err(self.no_layer(layer)),
        }
    }

    /// Stores `rows` (`[slots.len(), latent_dim]`) at `slots`; `usize::MAX` skips a token
    /// (one another DCP rank stores).
    pub fn write(
        &mut self,
        dev: &B,
        layer: usize,
        slots: &[usize],
        rows: B::View<'_>,
    ) -> Result<(), ModelError> {
        let (len, d) = (self.layer_len(), self.latent_dim);
        let err = self.no_layer(layer);
        let (Some(cache), Some(written)) =
            (self.layers.get_mut(layer), self.written.get_mut(layer))
        else {
            return Err(err);
        };
        *written += dev.write_rows(dev.kv_view_mut(cache, 0..len)?, d, slots, rows)?;
        Ok(())
    }

    fn no_layer(&self, layer: usize) -> ModelError {
        ModelError::Invalid(format!(
            "latent cache layer {layer} requested of a {}-layer cache",
            self.layers.len()
        ))
    }
}
