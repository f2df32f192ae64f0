/* Causal multi-head attention with grouped KV heads. Forward stores the softmax probabilities in the
 * node's aux area (B, NH, T, T) for the backward pass. (A flash-style kernel that keeps only the
 * per-row logsumexp is the operator library's job; this is the reference-grade path.) */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/kernels.h"

sl_status sl_k_attention(sl_tensor *n) {
    sl_tensor *q = n->src[0], *k = n->src[1], *v = n->src[2];
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
    int64_t grp = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
    const float *pq = q->data, *pk = k->data, *pv = v->data;
    float *out = n->data;
    float *P = (float *)((char *)n->data + sl_nbytes(n));
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t idx = 0; idx < B * NH * T; idx++) {
        int64_t t = idx % T, h = (idx / T) % NH, b = idx / (T * NH), kh = h / grp;
        const float *qr = pq + b * q->nb[0] + t * q->nb[1] + h * q->nb[2];
        float *p = P + ((b * NH + h) * T + t) * T;
        float mx = -INFINITY;
        for (int64_t j = 0; j <= t; j++) {
            const float *kr = pk + b * k->nb[0] + j * k->nb[1] + kh * k->nb[2];
            float s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t d = 0; d < hs; d++) s += qr[d] * kr[d];
            s *= scale;
            p[j] = s;
            if (s > mx) mx = s;
        }
        float sum = 0;
        for (int64_t j = 0; j <= t; j++) {
            p[j] = expf(p[j] - mx);
            sum += p[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j <= t; j++) p[j] *= inv;
        for (int64_t j = t + 1; j < T; j++) p[j] = 0;
        float *o = out + (b * T + t) * NH * hs + h * hs;
        for (int64_t d = 0; d < hs; d++) o[d] = 0;
        for (int64_t j = 0; j <= t; j++) {
            const float *vr = pv + b * v->nb[0] + j * v->nb[1] + kh * v->nb[2];
            float pj = p[j];
#pragma omp simd
            for (int64_t d = 0; d < hs; d++) o[d] += pj * vr[d];
        }
    }
    return SL_OK;
}

/* Output packed (B, T, NH + 2*NKV, hs): dq | dk | dv. Work is split over (b, kv head) so that the
 * accumulations into dk/dv have a single writer: deterministic and race-free. */
sl_status sl_k_attention_back(sl_tensor *n) {
    sl_tensor *f = n->src[0], *q = n->src[1], *k = n->src[2], *v = n->src[3], *g = n->src[4];
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
    int64_t grp = NH / NKV, W = NH + 2 * NKV;
    float scale = 1.0f / sqrtf((float)hs);
    const float *P = (const float *)((const char *)f->data + sl_nbytes(f));
    const float *pq = q->data, *pk = k->data, *pv = v->data, *pg = g->data;
    float *out = n->data;
    int64_t gb = g->nb[0], gt = g->nb[1];
#pragma omp parallel
    {
        float *dp = malloc(sizeof(float) * (size_t)(T ? T : 1));
#pragma omp for schedule(dynamic, 1)
        for (int64_t bk = 0; bk < B * NKV; bk++) {
            int64_t b = bk / NKV, kh = bk % NKV;
            for (int64_t j = 0; j < T; j++) {
                memset(out + (b * T + j) * W * hs + (NH + kh) * hs, 0, sizeof(float) * (size_t)hs);
                memset(out + (b * T + j) * W * hs + (NH + NKV + kh) * hs, 0, sizeof(float) * (size_t)hs);
            }
            for (int64_t h = kh * grp; h < (kh + 1) * grp; h++) {
                for (int64_t t = 0; t < T; t++) {
                    const float *p = P + ((b * NH + h) * T + t) * T;
                    const float *go = pg + b * gb + t * gt + h * hs;
                    const float *qr = pq + b * q->nb[0] + t * q->nb[1] + h * q->nb[2];
                    float *dq = out + (b * T + t) * W * hs + h * hs;
                    float dot = 0;
                    for (int64_t j = 0; j <= t; j++) {
                        const float *vr = pv + b * v->nb[0] + j * v->nb[1] + kh * v->nb[2];
                        float s = 0;
#pragma omp simd reduction(+ : s)
                        for (int64_t d = 0; d < hs; d++) s += go[d] * vr[d];
                        dp[j] = s;
                        dot += p[j] * s;
                    }
                    for (int64_t d = 0; d < hs; d++) dq[d] = 0;
                    for (int64_t j = 0; j <= t; j++) {
                        float ds = p[j] * (dp[j] - dot) * scale;
                        const float *kr = pk + b * k->nb[0] + j * k->nb[1] + kh * k->nb[2];
                        float *dk = out + (b * T + j) * W * hs + (NH + kh) * hs;
                        float *dv = out + (b * T + j) * W * hs + (NH + NKV + kh) * hs;
                        float pj = p[j];
#pragma omp simd
                        for (int64_t d = 0; d < hs; d++) {
                            dq[d] += ds * kr[d];
                            dk[d] += ds * qr[d];
                            dv[d] += pj * go[d];
                        }
                    }
                }
            }
        }
        free(dp);
    }
    return SL_OK;
}
