//! Several small-`m` products of one input in one parallel region: the q/k/v and
//! gate/up projections of a decode step read the same normed activations, and one
//! pool dispatch for all their rows costs one barrier instead of three or two (decode
//! calls the pool a few hundred times per token).

use super::{small_m_task, SyncPtr, SMALL_M};
use crate::error::{check_len, KernelError};
use crate::pool::ThreadPool;
use crate::weights::WeightMatrix;

/// `outs[i] = x · ws[i]ᵀ` for `m <= SMALL_M` rows of `x`, every product's rows split
/// into tasks of one pool run. Returns `false` (and does nothing) when `m` is larger:
/// the caller then runs the blocked path product by product.
pub(crate) fn matmul_each_small(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    products: &mut [(&WeightMatrix, &mut [f32])],
    isa: crate::cpu::CpuIsa,
) -> Result<bool, KernelError> {
    if m == 0 || m > SMALL_M {
        return Ok(m == 0);
    }
    let threads = pool.n_threads();
    // (product, first row, end row) of every task.
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    let mut outs = Vec::with_capacity(products.len());
    let mut weights = Vec::with_capacity(products.len());
    for (i, (w, out)) in products.iter_mut().enumerate() {
        let w: &WeightMatrix = w;
        weights.push(w);
        let (n, k) = (w.rows(), w.cols());
        check_len("matmul x", m * k, x.len())?;
        check_len("matmul out", m * n, out.len())?;
        if k == 0 {
            out.fill(0.0);
        }
        outs.push(SyncPtr(out.as_mut_ptr()));
        if n == 0 || k == 0 {
            continue;
        }
        // The same task size as one product alone (see `matmul_impl`).
        let rows_per = n.div_ceil(threads * 8).max(16).next_multiple_of(4);
        let mut n0 = 0;
        while n0 < n {
            tasks.push((i, n0, (n0 + rows_per).min(n)));
            n0 += rows_per;
        }
    }
    pool.run(tasks.len(), |t| {
        let (i, n0, n1) = tasks[t];
        // SAFETY: each task writes only columns n0..n1 of product i's output, whose
        // length was checked above.
        unsafe { small_m_task(x, m, weights[i], outs[i], n0, n1, isa) };
    });
    Ok(true)
}

#[cfg(test)]
mod tests {
    use crate::backend::DenseOps;
    use crate::backend::Precision;
    use crate::cpu::CpuBackend;
    use crate::dtype::DType;
    use crate::weights::WeightMatrix;

    /// `matmul_each` gives the bits of one `matmul` per product, for decode-sized `m`
    /// (one parallel region) and larger `m` (product by product), mixed formats.
    #[test]
    fn products_together_equal_products_one_by_one() {
        let dev = CpuBackend::new(2);
        let k = 96;
        let ws: Vec<WeightMatrix> = [(40, DType::Q4_1), (17, DType::Q8_0), (64, DType::F32)]
            .iter()
            .enumerate()
            .map(|(i, &(n, f))| {
                let v = (0..n * k)
                    .map(|j| ((j * 31 + i * 7) % 97) as f32 / 48.0 - 1.0)
                    .collect();
                WeightMatrix::from_f32(n, k, v)
                    .unwrap()
                    .to_format(f)
                    .unwrap()
            })
            .collect();
        for m in [1, 3, 9] {
            let x: Vec<f32> = (0..m * k)
                .map(|j| ((j * 13) % 29) as f32 / 14.0 - 1.0)
                .collect();
            let mut one: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; m * w.rows()]).collect();
            for (w, o) in ws.iter().zip(one.iter_mut()) {
                dev.matmul(&x, m, w, o, Precision::Exact).unwrap();
            }
            let mut all: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; m * w.rows()]).collect();
            let products = ws
                .iter()
                .zip(all.iter_mut())
                .map(|(w, o)| (w, o.as_mut_slice()))
                .collect();
            dev.matmul_each(&x, m, products, Precision::Exact).unwrap();
            assert_eq!(one, all, "m={m}");
        }
        let mut short = [0.0; 3];
        let err = dev.matmul_each(
            &[0.0; 96],
            1,
            vec![(&ws[0], &mut short[..])],
            Precision::Exact,
        );
        assert!(err.is_err(), "a short output is refused");
    }
}
