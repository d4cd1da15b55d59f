//! Hardware presets (H100, H200, B200 and this CPU) and the figures the planner uses.

use clap::ValueEnum;
pub use dcpserve_config::{meminfo_bytes, KvBudgetRule};
use dcpserve_config::{SharedMemory, ACTIVATION_RESERVE_BYTES};

const GB: f64 = 1e9;
const GIB: f64 = (1u64 << 30) as f64;

/// The machines `--hardware` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HardwarePreset {
    /// NVIDIA H100 SXM: 80 GB HBM3, 3.35 TB/s, NVLink4.
    H100,
    /// NVIDIA H200: 141 GB HBM3e, 4.8 TB/s, NVLink4.
    H200,
    /// NVIDIA B200: 180 GB HBM3e, 8 TB/s, NVLink5.
    B200,
    /// This machine's CPU cores, one rank per core, collectives through shared memory.
    Cpu,
}

/// The figures of one machine the roofline and the memory budget use.
#[derive(Debug, Clone, PartialEq)]
pub struct Hardware {
    pub preset: HardwarePreset,
    /// Ranks (GPUs, or CPU cores) available.
    pub ranks: usize,
    /// Memory one rank owns, in bytes (CPU: `MemTotal` / ranks).
    pub mem_per_rank_bytes: f64,
    /// Memory read bandwidth of one rank, bytes/s.
    pub mem_bw: f64,
    /// Interconnect bandwidth of one rank in one direction, bytes/s.
    pub link_bw: f64,
    /// Fixed cost of one collective operation, seconds (launch + synchronization).
    pub collective_latency_s: f64,
    /// Dense matmul peak of one rank, FLOP/s (bf16 tensor cores; CPU: AVX-512 f32).
    pub peak_flops: f64,
    /// Bytes of one activation value exchanged in collectives (bf16 on GPUs, f32 on CPU ranks).
    pub activation_bytes: usize,
    pub kv_budget: KvBudgetRule,
}

/// Overrides of a preset's figures from the command line (`None` keeps the preset's).
#[derive(Debug, Clone)]
pub struct HardwareOverrides {
    pub ranks: Option<usize>,
    pub mem_per_rank_gb: Option<f64>,
    pub mem_bw_gbs: Option<f64>,
    pub link_bw_gbs: Option<f64>,
    pub peak_tflops: Option<f64>,
    pub collective_latency_us: Option<f64>,
    pub gpu_memory_utilization: f64,
    pub activation_reserve_gb: Option<f64>,
    pub kv_cache_memory_bytes: Option<u64>,
}

impl Default for HardwareOverrides {
    /// The presets as they are, at vLLM's default memory utilization of 0.9.
    fn default() -> Self {
        HardwareOverrides {
            ranks: None,
            mem_per_rank_gb: None,
            mem_bw_gbs: None,
            link_bw_gbs: None,
            peak_tflops: None,
            collective_latency_us: None,
            gpu_memory_utilization: 0.9,
            activation_reserve_gb: None,
            kv_cache_memory_bytes: None,
        }
    }
}

impl Hardware {
    /// The preset with `o`'s overrides applied.
    pub fn new(preset: HardwarePreset, o: &HardwareOverrides) -> Self {
        // NVLink figures are bidirectional in the data sheets (900 GB/s, 1.8 TB/s); a ring
        // collective sends and receives at once, so one direction's half is what it gets.
        let (mem_gb, mem_bw_gbs, link_gbs, tflops, latency_us) = match preset {
            HardwarePreset::H100 => (80.0, 3350.0, 450.0, 989.0, 5.0),
            HardwarePreset::H200 => (141.0, 4800.0, 450.0, 989.0, 5.0),
            HardwarePreset::B200 => (180.0, 8000.0, 900.0, 2250.0, 5.0),
            // Measured here: ~17 GB/s read bandwidth on one core, 26–33 GB/s on two;
            // a shared-memory collective is a copy at about that speed. Zen 4 peak: two
            // 256-bit FMA pipes at ~2.5 GHz = 80 GFLOP/s f32 per core.
            HardwarePreset::Cpu => (0.0, 16.0, 16.0, 0.08, 2.0),
        };
        let ranks = o.ranks.unwrap_or(match preset {
            HardwarePreset::Cpu => std::thread::available_parallelism().map_or(1, |n| n.get()),
            _ => 8,
        });
        let mem_per_rank_bytes = match (o.mem_per_rank_gb, preset) {
            (Some(gb), _) => gb * GB,
            (None, HardwarePreset::Cpu) => {
                meminfo_bytes("MemTotal").unwrap_or(4 << 30) as f64 / ranks.max(1) as f64
            }
            (None, _) => mem_gb * GB,
        };
        let kv_budget = match (o.kv_cache_memory_bytes, preset) {
            (Some(bytes), _) => KvBudgetRule::Fixed(bytes),
            (None, HardwarePreset::Cpu) => KvBudgetRule::cpu_default(),
            (None, _) => KvBudgetRule::MemoryUtilization {
                utilization: o.gpu_memory_utilization,
                reserve_bytes: o
                    .activation_reserve_gb
                    .map_or(ACTIVATION_RESERVE_BYTES as f64, |gb| gb * GIB),
            },
        };
        Hardware {
            preset,
            ranks,
            mem_per_rank_bytes,
            mem_bw: o.mem_bw_gbs.unwrap_or(mem_bw_gbs) * GB,
            link_bw: o.link_bw_gbs.unwrap_or(link_gbs) * GB,
            collective_latency_s: o.collective_latency_us.unwrap_or(latency_us) * 1e-6,
            peak_flops: o.peak_tflops.unwrap_or(tflops) * 1e12,
            activation_bytes: if preset == HardwarePreset::Cpu { 4 } else { 2 },
            kv_budget,
        }
    }

    /// KV-cache bytes each rank of a `tp`-rank layout gets, given its weight bytes, by
    /// the engine's rule: the `tp` ranks share a host's memory on CPU cores, each GPU
    /// holds one rank. Zero when the weights alone exceed the memory.
    pub fn kv_budget_per_rank(&self, tp: usize, weight_bytes_per_rank: f64) -> u64 {
        let ranks = match self.kv_budget {
            KvBudgetRule::CpuEngineDefault { .. } => tp,
            _ => 1,
        };
        self.kv_budget.per_rank(SharedMemory {
            memory_bytes: self.mem_per_rank_bytes,
            ranks,
            weights_per_rank: weight_bytes_per_rank,
        })
    }

    /// One line naming the machine and its figures.
    pub fn describe(&self) -> String {
        let name = match self.preset {
            HardwarePreset::H100 => "H100 SXM",
            HardwarePreset::H200 => "H200",
            HardwarePreset::B200 => "B200",
            HardwarePreset::Cpu => "CPU cores",
        };
        let budget = match self.kv_budget {
            KvBudgetRule::Fixed(b) => format!("KV budget {b} bytes per rank (given)"),
            KvBudgetRule::CpuEngineDefault {
                mem_available_bytes,
            } => format!(
                "KV budget = the engine's default: min(MemAvailable {:.1} GiB / 4 / tp, 8 GiB) per rank",
                mem_available_bytes as f64 / GIB
            ),
            KvBudgetRule::MemoryUtilization {
                utilization,
                reserve_bytes,
            } => format!(
                "KV budget = {:.0} GB × {utilization} − weights − {:.1} GiB activation reserve per rank",
                self.mem_per_rank_bytes / GB,
                reserve_bytes / GIB
            ),
        };
        format!(
            "{}× {name}: {:.1} GB memory, {:.0} GB/s memory bandwidth, {:.0} GB/s link per direction, {} µs per collective, {} peak per rank; {budget}",
            self.ranks,
            self.mem_per_rank_bytes / GB,
            self.mem_bw / GB,
            self.link_bw / GB,
            self.collective_latency_s * 1e6,
            flops_text(self.peak_flops),
        )
    }
}

fn flops_text(flops: f64) -> String {
    if flops >= 1e12 {
        format!("{:.0} TFLOP/s", flops / 1e12)
    } else {
        format!("{:.0} GFLOP/s", flops / 1e9)
    }
}
