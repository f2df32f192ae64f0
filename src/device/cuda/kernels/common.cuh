/* Shared by the CUDA kernel files: launch geometry, warp reductions, bf16 / f16 rounding, the dropout masks'
 * Philox generator (Note [CUDA dropout]).
 *
 * Note [CUDA dropout]
 * The port of Note [OpenCL dropout] (src/device/opencl/kernels/0_common.cl): philox4x32 is src/base/rng.c's
 * sl_philox4x32 bit for bit (__umulhi gives the high words of the 32 x 32 products), so a kernel draws the
 * CPU's mask: element e of a dropout site is kept iff word e % 4 of Philox-4x32-10(key = seed, counter = (hi,
 * e / 4)) >= thr, thr = sl_dropout_threshold(p), and a kept value is multiplied by keep = (float)(1 / (1 -
 * p)) computed on the host in double. The host passes them in a cu_drop (cuda_kernels.h; on = 0: no dropout,
 * no word is drawn). Compiled by nvcc, not yet run on a GPU. */
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

/* x rounded to bf16 and widened back, exactly as sl_f32_to_bf16 */
__device__ __forceinline__ float rbf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
/* IEEE binary16, round to nearest even, overflow to inf, a NaN keeps its payload's top bits quieted: the
 * CPU's sl_f32_to_f16 / sl_f16_to_f32 (suanli/base.h) line for line, so NaN payloads match too */
__device__ __forceinline__ uint16_t f32_to_f16(float f) {
    uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, ax = u & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN */
    if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7c00u);                    /* >= 65536: inf */
    if (ax < 0x38800000u) { /* subnormal or zero: the float add rounds to nearest even */
        uint32_t mu = (uint32_t)((127 - 15) + (23 - 10) + 1) << 23;
        float a = __uint_as_float(ax) + __uint_as_float(mu);
        return (uint16_t)(sign | (__float_as_uint(a) - mu));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
    return (uint16_t)(sign | (ax >> 13));
}
__device__ __forceinline__ float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);
    } else if (e == 0) {
        if (!mant) {
            u = sign;
        } else { /* subnormal: normalise */
            int sh = 0;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                sh++;
            }
            u = sign | ((uint32_t)(127 - 15 + 1 - sh) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else {
        u = sign | ((e + 127 - 15) << 23) | (mant << 13);
    }
    return __uint_as_float(u);
}
/* x rounded to f16 and widened back */
__device__ __forceinline__ float rf16(float x) { return f16_to_f32(f32_to_f16(x)); }

/* Philox-4x32-10 (Note [CUDA dropout]): sl_philox4x32(key, hi, lo) bit for bit */
struct cu_u4 {
    uint32_t w[4];
};
__device__ __forceinline__ cu_u4 philox4x32(uint64_t key, uint64_t hi, uint64_t lo) {
    uint32_t c0 = (uint32_t)lo, c1 = (uint32_t)(lo >> 32), c2 = (uint32_t)hi, c3 = (uint32_t)(hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t l0 = 0xD2511F53u * c0, h0 = __umulhi(0xD2511F53u, c0);
        uint32_t l1 = 0xCD9E8D57u * c2, h1 = __umulhi(0xCD9E8D57u, c2);
        uint32_t n0 = h1 ^ c1 ^ k0, n2 = h0 ^ c3 ^ k1;
        c0 = n0;
        c1 = l1;
        c2 = n2;
        c3 = l0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    cu_u4 r = {{c0, c1, c2, c3}};
    return r;
}

/* the last counter block drawn, so consecutive elements of a row draw each block once */
struct cu_drop_cache {
    uint64_t c;
    cu_u4 w;
    int valid;
};
/* the dropout multiplier of element e: keep or 0 */
__device__ __forceinline__ float drop_at(cu_drop_cache &dc, const cu_drop &d, uint64_t e) {
    uint64_t c = e >> 2;
    if (!dc.valid || dc.c != c) {
        dc.w = philox4x32(d.seed, d.hi, c);
        dc.c = c;
        dc.valid = 1;
    }
    return dc.w.w[e & 3] >= d.thr ? d.keep : 0.0f;
}

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
