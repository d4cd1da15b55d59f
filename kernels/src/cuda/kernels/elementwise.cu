// Element-wise and row-wise ops on f32 buffers. Every kernel takes its element count
// and grid-strides, so any launch shape covers any length.

#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

extern "C" __global__ void fill_f32(float* x, u64 n, float value) {
    GRID_STRIDE(i, n) { x[i] = value; }
}

extern "C" __global__ void add_f32(float* a, const float* b, u64 n) {
    GRID_STRIDE(i, n) { a[i] += b[i]; }
}

extern "C" __global__ void add_bias_f32(float* x, const float* bias, u64 n, u64 width) {
    GRID_STRIDE(i, n) { x[i] += bias[i % width]; }
}

// out = silu(gate) · up with silu(g) = g / (1 + e^-g), as the CPU computes it.
extern "C" __global__ void silu_mul_f32(const float* gate, const float* up, float* out, u64 n) {
    GRID_STRIDE(i, n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

extern "C" __global__ void f32_to_bf16_kernel(const float* x, u16* out, u64 n) {
    GRID_STRIDE(i, n) { out[i] = f32_to_bf16(x[i]); }
}

// Row i's `width` values at src[i·ss + so ..] go to dst[i·ds + do_ ..].
extern "C" __global__ void copy_strided_f32(const float* src, u64 ss, u64 so, float* dst, u64 ds,
                                            u64 do_, u64 rows, u64 width) {
    GRID_STRIDE(i, rows * width) {
        u64 r = i / width, c = i % width;
        dst[r * ds + do_ + c] = src[r * ss + so + c];
    }
}

// Row j of dst is row rows[j] of src (indices checked on the host).
extern "C" __global__ void gather_rows_f32(const float* src, const u32* rows, float* dst, u64 n_rows,
                                           u64 width) {
    GRID_STRIDE(i, n_rows * width) {
        u64 j = i / width, c = i % width;
        dst[i] = src[(u64)rows[j] * width + c];
    }
}

// dst[rows[j]] += scales[j] · src[j], in order of j: one thread per column walks the
// rows sequentially, so repeated destination rows add up deterministically and in the
// CPU's order.
extern "C" __global__ void scatter_add_rows_f32(const float* src, const u32* rows, const float* scales,
                                                float* dst, u64 n_rows, u64 width) {
    GRID_STRIDE(c, width) {
        for (u64 j = 0; j < n_rows; ++j) {
            dst[(u64)rows[j] * width + c] += scales[j] * src[j * width + c];
        }
    }
}

// RMSNorm, one block per row: out = x / sqrt(mean(x²) + eps) · weight.
extern "C" __global__ void rms_norm_f32(const float* x, const float* weight, float* out, u64 d,
                                        float eps) {
    __shared__ float shared32[32];
    const float* xr = x + (u64)blockIdx.x * d;
    float* orow = out + (u64)blockIdx.x * d;
    float ss = 0.0f;
    for (u64 i = threadIdx.x; i < d; i += blockDim.x) {
        ss += xr[i] * xr[i];
    }
    ss = block_sum(ss, shared32);
    float s = 1.0f / sqrtf(ss / (float)d + eps);
    // In place (out == x) is safe: every read of the row happened before block_sum.
    for (u64 i = threadIdx.x; i < d; i += blockDim.x) {
        orow[i] = xr[i] * s * weight[i];
    }
}

// Index of the largest value of each `vocab`-wide row (lowest index on ties, NaN never
// wins, 0 when nothing beats -inf), one block per row.
extern "C" __global__ void argmax_f32(const float* logits, u64 vocab, u32* out) {
    __shared__ float best_v[1024];
    __shared__ u32 best_i[1024];
    const float* row = logits + (u64)blockIdx.x * vocab;
    float bv = NEG_INF;
    u32 bi = 0xFFFFFFFFu;
    for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = row[i];
        if (v > bv) {
            bv = v;
            bi = (u32)i;
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (u32 s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = best_v[threadIdx.x + s];
            u32 oi = best_i[threadIdx.x + s];
            float mv = best_v[threadIdx.x];
            u32 mi = best_i[threadIdx.x];
            if (oi != 0xFFFFFFFFu && (mi == 0xFFFFFFFFu || ov > mv || (ov == mv && oi < mi))) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = best_i[0] == 0xFFFFFFFFu ? 0u : best_i[0];
    }
}
