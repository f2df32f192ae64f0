/* The per-row bodies of the eager half attention's backward (attention_half.cu, Note [CUDA half attention]),
 * as device functions of plain arguments: included by attention_half.cu after common.cuh (rbf16, rf16,
 * philox4x32, drop_at, cu_drop, cu_v5). The reference's operations in its order, split three ways:
 *   half_dq_row (b, h, t): D_t = sum_j p dp (j ascending) and dq_t (j ascending, rounded once), as the
 *     reference's row loop;
 *   half_kv_row (b, h, j): this query head's dk_j, dv_j sums over the rows t that see key j, t ascending,
 *     which is the order in which the reference's row loop adds into its per-head hk[j], hv[j];
 *   half_kv_combine (b, kh, j): the group's heads rounded into dk_j, dv_j in head order.
 * p, dp, ds and the dropout multipliers are recomputed where they are needed by the same operations, so
 * every value is the reference's. */
#ifndef SL_CUDA_ATTENTION_HALF_CUH
#define SL_CUDA_ATTENTION_HALF_CUH

__device__ __forceinline__ float hround(float x, int mode) {
    return mode == 2 || mode == 3 ? rf16(x) : mode ? rbf16(x) : x;
}
__device__ __forceinline__ int p32(int mode) { return mode == 3 || mode == 4; } /* P kept in fp32 */
__device__ __forceinline__ float aexp(float x) { return (float)exp((double)x); }
__device__ __forceinline__ float alog(float x) { return (float)log((double)x); }
__device__ __forceinline__ int64_t jfirst(int64_t t, int64_t win) {
    return win > 0 && t - win + 1 > 0 ? t - win + 1 : 0;
}

/* the backward's p and dp (before the dropout multiplier) of query row qr / dy row gr against key kr /
 * value vr, as the reference computes them */
__device__ __forceinline__ void half_pdp(const float *qr, const float *kr, const float *gr, const float *vr,
                                         int64_t hs, float scale, float l, int hm, float *p, float *dp) {
    float s = 0, sd = 0;
    for (int64_t d = 0; d < hs; d++) {
        s += qr[d] * (p32(hm) ? hround(kr[d], hm) : kr[d]);
        sd += gr[d] * vr[d];
    }
    float sc = hround(hround(s, hm) * scale, hm); /* the forward's scores */
    *p = p32(hm) ? aexp(sc - l) : hround(aexp(sc - l), hm);
    *dp = hround(sd, hm);
}

/* the dropout multiplier of (b, h, t, j) (Note [CUDA dropout]) */
__device__ __forceinline__ float half_mask(const cu_drop &dr, int64_t b, int64_t h, int64_t t, int64_t j,
                                           int64_t T) {
    uint64_t e = (uint64_t)(((b * dr.heads + dr.head0 + h) * T + t) * T + j);
    cu_u4 w = philox4x32(dr.seed, dr.hi, e >> 2);
    return w.w[e & 3] >= dr.thr ? dr.keep : 0.0f;
}

/* dq of row t of query head h (into out) and D_t (into Dsum) */
__device__ __forceinline__ void half_dq_row(float *out, float *Dsum, const float *lse, const float *q, cu_v5 qs,
                                            const float *k, cu_v5 ks, const float *v, cu_v5 vs, const float *g,
                                            cu_v5 gs, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                                            int64_t win, float scale, int hm, const cu_drop &dr, int64_t b,
                                            int64_t h, int64_t t) {
    int64_t kh = h / (NH / NKV), W = NH + 2 * NKV, j0 = jfirst(t, win);
    const float *gr = g + b * gs.v[0] + t * gs.v[1] + h * hs;
    const float *qr = q + b * qs.v[0] + t * qs.v[1] + h * qs.v[2];
    const float *kb = k + b * ks.v[0] + kh * ks.v[2], *vb = v + b * vs.v[0] + kh * vs.v[2];
    float *dq = out + (b * T + t) * W * hs + h * hs;
    float l = lse[(b * NH + h) * T + t], dot = 0, p, dp;
    for (int64_t j = j0; j <= t; j++) {
        half_pdp(qr, kb + j * ks.v[1], gr, vb + j * vs.v[1], hs, scale, l, hm, &p, &dp);
        if (dr.on) dp *= half_mask(dr, b, h, t, j, T);
        dot += p * dp;
    }
    for (int64_t d = 0; d < hs; d++) dq[d] = 0;
    for (int64_t j = j0; j <= t; j++) {
        const float *kr = kb + j * ks.v[1];
        half_pdp(qr, kr, gr, vb + j * vs.v[1], hs, scale, l, hm, &p, &dp);
        if (dr.on) dp *= half_mask(dr, b, h, t, j, T);
        float ds = hround(hround(p * (dp - dot), hm) * scale, hm);
        for (int64_t d = 0; d < hs; d++) dq[d] += ds * (p32(hm) ? hround(kr[d], hm) : kr[d]);
    }
    for (int64_t d = 0; d < hs; d++) dq[d] = hround(dq[d], hm);
    Dsum[(b * NH + h) * T + t] = dot;
}

/* query head h's unrounded dk_j, dv_j (into Hk, Hv: (B, NH, T, hs)), rows t in order */
__device__ __forceinline__ void half_kv_row(float *Hk, float *Hv, const float *Dsum, const float *lse,
                                            const float *q, cu_v5 qs, const float *k, cu_v5 ks, const float *v,
                                            cu_v5 vs, const float *g, cu_v5 gs, int64_t T, int64_t NH,
                                            int64_t NKV, int64_t hs, int64_t win, float scale, int hm,
                                            const cu_drop &dr, int64_t b, int64_t h, int64_t j) {
    int64_t kh = h / (NH / NKV), row = (b * NH + h) * T;
    const float *kr = k + b * ks.v[0] + j * ks.v[1] + kh * ks.v[2];
    const float *vr = v + b * vs.v[0] + j * vs.v[1] + kh * vs.v[2];
    float *hk = Hk + (row + j) * hs, *hv = Hv + (row + j) * hs, p, dp;
    for (int64_t d = 0; d < hs; d++) hk[d] = hv[d] = 0;
    int64_t tend = win > 0 && j + win < T ? j + win : T; /* the rows whose window holds key j */
    for (int64_t t = j; t < tend; t++) {
        const float *gr = g + b * gs.v[0] + t * gs.v[1] + h * hs;
        const float *qr = q + b * qs.v[0] + t * qs.v[1] + h * qs.v[2];
        half_pdp(qr, kr, gr, vr, hs, scale, lse[row + t], hm, &p, &dp);
        float mk = dr.on ? half_mask(dr, b, h, t, j, T) : 1.0f;
        if (dr.on) dp *= mk;
        float ds = hround(hround(p * (dp - Dsum[row + t]), hm) * scale, hm);
        float pj = p32(hm) ? hround(p, hm) : p;
        if (dr.on) pj *= mk;
        for (int64_t d = 0; d < hs; d++) {
            hk[d] += ds * qr[d];
            hv[d] += pj * gr[d];
        }
    }
}

/* dk_j, dv_j of kv head kh (into out): the group's per-head sums rounded in, head by head */
__device__ __forceinline__ void half_kv_combine(float *out, const float *Hk, const float *Hv, int64_t T,
                                                int64_t NH, int64_t NKV, int64_t hs, int hm, int64_t b,
                                                int64_t kh, int64_t j) {
    int64_t grp = NH / NKV, W = NH + 2 * NKV;
    float *dk = out + (b * T + j) * W * hs + (NH + kh) * hs, *dv = dk + NKV * hs;
    for (int64_t d = 0; d < hs; d++) dk[d] = dv[d] = 0;
    for (int64_t h = kh * grp; h < (kh + 1) * grp; h++) {
        const float *hk = Hk + ((b * NH + h) * T + j) * hs, *hv = Hv + ((b * NH + h) * T + j) * hs;
        for (int64_t d = 0; d < hs; d++) {
            /* 3 / 4: transformers repeats the fp32 (post-RoPE) keys, so their sum is fp32 */
            dk[d] = p32(hm) ? dk[d] + hround(hk[d], hm) : hround(dk[d] + hround(hk[d], hm), hm);
            dv[d] = hround(dv[d] + hround(hv[d], hm), hm);
        }
    }
}
#endif
