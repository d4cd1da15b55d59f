//! The per-model supervisor: spawns the scheduler and the rank group, and brings the
//! rank group back when one of its ranks fails (one dead rank breaks the group's
//! collectives, so the whole group restarts; only requests with KV state are lost).

use std::sync::Arc;

use dcpserve_config::EngineConfig;
use dcpserve_model::arch::{KvCache, WeightPrecision};
use dcpserve_model::ModelFiles;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::placement::Placement;
use crate::rank::{RankActor, RankArgs, RankMsg};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerMsg};

/// What the supervisor needs to bring a model up.
pub struct SupervisorArgs {
    pub name: String,
    pub files: Arc<ModelFiles>,
    pub engine: EngineConfig,
    pub precision: WeightPrecision,
}

/// Facts about a running model, for the engine facade.
#[derive(Clone)]
pub struct ModelInfo {
    pub scheduler: ActorRef<SchedulerMsg>,
    pub max_model_len: usize,
    pub kv_tokens_per_rank: usize,
    pub kv_tokens_total: usize,
    pub restarts: u64,
}

/// Messages the supervisor understands.
pub enum SupervisorMsg {
    Info(RpcReplyPort<ModelInfo>),
    /// Test hook: make rank `n` fail on its next step.
    InjectFault(usize),
}

pub struct ModelSupervisor;

pub struct SupervisorState {
    args: SupervisorArgs,
    info: ModelInfo,
    sched_cfg: SchedulerConfig,
    ranks: Vec<ActorRef<RankMsg>>,
    threads_per_rank: usize,
}

/// KV budget per rank when none is configured: a quarter of available memory, split
/// over the ranks of this process.
fn default_kv_bytes(ranks: usize) -> u64 {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(4 << 30);
    (available / 4 / ranks as u64).min(8 << 30)
}

impl Actor for ModelSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let cfg = &args.files.config;
        let e = &args.engine;
        let tp = e.parallel.tensor_parallel_size;
        if tp != 1 {
            return Err(format!(
                "tensor_parallel_size={tp} is not implemented yet in this build: only single-rank serving (tp=1, dcp=1) is available."
            )
            .into());
        }
        let max_model_len = e.max_model_len.unwrap_or(cfg.max_position_embeddings);
        let per_token =
            KvCache::bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim);
        let budget = e
            .kv_cache_memory_bytes
            .unwrap_or_else(|| default_kv_bytes(tp));
        let num_blocks = (budget as usize / (per_token * e.block_size)).max(1);
        let tokens_per_rank = num_blocks * e.block_size;
        tracing::info!(
            model = %args.name,
            "KV cache: {tokens_per_rank} tokens per rank, {} tokens total ({} blocks of {} tokens, {} bytes per token per rank)",
            tokens_per_rank * e.parallel.decode_context_parallel_size,
            num_blocks,
            e.block_size,
            per_token
        );
        let sched_cfg = SchedulerConfig {
            tokens_per_block: e.block_size * e.parallel.decode_context_parallel_size,
            num_blocks,
            max_num_seqs: e.max_num_seqs,
            max_num_batched_tokens: e.max_num_batched_tokens,
            max_model_len,
            eos_token_ids: cfg.eos_token_ids.clone(),
            seed: e.seed,
        };
        let (scheduler, _) =
            Actor::spawn_linked(None, Scheduler, sched_cfg.clone(), myself.get_cell()).await?;
        let threads = e
            .num_threads
            .unwrap_or_else(dcpserve_kernels::available_cores);
        let mut state = SupervisorState {
            info: ModelInfo {
                scheduler,
                max_model_len,
                kv_tokens_per_rank: tokens_per_rank,
                kv_tokens_total: tokens_per_rank * e.parallel.decode_context_parallel_size,
                restarts: 0,
            },
            threads_per_rank: (threads / tp).max(1),
            sched_cfg,
            ranks: Vec::new(),
            args,
        };
        state.start_ranks(myself.get_cell()).await?;
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Info(port) => {
                let _ = port.send(state.info.clone());
            }
            SupervisorMsg::InjectFault(n) => {
                if let Some(r) = state.ranks.get(n) {
                    r.send_message(RankMsg::InjectFault)?;
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        evt: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (who, why) = match evt {
            SupervisionEvent::ActorFailed(who, err) => (who, err.to_string()),
            SupervisionEvent::ActorTerminated(who, _, reason) => {
                (who, reason.unwrap_or_else(|| "stopped".into()))
            }
            _ => return Ok(()),
        };
        if who.get_id() == state.info.scheduler.get_id() {
            // Without its scheduler the model cannot serve; stop and let the owner see it.
            tracing::error!(model = %state.args.name, "scheduler ended: {why}");
            myself.stop(Some(format!("scheduler ended: {why}")));
            return Ok(());
        }
        if !state.ranks.iter().any(|r| r.get_id() == who.get_id()) {
            return Ok(()); // a rank of a group already replaced
        }
        tracing::error!(model = %state.args.name, "rank failed: {why}; restarting the rank group");
        state
            .info
            .scheduler
            .send_message(SchedulerMsg::RanksLost(why))?;
        for r in state.ranks.drain(..) {
            r.stop(Some("rank group restart".into()));
        }
        state.info.restarts += 1;
        state.start_ranks(myself.get_cell()).await?;
        Ok(())
    }
}

impl SupervisorState {
    async fn start_ranks(&mut self, supervisor: ActorCell) -> Result<(), ActorProcessingErr> {
        let e = &self.args.engine;
        let tp = e.parallel.tensor_parallel_size;
        let mut ranks = Vec::with_capacity(tp);
        for rank in 0..tp {
            let layout = e.parallel.rank_layout(rank);
            let args = RankArgs {
                rank,
                files: self.args.files.clone(),
                precision: self.args.precision,
                placement: Placement {
                    block_size: e.block_size,
                    dcp_size: layout.dcp_size,
                    interleave: e.parallel.cp_kv_cache_interleave_size,
                    dcp_rank: layout.dcp_rank,
                },
                num_blocks: self.sched_cfg.num_blocks,
                threads: self.threads_per_rank,
                scheduler: self.info.scheduler.clone(),
            };
            let (r, _) = Actor::spawn_linked(None, RankActor, args, supervisor.clone()).await?;
            ranks.push(r);
        }
        self.ranks = ranks;
        self.info
            .scheduler
            .send_message(SchedulerMsg::SetRanks(self.ranks.clone()))?;
        Ok(())
    }
}
