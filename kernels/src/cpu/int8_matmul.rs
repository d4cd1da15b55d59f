//! `out = x · wᵀ` for quantized weights (Q8_0, Q4_x and Q5_x fused in `avx2.rs` /
//! `avx512.rs`; Q4_K/Q5_K/Q6_K at decode sizes fused in `kquant_small_m.rs`; the other
//! K-quant and IQ4 types, and larger batches of K-quants, transcoded in `kquant_avx2.rs`)
//! with **int8 activations**,
//! as llama.cpp computes it: each 32-element block of every row of `x` is quantized to
//! int8 with its own f32 scale `dx = amax / 127` (Q8_0-style) and the block sum
//! `sx = dx · Σq`, then every weight block meets every activation block in an integer
//! dot product:
//!
//! * Q8_0: `dw·dx · Σ qw·qx`
//! * Q4_0: `dw·dx · Σ qw·qx − 8·dw · sx` (nibbles stored `q + 8`)
//! * Q4_1: `dw·dx · Σ qw·qx + mw · sx` (value = `qw·dw + mw`)
//!
//! The integer dot products run on AVX-512 VNNI (`vpdpbusd` on zmm, two blocks per
//! instruction), AVX-VNNI (`vpdpbusd` on ymm) or AVX2 (`vpmaddubsw` + `vpmaddwd`),
//! picked at run time ([`Int8Isa::detect`]); AMX is never used (the virtual machines
//! advertise it without enabling it). Without AVX2 there is no int8 path and
//! [`matmul_int8`] reports [`KernelError::Shape`]; [`crate::CpuBackend`] then uses
//! the f32 path.
//!
//! Accuracy: the only new error is the activation rounding, at most `dx/2 = amax/254`
//! per element, so each block's contribution is off by at most
//! `Σ|w|·amax/254` — about 0.4% of the block's `Σ|w|·amax` scale, and since the
//! rounding errors have random signs the error of a whole row is typically far
//! smaller (see the tests in `int8_matmul/tests.rs`).
//!
//! The switch between this path and the f32 one is [`CpuMatmul`].

use std::cell::RefCell;

use serde::{Deserialize, Serialize};

use crate::error::{check_len, KernelError};
use crate::pool::ThreadPool;
use crate::quant::{WeightFormat, QK};
use crate::weights::WeightMatrix;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod kquant_avx2;
pub(crate) mod kquant_small_m;
mod transcode;

/// How the CPU backend multiplies by quantized (Q8_0/Q4_x/Q5_x/K-quant/IQ4) weights; float weights
/// always take the f32 path. `--cpu-matmul` on the command line, `cpu_matmul` in
/// the engine config; the environment variable `DCPSERVE_CPU_MATMUL` (same names)
/// decides what `auto` means.
///
/// `auto` chooses per product ([`auto_int8`], the one place that decides): int8 for
/// Q4_K/Q5_K/Q6_K weights at decode sizes (`m ≤ 4`, the fused kernels of
/// `kquant_small_m.rs`), f32 for everything else, as measured (README, "The accuracy
/// rule for int8 activations"): for larger batches the K-quant int8 kernels transcode
/// and are slower, on Q4_1 int8 is slower with AVX2 alone, and where it is faster (Q4_1
/// with AVX-512 VNNI, by 6–12%) it changes the default model's greedy chat answer (see
/// `tests/default_model.rs`, `int8_activations_on_the_default_model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuMatmul {
    /// Per product as [`auto_int8`] says, unless `DCPSERVE_CPU_MATMUL` says `int8` or
    /// `f32` (then that for every product).
    #[default]
    Auto,
    /// Decode the weights to f32 and multiply the f32 activations (the old path).
    F32,
    /// Quantize activations to int8 per 32-block and use integer dot products.
    Int8,
}

impl std::str::FromStr for CpuMatmul {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self, KernelError> {
        match s.trim() {
            "auto" => Ok(CpuMatmul::Auto),
            "f32" | "float32" => Ok(CpuMatmul::F32),
            "int8" | "i8" => Ok(CpuMatmul::Int8),
            other => Err(KernelError::Shape(format!(
                "unknown cpu matmul `{other}`: expected one of auto, f32, int8"
            ))),
        }
    }
}

/// What `auto` means for one product with `format` weights and `m` activation rows:
/// `true` for the int8 path. Q4_K, Q5_K and Q6_K at `m ≤ 4` (one-sequence and
/// small-batch decode), where the fused int8 kernels beat the f32 ones and their
/// per-256 activation rounding is llama.cpp's own (README, "The accuracy rule for int8
/// activations").
///
/// ```
/// use dcpserve_kernels::cpu::int8_matmul::auto_int8;
/// use dcpserve_kernels::WeightFormat;
/// assert!(auto_int8(WeightFormat::Q4_K, 1) == cfg!(target_arch = "x86_64"));
/// assert!(!auto_int8(WeightFormat::Q4_K, 512));
/// assert!(!auto_int8(WeightFormat::Q4_1, 1));
/// ```
pub fn auto_int8(format: WeightFormat, m: usize) -> bool {
    kquant_small_m::applies(format, m)
}

impl CpuMatmul {
    /// Whether this mode leaves the choice to [`auto_int8`] per product: `Auto` without a
    /// `DCPSERVE_CPU_MATMUL` that says `int8` or `f32`.
    pub fn per_product(self) -> bool {
        self == CpuMatmul::Auto
            && !std::env::var("DCPSERVE_CPU_MATMUL")
                .ok()
                .and_then(|v| v.parse::<CpuMatmul>().ok())
                .is_some_and(|m| m != CpuMatmul::Auto)
    }

    /// Resolves `Auto` (through `DCPSERVE_CPU_MATMUL`, else `F32`); `Int8` without an
    /// int8 ISA (or with the kernel level capped to scalar) becomes `F32`. Never returns `Auto`.
    pub fn resolve(self) -> CpuMatmul {
        let wanted = match self {
            CpuMatmul::Auto => std::env::var("DCPSERVE_CPU_MATMUL")
                .ok()
                .and_then(|v| v.parse::<CpuMatmul>().ok())
                .filter(|m| *m != CpuMatmul::Auto)
                .unwrap_or(CpuMatmul::F32),
            other => other,
        };
        if wanted == CpuMatmul::Int8 && Int8Isa::detect().is_none() {
            CpuMatmul::F32
        } else {
            wanted
        }
    }
}

/// The instruction set of the int8 dot products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int8Isa {
    /// AVX-512 VNNI: `vpdpbusd` on 512-bit vectors, two blocks per instruction.
    Avx512Vnni,
    /// AVX-VNNI: the VEX-encoded 256-bit `vpdpbusd` (Intel client cores, no AVX-512).
    AvxVnni,
    /// AVX2: `vpmaddubsw` + `vpmaddwd` on 256-bit vectors.
    Avx2,
    /// The 256-bit kernel with the EVEX `vpdpbusd` of AVX-512 VNNI + VL: exercises the
    /// AVX-VNNI kernel's structure on machines that have AVX-512 but not AVX-VNNI.
    Avx512Vnni256,
}

impl Int8Isa {
    /// Every variant, best first.
    pub const ALL: [Int8Isa; 4] = [
        Int8Isa::Avx512Vnni,
        Int8Isa::AvxVnni,
        Int8Isa::Avx512Vnni256,
        Int8Isa::Avx2,
    ];

    /// Whether the running CPU can execute this path.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let base = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let avx512 = is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni");
            base && match self {
                Int8Isa::Avx512Vnni | Int8Isa::Avx512Vnni256 => avx512,
                Int8Isa::AvxVnni => is_x86_feature_detected!("avxvnni"),
                Int8Isa::Avx2 => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = self;
            false
        }
    }

    /// The best available path within the kernel level cap ([`crate::cpu::isa`]:
    /// `DCPSERVE_CPU_ISA=avx2` leaves only the 256-bit AVX2 / AVX-VNNI kernels,
    /// `scalar` none); `DCPSERVE_INT8_ISA=avx512vnni|avxvnni|avx2` picks another
    /// available one, for measurements. `None` without AVX2.
    pub fn detect() -> Option<Int8Isa> {
        static ISA: std::sync::OnceLock<(Option<Int8Isa>, [bool; 4])> = std::sync::OnceLock::new();
        let (forced, avail) = *ISA.get_or_init(|| {
            let forced = std::env::var("DCPSERVE_INT8_ISA")
                .ok()
                .and_then(|v| match v.as_str() {
                    "avx512vnni" => Some(Int8Isa::Avx512Vnni),
                    "avxvnni" => Some(Int8Isa::AvxVnni),
                    "avx512vnni256" => Some(Int8Isa::Avx512Vnni256),
                    "avx2" => Some(Int8Isa::Avx2),
                    _ => None,
                });
            (forced, Int8Isa::ALL.map(Int8Isa::available))
        });
        let level = crate::cpu::isa();
        let usable = |isa: Int8Isa| {
            let i = Int8Isa::ALL.iter().position(|x| *x == isa).unwrap_or(0);
            avail[i] && isa.level() <= level
        };
        match forced {
            Some(isa) if usable(isa) => Some(isa),
            _ => [Int8Isa::Avx512Vnni, Int8Isa::AvxVnni, Int8Isa::Avx2]
                .into_iter()
                .find(|isa| usable(*isa)),
        }
    }

    /// The kernel level this path needs ([`crate::cpu::CpuIsa`]).
    pub fn level(self) -> crate::cpu::CpuIsa {
        match self {
            Int8Isa::Avx512Vnni | Int8Isa::Avx512Vnni256 => crate::cpu::CpuIsa::Avx512,
            Int8Isa::AvxVnni | Int8Isa::Avx2 => crate::cpu::CpuIsa::Avx2,
        }
    }
}

/// True for the weight formats [`matmul_int8`] handles: the quantized ones.
pub fn int8_supported(format: WeightFormat) -> bool {
    matches!(
        format,
        WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1
    ) || WeightFormat::EXTRA_QUANTS.contains(&format)
}

/// Activations quantized per 32-block, reused across calls (no per-call allocation once
/// the largest shape has been seen).
#[derive(Default)]
pub(crate) struct QuantizedActs {
    /// int8 values, row-major `[m, k]`, plus 64 bytes of zero padding (kernels load
    /// two blocks at once).
    pub(crate) q: Vec<i8>,
    /// Each block's scale repeated 8 times (one per 32-bit dot-product lane):
    /// `[m, nb, 8]`, plus 16 zeros.
    pub(crate) dx8: Vec<f32>,
    /// `dx · Σq` per block, `[m, nbp]` with `nbp = nb` rounded up to 16 (zero padded).
    pub(crate) sx: Vec<f32>,
}

/// Blocks per row rounded up to 16 (one zmm of per-block values).
pub(crate) fn padded_blocks(nb: usize) -> usize {
    nb.next_multiple_of(16)
}

impl QuantizedActs {
    fn resize(&mut self, m: usize, k: usize) {
        let nb = k / QK;
        fn grow<T: Default + Clone>(v: &mut Vec<T>, len: usize) {
            if v.len() < len {
                v.resize(len, T::default());
            }
        }
        grow(&mut self.q, m * k + 64);
        grow(&mut self.dx8, m * nb * 8 + 16);
        grow(&mut self.sx, m * padded_blocks(nb));
    }
}

thread_local! {
    /// The calling thread's activation buffer (each rank / micro-batch thread has one).
    static ACTS: RefCell<QuantizedActs> = RefCell::new(QuantizedActs::default());
}

#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: tasks write disjoint regions (documented at each use).
unsafe impl<T> Sync for SendPtr<T> {}
unsafe impl<T> Send for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the field).
    fn ptr(self) -> *mut T {
        self.0
    }
}

/// Quantizes row `i` of `x` (`k` values) into the buffers at `q`, `dx8`, `sx`.
///
/// Portable version of `avx512::quantize_row`, with identical results: the same
/// `127 / amax` reciprocal, the same f32 products and round-half-to-even.
///
/// # Safety
/// `q` has room for `k` values, `dx8` for `8 · k/32`, `sx` for `padded_blocks(k/32)`.
unsafe fn quantize_row_scalar(x: &[f32], q: *mut i8, dx8: *mut f32, sx: *mut f32) {
    let nb = x.len() / QK;
    for (b, blk) in x.chunks_exact(QK).enumerate() {
        let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let d = amax / 127.0;
        let mut sum = 0i32;
        for (j, v) in blk.iter().enumerate() {
            let r = (v * id).round_ties_even() as i32;
            sum += r;
            *q.add(b * QK + j) = r as i8;
        }
        for l in 0..8 {
            *dx8.add(b * 8 + l) = d;
        }
        *sx.add(b) = d * sum as f32;
    }
    for b in nb..padded_blocks(nb) {
        *sx.add(b) = 0.0;
    }
}

/// Quantizes the `m` rows of `x` into `acts`, in parallel on `pool` when large.
fn quantize_acts(pool: &ThreadPool, x: &[f32], m: usize, k: usize, acts: &mut QuantizedActs) {
    quantize_acts_at(pool, x, m, k, acts, crate::cpu::isa());
}

/// [`quantize_acts`] at kernel level `level` (which the CPU must support).
fn quantize_acts_at(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    k: usize,
    acts: &mut QuantizedActs,
    level: crate::cpu::CpuIsa,
) {
    assert!(level <= crate::cpu::features().best_isa());
    acts.resize(m, k);
    let nb = k / QK;
    let nbp = padded_blocks(nb);
    let (q, dx8, sx) = (
        SendPtr(acts.q.as_mut_ptr()),
        SendPtr(acts.dx8.as_mut_ptr()),
        SendPtr(acts.sx.as_mut_ptr()),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    let rows = |i0: usize, i1: usize| {
        for i in i0..i1 {
            let xr = &x[i * k..(i + 1) * k];
            // SAFETY: row i's regions of the three buffers (sized by `resize`) are
            // written by this call only.
            unsafe {
                let (qp, dp, sp) = (
                    q.ptr().add(i * k),
                    dx8.ptr().add(i * nb * 8),
                    sx.ptr().add(i * nbp),
                );
                #[cfg(target_arch = "x86_64")]
                match level {
                    crate::cpu::CpuIsa::Avx512 => {
                        avx512::quantize_row(xr, qp, dp, sp);
                        continue;
                    }
                    crate::cpu::CpuIsa::Avx2 => {
                        avx2::quantize_row(xr, qp, dp, sp);
                        continue;
                    }
                    crate::cpu::CpuIsa::Scalar | crate::cpu::CpuIsa::Neon => {}
                }
                quantize_row_scalar(xr, qp, dp, sp);
            }
        }
    };
    // Below ~64k values a pool dispatch costs more than it saves.
    if m * k < 1 << 16 || m < 2 {
        rows(0, m);
    } else {
        let per = m.div_ceil(pool.n_threads() * 2);
        pool.run(m.div_ceil(per), |t| rows(t * per, ((t + 1) * per).min(m)));
    }
}

/// The quantized activations as the kernels read them.
// Read by the x86 kernels only; other targets only build the quantizer.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Copy)]
pub(crate) struct ActsView {
    pub(crate) q: *const i8,
    pub(crate) dx8: *const f32,
    pub(crate) sx: *const f32,
    /// Elements per row.
    pub(crate) k: usize,
}

// SAFETY: read-only for the duration of one pool run.
unsafe impl Sync for ActsView {}
unsafe impl Send for ActsView {}

impl ActsView {
    /// Blocks per row.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn nb(&self) -> usize {
        self.k / QK
    }
}

/// Rows of `x` per task chunk for large `m` (the chunk's int8 rows stay in L2).
const MC: usize = 64;

/// `out[m, n] = x[m, k] · wᵀ` with int8 activations on `isa`, for quantized `w`.
///
/// Errors: wrong lengths, a float weight format, or an `isa` this CPU lacks
/// ([`KernelError::Shape`]).
///
/// ```
/// use dcpserve_kernels::cpu::int8_matmul::{matmul_int8, Int8Isa};
/// use dcpserve_kernels::{ThreadPool, WeightFormat, WeightMatrix};
/// let pool = ThreadPool::new(1);
/// let w = WeightMatrix::from_f32(1, 32, vec![0.5; 32]).unwrap()
///     .to_format(WeightFormat::Q8_0).unwrap();
/// let mut out = [0.0];
/// if let Some(isa) = Int8Isa::detect() {
///     matmul_int8(&pool, &[2.0; 32], 1, &w, &mut out, isa).unwrap();
///     assert!((out[0] - 32.0).abs() < 0.1);
/// }
/// ```
pub fn matmul_int8(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    w: &WeightMatrix,
    out: &mut [f32],
    isa: Int8Isa,
) -> Result<(), KernelError> {
    let (n, k) = (w.rows(), w.cols());
    check_len("matmul x", m * k, x.len())?;
    check_len("matmul out", m * n, out.len())?;
    if !int8_supported(w.format()) {
        return Err(KernelError::Shape(format!(
            "int8 matmul of {:?} weights",
            w.format()
        )));
    }
    if !isa.available() {
        return Err(KernelError::Shape(format!(
            "int8 matmul on {isa:?}: this CPU lacks it"
        )));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        out.fill(0.0);
        return Ok(());
    }
    if kquant_small_m::applies(w.format(), m) {
        kquant_small_m::matmul(pool, x, m, w, out, isa);
        return Ok(());
    }
    ACTS.with(|a| {
        // A nested call on the same thread (it does not happen today) gets its own buffer.
        let mut fresh = QuantizedActs::default();
        let mut guard = a.try_borrow_mut();
        let acts = match guard.as_mut() {
            Ok(g) => &mut **g,
            Err(_) => &mut fresh,
        };
        quantize_acts(pool, x, m, k, acts);
        let view = ActsView {
            q: acts.q.as_ptr(),
            dx8: acts.dx8.as_ptr(),
            sx: acts.sx.as_ptr(),
            k,
        };
        run_tasks(pool, view, m, w, out, isa);
    });
    Ok(())
}

/// Splits the product over output columns (rows of `w`, in multiples of 4) and, for
/// large `m`, over chunks of [`MC`] rows of `x`.
fn run_tasks(
    pool: &ThreadPool,
    acts: ActsView,
    m: usize,
    w: &WeightMatrix,
    out: &mut [f32],
    isa: Int8Isa,
) {
    let n = w.rows();
    let threads = pool.n_threads();
    let m_chunks = m.div_ceil(MC);
    // Enough tasks for load balance, few enough to keep dispatch cheap.
    let want = (threads * 8).div_ceil(m_chunks).max(1);
    let rows_per = n.div_ceil(want).max(16).next_multiple_of(4);
    let n_chunks = n.div_ceil(rows_per);
    let outp = SendPtr(out.as_mut_ptr());
    pool.run(m_chunks * n_chunks, |t| {
        let (mc, nc) = (t % m_chunks, t / m_chunks);
        let (m0, m1) = (mc * MC, ((mc + 1) * MC).min(m));
        let (n0, n1) = (nc * rows_per, ((nc + 1) * rows_per).min(n));
        let _ = (m0, m1, n0, n1, outp, acts, isa);
        // SAFETY: `isa` was checked available; each task writes only rows m0..m1,
        // columns n0..n1 of `out`, an `[m, n]` buffer; `acts` holds m quantized rows.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            if !avx2::handles(w.format()) {
                // The K-quant / IQ4 kernels are 256-bit only (the zmm ISA uses their
                // EVEX ymm variant).
                let o = outp.ptr();
                match isa {
                    Int8Isa::Avx2 => kquant_avx2::task_avx2(acts, m0, m1, w, o, n0, n1),
                    Int8Isa::AvxVnni => kquant_avx2::task_avxvnni(acts, m0, m1, w, o, n0, n1),
                    Int8Isa::Avx512Vnni | Int8Isa::Avx512Vnni256 => {
                        kquant_avx2::task_avx512vnni256(acts, m0, m1, w, o, n0, n1)
                    }
                }
                return;
            }
            match isa {
                Int8Isa::Avx512Vnni => avx512::task(acts, m0, m1, w, outp.ptr(), n0, n1),
                Int8Isa::AvxVnni => avx2::task_avxvnni(acts, m0, m1, w, outp.ptr(), n0, n1),
                Int8Isa::Avx512Vnni256 => {
                    avx2::task_avx512vnni256(acts, m0, m1, w, outp.ptr(), n0, n1)
                }
                Int8Isa::Avx2 => avx2::task_avx2(acts, m0, m1, w, outp.ptr(), n0, n1),
            }
        }
    });
}

#[cfg(test)]
mod tests;
