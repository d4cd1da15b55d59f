// KV-cache stores and reads in the cache's element type (f32, bf16, FP8 with a scale).

#define SKIP_SLOT 0xFFFFFFFFFFFFFFFFull

// Row t (`width` values) of `rows` goes to slot slots[t] of the cache; SKIP_SLOT skips
// it (a token another DCP rank stores). Slots were checked on the host.
extern "C" __global__ void kv_write_rows(const float* rows, const u64* slots, void* cache, u64 n_tokens,
                                         u64 width, int dt, float inv_scale) {
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < n_tokens * width; k += (u64)gridDim.x * blockDim.x) {
        u64 slot = slots[k / width];
        if (slot == SKIP_SLOT) {
            continue;
        }
        kv_store(cache, slot * width + k % width, rows[k], dt, inv_scale);
    }
}

extern "C" __global__ void kv_to_f32(const void* cache, float* out, u64 n, int dt, float scale) {
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (u64)gridDim.x * blockDim.x) {
        out[k] = kv_load(cache, k, dt, scale);
    }
}
