//! [`DType`]: the one element type of weights and buffers, for every backend.
//!
//! Before this enum, the same six values were spelled `WeightFormat` (kernels),
//! `TensorDType` (model loaders) and `Precision`-like enums elsewhere. `WeightFormat` is
//! now an alias of `DType`. Two settings that are *not* element types stay separate:
//! the user's `--dtype auto|float32|bfloat16` (`dcpserve_config::DType`) and the
//! model's loading policy (`WeightPrecision`), which both *choose* a `DType` per tensor
//! (`auto` keeps quantized tensors as they are), and the matmul accumulation mode
//! ([`crate::Precision`]).

use std::fmt;

/// Elements per block of the GGML quantized formats.
pub const QK: usize = 32;

/// Elements per super-block of the GGML K-quant formats (and IQ4_XS).
pub const QK_K: usize = 256;

/// Element type of a tensor or buffer.
///
/// Quantized types use GGML's block layouts along a row, 32 elements per block:
/// * `Q8_0`: f16 `d` + 32 × i8 (34 bytes), value `q·d`.
/// * `Q4_0`: f16 `d` + 16 bytes; element `j` (0..16) is the low nibble of byte `j`,
///   element `j+16` the high nibble; value `(q−8)·d` (18 bytes).
/// * `Q4_1`: f16 `d`, f16 `m` + 16 bytes of nibbles as `Q4_0`; value `q·d + m` (20 bytes).
///
/// The 5-bit, K-quant and IQ4 layouts (`Q5_0` … `IQ4_XS`) are described with the CPU
/// backend's decoders (`cpu::kquants`); K-quants and `IQ4_XS` have 256-element super-blocks.
///
/// ```
/// use dcpserve_kernels::DType;
/// assert_eq!(DType::Q4_1.block_elems(), 32);
/// assert_eq!(DType::Q4_1.bytes_for(64), 40);
/// assert_eq!(DType::BF16.storage_bytes(&[3, 4]), Some(24));
/// assert_eq!(DType::Q8_0.storage_bytes(&[2, 40]), None); // rows not whole blocks
/// ```
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision, little endian.
    F32,
    /// IEEE half precision, little endian.
    F16,
    /// bfloat16, little endian.
    BF16,
    /// GGML Q8_0.
    Q8_0,
    /// GGML Q4_0.
    Q4_0,
    /// GGML Q4_1.
    Q4_1,
    /// GGML Q5_0: 32 elements in 22 bytes.
    Q5_0,
    /// GGML Q5_1: 32 elements in 24 bytes.
    Q5_1,
    /// GGML Q2_K: 256 elements in 84 bytes.
    Q2_K,
    /// GGML Q3_K: 256 elements in 110 bytes.
    Q3_K,
    /// GGML Q4_K: 256 elements in 144 bytes.
    Q4_K,
    /// GGML Q5_K: 256 elements in 176 bytes.
    Q5_K,
    /// GGML Q6_K: 256 elements in 210 bytes.
    Q6_K,
    /// GGML Q8_K: 256 elements in 292 bytes (f32 scale, block sums).
    Q8_K,
    /// GGML IQ4_NL: 32 elements in 18 bytes (non-linear 4-bit codebook).
    IQ4_NL,
    /// GGML IQ4_XS: 256 elements in 136 bytes.
    IQ4_XS,
}

impl DType {
    /// Elements per block (1 for the float types).
    pub const fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4_NL => {
                QK
            }
            DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::Q8_K
            | DType::IQ4_XS => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::Q8_K => 292,
            DType::IQ4_NL => 18,
            DType::IQ4_XS => 136,
        }
    }

    /// The block-quantized types added for the GGUF files in the wild (5-bit, K-quants,
    /// IQ4), decoded by the CPU backend's `cpu::kquants`.
    pub const EXTRA_QUANTS: [DType; 10] = [
        DType::Q5_0,
        DType::Q5_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
    ];

    /// True for the block-quantized types.
    pub const fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// True for the plain floating-point types.
    pub const fn is_float(self) -> bool {
        !self.is_quantized()
    }

    /// Bytes needed for `n_elems` elements (whole blocks; quantized types need
    /// `n_elems % 32 == 0` to be meaningful, see [`check_elems`](Self::check_elems), defined next to
    /// [`KernelError`](crate::KernelError) so that this module stays a leaf).
    pub const fn bytes_for(self, n_elems: usize) -> usize {
        n_elems.div_ceil(self.block_elems()) * self.block_bytes()
    }

    /// Bytes of a row-major tensor of this shape (outermost first), or `None` when the
    /// size overflows or the rows are not a whole number of blocks (quantized types are
    /// blocked along the innermost dimension).
    pub fn storage_bytes(self, shape: &[usize]) -> Option<usize> {
        let inner = shape.last().copied().unwrap_or(1);
        if !inner.is_multiple_of(self.block_elems()) {
            return None;
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
        (numel / self.block_elems()).checked_mul(self.block_bytes())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_ggml_layouts() {
        let all = [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
        ];
        let per_64: Vec<usize> = all.iter().map(|d| d.bytes_for(64)).collect();
        assert_eq!(per_64, [256, 128, 128, 68, 36, 40]);
        for d in all {
            assert_eq!(d.storage_bytes(&[2, 64]), Some(2 * d.bytes_for(64)));
            assert_eq!(d.is_float(), d.block_elems() == 1);
        }
        assert!(DType::Q4_0.check_elems(33).is_err());
        assert!(DType::F16.check_elems(33).is_ok());
        assert_eq!(DType::F32.storage_bytes(&[usize::MAX, 2]), None);
        assert_eq!(DType::Q4_1.to_string(), "Q4_1");
        // ggml's type_size / blck_size for the 5-bit, K-quant and IQ4 types.
        let sizes: Vec<(usize, usize)> = DType::EXTRA_QUANTS
            .iter()
            .map(|d| (d.block_bytes(), d.block_elems()))
            .collect();
        assert_eq!(
            sizes,
            [
                (22, 32),
                (24, 32),
                (84, 256),
                (110, 256),
                (144, 256),
                (176, 256),
                (210, 256),
                (292, 256),
                (18, 32),
                (136, 256)
            ]
        );
    }
}
