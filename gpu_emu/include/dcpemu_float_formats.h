// bf16, fp16 and fp8 (E4M3, E5M2) as the device converts them: round to nearest even,
// NaN to the canonical NaN, fp8 saturating to the largest finite value under
// __NV_SATFINITE. Included by the stand-ins for <cuda_bf16.h>, <cuda_fp16.h> and
// <cuda_fp8.h> (as with NVRTC, a kernel sees these types only after including them).
#pragma once

namespace dcpemu {
static inline unsigned short f32_to_bf16_bits(float f) {
    unsigned int u = bits<unsigned int>(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static inline float bf16_bits_to_f32(unsigned short b) { return bits<float>((unsigned int)b << 16); }
static inline unsigned short f32_to_f16_bits(float f) {
    if (f != f) return 0x7FFFu;
    return bits<unsigned short>((_Float16)f);
}
static inline float f16_bits_to_f32(unsigned short h) { return (float)bits<_Float16>(h); }

// One fp8 format: mantissa bits, exponent bias, the largest finite code, and what an
// overflow and a NaN become without saturation.
struct Fp8Format {
    int m, bias;
    unsigned char max_code, overflow_code, nan_code;
    double max_value;
};
static constexpr Fp8Format E4M3 = {3, 7, 0x7E, 0x7F, 0x7F, 448.0};
static constexpr Fp8Format E5M2 = {2, 15, 0x7B, 0x7C, 0x7E, 57344.0};

// Nearest code, ties to even (exact: x / quantum is a power-of-two scaling in double).
static inline unsigned char encode_fp8(double x, const Fp8Format& f, bool satfinite) {
    unsigned char sign = (bits<unsigned long long>(x) >> 56) & 0x80u;
    double a = fabs(x);
    if (a != a) return f.nan_code;
    if (a > f.max_value) return sign | (satfinite ? f.max_code : f.overflow_code);
    int e;
    frexp(a, &e); // a = frac · 2^e, frac in [0.5, 1)
    e -= 1;       // a in [2^e, 2^(e+1))
    if (a == 0.0 || e < 1 - f.bias) e = 1 - f.bias;
    double q = rint(ldexp(a, f.m - e));
    return sign | (unsigned char)(((e + f.bias - 1) << f.m) + (int)q);
}
static inline float decode_fp8(unsigned char code, const Fp8Format& f) {
    float sign = (code & 0x80u) ? -1.0f : 1.0f;
    int mag = code & 0x7F;
    int exp_field = mag >> f.m, mant = mag & ((1 << f.m) - 1);
    if (f.m == 3 && mag == 0x7F) return bits<float>(0x7FC00000u);
    if (f.m == 2 && exp_field == 31) return mant == 0 ? sign * bits<float>(0x7F800000u) : bits<float>(0x7FC00000u);
    if (exp_field == 0) return sign * ldexpf((float)mant, 1 - f.bias - f.m);
    return sign * ldexpf((float)((1 << f.m) + mant), exp_field - f.bias - f.m);
}
} // namespace dcpemu

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(dcpemu::f32_to_bf16_bits(f)) {}
    __nv_bfloat16(double d) : __x(dcpemu::f32_to_bf16_bits((float)d)) {}
    __nv_bfloat16(int i) : __x(dcpemu::f32_to_bf16_bits((float)i)) {}
    operator float() const { return dcpemu::bf16_bits_to_f32(__x); }
};
typedef __nv_bfloat16 nv_bfloat16;
struct __attribute__((aligned(4))) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
typedef __nv_bfloat162 nv_bfloat162;
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) {
    __nv_bfloat16 r;
    r.__x = b;
    return r;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) {
    unsigned int u = __float_as_uint(f);
    return __ushort_as_bfloat16((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FFFu : (unsigned short)(u >> 16));
}
static inline float __bfloat162float(__nv_bfloat16 b) { return (float)b; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }
static inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return {__nv_bfloat16(v.x), __nv_bfloat16(v.y)}; }
static inline float2 __bfloat1622float2(__nv_bfloat162 v) { return make_float2((float)v.x, (float)v.y); }
static inline float __low2float(__nv_bfloat162 v) { return (float)v.x; }
static inline float __high2float(__nv_bfloat162 v) { return (float)v.y; }
// Arithmetic as the device's: the exact result rounded once to bf16 (a product of two
// bf16 values is exact in f32; a sum is too unless the exponents differ by more than 16,
// and then the f32 rounding cannot move the bf16 result).
static inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a + (float)b); }
static inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a - (float)b); }
static inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a * (float)b); }
static inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return __ushort_as_bfloat16(a.__x ^ 0x8000u); }

struct __half {
    unsigned short __x;
    __half() = default;
    __half(float f) : __x(dcpemu::f32_to_f16_bits(f)) {}
    __half(double d) : __x(dcpemu::f32_to_f16_bits((float)d)) {}
    operator float() const { return dcpemu::f16_bits_to_f32(__x); }
};
struct __attribute__((aligned(4))) __half2 {
    __half x, y;
};
struct __half_raw {
    unsigned short x;
};
static inline __half __float2half(float f) { return __half(f); }
static inline __half __float2half_rn(float f) { return __half(f); }
static inline float __half2float(__half h) { return (float)h; }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __ushort_as_half(unsigned short b) {
    __half r;
    r.__x = b;
    return r;
}

typedef unsigned char __nv_fp8_storage_t;
typedef unsigned short __nv_fp8x2_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
static inline const dcpemu::Fp8Format& dcpemu_fp8_format(__nv_fp8_interpretation_t i) {
    return i == __NV_E4M3 ? dcpemu::E4M3 : dcpemu::E5M2;
}
static inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t s, __nv_fp8_interpretation_t i) {
    return dcpemu::encode_fp8((double)x, dcpemu_fp8_format(i), s == __NV_SATFINITE);
}
static inline __nv_fp8_storage_t __nv_cvt_double_to_fp8(double x, __nv_saturation_t s, __nv_fp8_interpretation_t i) {
    return dcpemu::encode_fp8(x, dcpemu_fp8_format(i), s == __NV_SATFINITE);
}
static inline __nv_fp8x2_storage_t __nv_cvt_float2_to_fp8x2(float2 v, __nv_saturation_t s, __nv_fp8_interpretation_t i) {
    return (unsigned short)(__nv_cvt_float_to_fp8(v.x, s, i) | (__nv_cvt_float_to_fp8(v.y, s, i) << 8));
}
static inline __nv_fp8_storage_t __nv_cvt_bfloat16raw_to_fp8(__nv_bfloat16 x, __nv_saturation_t s, __nv_fp8_interpretation_t i) {
    return __nv_cvt_float_to_fp8((float)x, s, i);
}
static inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t x, __nv_fp8_interpretation_t i) {
    // Every fp8 value is exact in fp16.
    return __half_raw{dcpemu::f32_to_f16_bits(dcpemu::decode_fp8(x, dcpemu_fp8_format(i)))};
}

// The fp8 classes convert with __NV_SATFINITE, as cuda_fp8.hpp's constructors do.
template <__nv_fp8_interpretation_t I>
struct dcpemu_fp8 {
    __nv_fp8_storage_t __x;
    dcpemu_fp8() = default;
    dcpemu_fp8(float f) : __x(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, I)) {}
    dcpemu_fp8(double d) : __x(__nv_cvt_double_to_fp8(d, __NV_SATFINITE, I)) {}
    dcpemu_fp8(__nv_bfloat16 b) : __x(__nv_cvt_float_to_fp8((float)b, __NV_SATFINITE, I)) {}
    dcpemu_fp8(__half h) : __x(__nv_cvt_float_to_fp8((float)h, __NV_SATFINITE, I)) {}
    operator float() const { return dcpemu::decode_fp8(__x, dcpemu_fp8_format(I)); }
};
typedef dcpemu_fp8<__NV_E4M3> __nv_fp8_e4m3;
typedef dcpemu_fp8<__NV_E5M2> __nv_fp8_e5m2;
