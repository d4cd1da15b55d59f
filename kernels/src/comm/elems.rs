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

/// An all-to-all's input and output must be the same multiple of the group size `n`.
pub(crate) fn check_all_to_all(n: usize, input: usize, out: usize) -> Result<(), KernelError> {
    if input != out || !input.is_multiple_of(n) {
        return Err(KernelError::Shape(format!(
            "all_to_all: input ({input}) and output ({out}) must be the same multiple of the group size ({n})"
        )));
    }
    Ok(())
}

/// The element-typed methods of [`super::Communicator`] for an implementation whose
/// collectives are generic over [`CommElem`] (`all_gather_t`, `all_gather_varying_t`,
/// `all_reduce_sum_t`, `reduce_scatter_sum_t`, `broadcast_t`, `all_to_all_t`): each
/// dispatches on the element type, and a call mixing f32 and bf16 fails.
macro_rules! communicator_elems_by_type {
    () => {
        fn all_gather_elems(
            &self,
            input: $crate::comm::Elems<'_>,
            out: $crate::comm::ElemsMut<'_>,
        ) -> Result<(), $crate::error::KernelError> {
            $crate::comm::elems::typed_pair!("all_gather", input, out, |i, o| self
                .all_gather_t(i, o))
        }

        fn all_gather_varying_elems(
            &self,
            input: $crate::comm::Elems<'_>,
            counts: &[usize],
            out: $crate::comm::ElemsMut<'_>,
        ) -> Result<(), $crate::error::KernelError> {
            $crate::comm::elems::typed_pair!("all_gather_varying", input, out, |i, o| self
                .all_gather_varying_t(i, counts, o))
        }

        fn all_reduce_sum_elems(
            &self,
            data: $crate::comm::ElemsMut<'_>,
        ) -> Result<(), $crate::error::KernelError> {
            match data {
                $crate::comm::ElemsMut::F32(d) => self.all_reduce_sum_t(d),
                $crate::comm::ElemsMut::Bf16(d) => self.all_reduce_sum_t(d),
            }
        }

        fn reduce_scatter_sum_elems(
            &self,
            input: $crate::comm::Elems<'_>,
            out: $crate::comm::ElemsMut<'_>,
        ) -> Result<(), $crate::error::KernelError> {
            $crate::comm::elems::typed_pair!("reduce_scatter", input, out, |i, o| self
                .reduce_scatter_sum_t(i, o))
        }

        fn broadcast_elems(
            &self,
            data: $crate::comm::ElemsMut<'_>,
            root: usize,
        ) -> Result<(), $crate::error::KernelError> {
            match data {
                $crate::comm::ElemsMut::F32(d) => self.broadcast_t(d, root),
                $crate::comm::ElemsMut::Bf16(d) => self.broadcast_t(d, root),
            }
        }

        fn all_to_all_elems(
            &self,
            input: $crate::comm::Elems<'_>,
            out: $crate::comm::ElemsMut<'_>,
        ) -> Result<(), $crate::error::KernelError> {
            $crate::comm::elems::typed_pair!("all_to_all", input, out, |i, o| self
                .all_to_all_t(i, o))
        }
    };
}

/// Runs `$body` with `$i`/`$o` bound to the typed slices of an (Elems, ElemsMut) pair of
/// one element type, or fails for a mixed pair.
macro_rules! typed_pair {
    ($what:expr, $input:expr, $out:expr, |$i:ident, $o:ident| $body:expr) => {
        match ($input, $out) {
            ($crate::comm::Elems::F32($i), $crate::comm::ElemsMut::F32($o)) => $body,
            ($crate::comm::Elems::Bf16($i), $crate::comm::ElemsMut::Bf16($o)) => $body,
            (i, o) => Err($crate::comm::elems::dtype_mismatch(
                $what,
                i.dtype(),
                o.dtype(),
            )),
        }
    };
}

pub(crate) use communicator_elems_by_type;
pub(crate) use typed_pair;
