//! The CUDA C kernels (`kernels/*.cu`), compiled by NVRTC once per process and
//! architecture, and loaded into each backend's context.
//!
//! The backend compiles to a CUBIN for the device's exact architecture (`sm_90` on an
//! H200) rather than to PTX: the driver then needs no JIT, and a CUBIN from a newer
//! 13.x NVRTC runs on any CUDA 13 driver (minor-version compatibility), whereas PTX of
//! a newer ISA than the driver knows would be refused. [`compile_kernels`] also
//! produces PTX (`compute_90`), which the CPU-only compile check uses.

use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys, Ptx};

use crate::cuda::device::{driver_err, require_nvrtc};
use crate::error::KernelError;

/// Helpers prepended to every source (NVRTC gets no include path).
const COMMON: &str = include_str!("kernels/common.cu");

/// One kernel source and the functions it defines.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File stem under `kernels/src/cuda/kernels/`.
    pub name: &'static str,
    /// The CUDA C text (without the common prelude).
    pub text: &'static str,
    /// The `extern "C"` kernels it defines, all loaded at backend creation.
    pub functions: &'static [&'static str],
}

/// Every kernel source of the backend.
pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "elementwise",
        text: include_str!("kernels/elementwise.cu"),
        functions: &[
            "fill_f32",
            "add_f32",
            "add_bias_f32",
            "silu_mul_f32",
            "f32_to_bf16_kernel",
            "copy_strided_f32",
            "gather_rows_f32",
            "scatter_add_rows_f32",
            "rms_norm_f32",
            "argmax_f32",
        ],
    },
    KernelSource {
        name: "rope_embed",
        text: include_str!("kernels/rope_embed.cu"),
        functions: &["rope_f32", "embed_f32", "embed_bf16"],
    },
    KernelSource {
        name: "matmul",
        text: include_str!("kernels/matmul.cu"),
        functions: &["matmul_bf16_exact"],
    },
    KernelSource {
        name: "kv",
        text: include_str!("kernels/kv.cu"),
        functions: &["kv_write_rows", "kv_write_rows_fp8", "kv_to_f32"],
    },
    KernelSource {
        name: "attention",
        text: include_str!("kernels/attention.cu"),
        functions: &[
            "attention_partial",
            "merge_lse_f32",
            "scale_by_lse_share_f32",
        ],
    },
    KernelSource {
        name: "routing",
        text: include_str!("kernels/routing.cu"),
        functions: &["route_experts_f32"],
    },
    KernelSource {
        name: "sampling",
        text: include_str!("kernels/sampling.cu"),
        functions: &["sample_rows_f32", "row_logprobs_f32"],
    },
];

/// One source compiled for one architecture.
#[derive(Debug, Clone)]
pub struct CompiledSource {
    /// The source it came from.
    pub source: KernelSource,
    /// PTX text (for a `compute_XY` architecture) or a CUBIN (for `sm_XY`).
    pub image: Vec<u8>,
}

/// Compiles every kernel source for `arch` with NVRTC: `compute_90` gives PTX,
/// `sm_90` a CUBIN. Needs only NVRTC, no driver and no GPU, so CI checks the kernels
/// with it (see `kernels/tests/cuda_nvrtc_compile.rs`).
///
/// ```
/// // Without NVRTC this is an error saying how to install it, not a panic.
/// match dcpserve_kernels::cuda::compile_kernels("compute_90") {
///     Ok(all) => assert!(all.iter().all(|c| !c.image.is_empty())),
///     Err(e) => println!("{e}"),
/// }
/// ```
pub fn compile_kernels(arch: &str) -> Result<Vec<CompiledSource>, KernelError> {
    require_nvrtc()?;
    SOURCES
        .iter()
        .map(|&source| {
            let image = compile_one(source, arch)?;
            Ok(CompiledSource { source, image })
        })
        .collect()
}

/// [`compile_kernels`] once per process and architecture.
pub(crate) fn cached_kernels(arch: &str) -> Result<Arc<Vec<CompiledSource>>, KernelError> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Vec<CompiledSource>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    // A poisoned lock only means another thread panicked mid-insert; the map is intact.
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hit) = map.get(arch) {
        return Ok(hit.clone());
    }
    let compiled = Arc::new(compile_kernels(arch)?);
    map.insert(arch.to_owned(), compiled.clone());
    Ok(compiled)
}

fn nvrtc_err(what: &str, source: &str, e: impl std::fmt::Debug) -> KernelError {
    KernelError::Device(format!("NVRTC {what} of {source}.cu: {e:?}"))
}

/// Compiles one source (with the common prelude) for `arch`.
fn compile_one(source: KernelSource, arch: &str) -> Result<Vec<u8>, KernelError> {
    let text = format!("{COMMON}\n{}", source.text);
    let src = CString::new(text).map_err(|e| nvrtc_err("source", source.name, e))?;
    let name = CString::new(format!("{}.cu", source.name))
        .map_err(|e| nvrtc_err("name", source.name, e))?;
    let prog = nvrtc::create_program(&src, Some(&name))
        .map_err(|e| nvrtc_err("create", source.name, e))?;
    let options = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_owned(),
        // Exact IEEE division and square roots, no flush of subnormals: the CPU
        // backend's results are the reference.
        "--ftz=false".to_owned(),
        "--prec-div=true".to_owned(),
        "--prec-sqrt=true".to_owned(),
    ];
    // SAFETY: `prog` is a live program; it is destroyed below on every path.
    let result = unsafe { nvrtc::compile_program(prog, &options) };
    let out = match result {
        Err(e) => {
            // SAFETY: as above.
            let log = unsafe { nvrtc::get_program_log(prog) }
                .map(|l| c_chars_to_string(&l))
                .unwrap_or_default();
            Err(KernelError::Device(format!(
                "NVRTC could not compile {}.cu for {arch} ({e:?}):\n{log}",
                source.name
            )))
        }
        Ok(()) if arch.starts_with("sm_") => cubin(prog, source.name),
        // SAFETY: as above.
        Ok(()) => unsafe { nvrtc::get_ptx(prog) }
            .map(|p| c_chars_to_string(&p).into_bytes())
            .map_err(|e| nvrtc_err("PTX", source.name, e)),
    };
    // SAFETY: `prog` came from create_program and is not used afterwards.
    unsafe { nvrtc::destroy_program(prog) }.map_err(|e| nvrtc_err("destroy", source.name, e))?;
    out
}

/// The CUBIN of a program compiled for a real architecture.
fn cubin(prog: nvrtc_sys::nvrtcProgram, name: &str) -> Result<Vec<u8>, KernelError> {
    let mut size = 0usize;
    // SAFETY: `prog` is compiled; `size` is a valid out-pointer.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| nvrtc_err("CUBIN size", name, e))?;
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds the `size` bytes NVRTC writes.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) }
        .result()
        .map_err(|e| nvrtc_err("CUBIN", name, e))?;
    Ok(buf)
}

/// A NUL-terminated C string buffer as text.
fn c_chars_to_string(chars: &[c_char]) -> String {
    // c_char is i8 on x86-64 and u8 on aarch64: reinterpret, never cast.
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| u8::from_ne_bytes(c.to_ne_bytes()))
        .collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned())
}

/// The loaded kernels of one context, by name.
#[derive(Debug)]
pub(crate) struct Kernels {
    functions: HashMap<&'static str, CudaFunction>,
}

impl Kernels {
    /// Loads every compiled CUBIN into `ctx` and looks up its functions.
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        compiled: &[CompiledSource],
    ) -> Result<Kernels, KernelError> {
        let mut functions = HashMap::new();
        for c in compiled {
            let module = ctx
                .load_module(Ptx::from_binary(c.image.clone()))
                .map_err(|e| driver_err(&format!("loading {}.cu", c.source.name), e))?;
            for &f in c.source.functions {
                let func = module
                    .load_function(f)
                    .map_err(|e| driver_err(&format!("finding kernel {f}"), e))?;
                functions.insert(f, func);
            }
        }
        Ok(Kernels { functions })
    }

    /// The kernel `name` (one of [`SOURCES`]' functions).
    pub(crate) fn get(&self, name: &'static str) -> Result<&CudaFunction, KernelError> {
        self.functions
            .get(name)
            .ok_or_else(|| KernelError::Device(format!("kernel {name} is not loaded")))
    }
}
