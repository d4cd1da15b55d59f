//! The emulated cuBLAS: handles bound to a stream, and the GEMM calls the backend makes,
//! computed on the CPU as an item of the handle's stream (so they are ordered with the
//! stream's kernels and copies, and captured into graphs like them).

pub mod gemm;

#[cfg(test)]
mod tests;

use std::ffi::{c_int, c_longlong, c_void};
use std::sync::{Arc, Mutex};

use crate::driver::context::current_device;
use crate::driver::memory::{resolve, Fault};
use crate::driver::registry::Registry;
use crate::driver::stream::lookup;
use crate::driver::Handle;
use gemm::{Elem, Operand, Shape};

/// `cublasStatus_t`.
pub type Status = u32;
pub mod status {
    pub const SUCCESS: u32 = 0;
    pub const NOT_INITIALIZED: u32 = 1;
    pub const INVALID_VALUE: u32 = 7;
    pub const EXECUTION_FAILED: u32 = 13;
    pub const NOT_SUPPORTED: u32 = 15;
}

struct BlasHandle {
    device: usize,
    stream: Mutex<Handle>,
}

// SAFETY: the stream handle is an integer naming a registry entry.
unsafe impl Send for BlasHandle {}
unsafe impl Sync for BlasHandle {}

static HANDLES: Registry<BlasHandle> = Registry::new(0xB1A5);

fn refuse(code: Status, op: &str, why: impl std::fmt::Display) -> Status {
    eprintln!("dcpemu: {op}: {why} (cuBLAS status {code})");
    code
}

fn handle(h: Handle, op: &str) -> Result<Arc<BlasHandle>, Status> {
    HANDLES.get(h).ok_or_else(|| {
        refuse(
            status::NOT_INITIALIZED,
            op,
            format!("{h:?} is not a live handle"),
        )
    })
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

#[no_mangle]
pub unsafe extern "C" fn cublasCreate_v2(out: *mut Handle) -> Status {
    let Ok(device) = current_device("cublasCreate") else {
        return status::NOT_INITIALIZED;
    };
    if out.is_null() {
        return refuse(status::INVALID_VALUE, "cublasCreate", "null output pointer");
    }
    *out = HANDLES.insert(Arc::new(BlasHandle {
        device,
        stream: Mutex::new(std::ptr::null_mut()),
    }));
    status::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasDestroy_v2(h: Handle) -> Status {
    match HANDLES.remove(h) {
        Some(_) => status::SUCCESS,
        None => refuse(
            status::NOT_INITIALIZED,
            "cublasDestroy",
            format!("{h:?} is not a live handle"),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetStream_v2(h: Handle, stream: Handle) -> Status {
    let b = tri!(handle(h, "cublasSetStream"));
    if lookup(stream, "cublasSetStream").is_err() {
        return status::INVALID_VALUE;
    }
    *b.stream.lock().unwrap_or_else(|p| p.into_inner()) = stream;
    status::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetStream_v2(h: Handle, out: *mut Handle) -> Status {
    let b = tri!(handle(h, "cublasGetStream"));
    if out.is_null() {
        return status::INVALID_VALUE;
    }
    *out = *b.stream.lock().unwrap_or_else(|p| p.into_inner());
    status::SUCCESS
}

/// The CPU GEMM needs no workspace; the range is checked to be device memory.
#[no_mangle]
pub unsafe extern "C" fn cublasSetWorkspace_v2(h: Handle, ws: *mut c_void, bytes: usize) -> Status {
    let b = tri!(handle(h, "cublasSetWorkspace"));
    if bytes > 0 {
        match resolve(ws as u64, bytes, "cublasSetWorkspace") {
            Ok((_, dev)) if dev == b.device => {}
            Ok((_, dev)) => {
                return refuse(
                    status::INVALID_VALUE,
                    "cublasSetWorkspace",
                    format!("workspace on device {dev}"),
                )
            }
            Err(f) => return refuse(status::INVALID_VALUE, "cublasSetWorkspace", f.msg),
        }
    }
    status::SUCCESS
}

/// Math modes (tensor-op, TF32) only allow faster, less exact arithmetic; the emulator
/// always computes in full f32.
#[no_mangle]
pub unsafe extern "C" fn cublasSetMathMode(h: Handle, _mode: u32) -> Status {
    tri!(handle(h, "cublasSetMathMode"));
    status::SUCCESS
}

/// One operand as passed: a device address, its type, leading dimension, batch stride.
struct DevOperand {
    addr: u64,
    elem: Elem,
    ld: usize,
    stride: usize,
    trans: bool,
    /// Stored rows and columns (before the transpose).
    rows: usize,
    cols: usize,
}

impl DevOperand {
    /// Bytes spanned by `batch` matrices.
    fn extent_bytes(&self, batch: usize) -> usize {
        if self.rows == 0 || self.cols == 0 || batch == 0 {
            return 0;
        }
        let one = self.ld * (self.cols - 1) + self.rows;
        (self.stride * (batch - 1) + one) * self.elem.size()
    }

    fn host(&self, batch: usize, what: &str, name: &str) -> Result<usize, Fault> {
        let bytes = self.extent_bytes(batch);
        resolve(self.addr, bytes, &format!("{what}, matrix {name}")).map(|(p, _)| p as usize)
    }
}

/// Everything a GEMM call carries, validated.
struct GemmCall {
    shape: Shape,
    a: DevOperand,
    b: DevOperand,
    c: DevOperand,
    batch: usize,
}

#[allow(clippy::too_many_arguments)]
unsafe fn issue(
    op: &'static str,
    h: Handle,
    transa: u32,
    transb: u32,
    (m, n, k): (c_int, c_int, c_int),
    (alpha, beta): (f32, f32),
    (a, a_type, lda, stride_a): (*const c_void, u32, c_int, i64),
    (b, b_type, ldb, stride_b): (*const c_void, u32, c_int, i64),
    (c, c_type, ldc, stride_c): (*mut c_void, u32, c_int, i64),
    batch: c_int,
) -> Status {
    let bh = tri!(handle(h, op));
    if m < 0 || n < 0 || k < 0 || batch < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0 {
        return refuse(
            status::INVALID_VALUE,
            op,
            format!("negative size m={m} n={n} k={k} batch={batch}"),
        );
    }
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let trans = |t: u32, which: &str| match t {
        0 => Ok(false),
        1 | 2 => Ok(true),
        _ => Err(refuse(
            status::INVALID_VALUE,
            op,
            format!("operation {t} for {which}"),
        )),
    };
    let elem = |t: u32, which: &str| {
        Elem::from_cuda(t).ok_or_else(|| {
            refuse(
                status::NOT_SUPPORTED,
                op,
                format!("data type {t} for {which}"),
            )
        })
    };
    let (ta, tb) = (tri!(trans(transa, "A")), tri!(trans(transb, "B")));
    let mk =
        |addr: *const c_void, e: Elem, ld: c_int, stride: i64, t: bool, rows, cols| DevOperand {
            addr: addr as u64,
            elem: e,
            ld: ld.max(0) as usize,
            stride: stride as usize,
            trans: t,
            rows,
            cols,
        };
    let call = GemmCall {
        shape: Shape {
            m,
            n,
            k,
            alpha,
            beta,
        },
        a: {
            let (r, cl) = if ta { (k, m) } else { (m, k) };
            mk(a, tri!(elem(a_type, "A")), lda, stride_a, ta, r, cl)
        },
        b: {
            let (r, cl) = if tb { (n, k) } else { (k, n) };
            mk(b, tri!(elem(b_type, "B")), ldb, stride_b, tb, r, cl)
        },
        c: mk(c, tri!(elem(c_type, "C")), ldc, stride_c, false, m, n),
        batch: batch as usize,
    };
    for (x, name) in [(&call.a, "A"), (&call.b, "B"), (&call.c, "C")] {
        if x.ld < x.rows.max(1) {
            return refuse(
                status::INVALID_VALUE,
                op,
                format!("ld{name} = {} < {} rows", x.ld, x.rows),
            );
        }
        if let Err(f) = x.host(call.batch, op, name) {
            return refuse(status::INVALID_VALUE, op, f.msg);
        }
    }
    let stream = *bh.stream.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(s) = lookup(stream, op) else {
        return status::INVALID_VALUE;
    };
    if s.device != bh.device {
        return refuse(
            status::INVALID_VALUE,
            op,
            "the handle's stream is on another device",
        );
    }
    let call = Arc::new(call);
    s.submit(
        op,
        Arc::new(move || {
            let g = &*call;
            let pa = g.a.host(g.batch, op, "A")?;
            let pb = g.b.host(g.batch, op, "B")?;
            let pc = g.c.host(g.batch, op, "C")?;
            for i in 0..g.batch {
                let at = |d: &DevOperand, p: usize| Operand {
                    ptr: p + i * d.stride * d.elem.size(),
                    elem: d.elem,
                    ld: d.ld,
                    trans: d.trans,
                };
                // SAFETY: the three extents were resolved just above.
                unsafe { gemm::gemm(g.shape, at(&g.a, pa), at(&g.b, pb), at(&g.c, pc)) };
            }
            Ok(())
        }),
    );
    status::SUCCESS
}

/// Reads a host scalar of the compute type (pointer mode host: read at call time).
unsafe fn scalar(p: *const c_void, compute: u32) -> Result<f32, Status> {
    if p.is_null() {
        return Err(refuse(
            status::INVALID_VALUE,
            "cuBLAS",
            "null alpha or beta",
        ));
    }
    match compute {
        // CUBLAS_COMPUTE_32F and its fast variants, and CUDA_R_32F (legacy enum).
        0 | 68..=77 => Ok(p.cast::<f32>().read_unaligned()),
        _ => Err(refuse(
            status::NOT_SUPPORTED,
            "cuBLAS",
            format!("compute type {compute}"),
        )),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cublasGemmEx(
    h: Handle,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    a_type: u32,
    lda: c_int,
    b: *const c_void,
    b_type: u32,
    ldb: c_int,
    beta: *const c_void,
    c: *mut c_void,
    c_type: u32,
    ldc: c_int,
    compute: u32,
    _algo: i32,
) -> Status {
    let (al, be) = (tri!(scalar(alpha, compute)), tri!(scalar(beta, compute)));
    issue(
        "cublasGemmEx",
        h,
        transa,
        transb,
        (m, n, k),
        (al, be),
        (a, a_type, lda, 0),
        (b, b_type, ldb, 0),
        (c, c_type, ldc, 0),
        1,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cublasGemmStridedBatchedEx(
    h: Handle,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    a_type: u32,
    lda: c_int,
    stride_a: c_longlong,
    b: *const c_void,
    b_type: u32,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const c_void,
    c: *mut c_void,
    c_type: u32,
    ldc: c_int,
    stride_c: c_longlong,
    batch: c_int,
    compute: u32,
    _algo: i32,
) -> Status {
    let (al, be) = (tri!(scalar(alpha, compute)), tri!(scalar(beta, compute)));
    issue(
        "cublasGemmStridedBatchedEx",
        h,
        transa,
        transb,
        (m, n, k),
        (al, be),
        (a, a_type, lda, stride_a),
        (b, b_type, ldb, stride_b),
        (c, c_type, ldc, stride_c),
        batch,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cublasSgemm_v2(
    h: Handle,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: *const f32,
    c: *mut f32,
    ldc: c_int,
) -> Status {
    let (al, be) = (
        tri!(scalar(alpha.cast(), 68)),
        tri!(scalar(beta.cast(), 68)),
    );
    issue(
        "cublasSgemm",
        h,
        transa,
        transb,
        (m, n, k),
        (al, be),
        (a.cast(), 0, lda, 0),
        (b.cast(), 0, ldb, 0),
        (c.cast(), 0, ldc, 0),
        1,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cublasSgemmStridedBatched(
    h: Handle,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: *const f32,
    lda: c_int,
    stride_a: c_longlong,
    b: *const f32,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const f32,
    c: *mut f32,
    ldc: c_int,
    stride_c: c_longlong,
    batch: c_int,
) -> Status {
    let (al, be) = (
        tri!(scalar(alpha.cast(), 68)),
        tri!(scalar(beta.cast(), 68)),
    );
    issue(
        "cublasSgemmStridedBatched",
        h,
        transa,
        transb,
        (m, n, k),
        (al, be),
        (a.cast(), 0, lda, stride_a),
        (b.cast(), 0, ldb, stride_b),
        (c.cast(), 0, ldc, stride_c),
        batch,
    )
}
