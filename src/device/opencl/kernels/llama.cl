/* Llama-family kernels: rotate-half RoPE (with its half-precision numerics), the top-k routing gate, and the
 * sparse MoE expert of inference (semantics: src/device/cpu/kernels/llama_ops.c; SiLU is in elementwise.cl).
 * The bf16-numerics variant of MOE_EXPERT (iparams[1]) runs on the register GEMM: Note [OpenCL bf16 experts]
 * in opencl_ops_moe.c, kernels in moe.cl. */
#pragma OPENCL FP_CONTRACT OFF

/* y (B,T,NH,hs) contiguous; inv (hs/2): inverse frequencies computed on the host exactly as the CPU does
 * (Note [RoPE numerics]); one work-item per (b, t, h, i < hs/2). cos/sin of the float angle are taken in
 * double when the device has it, as the CPU does. */
/* Half numerics (Note [RoPE numerics]): bf = 1 (bf16) or 2 (f16) rounds every product and sum as the CPU
 * does, round_cs also cos and sin first (ROPE iparams[2] 1 / 2 -> bf 1 / 2 with round_cs; 5 / 6, autocast's
 * backward -> bf 1 / 2; 0, 3, 4 -> fp32). */
inline float rope_round(float x, int bf) { return bf == 2 ? rf16(x) : rbf16(x); }
kernel void k_rope(global float *y, long yo, global const float *x, long xo, long4 xs, global const float *inv, long T,
                   long NH, long hs, long pos0, float sgn, int bf, int round_cs) {
    long nh2 = hs / 2, idx = get_global_id(0);
    long i = idx % nh2, h = (idx / nh2) % NH, t = (idx / (nh2 * NH)) % T, b = idx / (nh2 * NH * T);
    float ang = (float)(pos0 + t) * inv[i];
#ifdef SL_FP64
    float cs = (float)cos((double)ang), sn = sgn * (float)sin((double)ang);
#else
    float cs = cos(ang), sn = sgn * sin(ang);
#endif
    global const float *xr = x + xo + b * xs.s0 + t * xs.s1 + h * xs.s2;
    global float *yr = y + yo + ((b * T + t) * NH + h) * hs;
    float x1 = xr[i], x2 = xr[i + nh2];
    if (round_cs) cs = rope_round(cs, bf), sn = rope_round(sn, bf);
    if (bf) {
        yr[i] = rope_round(rope_round(x1 * cs, bf) + rope_round(-x2 * sn, bf), bf);
        yr[i + nh2] = rope_round(rope_round(x2 * cs, bf) + rope_round(x1 * sn, bf), bf);
        return;
    }
    yr[i] = x1 * cs - x2 * sn;
    yr[i + nh2] = x2 * cs + x1 * sn;
}

/* softmax over the top-k logits of each row, zero elsewhere; ties go to the lower index */
kernel void k_topk_gate(global float *y, long yo, global const float *x, long xo, long xs, long E, int k) {
    long r = get_global_id(0);
    global const float *xr = x + xo + r * xs;
    global float *yr = y + yo + r * E;
    for (long e = 0; e < E; e++) yr[e] = 0.0f;
    float mx = -INFINITY;
    for (int j = 0; j < k; j++) {
        long best = -1;
        for (long e = 0; e < E; e++)
            if (yr[e] == 0.0f && (best < 0 || xr[e] > xr[best])) best = e;
        yr[best] = 1.0f; /* marker */
        if (xr[best] > mx) mx = xr[best];
    }
#ifdef SL_FP64
    double s = 0;
    for (long e = 0; e < E; e++)
        if (yr[e] != 0.0f) s += exp((double)xr[e] - mx);
    for (long e = 0; e < E; e++)
        if (yr[e] != 0.0f) yr[e] = (float)(exp((double)xr[e] - mx) / s);
#else
    float s = 0;
    for (long e = 0; e < E; e++)
        if (yr[e] != 0.0f) s += exp(xr[e] - mx);
    for (long e = 0; e < E; e++)
        if (yr[e] != 0.0f) yr[e] = exp(xr[e] - mx) / s;
#endif
}

/* Sparse expert e, step 1: a[r, i] = silu(h_r . w1_i) * (h_r . w3_i) for the rows routed to e
 * (gate[r, e] != 0); one work-item per (r, i). */
kernel void k_moe_up(global float *a, global const float *hh, long ho, global const float *gate, long gto, long gs,
                     long e, global const float *w1, long w1o, global const float *w3, long w3o, long C, long I) {
    long idx = get_global_id(0), r = idx / I, i = idx % I;
    if (gate[gto + r * gs + e] == 0.0f) return;
    global const float *hr = hh + ho + r * C, *p1 = w1 + w1o + i * C, *p3 = w3 + w3o + i * C;
    float u = 0.0f, g = 0.0f;
    for (long c = 0; c < C; c++) {
        u += hr[c] * p1[c];
        g += hr[c] * p3[c];
    }
    float s = u / (1.0f + exp(-u));
    a[idx] = s * g;
}

/* step 2: y[r, c] = gate[r, e] * (a_r . w2_c), zero for rows not routed to e */
kernel void k_moe_down(global float *y, long yo, global const float *a, global const float *gate, long gto, long gs,
                       long e, global const float *w2, long w2o, long C, long I) {
    long idx = get_global_id(0), r = idx / C, c = idx % C;
    float gw = gate[gto + r * gs + e];
    if (gw == 0.0f) {
        y[yo + idx] = 0.0f;
        return;
    }
    global const float *ar = a + r * I, *wr = w2 + w2o + c * I;
    float s = 0.0f;
    for (long i = 0; i < I; i++) s += ar[i] * wr[i];
    y[yo + idx] = s * gw;
}
