//! Kernels compiled through the emulated NVRTC and launched through `cuLaunchKernel`:
//! parameter copying, pointer checks, and a kernel's out-of-bounds access reported with
//! the allocation it missed.

use std::ffi::{c_void, CString};
use std::ptr::null_mut;

use super::context::{ctx_handle, cuCtxSetCurrent};
use super::errors::codes;
use super::launch::*;
use super::stream_api::cuStreamSynchronize;
use super::tests::{alloc, download, init, new_stream, upload};
use super::Handle;
use crate::nvrtc::*;

const SRC: &str = r#"
extern "C" __global__ void scale(float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
extern "C" __global__ void poke(float* x, unsigned at) {
    x[at] = 1.0f;
}
"#;

/// Compiles `SRC` and returns the two functions.
fn functions() -> (Handle, Handle) {
    let src = CString::new(SRC).unwrap();
    let name = CString::new("t.cu").unwrap();
    let opt = CString::new("--gpu-architecture=sm_90").unwrap();
    let opts = [opt.as_ptr()];
    unsafe {
        let mut prog: NvrtcProgram = null_mut();
        assert_eq!(
            nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null()
            ),
            0
        );
        assert_eq!(nvrtcCompileProgram(prog, 1, opts.as_ptr()), 0);
        let mut size = 0usize;
        assert_eq!(nvrtcGetCUBINSize(prog, &mut size), 0);
        let mut image = vec![0u8; size];
        assert_eq!(nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()), 0);
        let mut module = null_mut();
        assert_eq!(
            cuModuleLoadData(&mut module, image.as_ptr().cast()),
            codes::SUCCESS
        );
        let (mut f, mut g) = (null_mut(), null_mut());
        let (a, b) = (
            CString::new("scale").unwrap(),
            CString::new("poke").unwrap(),
        );
        assert_eq!(
            cuModuleGetFunction(&mut f, module, a.as_ptr()),
            codes::SUCCESS
        );
        assert_eq!(
            cuModuleGetFunction(&mut g, module, b.as_ptr()),
            codes::SUCCESS
        );
        let missing = CString::new("nope").unwrap();
        let mut h = null_mut();
        assert_eq!(
            cuModuleGetFunction(&mut h, module, missing.as_ptr()),
            codes::NOT_FOUND
        );
        (f, g)
    }
}

#[test]
fn launch_copies_parameters_and_checks_pointers() {
    init();
    unsafe { assert_eq!(cuCtxSetCurrent(ctx_handle(2)), 0) };
    let (scale, _) = functions();
    let s = new_stream();
    let n = 100u32;
    let x = alloc(n as usize * 4);
    upload(x, &(0..n).map(|i| i as f32).collect::<Vec<_>>());
    unsafe {
        let (mut p, mut a, mut cnt) = (x, 2.0f32, n);
        let mut params: [*mut c_void; 3] = [
            (&mut p as *mut u64).cast(),
            (&mut a as *mut f32).cast(),
            (&mut cnt as *mut u32).cast(),
        ];
        assert_eq!(
            cuLaunchKernel(
                scale,
                4,
                1,
                1,
                32,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                null_mut()
            ),
            codes::SUCCESS
        );
        // The values are copied at the call: changing them afterwards changes nothing.
        params[1].cast::<f32>().write(100.0);
        assert_eq!(cuStreamSynchronize(s), codes::SUCCESS);
        let got: Vec<f32> = download(x, n as usize);
        assert_eq!(got, (0..n).map(|i| 2.0 * i as f32).collect::<Vec<_>>());
        // A pointer parameter that is no device memory is refused at the call.
        params[0].cast::<u64>().write(0xdead_0000);
        assert_eq!(
            cuLaunchKernel(
                scale,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                null_mut()
            ),
            codes::ILLEGAL_ADDRESS
        );
        // Too many threads, too much dynamic shared memory.
        params[0].cast::<u64>().write(x);
        assert_eq!(
            cuLaunchKernel(
                scale,
                1,
                1,
                1,
                2048,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                null_mut()
            ),
            codes::INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(
                scale,
                1,
                1,
                1,
                32,
                1,
                1,
                64 * 1024,
                s,
                params.as_mut_ptr(),
                null_mut()
            ),
            codes::INVALID_VALUE
        );
        assert_eq!(cuFuncSetAttribute(scale, 8, 64 * 1024), codes::SUCCESS);
        assert_eq!(
            cuLaunchKernel(
                scale,
                1,
                1,
                1,
                32,
                1,
                1,
                64 * 1024,
                s,
                params.as_mut_ptr(),
                null_mut()
            ),
            codes::SUCCESS
        );
        assert_eq!(cuStreamSynchronize(s), codes::SUCCESS);
        let mut v = 0;
        assert_eq!(cuFuncGetAttribute(&mut v, 8, scale), codes::SUCCESS);
        assert_eq!(v, 64 * 1024);
    }
}

#[test]
fn a_kernel_writing_past_an_allocation_faults_naming_it() {
    init();
    // Device 4, which no other test uses: the fault breaks the device's context, as on a GPU.
    unsafe { assert_eq!(cuCtxSetCurrent(ctx_handle(4)), 0) };
    let (_, poke) = functions();
    let s = new_stream();
    let x = alloc(64 * 4);
    unsafe {
        let (mut p, mut at) = (x, 64u32);
        let mut params: [*mut c_void; 2] =
            [(&mut p as *mut u64).cast(), (&mut at as *mut u32).cast()];
        assert_eq!(
            cuLaunchKernel(
                poke,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                null_mut()
            ),
            codes::SUCCESS
        );
        assert_eq!(cuStreamSynchronize(s), codes::ILLEGAL_ADDRESS);
    }
    let f = super::stream::device_fault(4).expect("device 4 broken");
    assert!(
        f.msg
            .contains("0 bytes past the end of the 256-byte allocation"),
        "{}",
        f.msg
    );
}
