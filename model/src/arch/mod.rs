//! Decoder-only transformer architectures (Llama, Qwen2, Qwen3; DeepSeek-V2/V3 with MLA
//! in [`mla`]): both compute through the rank's
//! [`Backend`](dcpserve_kernels::Backend).
//!
//! The forward pass works on a flat batch of tokens from many sequences (continuous
//! batching): each token carries its sequence, position, KV slot and attention length,
//! and attention reads the paged KV cache through per-sequence block tables.

mod batch_input;
pub mod cache_access;
mod device_weights;
mod forward;
mod head;
mod kv_cache;
pub mod mla;
mod rank_io;
mod rank_model;
mod shell;
mod split_step;
mod weights;
mod workspace;

pub use batch_input::BatchInput;
pub use cache_access::{CacheAccess, TurnPoints};
pub use device_weights::{DeviceLayer, DeviceWeights};
pub use forward::DecoderModel;
pub use kv_cache::KvCache;
pub use mla::hf::{check_mla_config, mla_layer_tensors, mla_moe_from_json};
pub use mla::{LatentCache, MlaModel, MlaWorkspace, MtpLayer};
pub use rank_io::{ForwardOptions, ForwardOutput, RankComms};
pub use rank_model::{KvStorage, RankCache, RankModel};
pub use shell::ModelShell;
pub use weights::{
    split_range, DecoderWeights, HeadLayout, LayerWeights, TpShard, WeightPrecision,
};
pub use workspace::{HeadBuffers, Workspace};
