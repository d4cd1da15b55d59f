//! [`AttentionOps`]: storing new tokens' K/V rows into paged caches, paged GQA and MLA
//! latent attention returning log-sum-exp, and the merge of partials over KV shards
//! (decode context parallelism); with what those calls are asked ([`PagedBatch`], the
//! block-table metadata every paged op shares, and the per-kind parameters embedding it).

use super::memory::KvStorage;
use crate::error::KernelError;

/// Where a batch of query tokens' cached keys live: the paged-cache metadata that paged
/// GQA attention and MLA latent attention share (the scheduler produces it on the host).
///
/// ```
/// use dcpserve_kernels::PagedBatch;
/// let table: &[u32] = &[3, 1];
/// let batch = PagedBatch { block_size: 4, token_seq: &[0, 0], token_kv_len: &[5, 6],
///     block_tables: &[table] };
/// assert_eq!(batch.n_tokens(), 2);
/// assert_eq!(batch.tokens(1..2).token_kv_len, [6]);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PagedBatch<'a> {
    /// Tokens per cache block.
    pub block_size: usize,
    /// Sequence index (into `block_tables`) of each token.
    pub token_seq: &'a [u32],
    /// Cached tokens (local indices `0..kv_len`) each token attends to; the caller has
    /// already applied the causal mask.
    pub token_kv_len: &'a [u32],
    /// Per sequence: local token `j` lives in slot
    /// `block_tables[s][j / block_size] * block_size + j % block_size`.
    pub block_tables: &'a [&'a [u32]],
}

impl<'a> PagedBatch<'a> {
    /// Query tokens in the batch.
    pub fn n_tokens(&self) -> usize {
        self.token_seq.len()
    }

    /// The tokens `range` of the batch (their sequences and lengths; the block tables
    /// are shared).
    pub fn tokens(&self, range: std::ops::Range<usize>) -> PagedBatch<'a> {
        PagedBatch {
            token_seq: &self.token_seq[range.clone()],
            token_kv_len: &self.token_kv_len[range],
            ..*self
        }
    }
}

/// Shape and step metadata of one [`AttentionOps::paged_attention`] call (the queries
/// are passed separately as a device view).
#[derive(Debug, Clone, Copy)]
pub struct PagedAttentionParams<'a> {
    /// Query heads.
    pub n_q_heads: usize,
    /// KV heads (query head `h` uses KV head `h / (n_q_heads / n_kv_heads)`, GQA).
    pub n_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Score scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// The tokens and where their cached keys live.
    pub batch: PagedBatch<'a>,
}

/// Shape and step metadata of one [`AttentionOps::latent_attention`] call (MLA with
/// absorbed weights: one latent KV head, values are the `v_dim` prefix of each key row).
#[derive(Debug, Clone, Copy)]
pub struct LatentAttentionParams<'a> {
    /// Query heads (all share the one latent KV head).
    pub n_heads: usize,
    /// Key width: the cache row (`kv_lora_rank + qk_rope_head_dim`).
    pub dim: usize,
    /// Value width: the row prefix attention averages (`kv_lora_rank`).
    pub v_dim: usize,
    /// Score scale (MLA: the softmax scale incl. YaRN's correction).
    pub scale: f32,
    /// The tokens and where their cached latent rows live.
    pub batch: PagedBatch<'a>,
}

/// The attention ops: KV stores into paged caches, attention over them returning
/// log-sum-exp so partials over KV shards merge exactly, and that merge.
pub trait AttentionOps: KvStorage {
    /// Stores K/V rows of new tokens into paged caches
    /// (`[num_blocks, block_size, n_kv_heads, head_dim]`), converted to the caches'
    /// element type; slot `usize::MAX` skips a token (one another DCP rank stores).
    #[allow(clippy::too_many_arguments)]
    fn write_kv(
        &self,
        k_cache: Self::KvViewMut<'_>,
        v_cache: Self::KvViewMut<'_>,
        n_kv_heads: usize,
        head_dim: usize,
        slots: &[usize],
        k: Self::View<'_>,
        v: Self::View<'_>,
    ) -> Result<(), KernelError>;
    /// Stores `width`-wide rows into a paged cache of such rows (MLA's latent cache,
    /// `[num_blocks, block_size, width]`): row `t` of `rows` goes to slot `slots[t]`;
    /// `usize::MAX` skips a token (one another DCP rank stores). Rows are converted to
    /// the cache's element type. Returns the rows stored.
    fn write_rows(
        &self,
        cache: Self::KvViewMut<'_>,
        width: usize,
        slots: &[usize],
        rows: Self::View<'_>,
    ) -> Result<usize, KernelError>;
    /// Paged GQA attention of `q` (`[n_tokens, n_q_heads, head_dim]`): the output
    /// `[n_tokens, n_q_heads, head_dim]` and its log-sum-exp `[n_tokens, n_q_heads]`
    /// (`-inf` and zeros for tokens without keys), so partials over KV shards merge.
    /// The caches are read in their element type (no dequantized copy of them).
    fn paged_attention(
        &self,
        q: Self::View<'_>,
        p: &PagedAttentionParams<'_>,
        k_cache: Self::KvView<'_>,
        v_cache: Self::KvView<'_>,
        out: Self::ViewMut<'_>,
        lse: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// MLA latent attention of absorbed queries `q` (`[n_tokens, n_heads, dim]`) against
    /// the latent cache: output `[n_tokens, n_heads, v_dim]` and log-sum-exp.
    fn latent_attention(
        &self,
        q: Self::View<'_>,
        p: &LatentAttentionParams<'_>,
        cache: Self::KvView<'_>,
        out: Self::ViewMut<'_>,
        lse: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// Merges attention partials over disjoint KV shards by their log-sum-exp: row `i`
    /// of part `p` is `partial_out[p][i·head_dim..]` with `partial_lse[p][i]`.
    fn merge_lse(
        &self,
        partial_out: &[Self::View<'_>],
        partial_lse: &[Self::View<'_>],
        n_rows: usize,
        head_dim: usize,
        out: Self::ViewMut<'_>,
        lse: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;

    /// Scales each attention partial by its shard's share of the merged log-sum-exp,
    /// the step before a reduce-scatter sums the shards (vLLM's `correct_attn_out`): row
    /// `i` (`head_dim` wide) of `out` is multiplied by `exp(lse[i] − LSE_i)`, where
    /// `LSE_i` merges `all_lse[p·n_rows + i]` over the `parts` shards (`n_rows` is
    /// `lse`'s length). An empty shard (`−inf`) gets weight 0.
    fn scale_by_lse_share(
        &self,
        out: Self::ViewMut<'_>,
        lse: Self::View<'_>,
        all_lse: Self::View<'_>,
        parts: usize,
        head_dim: usize,
    ) -> Result<(), KernelError>;
}
