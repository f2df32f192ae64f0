/* Shared by the CUDA kernel files: launch geometry, warp reductions, bf16 rounding. */
#ifndef SL_CUDA_COMMON_CUH
#define SL_CUDA_COMMON_CUH
#include <stdint.h>

#include <cuda_runtime.h>

#include "device/cuda/cuda_kernels.h"

#define CU_THREADS 256
/* blocks for n items at CU_THREADS per block, grid-stride loops cover the rest */
static inline unsigned cu_blocks(int64_t n) {
    int64_t b = (n + CU_THREADS - 1) / CU_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);
}
#define CU_LOOP(i, n) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
#define CU_LAUNCHED() cudaGetLastError()

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* round to nearest even, quiet NaN (sl_f32_to_bf16 in suanli/base.h) */
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* element offset of linear index i (row-major over ne) for strides nb */
__device__ __forceinline__ int64_t off5(int64_t i, const cu_v5 &ne, const cu_v5 &nb) {
    int64_t o = 0;
    for (int d = 4; d >= 0; d--) {
        int64_t q = i / ne.v[d];
        o += (i - q * ne.v[d]) * nb.v[d];
        i = q;
    }
    return o;
}
/* rows per block for warp-per-row kernels */
#define CU_ROWS_PER_BLOCK 4
static inline unsigned cu_row_blocks(int64_t R) {
    int64_t b = (R + CU_ROWS_PER_BLOCK - 1) / CU_ROWS_PER_BLOCK;
    return (unsigned)(b < 1 ? 1 : b);
}
#endif
