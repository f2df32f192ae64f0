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
 * (b, h, t), its probabilities and dropout multipliers in a global scratch row. Backward, in two passes so
 * that every sum has one writer and the reference's order: one work-item per query row (b, h, t) computes
 * its dq row (a sum over keys j in increasing j) and leaves its ds and P-v multipliers in a scratch row; then
 * one work-item per key row (b, kv head, j) sums each query head's dk[j] / dv[j] over the query rows t in
 * increasing t, from those scratch rows and the q / dO rows, and rounds it into the group's sums, as
 * transformers' repeat_kv backward in half does (heads in increasing order). Each element's operations and
 * their order are the reference's, so the results are the CPU's bit for bit. Dropout of the probabilities
 * as in attention.cl (Note [OpenCL dropout]; the multipliers are drawn again where a pass needs them). The
 * parallelism is B NH T rows forward and B NH T + B NKV T items backward (it was one work-item per
 * (b, kv head) backward: 12 % of the GPT-2 124M bf16 step on PoCL, docs/BENCHMARKS.md). Within a
 * work-item the sums run in 16 vector lanes where each lane is one of the reference's sums: the scores for
 * 16 keys at once from a transposed copy of K (k_attention_half_kt; a lane per key, its sum over d in order),
 * the output, dq, dk and dv for 16 elements d at once (a lane per element, its sum over keys or query rows
 * in order), with the scalar loop for a head size's last hs % 16 elements. */
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

/* hround in 16 lanes: each lane exactly hround of its value */
inline float16 hround16(float16 x, int mode) {
    if (mode == 2 || mode == 3) {
        ushort h[16];
        vstore_half16_rte(x, 0, (private half *)h);
        return vload_half16(0, (private const half *)h);
    }
    return mode ? rbf16_16(x) : x;
}

/* Per (b, kv head), the keys transposed and rounded where the scores read them rounded (KT[d][j] = k[j][d],
 * rounded in modes 3 / 4) and the values transposed (VT[d][j]), rows of Tp (T rounded up to 16, plus 16)
 * floats, zero padded, so the score loops read 16 keys' elements d as one vector from any key j < T (the
 * forward and backward pass 1). global (B NKV hs Tp). */
kernel void k_attention_half_kt(global const float *k, long ko, long4 ks, global const float *v, long vo,
                                    long4 vs, long T, long NKV, long hs, long Tp, int hm, global float *KT,
                                    long kto) {
    long idx = get_global_id(0);
    long j = idx % Tp, d = (idx / Tp) % hs, bk = idx / (Tp * hs), b = bk / NKV, kh = bk % NKV;
    global float *kt = KT + kto + bk * 2 * hs * Tp, *vt = kt + hs * Tp;
    float kv = 0, vv = 0;
    if (j < T) {
        kv = k[ko + b * ks.s0 + j * ks.s1 + kh * ks.s2 + d];
        if (p32(hm)) kv = hround(kv, hm);
        vv = v[vo + b * vs.s0 + j * vs.s1 + kh * vs.s2 + d];
    }
    kt[d * Tp + j] = kv;
    vt[d * Tp + j] = vv;
}

/* global (B NH T); P: 2 T floats per row (probabilities, dropout multipliers), then KT / VT at kto. The scores
 * run for 16 keys at once (a lane per key, each lane's sum over d in the reference's order, from KT), the output for
 * 16 elements d at once (a lane per element, each a sum over keys in increasing j). */
kernel void k_attention_half(global float *out, long oo, global float *lse, long lo, global const float *q, long qo,
                             long4 qs, global const float *k, long ko, long4 ks, global const float *v, long vo,
                             long4 vs, long T, long NH, long NKV, long hs, long win, float scale, int hm, int drop,
                             ulong dseed, ulong dhi, uint thr, float keep, long heads, long head0,
                             global float *P, long Tp, long kto) {
    long idx = get_global_id(0);
    long t = idx % T, h = (idx / T) % NH, b = idx / (T * NH), kh = h / (NH / NKV);
    global const float *qr = q + qo + b * qs.s0 + t * qs.s1 + h * qs.s2;
    global const float *kt = P + kto + (b * NKV + kh) * 2 * hs * Tp;
    global float *p = P + idx * 2 * T, *mk = p + T;
    float mx = -INFINITY;
    long j0 = jfirst(t, win);
    for (long jb = j0; jb <= t; jb += 16) {
        float16 s16 = (float16)(0.0f);
        for (long d = 0; d < hs; d++) s16 += qr[d] * vload16(0, kt + d * Tp + jb);
        float sv[16];
        vstore16(s16, 0, sv);
        for (long j = jb; j <= t && j < jb + 16; j++) {
            float s = hround(hround(sv[j - jb], hm) * scale, hm);
            p[j] = s;
            if (s > mx) mx = s;
        }
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
        for (long j = j0; j <= t; j++) p[j] *= mk[j]; /* the P v multipliers */
    }
    global float *o = out + oo + (b * T + t) * NH * hs + h * hs;
    long d0 = 0;
    for (; d0 + 16 <= hs; d0 += 16) {
        float16 a = (float16)(0.0f);
        for (long j = j0; j <= t; j++) a += p[j] * vload16(0, v + vo + b * vs.s0 + j * vs.s1 + kh * vs.s2 + d0);
        vstore16(hround16(a, hm), 0, o + d0);
    }
    for (long d = d0; d < hs; d++) {
        float a = 0;
        for (long j = j0; j <= t; j++) a += p[j] * v[vo + b * vs.s0 + j * vs.s1 + kh * vs.s2 + d];
        o[d] = hround(a, hm);
    }
}

/* Backward, pass 1 of 2 (after k_attention_half_kt): out (B, T, NH + 2 NKV, hs) = dq | dk | dv; this pass writes dq. global (B NH T): one
 * work-item per query row (b, h, t), as the reference's inner loop over t: its p, dp, dot and dq row, then
 * its row of R (2 T floats: ds[j], the P v multiplier pj[j]) for pass 2. The scores' dot products run for
 * 16 keys at once (a lane per key, each lane's sum over d in the reference's order, from KT / VT), dq for
 * 16 elements d at once (a lane per element, each a sum over keys j in increasing j). */
kernel void k_attention_half_back_q(global float *out, long oo, global const float *lse, long lo,
                                    global const float *q, long qo, long4 qs, global const float *g, long go,
                                    long4 gs, long T, long NH, long NKV, long hs, long win, float scale, int hm,
                                    int drop, ulong dseed, ulong dhi, uint thr, float keep, long heads,
                                    long head0, global float *R, long Tp, long kto, global const float *k,
                                    long ko, long4 ks) {
    long idx = get_global_id(0);
    long t = idx % T, h = (idx / T) % NH, b = idx / (T * NH), kh = h / (NH / NKV), W = NH + 2 * NKV;
    global float *p = R + idx * 2 * T, *dp = p + T; /* then ds | pj in place */
    global const float *kt = R + kto + (b * NKV + kh) * 2 * hs * Tp, *vt = kt + hs * Tp;
    global const float *gr = g + go + b * gs.s0 + t * gs.s1 + h * hs;
    global const float *qr = q + qo + b * qs.s0 + t * qs.s1 + h * qs.s2;
    global float *dq = out + oo + (b * T + t) * W * hs + h * hs;
    float l = lse[lo + (b * NH + h) * T + t], dot = 0;
    long j0 = jfirst(t, win);
    ulong eb = (ulong)(((b * heads + head0 + h) * T + t) * T);
    drop_cache dc;
    dc.valid = 0;
    for (long jb = j0; jb <= t; jb += 16) {
        float16 s16 = (float16)(0.0f), sd16 = (float16)(0.0f);
        for (long d = 0; d < hs; d++) {
            s16 += qr[d] * vload16(0, kt + d * Tp + jb);
            sd16 += gr[d] * vload16(0, vt + d * Tp + jb);
        }
        float sv[16], sdv[16];
        vstore16(s16, 0, sv);
        vstore16(sd16, 0, sdv);
        for (long j = jb; j <= t && j < jb + 16; j++) {
            float sc = hround(hround(sv[j - jb], hm) * scale, hm); /* the forward's scores */
            p[j] = p32(hm) ? aexp(sc - l) : hround(aexp(sc - l), hm);
            dp[j] = hround(sdv[j - jb], hm);
            if (drop) dp[j] *= drop_at(&dc, dseed, dhi, eb + (ulong)j, thr, keep);
            dot += p[j] * dp[j];
        }
    }
    dc.valid = 0;
    for (long j = j0; j <= t; j++) {
        float ds = hround(hround(p[j] * (dp[j] - dot), hm) * scale, hm);
        float pj = p32(hm) ? hround(p[j], hm) : p[j];
        if (drop) pj *= drop_at(&dc, dseed, dhi, eb + (ulong)j, thr, keep);
        p[j] = ds;
        dp[j] = pj;
    }
    long d0 = 0;
    for (; d0 + 16 <= hs; d0 += 16) {
        float16 a = (float16)(0.0f);
        for (long j = j0; j <= t; j++) {
            float16 kr = vload16(0, k + ko + b * ks.s0 + j * ks.s1 + kh * ks.s2 + d0);
            a += p[j] * (p32(hm) ? hround16(kr, hm) : kr);
        }
        vstore16(hround16(a, hm), 0, dq + d0);
    }
    for (long d = d0; d < hs; d++) {
        float a = 0;
        for (long j = j0; j <= t; j++) {
            float kr = k[ko + b * ks.s0 + j * ks.s1 + kh * ks.s2 + d];
            a += p[j] * (p32(hm) ? hround(kr, hm) : kr);
        }
        dq[d] = hround(a, hm);
    }
}

/* this head's sums hk, hv of elements d .. (the lanes) rounded into the group's dk / dv, as the reference */
#define FOLD(DK, DV, HK, HV, RND)                                                                            \
    do {                                                                                                     \
        /* 3 / 4: transformers repeats the fp32 (post-RoPE) keys, so their sum is fp32 */                    \
        DK = p32(hm) ? DK + RND(HK, hm) : RND(DK + RND(HK, hm), hm);                                         \
        DV = RND(DV + RND(HV, hm), hm);                                                                      \
    } while (0)

/* Backward, pass 2 of 2: dk | dv. global (B NKV T): one work-item per key row (b, kv head, j), which owns that
 * row of the group's dk / dv. For each query head h of the group in order, the head's dk[j] / dv[j] sum over
 * the query rows t >= j that see key j, in increasing t (the reference's order), 16 elements d at once, and
 * are then rounded into the group's sums as the reference does. */
kernel void k_attention_half_back_kv(global float *out, long oo, global const float *q, long qo, long4 qs,
                                     global const float *g, long go, long4 gs, long T, long NH, long NKV, long hs,
                                     long win, int hm, global const float *R) {
    long idx = get_global_id(0);
    long j = idx % T, kh = (idx / T) % NKV, b = idx / (T * NKV), grp = NH / NKV, W = NH + 2 * NKV;
    long t1 = win > 0 && j + win - 1 < T - 1 ? j + win - 1 : T - 1; /* the last query row that sees key j */
    global float *dk = out + oo + (b * T + j) * W * hs + (NH + kh) * hs, *dv = dk + NKV * hs;
    for (long d = 0; d < hs; d++) dk[d] = dv[d] = 0;
    for (long h = kh * grp; h < (kh + 1) * grp; h++) {
        global const float *rr = R + ((b * NH + h) * T) * 2 * T + j;
        global const float *gh = g + go + b * gs.s0 + h * hs, *qh = q + qo + b * qs.s0 + h * qs.s2;
        long d0 = 0;
        for (; d0 + 16 <= hs; d0 += 16) {
            float16 hk = (float16)(0.0f), hv = (float16)(0.0f);
            for (long t = j; t <= t1; t++) {
                hk += rr[t * 2 * T] * vload16(0, qh + t * qs.s1 + d0);
                hv += rr[t * 2 * T + T] * vload16(0, gh + t * gs.s1 + d0);
            }
            float16 k16 = vload16(0, dk + d0), v16 = vload16(0, dv + d0);
            FOLD(k16, v16, hk, hv, hround16);
            vstore16(k16, 0, dk + d0);
            vstore16(v16, 0, dv + d0);
        }
        for (long d = d0; d < hs; d++) {
            float hk = 0, hv = 0;
            for (long t = j; t <= t1; t++) {
                hk += rr[t * 2 * T] * qh[t * qs.s1 + d];
                hv += rr[t * 2 * T + T] * gh[t * gs.s1 + d];
            }
            FOLD(dk[d], dv[d], hk, hv, hround);
        }
    }
}
