//! [`DenseOps`]: the products, norms, activations, copies and RoPE of a forward pass;
//! with what they are asked ([`Precision`] of a product, [`Strided`] sides of a copy).

use super::memory::WeightStorage;
use crate::error::KernelError;

/// Accumulation precision of a matrix product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// f32 products and f32 accumulation (the default, test-exact path).
    #[default]
    Exact,
    /// Allows `vdpbf16ps` for BF16 weights: activations are rounded to bf16.
    Fast,
}

/// One side of a [`DenseOps::copy_strided`]: rows `stride` values apart, each starting
/// `offset` values into its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    /// Distance between the starts of consecutive rows.
    pub stride: usize,
    /// Where the copied part starts within a row.
    pub offset: usize,
}

impl Strided {
    /// Rows `stride` apart, the copied part at `offset`.
    pub fn new(stride: usize, offset: usize) -> Self {
        Self { stride, offset }
    }

    /// Contiguous rows of exactly the copied width.
    pub fn packed(width: usize) -> Self {
        Self::new(width, 0)
    }
}

/// The dense ops of a transformer layer on f32 views and device weights.
///
/// ```
/// use dcpserve_kernels::{CpuBackend, DenseOps, DeviceMemory, Precision, WeightMatrix,
///     WeightStorage};
/// let dev = CpuBackend::new(1);
/// let w = dev.upload_matrix(&WeightMatrix::from_f32(2, 2, vec![1.0, 0.0, 1.0, 1.0]).unwrap())
///     .unwrap();
/// let x = dev.upload(&[3.0, 4.0]).unwrap();
/// let mut y = dev.zeros(2).unwrap();
/// dev.matmul(dev.view(&x, 0..2).unwrap(), 1, &w, dev.view_mut(&mut y, 0..2).unwrap(),
///     Precision::Exact).unwrap();
/// let mut host = [0.0; 2];
/// dev.download(dev.view(&y, 0..2).unwrap(), &mut host).unwrap();
/// assert_eq!(host, [3.0, 7.0]);
/// ```
pub trait DenseOps: WeightStorage {
    /// `out[m, w.rows] = x[m, w.cols] · wᵀ`; `precision` may allow bf16 products for
    /// bf16 weights ([`Precision::Fast`]).
    fn matmul(
        &self,
        x: Self::View<'_>,
        m: usize,
        w: &Self::Matrix,
        out: Self::ViewMut<'_>,
        precision: Precision,
    ) -> Result<(), KernelError>;
    /// Several products of the same input: `outs[i] = x[m, cols] · ws[i]ᵀ` (the q/k/v or
    /// gate/up projections). A backend may run them together (the CPU backend does
    /// for decode-sized `m`: one parallel region instead of one per product); the
    /// default runs [`matmul`](DenseOps::matmul) for each.
    fn matmul_each(
        &self,
        x: Self::View<'_>,
        m: usize,
        products: Vec<(&Self::Matrix, Self::ViewMut<'_>)>,
        precision: Precision,
    ) -> Result<(), KernelError> {
        for (w, out) in products {
            self.matmul(x, m, w, out, precision)?;
        }
        Ok(())
    }
    /// RMSNorm over rows of `weight.len()`: `out = x / sqrt(mean(x²) + eps) · weight`.
    fn rms_norm(
        &self,
        x: Self::View<'_>,
        weight: Self::View<'_>,
        eps: f32,
        out: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// In-place [`rms_norm`](DenseOps::rms_norm).
    fn rms_norm_inplace(
        &self,
        x: Self::ViewMut<'_>,
        weight: Self::View<'_>,
        eps: f32,
    ) -> Result<(), KernelError>;
    /// SwiGLU: `out = silu(gate) · up`.
    fn silu_mul(
        &self,
        gate: Self::View<'_>,
        up: Self::View<'_>,
        out: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// `a += b` (residual connections).
    fn add(&self, a: Self::ViewMut<'_>, b: Self::View<'_>) -> Result<(), KernelError>;
    /// Adds `bias` to every `bias.len()`-wide row of `x` (projection biases).
    fn add_bias(&self, x: Self::ViewMut<'_>, bias: Self::View<'_>) -> Result<(), KernelError>;
    /// Copies `src` into `dst` (equal lengths), e.g. picking rows of activations.
    fn copy(&self, src: Self::View<'_>, dst: Self::ViewMut<'_>) -> Result<(), KernelError>;
    /// Sets every element of `x` to `value`.
    fn fill(&self, x: Self::ViewMut<'_>, value: f32) -> Result<(), KernelError>;
    /// A 2-D strided copy (like `cudaMemcpy2D`): for `i` in `0..rows`, the `width` values
    /// at `src[i·src_stride + src_offset..]` go to `dst[i·dst_stride + dst_offset..]`.
    /// MLA uses it to take one head out of every token's row and to put it back.
    fn copy_strided(
        &self,
        src: (Self::View<'_>, Strided),
        dst: (Self::ViewMut<'_>, Strided),
        rows: usize,
        width: usize,
    ) -> Result<(), KernelError>;
    /// Row gather (`index_select`): row `j` of `dst` is row `rows[j]` of `src`, rows
    /// being `width` wide (the tokens routed to one expert).
    fn gather_rows(
        &self,
        src: Self::View<'_>,
        width: usize,
        rows: &[usize],
        dst: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// Weighted row scatter-add (`index_add`): `dst[rows[j]] += scales[j] · src[j]` for
    /// `width`-wide rows, in order of `j` (an expert's outputs into the MoE sum).
    fn scatter_add_rows(
        &self,
        src: Self::View<'_>,
        width: usize,
        rows: &[usize],
        scales: &[f32],
        dst: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// Rotates, for each token `t`, the `head_dim`-wide vector at `offset` of every
    /// `stride`-wide row of token `t`'s part of `x` (`x` is `[positions.len(), …]`) by
    /// position `positions[t]`. GQA heads: `stride = head_dim`, `offset = 0`; MLA: the
    /// rope part of each query head, or of the latent key row. `interleaved` rotates
    /// pairs `(2i, 2i+1)`, otherwise `(i, i + d/2)`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        table: &Self::Rope,
        x: Self::ViewMut<'_>,
        positions: &[usize],
        stride: usize,
        offset: usize,
        interleaved: bool,
    ) -> Result<(), KernelError>;
    /// Embedding gather: row `ids[i]` of `table` (decoded to f32) into row `i` of `out`.
    fn embedding(
        &self,
        table: &Self::Matrix,
        ids: &[u32],
        out: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
}
