//! The KV-cache budget of a rank: the one rule the supervisor sizes its caches with
//! and the planner (`dcpserve plan`) predicts them with.

/// Memory kept for activations, workspaces, CUDA graphs and NCCL on each GPU: vLLM
/// profiles it, dcpserve assumes it.
pub const ACTIVATION_RESERVE_BYTES: u64 = 4 << 30;

/// What the CPU default assumes is available when `/proc/meminfo` cannot be read.
const FALLBACK_MEM_AVAILABLE: u64 = 4 << 30;

/// A `/proc/meminfo` field in bytes (`MemAvailable`, `MemTotal`, ...).
pub fn meminfo_bytes(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// How each rank's KV-cache budget is derived.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudgetRule {
    /// vLLM's rule: `memory × gpu_memory_utilization − weights − activation reserve`,
    /// shared by the ranks on the device.
    MemoryUtilization {
        utilization: f64,
        reserve_bytes: f64,
    },
    /// dcpserve's CPU default: a quarter of `MemAvailable` split over the ranks of the
    /// host, at most 8 GiB per rank. Weights are not subtracted.
    CpuEngineDefault { mem_available_bytes: u64 },
    /// Exactly this many bytes per rank (`--kv-cache-memory-bytes`).
    Fixed(u64),
}

/// The ranks that share one host or device, and what they share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedMemory {
    /// The device's memory in bytes (unused by the CPU default, which reads `MemAvailable`).
    pub memory_bytes: f64,
    /// Ranks on the host or device.
    pub ranks: usize,
    /// Weight bytes of one of those ranks.
    pub weights_per_rank: f64,
}

impl KvBudgetRule {
    /// The engine's CPU default on this machine (its current `MemAvailable`).
    pub fn cpu_default() -> Self {
        KvBudgetRule::CpuEngineDefault {
            mem_available_bytes: meminfo_bytes("MemAvailable").unwrap_or(FALLBACK_MEM_AVAILABLE),
        }
    }

    /// Bytes the ranks of `shared` have left for their KV caches together (the memory
    /// rule only; the others answer per rank).
    pub fn left_on_device(utilization: f64, reserve_bytes: f64, shared: SharedMemory) -> u64 {
        let left = shared.memory_bytes * utilization
            - shared.weights_per_rank * shared.ranks as f64
            - reserve_bytes;
        if left > 0.0 {
            left as u64
        } else {
            0
        }
    }

    /// KV-cache bytes of each rank of `shared`; zero when the weights leave nothing.
    ///
    /// ```
    /// use dcpserve_config::{KvBudgetRule, SharedMemory};
    /// let gpu = KvBudgetRule::MemoryUtilization { utilization: 0.9, reserve_bytes: 4e9 };
    /// let two = SharedMemory { memory_bytes: 100e9, ranks: 2, weights_per_rank: 10e9 };
    /// // 90 − 20 − 4 = 66 GB for two ranks.
    /// assert_eq!(gpu.per_rank(two), 33_000_000_000);
    /// let host = KvBudgetRule::CpuEngineDefault { mem_available_bytes: 16 << 30 };
    /// assert_eq!(host.per_rank(two), 2 << 30);
    /// ```
    pub fn per_rank(&self, shared: SharedMemory) -> u64 {
        let ranks = shared.ranks.max(1) as u64;
        match *self {
            KvBudgetRule::Fixed(bytes) => bytes,
            KvBudgetRule::CpuEngineDefault {
                mem_available_bytes,
            } => (mem_available_bytes / 4 / ranks).min(8 << 30),
            KvBudgetRule::MemoryUtilization {
                utilization,
                reserve_bytes,
            } => Self::left_on_device(utilization, reserve_bytes, shared) / ranks,
        }
    }
}
