/* Causal attention with grouped KV heads (semantics: src/device/cpu/kernels/attention.c, llama_ops.c).
 *
 * Note [OpenCL attention, first version]
 * Forward: one work-item per (b, h, query row t). The scores q.k_j * scale are recomputed in three passes
 * (max, sum of exponentials, weighted sum of v) instead of being stored, so no per-item array of T floats
 * is needed and any T and head size work; the math is the CPU reference's (p_j = exp(s_j - max) / sum,
 * lse = max + log sum saved in aux). Backward in two kernels, both race-free and deterministic:
 * k_attention_back_dq, one item per (b, h, t), writes dq and D = sum_j p_j (dy.v_j) (scratch, B*NH*T);
 * k_attention_back_dkv, one item per (b, kv head, key row j), owns dk_j and dv_j and sums over the
 * group's heads and the rows t >= j in order. Work-items read q/k/v rows straight from global memory: a
 * tiled (flash) version staging K/V blocks in local memory is the follow-up for GPUs.
 * Strides: q/k/v rows are (b, t, head) with strides qs/ks/vs (elements, head dim contiguous); dy rows are
 * (b, t) with strides gs, heads contiguous. */
#pragma OPENCL FP_CONTRACT OFF

inline float dotp(global const float *a, global const float *b, long n) {
    float s = 0.0f;
    for (long d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

kernel void k_attention(global float *out, long oo, global float *lse, long lo, global const float *q, long qo,
                        long4 qs, global const float *k, long ko, long4 ks, global const float *v, long vo, long4 vs,
                        long T, long NH, long NKV, long hs, float scale) {
    long idx = get_global_id(0);
    long t = idx % T, h = (idx / T) % NH, b = idx / (T * NH), kh = h / (NH / NKV);
    global const float *qr = q + qo + b * qs.s0 + t * qs.s1 + h * qs.s2;
    global const float *kb = k + ko + b * ks.s0 + kh * ks.s2, *vb = v + vo + b * vs.s0 + kh * vs.s2;
    float mx = -INFINITY;
    for (long j = 0; j <= t; j++) mx = fmax(mx, dotp(qr, kb + j * ks.s1, hs) * scale);
    float sum = 0.0f;
    for (long j = 0; j <= t; j++) sum += exp(dotp(qr, kb + j * ks.s1, hs) * scale - mx);
    float inv = 1.0f / sum;
    lse[lo + (b * NH + h) * T + t] = mx + log(sum);
    global float *o = out + oo + (b * T + t) * NH * hs + h * hs;
    for (long d = 0; d < hs; d++) o[d] = 0.0f;
    for (long j = 0; j <= t; j++) {
        float pj = exp(dotp(qr, kb + j * ks.s1, hs) * scale - mx) * inv;
        global const float *vr = vb + j * vs.s1;
        for (long d = 0; d < hs; d++) o[d] += pj * vr[d];
    }
}

/* out: (B, T, NH + 2*NKV, hs) packed dq | dk | dv; Dsum: (B, NH, T) scratch */
kernel void k_attention_back_dq(global float *out, long oo, global float *Dsum, global const float *lse, long lo,
                                global const float *q, long qo, long4 qs, global const float *k, long ko, long4 ks,
                                global const float *v, long vo, long4 vs, global const float *g, long go, long4 gs,
                                long T, long NH, long NKV, long hs, float scale) {
    long idx = get_global_id(0);
    long t = idx % T, h = (idx / T) % NH, b = idx / (T * NH), kh = h / (NH / NKV), W = NH + 2 * NKV;
    global const float *qr = q + qo + b * qs.s0 + t * qs.s1 + h * qs.s2;
    global const float *go_ = g + go + b * gs.s0 + t * gs.s1 + h * hs;
    global const float *kb = k + ko + b * ks.s0 + kh * ks.s2, *vb = v + vo + b * vs.s0 + kh * vs.s2;
    float l = lse[lo + (b * NH + h) * T + t], dot = 0.0f;
    for (long j = 0; j <= t; j++) {
        float p = exp(dotp(qr, kb + j * ks.s1, hs) * scale - l);
        dot += p * dotp(go_, vb + j * vs.s1, hs);
    }
    Dsum[(b * NH + h) * T + t] = dot;
    global float *dq = out + oo + (b * T + t) * W * hs + h * hs;
    for (long d = 0; d < hs; d++) dq[d] = 0.0f;
    for (long j = 0; j <= t; j++) {
        global const float *kr = kb + j * ks.s1;
        float p = exp(dotp(qr, kr, hs) * scale - l);
        float ds = p * (dotp(go_, vb + j * vs.s1, hs) - dot) * scale;
        for (long d = 0; d < hs; d++) dq[d] += ds * kr[d];
    }
}

kernel void k_attention_back_dkv(global float *out, long oo, global const float *Dsum, global const float *lse, long lo,
                                 global const float *q, long qo, long4 qs, global const float *k, long ko, long4 ks,
                                 global const float *v, long vo, long4 vs, global const float *g, long go, long4 gs,
                                 long T, long NH, long NKV, long hs, float scale) {
    long idx = get_global_id(0);
    long j = idx % T, kh = (idx / T) % NKV, b = idx / (T * NKV), grp = NH / NKV, W = NH + 2 * NKV;
    global const float *kr = k + ko + b * ks.s0 + j * ks.s1 + kh * ks.s2;
    global const float *vr = v + vo + b * vs.s0 + j * vs.s1 + kh * vs.s2;
    global float *dk = out + oo + (b * T + j) * W * hs + (NH + kh) * hs;
    global float *dv = out + oo + (b * T + j) * W * hs + (NH + NKV + kh) * hs;
    for (long d = 0; d < hs; d++) dk[d] = dv[d] = 0.0f;
    for (long h = kh * grp; h < (kh + 1) * grp; h++)
        for (long t = j; t < T; t++) {
            global const float *qr = q + qo + b * qs.s0 + t * qs.s1 + h * qs.s2;
            global const float *go_ = g + go + b * gs.s0 + t * gs.s1 + h * hs;
            long row = (b * NH + h) * T + t;
            float p = exp(dotp(qr, kr, hs) * scale - lse[lo + row]);
            float ds = p * (dotp(go_, vr, hs) - Dsum[row]) * scale;
            for (long d = 0; d < hs; d++) {
                dk[d] += ds * qr[d];
                dv[d] += p * go_[d];
            }
        }
}

/* inference over a KV cache (B, S, NKV, hs), contiguous: query t at position pos0 + t attends rows
 * [first, pos0 + t] (win > 0: a sliding window) -> out (B, Tq, NH*hs) */
kernel void k_attention_kv(global float *out, long oo, global const float *q, long qo, long4 qs, global const float *k,
                           long ko, global const float *v, long vo, long Tq, long S, long NH, long NKV, long hs,
                           long pos0, long win, float scale) {
    long idx = get_global_id(0);
    long t = idx % Tq, h = (idx / Tq) % NH, b = idx / (Tq * NH), kh = h / (NH / NKV);
    long last = pos0 + t, first = (win > 0 && last - win + 1 > 0) ? last - win + 1 : 0;
    global const float *qr = q + qo + b * qs.s0 + t * qs.s1 + h * qs.s2;
    global const float *kb = k + ko + (b * S * NKV + kh) * hs, *vb = v + vo + (b * S * NKV + kh) * hs;
    long rs = NKV * hs;
    float mx = -INFINITY;
    for (long j = first; j <= last; j++) mx = fmax(mx, dotp(qr, kb + j * rs, hs) * scale);
    float sum = 0.0f;
    for (long j = first; j <= last; j++) sum += exp(dotp(qr, kb + j * rs, hs) * scale - mx);
    float inv = 1.0f / sum;
    global float *o = out + oo + (b * Tq + t) * NH * hs + h * hs;
    for (long d = 0; d < hs; d++) o[d] = 0.0f;
    for (long j = first; j <= last; j++) {
        float pj = exp(dotp(qr, kb + j * rs, hs) * scale - mx) * inv;
        global const float *vr = vb + j * rs;
        for (long d = 0; d < hs; d++) o[d] += pj * vr[d];
    }
}
