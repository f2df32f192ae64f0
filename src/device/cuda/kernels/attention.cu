/* Causal attention with grouped KV heads and an optional sliding window (win > 0: query t sees keys
 * max(0, t - win + 1) .. t, as the CPU's sl_attention_window). Port of the first version of
 * src/device/opencl/kernels/attention.cl (one work-item per row; that file is now tiled, Note [OpenCL flash
 * attention]); semantics: src/device/cpu/kernels/attention.c, llama_ops.c).
 * Forward: one thread per (b, h, query row t), scores recomputed in three passes (max, sum, weighted sum of
 * v); lse = max + log(sum) saved in aux. Backward: one thread per (b, h, t) writes dq and D = sum_j p_j
 * (dy . v_j) (scratch), then one thread per (b, kv head, key row j) owns dk_j and dv_j (race-free,
 * deterministic). Threads of a warp are consecutive t of one head, so they read the same k/v rows.
 * Note [CUDA attention speed]: this is the correct first version, not a flash kernel; at GPT-2 124M, T=1024
 * it is expected to dominate the step (README).
 * Dropout of the probabilities (d.on; Note [CUDA dropout] in common.cuh), as the CPU's sl_k_attention_ref /
 * sl_k_attention_back_ref and Note [OpenCL dropout]: element (t, j) of query head h of batch b has number
 * ((b heads + head0 + h) T + t) T + j (heads, head0: a TP shard's place among the model's heads); the
 * softmax sums the undropped p, o sums (p m) v, and the backward uses dp = (dy . v) m, D = sum p dp, ds = p
 * (dp - D) scale, dv += (p m) dy. Compiled by nvcc, not yet run on a GPU. */
#include "common.cuh"

__device__ __forceinline__ int64_t first_key(int64_t t, int64_t win) {
    return win > 0 && t - win + 1 > 0 ? t - win + 1 : 0;
}

__device__ __forceinline__ float dotp(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

__global__ void k_attention(float *out, float *lse, const float *q, cu_v5 qs, const float *k, cu_v5 ks,
                            const float *v, cu_v5 vs, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                            int64_t win, float scale, cu_drop dr) {
    CU_LOOP(idx, B * NH * T) {
        int64_t t = idx % T, h = (idx / T) % NH, b = idx / (T * NH), kh = h / (NH / NKV);
        const float *qr = q + b * qs.v[0] + t * qs.v[1] + h * qs.v[2];
        const float *kb = k + b * ks.v[0] + kh * ks.v[2], *vb = v + b * vs.v[0] + kh * vs.v[2];
        int64_t j0 = first_key(t, win);
        float mx = -INFINITY;
        for (int64_t j = j0; j <= t; j++) mx = fmaxf(mx, dotp(qr, kb + j * ks.v[1], hs) * scale);
        float sum = 0.0f;
        for (int64_t j = j0; j <= t; j++) sum += expf(dotp(qr, kb + j * ks.v[1], hs) * scale - mx);
        float inv = 1.0f / sum;
        lse[(b * NH + h) * T + t] = mx + logf(sum);
        float *o = out + (b * T + t) * NH * hs + h * hs;
        for (int64_t d = 0; d < hs; d++) o[d] = 0.0f;
        uint64_t eb = (uint64_t)(((b * dr.heads + dr.head0 + h) * T + t) * T); /* row t's numbers */
        cu_drop_cache dc;
        dc.valid = 0;
        for (int64_t j = j0; j <= t; j++) {
            float pj = expf(dotp(qr, kb + j * ks.v[1], hs) * scale - mx) * inv;
            if (dr.on) pj *= drop_at(dc, dr, eb + (uint64_t)j);
            const float *vr = vb + j * vs.v[1];
            for (int64_t d = 0; d < hs; d++) o[d] += pj * vr[d];
        }
    }
}

extern "C" cudaError_t cu_attention(cudaStream_t s, float *out, float *lse, const float *q, cu_v5 qs,
                                    const float *k, cu_v5 ks, const float *v, cu_v5 vs, int64_t B, int64_t T,
                                    int64_t NH, int64_t NKV, int64_t hs, int64_t win, float scale, cu_drop d) {
    if (B * NH * T <= 0) return cudaSuccess;
    k_attention<<<cu_blocks(B * NH * T), CU_THREADS, 0, s>>>(out, lse, q, qs, k, ks, v, vs, B, T, NH, NKV, hs,
                                                             win, scale, d);
    return CU_LAUNCHED();
}

__global__ void k_attention_back_dq(float *out, float *Dsum, const float *lse, const float *q, cu_v5 qs,
                                    const float *k, cu_v5 ks, const float *v, cu_v5 vs, const float *g, cu_v5 gs,
                                    int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs, int64_t win,
                                    float scale, cu_drop dr) {
    CU_LOOP(idx, B * NH * T) {
        int64_t t = idx % T, h = (idx / T) % NH, b = idx / (T * NH), kh = h / (NH / NKV), W = NH + 2 * NKV;
        const float *qr = q + b * qs.v[0] + t * qs.v[1] + h * qs.v[2];
        const float *gr = g + b * gs.v[0] + t * gs.v[1] + h * hs;
        const float *kb = k + b * ks.v[0] + kh * ks.v[2], *vb = v + b * vs.v[0] + kh * vs.v[2];
        float l = lse[(b * NH + h) * T + t], dot = 0.0f;
        int64_t j0 = first_key(t, win);
        uint64_t eb = (uint64_t)(((b * dr.heads + dr.head0 + h) * T + t) * T);
        cu_drop_cache dc;
        dc.valid = 0;
        for (int64_t j = j0; j <= t; j++) {
            float p = expf(dotp(qr, kb + j * ks.v[1], hs) * scale - l), dp = dotp(gr, vb + j * vs.v[1], hs);
            if (dr.on) dp *= drop_at(dc, dr, eb + (uint64_t)j);
            dot += p * dp;
        }
        Dsum[(b * NH + h) * T + t] = dot;
        float *dq = out + (b * T + t) * W * hs + h * hs;
        for (int64_t d = 0; d < hs; d++) dq[d] = 0.0f;
        for (int64_t j = j0; j <= t; j++) {
            const float *kr = kb + j * ks.v[1];
            float p = expf(dotp(qr, kr, hs) * scale - l), dp = dotp(gr, vb + j * vs.v[1], hs);
            if (dr.on) dp *= drop_at(dc, dr, eb + (uint64_t)j);
            float ds = p * (dp - dot) * scale;
            for (int64_t d = 0; d < hs; d++) dq[d] += ds * kr[d];
        }
    }
}

__global__ void k_attention_back_dkv(float *out, const float *Dsum, const float *lse, const float *q, cu_v5 qs,
                                     const float *k, cu_v5 ks, const float *v, cu_v5 vs, const float *g,
                                     cu_v5 gs, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                                     int64_t win, float scale, cu_drop dr) {
    CU_LOOP(idx, B * NKV * T) {
        int64_t j = idx % T, kh = (idx / T) % NKV, b = idx / (T * NKV), grp = NH / NKV, W = NH + 2 * NKV;
        const float *kr = k + b * ks.v[0] + j * ks.v[1] + kh * ks.v[2];
        const float *vr = v + b * vs.v[0] + j * vs.v[1] + kh * vs.v[2];
        float *dk = out + (b * T + j) * W * hs + (NH + kh) * hs;
        float *dv = out + (b * T + j) * W * hs + (NH + NKV + kh) * hs;
        for (int64_t d = 0; d < hs; d++) dk[d] = dv[d] = 0.0f;
        for (int64_t h = kh * grp; h < (kh + 1) * grp; h++)
            for (int64_t t = j; t < (win > 0 && j + win < T ? j + win : T); t++) {
                const float *qr = q + b * qs.v[0] + t * qs.v[1] + h * qs.v[2];
                const float *gr = g + b * gs.v[0] + t * gs.v[1] + h * hs;
                int64_t row = (b * NH + h) * T + t;
                float p = expf(dotp(qr, kr, hs) * scale - lse[row]), dp = dotp(gr, vr, hs), pm = p;
                if (dr.on) { /* one number per (row, key): a cache would not be reused */
                    uint64_t e = (uint64_t)(((b * dr.heads + dr.head0 + h) * T + t) * T + j);
                    cu_u4 w = philox4x32(dr.seed, dr.hi, e >> 2);
                    float mk = w.w[e & 3] >= dr.thr ? dr.keep : 0.0f;
                    dp *= mk;
                    pm *= mk;
                }
                float ds = p * (dp - Dsum[row]) * scale;
                for (int64_t d = 0; d < hs; d++) {
                    dk[d] += ds * qr[d];
                    dv[d] += pm * gr[d];
                }
            }
    }
}

extern "C" cudaError_t cu_attention_back(cudaStream_t s, float *out, float *dsum, const float *lse,
                                         const float *q, cu_v5 qs, const float *k, cu_v5 ks, const float *v,
                                         cu_v5 vs, const float *g, cu_v5 gs, int64_t B, int64_t T, int64_t NH,
                                         int64_t NKV, int64_t hs, int64_t win, float scale, cu_drop d) {
    if (B * NH * T <= 0) return cudaSuccess;
    k_attention_back_dq<<<cu_blocks(B * NH * T), CU_THREADS, 0, s>>>(out, dsum, lse, q, qs, k, ks, v, vs, g, gs,
                                                                     B, T, NH, NKV, hs, win, scale, d);
    cudaError_t e = CU_LAUNCHED();
    if (e != cudaSuccess) return e;
    k_attention_back_dkv<<<cu_blocks(B * NKV * T), CU_THREADS, 0, s>>>(out, dsum, lse, q, qs, k, ks, v, vs, g,
                                                                       gs, B, T, NH, NKV, hs, win, scale, d);
    return CU_LAUNCHED();
}

/* inference over a KV cache (B, S, NKV, hs), contiguous: query t at position pos0 + t attends rows
 * [first, pos0 + t] (win > 0: a sliding window) -> out (B, Tq, NH*hs) */
__global__ void k_attention_kv(float *out, const float *q, cu_v5 qs, const float *k, const float *v, int64_t B,
                               int64_t Tq, int64_t S, int64_t NH, int64_t NKV, int64_t hs, int64_t pos0,
                               int64_t win, float scale) {
    CU_LOOP(idx, B * NH * Tq) {
        int64_t t = idx % Tq, h = (idx / Tq) % NH, b = idx / (Tq * NH), kh = h / (NH / NKV);
        int64_t last = pos0 + t, first = (win > 0 && last - win + 1 > 0) ? last - win + 1 : 0;
        const float *qr = q + b * qs.v[0] + t * qs.v[1] + h * qs.v[2];
        const float *kb = k + (b * S * NKV + kh) * hs, *vb = v + (b * S * NKV + kh) * hs;
        int64_t rs = NKV * hs;
        float mx = -INFINITY;
        for (int64_t j = first; j <= last; j++) mx = fmaxf(mx, dotp(qr, kb + j * rs, hs) * scale);
        float sum = 0.0f;
        for (int64_t j = first; j <= last; j++) sum += expf(dotp(qr, kb + j * rs, hs) * scale - mx);
        float inv = 1.0f / sum;
        float *o = out + (b * Tq + t) * NH * hs + h * hs;
        for (int64_t d = 0; d < hs; d++) o[d] = 0.0f;
        for (int64_t j = first; j <= last; j++) {
            float pj = expf(dotp(qr, kb + j * rs, hs) * scale - mx) * inv;
            const float *vr = vb + j * rs;
            for (int64_t d = 0; d < hs; d++) o[d] += pj * vr[d];
        }
    }
}

extern "C" cudaError_t cu_attention_kv(cudaStream_t s, float *out, const float *q, cu_v5 qs, const float *k,
                                       const float *v, int64_t B, int64_t Tq, int64_t S, int64_t NH, int64_t NKV,
                                       int64_t hs, int64_t pos0, int64_t win, float scale) {
    if (B * NH * Tq <= 0) return cudaSuccess;
    k_attention_kv<<<cu_blocks(B * NH * Tq), CU_THREADS, 0, s>>>(out, q, qs, k, v, B, Tq, S, NH, NKV, hs, pos0,
                                                                 win, scale);
    return CU_LAUNCHED();
}
