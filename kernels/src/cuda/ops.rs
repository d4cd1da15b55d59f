//! Element-wise and row ops of the CUDA backend: each validates like the CPU op, then
//! launches its kernel from `kernels/elementwise.cu` or `kernels/rope_embed.cu`.

use crate::shape_checks::{check_strided_copy, rope_token_width};
use cudarc::driver::{CudaSlice, CudaViewMut, DevicePtr, DevicePtrMut};

use crate::backend::Strided;
use crate::cuda::memory::CudaRef;
use crate::cuda::staging::bytes_of;
use crate::cuda::{grid, launch_err, per_row, CudaBackend};
use crate::error::{check_len, KernelError};
use crate::ops::RopeTable;
use crate::step_graph;

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
        let mut b = self.launch_of("fill_f32")?;
        b.ptr_mut(x).u64(n).f32(value);
        // SAFETY: the kernel writes x[0..n).
        unsafe { b.launch(grid(n as usize)) }?;
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
        let mut b = self.launch_of("add_f32")?;
        b.ptr_mut(a).ptr(&bv).u64(n);
        // SAFETY: equal lengths checked.
        unsafe { b.launch(grid(n as usize)) }?;
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
        let mut b = self.launch_of("add_bias_f32")?;
        b.ptr_mut(x).ptr(&bv).u64(n).u64(w);
        // SAFETY: x is whole rows of the bias width.
        unsafe { b.launch(grid(n as usize)) }?;
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
        let mut b = self.launch_of("silu_mul_f32")?;
        b.ptr(&gv).ptr(&uv).ptr_mut(out).u64(n);
        // SAFETY: lengths checked.
        unsafe { b.launch(grid(n as usize)) }?;
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
        match x {
            RmsInput::Separate(x, out) => {
                check_len("rms_norm out", x.len(), out.len())?;
                let rows = rows_of("rms_norm x", x.len(), d)?;
                if rows == 0 {
                    return Ok(());
                }
                let xv = x.cuda();
                let mut b = self.launch_of("rms_norm_f32")?;
                b.ptr(&xv).ptr(&wv).ptr_mut(out).u64(d as u64).f32(eps);
                // SAFETY: one block per whole row.
                unsafe { b.launch(per_row(rows, BLOCK_NORM)?) }?;
            }
            RmsInput::InPlace(x) => {
                let rows = rows_of("rms_norm x", x.len(), d)?;
                if rows == 0 {
                    return Ok(());
                }
                let (ptr, _sync) = x.device_ptr_mut(self.stream());
                let mut b = self.launch_of("rms_norm_f32")?;
                b.u64(ptr).ptr(&wv).u64(ptr).u64(d as u64).f32(eps);
                // SAFETY: the kernel reads a row fully before writing it.
                unsafe { b.launch(per_row(rows, BLOCK_NORM)?) }?;
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
        let sv = src.cuda();
        let stream = self.stream();
        let (from, _read) = sv.device_ptr(stream);
        let (to, _write) = dst.device_ptr_mut(stream);
        let bytes = src.len() * std::mem::size_of::<f32>();
        step_graph::enqueue("memcpy_dtod", &[to, from, bytes as u64], || {
            stream
                .context()
                .bind_to_thread()
                .map_err(|e| launch_err("copy", e))?;
            // SAFETY: both views hold `src.len()` f32s (checked above), in this context.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(to, from, bytes, stream.cu_stream())
            }
            .map_err(|e| launch_err("copy", e))
        })
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
        let mut b = self.launch_of("copy_strided_f32")?;
        let a = [s.stride, s.offset, d.stride, d.offset, rows, width].map(|v| v as u64);
        b.ptr(&sv)
            .u64(a[0])
            .u64(a[1])
            .ptr_mut(dst)
            .u64(a[2])
            .u64(a[3]);
        b.u64(a[4]).u64(a[5]);
        // SAFETY: both layouts checked to fit.
        unsafe { b.launch(grid(rows * width)) }?;
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
        let mut b = self.launch_of("gather_rows_f32")?;
        let (n, w) = (rows.len() as u64, width as u64);
        b.ptr(&sv).u64(idx).ptr_mut(dst).u64(n).u64(w);
        // SAFETY: indices checked against the source rows.
        unsafe { b.launch(grid(rows.len() * width)) }?;
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
        let mut b = self.launch_of("scatter_add_rows_f32")?;
        b.ptr(&sv).u64(idx).u64(sc).ptr_mut(dst);
        let (n, w) = (rows.len() as u64, width as u64);
        b.u64(n).u64(w);
        // SAFETY: indices checked against the destination rows.
        unsafe { b.launch(grid(width)) }?;
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
        let mut b = self.launch_of("rope_f32")?;
        b.ptr_mut(x).u64(pos).u64(n_tokens).u64(rows_per_token);
        let (stride, offset) = (stride as u64, offset as u64);
        b.u64(stride).u64(offset).u32(half).i32(il);
        b.ptr(&table.cos).ptr(&table.sin).ptr(&table.inv_freq);
        b.u32(table.max_positions).f32(table.attention_factor);
        let pairs = positions.len() * rows_per_token as usize * half as usize;
        // SAFETY: every rotated pair lies inside its row (checked above).
        unsafe { b.launch(grid(pairs)) }?;
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
