//! The CPU backend's kernels: AVX-512 and AVX2 code (x86-64), NEON code (aarch64) and
//! portable scalar fallbacks (the level from [`isa`]), run on a
//! low-latency [`ThreadPool`](pool::ThreadPool).
//!
//! Every function here works on host slices (`&[f32]`); [`crate::CpuBackend`] exposes
//! them through the [`crate::Backend`] trait without copies. The modules are also
//! re-exported at the crate root (`dcpserve_kernels::matmul`, …) because the model and
//! the actors call them directly today.

pub mod attention;
mod backend;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod block32;
mod features;
pub mod int16_matmul;
pub mod int8_matmul;
pub mod kquants;
pub mod kv_store;
pub mod latent_attention;
pub mod matmul;
pub mod moe_routing;
pub mod ops;
pub mod pool;
pub mod quant;
pub mod rows;
pub mod sampling;
pub mod spec_sampling;
pub mod weights;

pub use backend::CpuBackend;
pub use features::{
    features, force_scalar, isa, isa_cap, scalar_forced, set_isa_cap, use_avx2, use_avx512,
    use_avx512_bf16, CpuFeatures, CpuIsa,
};
