//! Weight matrices on the device and the products with them: cuBLAS GEMMs and the exact
//! bf16-weight kernel (`kernels/matmul.cu`), plus embedding gathers.

use std::ffi::c_void;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{CudaSlice, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::backend::Precision;
use crate::cuda::device::driver_err;
use crate::cuda::memory::CudaRef;
use crate::cuda::staging::bytes_of;
use crate::cuda::{grid, lanes, CudaBackend};
use crate::device::GpuMatmul;
use crate::dtype::DType;
use crate::error::{check_len, KernelError};
use crate::kv_dtype::f32_to_bf16;
use crate::step_graph;
use crate::weights::WeightMatrix;

/// A `[rows, cols]` weight matrix in device memory (the backend's
/// [`WeightStorage::Matrix`](crate::WeightStorage::Matrix)).
///
/// f32 matrices stay f32; every other format is decoded on the host and stored as
/// bf16 (GGUF quantized weights are *dequantized to bf16 at upload*: twice the bytes of
/// Q8_0, four times Q4_0, in exchange for tensor-core GEMMs without dequantizing
/// kernels). [`WeightStorage::matrix_shape`](crate::WeightStorage::matrix_shape) reports the
/// original [`DType`]; [`CudaMatrix::device_dtype`] (and
/// [`WeightStorage::matrix_storage`](crate::WeightStorage::matrix_storage)) the stored one.
#[derive(Debug)]
pub struct CudaMatrix {
    rows: usize,
    cols: usize,
    dtype: DType,
    data: Weights,
}

#[derive(Debug)]
enum Weights {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<u16>),
}

impl CudaMatrix {
    /// The element type the device holds: `F32` or `BF16`.
    pub fn device_dtype(&self) -> DType {
        match self.data {
            Weights::F32(_) => DType::F32,
            Weights::Bf16(_) => DType::BF16,
        }
    }

    /// `(rows, cols, original dtype)`.
    pub fn shape(&self) -> (usize, usize, DType) {
        (self.rows, self.cols, self.dtype)
    }
}

/// Rows decoded per host batch at upload (bounds the f32 scratch to a few MB).
const UPLOAD_ROWS_ELEMS: usize = 1 << 20;

impl CudaBackend {
    pub(crate) fn upload_matrix_op(&self, w: &WeightMatrix) -> Result<CudaMatrix, KernelError> {
        let (rows, cols) = (w.rows(), w.cols());
        let n = rows * cols;
        let data = if w.format() == DType::F32 {
            let host = w.to_f32_vec();
            Weights::F32(self.upload_owned(&host)?)
        } else {
            let mut bf = Vec::with_capacity(n);
            let mut row = vec![0.0f32; cols];
            let batch = (UPLOAD_ROWS_ELEMS / cols.max(1)).max(1);
            for r0 in (0..rows).step_by(batch) {
                for r in r0..(r0 + batch).min(rows) {
                    w.dequantize_row(r, &mut row)?;
                    bf.extend(row.iter().map(|&v| f32_to_bf16(v)));
                }
            }
            Weights::Bf16(self.upload_owned(&bf)?)
        };
        Ok(CudaMatrix {
            rows,
            cols,
            dtype: w.format(),
            data,
        })
    }

    /// `out[m, w.rows] = x[m, w.cols] · wᵀ`.
    pub(crate) fn matmul_op(
        &self,
        x: CudaRef<'_>,
        m: usize,
        w: &CudaMatrix,
        out: &mut CudaViewMut<'_, f32>,
        precision: Precision,
    ) -> Result<(), KernelError> {
        let (n, k) = (w.rows, w.cols);
        check_len("matmul x", m * k, x.len())?;
        check_len("matmul out", m * n, out.len())?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return self.fill_op(out, 0.0);
        }
        let dims = [m, n, k].map(|v| {
            i32::try_from(v).map_err(|_| KernelError::Shape(format!("matmul: {v} exceeds cuBLAS")))
        });
        let [mi, ni, ki] = [dims[0].clone()?, dims[1].clone()?, dims[2].clone()?];
        // `--gpu-matmul bf16` (the default) runs every bf16 product on tensor cores.
        let precision = match self.gpu_matmul() {
            GpuMatmul::Bf16 => Precision::Fast,
            GpuMatmul::Exact => precision,
        };
        match (&w.data, precision) {
            (Weights::F32(wd), _) => self.gemm(GemmArgs {
                x: GemmInput::F32(x),
                w: wd.device_ptr(self.stream()).0,
                w_type: blas_sys::cudaDataType::CUDA_R_32F,
                m: mi,
                n: ni,
                k: ki,
                out,
            }),
            (Weights::Bf16(wd), Precision::Fast) => {
                // Tensor cores: activations rounded to bf16, f32 accumulation.
                // The bf16 copy of x lives in the lane's scratch (no allocation per GEMM).
                let xp = self.scratch_u16(m * k)?;
                let xv = x.cuda();
                let mut b = self.launch_of("f32_to_bf16_kernel")?;
                let n_x = (m * k) as u64;
                b.ptr(&xv).u64(xp).u64(n_x);
                // SAFETY: the scratch at `xp` holds at least m·k elements.
                unsafe { b.launch(grid(m * k)) }?;
                self.gemm(GemmArgs {
                    x: GemmInput::Bf16(xp),
                    w: wd.device_ptr(self.stream()).0,
                    w_type: blas_sys::cudaDataType::CUDA_R_16BF,
                    m: mi,
                    n: ni,
                    k: ki,
                    out,
                })
            }
            (Weights::Bf16(wd), Precision::Exact) => {
                let xv = x.cuda();
                // Vector loads need whole 8-element groups and 16-byte aligned rows of x
                // (a view may start anywhere in its buffer; weights start allocations).
                let (xp, _sx) = xv.device_ptr(self.stream());
                let vec = i32::from(k.is_multiple_of(8) && xp.is_multiple_of(16));
                let mut b = self.launch_of("matmul_bf16_exact")?;
                let (mu, nu, ku) = (mi as u32, ni as u32, ki as u32);
                b.ptr(&xv)
                    .ptr(wd)
                    .ptr_mut(out)
                    .u32(mu)
                    .u32(nu)
                    .u32(ku)
                    .i32(vec);
                let cfg = LaunchConfig {
                    grid_dim: (nu.div_ceil(MM_WARPS), mu.div_ceil(MM_TOKENS), 1),
                    block_dim: (MM_WARPS * 32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: shapes checked; the kernel bounds every index by m, n, k.
                unsafe { b.launch(cfg) }?;
                Ok(())
            }
        }
    }

    /// Column-major cuBLAS view of the row-major product: `outᵀ[n, m] = W[n, k] · xᵀ`,
    /// i.e. `C = op(A)·B` with `A = W` (k×n column-major, transposed), `B = x` (k×m).
    fn gemm(&self, a: GemmArgs<'_, '_, '_>) -> Result<(), KernelError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // cuBLAS works in the calling thread's current context.
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))?;
        let blas_guard = lanes::lock(&self.lane().blas);
        let handle = *blas_guard.handle();
        let (op_t, op_n) = (
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
        );
        let (out_ptr, _so) = a.out.device_ptr_mut(self.stream());
        let xv;
        let (x_ptr, x_type, _sx) = match a.x {
            GemmInput::F32(x) => {
                xv = x.cuda();
                let (p, s) = xv.device_ptr(self.stream());
                (p, blas_sys::cudaDataType::CUDA_R_32F, Some(s))
            }
            GemmInput::Bf16(p) => (p, blas_sys::cudaDataType::CUDA_R_16BF, None),
        };
        let (out_type, compute, algo) = (
            blas_sys::cudaDataType::CUDA_R_32F,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        );
        // Every value the GEMM is issued with (the handle fixes the stream and the
        // workspace); `lda = ldb = k`, `ldc = n`.
        let sig = [
            handle as usize as u64,
            op_t as u64,
            op_n as u64,
            a.n as u64,
            a.m as u64,
            a.k as u64,
            u64::from(alpha.to_bits()),
            a.w,
            a.w_type as u64,
            a.k as u64,
            x_ptr,
            x_type as u64,
            a.k as u64,
            u64::from(beta.to_bits()),
            out_ptr,
            out_type as u64,
            a.n as u64,
            compute as u64,
            algo as u64,
        ];
        // The guards of the pointers (`_so`, `_sx`) and the handle's lock are held until
        // the GEMM is enqueued (the end of the function).
        step_graph::enqueue("gemm", &sig, || {
            // SAFETY: pointers are live device buffers of the checked sizes, enqueued on
            // the handle's stream (the backend's).
            unsafe {
                blas::gemm_ex(
                    handle,
                    op_t,
                    op_n,
                    a.n,
                    a.m,
                    a.k,
                    &alpha as *const f32 as *const c_void,
                    a.w as *const c_void,
                    a.w_type,
                    a.k,
                    x_ptr as *const c_void,
                    x_type,
                    a.k,
                    &beta as *const f32 as *const c_void,
                    out_ptr as *mut c_void,
                    out_type,
                    a.n,
                    compute,
                    algo,
                )
            }
            .map_err(|e| KernelError::Device(format!("cuBLAS GEMM: {e:?}")))
        })
    }

    pub(crate) fn embedding_op(
        &self,
        table: &CudaMatrix,
        ids: &[u32],
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        let cols = table.cols;
        check_len("gather_rows output", ids.len() * cols, out.len())?;
        if cols == 0 || ids.is_empty() {
            return Ok(());
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= table.rows) {
            return Err(KernelError::OutOfRange {
                what: "row",
                value: bad as usize,
                limit: table.rows,
            });
        }
        let [dev_ids] = self.stage_meta([bytes_of(ids)])?;
        let (n, c) = (ids.len() as u64, cols as u64);
        let cfg = grid(ids.len() * cols);
        match &table.data {
            Weights::F32(t) => {
                let mut b = self.launch_of("embed_f32")?;
                b.ptr(t).u64(dev_ids).ptr_mut(out).u64(n).u64(c);
                // SAFETY: ids checked against the table rows.
                unsafe { b.launch(cfg) }?;
            }
            Weights::Bf16(t) => {
                let mut b = self.launch_of("embed_bf16")?;
                b.ptr(t).u64(dev_ids).ptr_mut(out).u64(n).u64(c);
                // SAFETY: as above.
                unsafe { b.launch(cfg) }?;
            }
        }
        Ok(())
    }
}

/// Output features per block and tokens per block row of `matmul_bf16_exact`
/// (`MM_WARPS` / `MM_TOKENS` in `kernels/matmul.cu`).
const MM_WARPS: u32 = 8;
const MM_TOKENS: u32 = 4;

enum GemmInput<'a> {
    F32(CudaRef<'a>),
    /// A bf16 copy of the activations (device pointer).
    Bf16(u64),
}

struct GemmArgs<'a, 'b, 'c> {
    x: GemmInput<'a>,
    w: u64,
    w_type: blas_sys::cudaDataType,
    m: i32,
    n: i32,
    k: i32,
    out: &'b mut CudaViewMut<'c, f32>,
}
