//! Row movement on host memory: strided copies, gathers and scatters of fixed-width rows
//! (the CPU side of [`DenseOps::copy_strided`](crate::DenseOps::copy_strided),
//! [`gather_rows`](crate::DenseOps::gather_rows),
//! [`scatter_add_rows`](crate::DenseOps::scatter_add_rows) and
//! [`write_rows`](crate::AttentionOps::write_rows)).

use crate::backend::Strided;
use crate::cpu::kv_store::KvMut;
use crate::error::{check_len, KernelError};
use crate::shape_checks::{check_fp8_store, check_strided_copy};

/// See [`DenseOps::copy_strided`](crate::DenseOps::copy_strided).
pub fn copy_strided(
    (src, s): (&[f32], Strided),
    (dst, d): (&mut [f32], Strided),
    rows: usize,
    width: usize,
) -> Result<(), KernelError> {
    check_strided_copy((src.len(), s), (dst.len(), d), rows, width)?;
    if width == 0 {
        return Ok(());
    }
    for i in 0..rows {
        let (from, to) = (i * s.stride + s.offset, i * d.stride + d.offset);
        dst[to..to + width].copy_from_slice(&src[from..from + width]);
    }
    Ok(())
}

/// See [`DenseOps::gather_rows`](crate::DenseOps::gather_rows).
pub fn gather_rows(
    src: &[f32],
    width: usize,
    rows: &[usize],
    dst: &mut [f32],
) -> Result<(), KernelError> {
    check_len("gathered rows", rows.len() * width, dst.len())?;
    if width == 0 {
        return Ok(());
    }
    let n_src = src.len() / width;
    for (&r, out) in rows.iter().zip(dst.chunks_exact_mut(width)) {
        if r >= n_src {
            return Err(KernelError::OutOfRange {
                what: "gathered row",
                value: r,
                limit: n_src,
            });
        }
        out.copy_from_slice(&src[r * width..(r + 1) * width]);
    }
    Ok(())
}

/// See [`DenseOps::scatter_add_rows`](crate::DenseOps::scatter_add_rows).
pub fn scatter_add_rows(
    src: &[f32],
    width: usize,
    rows: &[usize],
    scales: &[f32],
    dst: &mut [f32],
) -> Result<(), KernelError> {
    check_len("scatter-add source", rows.len() * width, src.len())?;
    check_len("scatter-add scales", rows.len(), scales.len())?;
    if width == 0 {
        return Ok(());
    }
    let n_dst = dst.len() / width;
    for ((&r, &scale), row) in rows.iter().zip(scales).zip(src.chunks_exact(width)) {
        if r >= n_dst {
            return Err(KernelError::OutOfRange {
                what: "scatter-add row",
                value: r,
                limit: n_dst,
            });
        }
        for (o, &v) in dst[r * width..(r + 1) * width].iter_mut().zip(row) {
            *o += scale * v;
        }
    }
    Ok(())
}

/// See [`AttentionOps::write_rows`](crate::AttentionOps::write_rows): rows are converted to the
/// cache's element type as they are stored.
pub fn write_rows(
    mut cache: KvMut<'_>,
    width: usize,
    slots: &[usize],
    rows: &[f32],
) -> Result<usize, KernelError> {
    check_len("rows to store", slots.len() * width, rows.len())?;
    check_fp8_store("write_rows", cache.fp8_row_len(), width)?;
    if width == 0 {
        return Ok(0);
    }
    let n_slots = cache.len() / width;
    let mut stored = 0;
    for (&s, row) in slots.iter().zip(rows.chunks_exact(width)) {
        if s == usize::MAX {
            continue;
        }
        if s >= n_slots {
            return Err(KernelError::OutOfRange {
                what: "cache slot",
                value: s,
                limit: n_slots,
            });
        }
        cache.encode(s * width, row);
        stored += 1;
    }
    Ok(stored)
}
