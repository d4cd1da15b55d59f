//! Storage formats of weights and of the KV cache, and what one value costs in each.

use clap::ValueEnum;
use dcpserve_config::DType;
use dcpserve_kernels::KvCacheDType;

/// How the weights of linear layers are stored. Sizes include the block scales each
/// format carries, because those are read on every step too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WeightDtype {
    #[value(name = "f32")]
    F32,
    #[value(name = "bf16", alias = "f16")]
    Bf16,
    /// FP8 with per-block (128×128) scales, whose 4 bytes per 16,384 weights are ignored.
    #[value(name = "fp8")]
    Fp8,
    /// NVIDIA NVFP4: 4-bit values plus one FP8 scale per 16 values (4.5 bits).
    #[value(name = "nvfp4")]
    Nvfp4,
    /// OCP MXFP4: 4-bit values plus one 8-bit scale per 32 values (4.25 bits).
    #[value(name = "mxfp4")]
    Mxfp4,
    /// INT4 with one bf16 scale per 32 values (4.5 bits), as Kimi K2 Thinking ships.
    #[value(name = "int4")]
    Int4,
    /// GGUF Q8_0: 32 int8 values plus an f16 scale (8.5 bits).
    #[value(name = "q8_0")]
    Q8_0,
    /// GGUF Q4_0: 32 4-bit values plus an f16 scale (4.5 bits).
    #[value(name = "q4_0")]
    Q4_0,
    /// GGUF Q4_1: 32 4-bit values plus an f16 scale and an f16 minimum (5 bits).
    #[value(name = "q4_1")]
    Q4_1,
}

impl WeightDtype {
    /// Bits one weight costs, scales included.
    pub fn bits_per_param(self) -> f64 {
        match self {
            WeightDtype::F32 => 32.0,
            WeightDtype::Bf16 => 16.0,
            WeightDtype::Fp8 => 8.0,
            WeightDtype::Nvfp4 => 4.0 + 8.0 / 16.0,
            WeightDtype::Mxfp4 => 4.0 + 8.0 / 32.0,
            WeightDtype::Int4 => 4.0 + 16.0 / 32.0,
            WeightDtype::Q8_0 => (32.0 * 8.0 + 16.0) / 32.0,
            WeightDtype::Q4_0 => (32.0 * 4.0 + 16.0) / 32.0,
            WeightDtype::Q4_1 => (32.0 * 4.0 + 2.0 * 16.0) / 32.0,
        }
    }

    /// Bytes of `params` weights in this format.
    pub fn bytes(self, params: u64) -> f64 {
        params as f64 * self.bits_per_param() / 8.0
    }

    /// The name the command line uses.
    pub fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    /// The engine's `--dtype` for weights stored in this format: float32 for f32,
    /// bfloat16 for bf16, `auto` for quantized formats (which stay quantized).
    pub fn engine_dtype(self) -> DType {
        match self {
            WeightDtype::F32 => DType::Float32,
            WeightDtype::Bf16 => DType::Bfloat16,
            _ => DType::Auto,
        }
    }
}

/// How the KV cache stores one value: the command line's names for the engine's
/// [`KvCacheDType`] (`--kv-cache-dtype`), which sizes the cache; `fp8` is E4M3 (E5M2
/// costs the same byte, and both one scale byte per cached row). `auto` is resolved as the engine resolves it
/// ([`KvDtype::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvDtype {
    /// The engine's `auto`: float32 for f32 weights, bfloat16 otherwise.
    #[value(name = "auto")]
    Auto,
    #[value(name = "f32", alias = "float32")]
    F32,
    #[value(name = "bf16", alias = "bfloat16", alias = "f16")]
    Bf16,
    #[value(name = "fp8", alias = "fp8_e4m3")]
    Fp8,
    #[value(name = "fp8_e5m2")]
    Fp8E5M2,
}

impl KvDtype {
    /// The engine's element type when one is named; `None` for `auto` (as the engine's
    /// `EngineConfig::kv_cache_dtype` field).
    pub fn explicit(self) -> Option<KvCacheDType> {
        match self {
            KvDtype::Auto => None,
            KvDtype::F32 => Some(KvCacheDType::F32),
            KvDtype::Bf16 => Some(KvCacheDType::BF16),
            KvDtype::Fp8 => Some(KvCacheDType::Fp8E4M3),
            KvDtype::Fp8E5M2 => Some(KvCacheDType::Fp8E5M2),
        }
    }

    /// The element type the engine allocates with this setting and weights stored as
    /// `weights`: the engine's own resolution ([`DType::kv_cache_dtype`]).
    ///
    /// ```
    /// use dcpserve_kernels::KvCacheDType;
    /// use dcpserve_tools::planner::{KvDtype, WeightDtype};
    /// assert_eq!(KvDtype::Auto.resolve(WeightDtype::F32), KvCacheDType::F32);
    /// assert_eq!(KvDtype::Auto.resolve(WeightDtype::Q4_1), KvCacheDType::BF16);
    /// assert_eq!(KvDtype::Fp8.resolve(WeightDtype::F32), KvCacheDType::Fp8E4M3);
    /// ```
    pub fn resolve(self, weights: WeightDtype) -> KvCacheDType {
        weights.engine_dtype().kv_cache_dtype(self.explicit())
    }

    /// The command line's name for the engine's element type.
    pub fn of(dtype: KvCacheDType) -> Self {
        match dtype {
            KvCacheDType::F32 => KvDtype::F32,
            KvCacheDType::BF16 => KvDtype::Bf16,
            KvCacheDType::Fp8E4M3 => KvDtype::Fp8,
            KvCacheDType::Fp8E5M2 => KvDtype::Fp8E5M2,
        }
    }

    /// The name the command line uses.
    pub fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}
