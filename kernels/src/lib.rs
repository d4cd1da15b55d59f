//! dcpserve-kernels: the CPU compute kernels of dcpserve.
//!
//! Everything a rank needs to run a transformer forward pass on CPU: a low-latency
//! thread pool, weight matrices in GGML/float formats with (de)quantization, an
//! AVX-512 matmul (with a portable scalar fallback), element-wise ops and RoPE, paged
//! attention returning log-sum-exp for decode context parallelism, and sampling.

pub mod attention;
pub mod comm;
pub mod cpu;
pub mod error;
pub mod link_model;
pub mod matmul;
pub mod ops;
pub mod overlap;
pub mod pool;
pub mod quant;
pub mod sampling;
pub mod sampling_params;
pub mod spec_sampling;
pub mod weights;

pub use attention::{merge_partials, paged_attention, write_kv, AttentionBatch};
pub use comm::{Communicator, InProcessComm};
pub use cpu::{features, force_scalar, CpuFeatures};
pub use error::KernelError;
pub use link_model::{LinkModel, ModeledLink};
pub use matmul::{matmul, matmul_fast, matmul_with_precision, Precision};
pub use ops::{
    add_bias, add_inplace, log_softmax, rms_norm, rms_norm_inplace, silu_mul, softmax_inplace,
    RopeScalingKind, RopeTable,
};
pub use overlap::{BatonComm, BatonTurn, ComputeBaton};
pub use pool::{available_cores, pin_current_thread, ThreadPool};
pub use quant::{dequantize, quantize, WeightFormat};
pub use sampling::{argmax, sample, Rng, SamplingParams};
pub use weights::{SharedBytes, WeightMatrix};
