//! The arithmetic of the collectives: element types and the reductions over ranks.

use crate::cublas::gemm::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// `ncclDataType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
    Bf16,
}

impl Dtype {
    pub fn from_nccl(v: u32) -> Option<Dtype> {
        Some(match v {
            0 => Dtype::I8,
            1 => Dtype::U8,
            2 => Dtype::I32,
            3 => Dtype::U32,
            4 => Dtype::I64,
            5 => Dtype::U64,
            6 => Dtype::F16,
            7 => Dtype::F32,
            8 => Dtype::F64,
            9 => Dtype::Bf16,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::I8 | Dtype::U8 => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        }
    }
}

/// `ncclRedOp_t` (the built-in ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl RedOp {
    pub fn from_nccl(v: u32) -> Option<RedOp> {
        Some(match v {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Max,
            3 => RedOp::Min,
            4 => RedOp::Avg,
            _ => return None,
        })
    }
}

/// Element `i` as f64 (exact for every type but 64-bit integers beyond 2^53).
///
/// # Safety
/// `p` holds at least `i + 1` elements of `t`.
unsafe fn load(p: *const u8, t: Dtype, i: usize) -> f64 {
    match t {
        Dtype::I8 => p.cast::<i8>().add(i).read() as f64,
        Dtype::U8 => p.add(i).read() as f64,
        Dtype::I32 => p.cast::<i32>().add(i).read_unaligned() as f64,
        Dtype::U32 => p.cast::<u32>().add(i).read_unaligned() as f64,
        Dtype::I64 => p.cast::<i64>().add(i).read_unaligned() as f64,
        Dtype::U64 => p.cast::<u64>().add(i).read_unaligned() as f64,
        Dtype::F16 => f16_to_f32(p.cast::<u16>().add(i).read_unaligned()) as f64,
        Dtype::Bf16 => bf16_to_f32(p.cast::<u16>().add(i).read_unaligned()) as f64,
        Dtype::F32 => p.cast::<f32>().add(i).read_unaligned() as f64,
        Dtype::F64 => p.cast::<f64>().add(i).read_unaligned(),
    }
}

/// # Safety
/// `p` holds at least `i + 1` elements of `t`.
unsafe fn store(p: *mut u8, t: Dtype, i: usize, v: f64) {
    match t {
        Dtype::I8 => p.cast::<i8>().add(i).write(v as i8),
        Dtype::U8 => p.add(i).write(v as u8),
        Dtype::I32 => p.cast::<i32>().add(i).write_unaligned(v as i32),
        Dtype::U32 => p.cast::<u32>().add(i).write_unaligned(v as u32),
        Dtype::I64 => p.cast::<i64>().add(i).write_unaligned(v as i64),
        Dtype::U64 => p.cast::<u64>().add(i).write_unaligned(v as u64),
        Dtype::F16 => p.cast::<u16>().add(i).write_unaligned(f32_to_f16(v as f32)),
        Dtype::Bf16 => p
            .cast::<u16>()
            .add(i)
            .write_unaligned(f32_to_bf16(v as f32)),
        Dtype::F32 => p.cast::<f32>().add(i).write_unaligned(v as f32),
        Dtype::F64 => p.cast::<f64>().add(i).write_unaligned(v),
    }
}

/// Reduces `count` elements from each of `inputs` (in rank order) into a fresh buffer.
///
/// Floating types accumulate in f32 (f64 for f64) in rank order and are rounded to the
/// element type once; NCCL's ring rounds after each step, so bf16 and f16 sums over more
/// than two ranks may differ from it by an ulp.
///
/// # Safety
/// Each input holds `count` elements of `t`.
pub unsafe fn reduce(inputs: &[*const u8], t: Dtype, op: RedOp, count: usize) -> Vec<u8> {
    let mut out = vec![0u8; count * t.size()];
    let narrow = matches!(t, Dtype::F16 | Dtype::Bf16 | Dtype::F32);
    for i in 0..count {
        let mut acc = load(inputs[0], t, i);
        for p in &inputs[1..] {
            let v = load(*p, t, i);
            acc = match op {
                RedOp::Sum | RedOp::Avg => acc + v,
                RedOp::Prod => acc * v,
                RedOp::Max => acc.max(v),
                RedOp::Min => acc.min(v),
            };
            if narrow {
                acc = acc as f32 as f64;
            }
        }
        if op == RedOp::Avg {
            acc /= inputs.len() as f64;
        }
        store(out.as_mut_ptr(), t, i, acc);
    }
    out
}
