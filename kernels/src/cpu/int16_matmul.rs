//! Products with the 32-element block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) and
//! **int16 activations**, fused on AVX2: a dot-product kernel for one to four activation
//! rows ([`SMALL_M`]: decode, speculative verification; `avx2.rs`, and `avx512.rs` on the
//! AVX-512 level) and an outer-product tile past that (`avx2_gemm.rs`; `auto` takes it up
//! to [`AUTO_MAX_M`] rows on the AVX2 level).
//!
//! Why a third path: at one to four activation rows the f32 path is bound by the
//! instructions that decode each weight to a float (about 26 per 32 weights with AVX2's
//! 8 lanes), not by memory, and llama.cpp's int8 activations (`vpmaddubsw`) move the
//! default model's greedy answer. With int16 activations the integer dot product is as
//! cheap on AVX2 — `vpmaddwd` multiplies 16 pairs, the same two instructions per 32 weights
//! as `vpmaddubsw` + `vpmaddwd` — and the codes widen to i16 in one `vpmovzxbw`, so a block
//! costs about 9 instructions; the activation rounding is 258× finer than int8's. From
//! five to eight rows the f32 path runs its 16-row tile half empty; one 8-row integer
//! tile does the same work in about half the time.
//!
//! Each activation row is quantized once per product, per 32-element block: `dx =
//! amax/32767`, `qx = round_half_even(x/dx)` (so `|qx| ≤ 32767`), and the exact f32 sum
//! `sx = Σx`. A weight block `w = dw·q + mt` (`mt` = the Q4_1/Q5_1 minimum, `−8·dw` for
//! Q4_0, `−16·dw` for Q5_0, 0 for Q8_0) then contributes
//!
//! `dw·dx · Σ q·qx  +  mt · sx`
//!
//! with `Σ q·qx` exact in i32 (`|q| ≤ 128`, so a block sums to at most 32·128·32767 <
//! 2³¹). The only error beside f32 rounding is the activation's, at most `dx/2 =
//! amax/65534` per element: a block's product moves by at most `Σ|q·dw|·amax/65534`.
//!
//! `auto` takes this path on the AVX2 level (`crate::cpu::isa() == Avx2`) up to
//! [`AUTO_MAX_M`] rows and on the AVX-512 level up to [`SMALL_M`] (its own dot-product
//! kernels, `avx512.rs`), where each was measured faster than the f32 path (README, "GGUF
//! types"); past those the f32 tiles, `--cpu-matmul f32` the exact f32 path
//! everywhere.

use std::cell::RefCell;

use crate::error::{check_len, KernelError};
use crate::pool::ThreadPool;
use crate::quant::{WeightFormat, QK};
use crate::weights::WeightMatrix;

#[cfg(target_arch = "x86_64")]
#[macro_use]
mod dot_kernel;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_gemm;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Largest `m` on the dot-product kernels (as the f32 path's fused small-m kernels);
/// larger batches take the tiled kernel.
pub(crate) const SMALL_M: usize = 4;

/// Largest `m` that `auto` multiplies here. One 8-row tile of the tiled kernel beats the
/// f32 path's 16-row tile, half of it padding, up to 8 rows (1.2–2.1× on the default
/// model's shapes, AVX2-only Zen 3, `INT16=1` vs `INT16=0` of the `matmul_bench`
/// example); from 12 rows on, the f32 tile is as fast or faster (0.6–1.0× at 32): on Zen
/// 3 a `vpmaddwd` (16 products) issues about as often as an FMA (8) and needs a
/// `vpaddd` beside it, so the integer tile gains nothing once the f32 tile is full.
pub(crate) const AUTO_MAX_M: usize = 8;

/// Whether `auto` multiplies `format` weights at batch size `m` here: the 32-element
/// block formats, `1 ≤ m ≤ 8` on the AVX2 level, `1 ≤ m ≤ 4` on the AVX-512 level (where
/// the f32 tile is the faster one past four rows).
///
/// ```
/// use dcpserve_kernels::cpu::int16_matmul::applies;
/// use dcpserve_kernels::WeightFormat;
/// assert!(!applies(WeightFormat::F32, 1));
/// assert!(!applies(WeightFormat::Q4_K, 4));
/// assert!(!applies(WeightFormat::Q4_1, 0));
/// assert!(!applies(WeightFormat::Q4_1, 32));
/// ```
pub fn applies(format: WeightFormat, m: usize) -> bool {
    let most = match crate::cpu::isa() {
        crate::cpu::CpuIsa::Avx2 => AUTO_MAX_M,
        crate::cpu::CpuIsa::Avx512 => SMALL_M,
        _ => 0,
    };
    m <= most && supported(format, m)
}

/// Whether the kernels exist for `format` at `m` on this CPU, whatever the level cap.
fn supported(format: WeightFormat, m: usize) -> bool {
    m >= 1
        && crate::cpu::block32::code_of(format).is_some()
        && crate::cpu::features().has_avx2_kernels()
}

/// Activation rows quantized per 32 elements to int16, reused across calls.
#[derive(Default)]
pub(crate) struct ActsI16 {
    /// int16 values, `[m, k]`.
    pub(crate) q: Vec<i16>,
    /// Each block's scale `dx`, `[m, nbp]`, zero past the row's blocks.
    pub(crate) dx: Vec<f32>,
    /// Each block's f32 sum `Σx`, `[m, nbp]`, zero past the row's blocks.
    pub(crate) sx: Vec<f32>,
    /// Elements per row.
    pub(crate) k: usize,
    /// Blocks per row rounded up to 8 (one ymm of per-block values).
    pub(crate) nbp: usize,
}

impl ActsI16 {
    /// Quantizes the `m` rows of `x` (`k` values each, `k` a multiple of 32).
    pub(crate) fn quantize(&mut self, x: &[f32], m: usize, k: usize) {
        let nb = k / QK;
        self.k = k;
        self.nbp = nb.next_multiple_of(8);
        self.q.resize(m * k, 0);
        self.dx.clear();
        self.dx.resize(m * self.nbp, 0.0);
        self.sx.clear();
        self.sx.resize(m * self.nbp, 0.0);
        for i in 0..m {
            let row = &x[i * k..(i + 1) * k];
            let q = &mut self.q[i * k..(i + 1) * k];
            let dx = &mut self.dx[i * self.nbp..i * self.nbp + nb];
            let sx = &mut self.sx[i * self.nbp..i * self.nbp + nb];
            #[cfg(target_arch = "x86_64")]
            if crate::cpu::features().has_avx2_kernels() {
                // SAFETY: the features were detected; the slices have k, nb, nb values.
                unsafe { avx2::quantize_row(row, q, dx, sx) };
                continue;
            }
            quantize_row(row, q, dx, sx);
        }
    }
}

/// One row of [`ActsI16::quantize`], portable: per 32 values `dx = amax/32767`, `q =
/// round_half_even(x·(32767/amax))` and `sx` the sum in order; a block holding a NaN or
/// an infinity gets a NaN scale, so that it reaches the output.
pub(crate) fn quantize_row(x: &[f32], q: &mut [i16], dx: &mut [f32], sx: &mut [f32]) {
    for (b, blk) in x.chunks_exact(QK).enumerate() {
        let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let nonfinite: f32 = blk.iter().map(|v| v * 0.0).sum();
        let id = if amax != 0.0 { 32767.0 / amax } else { 0.0 };
        dx[b] = amax / 32767.0 + nonfinite;
        sx[b] = blk.iter().sum();
        for (o, v) in q[b * QK..(b + 1) * QK].iter_mut().zip(blk) {
            *o = (v * id).round_ties_even() as i32 as i16;
        }
    }
}

thread_local! {
    /// The calling thread's quantized activations.
    static ACTS: RefCell<ActsI16> = RefCell::new(ActsI16::default());
    /// The calling thread's activations packed for the tiled kernel.
    #[cfg(target_arch = "x86_64")]
    static PACKED: RefCell<avx2_gemm::PackedActs> = RefCell::new(Default::default());
    /// A task's decoded weight panel for the tiled kernel.
    #[cfg(target_arch = "x86_64")]
    static PANEL: RefCell<avx2_gemm::Panel> = RefCell::new(Default::default());
}

// Only the x86 kernels write through it; other targets only build the quantizer.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: tasks write disjoint columns of the outputs (see each use).
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl SendPtr {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the field).
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// `outs[i] = x · ws[i]ᵀ` for every product, all of whose weights take this path at `m`
/// (`supported`), in one pool run over the products' rows; `x` is quantized once.
///
/// Errors: wrong lengths, products of different widths, or a format / `m` without a
/// kernel here ([`KernelError::Shape`]).
///
/// ```
/// use dcpserve_kernels::cpu::int16_matmul::matmul_each;
/// use dcpserve_kernels::{ThreadPool, WeightFormat, WeightMatrix};
/// let pool = ThreadPool::new(1);
/// let w = WeightMatrix::from_f32(1, 32, vec![0.5; 32]).unwrap()
///     .to_format(WeightFormat::Q8_0).unwrap();
/// let mut out = [0.0];
/// if dcpserve_kernels::cpu::features().has_avx2_kernels() {
///     matmul_each(&pool, &[2.0; 32], 1, &mut [(&w, &mut out[..])]).unwrap();
///     assert!((out[0] - 32.0).abs() < 0.01); // Q8_0 stores 0.5 as 127 · f16(0.5/127)
/// }
/// ```
pub fn matmul_each(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    products: &mut [(&WeightMatrix, &mut [f32])],
) -> Result<(), KernelError> {
    let Some((first, _)) = products.first() else {
        return Ok(());
    };
    let k = first.cols();
    check_len("matmul x", m * k, x.len())?;
    for (w, out) in products.iter() {
        if !supported(w.format(), m) || w.cols() != k || k % QK != 0 {
            return Err(KernelError::Shape(format!(
                "int16 matmul of {:?} weights [{}, {}] at m = {m}",
                w.format(),
                w.rows(),
                w.cols()
            )));
        }
        check_len("matmul out", m * w.rows(), out.len())?;
    }
    if k == 0 {
        products.iter_mut().for_each(|(_, out)| out.fill(0.0));
        return Ok(());
    }
    let threads = pool.n_threads();
    let outs: Vec<SendPtr> = products
        .iter_mut()
        .map(|(_, o)| SendPtr(o.as_mut_ptr()))
        .collect();
    let weights: Vec<&WeightMatrix> = products.iter().map(|(w, _)| *w).collect();
    ACTS.with(|a| {
        let mut fresh = ActsI16::default();
        let mut guard = a.try_borrow_mut();
        let acts = match guard.as_mut() {
            Ok(g) => &mut **g,
            Err(_) => &mut fresh,
        };
        acts.quantize(x, m, k);
        if m > SMALL_M {
            #[cfg(target_arch = "x86_64")]
            tiled(pool, acts, m, &weights, &outs);
            return;
        }
        // (product, first column, end column) of every task; the other paths' size.
        let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
        for (i, w) in weights.iter().enumerate() {
            let n = w.rows();
            let rows_per = n.div_ceil(threads * 8).max(16).next_multiple_of(4);
            let mut n0 = 0;
            while n0 < n {
                tasks.push((i, n0, (n0 + rows_per).min(n)));
                n0 += rows_per;
            }
        }
        let acts = &*acts;
        let wide = crate::cpu::use_avx512();
        pool.run(tasks.len(), |t| {
            let (i, n0, n1) = tasks[t];
            let _ = (acts, &outs, &weights, n0, n1, i, wide);
            // SAFETY: `supported` checked AVX2 + FMA + F16C and the format (the AVX-512
            // level only where its features are present); each task writes only columns
            // n0..n1 of product i's `[m, n]` output, whose length was checked; `acts`
            // holds m rows of k values.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                if wide {
                    avx512::task(acts, m, weights[i], outs[i].ptr(), n0, n1)
                } else {
                    avx2::task(acts, m, weights[i], outs[i].ptr(), n0, n1)
                }
            };
        });
    });
    Ok(())
}

/// The products of [`matmul_each`] past [`SMALL_M`] rows on the tiled kernel: tasks of up
/// to 64 activation rows by whole panels of weight rows, about four per thread.
#[cfg(target_arch = "x86_64")]
fn tiled(pool: &ThreadPool, acts: &ActsI16, m: usize, weights: &[&WeightMatrix], outs: &[SendPtr]) {
    use avx2_gemm::{MAX_ROWS, PANEL_ROWS};
    let m_chunks = m.div_ceil(MAX_ROWS);
    // (product, first row, first column, end column) of every task.
    let mut tasks: Vec<(usize, usize, usize, usize)> = Vec::new();
    for (i, w) in weights.iter().enumerate() {
        let n = w.rows();
        let n_panels = n.div_ceil(PANEL_ROWS);
        let n_chunks = (pool.n_threads() * 4).div_ceil(m_chunks).clamp(1, n_panels);
        let cols_per = n_panels.div_ceil(n_chunks) * PANEL_ROWS;
        for mc in 0..m_chunks {
            let mut n0 = 0;
            while n0 < n {
                tasks.push((i, mc * MAX_ROWS, n0, (n0 + cols_per).min(n)));
                n0 += cols_per;
            }
        }
    }
    PACKED.with(|p| {
        let mut fresh = avx2_gemm::PackedActs::default();
        let mut guard = p.try_borrow_mut();
        let packed = match guard.as_mut() {
            Ok(g) => &mut **g,
            Err(_) => &mut fresh,
        };
        packed.pack(acts, m);
        let packed = &*packed;
        pool.run(tasks.len(), |t| {
            let (i, m0, n0, n1) = tasks[t];
            let m1 = (m0 + MAX_ROWS).min(m);
            PANEL.with(|panel| {
                // SAFETY: `supported` checked AVX2 + FMA + F16C and the format; each task
                // writes only rows m0..m1 (m0 a multiple of 64) of columns n0..n1 of
                // product i's `[m, n]` output, whose length was checked; `packed` holds
                // m rows of k values.
                unsafe {
                    avx2_gemm::task(
                        packed,
                        m0,
                        m1,
                        weights[i],
                        outs[i].ptr(),
                        n0,
                        n1,
                        &mut panel.borrow_mut(),
                    )
                };
            });
        });
    });
}

/// One product through [`matmul_each`].
///
/// ```
/// use dcpserve_kernels::cpu::int16_matmul::matmul;
/// use dcpserve_kernels::{ThreadPool, WeightFormat, WeightMatrix};
/// let pool = ThreadPool::new(1);
/// let w = WeightMatrix::from_f32(2, 32, vec![0.25; 64]).unwrap()
///     .to_format(WeightFormat::Q4_1).unwrap();
/// let mut out = [0.0; 2];
/// if dcpserve_kernels::cpu::features().has_avx2_kernels() {
///     matmul(&pool, &[1.0; 32], 1, &w, &mut out).unwrap();
///     assert!((out[0] - 8.0).abs() < 1e-3);
/// }
/// ```
pub fn matmul(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    w: &WeightMatrix,
    out: &mut [f32],
) -> Result<(), KernelError> {
    matmul_each(pool, x, m, &mut [(w, out)])
}

#[cfg(test)]
mod tests;
