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
 * Layout for vector units (PoCL's CPU device vectorises the innermost loop, and with FP_CONTRACT off it
 * does not reassociate a dot product): the ATT_B scores of a row against a tile are computed together,
 * d outer and the tile's rows inner, from the tile stored transposed ([d][row]), so the inner loop is ATT_B
 * independent multiply-adds (each score still sums d in order, as the CPU does); the updates of a row's
 * accumulator (o += p v, dq += ds k, ...) run over d on row-major tiles ([row][d]).
 * The probabilities are exp(s - max) summed per tile rather than over the whole row as the CPU's scalar
 * reference does: the same values to a few ulps, within the conformance suite's attention tolerance.
 * Dropout of the probabilities (drop = 1; Note [OpenCL dropout] in 0_common.cl): element (t, j) of query
 * head h has number ((b heads + head0 + h) T + t) T + j (heads, head0: the TP shard's place among the model's
 * heads, Note [Dropout from counters]); the softmax sums the undropped p, o sums p m v, and the backward
 * uses dp = (dy . v) m, D = sum p dp (= dy . o), ds = p (dp - D) scale, dv += p m dy, as the CPU's
 * sl_k_attention_back_ref does.
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

/* rows [r0, r0 + ATT_B) of a (b, t, head) tensor at base into tile[row][d] (zero past T); work-item i
 * copies row i */
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

/* sc[jj] = sum over d (in order) of x[d] * tile_t[d][jj] */
inline void scores(float *sc, local const float *x, local const float *tile_t, long hs) {
    for (int jj = 0; jj < ATT_B; jj++) sc[jj] = 0.0f;
    for (long d = 0; d < hs; d++) {
        float xd = x[d];
        for (int jj = 0; jj < ATT_B; jj++) sc[jj] += xd * tile_t[d * ATT_B + jj];
    }
}

/* global (nqb * ATT_B, NH, B), local (ATT_B, 1, 1); local arrays: Qs, Os, Vs [ATT_B][hs], Kt [hs][ATT_B] */
kernel void k_attention(global float *out, long oo, global float *lse, long lo, global const float *q, long qo,
                        long4 qs, global const float *k, long ko, long4 ks, global const float *v, long vo, long4 vs,
                        long T, long NH, long NKV, long hs, long win, float scale, int drop, ulong dseed, ulong dhi,
                        uint thr, float keep, long heads, long head0, local float *Qs, local float *Os,
                        local float *Kt, local float *Vs) {
    int i = (int)get_local_id(0);
    long q0 = get_group_id(0) * ATT_B, h = get_global_id(1), b = get_global_id(2), kh = h / (NH / NKV);
    long t = q0 + i;
    global const float *kb = k + ko + b * ks.s0 + kh * ks.s2, *vb = v + vo + b * vs.s0 + kh * vs.s2;
    local float *qr = Qs + i * hs, *orow = Os + i * hs;
    load_tile(Qs, q + qo + b * qs.s0 + h * qs.s2, qs.s1, q0, T, hs);
    for (long d = 0; d < hs; d++) orow[d] = 0.0f;
    float m = -INFINITY, l = 0.0f, sc[ATT_B];
    ulong eb = (ulong)(((b * heads + head0 + h) * T + t) * T); /* Note [OpenCL dropout]: row t's numbers */
    drop_cache dc;
    dc.valid = 0;
    long jlo = first_key(q0, win), jhi = q0 + ATT_B - 1 < T - 1 ? q0 + ATT_B - 1 : T - 1;
    for (long j0 = jlo / ATT_B * ATT_B; j0 <= jhi; j0 += ATT_B) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_tile_t(Kt, kb, ks.s1, j0, T, hs);
        load_tile(Vs, vb, vs.s1, j0, T, hs);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t >= T) continue;
        long a = first_key(t, win);
        scores(sc, qr, Kt, hs);
        float tm = -INFINITY;
        for (int jj = 0; jj < ATT_B; jj++) {
            long j = j0 + jj;
            sc[jj] = j >= a && j <= t ? sc[jj] * scale : -INFINITY;
            tm = fmax(tm, sc[jj]);
        }
        if (tm == -INFINITY) continue; /* no key of this tile is visible to row t */
        float mn = fmax(m, tm), corr = exp(m - mn);
        l *= corr;
        for (long d = 0; d < hs; d++) orow[d] *= corr;
        m = mn;
        for (int jj = 0; jj < ATT_B; jj++) {
            if (sc[jj] == -INFINITY) continue;
            float p = exp(sc[jj] - m);
            l += p;
            if (drop) p *= drop_at(&dc, dseed, dhi, eb + (ulong)(j0 + jj), thr, keep);
            local const float *vr = Vs + jj * hs;
            for (long d = 0; d < hs; d++) orow[d] += p * vr[d];
        }
    }
    if (t >= T) return;
    float inv = 1.0f / l;
    lse[lo + (b * NH + h) * T + t] = m + log(l);
    global float *o = out + oo + (b * T + t) * NH * hs + h * hs;
    for (long d = 0; d < hs; d++) o[d] = orow[d] * inv;
}

/* out: (B, T, NH + 2*NKV, hs) packed dq | dk | dv; Dsum: (B, NH, T) scratch.
 * global (nqb * ATT_B, NH, B), local (ATT_B, 1, 1); local: Qs, Gs, dQs, Ks [ATT_B][hs], Kt, Vt [hs][ATT_B] */
kernel void k_attention_back_dq(global float *out, long oo, global float *Dsum, global const float *lse, long lo,
                                global const float *q, long qo, long4 qs, global const float *k, long ko, long4 ks,
                                global const float *v, long vo, long4 vs, global const float *g, long go, long4 gs,
                                long T, long NH, long NKV, long hs, long win, float scale, int drop, ulong dseed,
                                ulong dhi, uint thr, float keep, long heads, long head0, local float *Qs,
                                local float *Gs, local float *dQs, local float *Ks, local float *Kt,
                                local float *Vt) {
    int i = (int)get_local_id(0);
    long q0 = get_group_id(0) * ATT_B, h = get_global_id(1), b = get_global_id(2), kh = h / (NH / NKV);
    long t = q0 + i, W = NH + 2 * NKV;
    global const float *kb = k + ko + b * ks.s0 + kh * ks.s2, *vb = v + vo + b * vs.s0 + kh * vs.s2;
    local float *dqr = dQs + i * hs;
    load_tile(Qs, q + qo + b * qs.s0 + h * qs.s2, qs.s1, q0, T, hs);
    load_tile(Gs, g + go + b * gs.s0 + h * hs, gs.s1, q0, T, hs);
    for (long d = 0; d < hs; d++) dqr[d] = 0.0f;
    float l = t < T ? lse[lo + (b * NH + h) * T + t] : 0.0f, dot = 0.0f, s[ATT_B], sd[ATT_B];
    long a = first_key(t, win);
    long jlo = first_key(q0, win), jhi = q0 + ATT_B - 1 < T - 1 ? q0 + ATT_B - 1 : T - 1;
    ulong eb = (ulong)(((b * heads + head0 + h) * T + t) * T);
    drop_cache dc;
    dc.valid = 0;
    for (int pass = 0; pass < 2; pass++)
        for (long j0 = jlo / ATT_B * ATT_B; j0 <= jhi; j0 += ATT_B) {
            barrier(CLK_LOCAL_MEM_FENCE);
            load_tile(Ks, kb, ks.s1, j0, T, hs);
            load_tile_t(Kt, kb, ks.s1, j0, T, hs);
            load_tile_t(Vt, vb, vs.s1, j0, T, hs);
            barrier(CLK_LOCAL_MEM_FENCE);
            if (t >= T) continue;
            scores(s, Qs + i * hs, Kt, hs);
            scores(sd, Gs + i * hs, Vt, hs);
            for (int jj = 0; jj < ATT_B; jj++) {
                long j = j0 + jj;
                if (j < a || j > t) continue;
                float p = exp(s[jj] * scale - l), dp = sd[jj];
                if (drop) dp *= drop_at(&dc, dseed, dhi, eb + (ulong)j, thr, keep);
                if (pass == 0) {
                    dot += p * dp;
                    continue;
                }
                float ds = p * (dp - dot) * scale;
                local const float *kr = Ks + jj * hs;
                for (long d = 0; d < hs; d++) dqr[d] += ds * kr[d];
            }
        }
    if (t >= T) return;
    Dsum[(b * NH + h) * T + t] = dot;
    global float *dq = out + oo + (b * T + t) * W * hs + h * hs;
    for (long d = 0; d < hs; d++) dq[d] = dqr[d];
}

/* global (nkb * ATT_B, NKV, B), local (ATT_B, 1, 1); local: Kr, Vr, dKs, dVs, Qs, Gs [ATT_B][hs], Qt, Gt
 * [hs][ATT_B], Ls, Ds [ATT_B] */
kernel void k_attention_back_dkv(global float *out, long oo, global const float *Dsum, global const float *lse, long lo,
                                 global const float *q, long qo, long4 qs, global const float *k, long ko, long4 ks,
                                 global const float *v, long vo, long4 vs, global const float *g, long go, long4 gs,
                                 long T, long NH, long NKV, long hs, long win, float scale, int drop, ulong dseed,
                                 ulong dhi, uint thr, float keep, long heads, long head0, local float *Kr,
                                 local float *Vr, local float *dKs, local float *dVs, local float *Qs,
                                 local float *Gs, local float *Qt, local float *Gt, local float *Ls,
                                 local float *Ds) {
    int i = (int)get_local_id(0);
    long k0 = get_group_id(0) * ATT_B, kh = get_global_id(1), b = get_global_id(2), grp = NH / NKV;
    long j = k0 + i, W = NH + 2 * NKV;
    local float *dkr = dKs + i * hs, *dvr = dVs + i * hs;
    load_tile(Kr, k + ko + b * ks.s0 + kh * ks.s2, ks.s1, k0, T, hs);
    load_tile(Vr, v + vo + b * vs.s0 + kh * vs.s2, vs.s1, k0, T, hs);
    for (long d = 0; d < hs; d++) dkr[d] = dvr[d] = 0.0f;
    float s[ATT_B], sd[ATT_B];
    drop_cache dc;
    dc.valid = 0;
    /* query rows that see a key of this block: [k0, last key + win - 1] (all later rows without a window) */
    long kl = k0 + ATT_B - 1 < T - 1 ? k0 + ATT_B - 1 : T - 1;
    long thi = win > 0 && kl + win - 1 < T - 1 ? kl + win - 1 : T - 1;
    for (long h = kh * grp; h < (kh + 1) * grp; h++)
        for (long t0 = k0; t0 <= thi; t0 += ATT_B) {
            barrier(CLK_LOCAL_MEM_FENCE);
            global const float *qb = q + qo + b * qs.s0 + h * qs.s2, *gb = g + go + b * gs.s0 + h * hs;
            load_tile(Qs, qb, qs.s1, t0, T, hs);
            load_tile_t(Qt, qb, qs.s1, t0, T, hs);
            load_tile(Gs, gb, gs.s1, t0, T, hs);
            load_tile_t(Gt, gb, gs.s1, t0, T, hs);
            long row = (b * NH + h) * T + t0 + i;
            Ls[i] = t0 + i < T ? lse[lo + row] : 0.0f;
            Ds[i] = t0 + i < T ? Dsum[row] : 0.0f;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (j >= T) continue;
            scores(s, Kr + i * hs, Qt, hs);
            scores(sd, Vr + i * hs, Gt, hs);
            for (int tt = 0; tt < ATT_B; tt++) {
                long t = t0 + tt;
                if (t >= T || t < j || first_key(t, win) > j) continue;
                float p = exp(s[tt] * scale - Ls[tt]), dp = sd[tt], pm = p;
                if (drop) {
                    float mk = drop_at(&dc, dseed, dhi, (ulong)(((b * heads + head0 + h) * T + t) * T + j), thr, keep);
                    dp *= mk;
                    pm *= mk;
                }
                float ds = p * (dp - Ds[tt]) * scale;
                local const float *qr = Qs + tt * hs, *gr = Gs + tt * hs;
                for (long d = 0; d < hs; d++) {
                    dkr[d] += ds * qr[d];
                    dvr[d] += pm * gr[d];
                }
            }
        }
    if (j >= T) return;
    global float *dk = out + oo + (b * T + j) * W * hs + (NH + kh) * hs;
    global float *dv = out + oo + (b * T + j) * W * hs + (NH + NKV + kh) * hs;
    for (long d = 0; d < hs; d++) {
        dk[d] = dkr[d];
        dv[d] = dvr[d];
    }
}

/* a score of k_attention_kv: bf (an eager bf16 model's numerics, ATTENTION_KV iparams[2]) rounds the
 * product q.k and the scaled score to bf16, as the CPU kernel does */
inline float kv_score(global const float *qr, global const float *kr, long hs, float scale, int bf) {
    float s = dotp(qr, kr, hs);
    return bf ? rbf16(rbf16(s) * scale) : s * scale;
}

/* inference over a KV cache (B, S, NKV, hs), contiguous: query t at position pos0 + t attends rows
 * [first, pos0 + t] (win > 0: a sliding window) -> out (B, Tq, NH*hs); bf: bf16 numerics (scores rounded, and
 * the probabilities rounded to bf16 before they weight v, as sl_k_attention_kv) */
kernel void k_attention_kv(global float *out, long oo, global const float *q, long qo, long4 qs, global const float *k,
                           long ko, global const float *v, long vo, long Tq, long S, long NH, long NKV, long hs,
                           long pos0, long win, float scale, int bf) {
    long idx = get_global_id(0);
    long t = idx % Tq, h = (idx / Tq) % NH, b = idx / (Tq * NH), kh = h / (NH / NKV);
    long last = pos0 + t, first = (win > 0 && last - win + 1 > 0) ? last - win + 1 : 0;
    global const float *qr = q + qo + b * qs.s0 + t * qs.s1 + h * qs.s2;
    global const float *kb = k + ko + (b * S * NKV + kh) * hs, *vb = v + vo + (b * S * NKV + kh) * hs;
    long rs = NKV * hs;
    float mx = -INFINITY;
    for (long j = first; j <= last; j++) mx = fmax(mx, kv_score(qr, kb + j * rs, hs, scale, bf));
    float sum = 0.0f;
    for (long j = first; j <= last; j++) sum += exp(kv_score(qr, kb + j * rs, hs, scale, bf) - mx);
    float inv = 1.0f / sum;
    global float *o = out + oo + (b * Tq + t) * NH * hs + h * hs;
    for (long d = 0; d < hs; d++) o[d] = 0.0f;
    for (long j = first; j <= last; j++) {
        float e = exp(kv_score(qr, kb + j * rs, hs, scale, bf) - mx);
        float pj = bf ? rbf16(e * inv) / inv * inv : e * inv;
        global const float *vr = vb + j * rs;
        for (long d = 0; d < hs; d++) o[d] += pj * vr[d];
    }
}
