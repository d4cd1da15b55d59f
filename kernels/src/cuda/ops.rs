//! Element-wise and row ops of the CUDA backend: each validates like the CPU op, then
//! launches its kernel from `kernels/elementwise.cu` or `kernels/rope_embed.cu`.

use crate::shape_checks::{check_strided_copy, rope_token_width};
use cudarc::driver::{CudaSlice, CudaViewMut, DevicePtrMut, PushKernelArg};

use crate::backend::Strided;
use crate::cuda::memory::CudaRef;
use crate::cuda::staging::bytes_of;
use crate::cuda::{grid, launch_err, per_row, CudaBackend};
use crate::error::{check_len, KernelError};
use crate::ops::RopeTable;

/// RoPE tables on the device: the host [`RopeTable`]'s cos/sin (YaRN's attention factor
/// included) for its precomputed positions, and its inverse frequencies, from which
/// the kernel computes later positions exactly as the host does.
#[derive(Debug)]
pub struct CudaRope {
    pub(crate) host: RopeTable,
    pub(crate) cos: CudaSlice<f32>,
    pub(crate) sin: CudaSlice<f32>,
    pub(crate) inv_freq: CudaSlice<f32>,
    pub(crate) max_positions: u32,
    pub(crate) attention_factor: f32,
}

impl CudaRope {
    /// Head dimension the table was built for.
    pub fn head_dim(&self) -> usize {
        self.host.head_dim()
    }
}

fn rows_of(what: &'static str, len: usize, d: usize) -> Result<usize, KernelError> {
    if d == 0 || !len.is_multiple_of(d) {
        return Err(KernelError::Shape(format!(
            "{what}: length {len} is not a multiple of {d}"
        )));
    }
    Ok(len / d)
}

impl CudaBackend {
    pub(crate) fn rope_upload(&self, host: RopeTable) -> Result<CudaRope, KernelError> {
        let (cos, sin) = host.tables();
        let max_positions = u32::try_from(host.max_positions())
            .map_err(|_| KernelError::Shape("rope: too many positions".into()))?;
        Ok(CudaRope {
            cos: self.upload_owned(cos)?,
            sin: self.upload_owned(sin)?,
            inv_freq: self.upload_owned(host.inv_freq())?,
            max_positions,
            attention_factor: host.attention_factor(),
            host,
        })
    }

    pub(crate) fn fill_op(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        value: f32,
    ) -> Result<(), KernelError> {
        let n = x.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let mut b = self.stream().launch_builder(self.kernel("fill_f32")?);
        b.arg(x).arg(&n).arg(&value);
        // SAFETY: the kernel writes x[0..n).
        unsafe { b.launch(grid(n as usize)) }.map_err(|e| launch_err("fill", e))?;
        Ok(())
    }

    pub(crate) fn add_op(
        &self,
        a: &mut CudaViewMut<'_, f32>,
        b_: CudaRef<'_>,
    ) -> Result<(), KernelError> {
        check_len("add b", a.len(), b_.len())?;
        let n = a.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let bv = b_.cuda();
        let mut b = self.stream().launch_builder(self.kernel("add_f32")?);
        b.arg(a).arg(&bv).arg(&n);
        // SAFETY: equal lengths checked.
        unsafe { b.launch(grid(n as usize)) }.map_err(|e| launch_err("add", e))?;
        Ok(())
    }

    pub(crate) fn add_bias_op(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        bias: CudaRef<'_>,
    ) -> Result<(), KernelError> {
        rows_of("add_bias x", x.len(), bias.len())?;
        let (n, w) = (x.len() as u64, bias.len() as u64);
        if n == 0 {
            return Ok(());
        }
        let bv = bias.cuda();
        let mut b = self.stream().launch_builder(self.kernel("add_bias_f32")?);
        b.arg(x).arg(&bv).arg(&n).arg(&w);
        // SAFETY: x is whole rows of the bias width.
        unsafe { b.launch(grid(n as usize)) }.map_err(|e| launch_err("add_bias", e))?;
        Ok(())
    }

    pub(crate) fn silu_mul_op(
        &self,
        gate: CudaRef<'_>,
        up: CudaRef<'_>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        check_len("silu_mul up", gate.len(), up.len())?;
        check_len("silu_mul out", gate.len(), out.len())?;
        let n = gate.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let (gv, uv) = (gate.cuda(), up.cuda());
        let mut b = self.stream().launch_builder(self.kernel("silu_mul_f32")?);
        b.arg(&gv).arg(&uv).arg(out).arg(&n);
        // SAFETY: lengths checked.
        unsafe { b.launch(grid(n as usize)) }.map_err(|e| launch_err("silu_mul", e))?;
        Ok(())
    }

    /// RMSNorm of `x` into `out`, or in place when `out` is `None`.
    pub(crate) fn rms_norm_op(
        &self,
        x: RmsInput<'_, '_, '_>,
        weight: CudaRef<'_>,
        eps: f32,
    ) -> Result<(), KernelError> {
        let d = weight.len();
        let wv = weight.cuda();
        let f = self.kernel("rms_norm_f32")?;
        match x {
            RmsInput::Separate(x, out) => {
                check_len("rms_norm out", x.len(), out.len())?;
                let rows = rows_of("rms_norm x", x.len(), d)?;
                if rows == 0 {
                    return Ok(());
                }
                let xv = x.cuda();
                let mut b = self.stream().launch_builder(f);
                let d = d as u64;
                b.arg(&xv).arg(&wv).arg(out).arg(&d).arg(&eps);
                // SAFETY: one block per whole row.
                unsafe { b.launch(per_row(rows, BLOCK_NORM)?) }
                    .map_err(|e| launch_err("rms_norm", e))?;
            }
            RmsInput::InPlace(x) => {
                let rows = rows_of("rms_norm x", x.len(), d)?;
                if rows == 0 {
                    return Ok(());
                }
                let (ptr, _sync) = x.device_ptr_mut(self.stream());
                let mut b = self.stream().launch_builder(f);
                let d = d as u64;
                b.arg(&ptr).arg(&wv).arg(&ptr).arg(&d).arg(&eps);
                // SAFETY: the kernel reads a row fully before writing it.
                unsafe { b.launch(per_row(rows, BLOCK_NORM)?) }
                    .map_err(|e| launch_err("rms_norm", e))?;
            }
        }
        Ok(())
    }

    pub(crate) fn copy_op(
        &self,
        src: CudaRef<'_>,
        dst: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        check_len("copy destination", src.len(), dst.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.stream()
            .memcpy_dtod(&src.cuda(), dst)
            .map_err(|e| launch_err("copy", e))
    }

    pub(crate) fn copy_strided_op(
        &self,
        (src, s): (CudaRef<'_>, Strided),
        (dst, d): (&mut CudaViewMut<'_, f32>, Strided),
        rows: usize,
        width: usize,
    ) -> Result<(), KernelError> {
        check_strided_copy((src.len(), s), (dst.len(), d), rows, width)?;
        if rows == 0 || width == 0 {
            return Ok(());
        }
        let sv = src.cuda();
        let mut b = self
            .stream()
            .launch_builder(self.kernel("copy_strided_f32")?);
        let a = [s.stride, s.offset, d.stride, d.offset, rows, width].map(|v| v as u64);
        b.arg(&sv)
            .arg(&a[0])
            .arg(&a[1])
            .arg(dst)
            .arg(&a[2])
            .arg(&a[3]);
        b.arg(&a[4]).arg(&a[5]);
        // SAFETY: both layouts checked to fit.
        unsafe { b.launch(grid(rows * width)) }.map_err(|e| launch_err("copy_strided", e))?;
        Ok(())
    }

    pub(crate) fn gather_rows_op(
        &self,
        src: CudaRef<'_>,
        width: usize,
        rows: &[usize],
        dst: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        check_len("gathered rows", rows.len() * width, dst.len())?;
        if width == 0 || rows.is_empty() {
            return Ok(());
        }
        let idx = row_indices("gathered row", rows, src.len() / width)?;
        let [idx] = self.stage_meta([bytes_of(&idx)])?;
        let sv = src.cuda();
        let mut b = self
            .stream()
            .launch_builder(self.kernel("gather_rows_f32")?);
        let (n, w) = (rows.len() as u64, width as u64);
        b.arg(&sv).arg(&idx).arg(dst).arg(&n).arg(&w);
        // SAFETY: indices checked against the source rows.
        unsafe { b.launch(grid(rows.len() * width)) }.map_err(|e| launch_err("gather_rows", e))?;
        Ok(())
    }

    pub(crate) fn scatter_add_rows_op(
        &self,
        src: CudaRef<'_>,
        width: usize,
        rows: &[usize],
        scales: &[f32],
        dst: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        check_len("scatter-add source", rows.len() * width, src.len())?;
        check_len("scatter-add scales", rows.len(), scales.len())?;
        if width == 0 || rows.is_empty() {
            return Ok(());
        }
        let idx = row_indices("scatter-add row", rows, dst.len() / width)?;
        let [idx, sc] = self.stage_meta([bytes_of(&idx), bytes_of(scales)])?;
        let sv = src.cuda();
        let mut b = self
            .stream()
            .launch_builder(self.kernel("scatter_add_rows_f32")?);
        b.arg(&sv).arg(&idx).arg(&sc).arg(dst);
        let (n, w) = (rows.len() as u64, width as u64);
        b.arg(&n).arg(&w);
        // SAFETY: indices checked against the destination rows.
        unsafe { b.launch(grid(width)) }.map_err(|e| launch_err("scatter_add_rows", e))?;
        Ok(())
    }

    pub(crate) fn rope_op(
        &self,
        table: &CudaRope,
        x: &mut CudaViewMut<'_, f32>,
        positions: &[usize],
        stride: usize,
        offset: usize,
        interleaved: bool,
    ) -> Result<(), KernelError> {
        let width = rope_token_width(x.len(), positions.len())?;
        if positions.is_empty() {
            return Ok(());
        }
        let hd = table.head_dim();
        if stride == 0 || stride < offset + hd || !width.is_multiple_of(stride) {
            return Err(KernelError::Shape(format!(
                "rope: vectors of {hd} at offset {offset} do not fit rows of {stride} (len {width})"
            )));
        }
        let half = (hd / 2) as u32;
        if half == 0 || width == 0 {
            return Ok(());
        }
        let pos: Vec<u32> = positions
            .iter()
            .map(|&p| {
                u32::try_from(p).map_err(|_| KernelError::OutOfRange {
                    what: "rope position",
                    value: p,
                    limit: u32::MAX as usize,
                })
            })
            .collect::<Result<_, _>>()?;
        let [pos] = self.stage_meta([bytes_of(&pos)])?;
        let rows_per_token = (width / stride) as u64;
        let n_tokens = positions.len() as u64;
        let il = interleaved as i32;
        let mut b = self.stream().launch_builder(self.kernel("rope_f32")?);
        b.arg(x).arg(&pos).arg(&n_tokens).arg(&rows_per_token);
        let (stride, offset) = (stride as u64, offset as u64);
        b.arg(&stride).arg(&offset).arg(&half).arg(&il);
        b.arg(&table.cos).arg(&table.sin).arg(&table.inv_freq);
        b.arg(&table.max_positions).arg(&table.attention_factor);
        let pairs = positions.len() * rows_per_token as usize * half as usize;
        // SAFETY: every rotated pair lies inside its row (checked above).
        unsafe { b.launch(grid(pairs)) }.map_err(|e| launch_err("rope", e))?;
        Ok(())
    }
}

/// Threads per block of the row-reduction kernels.
const BLOCK_NORM: u32 = 256;

/// The input of an RMSNorm: separate input and output, or one buffer in place.
pub(crate) enum RmsInput<'a, 'b, 'c> {
    Separate(CudaRef<'a>, &'b mut CudaViewMut<'c, f32>),
    InPlace(&'b mut CudaViewMut<'c, f32>),
}

/// Row indices as u32 after checking each against `limit` rows.
pub(crate) fn row_indices(
    what: &'static str,
    rows: &[usize],
    limit: usize,
) -> Result<Vec<u32>, KernelError> {
    rows.iter()
        .map(|&r| {
            if r >= limit || r > u32::MAX as usize {
                Err(KernelError::OutOfRange {
                    what,
                    value: r,
                    limit,
                })
            } else {
                Ok(r as u32)
            }
        })
        .collect()
}
