//! The paged KV cache of one rank: per layer, K and V of shape
//! `[num_blocks, block_size, n_kv_heads, head_dim]`, in KV buffers of the rank's backend
//! whose elements are stored in the chosen [`KvCacheDType`].

use dcpserve_kernels::dcp::kv_bytes_per_token;
use dcpserve_kernels::{Backend, CpuBackend, KvCacheDType};

use crate::error::ModelError;

/// Paged key/value storage for all layers of one rank, owned as backend buffers.
pub struct KvCache<B: Backend = CpuBackend> {
    pub num_blocks: usize,
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// How each value is stored.
    pub dtype: KvCacheDType,
    k: Vec<B::KvBuffer>,
    v: Vec<B::KvBuffer>,
}

impl<B: Backend> KvCache<B> {
    /// Allocates `num_blocks` blocks for `n_layers` layers on `dev`, values stored as
    /// `dtype` (zeroed, so on the CPU untouched pages cost no RAM).
    pub fn new(
        dev: &B,
        dtype: KvCacheDType,
        n_layers: usize,
        num_blocks: usize,
        block_size: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self, ModelError> {
        let per_layer = num_blocks * block_size * n_kv_heads * head_dim;
        let mut k = Vec::with_capacity(n_layers);
        let mut v = Vec::with_capacity(n_layers);
        for _ in 0..n_layers {
            k.push(dev.kv_zeros(dtype, per_layer, head_dim)?);
            v.push(dev.kv_zeros(dtype, per_layer, head_dim)?);
        }
        Ok(Self {
            num_blocks,
            block_size,
            n_kv_heads,
            head_dim,
            dtype,
            k,
            v,
        })
    }

    /// Bytes one token occupies across all layers (K and V of each head, and FP8's
    /// scale byte per head row).
    pub fn bytes_per_token(&self) -> usize {
        kv_bytes_per_token(
            self.num_layers(),
            2 * self.n_kv_heads,
            self.head_dim,
            self.dtype,
        )
    }

    /// Layers the cache holds.
    pub fn num_layers(&self) -> usize {
        self.k.len()
    }

    /// Number of token slots.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }

    fn layer_len(&self) -> usize {
        self.capacity_tokens() * self.n_kv_heads * self.head_dim
    }

    /// Layer `layer`'s K and V caches, writable.
    pub(crate) fn layer_mut<'a>(
        &'a mut self,
        dev: &B,
        layer: usize,
    ) -> Result<(B::KvViewMut<'a>, B::KvViewMut<'a>), ModelError> {
        let (len, layers) = (self.layer_len(), self.k.len());
        let (k, v) = match (self.k.get_mut(layer), self.v.get_mut(layer)) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(no_layer(layer, layers)),
        };
        Ok((dev.kv_view_mut(k, 0..len)?, dev.kv_view_mut(v, 0..len)?))
    }

    /// Layer `layer`'s K and V caches.
    pub(crate) fn layer<'a>(
        &'a self,
        dev: &B,
        layer: usize,
    ) -> Result<(B::KvView<'a>, B::KvView<'a>), ModelError> {
        let len = self.layer_len();
        match (self.k.get(layer), self.v.get(layer)) {
            (Some(k), Some(v)) => Ok((dev.kv_view(k, 0..len)?, dev.kv_view(v, 0..len)?)),
            _ => Err(no_layer(layer, self.k.len())),
        }
    }

    /// Layer `layer`'s K and V as f32 on the host, `[num_blocks, block_size, n_kv_heads,
    /// head_dim]` each: to inspect what a rank stores (tests, debugging), not on a hot
    /// path.
    ///
    /// ```
    /// use dcpserve_kernels::{CpuBackend, KvCacheDType};
    /// use dcpserve_model::arch::KvCache;
    /// let dev = CpuBackend::new(1);
    /// let cache = KvCache::new(&dev, KvCacheDType::F32, 2, 3, 16, 1, 8).unwrap();
    /// let (k, v) = cache.download_layer(&dev, 1).unwrap();
    /// assert_eq!((k.len(), v.len()), (3 * 16 * 8, 3 * 16 * 8));
    /// assert!(k.iter().all(|&x| x == 0.0));
    /// ```
    pub fn download_layer(
        &self,
        dev: &B,
        layer: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let (k, v) = self.layer(dev, layer)?;
        let mut hk = vec![0.0; self.layer_len()];
        let mut hv = vec![0.0; self.layer_len()];
        dev.kv_download(k, &mut hk)?;
        dev.kv_download(v, &mut hv)?;
        Ok((hk, hv))
    }
}

fn no_layer(layer: usize, layers: usize) -> ModelError {
    ModelError::Invalid(format!(
        "KV cache layer {layer} requested of a {layers}-layer cache"
    ))
}
