//! What every rank model is made of, whatever its attention: the configuration, the
//! rank's weights on its backend, the RoPE table and the workspaces its forward passes
//! compute in. The dense and MLA models each add their own head layout around it.

use dcpserve_kernels::{Backend, RopeScalingKind};

use super::device_weights::DeviceWeights;
use super::weights::TpShard;
use super::workspace::{TokenBuffers, Workspace, WorkspacePool};
use crate::config::ModelConfig;
use crate::error::ModelError;

/// One rank's share of a decoder with layers `L` on backend `B`, computing in
/// workspaces of buffers `T`.
///
/// The backend carries the device and (on the CPU) the rank's thread pool. Workspaces
/// are allocated once and grow to the largest step seen; there is one per forward
/// running at the same time (one per micro-batch thread of the rank).
pub struct ModelShell<B: Backend, L, T: TokenBuffers<B>> {
    pub config: ModelConfig,
    pub weights: DeviceWeights<B, L>,
    pub shard: TpShard,
    pub(crate) backend: B,
    pub(crate) rope: B::Rope,
    workspaces: WorkspacePool<B, T>,
}

/// How a model's RoPE table is laid out: rotary dimensions and scaling.
pub(crate) struct RopeSpec {
    pub dim: usize,
    pub scaling: RopeScalingKind,
}

impl<B: Backend, L, T: TokenBuffers<B>> ModelShell<B, L, T> {
    /// The shell of a model whose weights are on `backend` already; builds its RoPE table.
    pub(crate) fn new(
        backend: B,
        config: ModelConfig,
        weights: DeviceWeights<B, L>,
        shard: TpShard,
        rope: RopeSpec,
    ) -> Result<Self, ModelError> {
        let rope = backend.rope_table(
            rope.dim,
            config.rope_theta,
            rope.scaling,
            config.max_position_embeddings.clamp(1, 1 << 16),
        )?;
        Ok(Self {
            config,
            weights,
            shard,
            backend,
            rope,
            workspaces: WorkspacePool::new(),
        })
    }

    /// The backend the model computes on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Allocates a workspace of `widths` for steps of up to `max_tokens` tokens now, so
    /// no step allocates activations.
    pub(crate) fn reserve_workspace(
        &self,
        widths: T::Widths,
        max_tokens: usize,
    ) -> Result<(), ModelError> {
        self.workspaces.reserve(&self.backend, widths, max_tokens)
    }

    /// Runs `f` in a free workspace (or a new one of `widths`, grown by the step itself),
    /// then returns the workspace to the pool.
    pub(crate) fn in_workspace<R>(
        &self,
        widths: T::Widths,
        f: impl FnOnce(&mut Workspace<B, T>) -> Result<R, ModelError>,
    ) -> Result<R, ModelError> {
        self.workspaces.run(&self.backend, widths, f)
    }

    /// Drops the free workspaces (made for widths the model no longer has).
    pub(crate) fn clear_workspaces(&self) {
        self.workspaces.clear();
    }
}
