//! Decoder-only transformer architectures (Llama, Qwen2, Qwen3) on the CPU kernels.
//!
//! The forward pass works on a flat batch of tokens from many sequences (continuous
//! batching): each token carries its sequence, position, KV slot and attention length,
//! and attention reads the paged KV cache through per-sequence block tables.

mod forward;
mod kv_cache;
mod weights;

pub use forward::{BatchInput, DecoderModel, ForwardOutput, RankComms};
pub use kv_cache::KvCache;
pub use weights::{
    split_range, DecoderWeights, HeadLayout, LayerWeights, TpShard, WeightPrecision,
};
