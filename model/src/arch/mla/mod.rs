//! Multi-head latent attention models: DeepSeek-V2 / V3 and Kimi K2, computed through the
//! rank's [`Backend`](dcpserve_kernels::Backend).
//!
//! The KV cache stores one latent row per token per layer (`kv_lora_rank +
//! qk_rope_head_dim` values: the normalized `c_kv` and the roped shared key), never
//! expanded keys and values. Attention always absorbs `kv_b_proj`: each head's no-rope
//! query goes through W_UKᵀ into latent space and is concatenated with its roped part,
//! attention runs against the latent rows (values are their `c_kv` prefix), and W_UV then
//! `o_proj` turn the attended latents into the output. Under tensor parallelism heads are
//! split and the latent cache is replicated; under decode context parallelism it is
//! sharded by position and the absorbed queries of the DCP group are gathered (the one
//! DCP attention step, `dcpserve_kernels::dcp::DcpAttention`).

pub mod cache;
pub mod device_weights;
pub mod hf;
mod layer;
pub mod model;
pub mod moe;
pub mod mtp;
mod mtp_forward;
pub mod rope;
pub mod weights;
mod workspace;

pub use cache::LatentCache;
pub use device_weights::{DeviceMlaWeights, DeviceMtp};
pub use model::MlaModel;
pub use mtp::MtpLayer;
pub use workspace::MlaWorkspace;
