//! What a rank's backend is built from ([`RankSettings`]), and the flags that set it on the
//! command line and in a TOML model entry ([`RankSettingsFlags`]).
//!
//! The settings travel as one value from [`EngineConfig`](crate::EngineConfig) through
//! the rank group, the MPI rank spec and the draft model to the rank that builds its
//! backend, so a new backend setting is a field here and a line where the backend is
//! built (see `docs/adding-a-setting.md`).

use serde::{Deserialize, Serialize};

use dcpserve_kernels::{CpuMatmul, CudaGraphs, Device, GpuMatmul, KernelError};

use crate::parallel::ConfigError;

/// The settings a rank builds its compute backend from: the same for every rank of a
/// model (and its draft model), and sent as they are to ranks in other processes.
///
/// Settings derived per model (KV blocks, threads per rank, the resolved KV-cache and
/// weight types) are not here: the supervisor computes them and sends them beside.
///
/// ```
/// use dcpserve_config::RankSettings;
/// use dcpserve_kernels::{CudaGraphs, Device, GpuMatmul};
/// let s = RankSettings::default();
/// assert_eq!((s.device, s.gpu_matmul, s.cuda_graphs), (Device::Cpu, GpuMatmul::Bf16, CudaGraphs::On));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RankSettings {
    /// Where the ranks compute (`--device`): CPU, or CUDA GPUs (rank `r` on visible GPU
    /// `r mod count`).
    pub device: Device,
    /// How the CPU multiplies by quantized weights: int8 activations with integer dot
    /// products (`int8`, on AVX-512 VNNI / AVX-VNNI / AVX2), dequantized f32 (`f32`), or
    /// `auto` (per product: int8 for Q4_K/Q5_K/Q6_K at decode sizes, f32 otherwise, unless
    /// `DCPSERVE_CPU_MATMUL` names a path; see `dcpserve_kernels::CpuMatmul`). GPU ranks
    /// ignore it.
    pub cpu_matmul: CpuMatmul,
    /// How GPU ranks multiply by bf16 weights (`--gpu-matmul`): cuBLAS bf16 tensor-core
    /// GEMMs with f32 accumulation (`bf16`, the default, as vLLM) or f32 activations
    /// (`exact`, closest to the CPU engine). CPU ranks ignore it.
    pub gpu_matmul: GpuMatmul,
    /// Whether GPU ranks replay decode steps from CUDA graphs (`--cuda-graphs`): `on`
    /// (the default, as vLLM) or `off` (every kernel launched one by one, as vLLM's
    /// `--enforce-eager`). CPU ranks ignore it.
    pub cuda_graphs: CudaGraphs,
    /// How long, in microseconds, an idle CPU worker thread spins waiting for the next
    /// kernel before it sleeps (`--cpu-spin-us`; `None`: the thread pool's default, 100).
    /// Spinning saves the wake-up latency between a step's kernels; less of it wastes
    /// less CPU where ranks share their cores with other work. GPU ranks ignore it.
    pub cpu_spin_us: Option<u32>,
}

/// The longest spin `--cpu-spin-us` accepts: a second (beyond that, waiting idle is all
/// cost).
pub const MAX_CPU_SPIN_US: u32 = 1_000_000;

/// The flags of [`RankSettings`]: flattened into the engine subcommands and `serve` on
/// the command line, and into a `[[models]]` entry of the TOML file under the same names
/// (`--gpu-matmul exact` is `gpu_matmul = "exact"`). A flag left out is `None` and takes
/// its default in [`RankSettingsFlags::rank_settings`]; the defaults are written in the
/// help by hand because clap shows no default for an optional flag.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RankSettingsFlags {
    /// Where the ranks compute: cpu, or cuda (rank r on visible GPU r mod count; the
    /// CUDA backend has not run on a GPU yet) [default: cpu]
    #[arg(long)]
    #[serde(deserialize_with = "named::device")]
    pub device: Option<Device>,
    /// With --device cuda: bf16 (cuBLAS bf16 tensor-core GEMMs with f32 accumulation, as
    /// vLLM) or exact (f32 activations times bf16 weights, closest to the CPU engine)
    /// [default: bf16]
    #[arg(long)]
    #[serde(deserialize_with = "named::gpu_matmul")]
    pub gpu_matmul: Option<GpuMatmul>,
    /// GPU ranks: replay decode steps from CUDA graphs (on, the default) or launch every
    /// kernel one by one (off, like vLLM's --enforce-eager) [default: on]
    #[arg(long)]
    #[serde(deserialize_with = "named::cuda_graphs")]
    pub cuda_graphs: Option<CudaGraphs>,
    /// Quantized (Q8_0/Q4_x/Q5_x/K-quant/IQ4) weights on the CPU: int8 (activations
    /// quantized to int8 per 32-block, VNNI/AVX2 integer dot products), f32 (weights
    /// decoded to f32), or auto (int8 for Q4_K/Q5_K/Q6_K at decode sizes, f32 for the
    /// rest, unless DCPSERVE_CPU_MATMUL names a path) [default: auto]
    // A string, parsed in `rank_settings`, so that the aliases of `CpuMatmul::from_str`
    // (`float32`, `i8`) work in the TOML file as on the command line.
    #[arg(long)]
    #[serde(deserialize_with = "named::cpu_matmul")]
    pub cpu_matmul: Option<String>,
    /// CPU ranks: microseconds an idle worker thread spins for the next kernel before it
    /// sleeps (0 sleeps at once: least CPU wasted when cores are shared; more: lower
    /// latency between kernels), at most 1000000 [default: 100]
    #[arg(long)]
    #[serde(deserialize_with = "named::cpu_spin_us")]
    pub cpu_spin_us: Option<u32>,
}

/// Deserializers of the flags that name their key in errors: the values of a flattened
/// struct reach serde after toml has lost track of their keys, and its message would only
/// point at the `[[models]]` line.
mod named {
    use serde::de::{Deserialize, Deserializer, Error};

    use super::{CudaGraphs, Device, GpuMatmul};

    macro_rules! named {
        ($($key:ident: $ty:ty),* $(,)?) => {$(
            pub(super) fn $key<'de, D: Deserializer<'de>>(d: D) -> Result<Option<$ty>, D::Error> {
                Option::<$ty>::deserialize(d)
                    .map_err(|e| D::Error::custom(format!("{}: {e}", stringify!($key))))
            }
        )*};
    }

    named!(
        device: Device,
        gpu_matmul: GpuMatmul,
        cuda_graphs: CudaGraphs,
        cpu_matmul: String,
        cpu_spin_us: u32,
    );
}

impl RankSettingsFlags {
    /// The settings these flags ask for, defaults for the ones left out.
    ///
    /// ```
    /// use dcpserve_config::{RankSettings, RankSettingsFlags};
    /// use dcpserve_kernels::{CpuMatmul, GpuMatmul};
    /// let flags = RankSettingsFlags { gpu_matmul: Some(GpuMatmul::Exact), cpu_matmul: Some("i8".into()), ..Default::default() };
    /// let s = flags.rank_settings().unwrap();
    /// assert_eq!((s.gpu_matmul, s.cpu_matmul), (GpuMatmul::Exact, CpuMatmul::Int8));
    /// assert_eq!(RankSettingsFlags::default().rank_settings().unwrap(), RankSettings::default());
    /// ```
    pub fn rank_settings(&self) -> Result<RankSettings, ConfigError> {
        let d = RankSettings::default();
        Ok(RankSettings {
            device: self.device.unwrap_or(d.device),
            cpu_matmul: match &self.cpu_matmul {
                Some(s) => s
                    .parse()
                    .map_err(|e: KernelError| ConfigError(e.to_string()))?,
                None => d.cpu_matmul,
            },
            gpu_matmul: self.gpu_matmul.unwrap_or(d.gpu_matmul),
            cuda_graphs: self.cuda_graphs.unwrap_or(d.cuda_graphs),
            cpu_spin_us: match self.cpu_spin_us {
                Some(us) if us > MAX_CPU_SPIN_US => {
                    return Err(ConfigError(format!(
                        "cpu_spin_us must be at most {MAX_CPU_SPIN_US} (one second), got {us}"
                    )))
                }
                spin => spin,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks in other processes get the settings inside their JSON rank spec.
    #[test]
    fn settings_round_trip_through_json() {
        let s = RankSettings {
            device: Device::Cuda,
            cpu_matmul: CpuMatmul::Int8,
            gpu_matmul: GpuMatmul::Exact,
            cuda_graphs: CudaGraphs::Off,
            cpu_spin_us: Some(20),
        };
        let back: RankSettings = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    /// Flattened into the engine config, the settings keep their top-level keys.
    #[test]
    fn the_engine_config_keeps_its_keys() {
        let mut cfg = crate::EngineConfig::default();
        cfg.rank_settings.gpu_matmul = GpuMatmul::Exact;
        let json = serde_json::to_value(&cfg).unwrap();
        assert_eq!(json["gpu_matmul"], "exact");
        assert_eq!(json["device"], "cpu");
        assert!(json.get("rank_settings").is_none(), "{json}");
        let back: crate::EngineConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, cfg);
        let e = serde_json::from_str::<crate::EngineConfig>(r#"{"bogus": 1}"#).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }

    #[test]
    fn a_bad_cpu_matmul_names_the_choices() {
        let flags = RankSettingsFlags {
            cpu_matmul: Some("int4".into()),
            ..Default::default()
        };
        let e = flags.rank_settings().unwrap_err();
        assert!(e.0.contains("int4") && e.0.contains("int8"), "{e}");
    }

    #[test]
    fn cpu_spin_is_bounded_and_defaults_to_the_pool_s_own() {
        let flags = |us| RankSettingsFlags {
            cpu_spin_us: Some(us),
            ..Default::default()
        };
        assert_eq!(
            RankSettingsFlags::default()
                .rank_settings()
                .unwrap()
                .cpu_spin_us,
            None
        );
        assert_eq!(flags(0).rank_settings().unwrap().cpu_spin_us, Some(0));
        assert_eq!(
            flags(MAX_CPU_SPIN_US).rank_settings().unwrap().cpu_spin_us,
            Some(MAX_CPU_SPIN_US)
        );
        let e = flags(MAX_CPU_SPIN_US + 1).rank_settings().unwrap_err();
        assert!(e.0.contains("cpu_spin_us must be at most 1000000"), "{e}");
        let toml: RankSettingsFlags = toml::from_str("cpu_spin_us = 5").unwrap();
        assert_eq!(toml.cpu_spin_us, Some(5));
        let e = toml::from_str::<RankSettingsFlags>("cpu_spin_us = -1").unwrap_err();
        assert!(e.to_string().contains("cpu_spin_us"), "{e}");
    }
}
