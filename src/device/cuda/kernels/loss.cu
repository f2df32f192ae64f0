/* Embedding lookup and its backward, cross-entropy (port of src/device/opencl/kernels/loss.cl; semantics:
 * src/device/cpu/kernels/embed_loss.c). Out-of-range ids and targets set flag = {1, id}; the host reads it
 * after the node and fails by name.
 *
 * Note [CUDA tensor parallelism]
 * The vocabulary-parallel ops of a TP graph (semantics: src/device/cpu/kernels/tp_kernels.c; the port of
 * Note [OpenCL tensor parallelism], src/device/opencl/kernels/loss.cl): the embedding of a vocab shard [lo, lo
 * + V) (ids outside it give zero rows, a negative id is flagged) and its backward (only the shard's rows;
 * ordered per column, or atomics as the whole-table backward), CE_VP_STATS (the shard's logsumexp per row by
 * k_ce_lse without the target bound, and the target's logit where the shard holds it), CE_VP (the group's
 * stats -> the global logsumexp and the mean loss in double, one thread, rows in order as the CPU's
 * sl_k_ce_vp), CE_VP_BACK (k_ce_mean mode 2 counts every target >= 0; k_ce_back with the shard's first id
 * tlo). Compiled by nvcc, not yet run on a GPU. */
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

/* a vocab shard [lo, lo + V) of the table (Note [CUDA tensor parallelism]) */
__global__ void k_embedding_shard(float *out, const float *tab, const int32_t *ids, int64_t N, int64_t V,
                                  int64_t C, int64_t lo, int *flag) {
    CU_LOOP(i, N * C) {
        int64_t r = i / C, c = i % C;
        int id = ids[r];
        int64_t k = (int64_t)id - lo;
        if (id < 0 && c == 0) set_flag(flag, id);
        out[i] = id >= 0 && k >= 0 && k < V ? tab[k * C + c] : 0.0f;
    }
}

extern "C" cudaError_t cu_embedding_shard(cudaStream_t s, float *out, const float *tab, const int32_t *ids,
                                          int64_t N, int64_t V, int64_t C, int64_t lo, int *flag) {
    if (N * C <= 0) return cudaSuccess;
    k_embedding_shard<<<cu_blocks(N * C), CU_THREADS, 0, s>>>(out, tab, ids, N, V, C, lo, flag);
    return CU_LAUNCHED();
}

__global__ void k_embedding_back_shard_ordered(float *d, const int32_t *ids, const float *g, int64_t N,
                                               int64_t V, int64_t C, int64_t lo) {
    CU_LOOP(c, C) {
        for (int64_t i = 0; i < N; i++) {
            int64_t k = (int64_t)ids[i] - lo;
            if (k >= 0 && k < V) d[k * C + c] += g[i * C + c];
        }
    }
}

__global__ void k_embedding_back_shard_atomic(float *d, const int32_t *ids, const float *g, int64_t N,
                                              int64_t V, int64_t C, int64_t lo) {
    CU_LOOP(i, N * C) {
        int64_t r = i / C, c = i % C, k = (int64_t)ids[r] - lo;
        if (k >= 0 && k < V) atomicAdd(&d[k * C + c], g[i]);
    }
}

extern "C" cudaError_t cu_embedding_back_shard(cudaStream_t s, float *d, const int32_t *ids, const float *g,
                                               int64_t N, int64_t V, int64_t C, int64_t lo, int deterministic) {
    if (N * C <= 0) return cudaSuccess;
    if (deterministic)
        k_embedding_back_shard_ordered<<<cu_blocks(C), CU_THREADS, 0, s>>>(d, ids, g, N, V, C, lo);
    else
        k_embedding_back_shard_atomic<<<cu_blocks(N * C), CU_THREADS, 0, s>>>(d, ids, g, N, V, C, lo);
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

/* lse[i] = logsumexp of logits row i; one warp per row; targets >= vcheck are flagged */
__global__ void k_ce_lse(float *lse, const float *x, const int32_t *tg, int64_t N, int64_t V, int64_t vcheck,
                         int *flag) {
    int64_t r = (int64_t)blockIdx.x * CU_ROWS_PER_BLOCK + threadIdx.y;
    int lane = threadIdx.x;
    if (r >= N) return;
    const float *xr = x + r * V;
    if (lane == 0 && tg[r] >= vcheck) set_flag(flag, tg[r]);
    float mx = -INFINITY;
    for (int64_t j = lane; j < V; j += 32) mx = fmaxf(mx, xr[j]);
    mx = warp_max(mx);
    float sm = 0.0f;
    for (int64_t j = lane; j < V; j += 32) sm += expf(xr[j] - mx);
    sm = warp_sum(sm);
    if (lane == 0) lse[r] = mx + logf(sm);
}

extern "C" cudaError_t cu_ce_lse(cudaStream_t s, float *lse, const float *x, const int32_t *tg, int64_t N,
                                 int64_t V, int64_t vcheck, int *flag) {
    if (N <= 0) return cudaSuccess;
    k_ce_lse<<<cu_row_blocks(N), dim3(32, CU_ROWS_PER_BLOCK), 0, s>>>(lse, x, tg, N, V, vcheck, flag);
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
        if (t < 0 || (t >= V && mode != 2)) continue; /* mode 2: a shard's targets are global ids */
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
                          int64_t N, int64_t V, int64_t tlo) {
    float sc = scale[0];
    CU_LOOP(i, N * V) {
        int64_t r = i / V, j = i % V;
        int t = tg[r];
        if (t < 0) {
            d[i] = 0.0f;
            continue;
        }
        float v = expf(x[i] - lse[r]) * sc;
        d[i] = j == (int64_t)t - tlo ? v - sc : v; /* tlo: a vocab shard's first id (0: the whole vocab) */
    }
}

extern "C" cudaError_t cu_ce_back(cudaStream_t s, float *d, const float *lse, const float *x, const int32_t *tg,
                                  const float *scale, int64_t N, int64_t V, int64_t tlo) {
    if (N * V <= 0) return cudaSuccess;
    k_ce_back<<<cu_blocks(N * V), CU_THREADS, 0, s>>>(d, lse, x, tg, scale, N, V, tlo);
    return CU_LAUNCHED();
}

/* CE_VP_STATS: out (N, 2) = [the shard's logsumexp (from k_ce_lse), the target's logit if it lies in the
 * shard [lo, lo + V) else 0] */
__global__ void k_ce_vp_stats(float *out, const float *lse, const float *x, const int32_t *tg, int64_t N,
                              int64_t V, int64_t lo) {
    CU_LOOP(i, N) {
        int t = tg[i];
        int64_t j = (int64_t)t - lo;
        out[2 * i] = lse[i];
        out[2 * i + 1] = t >= 0 && j >= 0 && j < V ? x[i * V + j] : 0.0f;
    }
}

extern "C" cudaError_t cu_ce_vp_stats(cudaStream_t s, float *out, const float *lse, const float *x,
                                      const int32_t *tg, int64_t N, int64_t V, int64_t lo) {
    if (N <= 0) return cudaSuccess;
    k_ce_vp_stats<<<cu_blocks(N), CU_THREADS, 0, s>>>(out, lse, x, tg, N, V, lo);
    return CU_LAUNCHED();
}

/* CE_VP: the group's stats (P, N, 2) -> the global logsumexp per row (max-shifted) into lse, and the mean
 * loss over targets >= 0 into out[0]; one thread, rows in order, the total in double (the CPU's sl_k_ce_vp) */
__global__ void k_ce_vp(float *out, float *lse, const int32_t *tg, const float *st, int64_t N, int64_t P) {
    double total = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) {
        float M = -INFINITY, tl = 0;
        for (int64_t r = 0; r < P; r++) {
            float l = st[(r * N + i) * 2];
            M = l > M ? l : M;
            tl += st[(r * N + i) * 2 + 1];
        }
        float sm = 0;
        for (int64_t r = 0; r < P; r++) sm += expf(st[(r * N + i) * 2] - M);
        float li = M + logf(sm);
        lse[i] = li;
        if (tg[i] >= 0) {
            total += (double)li - (double)tl;
            cnt++;
        }
    }
    out[0] = cnt ? (float)(total / (double)cnt) : 0.0f;
}

extern "C" cudaError_t cu_ce_vp(cudaStream_t s, float *out, float *lse, const int32_t *tg, const float *st,
                                int64_t N, int64_t P) {
    k_ce_vp<<<1, 1, 0, s>>>(out, lse, tg, st, N, P);
    return CU_LAUNCHED();
}
