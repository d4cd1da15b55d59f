// out[m, n] = x[m, k] · wᵀ for bf16 weights with f32 activations, products and sums
// (Precision::Exact: the CPU's semantics). One warp per output feature, MT tokens per
// block row so each weight element is read once for MT tokens. Memory-bound decode
// shapes run near bandwidth; large prefill batches should use Precision::Fast (cuBLAS
// bf16 tensor cores).

#define MM_WARPS 8
#define MM_TOKENS 4

// `vec` (set by the host when k % 8 == 0 and x is 16-byte aligned): each lane loads 8
// weights (16 bytes) and 8 activations per step instead of one, so a warp moves 512
// bytes of weights per load instead of 64.
extern "C" __global__ void matmul_bf16_exact(const float* x, const u16* w, float* out, u32 m, u32 n, u32 k,
                                             int vec) {
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
    if (vec) {
        const uint4* w8 = (const uint4*)wr;
        for (u32 j = lane; j < (k >> 3); j += 32) {
            uint4 p = w8[j];
            // Little endian: the low half of each word is the even element.
            float wv[8] = {
                __uint_as_float(p.x << 16), __uint_as_float(p.x & 0xFFFF0000u),
                __uint_as_float(p.y << 16), __uint_as_float(p.y & 0xFFFF0000u),
                __uint_as_float(p.z << 16), __uint_as_float(p.z & 0xFFFF0000u),
                __uint_as_float(p.w << 16), __uint_as_float(p.w & 0xFFFF0000u),
            };
#pragma unroll
            for (int t = 0; t < MM_TOKENS; ++t) {
                if (t < mt) {
                    const float4* x4 = (const float4*)(x + (u64)(m0 + t) * k) + 2 * (u64)j;
                    float4 a = x4[0], b = x4[1];
                    acc[t] += a.x * wv[0] + a.y * wv[1] + a.z * wv[2] + a.w * wv[3] + b.x * wv[4] +
                              b.y * wv[5] + b.z * wv[6] + b.w * wv[7];
                }
            }
        }
    } else {
        for (u32 j = lane; j < k; j += 32) {
            float wv = bf16_to_f32(wr[j]);
#pragma unroll
            for (int t = 0; t < MM_TOKENS; ++t) {
                if (t < mt) {
                    acc[t] += x[(u64)(m0 + t) * k + j] * wv;
                }
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
