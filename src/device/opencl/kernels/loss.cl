/* Embedding lookup and its backward, cross-entropy (semantics: src/device/cpu/kernels/embed_loss.c).
 * Out-of-range ids and targets set flag = {1, id}; the host reads it after the node and fails by name. */
#pragma OPENCL FP_CONTRACT OFF
#ifdef SL_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double acc_t;
#else
typedef float acc_t;
#endif

inline void set_flag(global int *flag, int id) {
    if (atomic_cmpxchg(flag, 0, 1) == 0) flag[1] = id;
}

/* out (N, C) = table[ids] */
kernel void k_embedding(global float *out, long oo, global const float *tab, long to, global const int *ids, long io,
                        long V, long C, global int *flag) {
    long i = get_global_id(0), r = i / C, c = i % C;
    int id = ids[io + r];
    if (id < 0 || id >= V) {
        set_flag(flag, id);
        out[oo + i] = 0.0f;
        return;
    }
    out[oo + i] = tab[to + (long)id * C + c];
}

/* d[ids[i]] += dy[i] for every position, one work-item per column: positions are added in order, so the
 * result is deterministic and bitwise the CPU's. */
kernel void k_embedding_back(global float *d, long dofs, global const int *ids, long io, global const float *g, long go,
                             long N, long V, long C, global int *flag) {
    long c = get_global_id(0);
    for (long i = 0; i < N; i++) {
        int id = ids[io + i];
        if (id < 0 || id >= V) {
            set_flag(flag, id);
            continue;
        }
        d[dofs + (long)id * C + c] += g[go + i * C + c];
    }
}

/* lse[i] = logsumexp of logits row i: one work-group per row, maxima and sums reduced in local memory
 * (Note [OpenCL row reductions] in norm.cl; red has L floats, L a power of two) */
kernel void k_ce_lse(global float *lse, long lo, global const float *x, long xo, global const int *tg, long tgo, long V,
                     global int *flag, local float *red) {
    long i = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    int li = (int)l, Li = (int)L;
    global const float *xr = x + xo + i * V;
    if (l == 0 && tg[tgo + i] >= V) set_flag(flag, tg[tgo + i]);
    float mx = -INFINITY;
    for (long j = l; j < V; j += L) mx = xr[j] > mx ? xr[j] : mx;
    red[li] = mx;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = Li / 2; s > 0; s >>= 1) {
        if (li < s) red[li] = fmax(red[li], red[li + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    mx = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float sum = 0.0f;
    for (long j = l; j < V; j += L) sum += exp(xr[j] - mx);
    red[li] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = Li / 2; s > 0; s >>= 1) {
        if (li < s) red[li] += red[li + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) lse[lo + i] = mx + log(red[0]);
}

/* mode 0: out[0] = mean over rows with target >= 0 of lse - logit[target] (in double when available);
 * mode 1: out[0] = dloss / count (the backward's scale). One work-item. */
kernel void k_ce_mean(global float *out, long oo, global const float *lse, long lo, global const float *x, long xo,
                      global const int *tg, long tgo, global const float *dl, long dlo, long N, long V, int mode) {
    acc_t total = 0;
    long cnt = 0;
    for (long i = 0; i < N; i++) {
        int t = tg[tgo + i];
        if (t < 0 || t >= V) continue;
        if (mode == 0) total += (acc_t)lse[lo + i] - (acc_t)x[xo + i * V + t];
        cnt++;
    }
    if (mode == 0)
        out[oo] = cnt ? (float)(total / (acc_t)cnt) : 0.0f;
    else
        out[oo] = cnt ? dl[dlo] / (float)cnt : 0.0f;
}

/* d (N, V) = softmax(logits) * scale - onehot(target) * scale; rows with target < 0 are zero */
kernel void k_ce_back(global float *d, long dofs, global const float *lse, long lo, global const float *x, long xo,
                      global const int *tg, long tgo, global const float *scale, long V) {
    long i = get_global_id(0), r = i / V, j = i % V;
    int t = tg[tgo + r];
    if (t < 0) {
        d[dofs + i] = 0.0f;
        return;
    }
    float s = scale[0], v = exp(x[xo + i] - lse[lo + r]) * s;
    d[dofs + i] = j == t ? v - s : v;
}
