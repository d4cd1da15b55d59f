// KV-cache stores and reads in the cache's element type (f32, bf16, FP8 with a
// power-of-two scale per row, `KvCacheDType::encode_fp8_row`).

#define SKIP_SLOT 0xFFFFFFFFFFFFFFFFull

// Row t (`width` values) of `rows` goes to slot slots[t] of an f32 or bf16 cache;
// SKIP_SLOT skips it (a token another DCP rank stores). Slots were checked on the host.
extern "C" __global__ void kv_write_rows(const float* rows, const u64* slots, void* cache, u64 n_tokens,
                                         u64 width, int dt) {
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < n_tokens * width; k += (u64)gridDim.x * blockDim.x) {
        u64 slot = slots[k / width];
        if (slot == SKIP_SLOT) {
            continue;
        }
        kv_store(cache, slot * width + k % width, rows[k], dt);
    }
}

// The same into an FP8 cache scaled per `row_len` values (`width` a multiple of it):
// one warp per scaled row finds the row's largest magnitude, stores its scale byte
// (`fp8_row_exponent`) and the codes of x / 2^e. The warp index is uniform across its
// lanes, so every lane reaches the shuffles.
extern "C" __global__ void kv_write_rows_fp8(const float* rows, const u64* slots, u8* cache, u8* scales,
                                             u64 n_tokens, u64 width, u64 row_len, int dt) {
    u32 lane = threadIdx.x & 31;
    u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    u64 per_token = width / row_len;
    int e5m2 = dt == KV_E5M2;
    for (u64 g = warp; g < n_tokens * per_token; g += warps) {
        u64 t = g / per_token;
        u64 slot = slots[t];
        if (slot == SKIP_SLOT) {
            continue;
        }
        const float* src = rows + t * width + (g % per_token) * row_len;
        float m = 0.0f;
        for (u64 i = lane; i < row_len; i += 32) {
            m = fmaxf(m, fabsf(src[i])); // fmaxf ignores NaN, as the host's f32::max
        }
        m = warp_max(m);
        u8 b = fp8_row_exponent(m, e5m2);
        float inv = pow2i(127 - (int)b);
        u64 dst_row = slot * per_token + g % per_token;
        for (u64 i = lane; i < row_len; i += 32) {
            cache[dst_row * row_len + i] = encode_fp8(src[i] * inv, e5m2);
        }
        if (lane == 0) {
            scales[dst_row] = b;
        }
    }
}

// Element k of the cache as f32 (FP8: code · its row's scale; `row_len` is 1 for the
// other types, whose `scales` are not read).
extern "C" __global__ void kv_to_f32(const void* cache, const u8* scales, float* out, u64 n, int dt,
                                     u64 row_len) {
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (u64)gridDim.x * blockDim.x) {
        float v = kv_load(cache, k, dt);
        out[k] = dt >= KV_E4M3 ? v * fp8_scale_value(scales[k / row_len]) : v;
    }
}
