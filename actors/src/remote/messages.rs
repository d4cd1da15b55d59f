//! The control plane's messages between process 0 and the rank processes.
//!
//! A message is a JSON header and, for a step plan, the plan's bytes as the scheduler
//! already encoded them ([`crate::plan::wire`]) appended unchanged: `[u32 header length,
//! little endian][header][payload]`.

use std::path::PathBuf;
use std::sync::Arc;

use dcpserve_config::RankSettings;
use dcpserve_kernels::KvCacheDType;
use dcpserve_model::arch::WeightPrecision;
use dcpserve_model::ModelFiles;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::collective::{GroupLayout, RankCommSpecs};
use crate::placement::Placement;
use crate::plan::{MtpPlan, StepReport};
use crate::rank::{RankArgs, StepSink};

/// Process 0 to a rank process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToRankProcess {
    /// Bring up this process's ranks of generation `generation`: register its part of
    /// every group of `groups` (in their order), load the shards, answer
    /// [`FromRankProcess::Started`].
    Start {
        generation: u64,
        groups: GroupLayout,
        ranks: Vec<RankSpec>,
    },
    /// Run the step plan in the payload on rank `rank`.
    Plan {
        rank: usize,
    },
    /// Run an MTP draft step on rank `rank`.
    Mtp {
        rank: usize,
        plan: MtpPlan,
    },
    /// Test hook: make rank `rank` fail on its next step.
    InjectFault {
        rank: usize,
    },
    /// Stop the ranks of `generation` (their collectives aborted first).
    TearDown {
        generation: u64,
    },
    Heartbeat,
    /// Stop everything and leave the job.
    Shutdown,
}

/// A rank process to process 0.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromRankProcess {
    /// The process is up (first message): where it runs.
    Hello {
        host: String,
        pid: u32,
    },
    /// The ranks of `generation` are loaded and connected, or why not.
    Started {
        generation: u64,
        result: Result<(), String>,
    },
    /// A rank's report (its failures: rank 0, which answers steps, is in process 0).
    Report {
        report: StepReport,
    },
    Heartbeat,
}

/// What a rank is started from, as plain data: `crate::rank::RankArgs` without the
/// process-local parts (the model is opened from its path on the rank's host, and reports
/// go wherever that process sends them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankSpec {
    pub rank: usize,
    pub tp_size: usize,
    pub generation: u64,
    pub comm_specs: RankCommSpecs,
    /// The model's file or folder: the same path on every host.
    pub model: PathBuf,
    pub precision: WeightPrecision,
    /// What the rank builds its backend from (`--device`: a CUDA rank picks GPU
    /// `rank mod visible`).
    pub rank_settings: RankSettings,
    pub placement: Placement,
    pub num_blocks: usize,
    pub kv_cache_dtype: KvCacheDType,
    pub max_step_tokens: usize,
    /// Compute threads of the rank; `None`: the host's cores split over its ranks.
    pub threads: Option<usize>,
    pub mtp: bool,
}

impl RankSpec {
    /// The rank's arguments in this process: its model files, where its reports go, and
    /// its threads when the spec leaves them to the host (`default_threads`).
    pub fn into_rank_args(
        self,
        files: Arc<ModelFiles>,
        reports: StepSink,
        default_threads: usize,
    ) -> RankArgs {
        RankArgs {
            rank: self.rank,
            tp_size: self.tp_size,
            generation: self.generation,
            comm_specs: self.comm_specs,
            files,
            precision: self.precision,
            rank_settings: self.rank_settings,
            placement: self.placement,
            num_blocks: self.num_blocks,
            kv_cache_dtype: self.kv_cache_dtype,
            max_step_tokens: self.max_step_tokens,
            threads: self.threads.unwrap_or(default_threads),
            reports,
            mtp: self.mtp,
        }
    }
}

/// `[header length][header][payload]`.
pub fn encode<T: Serialize>(header: &T, payload: &[u8]) -> Vec<u8> {
    let head = serde_json::to_vec(header).expect("control messages are plain data");
    let mut out = Vec::with_capacity(4 + head.len() + payload.len());
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
    out
}

/// The header and payload of a message.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, &[u8]), String> {
    let len = bytes
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("four bytes")) as usize)
        .ok_or("a control message shorter than its header length")?;
    let head = bytes
        .get(4..4 + len)
        .ok_or("a control message shorter than its header")?;
    let header = serde_json::from_slice(head).map_err(|e| format!("control message: {e}"))?;
    Ok((header, &bytes[4 + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dcpserve_kernels::{CudaGraphs, Device, GpuMatmul};

    #[test]
    fn messages_round_trip_with_their_payload() {
        let bytes = encode(&ToRankProcess::Plan { rank: 3 }, b"plan bytes");
        let (msg, payload): (ToRankProcess, _) = decode(&bytes).unwrap();
        assert!(matches!(msg, ToRankProcess::Plan { rank: 3 }));
        assert_eq!(payload, b"plan bytes");
        assert!(decode::<ToRankProcess>(&bytes[..3]).is_err());
        assert!(decode::<ToRankProcess>(&bytes[..6]).is_err());
    }

    /// A CUDA rank in another process gets its GPU settings with its spec.
    #[test]
    fn a_rank_spec_round_trips_with_its_gpu_settings() {
        use dcpserve_kernels::dcp::{Layout, MergeExchange};

        let layout = Layout::new(2, 1, 1, 16, 1).unwrap();
        let groups = GroupLayout::new(&layout, &crate::process_map::ProcessMap::single(2)).unwrap();
        for (gpu_matmul, cuda_graphs) in [
            (GpuMatmul::Exact, CudaGraphs::Off),
            (GpuMatmul::Bf16, CudaGraphs::On),
        ] {
            let spec = RankSpec {
                rank: 1,
                tp_size: 2,
                generation: 3,
                comm_specs: groups.rank_specs(&layout, 1, None, MergeExchange::default()),
                model: PathBuf::from("models/m.gguf"),
                precision: WeightPrecision::BF16,
                // The rest default, so that a new setting needs no edit here.
                rank_settings: RankSettings {
                    device: Device::Cuda,
                    gpu_matmul,
                    cuda_graphs,
                    ..RankSettings::default()
                },
                placement: layout.placement(1),
                num_blocks: 8,
                kv_cache_dtype: KvCacheDType::BF16,
                max_step_tokens: 64,
                threads: None,
                mtp: false,
            };
            let msg = ToRankProcess::Start {
                generation: 3,
                groups: groups.clone(),
                ranks: vec![spec.clone()],
            };
            let (back, _): (ToRankProcess, _) = decode(&encode(&msg, b"")).unwrap();
            let ToRankProcess::Start { ranks, .. } = back else {
                panic!("not a start message");
            };
            assert_eq!(ranks, [spec]);
        }
    }
}
