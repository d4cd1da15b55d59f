// Shared device helpers, prepended to every other kernel source before NVRTC compiles it
// (NVRTC has no include path of its own here, and no CUDA headers are needed: bf16 and
// FP8 are converted with integer bit operations that mirror the host's
// `kv_dtype::f32_to_bf16` and `KvCacheDType::encode_fp8` exactly).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// KV-cache element types, numbered as `cuda::kv::dtype_code` numbers them.
#define KV_F32 0
#define KV_BF16 1
#define KV_E4M3 2
#define KV_E5M2 3

__device__ __forceinline__ float bf16_to_f32(u16 x) {
    return __uint_as_float(((u32)x) << 16);
}

// Round to nearest even; NaN stays a quiet NaN (as the host conversion).
__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u32 b = __float_as_uint(x);
    if (x != x) {
        return (u16)((b >> 16) | 0x40);
    }
    return (u16)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// 2^p for the exponents FP8 needs (normal f32 range).
__device__ __forceinline__ float pow2i(int p) {
    return __uint_as_float(((u32)(p + 127)) << 23);
}

// The FP8 code of x: nearest, ties to even, saturating, NaN kept (E4M3: m = 3, bias 7,
// max 448; E5M2: m = 2, bias 15, max 57344); the host's algorithm step by step.
__device__ __forceinline__ u8 encode_fp8(float x, int e5m2) {
    int m = e5m2 ? 2 : 3;
    int bias = e5m2 ? 15 : 7;
    float maxv = e5m2 ? 57344.0f : 448.0f;
    u8 sign = (u8)((__float_as_uint(x) >> 24) & 0x80u);
    float a = fabsf(x);
    if (a != a) {
        return sign | 0x7F;
    }
    a = fminf(a, maxv);
    int e = (int)((__float_as_uint(a) >> 23) & 0xFFu) - 127;
    if (e < 1 - bias) {
        e = 1 - bias;
    }
    float quantum = pow2i(e - m);
    int q = (int)rintf(a / quantum); // rintf rounds half to even
    return sign | (u8)(((e + bias - 1) << m) + q);
}

__device__ __forceinline__ float decode_fp8(u8 code, int e5m2) {
    int m = e5m2 ? 2 : 3;
    int bias = e5m2 ? 15 : 7;
    float sign = (code & 0x80) ? -1.0f : 1.0f;
    int exp_field = (code & 0x7F) >> m;
    float mant = (float)(code & ((1 << m) - 1));
    int max_field = (1 << (7 - m)) - 1;
    if (!e5m2 && (code & 0x7F) == 0x7F) {
        return __uint_as_float(0x7FC00000u);
    }
    if (e5m2 && exp_field == max_field) {
        return mant == 0.0f ? sign * __uint_as_float(0x7F800000u) : __uint_as_float(0x7FC00000u);
    }
    float v;
    if (exp_field == 0) {
        v = mant * pow2i(1 - bias - m);
    } else {
        v = (1.0f + mant / (float)(1 << m)) * pow2i(exp_field - bias);
    }
    return sign * v;
}

// The E8M0 byte e + 127 of an FP8 row's scale 2^e: the smallest e in [-126, 126] with
// max_abs ≤ the format's largest finite value · 2^e (`KvCacheDType::fp8_row_exponent`,
// the same exact comparisons).
__device__ __forceinline__ u8 fp8_row_exponent(float max_abs, int e5m2) {
    float maxv = e5m2 ? 57344.0f : 448.0f;
    float q = max_abs / maxv;
    if (__float_as_uint(q) == 0x7F800000u) {
        return (u8)(126 + 127); // +inf: not settled below (maxv · 2^e overflows there)
    }
    int e;
    if (q != q || q < pow2i(-126)) {
        e = -126;
    } else {
        u32 bits = __float_as_uint(q);
        e = (int)((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0u ? 1 : 0);
        e = max(-126, min(e, 126));
    }
    while (e < 126 && max_abs > maxv * pow2i(e)) {
        ++e;
    }
    while (e > -126 && max_abs <= maxv * pow2i(e - 1)) {
        --e;
    }
    return (u8)(e + 127);
}

// The value of an FP8 row's scale byte (0, never written, reads as 0).
__device__ __forceinline__ float fp8_scale_value(u8 b) {
    return __uint_as_float(((u32)b) << 23);
}

// Element i of a KV cache of type `dt`; FP8 unscaled (the caller multiplies by the
// row's scale).
__device__ __forceinline__ float kv_load(const void* base, u64 i, int dt) {
    switch (dt) {
    case KV_F32:
        return ((const float*)base)[i];
    case KV_BF16:
        return bf16_to_f32(((const u16*)base)[i]);
    case KV_E4M3:
        return decode_fp8(((const u8*)base)[i], 0);
    default:
        return decode_fp8(((const u8*)base)[i], 1);
    }
}

// Stores x at element i of an f32 or bf16 KV cache (FP8 rows are stored whole, with
// their scale: `kv_write_rows_fp8`).
__device__ __forceinline__ void kv_store(void* base, u64 i, float x, int dt) {
    if (dt == KV_F32) {
        ((float*)base)[i] = x;
    } else {
        ((u16*)base)[i] = f32_to_bf16(x);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    }
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v, float* shared32) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) {
        shared32[warp] = v;
    }
    __syncthreads();
    int nw = blockDim.x >> 5;
    float t = lane < nw ? shared32[lane] : 0.0f;
    return warp_sum(t);
}

// The merged log-sum-exp of shard LSEs (NaN skipped; -inf when all are empty) and a
// shard's weight in it, as `dcp::merge::{merged_lse, shard_weight}`.
#define NEG_INF (-__uint_as_float(0x7F800000u))

__device__ __forceinline__ bool is_neg_inf(float v) {
    return v == NEG_INF;
}

__device__ __forceinline__ float shard_weight(float lse_i, float merged) {
    if (lse_i != lse_i || is_neg_inf(lse_i) || is_neg_inf(merged)) {
        return 0.0f;
    }
    return expf(lse_i - merged);
}
