/* State kernels (port of src/device/opencl/kernels/optim.cl): AdamW over one span (Note [AdamW order of
 * operations] in src/device/cpu/kernels/optim.c: the same single-precision operations in the same order;
 * nvcc --fmad=false, IEEE division and sqrt) and the gradient sum of squares in double. */
#include "common.cuh"

__global__ void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float decay, float gscale,
                        float b1, float b2, float eps, float step_size, float bc2_sqrt) {
    CU_LOOP(k, n) {
        float gk = g[k] * gscale;
        float pk = p[k] * decay;
        float mk = m[k], vk = v[k];
        mk += (1.0f - b1) * (gk - mk);
        vk = vk * b2 + (1.0f - b2) * gk * gk;
        float denom = sqrtf(vk) / bc2_sqrt + eps;
        pk += -step_size * (mk / denom);
        m[k] = mk;
        v[k] = vk;
        p[k] = pk;
    }
}

extern "C" cudaError_t cu_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v, int64_t n,
                                float decay, float gscale, float b1, float b2, float eps, float step_size,
                                float bc2_sqrt) {
    if (n <= 0) return cudaSuccess;
    k_adamw<<<cu_blocks(n), CU_THREADS, 0, s>>>(p, g, m, v, n, decay, gscale, b1, b2, eps, step_size, bc2_sqrt);
    return CU_LAUNCHED();
}

/* Note [CUDA sumsq order]: one block of 256 threads per 65536-element chunk; thread j sums elements j,
 * j + 256, ... of the chunk in double (coalesced), then a fixed shared-memory tree. The order depends only
 * on (off, n), as the contract asks, but is not the CPU's 8-lane order: the result agrees with the CPU's to
 * double rounding, not bit for bit. */
__global__ void k_sumsq(const float *x, int64_t n, double *part) {
    __shared__ double sh[256];
    int64_t a = (int64_t)blockIdx.x * 65536, e = a + 65536 < n ? a + 65536 : n;
    double acc = 0;
    for (int64_t k = a + threadIdx.x; k < e; k += 256) acc += (double)x[k] * (double)x[k];
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

extern "C" cudaError_t cu_sumsq_chunks(cudaStream_t s, const float *x, int64_t n, double *part) {
    int64_t nch = (n + 65535) / 65536;
    if (nch <= 0) return cudaSuccess;
    k_sumsq<<<(unsigned)nch, 256, 0, s>>>(x, n, part);
    return CU_LAUNCHED();
}
