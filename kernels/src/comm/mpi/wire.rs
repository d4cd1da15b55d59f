//! Element types as MPI moves them, and the f32 their sums are computed in.

use half::bf16;
use mpi::datatype::Equivalence;

use crate::comm::elems::{CommElem, Elems, ElemsMut};

/// An element type as MPI moves it (bf16 as its bits: MPI has no bf16 type), and its
/// conversions to and from the f32 that sums are done in.
pub(super) trait WireElem: CommElem {
    type Wire: Equivalence;
    fn wire(x: &[Self]) -> &[Self::Wire];
    fn wire_mut(x: &mut [Self]) -> &mut [Self::Wire];
    fn elems(x: &[Self]) -> Elems<'_>;
    fn elems_mut(x: &mut [Self]) -> ElemsMut<'_>;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl WireElem for f32 {
    type Wire = f32;
    fn wire(x: &[Self]) -> &[f32] {
        x
    }
    fn wire_mut(x: &mut [Self]) -> &mut [f32] {
        x
    }
    fn elems(x: &[Self]) -> Elems<'_> {
        Elems::F32(x)
    }
    fn elems_mut(x: &mut [Self]) -> ElemsMut<'_> {
        ElemsMut::F32(x)
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl WireElem for bf16 {
    type Wire = u16;
    fn wire(x: &[Self]) -> &[u16] {
        // SAFETY: bf16 is `repr(transparent)` over its u16 bits.
        unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u16, x.len()) }
    }
    fn wire_mut(x: &mut [Self]) -> &mut [u16] {
        // SAFETY: as above; every u16 is a valid bf16.
        unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut u16, x.len()) }
    }
    fn elems(x: &[Self]) -> Elems<'_> {
        Elems::Bf16(x)
    }
    fn elems_mut(x: &mut [Self]) -> ElemsMut<'_> {
        ElemsMut::Bf16(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}
