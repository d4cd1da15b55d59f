//! Kernels compiled through the NVRTC ABI and run through [`Module`] / [`Kernel`].

use std::ffi::{c_void, CString};
use std::ptr;

use super::{with_settings, Kernel, LaunchDims, Module, Schedule};
use crate::nvrtc::*;

/// Compiles `src` through the C ABI as the engine does; `Err` is the program log.
pub(crate) fn compile(
    src: &str,
    name: &str,
    options: &[&str],
) -> Result<Vec<u8>, (NvrtcResult, String)> {
    let src = CString::new(src).unwrap();
    let name = CString::new(name).unwrap();
    let opts: Vec<CString> = options.iter().map(|o| CString::new(*o).unwrap()).collect();
    let opt_ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: NvrtcProgram = ptr::null_mut();
    unsafe {
        assert_eq!(
            nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                ptr::null(),
                ptr::null()
            ),
            0
        );
        let r = nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let mut log_size = 0usize;
        assert_eq!(nvrtcGetProgramLogSize(prog, &mut log_size), 0);
        let mut log = vec![0u8; log_size];
        assert_eq!(nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()), 0);
        let log = String::from_utf8_lossy(&log[..log_size - 1]).into_owned();
        let out = if r == NVRTC_SUCCESS {
            let mut size = 0usize;
            assert_eq!(nvrtcGetCUBINSize(prog, &mut size), 0);
            let mut image = vec![0u8; size];
            assert_eq!(nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()), 0);
            Ok(image)
        } else {
            Err((r, log))
        };
        assert_eq!(nvrtcDestroyProgram(&mut prog), 0);
        out
    }
}

pub(crate) fn load(src: &str) -> Module {
    let image = compile(src, "test.cu", &["--gpu-architecture=sm_90", "--std=c++17"])
        .unwrap_or_else(|(r, log)| panic!("compile failed ({r}):\n{log}"));
    unsafe { Module::load(image.as_ptr().cast()) }.unwrap()
}

/// Launches with one argument per pointer in `args` (each pointing at the value).
pub(crate) fn launch(
    k: &Kernel,
    grid: u32,
    block: u32,
    shared: u32,
    args: &mut [*mut c_void],
) -> Result<(), String> {
    let dims = LaunchDims {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared_bytes: shared,
    };
    unsafe { k.launch_counted(&dims, args) }
}

fn arg<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

fn schedules() -> Vec<Schedule> {
    vec![
        Schedule::Forward,
        Schedule::Reverse,
        Schedule::parse("random:7").unwrap(),
        Schedule::parse("random:99").unwrap(),
    ]
}

const REDUCE: &str = r#"
extern "C" __global__ void block_sums(const float* x, float* out, unsigned n) {
    __shared__ float part[256];
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    part[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}
"#;

#[test]
fn shared_memory_reduction_under_every_schedule() {
    let m = load(REDUCE);
    let k = m.function("block_sums").unwrap();
    assert_eq!(k.params().len(), 3);
    assert!(k.params()[0].is_pointer && !k.params()[2].is_pointer);
    assert_eq!(k.params()[2].size, 4);
    assert_eq!(k.static_shared_bytes(), 1024);
    let n = 1000u32;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    for sched in schedules() {
        for threads in [1, 3] {
            let mut out = vec![0f32; 4];
            let (mut xp, mut op, mut nn) = (x.as_ptr(), out.as_mut_ptr(), n);
            with_settings(sched.clone(), threads, || {
                launch(
                    &k,
                    4,
                    256,
                    0,
                    &mut [arg(&mut xp), arg(&mut op), arg(&mut nn)],
                )
                .unwrap()
            });
            for (b, &v) in out.iter().enumerate() {
                let want: f32 = (b as u32 * 256..((b as u32 + 1) * 256).min(n))
                    .map(|i| i as f32)
                    .sum();
                assert_eq!(v, want, "block {b} under {sched:?}, {threads} OS threads");
            }
        }
    }
}

#[test]
fn warp_shuffles_and_votes() {
    let m = load(
        r#"
extern "C" __global__ void warp_ops(const int* x, int* out) {
    int v = x[threadIdx.x];
    int s = v;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    int d = v;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xFFFFFFFFu, d, o);
    int up = __shfl_up_sync(0xFFFFFFFFu, v, 1);
    int bcast = __shfl_sync(0xFFFFFFFFu, v, 5);
    int seg = __shfl_sync(0xFFFFFFFFu, v, 0, 8);
    unsigned ballot = __ballot_sync(0xFFFFFFFFu, v % 3 == 0);
    int any = __any_sync(0xFFFFFFFFu, v == 40), all = __all_sync(0xFFFFFFFFu, v >= 0);
    int* o = out + threadIdx.x * 8;
    o[0] = s; o[1] = d; o[2] = up; o[3] = bcast; o[4] = seg; o[5] = (int)ballot; o[6] = any; o[7] = all;
}
"#,
    );
    let k = m.function("warp_ops").unwrap();
    let x: Vec<i32> = (0..64).map(|i| i * 7 % 50).collect();
    for sched in schedules() {
        let mut out = vec![0i32; 64 * 8];
        let (mut xp, mut op) = (x.as_ptr(), out.as_mut_ptr());
        with_settings(sched.clone(), 1, || {
            launch(&k, 1, 64, 0, &mut [arg(&mut xp), arg(&mut op)]).unwrap()
        });
        for t in 0..64usize {
            let w = &x[t / 32 * 32..t / 32 * 32 + 32];
            let lane = t % 32;
            let o = &out[t * 8..t * 8 + 8];
            assert_eq!(o[0], w.iter().sum::<i32>(), "xor sum, thread {t}");
            if lane == 0 {
                assert_eq!(o[1], w.iter().sum::<i32>(), "down sum");
            }
            assert_eq!(o[2], if lane == 0 { w[0] } else { w[lane - 1] }, "up");
            assert_eq!(o[3], w[5]);
            assert_eq!(o[4], w[lane / 8 * 8]);
            let ballot = w
                .iter()
                .enumerate()
                .fold(0u32, |b, (l, v)| b | (u32::from(v % 3 == 0) << l));
            assert_eq!(o[5] as u32, ballot);
            assert_eq!(o[6], i32::from(w.contains(&40)));
            assert_eq!(o[7], 1);
        }
    }
}

#[test]
fn atomic_histogram_global_and_shared() {
    let m = load(
        r#"
extern "C" __global__ void histogram(const unsigned* x, unsigned n, unsigned* global_bins, unsigned* per_block) {
    __shared__ unsigned bins[16];
    if (threadIdx.x < 16) bins[threadIdx.x] = 0;
    __syncthreads();
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        atomicAdd(&global_bins[x[i] % 16], 1u);
        atomicAdd(&bins[x[i] % 16], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 16) atomicAdd(&per_block[threadIdx.x], bins[threadIdx.x]);
}
"#,
    );
    let k = m.function("histogram").unwrap();
    let n = 10_000u32;
    let x: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2_654_435_761) >> 7).collect();
    let mut want = [0u32; 16];
    for v in &x {
        want[(v % 16) as usize] += 1;
    }
    for threads in [1, 4] {
        let mut g = [0u32; 16];
        let mut b = [0u32; 16];
        let (mut xp, mut nn, mut gp, mut bp) = (x.as_ptr(), n, g.as_mut_ptr(), b.as_mut_ptr());
        with_settings(Schedule::parse("random:3").unwrap(), threads, || {
            launch(
                &k,
                8,
                128,
                0,
                &mut [arg(&mut xp), arg(&mut nn), arg(&mut gp), arg(&mut bp)],
            )
            .unwrap()
        });
        assert_eq!(g, want);
        assert_eq!(b, want);
    }
}

#[test]
fn dynamic_shared_memory() {
    let m = load(
        r#"
extern "C" __global__ void reverse(float* x) {
    extern __shared__ float buf[];
    unsigned t = threadIdx.x;
    buf[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    x[blockIdx.x * blockDim.x + t] = buf[blockDim.x - 1 - t];
}
"#,
    );
    let k = m.function("reverse").unwrap();
    let mut x: Vec<f32> = (0..384).map(|i| i as f32).collect();
    let mut xp = x.as_mut_ptr();
    launch(&k, 3, 128, 128 * 4, &mut [arg(&mut xp)]).unwrap();
    for b in 0..3 {
        for t in 0..128 {
            assert_eq!(x[b * 128 + t], (b * 128 + 127 - t) as f32);
        }
    }
    // Past the 48 KiB default (the driver's to refuse without the opt-in), and past
    // the device's maximum per block.
    launch(&k, 3, 128, 64 * 1024, &mut [arg(&mut xp)]).unwrap();
    let e = launch(&k, 1, 128, 228 * 1024, &mut [arg(&mut xp)]).unwrap_err();
    assert!(e.contains("shared memory"), "{e}");
}

#[test]
fn wrong_parameter_count_and_null_parameter_fail() {
    let m = load(REDUCE);
    let k = m.function("block_sums").unwrap();
    let x = [1f32; 4];
    let mut out = [0f32; 1];
    let (mut xp, mut op) = (x.as_ptr(), out.as_mut_ptr());
    let e = launch(&k, 1, 32, 0, &mut [arg(&mut xp), arg(&mut op)]).unwrap_err();
    assert!(e.contains("2 arguments given, the kernel takes 3"), "{e}");
    let e = launch(
        &k,
        1,
        32,
        0,
        &mut [arg(&mut xp), arg(&mut op), ptr::null_mut()],
    )
    .unwrap_err();
    assert!(e.contains("parameter 2 (of 3) is a null pointer"), "{e}");
    let mut n = 4u32;
    let e = launch(
        &k,
        1,
        2048,
        0,
        &mut [arg(&mut xp), arg(&mut op), arg(&mut n)],
    )
    .unwrap_err();
    assert!(e.contains("exceed"), "{e}");
}

#[test]
fn collective_misuse_is_reported_not_hung() {
    let m = load(
        r#"
#include <assert.h>
extern "C" __global__ void exited_lanes(int* x) {
    if ((threadIdx.x & 31) >= 16) return;
    x[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, x[threadIdx.x], 1);
}
extern "C" __global__ void split_barriers(int* x) {
    int v = x[threadIdx.x];
    if ((threadIdx.x & 31) < 16) v = __shfl_xor_sync(0xFFFFFFFFu, v, 1);
    __syncthreads();
    x[threadIdx.x] = v;
}
extern "C" __global__ void asserting(int* x) {
    assert(threadIdx.x < 5);
    x[threadIdx.x] = 1;
}
extern "C" __global__ void counting(int* x) {
    int c = __syncthreads_count(threadIdx.x % 3 == 0);
    int a = __syncthreads_and(threadIdx.x < 100);
    int o = __syncthreads_or(threadIdx.x == 17);
    int n = __syncthreads_and(threadIdx.x != 5);
    x[threadIdx.x] = c * 1000 + a * 100 + o * 10 + n;
}
extern "C" __global__ void trapping(int* x) {
    if (threadIdx.x == 3) __trap();
    x[threadIdx.x] = 1;
}
"#,
    );
    let mut x = [0i32; 64];
    let mut xp = x.as_mut_ptr();
    let e = launch(
        &m.function("exited_lanes").unwrap(),
        1,
        64,
        0,
        &mut [arg(&mut xp)],
    )
    .unwrap_err();
    assert!(e.contains("exited"), "{e}");
    let e = launch(
        &m.function("split_barriers").unwrap(),
        1,
        64,
        0,
        &mut [arg(&mut xp)],
    )
    .unwrap_err();
    assert!(e.contains("deadlock"), "{e}");
    let e = launch(
        &m.function("trapping").unwrap(),
        2,
        32,
        0,
        &mut [arg(&mut xp)],
    )
    .unwrap_err();
    assert!(
        e.contains("thread (3, 0, 0)") && e.contains("__trap"),
        "{e}"
    );
}

#[test]
fn a_compile_error_goes_to_the_log() {
    let (r, log) = compile(
        "extern \"C\" __global__ void k(int* x) {\n  x[0] = undefined_thing;\n}\n",
        "broken.cu",
        &[],
    )
    .unwrap_err();
    assert_eq!(r, NVRTC_ERROR_COMPILATION);
    assert!(
        log.contains("broken.cu:2") && log.contains("undefined_thing"),
        "{log}"
    );
    let (r, _) = compile(
        "extern \"C\" __global__ void k() {}",
        "x.cu",
        &["--no-such-option"],
    )
    .unwrap_err();
    assert_eq!(r, NVRTC_ERROR_INVALID_OPTION);
}

#[test]
fn schedule_exposes_a_missing_barrier() {
    // Reads a neighbour's shared slot without a barrier in between: the result depends
    // on the order threads run in, which the device does not promise.
    let m = load(
        r#"
extern "C" __global__ void racy(int* out) {
    __shared__ int s[64];
    s[threadIdx.x] = (int)threadIdx.x + 1;
    out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}
extern "C" __global__ void warp_racy(int* out) {
    __shared__ int s[64];
    s[threadIdx.x] = (int)threadIdx.x + 1;
    __syncwarp();
    out[threadIdx.x] = s[threadIdx.x ^ 1];
}
"#,
    );
    let run = |name: &str, sched: Schedule| {
        let mut out = [0i32; 64];
        let mut op = out.as_mut_ptr();
        with_settings(sched, 1, || {
            launch(&m.function(name).unwrap(), 1, 64, 0, &mut [arg(&mut op)]).unwrap()
        });
        out
    };
    // Fresh shared memory is not zero (nor what a previous block left) in forward order.
    let fwd = run("racy", Schedule::Forward);
    let rev = run("racy", Schedule::Reverse);
    assert_ne!(fwd, rev, "the missing barrier shows under some order");
    // Not yet written in forward order: the block's shared memory starts as 0xFF bytes.
    assert_eq!(fwd[0], -1);
    assert_eq!(rev[0], 2);
    let sync_fwd = run("warp_racy", Schedule::Forward);
    assert_eq!(sync_fwd, run("warp_racy", Schedule::Reverse));
}

#[test]
fn faults_in_kernels_are_launch_errors() {
    let m = load(
        r#"
extern "C" __global__ void wild_store(int* x) {
    if (threadIdx.x == 5) *(volatile int*)(unsigned long long)0x10 = 1;
    x[threadIdx.x] = 2;
}
__device__ __noinline__ int deep(int n) {
    volatile char buf[1024];
    buf[0] = (char)n;
    return n == 0 ? 0 : deep(n - 1) + buf[0];
}
extern "C" __global__ void recursion(int* x, int n) { x[threadIdx.x] = deep(n); }
"#,
    );
    let mut x = [0i32; 64];
    let mut xp = x.as_mut_ptr();
    let e = launch(
        &m.function("wild_store").unwrap(),
        2,
        32,
        0,
        &mut [arg(&mut xp)],
    )
    .unwrap_err();
    assert!(
        e.contains("thread (5, 0, 0)") && e.contains("invalid memory access at 0x10"),
        "{e}"
    );
    let rec = m.function("recursion").unwrap();
    let mut n = 10_000i32;
    let e = launch(&rec, 1, 32, 0, &mut [arg(&mut xp), arg(&mut n)]).unwrap_err();
    assert!(e.contains("stack overflow"), "{e}");
    // The same OS thread runs kernels as before.
    let mut n = 3i32;
    launch(&rec, 1, 32, 0, &mut [arg(&mut xp), arg(&mut n)]).unwrap();
    assert_eq!(x[0], 6);
}

#[test]
fn ptx_and_cubin_images_both_load() {
    let src = "extern \"C\" __global__ void k(int* x) { x[threadIdx.x] = 7; }\n";
    let cubin = compile(src, "k.cu", &["--gpu-architecture=sm_90"]).unwrap();
    assert_eq!(&cubin[..4], b"\x7fELF");
    // The PTX form: a text listing the target and the entries.
    let c = CString::new(src).unwrap();
    let mut prog: NvrtcProgram = ptr::null_mut();
    let opt = CString::new("--gpu-architecture=compute_90").unwrap();
    let ptx = unsafe {
        assert_eq!(
            nvrtcCreateProgram(
                &mut prog,
                c.as_ptr(),
                ptr::null(),
                0,
                ptr::null(),
                ptr::null()
            ),
            0
        );
        assert_eq!(nvrtcCompileProgram(prog, 1, &opt.as_ptr()), 0);
        let mut size = 0;
        assert_eq!(nvrtcGetPTXSize(prog, &mut size), 0);
        let mut ptx = vec![0u8; size];
        assert_eq!(nvrtcGetPTX(prog, ptx.as_mut_ptr().cast()), 0);
        assert_eq!(nvrtcDestroyProgram(&mut prog), 0);
        ptx
    };
    let text = String::from_utf8_lossy(&ptx[..ptx.len() - 1]).into_owned();
    assert!(
        text.contains(".target sm_90") && text.contains(".entry k("),
        "{text}"
    );
    for image in [cubin, ptx] {
        let m = unsafe { Module::load(image.as_ptr().cast()) }.unwrap();
        let mut x = [0i32; 4];
        let mut xp = x.as_mut_ptr();
        launch(&m.function("k").unwrap(), 1, 4, 0, &mut [arg(&mut xp)]).unwrap();
        assert_eq!(x, [7; 4]);
    }
}

#[test]
fn shared_declaration_forms_and_their_sizes() {
    let m = load(
        r#"
struct __align__(16) Foo { float a[4]; };
extern "C" __global__ void k(float* x) {
    __shared__ __align__(16) float s[8];
    __shared__ Foo f;
    volatile __shared__ int v[4];
    s[threadIdx.x] = x[0];
    f.a[threadIdx.x] = 1.0f;
    v[threadIdx.x] = 2;
    __syncthreads();
    x[threadIdx.x] = s[3 - threadIdx.x] + f.a[3 - threadIdx.x] + (float)v[3 - threadIdx.x];
}
"#,
    );
    let k = m.function("k").unwrap();
    assert_eq!(k.static_shared_bytes(), 32 + 16 + 16);
    let mut x = [5f32; 4];
    let mut xp = x.as_mut_ptr();
    launch(&k, 1, 4, 0, &mut [arg(&mut xp)]).unwrap();
    assert_eq!(x, [8.0; 4]);
}

#[test]
fn schedule_settings_parse() {
    assert!(matches!(Schedule::parse("").unwrap(), Schedule::Forward));
    assert!(matches!(
        Schedule::parse("reverse").unwrap(),
        Schedule::Reverse
    ));
    assert!(matches!(
        Schedule::parse("random:42").unwrap(),
        Schedule::Random(_)
    ));
    assert!(Schedule::parse("random:x").is_err());
    assert!(Schedule::parse("sideways").is_err());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let r = Schedule::parse("random:5").unwrap();
    r.order(100, &mut a);
    r.order(100, &mut b);
    assert_ne!(a, b, "each round draws a new order");
    a.sort_unstable();
    assert_eq!(a, (0..100).collect::<Vec<u32>>());
}

#[test]
fn module_and_kernel_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Module>();
    check::<Kernel>();
}
