/* Causal attention with grouped KV heads and an optional sliding window (semantics:
 * src/device/cpu/kernels/attention.c, llama_ops.c): query t sees keys j in [j0(t), t], j0(t) = max(0, t -
 * win + 1) when win > 0, else 0.
 *
 * Note [OpenCL flash attention]
 * Tiled in local memory, ATT_B rows a tile (a build constant, 16), one work-item per row of the block it
 * owns. Forward: a work-group per (query block, head, batch) stages its Q rows once, then each visited K/V
 * tile of ATT_B keys, and keeps an online softmax per query row (running max m, sum l, output accumulator
 * rescaled by exp(m_old - m_new) when a tile raises the max); o = acc / l, lse = m + log l. Only the tiles
 * that intersect [j0, t] of some row of the block are visited (causal and window bounds).
 * Backward, two kernels as before, both deterministic (single writer per output row, sums in key / query
 * order): k_attention_back_dq per query block: pass 1 D_t = sum_j p_tj (dy_t . v_j) (kept in Dsum for the
 * second kernel), pass 2 dq_t = sum_j p_tj (dy_t . v_j - D_t) scale k_j, with K/V tiles in local memory;
 * k_attention_back_dkv per (key block, kv head, batch) owns dk_j, dv_j and visits, for each query head of
 * its group, the Q / dY tiles (with their lse and D) of the query rows that see its keys.
 * Local arrays whose rows a work-item owns are transposed ([d][row]) so consecutive work-items touch
 * consecutive words (a vector load on PoCL's CPU device, coalesced on a GPU); shared tiles are [row][d].
 * The probabilities are exp(s - max) summed per tile rather than over the whole row as the CPU's scalar
 * reference does: the same values to a few ulps, within the conformance suite's attention tolerance.
 * Strides: q/k/v rows are (b, t, head) with strides qs/ks/vs (elements, head dim contiguous); dy rows are
 * (b, t) with strides gs, heads contiguous. */
#pragma OPENCL FP_CONTRACT OFF
#ifndef ATT_B
#define ATT_B 16
#endif

inline float dotp(global const float *a, global const float *b, long n) {
    float s = 0.0f;
    for (long d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

inline long first_key(long t, long win) { return win > 0 && t - win + 1 > 0 ? t - win + 1 : 0; }

/* rows [r0, r0 + ATT_B) of a (b, t, head) tensor at base into tile[row][d] (zero past T) */
inline void load_tile(local float *tile, global const float *base, long rs, long r0, long T, long hs) {
    int i = (int)get_local_id(0);
    long r = r0 + i;
    for (long d = 0; d < hs; d++) tile[i * hs + d] = r < T ? base[r * rs + d] : 0.0f;
}

/* the same rows transposed: tile[d][row] */
inline void load_tile_t(local float *tile, global const float *base, long rs, long r0, long T, long hs) {
    int i = (int)get_local_id(0);
    long r = r0 + i;
    for (long d = 0; d < hs; d++) tile[d * ATT_B + i] = r < T ? base[r * rs + d] : 0.0f;
}

/* global (nqb * ATT_B, NH, B), local (ATT_B, 1, 1); local arrays: Qt, Ot [hs][ATT_B], Ks, Vs [ATT_B][hs] */
kernel void k_attention(global float *out, long oo, global float *lse, long lo, global const float *q, long qo,
                        long4 qs, global const float *k, long ko, long4 ks, global const float *v, long vo, long4 vs,
                        long T, long NH, long NKV, long hs, long win, float scale, local float *Qt, local float *Ot,
                        local float *Ks, local float *Vs) {
    int i = (int)get_local_id(0);
    long q0 = get_group_id(0) * ATT_B, h = get_global_id(1), b = get_global_id(2), kh = h / (NH / NKV);
    long t = q0 + i;
    global const float *kb = k + ko + b * ks.s0 + kh * ks.s2, *vb = v + vo + b * vs.s0 + kh * vs.s2;
    load_tile_t(Qt, q + qo + b * qs.s0 + h * qs.s2, qs.s1, q0, T, hs);
    for (long d = 0; d < hs; d++) Ot[d * ATT_B + i] = 0.0f;
    float m = -INFINITY, l = 0.0f, sc[ATT_B];
    long jlo = first_key(q0, win), jhi = q0 + ATT_B - 1 < T - 1 ? q0 + ATT_B - 1 : T - 1;
    for (long j0 = jlo / ATT_B * ATT_B; j0 <= jhi; j0 += ATT_B) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_tile(Ks, kb, ks.s1, j0, T, hs);
        load_tile(Vs, vb, vs.s1, j0, T, hs);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t >= T) continue;
        long a = first_key(t, win);
        float tm = -INFINITY;
        for (int jj = 0; jj < ATT_B; jj++) {
            long j = j0 + jj;
            float s = -INFINITY;
            if (j >= a && j <= t) {
                float dt = 0.0f;
                for (long d = 0; d < hs; d++) dt += Qt[d * ATT_B + i] * Ks[jj * hs + d];
                s = dt * scale;
            }
            sc[jj] = s;
            tm = fmax(tm, s);
        }
        if (tm == -INFINITY) continue; /* no key of this tile is visible to row t */
        float mn = fmax(m, tm), corr = exp(m - mn);
        l *= corr;
        for (long d = 0; d < hs; d++) Ot[d * ATT_B + i] *= corr;
        m = mn;
        for (int jj = 0; jj < ATT_B; jj++) {
            if (sc[jj] == -INFINITY) continue;
            float p = exp(sc[jj] - m);
            l += p;
            for (long d = 0; d < hs; d++) Ot[d * ATT_B + i] += p * Vs[jj * hs + d];
        }
    }
    if (t >= T) return;
    float inv = 1.0f / l;
    lse[lo + (b * NH + h) * T + t] = m + log(l);
    global float *o = out + oo + (b * T + t) * NH * hs + h * hs;
    for (long d = 0; d < hs; d++) o[d] = Ot[d * ATT_B + i] * inv;
}

/* out: (B, T, NH + 2*NKV, hs) packed dq | dk | dv; Dsum: (B, NH, T) scratch.
 * global (nqb * ATT_B, NH, B), local (ATT_B, 1, 1); local: Qt, Gt, dQt [hs][ATT_B], Ks, Vs [ATT_B][hs] */
kernel void k_attention_back_dq(global float *out, long oo, global float *Dsum, global const float *lse, long lo,
                                global const float *q, long qo, long4 qs, global const float *k, long ko, long4 ks,
                                global const float *v, long vo, long4 vs, global const float *g, long go, long4 gs,
                                long T, long NH, long NKV, long hs, long win, float scale, local float *Qt,
                                local float *Gt, local float *dQt, local float *Ks, local float *Vs) {
    int i = (int)get_local_id(0);
    long q0 = get_group_id(0) * ATT_B, h = get_global_id(1), b = get_global_id(2), kh = h / (NH / NKV);
    long t = q0 + i, W = NH + 2 * NKV;
    global const float *kb = k + ko + b * ks.s0 + kh * ks.s2, *vb = v + vo + b * vs.s0 + kh * vs.s2;
    load_tile_t(Qt, q + qo + b * qs.s0 + h * qs.s2, qs.s1, q0, T, hs);
    load_tile_t(Gt, g + go + b * gs.s0 + h * hs, gs.s1, q0, T, hs);
    for (long d = 0; d < hs; d++) dQt[d * ATT_B + i] = 0.0f;
    float l = t < T ? lse[lo + (b * NH + h) * T + t] : 0.0f, dot = 0.0f;
    long a = first_key(t, win);
    long jlo = first_key(q0, win), jhi = q0 + ATT_B - 1 < T - 1 ? q0 + ATT_B - 1 : T - 1;
    for (int pass = 0; pass < 2; pass++)
        for (long j0 = jlo / ATT_B * ATT_B; j0 <= jhi; j0 += ATT_B) {
            barrier(CLK_LOCAL_MEM_FENCE);
            load_tile(Ks, kb, ks.s1, j0, T, hs);
            load_tile(Vs, vb, vs.s1, j0, T, hs);
            barrier(CLK_LOCAL_MEM_FENCE);
            if (t >= T) continue;
            for (int jj = 0; jj < ATT_B; jj++) {
                long j = j0 + jj;
                if (j < a || j > t) continue;
                float s = 0.0f, sd = 0.0f;
                for (long d = 0; d < hs; d++) {
                    s += Qt[d * ATT_B + i] * Ks[jj * hs + d];
                    sd += Gt[d * ATT_B + i] * Vs[jj * hs + d];
                }
                float p = exp(s * scale - l);
                if (pass == 0) {
                    dot += p * sd;
                    continue;
                }
                float ds = p * (sd - dot) * scale;
                for (long d = 0; d < hs; d++) dQt[d * ATT_B + i] += ds * Ks[jj * hs + d];
            }
        }
    if (t >= T) return;
    Dsum[(b * NH + h) * T + t] = dot;
    global float *dq = out + oo + (b * T + t) * W * hs + h * hs;
    for (long d = 0; d < hs; d++) dq[d] = dQt[d * ATT_B + i];
}

/* global (nkb * ATT_B, NKV, B), local (ATT_B, 1, 1); local: Kt, Vt, dKt, dVt [hs][ATT_B], Qs, Gs [ATT_B][hs],
 * Ls, Ds [ATT_B] */
kernel void k_attention_back_dkv(global float *out, long oo, global const float *Dsum, global const float *lse, long lo,
                                 global const float *q, long qo, long4 qs, global const float *k, long ko, long4 ks,
                                 global const float *v, long vo, long4 vs, global const float *g, long go, long4 gs,
                                 long T, long NH, long NKV, long hs, long win, float scale, local float *Kt,
                                 local float *Vt, local float *dKt, local float *dVt, local float *Qs,
                                 local float *Gs, local float *Ls, local float *Ds) {
    int i = (int)get_local_id(0);
    long k0 = get_group_id(0) * ATT_B, kh = get_global_id(1), b = get_global_id(2), grp = NH / NKV;
    long j = k0 + i, W = NH + 2 * NKV;
    load_tile_t(Kt, k + ko + b * ks.s0 + kh * ks.s2, ks.s1, k0, T, hs);
    load_tile_t(Vt, v + vo + b * vs.s0 + kh * vs.s2, vs.s1, k0, T, hs);
    for (long d = 0; d < hs; d++) dKt[d * ATT_B + i] = dVt[d * ATT_B + i] = 0.0f;
    /* query rows that see a key of this block: [k0, last key + win - 1] (all later rows without a window) */
    long kl = k0 + ATT_B - 1 < T - 1 ? k0 + ATT_B - 1 : T - 1;
    long thi = win > 0 && kl + win - 1 < T - 1 ? kl + win - 1 : T - 1;
    for (long h = kh * grp; h < (kh + 1) * grp; h++)
        for (long t0 = k0; t0 <= thi; t0 += ATT_B) {
            barrier(CLK_LOCAL_MEM_FENCE);
            load_tile(Qs, q + qo + b * qs.s0 + h * qs.s2, qs.s1, t0, T, hs);
            load_tile(Gs, g + go + b * gs.s0 + h * hs, gs.s1, t0, T, hs);
            long row = (b * NH + h) * T + t0 + i;
            Ls[i] = t0 + i < T ? lse[lo + row] : 0.0f;
            Ds[i] = t0 + i < T ? Dsum[row] : 0.0f;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (j >= T) continue;
            for (int tt = 0; tt < ATT_B; tt++) {
                long t = t0 + tt;
                if (t >= T || t < j || first_key(t, win) > j) continue;
                float s = 0.0f, sd = 0.0f;
                for (long d = 0; d < hs; d++) {
                    s += Qs[tt * hs + d] * Kt[d * ATT_B + i];
                    sd += Gs[tt * hs + d] * Vt[d * ATT_B + i];
                }
                float p = exp(s * scale - Ls[tt]);
                float ds = p * (sd - Ds[tt]) * scale;
                for (long d = 0; d < hs; d++) {
                    dKt[d * ATT_B + i] += ds * Qs[tt * hs + d];
                    dVt[d * ATT_B + i] += p * Gs[tt * hs + d];
                }
            }
        }
    if (j >= T) return;
    global float *dk = out + oo + (b * T + j) * W * hs + (NH + kh) * hs;
    global float *dv = out + oo + (b * T + j) * W * hs + (NH + NKV + kh) * hs;
    for (long d = 0; d < hs; d++) {
        dk[d] = dKt[d * ATT_B + i];
        dv[d] = dVt[d * ATT_B + i];
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
