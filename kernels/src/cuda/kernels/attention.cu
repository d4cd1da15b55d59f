// Paged attention returning output and log-sum-exp, for GQA (K and V caches, one KV
// head per `heads_per_kv` query heads) and for MLA's latent cache (one KV head whose
// value is the `dv`-wide prefix of the key row: pass the cache as both K and V).
//
// Flash-decoding: grid (query rows, splits). Block (row, s) attends to keys
// [s·chunk, (s+1)·chunk) of its token (clamped to the token's kv length, which carries
// the causal mask); inside a block each warp takes every ATT_WARPS-th key with its own
// online softmax, lanes splitting the head dimension, and the warps merge by LSE in
// shared memory. With one split the block writes the final row; otherwise the splits'
// partials are merged by `merge_lse_f32` (second pass).
//
// FP8 caches are scaled per row of `d` values (one KV head of one slot, or one latent
// row): key j's row scale multiplies its dot product, and its value row's scale the
// softmax weight, instead of every element.

#define ATT_WARPS 4
// Head dims up to 32 · ATT_PER_LANE = 640 (MLA's 576-wide latent rows included).
#define ATT_PER_LANE 20

extern "C" __global__ void attention_partial(
    const float* q, const void* kc, const void* vc, const u8* k_scales, const u8* v_scales, int dt,
    u64 kv_row_stride,
    const u32* token_seq, const u32* token_kv_len, const u32* bt_flat, const u64* bt_offsets,
    u32 n_heads, u32 heads_per_kv, u32 d, u32 dv, u32 block_size, float scale, u32 chunk,
    float* out, float* lse, u64 split_rows) {
    __shared__ float sm_m[ATT_WARPS];
    __shared__ float sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][32 * ATT_PER_LANE];

    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 row = blockIdx.x;
    u32 t = (u32)(row / n_heads), h = (u32)(row % n_heads);
    u32 split = blockIdx.y;
    u32 len = token_kv_len[t];
    u32 start = min(split * chunk, len);
    u32 end = min(start + chunk, len);
    const u32* bt = bt_flat + bt_offsets[token_seq[t]];
    u64 head_off = (u64)(h / heads_per_kv) * d;
    const float* qh = q + row * d;

    float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; ++i) {
        u32 e = lane + 32 * i;
        qr[i] = e < d ? qh[e] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (u32 j = start + warp; j < end; j += ATT_WARPS) {
        u64 slot = (u64)bt[j / block_size] * block_size + j % block_size;
        u64 base = slot * kv_row_stride + head_off;
        int fp8 = dt >= KV_E4M3;
        float ks = fp8 ? fp8_scale_value(k_scales[base / d]) : 1.0f;
        float vs = fp8 ? fp8_scale_value(v_scales[base / d]) : 1.0f;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; ++i) {
            u32 e = lane + 32 * i;
            if (e < d) {
                s += qr[i] * kv_load(kc, base + e, dt);
            }
        }
        s = warp_sum(s) * ks * scale;
        float m_new = fmaxf(m, s);
        float alpha = is_neg_inf(m) ? 0.0f : expf(m - m_new);
        float p = expf(s - m_new);
        l = l * alpha + p;
        float pv = p * vs;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; ++i) {
            u32 e = lane + 32 * i;
            if (e < dv) {
                acc[i] = acc[i] * alpha + pv * kv_load(vc, base + e, dt);
            }
        }
        m = m_new;
    }
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; ++i) {
        sm_acc[warp][lane + 32 * i] = acc[i];
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < ATT_WARPS; ++w) {
        mx = fmaxf(mx, sm_m[w]);
    }
    float wt[ATT_WARPS];
    float total = 0.0f;
    for (int w = 0; w < ATT_WARPS; ++w) {
        wt[w] = is_neg_inf(sm_m[w]) ? 0.0f : expf(sm_m[w] - mx);
        total += sm_l[w] * wt[w];
    }
    u64 out_row = (u64)split * split_rows + row;
    for (u32 e = threadIdx.x; e < dv; e += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w) {
            o += sm_acc[w][e] * wt[w];
        }
        out[out_row * dv + e] = total > 0.0f ? o / total : 0.0f;
    }
    if (threadIdx.x == 0) {
        lse[out_row] = total > 0.0f ? mx + logf(total) : NEG_INF;
    }
}

// The merged log-sum-exp of `parts` shard LSEs at `lse_ptrs[p][row]` (NaN skipped).
__device__ __forceinline__ float merged_lse(const u64* lse_ptrs, u32 parts, u64 row) {
    float m = NEG_INF;
    for (u32 p = 0; p < parts; ++p) {
        float v = ((const float*)lse_ptrs[p])[row];
        if (v == v) {
            m = fmaxf(m, v);
        }
    }
    if (is_neg_inf(m)) {
        return m;
    }
    float sum = 0.0f;
    for (u32 p = 0; p < parts; ++p) {
        float v = ((const float*)lse_ptrs[p])[row];
        if (v == v) {
            sum += expf(v - m);
        }
    }
    return m + logf(sum);
}

// Merges attention partials over disjoint KV shards (`dcp::merge::merge_partials`): one
// block per row; part p's row is at out_ptrs[p] + row·hd with LSE lse_ptrs[p][row].
extern "C" __global__ void merge_lse_f32(const u64* out_ptrs, const u64* lse_ptrs, u32 parts, u64 rows,
                                         u32 hd, float* out, float* lse_out) {
    u64 row = blockIdx.x;
    if (row >= rows) {
        return;
    }
    float merged = merged_lse(lse_ptrs, parts, row);
    if (threadIdx.x == 0) {
        lse_out[row] = merged;
    }
    for (u32 e = threadIdx.x; e < hd; e += blockDim.x) {
        float o = 0.0f;
        for (u32 p = 0; p < parts; ++p) {
            float w = shard_weight(((const float*)lse_ptrs[p])[row], merged);
            if (w != 0.0f) {
                o += w * ((const float*)out_ptrs[p])[row * hd + e];
            }
        }
        out[row * hd + e] = o;
    }
}

// Scales row i of `out` by exp(lse[i] − LSE_i), LSE_i merging all_lse[p·n + i] over the
// parts (`dcp::merge::scale_by_lse_share`). One block per row.
extern "C" __global__ void scale_by_lse_share_f32(float* out, const float* lse, const float* all_lse, u32 parts,
                                                  u64 n, u32 hd) {
    u64 i = blockIdx.x;
    if (i >= n) {
        return;
    }
    float m = NEG_INF;
    for (u32 p = 0; p < parts; ++p) {
        float v = all_lse[(u64)p * n + i];
        if (v == v) {
            m = fmaxf(m, v);
        }
    }
    float merged = m;
    if (!is_neg_inf(m)) {
        float sum = 0.0f;
        for (u32 p = 0; p < parts; ++p) {
            float v = all_lse[(u64)p * n + i];
            if (v == v) {
                sum += expf(v - m);
            }
        }
        merged = m + logf(sum);
    }
    float w = shard_weight(lse[i], merged);
    for (u32 e = threadIdx.x; e < hd; e += blockDim.x) {
        out[i * hd + e] *= w;
    }
}
