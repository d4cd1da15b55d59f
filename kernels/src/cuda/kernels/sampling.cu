// Device sampling (`Backend::sample_rows`, see `cuda/sampling.rs`): one block of
// SAMPLE_THREADS threads per draw. The host's `sampling::{support, sample}` and
// `sampling::token_logprobs` step by step, in the same orders:
// * greedy parameters or degenerate rows: the argmax (lowest index on ties);
// * no filter: every token walked in index order, the draw's fallback the last token of
//   positive weight;
// * min-p alone (or a top-k no smaller than the finite logits): the finite tokens of
//   weight >= min_p · top, walked in index order;
// * top-k that cuts, or top-p: the candidates selected (radix select of the k-th, or of
//   the SORT_CAP-th, largest logit) and sorted (most likely first, ties by lower id),
//   the nucleus cut and min-p applied and the draw walked in that order by one thread.
// Sums over a whole row are parallel f64 sums (the host's are sequential), so a draw
// or a top-p cut may differ from the host's when it falls within rounding of a
// boundary. Rows the device does not draw exactly (NaN or +inf logits, a top-k above
// SORT_CAP, a nucleus reaching past the SORT_CAP most likely tokens) are answered
// DRAWN_UNSUPPORTED and drawn on the host.

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SORT_CAP 2048
#define NO_ID 0xFFFFFFFFu
#define POS_INF __uint_as_float(0x7F800000u)

// Draw flags (set by cuda/sampling.rs).
#define DRAW_GREEDY 1u // greedy parameters: the argmax, no number used
#define DRAW_ALL 2u    // no filter at all (the host's `Support::All`)

// Status bits of an answer.
#define DRAWN_USED 1u        // the draw used its uniform number
#define DRAWN_UNSUPPORTED 2u // not drawn here: the host draws this row

// `Support::weight`: exp((l - max) · inv_t) as an f32. The exponential is taken in
// double and rounded once, which is the correctly rounded f32 but for a vanishing
// fraction of inputs (the host's expf is within a hair of correct rounding too).
// A −inf logit weighs 0 at every temperature (at +inf, inv_t 0, its product would be NaN).
__device__ __forceinline__ float sample_weight(float l, float max, float inv_t) {
    if (l == NEG_INF) return 0.0f;
    float x = (l - max) * inv_t;
    return (float)exp((double)x);
}

// A key whose unsigned order is f32's total order (Rust's `f32::total_cmp`).
__device__ __forceinline__ u32 total_key(float v) {
    u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The same for comparisons in which -0 and +0 are equal (`partial_cmp`; no NaN here).
__device__ __forceinline__ u32 value_key(float v) {
    return total_key(v == 0.0f ? 0.0f : v);
}

// (key, id) packed so that the larger pack has the larger key, then the lower id.
__device__ __forceinline__ u64 pack_key_id(u32 key, u32 id) {
    return ((u64)key << 32) | (u64)(NO_ID - id);
}

__device__ __forceinline__ u32 packed_id(u64 p) {
    return NO_ID - (u32)(p & 0xFFFFFFFFull);
}

// Block reductions (blockDim.x a multiple of 32, at most 1024): every thread gets the
// result. Every thread of the block must call them (they synchronize). `op(a, b)` is
// applied as `op(mine, other)` at every level, in the same order for every type.
template <typename T, typename Op>
__device__ T blk_reduce(T v, T* s, T identity, Op op) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    }
    __syncthreads();
    if (lane == 0) {
        s[warp] = v;
    }
    __syncthreads();
    T t = lane < (int)(blockDim.x >> 5) ? s[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) {
        t = op(t, __shfl_xor_sync(0xFFFFFFFFu, t, o));
    }
    return t;
}

struct MaxF32 {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MaxU64 {
    __device__ u64 operator()(u64 a, u64 b) const { return b > a ? b : a; }
};
struct Sum {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a + b; }
};

__device__ __forceinline__ float blk_max_f32(float v, float* s) {
    return blk_reduce(v, s, NEG_INF, MaxF32());
}
__device__ __forceinline__ u32 blk_sum_u32(u32 v, u32* s) {
    return blk_reduce(v, s, 0u, Sum());
}
__device__ __forceinline__ double blk_sum_f64(double v, double* s) {
    return blk_reduce(v, s, 0.0, Sum());
}
__device__ __forceinline__ u64 blk_max_u64(u64 v, u64* s) {
    return blk_reduce(v, s, (u64)0ull, MaxU64());
}

// Thread t's contiguous part [lo, hi) of a row of n (index-order walks need each
// thread's elements to be consecutive).
__device__ __forceinline__ void chunk_of(u64 n, u64* lo, u64* hi) {
    u64 chunk = (n + blockDim.x - 1) / blockDim.x;
    u64 a = (u64)threadIdx.x * chunk;
    *lo = a < n ? a : n;
    *hi = a + chunk < n ? a + chunk : n;
}

// Shared scratch of the sampling kernel.
struct SampleShared {
    float cand_l[SORT_CAP]; // selected candidates' logits (sorted in place)
    u32 cand_i[SORT_CAP];   // their ids
    float w[SORT_CAP];      // their weights
    double part[SAMPLE_THREADS]; // per-thread f64 sums, then their exclusive prefix
    u32 ties[SAMPLE_THREADS];    // per-thread tie counts, then their exclusive prefix
    u32 hist[256];
    double red_f64[SAMPLE_WARPS];
    float red_f32[SAMPLE_WARPS];
    u32 red_u32[SAMPLE_WARPS];
    u64 red_u64[SAMPLE_WARPS];
    double total;
    u32 found, last, count, prefix, rem;
};

// Whether element l passes an index-order filter: finite (when `finite_only`) and of
// weight >= thr.
__device__ __forceinline__ bool walk_passes(float l, float w, bool finite_only, float thr) {
    return (!finite_only || l > NEG_INF) && w >= thr;
}

// The draw of an index-order support: the first index whose running sum of weights
// passes u · total; when none does (rounding), the last index of positive weight
// (`last_fallback`, as `draw_weighted`) or `fallback`.
__device__ u32 index_walk(const float* row, u64 vocab, float mx, float inv_t, bool finite_only,
                          float thr, double u, bool last_fallback, u32 fallback,
                          SampleShared* sh) {
    u64 lo, hi;
    chunk_of(vocab, &lo, &hi);
    double s = 0.0;
    for (u64 i = lo; i < hi; ++i) {
        float l = row[i];
        float w = sample_weight(l, mx, inv_t);
        if (walk_passes(l, w, finite_only, thr) && w > 0.0f) {
            s += (double)w;
        }
    }
    sh->part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double run = 0.0;
        for (u32 t = 0; t < blockDim.x; ++t) {
            double x = sh->part[t];
            sh->part[t] = run;
            run += x;
        }
        sh->total = run;
        sh->found = NO_ID;
        sh->last = 0;
    }
    __syncthreads();
    double target = u * sh->total;
    double acc = sh->part[threadIdx.x];
    u32 found = NO_ID, last = 0;
    for (u64 i = lo; i < hi; ++i) {
        float l = row[i];
        float w = sample_weight(l, mx, inv_t);
        if (walk_passes(l, w, finite_only, thr) && w > 0.0f) {
            acc += (double)w;
            last = (u32)i + 1;
            if (target < acc) {
                found = (u32)i;
                break;
            }
        }
    }
    if (found != NO_ID) {
        atomicMin(&sh->found, found);
    }
    if (last != 0) {
        atomicMax(&sh->last, last);
    }
    __syncthreads();
    if (sh->found != NO_ID) {
        return sh->found;
    }
    if (last_fallback && sh->last != 0) {
        return sh->last - 1;
    }
    return fallback;
}

// Selects the `m` most likely finite logits (ties by lower id) into sh->cand_* (unsorted),
// m <= SORT_CAP and m <= the finite count: a radix select of the m-th key, then the keys
// above it and the lowest-id ties at it.
__device__ void select_top(const float* row, u64 vocab, u32 m, SampleShared* sh) {
    u32 prefix = 0, mask = 0, rem = m;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (u32 j = threadIdx.x; j < 256; j += blockDim.x) {
            sh->hist[j] = 0;
        }
        __syncthreads();
        for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
            float l = row[i];
            if (l > NEG_INF) {
                u32 k = value_key(l);
                if ((k & mask) == prefix) {
                    atomicAdd(&sh->hist[(k >> shift) & 255u], 1u);
                }
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // The bin holding the rem-th largest key among those matching the prefix.
            u32 r = rem;
            u32 b = 255;
            for (; b > 0; --b) {
                if (r <= sh->hist[b]) {
                    break;
                }
                r -= sh->hist[b];
            }
            sh->prefix = prefix | (b << shift);
            sh->rem = r;
        }
        __syncthreads();
        prefix = sh->prefix;
        rem = sh->rem;
        mask |= 255u << shift;
    }
    // `prefix` is the m-th largest key; `rem` elements equal to it are taken (lowest ids).
    u32 above = m - rem;
    if (threadIdx.x == 0) {
        sh->count = 0;
    }
    __syncthreads();
    for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
        float l = row[i];
        if (l > NEG_INF && value_key(l) > prefix) {
            u32 slot = atomicAdd(&sh->count, 1u);
            if (slot < above) {
                sh->cand_l[slot] = l;
                sh->cand_i[slot] = (u32)i;
            }
        }
    }
    u64 lo, hi;
    chunk_of(vocab, &lo, &hi);
    u32 c = 0;
    for (u64 i = lo; i < hi; ++i) {
        float l = row[i];
        c += (l > NEG_INF && value_key(l) == prefix) ? 1u : 0u;
    }
    sh->ties[threadIdx.x] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 run = 0;
        for (u32 t = 0; t < blockDim.x; ++t) {
            u32 x = sh->ties[t];
            sh->ties[t] = run;
            run += x;
        }
    }
    __syncthreads();
    u32 r = sh->ties[threadIdx.x];
    for (u64 i = lo; i < hi && r < rem; ++i) {
        float l = row[i];
        if (l > NEG_INF && value_key(l) == prefix) {
            sh->cand_l[above + r] = l;
            sh->cand_i[above + r] = (u32)i;
            ++r;
        }
    }
    __syncthreads();
}

// Whether candidate (la, ia) comes before (lb, ib): larger logit first, then lower id.
__device__ __forceinline__ bool cand_before(float la, u32 ia, float lb, u32 ib) {
    return la > lb || (la == lb && ia < ib);
}

// Sorts sh->cand_*[0..m) most likely first (bitonic, padded to a power of two).
__device__ void sort_candidates(u32 m, SampleShared* sh) {
    u32 p = 1;
    while (p < m) {
        p <<= 1;
    }
    for (u32 j = m + threadIdx.x; j < p; j += blockDim.x) {
        sh->cand_l[j] = NEG_INF; // after every candidate (all are finite)
        sh->cand_i[j] = NO_ID;
    }
    __syncthreads();
    for (u32 k = 2; k <= p; k <<= 1) {
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            for (u32 i = threadIdx.x; i < p; i += blockDim.x) {
                u32 ixj = i ^ j;
                if (ixj > i) {
                    bool up = (i & k) == 0;
                    float li = sh->cand_l[i], lj = sh->cand_l[ixj];
                    u32 ii = sh->cand_i[i], ij = sh->cand_i[ixj];
                    if (up == cand_before(lj, ij, li, ii)) {
                        sh->cand_l[i] = lj;
                        sh->cand_l[ixj] = li;
                        sh->cand_i[i] = ij;
                        sh->cand_i[ixj] = ii;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// One draw per block. Per draw d: its row, its effective top-k (>= vocab: off), flags,
// fparams[3d..3d+3] = (1 / temperature, top-p (1: off), min-p (0: off)) and its uniform
// number. Writes the token and the status bits.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_rows_f32(const float* logits, u64 vocab, const u32* rows, const u32* top_k,
                const u32* flags, const float* fparams, const double* uniform, u32* out_token,
                u32* out_status) {
    __shared__ SampleShared sh;
    const u32 d = blockIdx.x;
    const float* row = logits + (u64)rows[d] * vocab;
    const float inv_t = fparams[3 * d], top_p = fparams[3 * d + 1], min_p = fparams[3 * d + 2];
    const double u = uniform[d];
    const u32 k = top_k[d], fl = flags[d];

    // The row's max (NaN skipped, as f32::max), finite count, argmax and whether it
    // holds NaN or +inf.
    float mx = NEG_INF;
    u32 nfin = 0, bad = 0;
    u64 best = 0;
    for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = row[i];
        if (v != v || v == POS_INF) {
            bad = 1;
        } else {
            mx = fmaxf(mx, v);
            nfin += v > NEG_INF ? 1u : 0u;
            u64 p = pack_key_id(value_key(v), (u32)i);
            best = p > best ? p : best;
        }
    }
    mx = blk_max_f32(mx, sh.red_f32);
    nfin = blk_sum_u32(nfin, sh.red_u32);
    bad = blk_sum_u32(bad, sh.red_u32);
    best = blk_max_u64(best, sh.red_u64);
    // `argmax`: 0 when nothing beats -inf.
    const u32 amax = mx > NEG_INF ? packed_id(best) : 0u;

    if (bad != 0) {
        if (threadIdx.x == 0) {
            out_token[d] = 0;
            out_status[d] = DRAWN_UNSUPPORTED;
        }
        return;
    }
    if ((fl & DRAW_GREEDY) || mx == NEG_INF) {
        if (threadIdx.x == 0) {
            out_token[d] = amax;
            out_status[d] = 0;
        }
        return;
    }
    if (fl & DRAW_ALL) {
        u32 t = index_walk(row, vocab, mx, inv_t, false, 0.0f, u, true, amax, &sh);
        if (threadIdx.x == 0) {
            out_token[d] = t;
            out_status[d] = DRAWN_USED;
        }
        return;
    }
    const bool cuts = (u64)k < (u64)nfin; // top-k truncates the finite candidates
    if (!cuts && !(top_p < 1.0f)) {
        // Finite tokens (of weight >= min_p · top with min-p), in index order.
        float thr = 0.0f;
        if (min_p > 0.0f) {
            float top = 0.0f;
            for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
                float l = row[i];
                if (l > NEG_INF) {
                    top = fmaxf(top, sample_weight(l, mx, inv_t));
                }
            }
            top = blk_max_f32(top, sh.red_f32);
            thr = min_p * top;
            u32 n = 0;
            for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
                float l = row[i];
                n += (l > NEG_INF && sample_weight(l, mx, inv_t) >= thr) ? 1u : 0u;
            }
            n = blk_sum_u32(n, sh.red_u32);
            if (n == 0) {
                // Nothing left: the host's support falls back to the argmax, no draw.
                if (threadIdx.x == 0) {
                    out_token[d] = amax;
                    out_status[d] = 0;
                }
                return;
            }
        }
        u32 t = index_walk(row, vocab, mx, inv_t, true, thr, u, false, amax, &sh);
        if (threadIdx.x == 0) {
            out_token[d] = t;
            out_status[d] = DRAWN_USED;
        }
        return;
    }
    // Sorted candidates: the top-k, or (top-p without a cutting top-k) the SORT_CAP most
    // likely, the nucleus having to end among them.
    if (cuts && k > SORT_CAP) {
        if (threadIdx.x == 0) {
            out_token[d] = 0;
            out_status[d] = DRAWN_UNSUPPORTED;
        }
        return;
    }
    const u32 m = cuts ? k : (nfin < SORT_CAP ? nfin : SORT_CAP);
    double z_all = 0.0;
    if (!cuts && top_p < 1.0f) {
        // The nucleus is measured against every finite token's weight.
        double s = 0.0;
        for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
            float l = row[i];
            if (l > NEG_INF) {
                s += (double)sample_weight(l, mx, inv_t);
            }
        }
        z_all = blk_sum_f64(s, sh.red_f64);
    }
    select_top(row, vocab, m, &sh);
    sort_candidates(m, &sh);
    for (u32 j = threadIdx.x; j < m; j += blockDim.x) {
        sh.w[j] = sample_weight(sh.cand_l[j], mx, inv_t);
    }
    __syncthreads();
    if (threadIdx.x != 0) {
        return;
    }
    // One thread from here: the host's loops over at most SORT_CAP candidates.
    u32 n = m;
    if (top_p < 1.0f) {
        double z = z_all;
        if (cuts) {
            z = 0.0;
            for (u32 j = 0; j < m; ++j) {
                z += (double)sh.w[j];
            }
        }
        double lim = (double)top_p * z;
        double cum = 0.0;
        u32 keep = NO_ID;
        for (u32 i = 0; i < m; ++i) {
            if (cum >= lim && i > 0) {
                keep = i;
                break;
            }
            cum += (double)sh.w[i];
        }
        if (keep == NO_ID && cum >= lim) {
            keep = m;
        }
        if (keep != NO_ID) {
            n = keep;
        } else if (!cuts && m < nfin) {
            // The nucleus reaches past the candidates sorted here.
            out_token[d] = 0;
            out_status[d] = DRAWN_UNSUPPORTED;
            return;
        }
        // Otherwise every candidate was seen: all are kept, as on the host.
    }
    if (min_p > 0.0f) {
        float top = 0.0f;
        for (u32 j = 0; j < n; ++j) {
            top = fmaxf(top, sh.w[j]);
        }
        float thr = min_p * top;
        u32 kept = 0;
        for (u32 j = 0; j < n; ++j) {
            if (sh.w[j] >= thr) {
                sh.w[kept] = sh.w[j];
                sh.cand_i[kept] = sh.cand_i[j];
                ++kept;
            }
        }
        n = kept;
    }
    if (n == 0) {
        out_token[d] = amax;
        out_status[d] = 0;
        return;
    }
    double total = 0.0;
    for (u32 j = 0; j < n; ++j) {
        total += (double)sh.w[j];
    }
    double target = u * total;
    double acc = 0.0;
    u32 t = sh.cand_i[0]; // past the end by rounding: the most likely candidate
    for (u32 j = 0; j < n; ++j) {
        acc += (double)sh.w[j];
        if (target < acc) {
            t = sh.cand_i[j];
            break;
        }
    }
    out_token[d] = t;
    out_status[d] = DRAWN_USED;
}

// Log-probabilities of drawn tokens, one block per entry: entry b is draw which[b] (its
// row rows[d], its token tokens[d]); writes the token's log-probability and the top_n[b]
// most likely tokens (ties by lower id) with theirs at [b·max_n ..). As
// `sampling::token_logprobs`: log_softmax with an f64 sum of exp(l - max), then
// repeated block arg-maxima under f32's total order.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
row_logprobs_f32(const float* logits, u64 vocab, const u32* rows, const u32* tokens,
                 const u32* which, const u32* top_n, u32 max_n, float* out_lp, u32* out_ids,
                 float* out_vals) {
    __shared__ float red_f32[SAMPLE_WARPS];
    __shared__ double red_f64[SAMPLE_WARPS];
    __shared__ u64 red_u64[SAMPLE_WARPS];
    const u32 b = blockIdx.x;
    const u32 d = which[b];
    const float* row = logits + (u64)rows[d] * vocab;
    float mx = NEG_INF;
    for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
        mx = fmaxf(mx, row[i]);
    }
    mx = blk_max_f32(mx, red_f32);
    float lse;
    if (mx == NEG_INF) {
        // Every logit is -inf: every log-probability is -inf, as on the host.
        lse = POS_INF;
    } else {
        double s = 0.0;
        for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
            s += exp((double)(row[i] - mx));
        }
        s = blk_sum_f64(s, red_f64);
        lse = mx + (float)log(s);
    }
    if (threadIdx.x == 0) {
        out_lp[b] = row[tokens[d]] - lse;
    }
    u64 prev = 0;
    const u32 n = top_n[b];
    for (u32 r = 0; r < n; ++r) {
        u64 bestp = 0;
        for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
            u64 p = pack_key_id(total_key(row[i] - lse), (u32)i);
            if ((r == 0 || p < prev) && p > bestp) {
                bestp = p;
            }
        }
        bestp = blk_max_u64(bestp, red_u64);
        if (threadIdx.x == 0) {
            u32 id = packed_id(bestp);
            out_ids[(u64)b * max_n + r] = id;
            out_vals[(u64)b * max_n + r] = id < vocab ? row[id] - lse : NEG_INF;
        }
        prev = bestp;
    }
}
