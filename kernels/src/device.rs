//! Which device a model's ranks compute on (`--device cpu|cuda`), and which GPU each rank
//! gets.

use serde::{Deserialize, Serialize};

use crate::error::KernelError;

/// The device kind of a model's ranks: `--device`, `device = "…"` in a TOML model entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// CPU ranks (the default; the only kind that has run so far).
    #[default]
    Cpu,
    /// NVIDIA GPU ranks through the CUDA driver; rank `r` on GPU [`gpu_for_rank`].
    Cuda,
}

impl std::str::FromStr for Device {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self, KernelError> {
        match s.trim() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            other => Err(KernelError::Shape(format!(
                "unknown device `{other}`: expected cpu or cuda"
            ))),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        })
    }
}

/// How a GPU rank multiplies activations by bf16 weights (`--gpu-matmul`).
///
/// ```
/// use dcpserve_kernels::device::GpuMatmul;
/// assert_eq!("exact".parse::<GpuMatmul>().unwrap(), GpuMatmul::Exact);
/// assert_eq!(GpuMatmul::default(), GpuMatmul::Bf16);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuMatmul {
    /// cuBLAS bf16 tensor-core GEMMs with f32 accumulation, activations rounded to bf16
    /// (vLLM's way; the default).
    #[default]
    Bf16,
    /// f32 activations times bf16 weights in f32 (no activation rounding): the
    /// reference path that matches the CPU engine closely, slower for large batches.
    Exact,
}

impl std::str::FromStr for GpuMatmul {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self, KernelError> {
        match s.trim() {
            "bf16" => Ok(GpuMatmul::Bf16),
            "exact" => Ok(GpuMatmul::Exact),
            other => Err(KernelError::Shape(format!(
                "unknown GPU matmul `{other}`: expected bf16 or exact"
            ))),
        }
    }
}

impl std::fmt::Display for GpuMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GpuMatmul::Bf16 => "bf16",
            GpuMatmul::Exact => "exact",
        })
    }
}

/// Whether a GPU rank replays its decode steps from CUDA graphs (`--cuda-graphs`).
///
/// ```
/// use dcpserve_kernels::device::CudaGraphs;
/// assert_eq!("off".parse::<CudaGraphs>().unwrap(), CudaGraphs::Off);
/// assert_eq!(CudaGraphs::default(), CudaGraphs::On);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CudaGraphs {
    /// Decode steps are captured once per shape and replayed while their launches are
    /// provably the same (see [`step_graph`](crate::step_graph)); the default, as in
    /// vLLM.
    #[default]
    On,
    /// Every kernel is launched one by one (vLLM's `--enforce-eager`).
    Off,
}

impl std::str::FromStr for CudaGraphs {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self, KernelError> {
        match s.trim() {
            "on" => Ok(CudaGraphs::On),
            "off" => Ok(CudaGraphs::Off),
            other => Err(KernelError::Shape(format!(
                "unknown CUDA graphs setting `{other}`: expected on or off"
            ))),
        }
    }
}

impl std::fmt::Display for CudaGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CudaGraphs::On => "on",
            CudaGraphs::Off => "off",
        })
    }
}

/// The GPU ordinal of global rank `rank` when `visible` GPUs are visible: `rank mod
/// visible`, so ranks share GPUs round-robin when there are more ranks than GPUs. The
/// ordinal counts visible GPUs only: the driver itself applies `CUDA_VISIBLE_DEVICES`.
/// `None` when no GPU is visible.
///
/// ```
/// use dcpserve_kernels::device::gpu_for_rank;
/// assert_eq!(gpu_for_rank(5, 4), Some(1));
/// assert_eq!(gpu_for_rank(3, 1), Some(0));
/// assert_eq!(gpu_for_rank(0, 0), None);
/// ```
pub fn gpu_for_rank(rank: usize, visible: usize) -> Option<usize> {
    rank.checked_rem(visible)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_go_round_robin_over_visible_gpus() {
        let on = |ranks: usize, visible: usize| -> Vec<Option<usize>> {
            (0..ranks).map(|r| gpu_for_rank(r, visible)).collect()
        };
        assert_eq!(on(4, 1), vec![Some(0); 4]);
        assert_eq!(on(4, 2), vec![Some(0), Some(1), Some(0), Some(1)]);
        assert_eq!(on(2, 8), vec![Some(0), Some(1)]);
        assert_eq!(on(2, 0), vec![None, None]);
    }

    #[test]
    fn gpu_matmul_parses_and_prints() {
        for m in [GpuMatmul::Bf16, GpuMatmul::Exact] {
            assert_eq!(m.to_string().parse::<GpuMatmul>().unwrap(), m);
        }
        assert!("f32"
            .parse::<GpuMatmul>()
            .unwrap_err()
            .to_string()
            .contains("bf16 or exact"));
    }

    #[test]
    fn cuda_graphs_parses_and_prints() {
        for m in [CudaGraphs::On, CudaGraphs::Off] {
            assert_eq!(m.to_string().parse::<CudaGraphs>().unwrap(), m);
        }
        assert!("yes"
            .parse::<CudaGraphs>()
            .unwrap_err()
            .to_string()
            .contains("on or off"));
    }

    #[test]
    fn device_parses_and_prints_lowercase() {
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda);
        assert_eq!(" cpu ".parse::<Device>().unwrap(), Device::Cpu);
        assert!("gpu"
            .parse::<Device>()
            .unwrap_err()
            .to_string()
            .contains("cpu or cuda"));
        assert_eq!(Device::Cuda.to_string(), "cuda");
        assert_eq!(serde_json::to_string(&Device::Cuda).unwrap(), "\"cuda\"");
        assert_eq!(Device::default(), Device::Cpu);
    }
}
