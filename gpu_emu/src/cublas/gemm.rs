//! The GEMM arithmetic: `C = alpha * op(A) * op(B) + beta * C`, column-major as in BLAS,
//! inputs f32 / bf16 / f16 widened to f32, products accumulated in f32 (what
//! `CUBLAS_COMPUTE_32F` asks for; the summation order differs from cuBLAS's, so results
//! agree within a tolerance, not bit for bit).

/// `cudaDataType` values the emulator handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    F16,
    Bf16,
}

impl Elem {
    pub fn from_cuda(t: u32) -> Option<Elem> {
        match t {
            0 => Some(Elem::F32),
            2 => Some(Elem::F16),
            14 => Some(Elem::Bf16),
            _ => None,
        }
    }

    pub fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F16 | Elem::Bf16 => 2,
        }
    }
}

pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Round to nearest even, NaN kept a NaN.
pub fn f32_to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value = m * 2^-24.
            let v = m as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Round to nearest even, with overflow to infinity and subnormals.
pub fn f32_to_f16(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    if v.is_nan() {
        return sign | 0x7e00;
    }
    let a = v.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    if a < f32::from_bits(0x3880_0000) {
        // Below the smallest normal (2^-14): a multiple of 2^-24, rounded to even.
        let q = a / f32::from_bits(0x3380_0000);
        return sign | q.round_ties_even() as u16;
    }
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mant = bits & 0x7f_ffff;
    let mut h = ((exp as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}

/// Element `i` of a buffer of type `t`, widened.
///
/// # Safety
/// `base` holds at least `i + 1` elements of `t`.
unsafe fn load(base: *const u8, t: Elem, i: usize) -> f32 {
    match t {
        Elem::F32 => base.cast::<f32>().add(i).read_unaligned(),
        Elem::Bf16 => bf16_to_f32(base.cast::<u16>().add(i).read_unaligned()),
        Elem::F16 => f16_to_f32(base.cast::<u16>().add(i).read_unaligned()),
    }
}

/// # Safety
/// `base` holds at least `i + 1` elements of `t`.
unsafe fn store(base: *mut u8, t: Elem, i: usize, v: f32) {
    match t {
        Elem::F32 => base.cast::<f32>().add(i).write_unaligned(v),
        Elem::Bf16 => base.cast::<u16>().add(i).write_unaligned(f32_to_bf16(v)),
        Elem::F16 => base.cast::<u16>().add(i).write_unaligned(f32_to_f16(v)),
    }
}

/// Widens `out.len()` elements starting at element `first`, `step` elements apart.
///
/// # Safety
/// `base` holds every element read.
unsafe fn widen(base: *const u8, t: Elem, first: usize, step: usize, out: &mut [f32]) {
    if step == 1 {
        // Contiguous (the common case): per-type loops the compiler vectorizes.
        match t {
            Elem::F32 => {
                let src = std::slice::from_raw_parts(base.cast::<f32>().add(first), out.len());
                out.copy_from_slice(src);
            }
            Elem::Bf16 => {
                let src = std::slice::from_raw_parts(base.cast::<u16>().add(first), out.len());
                for (o, b) in out.iter_mut().zip(src) {
                    *o = f32::from_bits((*b as u32) << 16);
                }
            }
            Elem::F16 => {
                let src = std::slice::from_raw_parts(base.cast::<u16>().add(first), out.len());
                for (o, h) in out.iter_mut().zip(src) {
                    *o = f16_to_f32(*h);
                }
            }
        }
        return;
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = load(base, t, first + j * step);
    }
}

/// One operand: host address, type, leading dimension, and whether it is transposed.
#[derive(Debug, Clone, Copy)]
pub struct Operand {
    pub ptr: usize,
    pub elem: Elem,
    pub ld: usize,
    pub trans: bool,
}

/// A GEMM's shape and scalars.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub beta: f32,
}

/// Rows of op(A) converted per block (bounds the temporary to 64 * k floats).
const ROW_BLOCK: usize = 64;

/// Computes one GEMM on host buffers.
///
/// # Safety
/// Each operand's buffer holds the extent its shape and leading dimension imply.
pub unsafe fn gemm(s: Shape, a: Operand, b: Operand, c: Operand) {
    let (m, n, k) = (s.m, s.n, s.k);
    if m == 0 || n == 0 {
        return;
    }
    // op(B) by columns: column j is k contiguous floats.
    let mut bcols = vec![0f32; n * k];
    for j in 0..n {
        let (first, step) = if b.trans { (j, b.ld) } else { (j * b.ld, 1) };
        widen(
            b.ptr as *const u8,
            b.elem,
            first,
            step,
            &mut bcols[j * k..(j + 1) * k],
        );
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |p| p.get())
        .min(8);
    let blocks: Vec<usize> = (0..m).step_by(ROW_BLOCK).collect();
    let per = blocks
        .len()
        .div_ceil(if m * n * k > 1 << 20 { threads } else { 1 });
    std::thread::scope(|scope| {
        for chunk in blocks.chunks(per.max(1)) {
            let bcols = &bcols;
            scope.spawn(move || {
                let mut arows = vec![0f32; ROW_BLOCK * k];
                for &i0 in chunk {
                    let rows = ROW_BLOCK.min(m - i0);
                    for r in 0..rows {
                        let i = i0 + r;
                        let (first, step) = if a.trans { (i * a.ld, 1) } else { (i, a.ld) };
                        let row = &mut arows[r * k..(r + 1) * k];
                        // SAFETY: within A's extent (caller's contract).
                        unsafe { widen(a.ptr as *const u8, a.elem, first, step, row) };
                    }
                    for j in 0..n {
                        let bj = &bcols[j * k..(j + 1) * k];
                        for r in 0..rows {
                            let ar = &arows[r * k..(r + 1) * k];
                            let dot = dot(ar, bj);
                            let ci = i0 + r + j * c.ld;
                            // beta == 0: C is not read (it may hold NaN), as in BLAS.
                            let prev = if s.beta == 0.0 {
                                0.0
                            } else {
                                // SAFETY: within C's extent.
                                s.beta * unsafe { load(c.ptr as *const u8, c.elem, ci) }
                            };
                            // SAFETY: within C's extent; rows of C are disjoint per thread.
                            unsafe { store(c.ptr as *mut u8, c.elem, ci, s.alpha * dot + prev) };
                        }
                    }
                }
            });
        }
    });
}

/// A dot product in f32 with eight partial sums, with AVX2 where the CPU has it.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked above).
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_portable(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_portable(a, b)
}

#[inline(always)]
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for t in 0..8 {
            acc[t] += x[t] * y[t];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}
