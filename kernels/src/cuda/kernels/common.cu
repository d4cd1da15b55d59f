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

// Element i of a KV cache of type `dt` (FP8: code · scale).
__device__ __forceinline__ float kv_load(const void* base, u64 i, int dt, float scale) {
    switch (dt) {
    case KV_F32:
        return ((const float*)base)[i];
    case KV_BF16:
        return bf16_to_f32(((const u16*)base)[i]);
    case KV_E4M3:
        return decode_fp8(((const u8*)base)[i], 0) * scale;
    default:
        return decode_fp8(((const u8*)base)[i], 1) * scale;
    }
}

// Stores x at element i of a KV cache of type `dt` (FP8: x / scale, as the host).
__device__ __forceinline__ void kv_store(void* base, u64 i, float x, int dt, float inv_scale) {
    switch (dt) {
    case KV_F32:
        ((float*)base)[i] = x;
        break;
    case KV_BF16:
        ((u16*)base)[i] = f32_to_bf16(x);
        break;
    case KV_E4M3:
        ((u8*)base)[i] = encode_fp8(x * inv_scale, 0);
        break;
    default:
        ((u8*)base)[i] = encode_fp8(x * inv_scale, 1);
        break;
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
