//! The paged KV cache of one rank: per layer, K and V of shape
//! `[num_blocks, block_size, n_kv_heads, head_dim]`.

/// Paged key/value storage for all layers of one rank.
pub struct KvCache {
    pub num_blocks: usize,
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    /// Allocates `num_blocks` blocks for `n_layers` layers (zeroed, so untouched pages cost no RAM).
    pub fn new(
        n_layers: usize,
        num_blocks: usize,
        block_size: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let per_layer = num_blocks * block_size * n_kv_heads * head_dim;
        Self {
            num_blocks,
            block_size,
            n_kv_heads,
            head_dim,
            k: (0..n_layers).map(|_| vec![0.0; per_layer]).collect(),
            v: (0..n_layers).map(|_| vec![0.0; per_layer]).collect(),
        }
    }

    /// Bytes one token occupies across all layers (K and V, f32).
    pub fn bytes_per_token(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> usize {
        2 * n_layers * n_kv_heads * head_dim * std::mem::size_of::<f32>()
    }

    /// Layers the cache holds.
    pub fn num_layers(&self) -> usize {
        self.k.len()
    }

    /// Number of token slots.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }

    pub(crate) fn layer_mut(&mut self, layer: usize) -> (&mut [f32], &mut [f32]) {
        (&mut self.k[layer], &mut self.v[layer])
    }

    pub(crate) fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }
}
