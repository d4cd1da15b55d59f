//! An emulated CUDA device, for running the engine's CUDA backend on a machine without a GPU.
//!
//! This crate builds one shared object that exports the subset of the CUDA driver API,
//! NVRTC, cuBLAS and NCCL that the engine calls, under the C names and ABI of the real
//! libraries. cudarc loads libraries at run time (`dynamic-loading`), so with this object on
//! `LD_LIBRARY_PATH` under the real file names (`scripts/gpu-emulated.sh` arranges it) the
//! engine's own CUDA code runs unmodified: `--device cuda` executes `CudaBackend`, its NVRTC
//! kernels, streams, graphs and collectives on the CPU.
//!
//! - [`nvrtc`]: compiles each `.cu` source with the host C++ compiler and the emulation
//!   header (`include/dcpemu.h`); the "CUBIN" it returns is a loadable module image.
//! - [`kernel_exec`]: loads such an image and runs a kernel's grid (every thread of a block
//!   able to meet at a barrier), with the launch parameters as `void**` as on a GPU.
//! - [`driver`]: contexts, checked device memory, streams on worker threads, events, graph
//!   capture and replay, module loading and `cuLaunchKernel`.
//! - [`cublas`]: the GEMM variants the backend uses, on the CPU.
//! - [`nccl`]: communicators among the ranks of one process.
//!
//! What it cannot check (timing, the real memory model, tensor-core numerics, NCCL across
//! processes) is listed in the README's "Emulated CUDA device" section.

// Every `extern "C"` export stands in for a CUDA / cuBLAS / NCCL entry point: its safety
// contract and its argument list are those of the C API it emulates.
#![allow(clippy::missing_safety_doc, clippy::too_many_arguments)]

pub mod cache;
pub mod cublas;
pub mod driver;
pub mod kernel_exec;
pub mod nccl;
pub mod nvrtc;
