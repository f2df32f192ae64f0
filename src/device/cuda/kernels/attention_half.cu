/* Eager half attention numerics (ATTENTION iparams[2] = 1..4; Note [Eager half attention numerics] in
 * src/device/cpu/kernels/attention.c): the rounding points of an eager softmax(q k^T / sqrt(hs)) v under
 * torch.autocast, for --bf16 / --fp16 training.
 *
 * Note [CUDA half attention]
 * The port of src/device/opencl/kernels/attention_half.cl (Note [OpenCL half attention]): the CPU's scalar
 * reference kernels (sl_k_attention_ref, sl_k_attention_back_ref) turned into threads, the same fp32
 * operations in the same order (nvcc --fmad=false), the same rounding points (rbf16 / rf16 of common.cuh, the
 * CPU's roundings bit for bit), the softmax's exp and the lse's log computed in double and rounded once.
 * Forward: one thread per query row (b, h, t), its probabilities and dropout multipliers in a global scratch
 * row (2 T floats). Backward: one thread per (b, kv head), which owns that head's dk / dv rows and its
 * group's dq rows (3 T + 2 T hs floats of scratch); under half numerics each query head's dk / dv is
 * accumulated in the scratch and then rounded into the group's sums. Dropout of the probabilities as in
 * attention.cu (Note [CUDA dropout]). B NH T threads forward and only B NKV backward: a numerics path, not a
 * fast one. Compiled by nvcc, not yet run on a GPU. */
#include "common.cuh"

__device__ __forceinline__ float hround(float x, int mode) {
    return mode == 2 || mode == 3 ? rf16(x) : mode ? rbf16(x) : x;
}
__device__ __forceinline__ int p32(int mode) { return mode == 3 || mode == 4; } /* P kept in fp32 */
__device__ __forceinline__ float aexp(float x) { return (float)exp((double)x); }
__device__ __forceinline__ float alog(float x) { return (float)log((double)x); }
__device__ __forceinline__ int64_t jfirst(int64_t t, int64_t win) {
    return win > 0 && t - win + 1 > 0 ? t - win + 1 : 0;
}

__global__ void k_attention_half(float *out, float *lse, const float *q, cu_v5 qs, const float *k, cu_v5 ks,
                                 const float *v, cu_v5 vs, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                 int64_t hs, int64_t win, float scale, int hm, cu_drop dr, float *P) {
    CU_LOOP(idx, B * NH * T) {
        int64_t t = idx % T, h = (idx / T) % NH, b = idx / (T * NH), kh = h / (NH / NKV);
        const float *qr = q + b * qs.v[0] + t * qs.v[1] + h * qs.v[2];
        float *p = P + idx * 2 * T, *mk = p + T;
        float mx = -INFINITY;
        int64_t j0 = jfirst(t, win);
        for (int64_t j = j0; j <= t; j++) {
            const float *kr = k + b * ks.v[0] + j * ks.v[1] + kh * ks.v[2];
            float s = 0;
            for (int64_t d = 0; d < hs; d++) s += qr[d] * (p32(hm) ? hround(kr[d], hm) : kr[d]);
            s = hround(hround(s, hm) * scale, hm);
            p[j] = s;
            if (s > mx) mx = s;
        }
        float sum = 0;
        for (int64_t j = j0; j <= t; j++) {
            p[j] = aexp(p[j] - mx);
            sum += p[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = j0; j <= t; j++) p[j] = hround(p[j] * inv, hm);
        lse[(b * NH + h) * T + t] = mx + alog(sum);
        if (dr.on) {
            cu_drop_cache dc;
            dc.valid = 0;
            uint64_t eb = (uint64_t)(((b * dr.heads + dr.head0 + h) * T + t) * T);
            for (int64_t j = 0; j <= t; j++) mk[j] = drop_at(dc, dr, eb + (uint64_t)j);
        }
        float *o = out + (b * T + t) * NH * hs + h * hs;
        for (int64_t d = 0; d < hs; d++) o[d] = 0;
        for (int64_t j = j0; j <= t; j++) {
            const float *vr = v + b * vs.v[0] + j * vs.v[1] + kh * vs.v[2];
            float pj = dr.on ? p[j] * mk[j] : p[j];
            for (int64_t d = 0; d < hs; d++) o[d] += pj * vr[d];
        }
        for (int64_t d = 0; d < hs; d++) o[d] = hround(o[d], hm);
    }
}

extern "C" cudaError_t cu_attention_half(cudaStream_t s, float *out, float *lse, const float *q, cu_v5 qs,
                                         const float *k, cu_v5 ks, const float *v, cu_v5 vs, int64_t B,
                                         int64_t T, int64_t NH, int64_t NKV, int64_t hs, int64_t win,
                                         float scale, int hm, cu_drop d, float *P) {
    if (B * NH * T <= 0) return cudaSuccess;
    k_attention_half<<<cu_blocks(B * NH * T), CU_THREADS, 0, s>>>(out, lse, q, qs, k, ks, v, vs, B, T, NH, NKV,
                                                                  hs, win, scale, hm, d, P);
    return CU_LAUNCHED();
}

__global__ void k_attention_half_back(float *out, const float *lse, const float *q, cu_v5 qs, const float *k,
                                      cu_v5 ks, const float *v, cu_v5 vs, const float *g, cu_v5 gs, int64_t B,
                                      int64_t T, int64_t NH, int64_t NKV, int64_t hs, int64_t win, float scale,
                                      int hm, cu_drop dr, float *S) {
    CU_LOOP(bk, B * NKV) {
        int64_t b = bk / NKV, kh = bk % NKV, grp = NH / NKV, W = NH + 2 * NKV;
        float *p = S + bk * (3 * T + 2 * T * hs), *dp = p + T, *mk = dp + T, *hk = mk + T, *hv = hk + T * hs;
        for (int64_t j = 0; j < T; j++)
            for (int64_t d = 0; d < hs; d++) {
                out[(b * T + j) * W * hs + (NH + kh) * hs + d] = 0;
                out[(b * T + j) * W * hs + (NH + NKV + kh) * hs + d] = 0;
            }
        for (int64_t h = kh * grp; h < (kh + 1) * grp; h++) {
            for (int64_t i = 0; i < 2 * T * hs; i++) hk[i] = 0;
            for (int64_t t = 0; t < T; t++) {
                const float *gr = g + b * gs.v[0] + t * gs.v[1] + h * hs;
                const float *qr = q + b * qs.v[0] + t * qs.v[1] + h * qs.v[2];
                float *dq = out + (b * T + t) * W * hs + h * hs;
                float l = lse[(b * NH + h) * T + t], dot = 0;
                int64_t j0 = jfirst(t, win);
                if (dr.on) {
                    cu_drop_cache dc;
                    dc.valid = 0;
                    uint64_t eb = (uint64_t)(((b * dr.heads + dr.head0 + h) * T + t) * T);
                    for (int64_t j = 0; j <= t; j++) mk[j] = drop_at(dc, dr, eb + (uint64_t)j);
                }
                for (int64_t j = j0; j <= t; j++) {
                    const float *kr = k + b * ks.v[0] + j * ks.v[1] + kh * ks.v[2];
                    const float *vr = v + b * vs.v[0] + j * vs.v[1] + kh * vs.v[2];
                    float s = 0, sd = 0;
                    for (int64_t d = 0; d < hs; d++) {
                        s += qr[d] * (p32(hm) ? hround(kr[d], hm) : kr[d]);
                        sd += gr[d] * vr[d];
                    }
                    float sc = hround(hround(s, hm) * scale, hm); /* the forward's scores */
                    p[j] = p32(hm) ? aexp(sc - l) : hround(aexp(sc - l), hm);
                    dp[j] = hround(sd, hm);
                    if (dr.on) dp[j] *= mk[j];
                    dot += p[j] * dp[j];
                }
                for (int64_t d = 0; d < hs; d++) dq[d] = 0;
                for (int64_t j = j0; j <= t; j++) {
                    float ds = hround(hround(p[j] * (dp[j] - dot), hm) * scale, hm);
                    const float *kr = k + b * ks.v[0] + j * ks.v[1] + kh * ks.v[2];
                    float *dk = hk + j * hs, *dv = hv + j * hs;
                    float pj = p32(hm) ? hround(p[j], hm) : p[j];
                    if (dr.on) pj *= mk[j];
                    for (int64_t d = 0; d < hs; d++) {
                        dq[d] += ds * (p32(hm) ? hround(kr[d], hm) : kr[d]);
                        dk[d] += ds * qr[d];
                        dv[d] += pj * gr[d];
                    }
                }
                for (int64_t d = 0; d < hs; d++) dq[d] = hround(dq[d], hm);
            }
            for (int64_t j = 0; j < T; j++) { /* this head's h(dk), h(dv) into the group's sums */
                float *dk = out + (b * T + j) * W * hs + (NH + kh) * hs, *dv = dk + NKV * hs;
                for (int64_t d = 0; d < hs; d++) {
                    /* 3 / 4: transformers repeats the fp32 (post-RoPE) keys, so their sum is fp32 */
                    dk[d] = p32(hm) ? dk[d] + hround(hk[j * hs + d], hm)
                                    : hround(dk[d] + hround(hk[j * hs + d], hm), hm);
                    dv[d] = hround(dv[d] + hround(hv[j * hs + d], hm), hm);
                }
            }
        }
    }
}

extern "C" cudaError_t cu_attention_half_back(cudaStream_t s, float *out, const float *lse, const float *q,
                                              cu_v5 qs, const float *k, cu_v5 ks, const float *v, cu_v5 vs,
                                              const float *g, cu_v5 gs, int64_t B, int64_t T, int64_t NH,
                                              int64_t NKV, int64_t hs, int64_t win, float scale, int hm,
                                              cu_drop d, float *S) {
    if (B * NKV <= 0) return cudaSuccess;
    k_attention_half_back<<<cu_blocks(B * NKV), CU_THREADS, 0, s>>>(out, lse, q, qs, k, ks, v, vs, g, gs, B, T,
                                                                    NH, NKV, hs, win, scale, hm, d, S);
    return CU_LAUNCHED();
}
