//! One MLA decoder layer on the rank's backend: attention with weight absorption over the
//! latent cache (decode and prefill alike), then a dense or mixture-of-experts MLP, each
//! ending in the tensor-parallel all-reduce of its partial output.

use dcpserve_kernels::dcp::DcpShape;
use dcpserve_kernels::{Backend, LatentAttentionParams, PagedBatch, Precision, Strided};

use super::cache::LatentCache;
use super::device_weights::{DeviceFeedForward, DeviceMlaLayer};
use super::model::MlaModel;
use super::moe::{mlp_forward, moe_forward};
use super::workspace::MlaWorkspace;
use crate::arch::batch_input::BatchInput;
use crate::arch::cache_access::{read_in_pieces, CacheAccess};
use crate::arch::rank_io::{add_reduced, RankComms};
use crate::arch::split_step::AttendBatch;
use crate::arch::workspace::whole;
use crate::error::ModelError;

/// transformers builds `q_a_layernorm` / `kv_a_layernorm` with the default epsilon, not
/// the configured `rms_norm_eps`.
const LORA_NORM_EPS: f32 = 1e-6;

impl<B: Backend> MlaModel<B> {
    /// One decoder layer `lw` on the residual stream `ws.t.x` (its first `n` rows), its
    /// latents in cache layer `li`; attention runs over `attend`'s rows.
    pub(super) fn layer(
        &self,
        comms: &RankComms<B>,
        (input, attend): (&BatchInput, &AttendBatch),
        cache: &mut impl CacheAccess<LatentCache<B>>,
        (li, lw): (usize, &DeviceMlaLayer<B>),
        ws: &mut MlaWorkspace<B>,
    ) -> Result<(), ModelError> {
        let dev = &self.shell.backend;
        let (n, h) = (input.tokens.len(), self.shell.config.hidden_size);
        let nh = n * h;
        self.attention(comms, (input, attend), cache, (li, lw), ws)?;
        add_reduced(dev, comms, nh, &mut ws.t.proj, &mut ws.t.x)?;

        let x = dev.view(&ws.t.x, 0..nh)?;
        let normed = dev.view_mut(&mut ws.t.normed, 0..nh)?;
        let eps = self.shell.config.rms_norm_eps;
        dev.rms_norm(x, whole(dev, &lw.post_attention_norm)?, eps, normed)?;
        match &lw.ffn {
            DeviceFeedForward::Dense(Some(m)) => {
                let normed = dev.view(&ws.t.normed, 0..nh)?;
                let out = dev.view_mut(&mut ws.t.proj, 0..nh)?;
                mlp_forward(dev, m, (normed, n), &mut ws.t.mlp, out)?
            }
            DeviceFeedForward::Dense(None) => {
                dev.fill(dev.view_mut(&mut ws.t.proj, 0..nh)?, 0.0)?
            }
            DeviceFeedForward::Moe(m) => moe_forward(
                dev,
                &self.moe,
                m,
                (&ws.t.normed, n, h),
                &mut ws.t.mlp,
                &mut ws.t.moe,
                &mut ws.t.proj,
            )?,
        }
        add_reduced(dev, comms, nh, &mut ws.t.proj, &mut ws.t.x)
    }

    /// Layer `layer`'s attention (latents in cache layer `li`): leaves this rank's partial
    /// `o_proj` output in `ws.t.proj`.
    fn attention(
        &self,
        comms: &RankComms<B>,
        (input, attend): (&BatchInput, &AttendBatch),
        cache: &mut impl CacheAccess<LatentCache<B>>,
        (li, layer): (usize, &DeviceMlaLayer<B>),
        ws: &mut MlaWorkspace<B>,
    ) -> Result<(), ModelError> {
        let dev = &self.shell.backend;
        let m = &self.mla;
        let lw = &layer.attn;
        let n = input.tokens.len();
        let hl = self.local_heads;
        let (r, dn, dv) = (m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim);
        let (d, qk) = (m.latent_dim(), dn + m.qk_rope_head_dim);
        let (nh, nq, nd) = (n * self.shell.config.hidden_size, n * hl * qk, n * d);
        let exact = Precision::Exact;

        let x = dev.view(&ws.t.x, 0..nh)?;
        let normed = dev.view_mut(&mut ws.t.normed, 0..nh)?;
        dev.rms_norm(
            x,
            whole(dev, &layer.input_norm)?,
            self.shell.config.rms_norm_eps,
            normed,
        )?;
        let normed = dev.view(&ws.t.normed, 0..nh)?;
        let q = dev.view_mut(&mut ws.t.q, 0..nq)?;
        match &lw.q_a {
            Some((q_a, norm)) => {
                let nqa = n * dev.matrix_shape(q_a).0;
                dev.matmul(normed, n, q_a, dev.view_mut(&mut ws.t.qa, 0..nqa)?, exact)?;
                let qa = dev.view_mut(&mut ws.t.qa, 0..nqa)?;
                dev.rms_norm_inplace(qa, whole(dev, norm)?, LORA_NORM_EPS)?;
                dev.matmul(dev.view(&ws.t.qa, 0..nqa)?, n, &lw.q, q, exact)?;
            }
            None => dev.matmul(normed, n, &lw.q, q, exact)?,
        }
        // The latent row of each new token: [normalized c_kv, roped k_pe].
        dev.matmul(
            normed,
            n,
            &lw.kv_a,
            dev.view_mut(&mut ws.t.kv, 0..nd)?,
            exact,
        )?;
        for t in 0..n {
            let c_kv = dev.view_mut(&mut ws.t.kv, t * d..t * d + r)?;
            dev.rms_norm_inplace(c_kv, whole(dev, &lw.kv_a_norm)?, LORA_NORM_EPS)?;
        }
        let interleaved = m.rope_interleave;
        let kv = dev.view_mut(&mut ws.t.kv, 0..nd)?;
        dev.rope(&self.shell.rope, kv, input.positions, d, r, interleaved)?;
        let q = dev.view_mut(&mut ws.t.q, 0..nq)?;
        dev.rope(&self.shell.rope, q, input.positions, qk, dn, interleaved)?;
        let block_size = cache.with(|c| {
            c.write(dev, li, input.slots, dev.view(&ws.t.kv, 0..nd)?)?;
            Ok::<_, ModelError>(c.block_size)
        })?;

        // Absorb W_UK: q_lat = W_UKᵀ·q_nope per head; the rope part is used as is.
        let nqa = n * hl * d;
        for (hh, w_uk_t) in lw.w_uk_t.iter().enumerate() {
            let q = dev.view(&ws.t.q, 0..nq)?;
            let nope = (q, Strided::new(hl * qk, hh * qk));
            let head_in = dev.view_mut(&mut ws.t.head_in, 0..n * dn)?;
            dev.copy_strided(nope, (head_in, Strided::packed(dn)), n, dn)?;
            let head_in = dev.view(&ws.t.head_in, 0..n * dn)?;
            let head_out = dev.view_mut(&mut ws.t.head_out, 0..n * r)?;
            dev.matmul(head_in, n, w_uk_t, head_out, exact)?;
            let latent = (dev.view(&ws.t.head_out, 0..n * r)?, Strided::packed(r));
            let q_abs = dev.view_mut(&mut ws.t.q_abs, 0..nqa)?;
            dev.copy_strided(latent, (q_abs, Strided::new(hl * d, hh * d)), n, r)?;
            let pe = (q, Strided::new(hl * qk, hh * qk + dn));
            let q_abs = dev.view_mut(&mut ws.t.q_abs, 0..nqa)?;
            dev.copy_strided(pe, (q_abs, Strided::new(hl * d, hh * d + r)), n, d - r)?;
        }

        let shape = DcpShape {
            tokens: attend.per_part,
            heads: hl,
            q_dim: d,
            v_dim: r,
            token_parts: attend.parts,
        };
        // The cache is only touched inside `with`, never across a collective.
        ws.dcp.run(
            dev,
            comms.dcp.as_ref(),
            &ws.t.q_abs,
            shape,
            &mut ws.t.lat_out,
            |q_all, heads, out, lse| {
                let (row, out_row) = (heads * d, heads * r);
                read_in_pieces(cache, attend.len(), |c, rg| {
                    let p = LatentAttentionParams {
                        n_heads: heads,
                        dim: d,
                        v_dim: r,
                        scale: self.scale,
                        batch: PagedBatch {
                            block_size,
                            token_seq: &attend.token_seq[rg.clone()],
                            token_kv_len: &attend.kv_lens[rg.clone()],
                            block_tables: input.block_tables,
                        },
                    };
                    let q = dev.view(q_all, rg.start * row..rg.end * row)?;
                    let o = dev.view_mut(out, rg.start * out_row..rg.end * out_row)?;
                    let l = dev.view_mut(lse, rg.start * heads..rg.end * heads)?;
                    dev.latent_attention(q, &p, c.layer(dev, li)?, o, l)?;
                    Ok::<(), ModelError>(())
                })
            },
        )?;

        // W_UV per head turns the attended latents into values; then o_proj.
        let (nlat, nattn) = (n * hl * r, n * hl * dv);
        for (hh, w_uv) in lw.w_uv.iter().enumerate() {
            let lat = (
                dev.view(&ws.t.lat_out, 0..nlat)?,
                Strided::new(hl * r, hh * r),
            );
            let head_in = dev.view_mut(&mut ws.t.head_in, 0..n * r)?;
            dev.copy_strided(lat, (head_in, Strided::packed(r)), n, r)?;
            let head_in = dev.view(&ws.t.head_in, 0..n * r)?;
            let head_out = dev.view_mut(&mut ws.t.head_out, 0..n * dv)?;
            dev.matmul(head_in, n, w_uv, head_out, exact)?;
            let v = (dev.view(&ws.t.head_out, 0..n * dv)?, Strided::packed(dv));
            let attn = dev.view_mut(&mut ws.t.attn, 0..nattn)?;
            dev.copy_strided(v, (attn, Strided::new(hl * dv, hh * dv)), n, dv)?;
        }
        let attn = dev.view(&ws.t.attn, 0..nattn)?;
        dev.matmul(
            attn,
            n,
            &lw.o_proj,
            dev.view_mut(&mut ws.t.proj, 0..nh)?,
            exact,
        )?;
        Ok(())
    }
}
