//! KV-cache storage ops of the CUDA backend: allocation, stores converted to the
//! cache's element type (`kernels/kv.cu`), and reads back as f32.

use crate::cuda::memory::{dtype_code, CudaKvBuffer, CudaKvMut, CudaKvRef, CudaRef};
use crate::cuda::staging::bytes_of;
use crate::cuda::{grid, CudaBackend};
use crate::error::{check_len, KernelError};
use crate::kv_dtype::KvCacheDType;
use crate::shape_checks::{check_fp8_row, check_fp8_rows, check_fp8_store, check_write_kv};
use crate::step_graph;

use crate::cuda::device::driver_err;

impl CudaBackend {
    pub(crate) fn kv_zeros_op(
        &self,
        dtype: KvCacheDType,
        len: usize,
        row_len: usize,
    ) -> Result<CudaKvBuffer, KernelError> {
        if dtype.is_fp8() {
            check_fp8_rows(len, row_len)?;
        }
        step_graph::refuse("allocates a KV cache")?;
        let alloc = |n: usize| {
            self.stream()
                .alloc_zeros::<u8>(n.max(1))
                .map_err(|e| driver_err("allocating a KV cache", e))
        };
        let n_scales = if dtype.is_fp8() { len / row_len } else { 0 };
        Ok(CudaKvBuffer {
            bytes: alloc(len * dtype.bytes())?,
            scales: alloc(n_scales)?,
            len,
            row_len,
            dtype,
        })
    }

    /// Stores row `t` of `rows` (`width` wide) at slot `slots[t]` of `cache`
    /// (`usize::MAX` skips it); returns the rows stored.
    pub(crate) fn kv_store_rows(
        &self,
        cache: &mut CudaKvMut<'_>,
        width: usize,
        slots: &[usize],
        rows: CudaRef<'_>,
    ) -> Result<usize, KernelError> {
        check_len("rows to store", slots.len() * width, rows.len())?;
        check_fp8_store("write_rows", cache.fp8_row_len(), width)?;
        if width == 0 {
            return Ok(0);
        }
        let n_slots = cache.len() / width;
        let mut stored = 0;
        let mut dev_slots = Vec::with_capacity(slots.len());
        for &s in slots {
            if s == usize::MAX {
                dev_slots.push(u64::MAX);
                continue;
            }
            if s >= n_slots {
                return Err(KernelError::OutOfRange {
                    what: "cache slot",
                    value: s,
                    limit: n_slots,
                });
            }
            dev_slots.push(s as u64);
            stored += 1;
        }
        if stored == 0 {
            return Ok(0);
        }
        check_distinct_slots(&dev_slots)?;
        let [dev_slots] = self.stage_meta([bytes_of(&dev_slots)])?;
        let rv = rows.cuda();
        let dt = dtype_code(cache.dtype);
        let (n, w) = (slots.len() as u64, width as u64);
        if cache.dtype.is_fp8() {
            // One warp per scaled row: its largest magnitude, then its codes.
            let r = cache.row_len;
            let mut b = self.launch_of("kv_write_rows_fp8")?;
            b.ptr(&rv).u64(dev_slots).ptr_mut(&mut cache.bytes);
            b.ptr_mut(&mut cache.scales);
            b.u64(n).u64(w).u64(r as u64).i32(dt);
            // SAFETY: every stored slot was checked against the cache, whose rows the
            // stored width covers whole (`check_fp8_store`).
            unsafe { b.launch(grid(slots.len() * (width / r) * 32)) }?;
            return Ok(stored);
        }
        let mut b = self.launch_of("kv_write_rows")?;
        b.ptr(&rv).u64(dev_slots).ptr_mut(&mut cache.bytes);
        b.u64(n).u64(w).i32(dt);
        // SAFETY: every stored slot was checked against the cache.
        unsafe { b.launch(grid(slots.len() * width)) }?;
        Ok(stored)
    }

    /// `write_kv`: K and V rows of `n_kv_heads · head_dim` into their caches.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_kv_op(
        &self,
        mut k_cache: CudaKvMut<'_>,
        mut v_cache: CudaKvMut<'_>,
        n_kv_heads: usize,
        head_dim: usize,
        slots: &[usize],
        k: CudaRef<'_>,
        v: CudaRef<'_>,
    ) -> Result<(), KernelError> {
        // Every slot is checked before anything is stored, as on the CPU.
        let caches = (k_cache.len(), v_cache.len());
        let row = check_write_kv(caches, n_kv_heads, head_dim, slots, (k.len(), v.len()))?;
        check_fp8_row("write_kv K cache", k_cache.fp8_row_len(), head_dim)?;
        check_fp8_row("write_kv V cache", v_cache.fp8_row_len(), head_dim)?;
        if row == 0 {
            return Ok(());
        }
        self.kv_store_rows(&mut k_cache, row, slots, k)?;
        self.kv_store_rows(&mut v_cache, row, slots, v)?;
        Ok(())
    }

    pub(crate) fn kv_download_op(
        &self,
        src: CudaKvRef<'_>,
        host: &mut [f32],
    ) -> Result<(), KernelError> {
        check_len("kv_download host", src.len(), host.len())?;
        if src.is_empty() {
            return Ok(());
        }
        step_graph::refuse("downloads a KV cache")?;
        let mut tmp = unsafe { self.stream().alloc::<f32>(src.len()) }
            .map_err(|e| driver_err("allocating a download buffer", e))?;
        let (bytes, scales) = (src.bytes(), src.scales());
        let (dt, n) = (dtype_code(src.dtype()), src.len() as u64);
        let row_len = src.fp8_row_len().unwrap_or(1) as u64;
        let mut b = self.launch_of("kv_to_f32")?;
        b.ptr(&bytes).ptr(&scales).ptr_mut(&mut tmp);
        b.u64(n).i32(dt).u64(row_len);
        // SAFETY: `tmp` holds n elements, the view n of the cache's type.
        unsafe { b.launch(grid(src.len())) }?;
        self.stream()
            .memcpy_dtoh(&tmp, host)
            .map_err(|e| driver_err("downloading", e))?;
        self.synchronize()
    }
}

/// One write may not store two rows in one slot: on a GPU the threads of both rows would
/// race on it (whichever lands last wins). The scheduler never plans such a write; this
/// refuses one rather than let the result depend on the device's scheduling.
fn check_distinct_slots(slots: &[u64]) -> Result<(), KernelError> {
    let mut sorted: Vec<u64> = slots.iter().copied().filter(|&s| s != u64::MAX).collect();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(KernelError::Shape(format!(
            "kv write: slot {} is written twice in one call (its rows would race on the device)",
            w[0]
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod slot_tests {
    use super::check_distinct_slots;

    #[test]
    fn a_slot_written_twice_is_refused() {
        assert!(check_distinct_slots(&[3, 1, u64::MAX, u64::MAX, 2]).is_ok());
        let e = check_distinct_slots(&[3, 1, 7, 1]).unwrap_err();
        assert!(e.to_string().contains("slot 1 is written twice"), "{e}");
    }
}
