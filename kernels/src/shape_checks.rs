//! Argument checks that every backend makes the same way, so a bad shape gets the same
//! error from the CPU and the GPU.

use crate::backend::{PagedAttentionParams, Strided};
use crate::error::{check_len, KernelError};
use crate::kv_dtype::KvCacheDType;
use std::ops::Range;

/// Checks that `rows` rows of `width` values, `stride` apart and starting `offset`
/// into each row, fit in `len` values.
pub(crate) fn check_strided(
    what: &'static str,
    (stride, offset): (usize, usize),
    rows: usize,
    width: usize,
    len: usize,
) -> Result<(), KernelError> {
    if rows == 0 || width == 0 {
        return Ok(());
    }
    if offset + width > stride {
        return Err(KernelError::Shape(format!(
            "{what}: {width} values at offset {offset} overrun rows of {stride}"
        )));
    }
    let end = (rows - 1) * stride + offset + width;
    if end > len {
        return Err(KernelError::OutOfRange {
            what,
            value: end,
            limit: len + 1,
        });
    }
    Ok(())
}

/// Checks both sides of a strided copy (see `DenseOps::copy_strided`).
pub(crate) fn check_strided_copy(
    (src_len, s): (usize, Strided),
    (dst_len, d): (usize, Strided),
    rows: usize,
    width: usize,
) -> Result<(), KernelError> {
    let src = "strided copy source";
    check_strided(src, (s.stride, s.offset), rows, width, src_len)?;
    let dst = "strided copy destination";
    check_strided(dst, (d.stride, d.offset), rows, width, dst_len)
}

/// Checks a `write_kv` call: `k` and `v` (`(k_len, v_len)`) hold one row of
/// `n_kv_heads · head_dim` per slot, the caches (`(k_cache_len, v_cache_len)`) are
/// equally long, and every slot but `usize::MAX` (skip) is a slot of the cache. All
/// checked before anything is stored. Returns the row width.
pub(crate) fn check_write_kv(
    (k_cache_len, v_cache_len): (usize, usize),
    n_kv_heads: usize,
    head_dim: usize,
    slots: &[usize],
    (k_len, v_len): (usize, usize),
) -> Result<usize, KernelError> {
    let row = n_kv_heads * head_dim;
    check_len("write_kv k", slots.len() * row, k_len)?;
    check_len("write_kv v", slots.len() * row, v_len)?;
    check_len("write_kv v_cache", k_cache_len, v_cache_len)?;
    if row == 0 {
        return Ok(0);
    }
    let n_slots = k_cache_len / row;
    if let Some(&bad) = slots.iter().find(|&&s| s != usize::MAX && s >= n_slots) {
        return Err(KernelError::OutOfRange {
            what: "kv slot",
            value: bad,
            limit: n_slots,
        });
    }
    Ok(row)
}

/// An FP8 cache keeps one scale per row of its `row_len` values (`fp8_row_len`; `None`
/// for the other types): an op that reads or writes one head's (or one latent) row of
/// `width` values at a time needs the cache's rows to be exactly those rows.
pub(crate) fn check_fp8_row(
    what: &str,
    fp8_row_len: Option<usize>,
    width: usize,
) -> Result<(), KernelError> {
    match fp8_row_len {
        Some(r) if r != width => Err(KernelError::Shape(format!(
            "{what}: the FP8 cache is scaled per row of {r} values, but the op's rows have {width}"
        ))),
        _ => Ok(()),
    }
}

/// A store of rows of `width` values into an FP8 cache scaled per `fp8_row_len` values
/// (`None`: not FP8) must write whole scaled rows: `width` a multiple of them.
pub(crate) fn check_fp8_store(
    what: &str,
    fp8_row_len: Option<usize>,
    width: usize,
) -> Result<(), KernelError> {
    match fp8_row_len {
        Some(r) if r == 0 || !width.is_multiple_of(r) => Err(KernelError::Shape(format!(
            "{what}: rows of {width} values do not cover whole FP8 rows of {r} (one scale per row)"
        ))),
        _ => Ok(()),
    }
}

/// An FP8 buffer of `len` values in rows of `row_len`.
pub(crate) fn check_fp8_rows(len: usize, row_len: usize) -> Result<(), KernelError> {
    if row_len == 0 || !len.is_multiple_of(row_len) {
        return Err(KernelError::Shape(format!(
            "an FP8 KV cache of {len} values cannot be split into rows of {row_len} (one scale per row)"
        )));
    }
    Ok(())
}

/// `range` starts and ends on row boundaries of `row_len` (FP8 views and stores).
pub(crate) fn check_row_aligned(
    what: &str,
    range: &Range<usize>,
    row_len: usize,
) -> Result<(), KernelError> {
    if row_len == 0 || !range.start.is_multiple_of(row_len) || !range.end.is_multiple_of(row_len) {
        return Err(KernelError::Shape(format!(
            "{what} {range:?} does not cover whole FP8 rows of {row_len} values (one scale per row)"
        )));
    }
    Ok(())
}

/// Checks a paged GQA attention call: head counts, the lengths of `q`, `out` and `lse`
/// (`q_out_lse`), the K and V caches (`(elements, dtype, FP8 row length)` each: FP8
/// caches must be scaled per `head_dim` row) and every token's block table.
pub(crate) fn check_paged_attention(
    p: &PagedAttentionParams<'_>,
    (q_len, out_len, lse_len): (usize, usize, usize),
    (k_len, k_dtype, k_rows): (usize, KvCacheDType, Option<usize>),
    (v_len, v_dtype, v_rows): (usize, KvCacheDType, Option<usize>),
) -> Result<(), KernelError> {
    let (nq, nkv, hd) = (p.n_q_heads, p.n_kv_heads, p.head_dim);
    if nkv == 0 || nq % nkv != 0 || p.batch.block_size == 0 {
        return Err(KernelError::Shape(format!(
            "n_q_heads={nq} must be a multiple of n_kv_heads={nkv} > 0, block_size={} > 0",
            p.batch.block_size
        )));
    }
    let n = p.batch.token_seq.len();
    check_len("attention q", n * nq * hd, q_len)?;
    check_len("attention out", n * nq * hd, out_len)?;
    check_len("attention lse", n * nq, lse_len)?;
    check_len("attention v_cache", k_len, v_len)?;
    if k_dtype != v_dtype {
        return Err(KernelError::Shape(format!(
            "K cache is {k_dtype}, V cache {v_dtype}: both must have one element type"
        )));
    }
    check_fp8_row("attention K cache", k_rows, hd)?;
    check_fp8_row("attention V cache", v_rows, hd)?;
    let row = nkv * hd;
    let n_blocks = if row == 0 {
        0
    } else {
        k_len / (row * p.batch.block_size)
    };
    check_block_tables(
        p.batch.token_seq,
        p.batch.token_kv_len,
        p.batch.block_tables,
        p.batch.block_size,
        n_blocks,
    )
}

/// The width of each token's part of a RoPE input of `len` values for `tokens`
/// positions (which must divide it).
pub(crate) fn rope_token_width(len: usize, tokens: usize) -> Result<usize, KernelError> {
    if tokens == 0 {
        check_len("rope x", 0, len)?;
        return Ok(0);
    }
    if !len.is_multiple_of(tokens) {
        return Err(KernelError::Shape(format!(
            "rope: {len} values are not {tokens} equal tokens"
        )));
    }
    Ok(len / tokens)
}

/// Checks every token's sequence and block table against a cache of `n_blocks` blocks:
/// each sequence's table must cover the longest kv length any of its tokens uses.
pub(crate) fn check_block_tables(
    token_seq: &[u32],
    token_kv_len: &[u32],
    block_tables: &[&[u32]],
    block_size: usize,
    n_blocks: usize,
) -> Result<(), KernelError> {
    check_len(
        "attention token_kv_len",
        token_seq.len(),
        token_kv_len.len(),
    )?;
    // Each sequence's table once, up to the longest kv_len any token uses.
    let mut need = vec![0usize; block_tables.len()];
    for (&s, &l) in token_seq.iter().zip(token_kv_len) {
        let slot = need.get_mut(s as usize).ok_or(KernelError::OutOfRange {
            what: "token_seq",
            value: s as usize,
            limit: block_tables.len(),
        })?;
        *slot = (*slot).max((l as usize).div_ceil(block_size));
    }
    for (bt, &nb) in block_tables.iter().zip(&need) {
        if nb > bt.len() {
            return Err(KernelError::OutOfRange {
                what: "kv_len blocks",
                value: nb,
                limit: bt.len() + 1,
            });
        }
        if let Some(&bad) = bt[..nb].iter().find(|&&id| id as usize >= n_blocks) {
            return Err(KernelError::OutOfRange {
                what: "block id",
                value: bad as usize,
                limit: n_blocks,
            });
        }
    }
    Ok(())
}

/// Checks the shapes of an LSE merge: `(outputs, lses)` partials, `parts` gives each
/// partial's (output, lse) lengths.
pub(crate) fn check_merge(
    (outputs, lses): (usize, usize),
    parts: impl Iterator<Item = (usize, usize)>,
    n_rows: usize,
    head_dim: usize,
    (out_len, lse_len): (usize, usize),
) -> Result<(), KernelError> {
    check_len("merge_partials partial_lse count", outputs, lses)?;
    for (o, l) in parts {
        check_len("merge_partials partial_out", n_rows * head_dim, o)?;
        check_len("merge_partials partial_lse", n_rows, l)?;
    }
    check_len("merge_partials out", n_rows * head_dim, out_len)?;
    check_len("merge_partials lse_out", n_rows, lse_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_tables_must_cover_every_tokens_keys() {
        let (a, b): (&[u32], &[u32]) = (&[0, 1], &[2]);
        assert!(check_block_tables(&[0, 1], &[8, 3], &[a, b], 4, 3).is_ok());
        assert!(check_block_tables(&[1], &[5], &[a, b], 4, 3).is_err());
        assert!(check_block_tables(&[0], &[8], &[a, b], 4, 1).is_err());
        assert!(check_block_tables(&[2], &[1], &[a, b], 4, 3).is_err());
        assert!(check_block_tables(&[0], &[1, 2], &[a], 4, 3).is_err());
    }

    #[test]
    fn strided_rows_and_rope_tokens() {
        assert!(check_strided("s", (8, 2), 3, 6, 24).is_ok());
        assert!(check_strided("s", (8, 3), 3, 6, 100).is_err());
        assert!(check_strided("s", (8, 2), 3, 6, 23).is_err());
        assert_eq!(rope_token_width(12, 3).unwrap(), 4);
        assert!(rope_token_width(13, 3).is_err());
        assert!(rope_token_width(1, 0).is_err());
    }

    #[test]
    fn write_kv_shapes_and_slots() {
        // 2 heads of 4: rows of 8; caches of 3 slots.
        assert_eq!(
            check_write_kv((24, 24), 2, 4, &[2, usize::MAX], (16, 16)).unwrap(),
            8
        );
        assert!(check_write_kv((24, 24), 2, 4, &[2], (16, 8)).is_err());
        assert!(check_write_kv((24, 24), 2, 4, &[2], (8, 16)).is_err());
        assert!(check_write_kv((24, 16), 2, 4, &[2], (8, 8)).is_err());
        // The first bad slot is named, whatever comes before it.
        let e = check_write_kv((24, 24), 2, 4, &[0, 5, 3], (24, 24)).unwrap_err();
        assert_eq!(
            e.to_string(),
            KernelError::OutOfRange {
                what: "kv slot",
                value: 5,
                limit: 3
            }
            .to_string()
        );
        assert_eq!(check_write_kv((24, 24), 0, 4, &[7], (0, 0)).unwrap(), 0);
    }

    #[test]
    fn fp8_rows_must_match_the_ops_rows() {
        assert!(check_fp8_row("a", None, 8).is_ok());
        assert!(check_fp8_row("a", Some(8), 8).is_ok());
        assert!(check_fp8_row("a", Some(4), 8).is_err());
        assert!(check_fp8_store("s", Some(4), 8).is_ok());
        assert!(check_fp8_store("s", Some(8), 12).is_err());
        assert!(check_fp8_store("s", None, 12).is_ok());
    }

    #[test]
    fn merge_shapes() {
        let ok = check_merge((2, 2), [(8, 2), (8, 2)].into_iter(), 2, 4, (8, 2));
        assert!(ok.is_ok());
        assert!(check_merge((2, 1), [(8, 2)].into_iter(), 2, 4, (8, 2)).is_err());
        assert!(check_merge((1, 1), [(7, 2)].into_iter(), 2, 4, (8, 2)).is_err());
        assert!(check_merge((1, 1), [(8, 2)].into_iter(), 2, 4, (8, 3)).is_err());
    }
}
