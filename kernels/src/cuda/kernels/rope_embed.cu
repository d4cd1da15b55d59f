// RoPE from the host-built tables (incl. YaRN's attention factor), and embedding
// gathers from f32 or bf16 tables.

// (sin, cos) of pos · inv_freq, the product rounded to f32 and the functions taken in
// f64, like the host's `ops::angle`, for positions beyond the precomputed table.
__device__ __forceinline__ void rope_angle(u32 pos, float inv_freq, float* s, float* c) {
    float a = (float)pos * inv_freq;
    double sd, cd;
    sincos((double)a, &sd, &cd);
    *s = (float)sd;
    *c = (float)cd;
}

// x is [n_tokens, rows_per_token · stride]; the head_dim-wide vector at `offset` of each
// stride-wide row is rotated by its token's position. One thread per rotated pair.
extern "C" __global__ void rope_f32(float* x, const u32* positions, u64 n_tokens, u64 rows_per_token,
                                    u64 stride, u64 offset, u32 half, int interleaved,
                                    const float* cos_t, const float* sin_t, const float* inv_freq,
                                    u32 max_positions, float attention_factor) {
    u64 total = n_tokens * rows_per_token * half;
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (u64)gridDim.x * blockDim.x) {
        u64 i = k % half;
        u64 r = k / half; // row over all tokens
        u64 t = r / rows_per_token;
        u32 pos = positions[t];
        float c, s;
        if (pos < max_positions) {
            c = cos_t[(u64)pos * half + i];
            s = sin_t[(u64)pos * half + i];
        } else {
            rope_angle(pos, inv_freq[i], &s, &c);
            c *= attention_factor;
            s *= attention_factor;
        }
        float* v = x + r * stride + offset;
        u64 a = interleaved ? 2 * i : i;
        u64 b = interleaved ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x1 * c + x0 * s;
    }
}

extern "C" __global__ void embed_f32(const float* table, const u32* ids, float* out, u64 n_ids, u64 cols) {
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < n_ids * cols; k += (u64)gridDim.x * blockDim.x) {
        out[k] = table[(u64)ids[k / cols] * cols + k % cols];
    }
}

extern "C" __global__ void embed_bf16(const u16* table, const u32* ids, float* out, u64 n_ids, u64 cols) {
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < n_ids * cols; k += (u64)gridDim.x * blockDim.x) {
        out[k] = bf16_to_f32(table[(u64)ids[k / cols] * cols + k % cols]);
    }
}
