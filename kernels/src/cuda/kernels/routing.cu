// Mixture-of-experts routing on the device, one block per token, step for step as the
// host's `moe_routing::route_experts`: scores (sigmoid, or a softmax whose max and sum
// are taken serially in the host's order), the correction bias added for choosing only,
// the group-limited choice, top-k in `f32::total_cmp` order with the lower index first
// on ties, and the weights' renormalisation and scaling. Only the choice's orderings
// are parallel; every sum is serial so it rounds as the host's does.

// The shared arrays' size; the host routes wider rows itself (`cuda::routing`).
#define ROUTE_MAX_EXPERTS 1024

// Rust's `f32::total_cmp` as an integer order: negative values have their magnitude
// bits flipped, so -NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN.
__device__ __forceinline__ int total_key(float v) {
    int b = __float_as_int(v);
    return b ^ (int)(((u32)(b >> 31)) >> 1);
}

// Whether value key `ka` at index `ia` ranks before `kb` at `ib`: larger value first,
// lower index on ties (the host's sort by value, then by index).
__device__ __forceinline__ bool ranks_before(int ka, u32 ia, int kb, u32 ib) {
    return ka > kb || (ka == kb && ia < ib);
}

// Warp 0 picks the `k` best of vals[0..n) (k <= n) one at a time, best first: marks each
// in `taken` (zeroed by the caller) and, when `out` is not null, writes its index to
// out[r]. Every lane of warp 0 must call it, and only warp 0.
__device__ void warp_top_k(const float* vals, u8* taken, u32 n, u32 k, u32* out) {
    u32 lane = threadIdx.x & 31;
    for (u32 r = 0; r < k; ++r) {
        // An empty lane holds the lowest key at an index no element has, so any real
        // candidate (even one of key INT_MIN) ranks before it.
        int bk = (int)0x80000000;
        u32 bi = 0xFFFFFFFFu;
        for (u32 i = lane; i < n; i += 32) {
            int key = total_key(vals[i]);
            if (!taken[i] && ranks_before(key, i, bk, bi)) {
                bk = key;
                bi = i;
            }
        }
        // (key, index) pairs are distinct, so the butterfly leaves every lane the same best.
        for (int o = 16; o > 0; o >>= 1) {
            int ok = __shfl_xor_sync(0xFFFFFFFFu, bk, o);
            u32 oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
            if (ranks_before(ok, oi, bk, bi)) {
                bk = ok;
                bi = oi;
            }
        }
        if (lane == 0) {
            taken[bi] = 1;
            if (out != nullptr) {
                out[r] = bi;
            }
        }
        // Lane 0's mark must be seen by every lane's next scan.
        __syncwarp();
    }
}

// Routes token blockIdx.x: logits[t·n_experts ..] → k expert ids (best first) at
// out_ids[t·k ..] and their weights at out_w[t·k ..]. `bias` is read only when
// `has_bias`; `n_group` is 1 unless `grouped`, and then divides n_experts; k <=
// n_experts <= ROUTE_MAX_EXPERTS and topk_group <= n_group (all checked on the host).
// Launch with a multiple of 32 threads, at least 32.
extern "C" __global__ void route_experts_f32(const float* logits, const float* bias, int has_bias,
                                             u32 n_experts, u32 k, u32 n_group, u32 topk_group,
                                             int grouped, int sigmoid, int norm, float scaling,
                                             u32* out_ids, float* out_w) {
    __shared__ float scores[ROUTE_MAX_EXPERTS]; // unbiased: the weights
    __shared__ float choice[ROUTE_MAX_EXPERTS]; // biased, masked: the choice
    __shared__ u8 taken[ROUTE_MAX_EXPERTS];
    __shared__ float group_score[ROUTE_MAX_EXPERTS];
    __shared__ u8 group_kept[ROUTE_MAX_EXPERTS];
    __shared__ float softmax_max, softmax_sum;
    const float* row = logits + (u64)blockIdx.x * n_experts;
    u32 tid = threadIdx.x;

    if (sigmoid) {
        for (u32 i = tid; i < n_experts; i += blockDim.x) {
            scores[i] = 1.0f / (1.0f + expf(-row[i]));
        }
    } else {
        if (tid == 0) {
            // fmaxf skips NaN as f32::max does; the host folds from -inf the same way.
            float mx = NEG_INF;
            for (u32 i = 0; i < n_experts; ++i) {
                mx = fmaxf(mx, row[i]);
            }
            softmax_max = mx;
        }
        __syncthreads();
        for (u32 i = tid; i < n_experts; i += blockDim.x) {
            scores[i] = expf(row[i] - softmax_max);
        }
        __syncthreads();
        if (tid == 0) {
            // Rust's f32 `sum` folds from -0.0, in index order.
            float s = -0.0f;
            for (u32 i = 0; i < n_experts; ++i) {
                s += scores[i];
            }
            softmax_sum = s;
        }
        __syncthreads();
        for (u32 i = tid; i < n_experts; i += blockDim.x) {
            scores[i] = scores[i] / softmax_sum;
        }
    }
    __syncthreads();
    for (u32 i = tid; i < n_experts; i += blockDim.x) {
        choice[i] = has_bias ? scores[i] + bias[i] : scores[i];
        taken[i] = 0;
    }
    __syncthreads();

    if (grouped) {
        u32 per_group = n_experts / n_group;
        for (u32 g = tid; g < n_group; g += blockDim.x) {
            const float* v = choice + g * per_group;
            float gs;
            if (sigmoid) {
                // The sum of the group's top 2 (one when the group has one expert),
                // folded from -0.0 as Rust's `sum`.
                int k1 = (int)0x80000000, k2 = (int)0x80000000;
                u32 i1 = 0xFFFFFFFFu, i2 = 0xFFFFFFFFu;
                for (u32 j = 0; j < per_group; ++j) {
                    int key = total_key(v[j]);
                    if (ranks_before(key, j, k1, i1)) {
                        k2 = k1;
                        i2 = i1;
                        k1 = key;
                        i1 = j;
                    } else if (ranks_before(key, j, k2, i2)) {
                        k2 = key;
                        i2 = j;
                    }
                }
                gs = -0.0f + v[i1];
                if (per_group > 1) {
                    gs += v[i2];
                }
            } else {
                gs = NEG_INF;
                for (u32 j = 0; j < per_group; ++j) {
                    gs = fmaxf(gs, v[j]);
                }
            }
            group_score[g] = gs;
            group_kept[g] = 0;
        }
        __syncthreads();
        if (tid < 32) {
            warp_top_k(group_score, group_kept, n_group, topk_group, nullptr);
        }
        __syncthreads();
        for (u32 i = tid; i < n_experts; i += blockDim.x) {
            if (!group_kept[i / per_group]) {
                choice[i] = NEG_INF;
            }
        }
        __syncthreads();
    }

    if (tid < 32) {
        u32* ids = out_ids + (u64)blockIdx.x * k;
        float* w = out_w + (u64)blockIdx.x * k;
        warp_top_k(choice, taken, n_experts, k, ids);
        if (tid == 0) {
            // Lane 0 wrote `ids` itself. Sum (from -0.0, in choice order), add 1e-20,
            // divide, then scale: the host's roundings one by one.
            float s = -0.0f;
            for (u32 j = 0; j < k; ++j) {
                s += scores[ids[j]];
            }
            float denom = s + 1e-20f;
            for (u32 j = 0; j < k; ++j) {
                float v = scores[ids[j]];
                if (norm) {
                    v = v / denom;
                }
                w[j] = v * scaling;
            }
        }
    }
}
