// out[m, n] = x[m, k] · wᵀ for bf16 weights with f32 activations, products and sums
// (Precision::Exact: the CPU's semantics). One warp per output feature, MT tokens per
// block row so each weight element is read once for MT tokens. Memory-bound decode
// shapes run near bandwidth; large prefill batches should use Precision::Fast (cuBLAS
// bf16 tensor cores).

#define MM_WARPS 8
#define MM_TOKENS 4

extern "C" __global__ void matmul_bf16_exact(const float* x, const u16* w, float* out, u32 m, u32 n, u32 k) {
    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 col = blockIdx.x * MM_WARPS + warp;
    u32 m0 = blockIdx.y * MM_TOKENS;
    if (col >= n) {
        return;
    }
    u32 mt = min((u32)MM_TOKENS, m - m0);
    const u16* wr = w + (u64)col * k;
    float acc[MM_TOKENS];
#pragma unroll
    for (int t = 0; t < MM_TOKENS; ++t) {
        acc[t] = 0.0f;
    }
    for (u32 j = lane; j < k; j += 32) {
        float wv = bf16_to_f32(wr[j]);
#pragma unroll
        for (int t = 0; t < MM_TOKENS; ++t) {
            if (t < mt) {
                acc[t] += x[(u64)(m0 + t) * k + j] * wv;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MM_TOKENS; ++t) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t < mt) {
            out[(u64)(m0 + t) * n + col] = s;
        }
    }
}
