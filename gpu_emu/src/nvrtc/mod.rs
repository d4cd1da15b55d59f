//! NVRTC's C ABI (the functions cudarc 0.19 calls with the `cuda-13000` bindings):
//! programs are compiled by the host C++ compiler with the emulation headers
//! ([`compile`]); the "PTX" handed out is a text naming the compiled shared object, the
//! "CUBIN" the shared object itself, both of which the emulated driver's
//! `cuModuleLoadData` loads ([`crate::kernel_exec::image`]).

pub mod compile;
pub mod scan;

use std::ffi::{c_char, c_int, CStr};
use std::ptr;

/// `nvrtcResult` (values of the CUDA 13 header).
pub type NvrtcResult = c_int;
pub const NVRTC_SUCCESS: NvrtcResult = 0;
pub const NVRTC_ERROR_OUT_OF_MEMORY: NvrtcResult = 1;
pub const NVRTC_ERROR_PROGRAM_CREATION_FAILURE: NvrtcResult = 2;
pub const NVRTC_ERROR_INVALID_INPUT: NvrtcResult = 3;
pub const NVRTC_ERROR_INVALID_PROGRAM: NvrtcResult = 4;
pub const NVRTC_ERROR_INVALID_OPTION: NvrtcResult = 5;
pub const NVRTC_ERROR_COMPILATION: NvrtcResult = 6;
pub const NVRTC_ERROR_BUILTIN_OPERATION_FAILURE: NvrtcResult = 7;
pub const NVRTC_ERROR_INTERNAL_ERROR: NvrtcResult = 11;

/// What `nvrtcProgram` points to.
pub struct Program {
    src: String,
    name: String,
    headers: Vec<(String, String)>,
    log: Vec<u8>,
    /// The text image ("PTX") once compiled, and the shared object it names.
    image: Option<Vec<u8>>,
    so_path: Option<String>,
    /// The shared object's bytes ("CUBIN"), read on first request.
    cubin: Option<Vec<u8>>,
}

/// `nvrtcProgram`.
pub type NvrtcProgram = *mut Program;

unsafe fn c_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: the caller passes a C string.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// # Safety
/// As NVRTC's: `prog` a valid out-pointer, `src` a C string, the header arrays of
/// `num_headers` C strings each.
#[no_mangle]
pub unsafe extern "C" fn nvrtcCreateProgram(
    prog: *mut NvrtcProgram,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> NvrtcResult {
    if prog.is_null() || src.is_null() || num_headers < 0 {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    let mut hdrs = Vec::new();
    for i in 0..num_headers as usize {
        if headers.is_null() || include_names.is_null() {
            return NVRTC_ERROR_INVALID_INPUT;
        }
        // SAFETY: the caller's arrays of num_headers C strings.
        let (h, n) = unsafe { (c_str(*headers.add(i)), c_str(*include_names.add(i))) };
        match (h, n) {
            (Some(h), Some(n)) => hdrs.push((n, h)),
            _ => return NVRTC_ERROR_INVALID_INPUT,
        }
    }
    let program = Program {
        // SAFETY: checked non-null above.
        src: unsafe { c_str(src) }.unwrap_or_default(),
        // SAFETY: null or a C string.
        name: unsafe { c_str(name) }.unwrap_or_else(|| "default_program".into()),
        headers: hdrs,
        log: Vec::new(),
        image: None,
        so_path: None,
        cubin: None,
    };
    // SAFETY: prog is a valid out-pointer.
    unsafe { *prog = Box::into_raw(Box::new(program)) };
    NVRTC_SUCCESS
}

/// # Safety
/// `prog` points to a program handle of [`nvrtcCreateProgram`] (or null).
#[no_mangle]
pub unsafe extern "C" fn nvrtcDestroyProgram(prog: *mut NvrtcProgram) -> NvrtcResult {
    // SAFETY: the caller's contract.
    if prog.is_null() || unsafe { (*prog).is_null() } {
        return NVRTC_ERROR_INVALID_PROGRAM;
    }
    // SAFETY: the handle came from Box::into_raw and is not used again.
    unsafe {
        drop(Box::from_raw(*prog));
        *prog = ptr::null_mut();
    }
    NVRTC_SUCCESS
}

/// # Safety
/// `prog` a live program; `options` holds `num_options` C strings.
#[no_mangle]
pub unsafe extern "C" fn nvrtcCompileProgram(
    prog: NvrtcProgram,
    num_options: c_int,
    options: *const *const c_char,
) -> NvrtcResult {
    if prog.is_null() {
        return NVRTC_ERROR_INVALID_PROGRAM;
    }
    // SAFETY: a live program, used by one thread at a time (as NVRTC requires).
    let p = unsafe { &mut *prog };
    let mut opts = Vec::new();
    for i in 0..num_options.max(0) as usize {
        // SAFETY: the caller's array.
        match unsafe { c_str(*options.add(i)) } {
            Some(o) => opts.push(o),
            None => return NVRTC_ERROR_INVALID_OPTION,
        }
    }
    let options = match compile::translate_options(&opts) {
        Ok(o) => o,
        Err(e) => {
            p.log = e.into_bytes();
            return NVRTC_ERROR_INVALID_OPTION;
        }
    };
    match compile::compile(&p.src, &p.name, &p.headers, &options) {
        Ok(c) => {
            p.image = Some(c.text_image(options.arch));
            p.so_path = Some(c.so_path);
            p.log = c.log.into_bytes();
            p.cubin = None;
            NVRTC_SUCCESS
        }
        Err(compile::CompileError::Source(log)) => {
            p.log = log.into_bytes();
            NVRTC_ERROR_COMPILATION
        }
        Err(compile::CompileError::Internal(e)) => {
            eprintln!("dcpemu nvrtc: {e}");
            p.log = e.into_bytes();
            NVRTC_ERROR_INTERNAL_ERROR
        }
    }
}

/// Copies `bytes` and a NUL to `out`.
unsafe fn copy_out(bytes: &[u8], out: *mut c_char) {
    // SAFETY: the caller sized `out` with the matching *Size call (len + 1).
    unsafe {
        ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len());
        *out.add(bytes.len()) = 0;
    }
}

/// # Safety
/// `prog` a live program, `size` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetProgramLogSize(
    prog: NvrtcProgram,
    size: *mut usize,
) -> NvrtcResult {
    if prog.is_null() || size.is_null() {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: the caller's contract.
    unsafe { *size = (*prog).log.len() + 1 };
    NVRTC_SUCCESS
}

/// # Safety
/// `prog` a live program, `log` holds the size [`nvrtcGetProgramLogSize`] gave.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetProgramLog(prog: NvrtcProgram, log: *mut c_char) -> NvrtcResult {
    if prog.is_null() || log.is_null() {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: the caller's contract; the log holds no NUL (compiler text).
    unsafe { copy_out(&(*prog).log, log) };
    NVRTC_SUCCESS
}

/// The text image of a compiled program (it ends with its own NUL).
unsafe fn image_of<'a>(prog: NvrtcProgram, what: &str) -> Result<&'a [u8], NvrtcResult> {
    if prog.is_null() {
        return Err(NVRTC_ERROR_INVALID_PROGRAM);
    }
    // SAFETY: the caller's contract.
    match unsafe { &(*prog).image } {
        Some(i) => Ok(i),
        None => {
            eprintln!("dcpemu nvrtc: {what} asked of a program that has not compiled");
            Err(NVRTC_ERROR_INVALID_PROGRAM)
        }
    }
}

unsafe fn image_size(prog: NvrtcProgram, size: *mut usize, what: &str) -> NvrtcResult {
    if size.is_null() {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: the caller's contract.
    match unsafe { image_of(prog, what) } {
        Ok(i) => {
            // SAFETY: a valid out-pointer.
            unsafe { *size = i.len() };
            NVRTC_SUCCESS
        }
        Err(e) => e,
    }
}

unsafe fn image_copy(prog: NvrtcProgram, out: *mut c_char, what: &str) -> NvrtcResult {
    if out.is_null() {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: the caller's contract.
    match unsafe { image_of(prog, what) } {
        Ok(i) => {
            // SAFETY: `out` holds the size image_size gave (the image with its NUL).
            unsafe { ptr::copy_nonoverlapping(i.as_ptr(), out.cast::<u8>(), i.len()) };
            NVRTC_SUCCESS
        }
        Err(e) => e,
    }
}

/// # Safety
/// `prog` a live program, `size` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetPTXSize(prog: NvrtcProgram, size: *mut usize) -> NvrtcResult {
    // SAFETY: the caller's contract.
    unsafe { image_size(prog, size, "nvrtcGetPTXSize") }
}

/// # Safety
/// `prog` a live compiled program, `ptx` holds [`nvrtcGetPTXSize`] bytes.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetPTX(prog: NvrtcProgram, ptx: *mut c_char) -> NvrtcResult {
    // SAFETY: the caller's contract.
    unsafe { image_copy(prog, ptx, "nvrtcGetPTX") }
}

/// # Safety
/// `prog` a live program, `size` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBINSize(prog: NvrtcProgram, size: *mut usize) -> NvrtcResult {
    if size.is_null() {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: the caller's contract.
    match unsafe { cubin_of(prog) } {
        Ok(c) => {
            // SAFETY: a valid out-pointer.
            unsafe { *size = c.len() };
            NVRTC_SUCCESS
        }
        Err(e) => e,
    }
}

/// # Safety
/// `prog` a live compiled program, `cubin` holds [`nvrtcGetCUBINSize`] bytes.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBIN(prog: NvrtcProgram, cubin: *mut c_char) -> NvrtcResult {
    if cubin.is_null() {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: the caller's contract.
    match unsafe { cubin_of(prog) } {
        Ok(c) => {
            // SAFETY: `cubin` holds the size nvrtcGetCUBINSize gave.
            unsafe { ptr::copy_nonoverlapping(c.as_ptr(), cubin.cast::<u8>(), c.len()) };
            NVRTC_SUCCESS
        }
        Err(e) => e,
    }
}

/// The "CUBIN" of a compiled program: its shared object's bytes (an x86-64 ELF, which
/// the emulated driver loads as it is; see `kernel_exec::image`).
unsafe fn cubin_of<'a>(prog: NvrtcProgram) -> Result<&'a [u8], NvrtcResult> {
    if prog.is_null() {
        return Err(NVRTC_ERROR_INVALID_PROGRAM);
    }
    // SAFETY: a live program, one thread at a time.
    let p = unsafe { &mut *prog };
    if p.cubin.is_none() {
        let Some(path) = &p.so_path else {
            eprintln!("dcpemu nvrtc: a CUBIN asked of a program that has not compiled");
            return Err(NVRTC_ERROR_INVALID_PROGRAM);
        };
        match std::fs::read(path) {
            Ok(bytes) => p.cubin = Some(bytes),
            Err(e) => {
                eprintln!("dcpemu nvrtc: reading the compiled module {path}: {e}");
                return Err(NVRTC_ERROR_INTERNAL_ERROR);
            }
        }
    }
    Ok(p.cubin.as_deref().unwrap_or_default())
}

/// # Safety
/// Valid out-pointers.
#[no_mangle]
pub unsafe extern "C" fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> NvrtcResult {
    if major.is_null() || minor.is_null() {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: valid out-pointers.
    unsafe {
        *major = 13;
        *minor = 0;
    }
    NVRTC_SUCCESS
}

/// Architectures the emulator accepts (it ignores the choice).
const ARCHS: [c_int; 8] = [75, 80, 86, 89, 90, 100, 110, 120];

/// # Safety
/// A valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetNumSupportedArchs(n: *mut c_int) -> NvrtcResult {
    if n.is_null() {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: a valid out-pointer.
    unsafe { *n = ARCHS.len() as c_int };
    NVRTC_SUCCESS
}

/// # Safety
/// `archs` holds [`nvrtcGetNumSupportedArchs`] entries.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetSupportedArchs(archs: *mut c_int) -> NvrtcResult {
    if archs.is_null() {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: the caller's contract.
    unsafe { ptr::copy_nonoverlapping(ARCHS.as_ptr(), archs, ARCHS.len()) };
    NVRTC_SUCCESS
}

#[no_mangle]
pub extern "C" fn nvrtcGetErrorString(result: NvrtcResult) -> *const c_char {
    let s: &'static CStr = match result {
        0 => c"NVRTC_SUCCESS",
        1 => c"NVRTC_ERROR_OUT_OF_MEMORY",
        2 => c"NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
        3 => c"NVRTC_ERROR_INVALID_INPUT",
        4 => c"NVRTC_ERROR_INVALID_PROGRAM",
        5 => c"NVRTC_ERROR_INVALID_OPTION",
        6 => c"NVRTC_ERROR_COMPILATION",
        7 => c"NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
        8 => c"NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
        9 => c"NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
        10 => c"NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
        11 => c"NVRTC_ERROR_INTERNAL_ERROR",
        _ => c"NVRTC_ERROR unknown",
    };
    s.as_ptr()
}

/// A call the emulator does not implement: says so and fails.
fn not_emulated(what: &str) -> NvrtcResult {
    eprintln!("dcpemu nvrtc: {what} is not emulated (only extern \"C\" kernels by name, PTX/CUBIN output)");
    NVRTC_ERROR_INTERNAL_ERROR
}

/// Not emulated (name expressions): fails with a message.
#[no_mangle]
pub extern "C" fn nvrtcAddNameExpression(_prog: NvrtcProgram, _name: *const c_char) -> NvrtcResult {
    not_emulated("nvrtcAddNameExpression")
}

/// Not emulated (name expressions): fails with a message.
#[no_mangle]
pub extern "C" fn nvrtcGetLoweredName(
    _prog: NvrtcProgram,
    _name: *const c_char,
    _lowered: *mut *const c_char,
) -> NvrtcResult {
    not_emulated("nvrtcGetLoweredName")
}

/// Not emulated (LTO IR): fails with a message.
#[no_mangle]
pub extern "C" fn nvrtcGetLTOIRSize(_prog: NvrtcProgram, _size: *mut usize) -> NvrtcResult {
    not_emulated("nvrtcGetLTOIRSize")
}

/// Not emulated (LTO IR): fails with a message.
#[no_mangle]
pub extern "C" fn nvrtcGetLTOIR(_prog: NvrtcProgram, _out: *mut c_char) -> NvrtcResult {
    not_emulated("nvrtcGetLTOIR")
}

/// Not emulated (OptiX IR): fails with a message.
#[no_mangle]
pub extern "C" fn nvrtcGetOptiXIRSize(_prog: NvrtcProgram, _size: *mut usize) -> NvrtcResult {
    not_emulated("nvrtcGetOptiXIRSize")
}

/// Not emulated (OptiX IR): fails with a message.
#[no_mangle]
pub extern "C" fn nvrtcGetOptiXIR(_prog: NvrtcProgram, _out: *mut c_char) -> NvrtcResult {
    not_emulated("nvrtcGetOptiXIR")
}
