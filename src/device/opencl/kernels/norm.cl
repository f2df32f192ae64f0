/* LayerNorm, RMSNorm and softmax over the last dim, forward and backward (semantics:
 * src/device/cpu/kernels/norm.c, llama_ops.c). First version: one work-item per row (forward, backward x)
 * or per column (the weight gradients, whose rows are summed in order as on the CPU, so they are
 * deterministic). Row r of an input starts at r * its row stride; outputs are contiguous. */
#pragma OPENCL FP_CONTRACT OFF

kernel void k_layernorm(global float *y, long yo, global float *stats, long so, global const float *x, long xo,
                        long xs, global const float *w, long wo, global const float *b, long bo, long R, long C,
                        float eps) {
    long r = get_global_id(0);
    global const float *xr = x + xo + r * xs;
    global float *yr = y + yo + r * C;
    w += wo;
    b += bo;
    float m = 0.0f;
    for (long c = 0; c < C; c++) m += xr[c];
    m /= (float)C;
    float v = 0.0f;
    for (long c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
    v /= (float)C;
    float rs = 1.0f / sqrt(v + eps);
    for (long c = 0; c < C; c++) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
    stats[so + r] = m;
    stats[so + R + r] = rs;
}

kernel void k_layernorm_back_x(global float *dx, long dxo, global const float *stats, long so, global const float *x,
                               long xo, long xs, global const float *w, long wo, global const float *g, long go,
                               long gs, long R, long C) {
    long r = get_global_id(0);
    global const float *xr = x + xo + r * xs, *gr = g + go + r * gs;
    global float *d = dx + dxo + r * C;
    w += wo;
    float m = stats[so + r], rs = stats[so + R + r], s1 = 0.0f, s2 = 0.0f;
    for (long c = 0; c < C; c++) {
        float dxh = gr[c] * w[c];
        s1 += dxh;
        s2 += dxh * (xr[c] - m) * rs;
    }
    s1 /= (float)C;
    s2 /= (float)C;
    for (long c = 0; c < C; c++) {
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
                      global const float *w, long wo, int has_w, long C, float eps) {
    long r = get_global_id(0);
    global const float *xr = x + xo + r * xs;
    global float *yr = y + yo + r * C;
    w += wo;
    float ss = 0.0f;
    for (long c = 0; c < C; c++) ss += xr[c] * xr[c];
    float rs = 1.0f / sqrt(ss / (float)C + eps);
    for (long c = 0; c < C; c++) yr[c] = has_w ? w[c] * (xr[c] * rs) : xr[c] * rs;
    rstd[so + r] = rs;
}

kernel void k_rmsnorm_back_x(global float *dx, long dxo, global const float *rstd, long so, global const float *x,
                             long xo, long xs, global const float *w, long wo, int has_w, global const float *g,
                             long go, long gs, long C) {
    long r = get_global_id(0);
    global const float *xr = x + xo + r * xs, *gr = g + go + r * gs;
    global float *d = dx + dxo + r * C;
    w += wo;
    float rs = rstd[so + r], s = 0.0f;
    if (has_w) {
        for (long c = 0; c < C; c++) s += gr[c] * w[c] * xr[c] * rs;
        s /= (float)C;
        for (long c = 0; c < C; c++) d[c] = rs * (gr[c] * w[c] - xr[c] * rs * s);
    } else {
        for (long c = 0; c < C; c++) s += gr[c] * xr[c] * rs;
        s /= (float)C;
        for (long c = 0; c < C; c++) d[c] = rs * (gr[c] - xr[c] * rs * s);
    }
}

kernel void k_rmsnorm_back_w(global float *dw, long dwo, global const float *rstd, long so, global const float *x,
                             long xo, long xs, global const float *g, long go, long gs, long R) {
    long c = get_global_id(0);
    float acc = 0.0f;
    for (long r = 0; r < R; r++) acc += g[go + r * gs + c] * (x[xo + r * xs + c] * rstd[so + r]);
    dw[dwo + c] = acc;
}

kernel void k_softmax(global float *y, long yo, global const float *x, long xo, long xs, long C) {
    long r = get_global_id(0);
    global const float *xr = x + xo + r * xs;
    global float *yr = y + yo + r * C;
    float mx = -INFINITY;
    for (long c = 0; c < C; c++) mx = xr[c] > mx ? xr[c] : mx;
    float s = 0.0f;
    for (long c = 0; c < C; c++) {
        yr[c] = exp(xr[c] - mx);
        s += yr[c];
    }
    float inv = 1.0f / s;
    for (long c = 0; c < C; c++) yr[c] *= inv;
}

/* also the top-k gate's backward (zero where y is zero) */
kernel void k_softmax_back(global float *dx, long dxo, global const float *y, long yo, global const float *g, long go,
                           long gs, long C) {
    long r = get_global_id(0);
    global const float *yr = y + yo + r * C, *gr = g + go + r * gs;
    global float *d = dx + dxo + r * C;
    float dot = 0.0f;
    for (long c = 0; c < C; c++) dot += yr[c] * gr[c];
    for (long c = 0; c < C; c++) d[c] = yr[c] * (gr[c] - dot);
}
