//! One forward step over a continuous batch of tokens, computed through the rank's
//! [`Backend`].

use dcpserve_kernels::dcp::DcpShape;
use dcpserve_kernels::step_graph::run_step;
use dcpserve_kernels::{
    Backend, CpuBackend, PagedAttentionParams, PagedBatch, Precision, RopeScalingKind,
};

use super::batch_input::BatchInput;
use super::cache_access::{read_in_pieces, CacheAccess};
use super::device_weights::{DeviceLayer, DeviceWeights};
use super::head::{head_logits, take_logits};
use super::kv_cache::KvCache;
use super::rank_io::{add_reduced, ForwardOptions, ForwardOutput, RankComms};
use super::shell::{ModelShell, RopeSpec};
use super::split_step::{AttendBatch, SplitStep};
use super::weights::{DecoderWeights, HeadLayout, TpShard, WeightPrecision};
use super::workspace::{whole, DenseBuffers, DenseWorkspace, Widths};
use crate::config::{ModelConfig, RopeScaling};
use crate::error::ModelError;
use crate::tensors::TensorSource;

/// One rank's share of a dense decoder on its backend `B`: the common [`ModelShell`]
/// (weights, RoPE table, workspaces) and the rank's attention-head layout.
pub struct DecoderModel<B: Backend = CpuBackend> {
    pub shell: ModelShell<B, DeviceLayer<B>, DenseBuffers<B>>,
    pub heads: HeadLayout,
}

fn rope_kind(s: &Option<RopeScaling>) -> RopeScalingKind {
    match s {
        None => RopeScalingKind::None,
        Some(RopeScaling::Linear { factor }) => RopeScalingKind::Linear { factor: *factor },
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => RopeScalingKind::Llama3 {
            factor: *factor,
            low_freq_factor: *low_freq_factor,
            high_freq_factor: *high_freq_factor,
            original_max_position_embeddings: *original_max_position_embeddings,
        },
    }
}

impl<B: Backend> DecoderModel<B> {
    /// Loads the whole model (one rank) onto `backend`.
    pub fn load(
        backend: B,
        config: ModelConfig,
        tensors: &dyn TensorSource,
        precision: WeightPrecision,
    ) -> Result<Self, ModelError> {
        Self::load_shard(backend, config, tensors, precision, TpShard::single())
    }

    /// Loads tensor-parallel rank `shard.rank`'s slice of the model onto `backend`.
    pub fn load_shard(
        backend: B,
        config: ModelConfig,
        tensors: &dyn TensorSource,
        precision: WeightPrecision,
        shard: TpShard,
    ) -> Result<Self, ModelError> {
        let host = DecoderWeights::load(&config, tensors, precision, shard)?;
        let weights = DeviceWeights::<B, DeviceLayer<B>>::upload(&backend, &host)?;
        drop(host);
        let heads = HeadLayout::new(&config, shard);
        let rope = RopeSpec {
            dim: config.head_dim,
            scaling: rope_kind(&config.rope_scaling),
        };
        Ok(Self {
            shell: ModelShell::new(backend, config, weights, shard, rope)?,
            heads,
        })
    }

    /// The backend the model computes on.
    pub fn backend(&self) -> &B {
        &self.shell.backend
    }

    /// A KV cache shaped for this rank with `num_blocks` blocks of `block_size` tokens,
    /// values stored as `dtype`, in the backend's memory.
    pub fn new_kv_cache(
        &self,
        num_blocks: usize,
        block_size: usize,
        dtype: dcpserve_kernels::KvCacheDType,
    ) -> Result<KvCache<B>, ModelError> {
        KvCache::new(
            &self.shell.backend,
            dtype,
            self.shell.config.num_hidden_layers,
            num_blocks,
            block_size,
            self.heads.kv_heads,
            self.shell.config.head_dim,
        )
    }

    fn widths(&self) -> Widths {
        let hd = self.shell.config.head_dim;
        let inter = self
            .shell
            .weights
            .layers
            .first()
            .map_or(0, |l| self.shell.backend.matrix_shape(&l.gate_proj).0);
        Widths {
            hidden: self.shell.config.hidden_size,
            q: self.heads.q_heads * hd,
            kv: self.heads.kv_heads * hd,
            inter,
        }
    }

    /// Allocates a workspace for steps of up to `max_tokens` tokens now (e.g. the
    /// engine's max batched tokens), so no step allocates activations; call it once per
    /// forward that may run at the same time.
    pub fn reserve_workspace(&self, max_tokens: usize) -> Result<(), ModelError> {
        self.shell.reserve_workspace(self.widths(), max_tokens)
    }
}

impl<B: Backend> DecoderModel<B> {
    /// Runs all layers for the batch on this rank, writing its K/V shard into the cache
    /// reached through `cache` (borrowed, or shared with the rank's other micro-batch
    /// thread), and returns the logits of the tokens listed in `input.logits_for`
    /// (complete on every rank). Every rank of the group must call it with the same
    /// plan; a model on one rank passes [`RankComms::single`]. Dense models keep no
    /// hidden states and have no MTP layer: `opts` asking for either is an error.
    pub fn forward(
        &self,
        comms: &RankComms<B>,
        input: &BatchInput,
        cache: impl CacheAccess<KvCache<B>>,
        opts: &ForwardOptions<'_, B>,
    ) -> Result<ForwardOutput<B>, ModelError> {
        if opts.mtp_prev_hidden.is_some() {
            return Err(no_mtp());
        }
        if !opts.hidden_for.is_empty() {
            return Err(ModelError::Invalid(
                "hidden states are only kept for MLA models".into(),
            ));
        }
        let widths = self.widths();
        let dev = &self.shell.backend;
        let mut cache = cache;
        // A decode step of a model on one rank may be replayed from a device graph (the
        // backend's, when it has them); the step leaves its logits in the workspace,
        // copied out after. Not with collectives: NCCL needs every rank of a
        // communicator to capture and launch its graphs together, and the ranks here
        // decide on their own (their keys differ, e.g. a DCP rank's local context).
        let alone = comms.world.size() == 1 && comms.dcp.size() == 1;
        let graphs = if alone && input.is_decode() {
            dev.step_graphs()
        } else {
            None
        };
        // With prefill context parallelism this copy computes its share of the tokens.
        let split = comms
            .split
            .is_split()
            .then(|| SplitStep::new(input, &[], comms.split))
            .transpose()?;
        let own = split.as_ref().map(|s| s.input(input));
        self.shell.in_workspace(widths, |ws| {
            let step_input = own.as_ref().unwrap_or(input);
            run_step(graphs, || {
                self.step(ws, comms, step_input, split.as_ref(), &mut cache)
            })?;
            let vocab = self.shell.config.vocab_size;
            take_logits(dev, &ws.head, input.logits_for.len(), vocab)
        })
    }

    /// The step itself, in workspace `ws`: logits of `input.logits_for` into
    /// `ws.head.logits`. With `split`, `input` is this copy's share of the step and
    /// attention and the logits cover the whole step.
    fn step(
        &self,
        ws: &mut DenseWorkspace<B>,
        comms: &RankComms<B>,
        input: &BatchInput,
        split: Option<&SplitStep>,
        cache: &mut impl CacheAccess<KvCache<B>>,
    ) -> Result<(), ModelError> {
        let dev = &self.shell.backend;
        let cfg = &self.shell.config;
        let n = input.checked_len()?;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (nq, nkv) = (self.heads.q_heads, self.heads.kv_heads);
        let Widths {
            q: q_dim,
            kv: kv_dim,
            inter,
            ..
        } = self.widths();
        let (nh, nqd, nkvd, ni) = (n * h, n * q_dim, n * kv_dim, n * inter);
        let eps = cfg.rms_norm_eps;
        let w = &self.shell.weights;
        let attend = split.map_or_else(|| AttendBatch::of(input), SplitStep::attend);
        ws.prepare(dev, n.max(attend.per_part), comms.dcp_merge)?;

        input.check_vocab(cfg.vocab_size)?;
        dev.embedding(
            &w.embed_tokens,
            input.tokens,
            dev.view_mut(&mut ws.t.x, 0..nh)?,
        )?;

        let scale = 1.0 / (hd as f32).sqrt();
        let block_size = cache.with(|c| c.block_size);
        let exact = Precision::Exact;

        for (li, lw) in w.layers.iter().enumerate() {
            let x = dev.view(&ws.t.x, 0..nh)?;
            let normed = dev.view_mut(&mut ws.t.normed, 0..nh)?;
            dev.rms_norm(x, whole(dev, &lw.input_norm)?, eps, normed)?;
            let normed = dev.view(&ws.t.normed, 0..nh)?;
            dev.matmul_each(
                normed,
                n,
                vec![
                    (&lw.q_proj, dev.view_mut(&mut ws.t.q, 0..nqd)?),
                    (&lw.k_proj, dev.view_mut(&mut ws.t.k, 0..nkvd)?),
                    (&lw.v_proj, dev.view_mut(&mut ws.t.v, 0..nkvd)?),
                ],
                exact,
            )?;
            if let (Some(qb), Some(kb), Some(vb)) = (&lw.q_bias, &lw.k_bias, &lw.v_bias) {
                dev.add_bias(dev.view_mut(&mut ws.t.q, 0..nqd)?, whole(dev, qb)?)?;
                dev.add_bias(dev.view_mut(&mut ws.t.k, 0..nkvd)?, whole(dev, kb)?)?;
                dev.add_bias(dev.view_mut(&mut ws.t.v, 0..nkvd)?, whole(dev, vb)?)?;
            }
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                // Qwen3's q/k norm: RMSNorm of every head vector.
                dev.rms_norm_inplace(dev.view_mut(&mut ws.t.q, 0..nqd)?, whole(dev, qn)?, eps)?;
                dev.rms_norm_inplace(dev.view_mut(&mut ws.t.k, 0..nkvd)?, whole(dev, kn)?, eps)?;
            }
            let interleaved = cfg.rope_interleaved;
            let q = dev.view_mut(&mut ws.t.q, 0..nqd)?;
            dev.rope(&self.shell.rope, q, input.positions, hd, 0, interleaved)?;
            let k = dev.view_mut(&mut ws.t.k, 0..nkvd)?;
            dev.rope(&self.shell.rope, k, input.positions, hd, 0, interleaved)?;
            let (k, v) = (dev.view(&ws.t.k, 0..nkvd)?, dev.view(&ws.t.v, 0..nkvd)?);
            cache.with(|c| {
                let (kc, vc) = c.layer_mut(dev, li)?;
                dev.write_kv(kc, vc, nkv, hd, input.slots, k, v)?;
                Ok::<(), ModelError>(())
            })?;

            let shape = DcpShape {
                tokens: attend.per_part,
                heads: nq,
                q_dim: hd,
                v_dim: hd,
                token_parts: attend.parts,
            };
            // The cache is only touched inside `with`, never across a collective.
            ws.dcp.run(
                dev,
                comms.dcp.as_ref(),
                &ws.t.q,
                shape,
                &mut ws.t.attn,
                |q_all, heads, out, lse| {
                    let row = heads * hd;
                    read_in_pieces(cache, attend.len(), |c, r| {
                        let (kc, vc) = c.layer(dev, li)?;
                        let p = PagedAttentionParams {
                            n_q_heads: heads,
                            n_kv_heads: nkv,
                            head_dim: hd,
                            scale,
                            batch: PagedBatch {
                                block_size,
                                token_seq: &attend.token_seq[r.clone()],
                                token_kv_len: &attend.kv_lens[r.clone()],
                                block_tables: input.block_tables,
                            },
                        };
                        let q = dev.view(q_all, r.start * row..r.end * row)?;
                        let o = dev.view_mut(out, r.start * row..r.end * row)?;
                        let l = dev.view_mut(lse, r.start * heads..r.end * heads)?;
                        dev.paged_attention(q, &p, kc, vc, o, l)?;
                        Ok::<(), ModelError>(())
                    })
                },
            )?;
            let attn = dev.view(&ws.t.attn, 0..nqd)?;
            add_projected(
                dev,
                comms,
                (attn, n),
                &lw.o_proj,
                nh,
                &mut ws.t.proj,
                &mut ws.t.x,
            )?;

            let x = dev.view(&ws.t.x, 0..nh)?;
            let normed = dev.view_mut(&mut ws.t.normed, 0..nh)?;
            dev.rms_norm(x, whole(dev, &lw.post_attention_norm)?, eps, normed)?;
            let normed = dev.view(&ws.t.normed, 0..nh)?;
            dev.matmul_each(
                normed,
                n,
                vec![
                    (&lw.gate_proj, dev.view_mut(&mut ws.t.gate, 0..ni)?),
                    (&lw.up_proj, dev.view_mut(&mut ws.t.up, 0..ni)?),
                ],
                exact,
            )?;
            let (gate, up) = (dev.view(&ws.t.gate, 0..ni)?, dev.view(&ws.t.up, 0..ni)?);
            dev.silu_mul(gate, up, dev.view_mut(&mut ws.t.act, 0..ni)?)?;
            let act = dev.view(&ws.t.act, 0..ni)?;
            add_projected(
                dev,
                comms,
                (act, n),
                &lw.down_proj,
                nh,
                &mut ws.t.proj,
                &mut ws.t.x,
            )?;
        }

        let head = (w.output_head(), cfg.vocab_size);
        match split {
            None => head_logits(
                dev,
                comms,
                &ws.t.x,
                (n, h),
                input.logits_for,
                (&w.norm, eps),
                head.0,
                head.1,
                &mut ws.head,
            ),
            Some(s) => s.head_logits(
                dev,
                comms,
                (&ws.t.x, h),
                (&w.norm, eps),
                head.0,
                head.1,
                &mut ws.head,
            ),
        }
    }
}

/// The residual update of a row-parallel layer (attention's `o_proj`, the MLP's
/// `down_proj`): `x += all_reduce(input · weight)` for the `n` tokens of `input`, whose
/// products fill the first `nh` values of `proj` and `x`.
fn add_projected<B: Backend>(
    dev: &B,
    comms: &RankComms<B>,
    (input, n): (B::View<'_>, usize),
    weight: &B::Matrix,
    nh: usize,
    proj: &mut B::Buffer,
    x: &mut B::Buffer,
) -> Result<(), ModelError> {
    dev.matmul(
        input,
        n,
        weight,
        dev.view_mut(proj, 0..nh)?,
        Precision::Exact,
    )?;
    add_reduced(dev, comms, nh, proj, x)
}

/// A multi-token-prediction step asked of a model without the layer.
pub(crate) fn no_mtp() -> ModelError {
    ModelError::Invalid("multi-token prediction needs a DeepSeek-V3 (MLA) model".into())
}
