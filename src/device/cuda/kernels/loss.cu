/* Embedding lookup and its backward, cross-entropy (port of src/device/opencl/kernels/loss.cl; semantics:
 * src/device/cpu/kernels/embed_loss.c). Out-of-range ids and targets set flag = {1, id}; the host reads it
 * after the node and fails by name. */
#include "common.cuh"

__device__ __forceinline__ void set_flag(int *flag, int id) {
    if (atomicCAS(flag, 0, 1) == 0) flag[1] = id;
}

__global__ void k_embedding(float *out, const float *tab, const int32_t *ids, int64_t N, int64_t V, int64_t C,
                            int *flag) {
    CU_LOOP(i, N * C) {
        int64_t r = i / C, c = i % C;
        int id = ids[r];
        if (id < 0 || id >= V) {
            if (c == 0) set_flag(flag, id);
            out[i] = 0.0f;
            continue;
        }
        out[i] = tab[(int64_t)id * C + c];
    }
}

extern "C" cudaError_t cu_embedding(cudaStream_t s, float *out, const float *tab, const int32_t *ids, int64_t N,
                                    int64_t V, int64_t C, int *flag) {
    if (N * C <= 0) return cudaSuccess;
    k_embedding<<<cu_blocks(N * C), CU_THREADS, 0, s>>>(out, tab, ids, N, V, C, flag);
    return CU_LAUNCHED();
}

/* deterministic: one thread per column, positions added in order (the CPU's result bit for bit) */
__global__ void k_embedding_back_ordered(float *d, const int32_t *ids, const float *g, int64_t N, int64_t V,
                                         int64_t C, int *flag) {
    CU_LOOP(c, C) {
        for (int64_t i = 0; i < N; i++) {
            int id = ids[i];
            if (id < 0 || id >= V) {
                if (c == 0) set_flag(flag, id);
                continue;
            }
            d[(int64_t)id * C + c] += g[i * C + c];
        }
    }
}

/* fast: one thread per (position, column), atomicAdd (order of a repeated token's additions varies) */
__global__ void k_embedding_back_atomic(float *d, const int32_t *ids, const float *g, int64_t N, int64_t V,
                                        int64_t C, int *flag) {
    CU_LOOP(i, N * C) {
        int64_t r = i / C, c = i % C;
        int id = ids[r];
        if (id < 0 || id >= V) {
            if (c == 0) set_flag(flag, id);
            continue;
        }
        atomicAdd(&d[(int64_t)id * C + c], g[i]);
    }
}

extern "C" cudaError_t cu_embedding_back(cudaStream_t s, float *d, const int32_t *ids, const float *g, int64_t N,
                                         int64_t V, int64_t C, int *flag, int deterministic) {
    if (N * C <= 0) return cudaSuccess;
    if (deterministic)
        k_embedding_back_ordered<<<cu_blocks(C), CU_THREADS, 0, s>>>(d, ids, g, N, V, C, flag);
    else
        k_embedding_back_atomic<<<cu_blocks(N * C), CU_THREADS, 0, s>>>(d, ids, g, N, V, C, flag);
    return CU_LAUNCHED();
}

/* lse[i] = logsumexp of logits row i; one warp per row */
__global__ void k_ce_lse(float *lse, const float *x, const int32_t *tg, int64_t N, int64_t V, int *flag) {
    int64_t r = (int64_t)blockIdx.x * CU_ROWS_PER_BLOCK + threadIdx.y;
    int lane = threadIdx.x;
    if (r >= N) return;
    const float *xr = x + r * V;
    if (lane == 0 && tg[r] >= V) set_flag(flag, tg[r]);
    float mx = -INFINITY;
    for (int64_t j = lane; j < V; j += 32) mx = fmaxf(mx, xr[j]);
    mx = warp_max(mx);
    float sm = 0.0f;
    for (int64_t j = lane; j < V; j += 32) sm += expf(xr[j] - mx);
    sm = warp_sum(sm);
    if (lane == 0) lse[r] = mx + logf(sm);
}

extern "C" cudaError_t cu_ce_lse(cudaStream_t s, float *lse, const float *x, const int32_t *tg, int64_t N,
                                 int64_t V, int *flag) {
    if (N <= 0) return cudaSuccess;
    k_ce_lse<<<cu_row_blocks(N), dim3(32, CU_ROWS_PER_BLOCK), 0, s>>>(lse, x, tg, N, V, flag);
    return CU_LAUNCHED();
}

/* one block of 1024 threads: thread j sums rows j, j + 1024, ... in double, then a fixed tree: the result
 * depends only on N (deterministic) */
__global__ void k_ce_mean(int mode, float *out, const float *lse, const float *x, const int32_t *tg,
                          const float *dl, int64_t N, int64_t V) {
    __shared__ double st[1024];
    __shared__ long long sc[1024];
    double total = 0;
    long long cnt = 0;
    for (int64_t i = threadIdx.x; i < N; i += 1024) {
        int t = tg[i];
        if (t < 0 || t >= V) continue;
        if (mode == 0) total += (double)lse[i] - (double)x[i * V + t];
        cnt++;
    }
    st[threadIdx.x] = total;
    sc[threadIdx.x] = cnt;
    __syncthreads();
    for (int w = 512; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            st[threadIdx.x] += st[threadIdx.x + w];
            sc[threadIdx.x] += sc[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (mode == 0)
            out[0] = sc[0] ? (float)(st[0] / (double)sc[0]) : 0.0f;
        else
            out[0] = sc[0] ? dl[0] / (float)sc[0] : 0.0f;
    }
}

extern "C" cudaError_t cu_ce_mean(cudaStream_t s, int mode, float *out, const float *lse, const float *x,
                                  const int32_t *tg, const float *dl, int64_t N, int64_t V) {
    k_ce_mean<<<1, 1024, 0, s>>>(mode, out, lse, x, tg, dl, N, V);
    return CU_LAUNCHED();
}

/* d (N, V) = softmax(logits) * scale - onehot(target) * scale; rows with target < 0 are zero */
__global__ void k_ce_back(float *d, const float *lse, const float *x, const int32_t *tg, const float *scale,
                          int64_t N, int64_t V) {
    float sc = scale[0];
    CU_LOOP(i, N * V) {
        int64_t r = i / V, j = i % V;
        int t = tg[r];
        if (t < 0) {
            d[i] = 0.0f;
            continue;
        }
        float v = expf(x[i] - lse[r]) * sc;
        d[i] = j == t ? v - sc : v;
    }
}

extern "C" cudaError_t cu_ce_back(cudaStream_t s, float *d, const float *lse, const float *x, const int32_t *tg,
                                  const float *scale, int64_t N, int64_t V) {
    if (N * V <= 0) return cudaSuccess;
    k_ce_back<<<cu_blocks(N * V), CU_THREADS, 0, s>>>(d, lse, x, tg, scale, N, V);
    return CU_LAUNCHED();
}
