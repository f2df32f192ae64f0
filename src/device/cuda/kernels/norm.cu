/* LayerNorm, RMSNorm and softmax over the last dim, forward and backward (port of
 * src/device/opencl/kernels/norm.cl; semantics: src/device/cpu/kernels/norm.c, llama_ops.c).
 * One warp per row (CU_ROWS_PER_BLOCK rows per block), sums by warp shuffles; the weight gradients sum
 * 512-row chunks per column (a fixed order) and then the chunks in order, so they are deterministic. */
#include "common.cuh"

#define ROW_SETUP(R)                                                                                          \
    int64_t r = (int64_t)blockIdx.x * CU_ROWS_PER_BLOCK + threadIdx.y;                                        \
    int lane = threadIdx.x;                                                                                   \
    if (r >= (R)) return;

static dim3 row_block() { return dim3(32, CU_ROWS_PER_BLOCK); }

__global__ void k_layernorm(float *y, float *stats, const float *x, int64_t xs, const float *w, const float *b,
                            int64_t R, int64_t C, float eps) {
    ROW_SETUP(R)
    const float *xr = x + r * xs;
    float *yr = y + r * C;
    float m = 0.0f;
    for (int64_t c = lane; c < C; c += 32) m += xr[c];
    m = warp_sum(m) / (float)C;
    float v = 0.0f;
    for (int64_t c = lane; c < C; c += 32) v += (xr[c] - m) * (xr[c] - m);
    v = warp_sum(v) / (float)C;
    float rs = 1.0f / sqrtf(v + eps);
    for (int64_t c = lane; c < C; c += 32) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
    if (lane == 0) {
        stats[r] = m;
        stats[R + r] = rs;
    }
}

extern "C" cudaError_t cu_layernorm(cudaStream_t s, float *y, float *stats, const float *x, int64_t xs,
                                    const float *w, const float *b, int64_t R, int64_t C, float eps) {
    if (R <= 0) return cudaSuccess;
    k_layernorm<<<cu_row_blocks(R), row_block(), 0, s>>>(y, stats, x, xs, w, b, R, C, eps);
    return CU_LAUNCHED();
}

__global__ void k_layernorm_back_x(float *dx, const float *stats, const float *x, int64_t xs, const float *w,
                                   const float *g, int64_t gs, int64_t R, int64_t C) {
    ROW_SETUP(R)
    const float *xr = x + r * xs, *gr = g + r * gs;
    float *d = dx + r * C;
    float m = stats[r], rs = stats[R + r], s1 = 0.0f, s2 = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        float dxh = gr[c] * w[c];
        s1 += dxh;
        s2 += dxh * (xr[c] - m) * rs;
    }
    s1 = warp_sum(s1) / (float)C;
    s2 = warp_sum(s2) / (float)C;
    for (int64_t c = lane; c < C; c += 32) {
        float xh = (xr[c] - m) * rs;
        d[c] = rs * (gr[c] * w[c] - s1 - xh * s2);
    }
}

extern "C" cudaError_t cu_layernorm_back_x(cudaStream_t s, float *dx, const float *stats, const float *x,
                                           int64_t xs, const float *w, const float *g, int64_t gs, int64_t R,
                                           int64_t C) {
    if (R <= 0) return cudaSuccess;
    k_layernorm_back_x<<<cu_row_blocks(R), row_block(), 0, s>>>(dx, stats, x, xs, w, g, gs, R, C);
    return CU_LAUNCHED();
}

#define CHUNK 512
extern "C" int64_t cu_colsum_parts(int64_t R, int64_t C) { return 2 * C * ((R + CHUNK - 1) / CHUNK + 1); }

/* block (32, 8): 32 columns x 8 row lanes over one 512-row chunk; lanes combined in order */
__global__ void k_norm_back_w_part(int mode, float *part, const float *stats, const float *x, int64_t xs,
                                   const float *g, int64_t gs, int64_t R, int64_t C) {
    __shared__ float sw[8][32], sb[8][32];
    int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x, ch = blockIdx.y;
    int64_t r0 = ch * CHUNK, r1 = r0 + CHUNK < R ? r0 + CHUNK : R;
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
            float xv = x[r * xs + c], gv = g[r * gs + c];
            if (mode == 0) {
                aw += gv * (xv - stats[r]) * stats[R + r];
                ab += gv;
            } else {
                aw += gv * (xv * stats[r]);
            }
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int j = 1; j < 8; j++) {
            aw += sw[j][threadIdx.x];
            ab += sb[j][threadIdx.x];
        }
        part[ch * 2 * C + c] = aw;
        part[ch * 2 * C + C + c] = ab;
    }
}

__global__ void k_norm_back_w_sum(int mode, float *out, const float *part, int64_t nch, int64_t C) {
    CU_LOOP(c, C) {
        float aw = 0.0f, ab = 0.0f;
        for (int64_t ch = 0; ch < nch; ch++) {
            aw += part[ch * 2 * C + c];
            ab += part[ch * 2 * C + C + c];
        }
        out[c] = aw;
        if (mode == 0) out[C + c] = ab;
    }
}

extern "C" cudaError_t cu_norm_back_w(cudaStream_t s, int mode, float *out, float *part, const float *stats,
                                      const float *x, int64_t xs, const float *g, int64_t gs, int64_t R,
                                      int64_t C) {
    if (C <= 0) return cudaSuccess;
    int64_t nch = (R + CHUNK - 1) / CHUNK;
    if (nch > 0) {
        dim3 grid((unsigned)((C + 31) / 32), (unsigned)nch);
        k_norm_back_w_part<<<grid, dim3(32, 8), 0, s>>>(mode, part, stats, x, xs, g, gs, R, C);
    }
    k_norm_back_w_sum<<<cu_blocks(C), CU_THREADS, 0, s>>>(mode, out, part, nch, C);
    return CU_LAUNCHED();
}

__global__ void k_rmsnorm(float *y, float *rstd, const float *x, int64_t xs, const float *w, int64_t R, int64_t C,
                          float eps) {
    ROW_SETUP(R)
    const float *xr = x + r * xs;
    float *yr = y + r * C;
    float ss = 0.0f;
    for (int64_t c = lane; c < C; c += 32) ss += xr[c] * xr[c];
    ss = warp_sum(ss);
    float rs = 1.0f / sqrtf(ss / (float)C + eps);
    for (int64_t c = lane; c < C; c += 32) yr[c] = w ? w[c] * (xr[c] * rs) : xr[c] * rs;
    if (lane == 0) rstd[r] = rs;
}

extern "C" cudaError_t cu_rmsnorm(cudaStream_t s, float *y, float *rstd, const float *x, int64_t xs,
                                  const float *w, int64_t R, int64_t C, float eps) {
    if (R <= 0) return cudaSuccess;
    k_rmsnorm<<<cu_row_blocks(R), row_block(), 0, s>>>(y, rstd, x, xs, w, R, C, eps);
    return CU_LAUNCHED();
}

__global__ void k_rmsnorm_back_x(float *dx, const float *rstd, const float *x, int64_t xs, const float *w,
                                 const float *g, int64_t gs, int64_t R, int64_t C) {
    ROW_SETUP(R)
    const float *xr = x + r * xs, *gr = g + r * gs;
    float *d = dx + r * C;
    float rs = rstd[r], sm = 0.0f;
    for (int64_t c = lane; c < C; c += 32) sm += (w ? gr[c] * w[c] : gr[c]) * xr[c] * rs;
    sm = warp_sum(sm) / (float)C;
    for (int64_t c = lane; c < C; c += 32) d[c] = rs * ((w ? gr[c] * w[c] : gr[c]) - xr[c] * rs * sm);
}

extern "C" cudaError_t cu_rmsnorm_back_x(cudaStream_t s, float *dx, const float *rstd, const float *x, int64_t xs,
                                         const float *w, const float *g, int64_t gs, int64_t R, int64_t C) {
    if (R <= 0) return cudaSuccess;
    k_rmsnorm_back_x<<<cu_row_blocks(R), row_block(), 0, s>>>(dx, rstd, x, xs, w, g, gs, R, C);
    return CU_LAUNCHED();
}

__global__ void k_softmax(float *y, const float *x, int64_t xs, int64_t R, int64_t C) {
    ROW_SETUP(R)
    const float *xr = x + r * xs;
    float *yr = y + r * C;
    float mx = -INFINITY;
    for (int64_t c = lane; c < C; c += 32) mx = fmaxf(mx, xr[c]);
    mx = warp_max(mx);
    float sm = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        float e = expf(xr[c] - mx);
        yr[c] = e;
        sm += e;
    }
    float inv = 1.0f / warp_sum(sm);
    for (int64_t c = lane; c < C; c += 32) yr[c] *= inv;
}

extern "C" cudaError_t cu_softmax(cudaStream_t s, float *y, const float *x, int64_t xs, int64_t R, int64_t C) {
    if (R <= 0) return cudaSuccess;
    k_softmax<<<cu_row_blocks(R), row_block(), 0, s>>>(y, x, xs, R, C);
    return CU_LAUNCHED();
}

__global__ void k_softmax_back(float *dx, const float *y, const float *g, int64_t gs, int64_t R, int64_t C) {
    ROW_SETUP(R)
    const float *yr = y + r * C, *gr = g + r * gs;
    float *d = dx + r * C;
    float dot = 0.0f;
    for (int64_t c = lane; c < C; c += 32) dot += yr[c] * gr[c];
    dot = warp_sum(dot);
    for (int64_t c = lane; c < C; c += 32) d[c] = yr[c] * (gr[c] - dot);
}

extern "C" cudaError_t cu_softmax_back(cudaStream_t s, float *dx, const float *y, const float *g, int64_t gs,
                                       int64_t R, int64_t C) {
    if (R <= 0) return cudaSuccess;
    k_softmax_back<<<cu_row_blocks(R), row_block(), 0, s>>>(dx, y, g, gs, R, C);
    return CU_LAUNCHED();
}
