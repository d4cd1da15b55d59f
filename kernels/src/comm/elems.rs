//! The element types collectives move: f32 and bf16 (of the crate's one [`DType`]),
//! behind one object-safe trait.

use half::bf16;

pub use crate::dtype::DType;
use crate::error::KernelError;

/// A read-only buffer of one of the element types collectives move.
#[derive(Debug, Clone, Copy)]
pub enum Elems<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

/// A writable buffer of one of the element types collectives move.
#[derive(Debug)]
pub enum ElemsMut<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
}

impl Elems<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Elems::F32(x) => x.len(),
            Elems::Bf16(x) => x.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Elems::F32(_) => DType::F32,
            Elems::Bf16(_) => DType::BF16,
        }
    }
}

impl ElemsMut<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ElemsMut::F32(x) => x.len(),
            ElemsMut::Bf16(x) => x.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            ElemsMut::F32(_) => DType::F32,
            ElemsMut::Bf16(_) => DType::BF16,
        }
    }
}

impl<'a> From<&'a [f32]> for Elems<'a> {
    fn from(x: &'a [f32]) -> Self {
        Elems::F32(x)
    }
}
impl<'a> From<&'a [bf16]> for Elems<'a> {
    fn from(x: &'a [bf16]) -> Self {
        Elems::Bf16(x)
    }
}
impl<'a> From<&'a mut [f32]> for ElemsMut<'a> {
    fn from(x: &'a mut [f32]) -> Self {
        ElemsMut::F32(x)
    }
}
impl<'a> From<&'a mut [bf16]> for ElemsMut<'a> {
    fn from(x: &'a mut [bf16]) -> Self {
        ElemsMut::Bf16(x)
    }
}

/// An element type collectives can move and sum: lets an implementation write each
/// collective once for every element type.
pub trait CommElem: Copy + Default + Send + Sync + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// `a + b` (bf16 sums are rounded back to bf16 after each addition, as NCCL's are).
    fn add(a: Self, b: Self) -> Self;
}

impl CommElem for f32 {
    const DTYPE: DType = DType::F32;
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
}

impl CommElem for bf16 {
    const DTYPE: DType = DType::BF16;
    fn add(a: Self, b: Self) -> Self {
        bf16::from_f32(a.to_f32() + b.to_f32())
    }
}

/// The error for an input and output of different element types.
pub(crate) fn dtype_mismatch(what: &str, a: DType, b: DType) -> KernelError {
    KernelError::Shape(format!(
        "{what}: input is {a:?} but output is {b:?}; a collective moves one element type"
    ))
}
