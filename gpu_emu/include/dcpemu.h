// dcpemu.h: the CUDA device built-ins for kernels compiled by the emulated NVRTC with the
// host C++ compiler (force-included before every source). Every CUDA thread of a block
// runs as a fiber on one OS thread; the fiber's control block sits at the base of its
// 64 KiB-aligned stack, so `threadIdx` & co. are one mask of the stack pointer away.
// Barriers, warp shuffles and votes switch back to the block scheduler (Rust,
// `kernel_exec`), which releases a barrier once every participant has reached it.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <type_traits>
#include <utility>

// Bumped whenever the layout of `dcpemu_thread` or `dcpemu_kernel_info` changes; the
// loader refuses a module built against another layout.
#define DCPEMU_ABI_VERSION 3u
// Size and alignment of one fiber's stack slot (control block, guard page, stack).
#define DCPEMU_STACK_SLOT 65536u

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

// The fiber's control block (mirrored by `kernel_exec::fiber::ThreadAbi`).
struct dcpemu_thread {
    uint3 thread_idx;
    uint3 block_idx;
    uint3 block_dim;
    uint3 grid_dim;
    unsigned int lane;
    unsigned int warp_size;
    void* dyn_shared;
    void* runtime;
    void (*sync_block)(dcpemu_thread*);
    // A warp collective among the lanes of `mask`: op < 32 reads lane op's value
    // (shuffle), DCPEMU_OP_* below otherwise.
    unsigned long long (*warp_op)(dcpemu_thread*, unsigned int mask, unsigned long long value,
                                  unsigned int op);
    void (*fail)(dcpemu_thread*, const char* msg);
    unsigned int (*active_mask)(dcpemu_thread*);
    // __syncthreads that also counts the threads whose predicate is non-zero.
    unsigned int (*sync_block_count)(dcpemu_thread*, int pred);
};
#define DCPEMU_OP_BALLOT 32u
#define DCPEMU_OP_SYNCWARP 33u

// The control block sits in the slot's first page at a per-slot offset (a multiple of
// 64 bytes from the slot's address), so that the control blocks of a block's threads,
// 64 KiB apart, do not all fall into the same cache sets (`kernel_exec::fiber::color`).
static inline __attribute__((always_inline)) dcpemu_thread* dcpemu_self() {
    uintptr_t sp;
    __asm__("mov %%rsp, %0" : "=r"(sp));
    uintptr_t base = sp & ~(uintptr_t)(DCPEMU_STACK_SLOT - 1u);
    return (dcpemu_thread*)(base + (((base >> 16) & 31u) << 6));
}

// What the loader reads from each module (`dcpemu_kernels`, `dcpemu_kernel_count`).
struct dcpemu_kernel_info {
    const char* name;
    void (*entry)(void** params);
    unsigned int n_params;
    const unsigned int* param_sizes;
    const unsigned char* param_is_pointer;
    unsigned long long static_shared_bytes;
    unsigned int max_threads_per_block;
};

// ---- qualifiers -------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Static shared memory: one instance per OS thread, and every thread of a block runs
// on the same OS thread, one block at a time, so the block's threads share it.
// (`extern __shared__` is rewritten by the compile step into a `dcpemu::DynShared`.)
#define __shared__ static thread_local
#define warpSize 32

#define threadIdx (dcpemu_self()->thread_idx)
#define blockIdx (dcpemu_self()->block_idx)
#define blockDim (dcpemu_self()->block_dim)
#define gridDim (dcpemu_self()->grid_dim)

[[noreturn]] static inline void dcpemu_fail(const char* msg) {
    dcpemu_thread* t = dcpemu_self();
    t->fail(t, msg);
    __builtin_unreachable();
}
// A failed device assert (see the stand-in <assert.h>) fails the launch, as CUDA's
// "device-side assert triggered" does, instead of aborting the process.
[[noreturn]] static inline void dcpemu_assert_fail(const char* expr, const char* file, int line) {
    char msg[512];
    snprintf(msg, sizeof msg, "device-side assert triggered: %s (%s:%d)", expr, file, line);
    dcpemu_fail(msg);
}
#define __trap() dcpemu_fail("__trap() called")
#define __brkpt() dcpemu_fail("__brkpt() called")

namespace dcpemu {
// `extern __shared__ T name[];`: the launch's dynamic shared memory seen as T*.
template <typename T>
struct DynShared {
    T* get() const { return (T*)dcpemu_self()->dyn_shared; }
    operator T*() const { return get(); }
    template <typename U>
    explicit operator U*() const { return (U*)get(); }
    T& operator[](long long i) const { return get()[i]; }
    T* operator+(long long i) const { return get() + i; }
};
} // namespace dcpemu

// ---- barriers, warp collectives ------------------------------------------------------
static inline void __syncthreads() {
    dcpemu_thread* t = dcpemu_self();
    t->sync_block(t);
}
// Exited threads count as arrived with a zero predicate.
static inline int __syncthreads_count(int p) {
    dcpemu_thread* t = dcpemu_self();
    return (int)t->sync_block_count(t, p);
}
static inline int __syncthreads_or(int p) { return __syncthreads_count(p) != 0; }
static inline int __syncthreads_and(int p) {
    dcpemu_thread* t = dcpemu_self();
    return (int)t->sync_block_count(t, !p) == 0;
}
static inline void __syncwarp(unsigned int mask = 0xFFFFFFFFu) {
    dcpemu_thread* t = dcpemu_self();
    t->warp_op(t, mask, 0, DCPEMU_OP_SYNCWARP);
}
static inline unsigned int __activemask() {
    dcpemu_thread* t = dcpemu_self();
    return t->active_mask(t);
}
static inline unsigned int __ballot_sync(unsigned int mask, int pred) {
    dcpemu_thread* t = dcpemu_self();
    return (unsigned int)t->warp_op(t, mask, pred ? 1u : 0u, DCPEMU_OP_BALLOT);
}
static inline int __any_sync(unsigned int mask, int pred) { return __ballot_sync(mask, pred) != 0; }
// Every lane of `mask` takes part (the emulator refuses a mask naming absent lanes).
static inline int __all_sync(unsigned int mask, int pred) { return __ballot_sync(mask, pred) == mask; }
static inline unsigned int __lanemask_lt() { return (1u << dcpemu_self()->lane) - 1u; }

namespace dcpemu {
template <typename T>
static inline T shuffle_from(unsigned int mask, T v, int src) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "warp shuffles move values of at most 8 bytes");
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof(T));
    dcpemu_thread* t = dcpemu_self();
    bits = t->warp_op(t, mask, bits, (unsigned int)src);
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}
static inline void check_width(int width) {
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
        dcpemu_fail("warp shuffle width must be a power of two in 1..=32");
    }
}
} // namespace dcpemu

// The lane each shuffle reads, as the PTX `shfl.sync` modes define it (a source outside
// the lane's `width`-wide segment reads the lane's own value).
template <typename T>
static inline T __shfl_sync(unsigned int mask, T v, int src_lane, int width = 32) {
    dcpemu::check_width(width);
    int lane = (int)dcpemu_self()->lane;
    int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
    return dcpemu::shuffle_from(mask, v, src);
}
template <typename T>
static inline T __shfl_up_sync(unsigned int mask, T v, unsigned int delta, int width = 32) {
    dcpemu::check_width(width);
    int lane = (int)dcpemu_self()->lane;
    int src = lane - (int)delta;
    if (src < (lane & ~(width - 1))) src = lane;
    return dcpemu::shuffle_from(mask, v, src);
}
template <typename T>
static inline T __shfl_down_sync(unsigned int mask, T v, unsigned int delta, int width = 32) {
    dcpemu::check_width(width);
    int lane = (int)dcpemu_self()->lane;
    int src = lane + (int)delta;
    if (src >= (lane & ~(width - 1)) + width) src = lane;
    return dcpemu::shuffle_from(mask, v, src);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = 32) {
    dcpemu::check_width(width);
    int lane = (int)dcpemu_self()->lane;
    int src = lane ^ lane_mask;
    if (src >= (lane & ~(width - 1)) + width) src = lane;
    return dcpemu::shuffle_from(mask, v, src);
}

// ---- memory fences, atomics (relaxed, as the device's; blocks may run on several OS
// threads, so they are real atomics) -------------------------------------------------
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#define DCPEMU_INT_ATOMICS(T)                                                                      \
    static inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }   \
    static inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }   \
    static inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }   \
    static inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }     \
    static inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); }   \
    static inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicCAS(T* p, T cmp, T v) {                                                  \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);        \
        return cmp;                                                                                \
    }                                                                                              \
    static inline T atomicMin(T* p, T v) {                                                         \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                              \
        while (v < old && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED,         \
                                                       __ATOMIC_RELAXED)) {                        \
        }                                                                                          \
        return old;                                                                                \
    }                                                                                              \
    static inline T atomicMax(T* p, T v) {                                                         \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                              \
        while (v > old && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED,         \
                                                       __ATOMIC_RELAXED)) {                        \
        }                                                                                          \
        return old;                                                                                \
    }
DCPEMU_INT_ATOMICS(int)
DCPEMU_INT_ATOMICS(unsigned int)
DCPEMU_INT_ATOMICS(long long)
DCPEMU_INT_ATOMICS(unsigned long long)
#undef DCPEMU_INT_ATOMICS
static inline unsigned short atomicCAS(unsigned short* p, unsigned short cmp, unsigned short v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
// atomicInc/Dec wrap as the device's: ((old >= limit) ? 0 : old + 1).
static inline unsigned int atomicInc(unsigned int* p, unsigned int limit) {
    unsigned int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &old, old >= limit ? 0u : old + 1u, true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
static inline unsigned int atomicDec(unsigned int* p, unsigned int limit) {
    unsigned int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &old, (old == 0u || old > limit) ? limit : old - 1u,
                                        true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
namespace dcpemu {
// Floating-point atomics as compare-and-swap loops on the bits.
template <typename F, typename I, typename Op>
static inline F float_atomic(F* p, Op op) {
    I* ip = (I*)p;
    I old = __atomic_load_n(ip, __ATOMIC_RELAXED);
    for (;;) {
        F of;
        memcpy(&of, &old, sizeof(F));
        F nf = op(of);
        I ni;
        memcpy(&ni, &nf, sizeof(F));
        if (__atomic_compare_exchange_n(ip, &old, ni, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            return of;
        }
    }
}
} // namespace dcpemu
static inline float atomicAdd(float* p, float v) {
    return dcpemu::float_atomic<float, unsigned int>(p, [v](float o) { return o + v; });
}
static inline double atomicAdd(double* p, double v) {
    return dcpemu::float_atomic<double, unsigned long long>(p, [v](double o) { return o + v; });
}
static inline float atomicExch(float* p, float v) {
    return dcpemu::float_atomic<float, unsigned int>(p, [v](float) { return v; });
}
// The device's float atomicMax/Min (sm_90) order as fmaxf/fminf.
static inline float atomicMax(float* p, float v) {
    return dcpemu::float_atomic<float, unsigned int>(p, [v](float o) { return fmaxf(o, v); });
}
static inline float atomicMin(float* p, float v) {
    return dcpemu::float_atomic<float, unsigned int>(p, [v](float o) { return fminf(o, v); });
}

// ---- integer and float intrinsics ----------------------------------------------------
namespace dcpemu {
template <typename To, typename From>
static inline To bits(From f) {
    static_assert(sizeof(To) == sizeof(From), "bit cast of different sizes");
    To t;
    memcpy(&t, &f, sizeof(To));
    return t;
}
// A value the compiler may not fuse into a neighbouring multiply-add (the `_rn`
// intrinsics are never contracted on the device).
template <typename T>
static inline T opaque(T v) {
    __asm__("" : "+x"(v));
    return v;
}
} // namespace dcpemu
static inline float __int_as_float(int v) { return dcpemu::bits<float>(v); }
static inline int __float_as_int(float v) { return dcpemu::bits<int>(v); }
static inline float __uint_as_float(unsigned int v) { return dcpemu::bits<float>(v); }
static inline unsigned int __float_as_uint(float v) { return dcpemu::bits<unsigned int>(v); }
static inline double __longlong_as_double(long long v) { return dcpemu::bits<double>(v); }
static inline long long __double_as_longlong(double v) { return dcpemu::bits<long long>(v); }
static inline int __double2hiint(double v) { return (int)(dcpemu::bits<unsigned long long>(v) >> 32); }
static inline int __double2loint(double v) { return (int)dcpemu::bits<unsigned long long>(v); }

static inline int __popc(unsigned int v) { return __builtin_popcount(v); }
static inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
static inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned int)v); }
static inline int __clzll(long long v) { return v == 0 ? 64 : __builtin_clzll((unsigned long long)v); }
static inline int __ffs(int v) { return __builtin_ffs(v); }
static inline int __ffsll(long long v) { return __builtin_ffsll(v); }
static inline unsigned int __brev(unsigned int v) {
    v = ((v >> 1) & 0x55555555u) | ((v & 0x55555555u) << 1);
    v = ((v >> 2) & 0x33333333u) | ((v & 0x33333333u) << 2);
    v = ((v >> 4) & 0x0F0F0F0Fu) | ((v & 0x0F0F0F0Fu) << 4);
    return __builtin_bswap32(v);
}
static inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline int __mul24(int a, int b) { return ((a << 8) >> 8) * ((b << 8) >> 8); }
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned int r = 0;
    for (int i = 0; i < 4; ++i) {
        unsigned int sel = (s >> (4 * i)) & 7u;
        r |= (unsigned int)((v >> (8 * sel)) & 0xFFu) << (8 * i);
    }
    return r;
}

// min/max as CUDA's overloads (mixed signedness goes unsigned, as there).
#define DCPEMU_MINMAX(T)                                   \
    static inline T min(T a, T b) { return a < b ? a : b; } \
    static inline T max(T a, T b) { return a > b ? a : b; }
DCPEMU_MINMAX(int)
DCPEMU_MINMAX(unsigned int)
DCPEMU_MINMAX(long)
DCPEMU_MINMAX(unsigned long)
DCPEMU_MINMAX(long long)
DCPEMU_MINMAX(unsigned long long)
#undef DCPEMU_MINMAX
static inline unsigned int min(int a, unsigned int b) { return min((unsigned int)a, b); }
static inline unsigned int min(unsigned int a, int b) { return min(a, (unsigned int)b); }
static inline unsigned int max(int a, unsigned int b) { return max((unsigned int)a, b); }
static inline unsigned int max(unsigned int a, int b) { return max(a, (unsigned int)b); }
static inline unsigned long long min(long long a, unsigned long long b) { return min((unsigned long long)a, b); }
static inline unsigned long long min(unsigned long long a, long long b) { return min(a, (unsigned long long)b); }
static inline unsigned long long max(long long a, unsigned long long b) { return max((unsigned long long)a, b); }
static inline unsigned long long max(unsigned long long a, long long b) { return max(a, (unsigned long long)b); }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

// Fast-math intrinsics: the device's are approximations; here they are the libm
// functions (closer to exact than the device, so tolerances written for the device hold).
#define __expf(x) expf(x)
#define __exp10f(x) exp10f(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __log10f(x) log10f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(x, y) powf(x, y)
#define __sincosf(x, s, c) sincosf(x, s, c)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
static inline float __saturatef(float x) { return x != x ? 0.0f : fminf(fmaxf(x, 0.0f), 1.0f); }
static inline float saturatef(float x) { return __saturatef(x); }
static inline void sincospif(float x, float* s, float* c) {
    *s = sinf((float)M_PI * x);
    *c = cosf((float)M_PI * x);
}
static inline float __fadd_rn(float a, float b) { return dcpemu::opaque(a + b); }
static inline float __fsub_rn(float a, float b) { return dcpemu::opaque(a - b); }
static inline float __fmul_rn(float a, float b) { return dcpemu::opaque(a * b); }
static inline float __fdiv_rn(float a, float b) { return dcpemu::opaque(a / b); }
static inline float __frcp_rn(float a) { return dcpemu::opaque(1.0f / a); }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return dcpemu::opaque(a + b); }
static inline double __dmul_rn(double a, double b) { return dcpemu::opaque(a * b); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline int __float2int_rn(float x) { return (int)rintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float2int_ru(float x) { return (int)ceilf(x); }
static inline unsigned int __float2uint_rn(float x) { return (unsigned int)rintf(x); }
static inline unsigned int __float2uint_rz(float x) { return (unsigned int)x; }
static inline long long __float2ll_rn(float x) { return (long long)rintf(x); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __uint2float_rn(unsigned int x) { return (float)x; }
static inline float __ll2float_rn(long long x) { return (float)x; }
static inline int __double2int_rn(double x) { return (int)rint(x); }
static inline float __double2float_rn(double x) { return (float)x; }

static inline long long clock64() { return (long long)__builtin_ia32_rdtsc(); }
static inline void __nanosleep(unsigned int) {}

template <typename T>
static inline T __ldg(const T* p) { return *p; }
template <typename T>
static inline T __ldcg(const T* p) { return *p; }
template <typename T>
static inline T __ldcs(const T* p) { return *p; }
template <typename T>
static inline void __stcg(T* p, T v) { *p = v; }
template <typename T>
static inline void __stcs(T* p, T v) { *p = v; }

#include "dcpemu_vector.h"

// ---- trampolines: `void** params` unpacked into the kernel's typed parameters ---------
namespace dcpemu {
template <typename... A, size_t... I>
static inline void call_with(void (*f)(A...), void** p, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(p[I])...);
}
template <typename... A>
static inline void invoke(void (*f)(A...), void** p) {
    call_with(f, p, std::index_sequence_for<A...>{});
}
template <typename... A>
struct Signature {
    static constexpr unsigned int count = sizeof...(A);
    static constexpr unsigned int sizes[sizeof...(A) + 1] = {(unsigned int)sizeof(A)..., 0u};
    static constexpr unsigned char pointers[sizeof...(A) + 1] = {
        (unsigned char)std::is_pointer<A>::value..., 0};
};
template <typename... A>
Signature<A...> signature_of(void (*)(A...));
} // namespace dcpemu
