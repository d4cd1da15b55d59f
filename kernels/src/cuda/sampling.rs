//! [`SamplingOps::sample_rows`](crate::SamplingOps::sample_rows) on the GPU: the kernels of
//! `kernels/sampling.cu` (one block per draw) choose every token and compute the
//! log-probabilities asked for; only those come back, never the logits.
//!
//! Limits (the answer is `None`, and the caller draws that row on the host): rows with
//! NaN or +inf logits, a top-k above [`SORT_CAP`], a top-p nucleus that reaches past
//! the [`SORT_CAP`] most likely tokens (without a top-k that cuts), more than
//! [`MAX_TOP_LOGPROBS`] top log-probabilities. Answers equal the host's draw except
//! when a draw or a top-p cut falls within rounding of a boundary (sums over a whole
//! row are parallel f64 sums there, sequential on the host; exponentials round alike
//! but for a vanishing fraction of inputs).

use cudarc::driver::{CudaSlice, DeviceRepr};

use crate::cuda::device::driver_err;
use crate::cuda::memory::CudaRef;
use crate::cuda::{per_row, CudaBackend};
use crate::error::KernelError;
use crate::row_sampling::{check_draws, RowDraw, RowDrawn};
use crate::step_graph;

/// Threads per block of the sampling kernels (their shared arrays are sized for it).
const SAMPLE_THREADS: u32 = 1024;
/// The most candidates the device sorts for a top-k or top-p draw (`SORT_CAP` in
/// `sampling.cu`).
pub const SORT_CAP: usize = 2048;
/// The most top log-probabilities per token the device computes (one pass over the
/// row each).
pub const MAX_TOP_LOGPROBS: usize = 64;

// Flags and status bits, as `sampling.cu` defines them.
const DRAW_GREEDY: u32 = 1;
const DRAW_ALL: u32 = 2;
const DRAWN_USED: u32 = 1;
const DRAWN_UNSUPPORTED: u32 = 2;

/// The per-draw arrays the sampling kernel reads.
struct DrawMeta {
    rows: Vec<u32>,
    top_k: Vec<u32>,
    flags: Vec<u32>,
    /// `(1 / temperature, top-p, min-p)` per draw, with the host's readings of NaN
    /// (top-p off) and of min-p ≤ 0 or NaN (off) applied.
    fparams: Vec<f32>,
    uniform: Vec<f64>,
}

impl DrawMeta {
    fn of(draws: &[RowDraw<'_>], vocab: usize) -> Result<DrawMeta, KernelError> {
        let mut m = DrawMeta {
            rows: Vec::with_capacity(draws.len()),
            top_k: Vec::with_capacity(draws.len()),
            flags: Vec::with_capacity(draws.len()),
            fparams: Vec::with_capacity(3 * draws.len()),
            uniform: Vec::with_capacity(draws.len()),
        };
        for d in draws {
            let p = d.params;
            let row = u32::try_from(d.row)
                .map_err(|_| KernelError::Shape(format!("sample_rows: row {}", d.row)))?;
            // `support`: top-k 0 is off; one of at least the vocabulary never cuts.
            let top_k = if p.top_k == 0 {
                u32::MAX
            } else {
                u32::try_from(p.top_k).unwrap_or(u32::MAX)
            };
            let top_p = if p.top_p.is_nan() { 1.0 } else { p.top_p };
            let min_p = if p.min_p > 0.0 { p.min_p } else { 0.0 };
            let mut flags = 0;
            if p.is_greedy() {
                flags |= DRAW_GREEDY;
            }
            // `Support::All` (a NaN min-p is not "≤ 0": the host filters then).
            if top_k as usize >= vocab && top_p >= 1.0 && p.min_p <= 0.0 {
                flags |= DRAW_ALL;
            }
            m.rows.push(row);
            m.top_k.push(top_k);
            m.flags.push(flags);
            m.fparams.extend([1.0 / p.temperature, top_p, min_p]);
            m.uniform.push(d.uniform.unwrap_or(0.0));
        }
        Ok(m)
    }
}

impl CudaBackend {
    /// Copies a draw table to the device. Not through the step's staging arena: it
    /// holds f64 numbers, and sampling ends the step with a download anyway.
    fn upload_draws<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, KernelError> {
        step_graph::refuse("allocates sampling metadata")?;
        if host.is_empty() {
            // SAFETY: one element nobody reads; the driver refuses zero-length buffers.
            return unsafe { self.stream().alloc::<T>(1) }
                .map_err(|e| driver_err("allocating sampling metadata", e));
        }
        self.stream()
            .clone_htod(host)
            .map_err(|e| driver_err("uploading sampling metadata", e))
    }

    pub(crate) fn sample_rows_op(
        &self,
        logits: CudaRef<'_>,
        vocab: usize,
        draws: &[RowDraw<'_>],
    ) -> Result<Vec<Option<RowDrawn>>, KernelError> {
        check_draws(logits.len(), vocab, draws)?;
        if draws.is_empty() {
            return Ok(Vec::new());
        }
        // Token ids are u32 and the kernels reserve u32::MAX.
        if vocab >= u32::MAX as usize {
            return Err(KernelError::Shape(format!(
                "sample_rows: a vocabulary of {vocab} does not fit u32 token ids"
            )));
        }
        step_graph::refuse("downloads sampled tokens")?;
        let n = draws.len();
        let meta = DrawMeta::of(draws, vocab)?;
        let rows = self.upload_draws(&meta.rows)?;
        let top_k = self.upload_draws(&meta.top_k)?;
        let flags = self.upload_draws(&meta.flags)?;
        let fparams = self.upload_draws(&meta.fparams)?;
        let uniform = self.upload_draws(&meta.uniform)?;
        let alloc_u32 = |len: usize| {
            self.stream()
                .alloc_zeros::<u32>(len)
                .map_err(|e| driver_err("allocating", e))
        };
        let mut tokens = alloc_u32(n)?;
        let mut status = alloc_u32(n)?;
        let lv = logits.cuda();
        let vocab64 = vocab as u64;
        let mut b = self.launch_of("sample_rows_f32")?;
        b.ptr(&lv).u64(vocab64).ptr(&rows).ptr(&top_k).ptr(&flags);
        b.ptr(&fparams)
            .ptr(&uniform)
            .ptr_mut(&mut tokens)
            .ptr_mut(&mut status);
        // SAFETY: one block of SAMPLE_THREADS per draw; every array holds one entry per
        // draw (`fparams` three); rows were checked against the logits.
        unsafe { b.launch(per_row(n, SAMPLE_THREADS)?) }?;

        // Log-probabilities of the draws that ask for them (and that the device computes).
        let mut which = Vec::new();
        let mut top_n = Vec::new();
        for (i, d) in draws.iter().enumerate() {
            if let Some(k) = d.top_logprobs {
                let k = k.min(vocab);
                if k <= MAX_TOP_LOGPROBS {
                    which.push(i as u32);
                    top_n.push(k as u32);
                }
            }
        }
        let max_n = top_n.iter().copied().max().unwrap_or(0).max(1);
        let mut lp_host = vec![0.0f32; which.len()];
        let mut ids_host = vec![0u32; which.len() * max_n as usize];
        let mut vals_host = vec![0.0f32; which.len() * max_n as usize];
        if !which.is_empty() {
            let which_d = self.upload_draws(&which)?;
            let top_n_d = self.upload_draws(&top_n)?;
            let mut lp = self.alloc_f32(which.len(), true)?;
            let mut ids = alloc_u32(ids_host.len())?;
            let mut vals = self.alloc_f32(vals_host.len(), true)?;
            let mut b = self.launch_of("row_logprobs_f32")?;
            b.ptr(&lv).u64(vocab64).ptr(&rows).ptr(&tokens);
            b.ptr(&which_d).ptr(&top_n_d).u32(max_n);
            b.ptr_mut(&mut lp).ptr_mut(&mut ids).ptr_mut(&mut vals);
            // SAFETY: one block per entry of `which` (draw indices < n); `ids` and `vals`
            // hold `max_n` slots per entry, and `top_n` ≤ `max_n`.
            unsafe { b.launch(per_row(which.len(), SAMPLE_THREADS)?) }?;
            self.dtoh(&lp, &mut lp_host)?;
            self.dtoh(&ids, &mut ids_host)?;
            self.dtoh(&vals, &mut vals_host)?;
        }
        let mut tokens_host = vec![0u32; n];
        let mut status_host = vec![0u32; n];
        self.dtoh(&tokens, &mut tokens_host)?;
        self.dtoh(&status, &mut status_host)?;
        self.synchronize()?;

        let mut out: Vec<Option<RowDrawn>> = Vec::with_capacity(n);
        for (i, d) in draws.iter().enumerate() {
            let token = tokens_host[i];
            if status_host[i] & DRAWN_UNSUPPORTED != 0 {
                out.push(None);
                continue;
            }
            if token as usize >= vocab {
                return Err(KernelError::Device(format!(
                    "sample_rows: the kernel chose token {token} of a vocabulary of {vocab}"
                )));
            }
            let mut drawn = RowDrawn {
                token,
                used_uniform: status_host[i] & DRAWN_USED != 0,
                logprob: None,
                top_logprobs: Vec::new(),
            };
            if let Some(asked) = d.top_logprobs {
                let Some(e) = which.iter().position(|&w| w as usize == i) else {
                    // More top log-probabilities than the device computes.
                    out.push(None);
                    continue;
                };
                let k = top_n[e] as usize;
                let at = e * max_n as usize;
                drawn.logprob = Some(lp_host[e]);
                drawn.top_logprobs = ids_host[at..at + k]
                    .iter()
                    .copied()
                    .zip(vals_host[at..at + k].iter().copied())
                    .collect();
                if let Some(&(bad, _)) = drawn.top_logprobs.iter().find(|t| t.0 as usize >= vocab) {
                    return Err(KernelError::Device(format!(
                        "sample_rows: the kernel ranked token {bad} of a vocabulary of {vocab} \
                         ({k} of {asked} top log-probabilities asked)"
                    )));
                }
            }
            out.push(Some(drawn));
        }
        Ok(out)
    }

    /// Enqueues a copy of a whole device array into `host` (the caller synchronizes).
    fn dtoh<T: cudarc::driver::DeviceRepr>(
        &self,
        src: &cudarc::driver::CudaSlice<T>,
        host: &mut [T],
    ) -> Result<(), KernelError> {
        if host.len() < src.len() {
            return Err(KernelError::Shape(format!(
                "sample_rows: {} host slots for {} values",
                host.len(),
                src.len()
            )));
        }
        step_graph::refuse("downloads sampled tokens")?;
        self.stream()
            .memcpy_dtoh(src, host)
            .map_err(|e| driver_err("downloading", e))
    }
}
