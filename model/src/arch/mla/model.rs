//! One rank's DeepSeek-V2/V3 model on its backend: loading, the per-rank workspaces and
//! the forward entry points (the layers themselves are in `layer`, the MTP step in
//! `mtp_forward`).

use dcpserve_kernels::{Backend, CpuBackend};

use super::cache::LatentCache;
use super::device_weights::{DeviceFeedForward, DeviceMlaLayer, DeviceMlaWeights, DeviceMtp};
use super::rope::{rope_scaling, softmax_scale};
use super::weights::MlaWeights;
use super::workspace::{MlaBuffers, MlaWidths, MlaWorkspace};
use crate::arch::batch_input::BatchInput;
use crate::arch::cache_access::CacheAccess;
use crate::arch::head::{copy_out, head_logits, pick_normed, take_logits};
use crate::arch::rank_io::{ForwardOptions, ForwardOutput, RankComms};
use crate::arch::shell::{ModelShell, RopeSpec};
use crate::arch::split_step::{AttendBatch, SplitStep};
use crate::arch::weights::{TpShard, WeightPrecision};
use crate::config::{MlaConfig, ModelConfig, MoeConfig};
use crate::error::ModelError;
use crate::tensors::TensorSource;

/// One rank's share of an MLA model on its backend `B`: its heads, its MLP slices, the
/// RoPE table, and the workspaces its forward passes compute in (one per forward running
/// at the same time, allocated once and grown to the largest step seen).
pub struct MlaModel<B: Backend = CpuBackend> {
    pub shell: ModelShell<B, DeviceMlaLayer<B>, MlaBuffers<B>>,
    pub(super) mla: MlaConfig,
    pub(super) moe: MoeConfig,
    /// Attention heads on this rank.
    pub(super) local_heads: usize,
    pub(super) scale: f32,
    /// The multi-token-prediction layer, when loaded ([`MlaModel::load_mtp`]).
    pub mtp: Option<DeviceMtp<B>>,
}

impl<B: Backend> MlaModel<B> {
    /// Loads tensor-parallel rank `shard.rank`'s slice of the model onto `backend`.
    pub fn load_shard(
        backend: B,
        config: ModelConfig,
        tensors: &dyn TensorSource,
        precision: WeightPrecision,
        shard: TpShard,
    ) -> Result<Self, ModelError> {
        let (Some(mla), Some(moe)) = (config.mla.clone(), config.moe.clone()) else {
            return Err(ModelError::Invalid(format!(
                "{:?} model without MLA / MoE configuration",
                config.architecture
            )));
        };
        let host = MlaWeights::load(&config, tensors, precision, shard)?;
        let weights = DeviceMlaWeights::upload(&backend, &host)?;
        drop(host);
        let rope = RopeSpec {
            dim: mla.qk_rope_head_dim,
            scaling: rope_scaling(&mla),
        };
        Ok(Self {
            local_heads: config.num_attention_heads / shard.size,
            scale: softmax_scale(&mla),
            mla,
            moe,
            shell: ModelShell::new(backend, config, weights, shard, rope)?,
            mtp: None,
        })
    }

    /// The backend the model computes on.
    pub fn backend(&self) -> &B {
        &self.shell.backend
    }

    /// Places a loaded MTP layer on the backend; workspaces made before are dropped, as
    /// they were sized without it.
    pub(super) fn set_mtp(&mut self, mtp: DeviceMtp<B>) {
        self.mtp = Some(mtp);
        self.shell.clear_workspaces();
    }

    /// Latent-cache layers: the decoder layers, plus the MTP layer when loaded (it attends
    /// over its own latents, at the same slots as the target's).
    pub fn cache_layers(&self) -> usize {
        self.shell.config.num_hidden_layers + usize::from(self.mtp.is_some())
    }

    /// A latent cache for this rank: `num_blocks` blocks of `block_size` tokens, values
    /// stored as `dtype`, in the backend's memory.
    pub fn new_kv_cache(
        &self,
        num_blocks: usize,
        block_size: usize,
        dtype: dcpserve_kernels::KvCacheDType,
    ) -> Result<LatentCache<B>, ModelError> {
        LatentCache::new(
            &self.shell.backend,
            dtype,
            self.cache_layers(),
            num_blocks,
            block_size,
            self.mla.latent_dim(),
        )
    }

    /// Activation widths of this rank (the widest MLP slice over all layers, the MTP
    /// layer included).
    fn widths(&self) -> MlaWidths {
        let m = &self.mla;
        let hl = self.local_heads;
        let (r, d, dn) = (m.kv_lora_rank, m.latent_dim(), m.qk_nope_head_dim);
        let head_in = r.max(dn);
        let dev = &self.shell.backend;
        let layers = self
            .shell
            .weights
            .layers
            .iter()
            .chain(self.mtp.as_ref().map(|t| &t.layer));
        let inter = layers
            .flat_map(|l: &DeviceMlaLayer<B>| match &l.ffn {
                DeviceFeedForward::Dense(mlp) => vec![mlp.as_ref()],
                DeviceFeedForward::Moe(moe) => moe
                    .experts
                    .iter()
                    .map(Option::as_ref)
                    .chain([moe.shared.as_ref()])
                    .collect(),
            })
            .flatten()
            .map(|mlp| dev.matrix_shape(&mlp.gate).0)
            .max()
            .unwrap_or(0);
        MlaWidths {
            hidden: self.shell.config.hidden_size,
            q_lora: m.q_lora_rank.unwrap_or(0),
            q: hl * (dn + m.qk_rope_head_dim),
            latent: d,
            q_abs: hl * d,
            lat_out: hl * r,
            head_in,
            head_out: head_in.max(m.v_head_dim),
            attn: hl * m.v_head_dim,
            inter,
            experts: self.moe.n_routed_experts,
        }
    }

    /// Allocates a workspace for steps of up to `max_tokens` tokens now (e.g. the
    /// engine's max batched tokens), so no step allocates activations; call it once per
    /// forward that may run at the same time, after [`MlaModel::load_mtp`].
    pub fn reserve_workspace(&self, max_tokens: usize) -> Result<(), ModelError> {
        self.shell.reserve_workspace(self.widths(), max_tokens)
    }

    /// Runs `f` in a free workspace (or a new one, grown by the step itself), then
    /// returns the workspace to the pool.
    pub(super) fn in_workspace<R>(
        &self,
        f: impl FnOnce(&mut MlaWorkspace<B>) -> Result<R, ModelError>,
    ) -> Result<R, ModelError> {
        self.shell.in_workspace(self.widths(), f)
    }

    pub(super) fn check_cache(&self, cache: &LatentCache<B>) -> Result<(), ModelError> {
        if cache.latent_dim != self.mla.latent_dim() || cache.num_layers() != self.cache_layers() {
            return Err(ModelError::Invalid(
                "the latent cache was not made for this model".into(),
            ));
        }
        Ok(())
    }
}

impl<B: Backend> MlaModel<B> {
    /// Runs all layers for the batch on this rank, storing its latent shard in the cache
    /// reached through `cache` (borrowed, or shared with the rank's other micro-batch
    /// thread), and returns the logits of `input.logits_for` (complete on every rank)
    /// with, when `opts` asks, the final-normed hidden states of `opts.hidden_for`
    /// (`[hidden_for.len(), hidden_size]`, the same on every rank). With
    /// `opts.mtp_prev_hidden` it runs the MTP layer instead (see [`ForwardOptions`]).
    /// Every rank of the group must call it with the same plan.
    pub fn forward(
        &self,
        comms: &RankComms<B>,
        input: &BatchInput,
        cache: impl CacheAccess<LatentCache<B>>,
        opts: &ForwardOptions<'_, B>,
    ) -> Result<ForwardOutput<B>, ModelError> {
        match opts.mtp_prev_hidden {
            Some(prev_hidden) => self.mtp_step(comms, input, prev_hidden, cache),
            None => self.model_step(comms, input, cache, opts.hidden_for),
        }
    }

    /// A step of the decoder layers (see [`MlaModel::forward`]).
    fn model_step(
        &self,
        comms: &RankComms<B>,
        input: &BatchInput,
        mut cache: impl CacheAccess<LatentCache<B>>,
        hidden_for: &[usize],
    ) -> Result<ForwardOutput<B>, ModelError> {
        let dev = &self.shell.backend;
        let cfg = &self.shell.config;
        input.checked_len()?;
        cache.with(|c| self.check_cache(c))?;
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let w = &self.shell.weights;
        // With prefill context parallelism this copy computes its share of the tokens.
        let split = comms
            .split
            .is_split()
            .then(|| SplitStep::new(input, hidden_for, comms.split))
            .transpose()?;
        let whole = input;
        let own = split.as_ref().map(|s| s.input(whole));
        let input = own.as_ref().unwrap_or(whole);
        let n = input.tokens.len();
        let attend = split
            .as_ref()
            .map_or_else(|| AttendBatch::of(input), SplitStep::attend);
        self.in_workspace(|ws| {
            ws.prepare(dev, n.max(attend.per_part), comms.dcp_merge)?;
            input.check_vocab(cfg.vocab_size)?;
            dev.embedding(
                &w.embed_tokens,
                input.tokens,
                dev.view_mut(&mut ws.t.x, 0..n * h)?,
            )?;
            for (li, lw) in w.layers.iter().enumerate() {
                self.layer(comms, (input, &attend), &mut cache, (li, lw), ws)?;
            }
            let head = (&w.norm, w.output_head());
            let mut out = match &split {
                None => self.logits(comms, ws, n, input.logits_for, head)?,
                Some(s) => {
                    let (norm, out) = head;
                    let bufs = &mut ws.head;
                    s.head_logits(
                        dev,
                        comms,
                        (&ws.t.x, h),
                        (norm, eps),
                        out,
                        cfg.vocab_size,
                        bufs,
                    )?;
                    take_logits(dev, &ws.head, s.logits_len(), cfg.vocab_size)?
                }
            };
            if !hidden_for.is_empty() {
                let m = hidden_for.len();
                match &split {
                    None => {
                        pick_normed(dev, &ws.t.x, n, h, hidden_for, &w.norm, eps, &mut ws.head)?
                    }
                    Some(s) => {
                        // The rows, gathered from the copies that computed them.
                        let rows = s.gather_hidden_rows(dev, comms, &ws.t.x, h)?;
                        let all: Vec<usize> = (0..m).collect();
                        pick_normed(dev, &rows, m, h, &all, &w.norm, eps, &mut ws.head)?
                    }
                }
                out.hidden = Some(copy_out(dev, &ws.head.normed, m * h)?);
            }
            Ok(out)
        })
    }

    /// `norm` then the output `head` (this rank's vocabulary slice) for the tokens
    /// `logits_for` of the workspace's residual stream (`n` tokens), gathered over the
    /// vocabulary.
    pub(super) fn logits(
        &self,
        comms: &RankComms<B>,
        ws: &mut MlaWorkspace<B>,
        n: usize,
        logits_for: &[usize],
        (norm, head): (&B::Buffer, &B::Matrix),
    ) -> Result<ForwardOutput<B>, ModelError> {
        let cfg = &self.shell.config;
        head_logits(
            &self.shell.backend,
            comms,
            &ws.t.x,
            (n, cfg.hidden_size),
            logits_for,
            (norm, cfg.rms_norm_eps),
            head,
            cfg.vocab_size,
            &mut ws.head,
        )?;
        take_logits(
            &self.shell.backend,
            &ws.head,
            logits_for.len(),
            cfg.vocab_size,
        )
    }
}
