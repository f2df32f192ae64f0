/* LayerNorm, RMSNorm and softmax over the last dim, forward and backward (semantics:
 * src/device/cpu/kernels/norm.c, llama_ops.c). Row kernels: one work-group per row, its L work-items
 * (a power of two) striding over the columns, sums and maxima reduced in local memory (wg_sum, wg_max;
 * Note [OpenCL row reductions]). The weight gradients: one work-item per column, rows summed in order as on
 * the CPU (deterministic). Row r of an input starts at r * its row stride; outputs are contiguous. */
#pragma OPENCL FP_CONTRACT OFF

/* Note [OpenCL row reductions]
 * Each work-item sums the columns c = l, l + L, ... of its row (consecutive work-items read consecutive
 * columns: coalesced on a GPU, one vector load per L lanes on PoCL's CPU device); the L partial sums are
 * added by a tree in local memory. The order differs from the CPU's sequential sum, so results agree to
 * the rounding of a sum of C terms (the conformance suite's 1e-4), not bitwise. red has L floats. */
inline float wg_sum(local float *red, float v) {
    int l = (int)get_local_id(0), L = (int)get_local_size(0);
    red[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {
        if (l < s) red[l] += red[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline float wg_max(local float *red, float v) {
    int l = (int)get_local_id(0), L = (int)get_local_size(0);
    red[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {
        if (l < s) red[l] = fmax(red[l], red[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

kernel void k_layernorm(global float *y, long yo, global float *stats, long so, global const float *x, long xo,
                        long xs, global const float *w, long wo, global const float *b, long bo, long R, long C,
                        float eps, local float *red) {
    long r = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    global const float *xr = x + xo + r * xs;
    global float *yr = y + yo + r * C;
    w += wo;
    b += bo;
    float m = 0.0f;
    for (long c = l; c < C; c += L) m += xr[c];
    m = wg_sum(red, m) / (float)C;
    float v = 0.0f;
    for (long c = l; c < C; c += L) v += (xr[c] - m) * (xr[c] - m);
    v = wg_sum(red, v) / (float)C;
    float rs = 1.0f / sqrt(v + eps);
    for (long c = l; c < C; c += L) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
    if (l == 0) {
        stats[so + r] = m;
        stats[so + R + r] = rs;
    }
}

kernel void k_layernorm_back_x(global float *dx, long dxo, global const float *stats, long so, global const float *x,
                               long xo, long xs, global const float *w, long wo, global const float *g, long go,
                               long gs, long R, long C, local float *red) {
    long r = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    global const float *xr = x + xo + r * xs, *gr = g + go + r * gs;
    global float *d = dx + dxo + r * C;
    w += wo;
    float m = stats[so + r], rs = stats[so + R + r], s1 = 0.0f, s2 = 0.0f;
    for (long c = l; c < C; c += L) {
        float dxh = gr[c] * w[c];
        s1 += dxh;
        s2 += dxh * (xr[c] - m) * rs;
    }
    s1 = wg_sum(red, s1) / (float)C;
    s2 = wg_sum(red, s2) / (float)C;
    for (long c = l; c < C; c += L) {
        float xh = (xr[c] - m) * rs;
        d[c] = rs * (gr[c] * w[c] - s1 - xh * s2);
    }
}

/* out (2, C): [dweight; dbias]; one work-item per column */
kernel void k_layernorm_back_wb(global float *out, long oo, global const float *stats, long so, global const float *x,
                                long xo, long xs, global const float *g, long go, long gs, long R, long C) {
    long c = get_global_id(0);
    float aw = 0.0f, ab = 0.0f;
    for (long r = 0; r < R; r++) {
        float xv = x[xo + r * xs + c], gv = g[go + r * gs + c];
        aw += gv * (xv - stats[so + r]) * stats[so + R + r];
        ab += gv;
    }
    out[oo + c] = aw;
    out[oo + C + c] = ab;
}

kernel void k_rmsnorm(global float *y, long yo, global float *rstd, long so, global const float *x, long xo, long xs,
                      global const float *w, long wo, int has_w, long C, float eps, local float *red) {
    long r = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    global const float *xr = x + xo + r * xs;
    global float *yr = y + yo + r * C;
    w += wo;
    float ss = 0.0f;
    for (long c = l; c < C; c += L) ss += xr[c] * xr[c];
    ss = wg_sum(red, ss);
    float rs = 1.0f / sqrt(ss / (float)C + eps);
    for (long c = l; c < C; c += L) yr[c] = has_w ? w[c] * (xr[c] * rs) : xr[c] * rs;
    if (l == 0) rstd[so + r] = rs;
}

kernel void k_rmsnorm_back_x(global float *dx, long dxo, global const float *rstd, long so, global const float *x,
                             long xo, long xs, global const float *w, long wo, int has_w, global const float *g,
                             long go, long gs, long C, local float *red) {
    long r = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    global const float *xr = x + xo + r * xs, *gr = g + go + r * gs;
    global float *d = dx + dxo + r * C;
    w += wo;
    float rs = rstd[so + r], s = 0.0f;
    for (long c = l; c < C; c += L) s += (has_w ? gr[c] * w[c] : gr[c]) * xr[c] * rs;
    s = wg_sum(red, s) / (float)C;
    for (long c = l; c < C; c += L) d[c] = rs * ((has_w ? gr[c] * w[c] : gr[c]) - xr[c] * rs * s);
}

kernel void k_rmsnorm_back_w(global float *dw, long dwo, global const float *rstd, long so, global const float *x,
                             long xo, long xs, global const float *g, long go, long gs, long R) {
    long c = get_global_id(0);
    float acc = 0.0f;
    for (long r = 0; r < R; r++) acc += g[go + r * gs + c] * (x[xo + r * xs + c] * rstd[so + r]);
    dw[dwo + c] = acc;
}

kernel void k_softmax(global float *y, long yo, global const float *x, long xo, long xs, long C, local float *red) {
    long r = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    global const float *xr = x + xo + r * xs;
    global float *yr = y + yo + r * C;
    float mx = -INFINITY;
    for (long c = l; c < C; c += L) mx = xr[c] > mx ? xr[c] : mx;
    mx = wg_max(red, mx);
    float s = 0.0f;
    for (long c = l; c < C; c += L) {
        yr[c] = exp(xr[c] - mx);
        s += yr[c];
    }
    float inv = 1.0f / wg_sum(red, s);
    for (long c = l; c < C; c += L) yr[c] *= inv;
}

/* also the top-k gate's backward (zero where y is zero) */
kernel void k_softmax_back(global float *dx, long dxo, global const float *y, long yo, global const float *g, long go,
                           long gs, long C, local float *red) {
    long r = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    global const float *yr = y + yo + r * C, *gr = g + go + r * gs;
    global float *d = dx + dxo + r * C;
    float dot = 0.0f;
    for (long c = l; c < C; c += L) dot += yr[c] * gr[c];
    dot = wg_sum(red, dot);
    for (long c = l; c < C; c += L) d[c] = yr[c] * (gr[c] - dot);
}
