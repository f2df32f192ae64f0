/* Eager half attention numerics (ATTENTION iparams[2] = 1..4; Note [Eager half attention numerics] in
 * src/device/cpu/kernels/attention.c): the rounding points of an eager softmax(q k^T / sqrt(hs)) v under
 * torch.autocast, for --bf16 / --fp16 training.
 *
 * Note [OpenCL half attention]
 * These kernels are the CPU's scalar reference kernels (sl_k_attention_ref, sl_k_attention_back_ref) turned
 * into work-items: the same fp32 operations in the same order (FP_CONTRACT off), the same rounding points
 * (hround: rbf16 / rf16 of 0_common.cl, the CPU's roundings bit for bit), the softmax's exp and the lse's log
 * computed in double and rounded once where the device has fp64 (the CPU's sl_exp_acc and logf are within
 * half an ulp of those: the same floats but at rounding midpoints). Forward: one work-item per query row
 * (b, h, t), its probabilities and dropout multipliers in a global scratch row. Backward: one work-item per
 * (b, kv head), which owns that head's dk / dv rows and its group's dq rows, so every sum has one writer and
 * the reference's order; under half numerics each query head's dk / dv is accumulated in the scratch and
 * then rounded into the group's sums, as transformers' repeat_kv backward in half does. Dropout of the
 * probabilities as in attention.cl (Note [OpenCL dropout]). The parallelism is B NH T rows forward and only
 * B NKV items backward: a numerics path for half-precision training on any device, not a fast one. */
#pragma OPENCL FP_CONTRACT OFF

inline float hround(float x, int mode) { return mode == 2 || mode == 3 ? rf16(x) : mode ? rbf16(x) : x; }
inline int p32(int mode) { return mode == 3 || mode == 4; } /* the softmax's P kept in fp32 */
inline float aexp(float x) {
#ifdef SL_FP64
    return (float)exp((double)x);
#else
    return exp(x);
#endif
}
inline float alog(float x) {
#ifdef SL_FP64
    return (float)log((double)x);
#else
    return log(x);
#endif
}
inline long jfirst(long t, long win) { return win > 0 && t - win + 1 > 0 ? t - win + 1 : 0; }

/* global (B NH T); P: 2 T floats per row (probabilities, dropout multipliers) */
kernel void k_attention_half(global float *out, long oo, global float *lse, long lo, global const float *q, long qo,
                             long4 qs, global const float *k, long ko, long4 ks, global const float *v, long vo,
                             long4 vs, long T, long NH, long NKV, long hs, long win, float scale, int hm, int drop,
                             ulong dseed, ulong dhi, uint thr, float keep, long heads, long head0,
                             global float *P) {
    long idx = get_global_id(0);
    long t = idx % T, h = (idx / T) % NH, b = idx / (T * NH), kh = h / (NH / NKV);
    global const float *qr = q + qo + b * qs.s0 + t * qs.s1 + h * qs.s2;
    global float *p = P + idx * 2 * T, *mk = p + T;
    float mx = -INFINITY;
    long j0 = jfirst(t, win);
    for (long j = j0; j <= t; j++) {
        global const float *kr = k + ko + b * ks.s0 + j * ks.s1 + kh * ks.s2;
        float s = 0;
        for (long d = 0; d < hs; d++) s += qr[d] * (p32(hm) ? hround(kr[d], hm) : kr[d]);
        s = hround(hround(s, hm) * scale, hm);
        p[j] = s;
        if (s > mx) mx = s;
    }
    float sum = 0;
    for (long j = j0; j <= t; j++) {
        p[j] = aexp(p[j] - mx);
        sum += p[j];
    }
    float inv = 1.0f / sum;
    for (long j = j0; j <= t; j++) p[j] = hround(p[j] * inv, hm);
    lse[lo + (b * NH + h) * T + t] = mx + alog(sum);
    if (drop) {
        drop_cache dc;
        dc.valid = 0;
        ulong eb = (ulong)(((b * heads + head0 + h) * T + t) * T);
        for (long j = 0; j <= t; j++) mk[j] = drop_at(&dc, dseed, dhi, eb + (ulong)j, thr, keep);
    }
    global float *o = out + oo + (b * T + t) * NH * hs + h * hs;
    for (long d = 0; d < hs; d++) o[d] = 0;
    for (long j = j0; j <= t; j++) {
        global const float *vr = v + vo + b * vs.s0 + j * vs.s1 + kh * vs.s2;
        float pj = drop ? p[j] * mk[j] : p[j];
        for (long d = 0; d < hs; d++) o[d] += pj * vr[d];
    }
    for (long d = 0; d < hs; d++) o[d] = hround(o[d], hm);
}

/* out (B, T, NH + 2 NKV, hs): dq | dk | dv. global (B NKV); S: 3 T + 2 T hs floats per item */
kernel void k_attention_half_back(global float *out, long oo, global const float *lse, long lo, global const float *q,
                                  long qo, long4 qs, global const float *k, long ko, long4 ks, global const float *v,
                                  long vo, long4 vs, global const float *g, long go, long4 gs, long T, long NH,
                                  long NKV, long hs, long win, float scale, int hm, int drop, ulong dseed, ulong dhi,
                                  uint thr, float keep, long heads, long head0, global float *S) {
    long bk = get_global_id(0), b = bk / NKV, kh = bk % NKV, grp = NH / NKV, W = NH + 2 * NKV;
    global float *p = S + bk * (3 * T + 2 * T * hs), *dp = p + T, *mk = dp + T, *hk = mk + T, *hv = hk + T * hs;
    out += oo;
    for (long j = 0; j < T; j++)
        for (long d = 0; d < hs; d++) {
            out[(b * T + j) * W * hs + (NH + kh) * hs + d] = 0;
            out[(b * T + j) * W * hs + (NH + NKV + kh) * hs + d] = 0;
        }
    for (long h = kh * grp; h < (kh + 1) * grp; h++) {
        for (long i = 0; i < 2 * T * hs; i++) hk[i] = 0;
        for (long t = 0; t < T; t++) {
            global const float *gr = g + go + b * gs.s0 + t * gs.s1 + h * hs;
            global const float *qr = q + qo + b * qs.s0 + t * qs.s1 + h * qs.s2;
            global float *dq = out + (b * T + t) * W * hs + h * hs;
            float l = lse[lo + (b * NH + h) * T + t], dot = 0;
            long j0 = jfirst(t, win);
            if (drop) {
                drop_cache dc;
                dc.valid = 0;
                ulong eb = (ulong)(((b * heads + head0 + h) * T + t) * T);
                for (long j = 0; j <= t; j++) mk[j] = drop_at(&dc, dseed, dhi, eb + (ulong)j, thr, keep);
            }
            for (long j = j0; j <= t; j++) {
                global const float *kr = k + ko + b * ks.s0 + j * ks.s1 + kh * ks.s2;
                global const float *vr = v + vo + b * vs.s0 + j * vs.s1 + kh * vs.s2;
                float s = 0, sd = 0;
                for (long d = 0; d < hs; d++) {
                    s += qr[d] * (p32(hm) ? hround(kr[d], hm) : kr[d]);
                    sd += gr[d] * vr[d];
                }
                float sc = hround(hround(s, hm) * scale, hm); /* the forward's scores */
                p[j] = p32(hm) ? aexp(sc - l) : hround(aexp(sc - l), hm);
                dp[j] = hround(sd, hm);
                if (drop) dp[j] *= mk[j];
                dot += p[j] * dp[j];
            }
            for (long d = 0; d < hs; d++) dq[d] = 0;
            for (long j = j0; j <= t; j++) {
                float ds = hround(hround(p[j] * (dp[j] - dot), hm) * scale, hm);
                global const float *kr = k + ko + b * ks.s0 + j * ks.s1 + kh * ks.s2;
                global float *dk = hk + j * hs, *dv = hv + j * hs;
                float pj = p32(hm) ? hround(p[j], hm) : p[j];
                if (drop) pj *= mk[j];
                for (long d = 0; d < hs; d++) {
                    dq[d] += ds * (p32(hm) ? hround(kr[d], hm) : kr[d]);
                    dk[d] += ds * qr[d];
                    dv[d] += pj * gr[d];
                }
            }
            for (long d = 0; d < hs; d++) dq[d] = hround(dq[d], hm);
        }
        for (long j = 0; j < T; j++) { /* this head's h(dk), h(dv) into the group's sums */
            global float *dk = out + (b * T + j) * W * hs + (NH + kh) * hs, *dv = dk + NKV * hs;
            for (long d = 0; d < hs; d++) {
                /* 3 / 4: transformers repeats the fp32 (post-RoPE) keys, so their sum is fp32 */
                dk[d] = p32(hm) ? dk[d] + hround(hk[j * hs + d], hm) : hround(dk[d] + hround(hk[j * hs + d], hm), hm);
                dv[d] = hround(dv[d] + hround(hv[j * hs + d], hm), hm);
            }
        }
    }
}
