// Fixed-order sums for DeviceLocalCollectives (ranks sharing one GPU).
//
// out[i] = ((src[0][i] + src[1][i]) + src[2][i]) + ... in f32, always in rank order, so
// every rank that runs the kernel on the same sources gets the same bits. bf16 inputs are
// widened to f32, summed, and rounded once (round to nearest even) at the end.
// No headers: NVRTC compiles this without the CUDA include folder (bf16 is done on bits).

#define DCP_MAX_SOURCES 16

struct DcpSources {
    unsigned long long ptr[DCP_MAX_SOURCES];
};

__device__ __forceinline__ float dcp_bf16_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

__device__ __forceinline__ unsigned short dcp_f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)((u >> 16) | 0x40u);  // NaN stays a (quiet) NaN
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

extern "C" __global__ void dcp_sum_f32(float* out, DcpSources src, int n_src,
                                       unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float acc = ((const float*)src.ptr[0])[i];
        for (int s = 1; s < n_src; ++s) {
            acc += ((const float*)src.ptr[s])[i];
        }
        out[i] = acc;
    }
}

extern "C" __global__ void dcp_sum_bf16(unsigned short* out, DcpSources src, int n_src,
                                        unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float acc = dcp_bf16_to_f32(((const unsigned short*)src.ptr[0])[i]);
        for (int s = 1; s < n_src; ++s) {
            acc += dcp_bf16_to_f32(((const unsigned short*)src.ptr[s])[i]);
        }
        out[i] = dcp_f32_to_bf16(acc);
    }
}
