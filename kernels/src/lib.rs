//! dcpserve-kernels: the compute backends of dcpserve.
//!
//! [`Backend`] is the device seam ([`backend`]): buffers, allocation, host transfers and
//! every op a forward pass uses, split into memory, queue and op traits it unites. [`CpuBackend`] implements it with the CPU kernels in [`cpu`]: a
//! low-latency thread pool, weight matrices in GGML/float formats with
//! (de)quantization, an AVX-512 matmul (with a portable scalar fallback), element-wise
//! ops and RoPE (incl. YaRN and Llama 3 scaling), paged attention and MLA latent
//! attention returning log-sum-exp for decode context parallelism, MoE routing and
//! sampling. [`CudaBackend`] ([`cuda`]) implements it on an NVIDIA GPU (cudarc, NVRTC
//! kernels, cuBLAS; the libraries are loaded at run time, so it builds everywhere). [`DType`] is the one
//! element type of weights and buffers. DCP's placement, layout, merge and attention
//! step live in [`dcp`]; the communicators and their bootstrap from group specs in
//! [`comm`].

pub mod backend;
pub mod comm;
pub mod cpu;
pub mod cuda;
pub mod cuda_comm;
pub mod dcp;
pub mod device;
pub mod dtype;
pub mod error;
pub mod kv_dtype;
pub mod link_model;
pub mod overlap;
pub mod row_sampling;
pub mod sampling_params;
mod shape_checks;
pub mod step_graph;

// The CPU kernel modules, also at the crate root where callers have always found them.
pub use cpu::{
    attention, latent_attention, matmul, moe_routing, ops, pool, quant, sampling, spec_sampling,
    weights,
};

pub use attention::{
    paged_attention, paged_attention_typed, write_kv, write_kv_typed, AttentionBatch,
};
pub use backend::{
    yarn_mscale, AttentionOps, Backend, DenseOps, DeviceMemory, HostViews, KvStorage,
    LatentAttentionParams, PagedAttentionParams, PagedBatch, Precision, Rng, RopeScalingKind,
    RouterParams, RouterScoring, Routing, SamplingOps, SharedBytes, StepQueues, Strided,
    WeightMatrix, WeightStorage, YarnParams,
};
pub use comm::{
    Collectives, Communicator, Elems, ElemsMut, HostCollectives, InProcessComm, SoloCollectives,
};
pub use cpu::int8_matmul::{matmul_int8, CpuMatmul, Int8Isa};
pub use cpu::kv_store::{KvMut, KvRef, KvStore};
pub use cpu::{features, force_scalar, CpuBackend, CpuFeatures};
pub use cuda::{cuda_device_count, cuda_total_memory, CudaBackend};
pub use dcp::{merge_partials, DcpAttention, Layout, MergeExchange, Placement};
pub use device::{CudaGraphs, Device, GpuMatmul};
pub use dtype::{DType, QK_K};
pub use error::KernelError;
pub use kv_dtype::{fp8_scale_value, KvCacheDType};
pub use latent_attention::{latent_attention, latent_attention_typed, LatentBatch};
pub use link_model::{LinkModel, ModeledLink};
pub use matmul::{matmul, matmul_fast, matmul_with_precision};
pub use moe_routing::route_experts;
pub use ops::{
    add_bias, add_inplace, log_softmax, rms_norm, rms_norm_inplace, silu_mul, softmax_inplace,
    RopeTable,
};
pub use overlap::{BatonComm, BatonTurn, ComputeBaton};
pub use pool::{available_cores, online_cores, pin_current_thread, ThreadPool};
pub use quant::{dequantize, quantize, WeightFormat};
pub use sampling::{argmax, sample};
pub use sampling_params::{OutputConstraint, SamplingParams};
