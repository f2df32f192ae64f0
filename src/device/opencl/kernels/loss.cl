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

/* Note [OpenCL tensor parallelism]: the vocabulary-parallel ops of a TP graph (semantics: tp_kernels.c of
 * the CPU backend). The embedding of a vocab shard [lo, lo + V): ids outside it give zero rows (another rank
 * holds them), a negative id is flagged; its backward adds only the shard's rows, positions in order. */
kernel void k_embedding_shard(global float *out, long oo, global const float *tab, long to, global const int *ids,
                              long io, long V, long C, long lo, global int *flag) {
    long i = get_global_id(0), r = i / C, c = i % C;
    int id = ids[io + r];
    long k = (long)id - lo;
    if (id < 0) set_flag(flag, id);
    out[oo + i] = id >= 0 && k >= 0 && k < V ? tab[to + k * C + c] : 0.0f;
}

kernel void k_embedding_back_shard(global float *d, long dofs, global const int *ids, long io, global const float *g,
                                   long go, long N, long V, long C, long lo) {
    long c = get_global_id(0);
    for (long i = 0; i < N; i++) {
        long k = (long)ids[io + i] - lo;
        if (k >= 0 && k < V) d[dofs + k * C + c] += g[go + i * C + c];
    }
}

/* CE_VP_STATS: out (N, 2) = [the shard's logsumexp (from k_ce_lse), the target's logit if it lies in the
 * shard else 0] */
kernel void k_ce_vp_stats(global float *out, long oo, global const float *lse, global const float *x, long xo,
                          global const int *tg, long tgo, long V, long lo) {
    long i = get_global_id(0);
    int t = tg[tgo + i];
    long j = (long)t - lo;
    out[oo + 2 * i] = lse[i];
    out[oo + 2 * i + 1] = t >= 0 && j >= 0 && j < V ? x[xo + i * V + j] : 0.0f;
}

/* CE_VP: the group's stats (P, N, 2) -> the global logsumexp per row (max-shifted) into lse, and the mean
 * loss over targets >= 0 into out[0]; one work-item, rows in order (as the CPU's sl_k_ce_vp) */
kernel void k_ce_vp(global float *out, long oo, global float *lse, long lo, global const int *tg, long tgo,
                    global const float *st, long so, long N, long P) {
    acc_t total = 0;
    long cnt = 0;
    for (long i = 0; i < N; i++) {
        float M = -INFINITY, tl = 0;
        for (long r = 0; r < P; r++) {
            float l = st[so + (r * N + i) * 2];
            M = l > M ? l : M;
            tl += st[so + (r * N + i) * 2 + 1];
        }
        float s = 0;
        for (long r = 0; r < P; r++) s += exp(st[so + (r * N + i) * 2] - M);
        float li = M + log(s);
        lse[lo + i] = li;
        if (tg[tgo + i] >= 0) {
            total += (acc_t)li - (acc_t)tl;
            cnt++;
        }
    }
    out[oo] = cnt ? (float)(total / (acc_t)cnt) : 0.0f;
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

inline float hmax16(float16 v) {
    float8 a = fmax(v.lo, v.hi);
    float4 b = fmax(a.lo, a.hi);
    float2 c = fmax(b.lo, b.hi);
    return fmax(c.x, c.y);
}
inline float hsum16(float16 v) {
    float8 a = v.lo + v.hi;
    float4 b = a.lo + a.hi;
    float2 c = b.lo + b.hi;
    return c.x + c.y;
}

/* lse[i] = logsumexp of logits row i: one work-group per row, maxima and sums reduced in local memory
 * (Note [OpenCL row reductions] in norm.cl; red has L floats, L a power of two). Note [OpenCL vector
 * cross-entropy]: each work-item takes 16-float chunks l, l + L, ... of the row as float16 (vector max,
 * vector exp), the V % 16 tail element by element; one element per work-item and step ran the exp scalar,
 * ~3 ns per logit on PoCL's CPU device (cross-entropy and its backward were 7.5 % of the GPT-2 124M
 * step, 10x the CPU backend's share). */
kernel void k_ce_lse(global float *lse, long lo, global const float *x, long xo, global const int *tg, long tgo, long V,
                     long vcheck, global int *flag, local float *red) {
    long i = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    int li = (int)l, Li = (int)L;
    global const float *xr = x + xo + i * V;
    const long nc = V / 16;
    if (l == 0 && tg[tgo + i] >= vcheck) set_flag(flag, tg[tgo + i]); /* vcheck: V, or none (a shard) */
    float16 m16 = (float16)(-INFINITY);
    for (long c = l; c < nc; c += L) m16 = fmax(m16, vload16(c, xr));
    float mx = hmax16(m16);
    for (long j = nc * 16 + l; j < V; j += L) mx = xr[j] > mx ? xr[j] : mx;
    red[li] = mx;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = Li / 2; s > 0; s >>= 1) {
        if (li < s) red[li] = fmax(red[li], red[li + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    mx = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float16 s16 = (float16)(0.0f);
    for (long c = l; c < nc; c += L) s16 += exp(vload16(c, xr) - mx);
    float sum = hsum16(s16);
    for (long j = nc * 16 + l; j < V; j += L) sum += exp(xr[j] - mx);
    red[li] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = Li / 2; s > 0; s >>= 1) {
        if (li < s) red[li] += red[li + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) lse[lo + i] = mx + log(red[0]);
}

/* mode 0: out[0] = mean over rows with target >= 0 of lse - logit[target] (in double when available);
 * mode 1: out[0] = dloss / count (the backward's scale); mode 2: the same with every target >= 0 counted
 * (a vocab shard's targets are global ids). One work-item. */
kernel void k_ce_mean(global float *out, long oo, global const float *lse, long lo, global const float *x, long xo,
                      global const int *tg, long tgo, global const float *dl, long dlo, long N, long V, int mode) {
    acc_t total = 0;
    long cnt = 0;
    for (long i = 0; i < N; i++) {
        int t = tg[tgo + i];
        if (t < 0 || (t >= V && mode != 2)) continue;
        if (mode == 0) total += (acc_t)lse[lo + i] - (acc_t)x[xo + i * V + t];
        cnt++;
    }
    if (mode == 0)
        out[oo] = cnt ? (float)(total / (acc_t)cnt) : 0.0f;
    else
        out[oo] = cnt ? dl[dlo] / (float)cnt : 0.0f;
}

/* d (N, V) = softmax(logits) * scale - onehot(target) * scale; rows with target < 0 are zero. One
 * work-item per 16 columns of a row (global (ceil(V / 16), N)), as float16 (Note [OpenCL vector
 * cross-entropy]); the target's element is the stored softmax value minus scale, as before. */
kernel void k_ce_back(global float *d, long dofs, global const float *lse, long lo, global const float *x, long xo,
                      global const int *tg, long tgo, global const float *scale, long V, long tlo) {
    const long j0 = get_global_id(0) * 16, r = get_global_id(1), j1 = min(V, j0 + 16);
    const int t = tg[tgo + r];
    global float *dr = d + dofs + r * V;
    global const float *xr = x + xo + r * V;
    if (t < 0) {
        for (long j = j0; j < j1; j++) dr[j] = 0.0f;
        return;
    }
    const float s = scale[0], m = lse[lo + r];
    if (j1 - j0 == 16)
        vstore16(exp(vload16(0, xr + j0) - m) * s, 0, dr + j0);
    else
        for (long j = j0; j < j1; j++) dr[j] = exp(xr[j] - m) * s;
    const long tt = (long)t - tlo; /* tlo: the vocab shard's first id (0: the whole vocabulary) */
    if (tt >= j0 && tt < j1) dr[tt] = dr[tt] - s;
}
