//! The latent KV cache of one rank: per layer, one row of `kv_lora_rank + qk_rope_head_dim`
//! values per slot (`[num_blocks, block_size, 1, latent_dim]`), the normalized latent `c_kv`
//! followed by the roped shared key `k_pe`. Keys and values are both read from these rows
//! (values are the `c_kv` prefix), so there is no separate V cache.

use crate::error::ModelError;

/// Paged latent storage for all layers of one rank.
pub struct LatentCache {
    pub num_blocks: usize,
    pub block_size: usize,
    /// Values per token per layer (`kv_lora_rank + qk_rope_head_dim`).
    pub latent_dim: usize,
    layers: Vec<Vec<f32>>,
    /// Token rows written per layer since allocation (diagnostic: what DCP left on this rank).
    written: Vec<usize>,
}

impl LatentCache {
    /// Allocates `num_blocks` blocks for `n_layers` layers (zeroed, so untouched pages cost no RAM).
    pub fn new(n_layers: usize, num_blocks: usize, block_size: usize, latent_dim: usize) -> Self {
        let per_layer = num_blocks * block_size * latent_dim;
        Self {
            num_blocks,
            block_size,
            latent_dim,
            layers: (0..n_layers).map(|_| vec![0.0; per_layer]).collect(),
            written: vec![0; n_layers],
        }
    }

    /// Token rows written to each layer since allocation; a slot written twice (a
    /// recomputed sequence) counts twice. Tokens another DCP rank stores are not counted.
    pub fn tokens_written(&self) -> &[usize] {
        &self.written
    }

    /// Bytes one token occupies on one rank across all layers (f32, one latent row per layer).
    pub fn bytes_per_token(n_layers: usize, latent_dim: usize) -> usize {
        n_layers * latent_dim * std::mem::size_of::<f32>()
    }

    /// Bytes the cache occupies (all layers, f32).
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.len()).sum::<usize>() * std::mem::size_of::<f32>()
    }

    /// Layers the cache holds.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Number of token slots.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Layer `layer`'s rows.
    pub fn layer(&self, layer: usize) -> &[f32] {
        &self.layers[layer]
    }

    /// Stores `rows` (`[slots.len(), latent_dim]`) at `slots`; `usize::MAX` skips a token
    /// (one another DCP rank stores).
    pub fn write(&mut self, layer: usize, slots: &[usize], rows: &[f32]) -> Result<(), ModelError> {
        let d = self.latent_dim;
        if rows.len() != slots.len() * d || layer >= self.layers.len() {
            return Err(ModelError::Invalid(format!(
                "latent cache write: {} values for {} slots of {d} in layer {layer}",
                rows.len(),
                slots.len()
            )));
        }
        let cache = &mut self.layers[layer];
        let n_slots = cache.len() / d.max(1);
        for (t, &s) in slots.iter().enumerate() {
            if s == usize::MAX {
                continue;
            }
            if s >= n_slots {
                return Err(ModelError::Invalid(format!(
                    "kv slot {s} is outside the latent cache ({n_slots} slots)"
                )));
            }
            cache[s * d..(s + 1) * d].copy_from_slice(&rows[t * d..(t + 1) * d]);
            self.written[layer] += 1;
        }
        Ok(())
    }
}
