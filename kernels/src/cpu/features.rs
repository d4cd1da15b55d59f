//! Runtime CPU feature detection and the instruction-set level the kernels run at.
//!
//! Every hot kernel has an AVX-512 path, an AVX2 + FMA path (x86-64), a NEON path
//! (aarch64) and a portable scalar fallback. [`isa`] picks the best level the CPU
//! supports, capped by `DCPSERVE_CPU_ISA=scalar|neon|avx2|avx512` (for tests and
//! same-machine comparisons; `DCPSERVE_FORCE_SCALAR=1` is the old spelling of `scalar`)
//! or by [`set_isa_cap`]. AMX is never used: the virtual machines list it without
//! enabling it.

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
    /// AArch64 Advanced SIMD (always present there, absent elsewhere).
    pub neon: bool,
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
                neon: false,
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            CpuFeatures {
                // Architecturally mandatory on AArch64 (the target's baseline); asked
                // anyway so a future soft-float target would fall back to scalar.
                neon: std::arch::is_aarch64_feature_detected!("neon"),
                ..CpuFeatures::default()
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            CpuFeatures::default()
        }
    }

    /// True when the AVX-512 kernels can run (F, BW, VL, FMA and F16C).
    pub fn has_avx512_kernels(&self) -> bool {
        self.avx512f && self.avx512bw && self.avx512vl && self.has_avx2_kernels()
    }

    /// True when the AVX2 kernels can run (AVX2, FMA and F16C).
    pub fn has_avx2_kernels(&self) -> bool {
        self.avx2 && self.fma && self.f16c
    }

    /// True when the NEON kernels can run (an AArch64 CPU).
    pub fn has_neon_kernels(&self) -> bool {
        self.neon && cfg!(target_arch = "aarch64")
    }

    /// True when the kernels of `level` can run on these features.
    pub fn supports(&self, level: CpuIsa) -> bool {
        match level {
            CpuIsa::Scalar => true,
            CpuIsa::Neon => self.has_neon_kernels(),
            CpuIsa::Avx2 => self.has_avx2_kernels(),
            CpuIsa::Avx512 => self.has_avx512_kernels(),
        }
    }

    /// The best kernel level these features allow.
    pub fn best_isa(&self) -> CpuIsa {
        if self.has_avx512_kernels() {
            CpuIsa::Avx512
        } else if self.has_avx2_kernels() {
            CpuIsa::Avx2
        } else if self.has_neon_kernels() {
            CpuIsa::Neon
        } else {
            CpuIsa::Scalar
        }
    }

    /// The best level these features allow that is not above `cap`. Not simply
    /// `best_isa().min(cap)`: the levels of the two architectures interleave, so an x86
    /// CPU capped at `neon` runs scalar code, never a level it lacks.
    pub fn best_isa_up_to(&self, cap: CpuIsa) -> CpuIsa {
        CpuIsa::ALL
            .into_iter()
            .rev()
            .find(|l| *l <= cap && self.supports(*l))
            .unwrap_or(CpuIsa::Scalar)
    }
}

/// The vector instruction level of the CPU kernels, ordered from least to most capable.
///
/// The x86-64 levels (`Avx2`, `Avx512`) and the aarch64 one (`Neon`) never run on the
/// same CPU. `Neon` sits between `Scalar` and `Avx2`, so the x86 code's
/// `isa >= CpuIsa::Avx2` tests stay false on aarch64, and a cap of `avx2` or `avx512`
/// leaves an aarch64 CPU at `Neon`; only x86 levels are ever above it.
///
/// ```
/// use dcpserve_kernels::cpu::CpuIsa;
/// assert_eq!("avx2".parse::<CpuIsa>().unwrap(), CpuIsa::Avx2);
/// assert!(CpuIsa::Scalar < CpuIsa::Neon && CpuIsa::Neon < CpuIsa::Avx2);
/// assert!(CpuIsa::Avx2 < CpuIsa::Avx512);
/// // Every level the running CPU has can be tested on it.
/// assert!(CpuIsa::available().contains(&CpuIsa::Scalar));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuIsa {
    /// Portable Rust (the compiler's baseline vectorization only).
    Scalar = 1,
    /// 128-bit AArch64 Advanced SIMD (NEON) with FMA.
    Neon = 2,
    /// 256-bit AVX2 + FMA + F16C.
    Avx2 = 3,
    /// 512-bit AVX-512 F/BW/VL (plus BF16 / VNNI where present).
    Avx512 = 4,
}

impl CpuIsa {
    /// Every level, least capable first.
    pub const ALL: [CpuIsa; 4] = [CpuIsa::Scalar, CpuIsa::Neon, CpuIsa::Avx2, CpuIsa::Avx512];

    /// The levels the running CPU can execute (whatever the cap), least capable first:
    /// what the kernel tests iterate over (scalar and NEON on aarch64; scalar and the
    /// AVX levels it has on x86-64).
    pub fn available() -> Vec<CpuIsa> {
        let f = features();
        CpuIsa::ALL.into_iter().filter(|l| f.supports(*l)).collect()
    }

    /// The level's name as `DCPSERVE_CPU_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            CpuIsa::Scalar => "scalar",
            CpuIsa::Neon => "neon",
            CpuIsa::Avx2 => "avx2",
            CpuIsa::Avx512 => "avx512",
        }
    }

    fn from_u8(v: u8) -> Option<CpuIsa> {
        CpuIsa::ALL.into_iter().find(|l| *l as u8 == v)
    }
}

impl std::fmt::Display for CpuIsa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CpuIsa {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" | "none" => Ok(CpuIsa::Scalar),
            "neon" | "asimd" => Ok(CpuIsa::Neon),
            "avx2" => Ok(CpuIsa::Avx2),
            "avx512" | "avx-512" => Ok(CpuIsa::Avx512),
            other => Err(format!(
                "unknown CPU ISA `{other}`: expected one of scalar, neon, avx2, avx512"
            )),
        }
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

// 0 = not decided yet (read the environment), otherwise a `CpuIsa` as u8 (the cap).
static CAP: AtomicU8 = AtomicU8::new(0);

/// The cap from the environment: `DCPSERVE_CPU_ISA` (`auto` or unset: none), or
/// `DCPSERVE_FORCE_SCALAR=1`. An unknown value is reported once and ignored.
fn env_cap() -> CpuIsa {
    let forced = std::env::var("DCPSERVE_FORCE_SCALAR")
        .map(|v| !v.is_empty() && v != "0")
        .unwrap_or(false);
    if forced {
        return CpuIsa::Scalar;
    }
    match std::env::var("DCPSERVE_CPU_ISA") {
        Ok(v) if !v.trim().is_empty() && v.trim() != "auto" => match v.parse::<CpuIsa>() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("DCPSERVE_CPU_ISA ignored: {e}");
                CpuIsa::Avx512
            }
        },
        _ => CpuIsa::Avx512,
    }
}

/// The cap in force ([`set_isa_cap`], else the environment).
pub fn isa_cap() -> CpuIsa {
    if let Some(l) = CpuIsa::from_u8(CAP.load(Ordering::Relaxed)) {
        return l;
    }
    let l = env_cap();
    // Only the first decision sticks, unless set_isa_cap overrides it later.
    let _ = CAP.compare_exchange(0, l as u8, Ordering::Relaxed, Ordering::Relaxed);
    CpuIsa::from_u8(CAP.load(Ordering::Relaxed)).unwrap_or(l)
}

/// Caps the kernel level process-wide (`None`: back to the environment's choice).
pub fn set_isa_cap(cap: Option<CpuIsa>) {
    CAP.store(cap.map_or(0, |l| l as u8), Ordering::Relaxed);
}

/// The level the kernels run at now: the CPU's best, capped.
///
/// ```
/// let level = dcpserve_kernels::cpu::isa();
/// assert!(level <= dcpserve_kernels::cpu::features().best_isa());
/// ```
#[inline]
pub fn isa() -> CpuIsa {
    let (f, cap) = (features(), isa_cap());
    let best = f.best_isa();
    if best <= cap {
        best
    } else {
        f.best_isa_up_to(cap)
    }
}

/// Forces (or stops forcing) the scalar fallback for all kernels, process-wide.
pub fn force_scalar(on: bool) {
    set_isa_cap(on.then_some(CpuIsa::Scalar));
}

/// True when the kernels run scalar code although the CPU has SIMD kernels because of
/// the cap ([`force_scalar`], `DCPSERVE_CPU_ISA=scalar`, `DCPSERVE_FORCE_SCALAR`).
pub fn scalar_forced() -> bool {
    isa_cap() == CpuIsa::Scalar
}

/// True when the AVX-512 kernels should be used right now.
#[inline]
pub fn use_avx512() -> bool {
    isa() == CpuIsa::Avx512
}

/// True when the AVX2 (or better) kernels should be used right now (never on
/// aarch64, whose levels all order below `Avx2`).
#[inline]
pub fn use_avx2() -> bool {
    isa() >= CpuIsa::Avx2
}

/// True when the `avx512bf16` fast path may be used (see `matmul_fast`).
#[inline]
pub fn use_avx512_bf16() -> bool {
    use_avx512() && features().avx512bf16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_limits_the_level_and_parses() {
        let f = features();
        let best = f.best_isa();
        for cap in CpuIsa::ALL {
            assert_eq!(cap.name().parse::<CpuIsa>().unwrap(), cap);
            // A cap never selects a level the CPU lacks (x86 capped at neon: scalar).
            let l = f.best_isa_up_to(cap);
            assert!(l <= cap && f.supports(l), "cap {cap}: {l}");
        }
        assert!("sse9".parse::<CpuIsa>().is_err());
        assert_eq!(CpuIsa::available().last().copied(), Some(best));
        assert_eq!(CpuIsa::available()[0], CpuIsa::Scalar);
        // NEON on aarch64 only, AVX on x86-64 only; the x86 kernels' `>= Avx2` tests
        // are false at every aarch64 level.
        #[cfg(target_arch = "aarch64")]
        {
            assert_eq!(best, CpuIsa::Neon);
            assert_eq!(f.best_isa_up_to(CpuIsa::Avx512), CpuIsa::Neon);
            assert!(CpuIsa::available().iter().all(|l| *l < CpuIsa::Avx2));
        }
        #[cfg(not(target_arch = "aarch64"))]
        assert!(!CpuIsa::available().contains(&CpuIsa::Neon));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(f.best_isa_up_to(CpuIsa::Neon), CpuIsa::Scalar);
    }
}
