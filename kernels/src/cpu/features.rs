//! Runtime CPU feature detection and the switch that forces the portable scalar path.
//!
//! Every kernel has an AVX-512 implementation and a scalar fallback. The fallback is
//! chosen when the CPU lacks the features, when `DCPSERVE_FORCE_SCALAR=1` is set in
//! the environment, or after [`force_scalar`]`(true)` (handy in tests).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The instruction-set extensions the kernels care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuFeatures {
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// AVX-512 byte/word instructions (masked 16-bit loads).
    pub avx512bw: bool,
    /// AVX-512 vector-length extensions (masked 128/256-bit ops).
    pub avx512vl: bool,
    /// AVX-512 BF16 dot products (`vdpbf16ps`).
    pub avx512bf16: bool,
    /// AVX-512 VNNI integer dot products.
    pub avx512vnni: bool,
    /// AVX2.
    pub avx2: bool,
    /// Fused multiply-add.
    pub fma: bool,
    /// Half-precision conversions.
    pub f16c: bool,
}

impl CpuFeatures {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            CpuFeatures {
                avx512f: is_x86_feature_detected!("avx512f"),
                avx512bw: is_x86_feature_detected!("avx512bw"),
                avx512vl: is_x86_feature_detected!("avx512vl"),
                avx512bf16: is_x86_feature_detected!("avx512bf16"),
                avx512vnni: is_x86_feature_detected!("avx512vnni"),
                avx2: is_x86_feature_detected!("avx2"),
                fma: is_x86_feature_detected!("fma"),
                f16c: is_x86_feature_detected!("f16c"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            CpuFeatures::default()
        }
    }

    /// True when the AVX-512 kernels can run (F, BW, VL, FMA and F16C).
    pub fn has_avx512_kernels(&self) -> bool {
        self.avx512f && self.avx512bw && self.avx512vl && self.fma && self.f16c
    }
}

/// The features of the running CPU, detected once.
///
/// ```
/// let f = dcpserve_kernels::cpu::features();
/// println!("avx512f: {}", f.avx512f);
/// ```
pub fn features() -> &'static CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    FEATURES.get_or_init(CpuFeatures::detect)
}

// 0 = not decided yet (read the env var), 1 = SIMD allowed, 2 = scalar forced.
static FORCE: AtomicU8 = AtomicU8::new(0);

/// Forces (or stops forcing) the scalar fallback for all kernels, process-wide.
pub fn force_scalar(on: bool) {
    FORCE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// True when the scalar path is forced by [`force_scalar`] or `DCPSERVE_FORCE_SCALAR`.
pub fn scalar_forced() -> bool {
    match FORCE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let forced = std::env::var("DCPSERVE_FORCE_SCALAR")
                .map(|v| !v.is_empty() && v != "0")
                .unwrap_or(false);
            // Only the first decision sticks, unless force_scalar overrides it later.
            let _ = FORCE.compare_exchange(
                0,
                if forced { 2 } else { 1 },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            FORCE.load(Ordering::Relaxed) == 2
        }
    }
}

/// True when the AVX-512 kernels should be used right now.
#[inline]
pub fn use_avx512() -> bool {
    features().has_avx512_kernels() && !scalar_forced()
}

/// True when the `avx512bf16` fast path may be used (see `matmul_fast`).
#[inline]
pub fn use_avx512_bf16() -> bool {
    use_avx512() && features().avx512bf16
}
