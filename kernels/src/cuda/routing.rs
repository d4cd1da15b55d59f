//! MoE routing on the device (`kernels/routing.cu`): one block per token computes the
//! scores, the group-limited choice, the top-k and the weights exactly as the host's
//! [`route_experts`] does, and only the `[n_tokens, experts_per_token]` expert ids and
//! weights come back.
//!
//! Rows wider than [`MAX_DEVICE_EXPERTS`] (the kernel's shared arrays) are routed on
//! the host instead: the logits are downloaded and [`route_experts`] runs there.
//!
//! The device's `expf` may differ from the host's by an ulp or two, so weights agree to
//! about 1e-6 relative, and two experts whose scores are that close may rank in the
//! other order. Exact ties (equal logits) rank as on the host. NaN and ±0.0 are ordered
//! by `f32::total_cmp` on both, but a NaN the device computes may carry another sign or
//! payload than the host's, so rows with NaN logits are not guaranteed to match.

use crate::backend::DeviceMemory;
use crate::backend::{RouterParams, RouterScoring, Routing};
use crate::cuda::device::driver_err;
use crate::cuda::memory::CudaRef;
use crate::cuda::{per_row, CudaBackend};
use crate::error::KernelError;
use crate::moe_routing::{check_routing, route_experts};
use crate::step_graph;

/// The widest rows (experts) the routing kernel takes: `ROUTE_MAX_EXPERTS` in
/// `routing.cu`. DeepSeek-V3 has 256, Kimi K2 384.
pub(crate) const MAX_DEVICE_EXPERTS: usize = 1024;

/// Threads per token: the scoring is parallel over experts, the choice uses one warp.
const ROUTE_THREADS: u32 = 256;

impl CudaBackend {
    /// `route_experts` on the device (see the module doc), with the host's checks.
    pub(crate) fn route_experts_op(
        &self,
        logits: CudaRef<'_>,
        p: &RouterParams,
        correction_bias: Option<CudaRef<'_>>,
    ) -> Result<Routing, KernelError> {
        let n = check_routing(logits.len(), p, correction_bias.map(|b| b.len()))?;
        if p.n_experts > MAX_DEVICE_EXPERTS {
            return self.route_on_host(logits, p, correction_bias);
        }
        let k = p.experts_per_token;
        if n == 0 || k == 0 {
            return Ok(Routing {
                experts: Vec::new(),
                weights: Vec::new(),
            });
        }
        step_graph::refuse("downloads the MoE routing")?;
        // As the host: groups only when limited to some and there are several; a group
        // count then divides the experts, so it is at most 1024 like them.
        let grouped = p.group_limited && p.n_group > 1;
        let n_group = if grouped { p.n_group } else { 1 };
        // The host's top-k of the groups keeps all of them when asked for more.
        let topk_group = p.topk_group.min(n_group);
        let mut ids = self
            .stream()
            .alloc_zeros::<u32>(n * k)
            .map_err(|e| driver_err("allocating routing ids", e))?;
        let mut weights = self.alloc_f32(n * k, false)?;
        let lv = logits.cuda();
        // Without a bias the kernel reads none; the logits stand in for the pointer.
        let bv = correction_bias.unwrap_or(logits).cuda();
        let has_bias = correction_bias.is_some() as i32;
        // All ≤ 1024 (checked above), so the u32s are exact.
        let (e32, k32) = (p.n_experts as u32, k as u32);
        let (g32, tg32) = (n_group as u32, topk_group as u32);
        let grouped = grouped as i32;
        let sigmoid = (p.scoring == RouterScoring::Sigmoid) as i32;
        let norm = p.norm_topk_prob as i32;
        let scaling = p.routed_scaling_factor;
        let mut b = self.launch_of("route_experts_f32")?;
        b.ptr(&lv).ptr(&bv).i32(has_bias);
        b.u32(e32).u32(k32).u32(g32).u32(tg32);
        b.i32(grouped).i32(sigmoid).i32(norm).f32(scaling);
        b.ptr_mut(&mut ids).ptr_mut(&mut weights);
        // SAFETY: one block per whole row of n_experts ≤ ROUTE_MAX_EXPERTS logits (the
        // bias, when read, has n_experts values); `ids` and `weights` hold k per row;
        // k ≤ n_experts and topk_group ≤ n_group, which divides n_experts when grouped.
        unsafe { b.launch(per_row(n, ROUTE_THREADS)?) }?;
        let mut host_ids = vec![0u32; n * k];
        let mut host_weights = vec![0.0f32; n * k];
        self.stream()
            .memcpy_dtoh(&ids, &mut host_ids)
            .map_err(|e| driver_err("downloading routing ids", e))?;
        self.stream()
            .memcpy_dtoh(&weights, &mut host_weights)
            .map_err(|e| driver_err("downloading routing weights", e))?;
        self.synchronize()?;
        Ok(Routing {
            experts: host_ids.into_iter().map(|i| i as usize).collect(),
            weights: host_weights,
        })
    }

    /// The host path for rows wider than the kernel takes: download and route there.
    fn route_on_host(
        &self,
        logits: CudaRef<'_>,
        p: &RouterParams,
        correction_bias: Option<CudaRef<'_>>,
    ) -> Result<Routing, KernelError> {
        let download = |v: CudaRef<'_>| -> Result<Vec<f32>, KernelError> {
            let mut host = vec![0.0f32; v.len()];
            self.download(v, &mut host)?;
            Ok(host)
        };
        let host = download(logits)?;
        let bias = correction_bias.map(download).transpose()?;
        route_experts(&host, p, bias.as_deref())
    }
}
