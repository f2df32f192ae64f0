/* Llama-family kernels: RMSNorm, rotate-half RoPE, SiLU, top-k routing gate, and the KV-cache
 * attention used by inference. OpenMP over rows; inner loops unit-stride so the compiler vectorises;
 * every reduction runs in a fixed order, so results do not depend on the thread count. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/kernels/aten_sum.h"
#include "device/cpu/kernels/gemm.h"
#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/llama_ops.h"

static float round_bf16(float f);
/* mode 1: to bf16, 2: to f16 (values kept in f32) */
static float round_to(float f, int mode) {
    return mode == 2 ? sl_f16_to_f32(sl_f32_to_f16(f)) : round_bf16(f);
}
/* Thread only when there is enough work: on small decode-step tensors the fork/join costs more than the
 * loop, and far more on a loaded machine. */
#define PAR(work) ((int64_t)(work) >= 16384)
static int64_t rows_of(const sl_tensor *t) {
    return t->ne[t->ndim - 1] ? sl_nelements(t) / t->ne[t->ndim - 1] : 0;
}
static int64_t row_stride(const sl_tensor *t) { return t->ndim >= 2 ? t->nb[t->ndim - 2] : t->ne[0]; }

/* ---------------- RMSNorm ---------------- */

/* Note [RMSNorm as transformers computes it]
 * transformers' LlamaRMSNorm is a chain of fp32 tensor ops: v = x.pow(2).mean(-1), r = rsqrt(v + eps),
 * y = w * (x * r). Its gradient is autograd's through them: dh = dy * w; dr = sum over the row of dh * x;
 * dv = (-0.5 * dr) * r.pow(3) (r * r * r); the mean's gradient dv / C, times pow's 2 * x; so
 * dx = dh * r + (dv / C) * (2 * x); and dw = sum over the rows of dy * (x * r). The kernels below
 * evaluate exactly those expressions, and take the three sums in PyTorch's own order (Note [ATen's
 * summation order], aten_sum.c), so a row's r, dx and dw carry torch's bits: under bf16 autocast an ulp
 * of the fp32 dx decides roundings further down (test_hf_models' autocast gradients). The sums' scratch:
 * one row of C floats per thread. */

sl_status sl_k_rmsnorm(sl_tensor *n) {
    sl_tensor *x = n->src[0], *w = n->src[1];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x), xs = row_stride(x);
    float eps = n->fparams[0];
    const float *px = x->data, *pw = w ? w->data : NULL;
    float *py = n->data, *rstd = (float *)((char *)n->data + sl_nbytes(n));
    int bad = 0;
#pragma omp parallel if (PAR(R * C)) reduction(| : bad)
    {
        float *sq = malloc(sizeof(float) * (size_t)(C > 0 ? C : 1));
        bad = sq == NULL; /* every thread still meets the worksharing loop */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            if (!sq) continue;
            const float *xr = px + r * xs;
            float *yr = py + r * C;
            for (int64_t c = 0; c < C; c++) sq[c] = xr[c] * xr[c];
            float rs = 1.0f / sqrtf(sl_aten_row_sum(sq, C) / (float)C + eps);
            if (pw) {
#pragma omp simd
                for (int64_t c = 0; c < C; c++) yr[c] = pw[c] * (xr[c] * rs);
            } else {
#pragma omp simd
                for (int64_t c = 0; c < C; c++) yr[c] = xr[c] * rs;
            }
            rstd[r] = rs;
        }
        free(sq);
    }
    return bad ? sl_fail(SL_ERR_NOMEM, "rmsnorm: out of memory") : SL_OK;
}

/* dx = dh * r + ((-0.5 * sum(dh * x)) * r^3 / C) * (2 * x), dh = g * w (Note [RMSNorm as transformers
 * computes it]) */
sl_status sl_k_rmsnorm_back_x(sl_tensor *n) {
    sl_tensor *f = n->src[0], *x = n->src[1], *w = n->src[2], *g = n->src[3];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x), xs = row_stride(x), gs = row_stride(g);
    const float *rstd = (const float *)((const char *)f->data + sl_nbytes(f));
    const float *px = x->data, *pw = w ? w->data : NULL, *pg = g->data;
    float *pdx = n->data;
    int bad = 0;
#pragma omp parallel if (PAR(R * C)) reduction(| : bad)
    {
        float *pr = malloc(sizeof(float) * (size_t)(C > 0 ? C : 1));
        bad = pr == NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            if (!pr) continue;
            const float *xr = px + r * xs, *gr = pg + r * gs;
            float *dx = pdx + r * C, rs = rstd[r];
            /* dh lives in dx until the last loop overwrites it with the row's gradient */
            for (int64_t c = 0; c < C; c++) dx[c] = pw ? gr[c] * pw[c] : gr[c], pr[c] = dx[c] * xr[c];
            float t = (-0.5f * sl_aten_row_sum(pr, C)) * ((rs * rs) * rs) / (float)C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) dx[c] = dx[c] * rs + t * (2.0f * xr[c]);
        }
        free(pr);
    }
    return bad ? sl_fail(SL_ERR_NOMEM, "rmsnorm_back: out of memory") : SL_OK;
}

/* dw = sum over the rows of g * (x * r), in ATen's order down the rows (Note [ATen's summation order]): each
 * block of 32 columns, and each trailing column block, is summed from a per-thread R x 32 buffer of its
 * products, with the order of its place in the whole row (trailing columns under 8 one at a time, as
 * row_sum takes them, where C >= 8) */
sl_status sl_k_rmsnorm_back_w(sl_tensor *n) {
    sl_tensor *f = n->src[0], *x = n->src[1], *g = n->src[2];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x), xs = row_stride(x), gs = row_stride(g);
    const float *rstd = (const float *)((const char *)f->data + sl_nbytes(f));
    const float *px = x->data, *pg = g->data;
    float *dw = n->data;
    int64_t nb = (C + 31) / 32;
    int bad = 0;
#pragma omp parallel if (PAR(R * C) && nb > 1) reduction(| : bad)
    {
        float *buf = malloc(sizeof(float) * (size_t)(R > 0 ? R : 1) * 32);
        bad = buf == NULL;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nb; b++) {
            if (!buf) continue;
            int64_t c0 = b * 32, w = C - c0 < 32 ? C - c0 : 32;
            for (int64_t r = 0; r < R; r++) {
                const float *xr = px + r * xs, *gr = pg + r * gs;
                float rs = rstd[r];
                for (int64_t c = 0; c < w; c++) buf[r * w + c] = gr[c0 + c] * (xr[c0 + c] * rs);
            }
            if (w >= 8 || C < 8) {
                sl_aten_col_sums(buf, R, w, w, dw + c0);
            } else { /* single trailing columns of a wider row: row_sum each (a width of 1 takes it) */
                for (int64_t c = 0; c < w; c++) sl_aten_col_sums(buf + c, R, 1, w, dw + c0 + c);
            }
        }
        free(buf);
    }
    return bad ? sl_fail(SL_ERR_NOMEM, "rmsnorm_back_w: out of memory") : SL_OK;
}

/* ---------------- RoPE ---------------- */

/* Note [RoPE numerics]
 * transformers computes inv_freq = 1 / theta^(2i/hs) in float32, freqs = pos * inv_freq in float32,
 * then cos/sin of the float32 angle. We mirror that order (float angle, then cosf/sinf on its exact
 * value in double) so that angles at large positions round the same way as in PyTorch.
 * iparams[2]: 0 fp32; 1 (2) a bf16 (f16) model: cos/sin and every product and sum rounded; 3 (4) autocast
 * bf16 (f16): an fp32 forward (transformers' fp32 cos/sin promote q and k to fp32; the attention matmul's
 * cast rounds them after) whose backward is mode 5 (6): autocast's gradient of q * cos + rotate_half(q) *
 * sin for a half q, each product's gradient rounded and their sum rounded, cos/sin exact. */
sl_status sl_k_rope(sl_tensor *n) {
    sl_tensor *x = n->src[0];
    int64_t B = x->ne[0], T = x->ne[1], NH = x->ne[2], hs = x->ne[3], half = hs / 2;
    int pos0 = n->iparams[0];
    float sgn = n->iparams[1] ? -1.0f : 1.0f, theta = n->fparams[0];
    int mode = n->iparams[2]; /* Note [RoPE numerics] */
    int bf = mode == 1 || mode == 2 ? mode
             : mode == 5            ? 1
             : mode == 6            ? 2
                                    : 0,
        round_cs = mode == 1 || mode == 2;
    const float *px = x->data;
    float *py = n->data;
    int nt = omp_get_max_threads();
    float *scratch =
        malloc(sizeof(float) * (size_t)(3 * half + 1) * (size_t)nt); /* per-thread cos|sin|inv_freq */
    if (!scratch) return sl_fail(SL_ERR_NOMEM, "rope: out of memory");
#pragma omp parallel num_threads(nt) if (PAR(B * T * NH * hs))
    {
        float *cs = scratch + (size_t)omp_get_thread_num() * (size_t)(3 * half + 1), *sn = cs + half,
              *inv = sn + half;
        for (int64_t i = 0; i < half; i++) inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
        float factor = n->fparams[1];
        if (factor > 0) { /* transformers' _compute_llama3_parameters, in float32 */
            float lo = n->fparams[2], hi = n->fparams[3], old = (float)n->iparams[3];
            float lo_wl = old / lo, hi_wl = old / hi;
            for (int64_t i = 0; i < half; i++) {
                float wl = 2.0f * (float)M_PI / inv[i];
                float f = wl > lo_wl ? inv[i] / factor : inv[i];
                if (!(wl < hi_wl) && !(wl > lo_wl)) {
                    float sm = (old / wl - lo) / (hi - lo);
                    f = (1.0f - sm) * f / factor + sm * f;
                }
                inv[i] = f;
            }
        }
#pragma omp for schedule(static)
        for (int64_t bt = 0; bt < B * T; bt++) {
            int64_t b = bt / T, t = bt % T;
            float pos = (float)(pos0 + t);
            for (int64_t i = 0; i < half; i++) {
                float ang = pos * inv[i];
                cs[i] = (float)cos((double)ang);
                sn[i] = sgn * (float)sin((double)ang);
                if (round_cs) cs[i] = round_to(cs[i], bf), sn[i] = round_to(sn[i], bf);
            }
            for (int64_t h = 0; h < NH; h++) {
                const float *xr = px + b * x->nb[0] + t * x->nb[1] + h * x->nb[2];
                float *yr = py + ((b * T + t) * NH + h) * hs;
                if (bf) {
                    for (int64_t i = 0; i < half; i++) {
                        float x1 = xr[i], x2 = xr[i + half];
                        yr[i] = round_to(round_to(x1 * cs[i], bf) + round_to(-x2 * sn[i], bf), bf);
                        yr[i + half] = round_to(round_to(x2 * cs[i], bf) + round_to(x1 * sn[i], bf), bf);
                    }
                    continue;
                }
#pragma omp simd
                for (int64_t i = 0; i < half; i++) {
                    float x1 = xr[i], x2 = xr[i + half];
                    yr[i] = x1 * cs[i] - x2 * sn[i];
                    yr[i + half] = x2 * cs[i] + x1 * sn[i];
                }
            }
        }
    }
    free(scratch);
    return SL_OK;
}

/* ---------------- SiLU ---------------- */

sl_status sl_k_silu(sl_tensor *n) {
    sl_tensor *a = n->src[0];
    sl_it5 ia = sl_it5_of(a), io = sl_it5_of(n);
    const float *pa = a->data;
    float *py = n->data;
    int64_t outer = io.ne[0] * io.ne[1] * io.ne[2] * io.ne[3], inner = io.ne[4];
#pragma omp parallel for schedule(static) if (PAR(outer * inner))
    for (int64_t o = 0; o < outer; o++) {
        int64_t i3 = o % io.ne[3], i2 = (o / io.ne[3]) % io.ne[2],
                i1 = (o / (io.ne[3] * io.ne[2])) % io.ne[1], i0 = o / (io.ne[3] * io.ne[2] * io.ne[1]);
        const float *xr = pa + i0 * ia.nb[0] + i1 * ia.nb[1] + i2 * ia.nb[2] + i3 * ia.nb[3];
        float *yr = py + o * inner;
        int64_t s = ia.nb[4];
        for (int64_t i = 0; i < inner; i++) {
            float v = xr[i * s];
            yr[i] = v / (1.0f + expf(-v));
        }
    }
    return SL_OK;
}

/* d/dx x*sig(x) = sig(x) * (1 + x*(1 - sig(x))) */
sl_status sl_k_silu_back(sl_tensor *n) {
    sl_tensor *a = n->src[0], *g = n->src[1];
    sl_it5 ia = sl_it5_of(a), ig = sl_it5_of(g), io = sl_it5_of(n);
    const float *pa = a->data, *pg = g->data;
    float *py = n->data;
    int64_t outer = io.ne[0] * io.ne[1] * io.ne[2] * io.ne[3], inner = io.ne[4];
#pragma omp parallel for schedule(static) if (PAR(outer * inner))
    for (int64_t o = 0; o < outer; o++) {
        int64_t i3 = o % io.ne[3], i2 = (o / io.ne[3]) % io.ne[2],
                i1 = (o / (io.ne[3] * io.ne[2])) % io.ne[1], i0 = o / (io.ne[3] * io.ne[2] * io.ne[1]);
        const float *xr = pa + i0 * ia.nb[0] + i1 * ia.nb[1] + i2 * ia.nb[2] + i3 * ia.nb[3];
        const float *gr = pg + i0 * ig.nb[0] + i1 * ig.nb[1] + i2 * ig.nb[2] + i3 * ig.nb[3];
        float *yr = py + o * inner;
        for (int64_t i = 0; i < inner; i++) {
            float v = xr[i * ia.nb[4]], sg = 1.0f / (1.0f + expf(-v));
            yr[i] = gr[i * ig.nb[4]] * sg * (1.0f + v * (1.0f - sg));
        }
    }
    return SL_OK;
}

/* ---------------- top-k gate ---------------- */

/* Ties resolve to the lower index, like torch.topk on CPU for distinct values. */
sl_status sl_k_topk_gate(sl_tensor *n) {
    sl_tensor *a = n->src[0];
    int64_t N = a->ne[0], E = a->ne[1], as = a->nb[0];
    int k = n->iparams[0];
    const float *pa = a->data;
    float *py = n->data;
#pragma omp parallel for schedule(static) if (PAR(N * E))
    for (int64_t r = 0; r < N; r++) {
        const float *x = pa + r * as;
        float *y = py + r * E;
        for (int64_t e = 0; e < E; e++) y[e] = 0;
        float mx = -INFINITY;
        for (int j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++)
                if (y[e] == 0 && (best < 0 || x[e] > x[best])) best = e;
            y[best] = 1; /* marker */
            if (x[best] > mx) mx = x[best];
        }
        double s = 0;
        for (int64_t e = 0; e < E; e++)
            if (y[e] != 0) s += exp((double)x[e] - mx);
        for (int64_t e = 0; e < E; e++)
            if (y[e] != 0) y[e] = (float)(exp((double)x[e] - mx) / s);
    }
    return SL_OK;
}

/* softmax backward restricted to the selected entries: dx = y * (dy - sum(y*dy)) (zero where y == 0) */
sl_status sl_k_topk_gate_back(sl_tensor *n) {
    sl_tensor *f = n->src[0], *g = n->src[1];
    int64_t N = f->ne[0], E = f->ne[1], gs = row_stride(g);
    const float *py = f->data, *pg = g->data;
    float *pd = n->data;
#pragma omp parallel for schedule(static) if (PAR(N * E))
    for (int64_t r = 0; r < N; r++) {
        const float *y = py + r * E, *gr = pg + r * gs;
        float *d = pd + r * E, dot = 0;
        for (int64_t e = 0; e < E; e++) dot += y[e] * gr[e];
        for (int64_t e = 0; e < E; e++) d[e] = y[e] * (gr[e] - dot);
    }
    return SL_OK;
}

/* ---------------- KV cache ---------------- */

sl_status sl_k_kv_store(sl_tensor *n) {
    sl_tensor *x = n->src[1];
    int64_t B = x->ne[0], T = x->ne[1], NKV = x->ne[2], hs = x->ne[3], S = n->ne[1];
    int64_t pos0 = n->iparams[0];
    if (pos0 < 0 || pos0 + T > S)
        return sl_fail(SL_ERR_INVALID, "kv cache: position %lld + %lld exceeds capacity %lld",
                       (long long)pos0, (long long)T, (long long)S);
    float *pc = n->data;
    const float *px = x->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < NKV; h++)
                memcpy(pc + ((b * S + pos0 + t) * NKV + h) * hs,
                       px + b * x->nb[0] + t * x->nb[1] + h * x->nb[2], sizeof(float) * (size_t)hs);
    return SL_OK;
}

sl_status sl_k_attention_kv(sl_tensor *n) {
    sl_tensor *q = n->src[0], *kc = n->src[1], *vc = n->src[2];
    int64_t B = q->ne[0], Tq = q->ne[1], NH = q->ne[2], hs = q->ne[3], S = kc->ne[1], NKV = kc->ne[2];
    int64_t grp = NH / NKV, pos0 = n->iparams[0], win = n->iparams[1];
    int bf = n->iparams[2]; /* bf16 numerics of an eager bf16 model: scores and probabilities rounded */
    if (pos0 < 0 || pos0 + Tq > S)
        return sl_fail(SL_ERR_INVALID, "kv cache: position %lld + %lld exceeds capacity %lld",
                       (long long)pos0, (long long)Tq, (long long)S);
    float scale = 1.0f / sqrtf((float)hs);
    const float *pq = q->data, *pk = kc->data, *pv = vc->data;
    float *out = n->data;
    int nt = omp_get_max_threads();
    float *scratch = malloc(sizeof(float) * (size_t)(S ? S : 1) * (size_t)nt); /* per-thread score rows */
    if (!scratch) return sl_fail(SL_ERR_NOMEM, "attention_kv: out of memory");
#pragma omp parallel num_threads(nt) if (PAR(B * NH * Tq * (pos0 + Tq) * hs))
    {
        float *p = scratch + (size_t)omp_get_thread_num() * (size_t)(S ? S : 1);
#pragma omp for schedule(dynamic, 4)
        for (int64_t idx = 0; idx < B * NH * Tq; idx++) {
            int64_t t = idx % Tq, h = (idx / Tq) % NH, b = idx / (Tq * NH), kh = h / grp;
            int64_t last = pos0 + t, first = (win > 0 && last - win + 1 > 0) ? last - win + 1 : 0;
            const float *qr = pq + b * q->nb[0] + t * q->nb[1] + h * q->nb[2];
            float mx = -INFINITY;
            for (int64_t j = first; j <= last; j++) {
                const float *kr = pk + ((b * S + j) * NKV + kh) * hs;
                float s = 0;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < hs; d++) s += qr[d] * kr[d];
                s = bf ? round_bf16(round_bf16(s) * scale) : s * scale;
                p[j] = s;
                if (s > mx) mx = s;
            }
            float sum = 0;
            for (int64_t j = first; j <= last; j++) {
                p[j] = expf(p[j] - mx);
                sum += p[j];
            }
            float inv = 1.0f / sum;
            if (bf)
                for (int64_t j = first; j <= last; j++) p[j] = round_bf16(p[j] * inv) / inv;
            float *o = out + (b * Tq + t) * NH * hs + h * hs;
            for (int64_t d = 0; d < hs; d++) o[d] = 0;
            for (int64_t j = first; j <= last; j++) {
                const float *vr = pv + ((b * S + j) * NKV + kh) * hs;
                float pj = p[j] * inv;
#pragma omp simd
                for (int64_t d = 0; d < hs; d++) o[d] += pj * vr[d];
            }
        }
    }
    free(scratch);
    return SL_OK;
}

/* ---------------- bf16 linear ---------------- */

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);                 /* round to nearest even */
}

static float round_bf16(float f) {
    uint32_t u = (uint32_t)to_bf16(f) << 16;
    memcpy(&f, &u, 4);
    return f;
}

/* x rows are converted to bf16 once (the activation rounding of a bf16 model), then the packed bf16 GEMM
 * (vdpbf16ps or its exact emulation) accumulates in fp32. */
sl_status sl_k_linear_bf16(sl_tensor *n) {
    sl_tensor *x = n->src[0], *w = n->src[1];
    int transB = n->iparams[0];
    int64_t K = x->ne[x->ndim - 1], M = K ? sl_nelements(x) / K : 0, xs = row_stride(x);
    int64_t N = n->ne[n->ndim - 1];
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)(M * K + 1));
    if (!xb)
        return sl_fail(SL_ERR_NOMEM, "linear_bf16: cannot allocate %lld bf16 activations",
                       (long long)(M * K));
    const float *px = x->data;
#pragma omp parallel for schedule(static) if (PAR(M * K))
    for (int64_t r = 0; r < M; r++)
        for (int64_t k = 0; k < K; k++) xb[r * K + k] = to_bf16(px[r * xs + k]);
    float *y = n->data;
    sl_gemm_bf16(0, transB, M, N, K, 1.0f, xb, K, w->data, transB ? K : N, 0.0f, y, N);
    free(xb);
    if (n->iparams[1]) {
#pragma omp parallel for schedule(static) if (PAR(M * N))
        for (int64_t i = 0; i < M * N; i++) y[i] = round_bf16(y[i]);
    }
    return SL_OK;
}

/* ---------------- sparse MoE expert ---------------- */

/* y (M, N) = x (M, K) @ w^T, w (N, K) f32 or bf16 (bf16: x rounded to bf16, fp32 accumulation, y rounded) */
static sl_status rows_linear(const float *x, int64_t M, int64_t K, const sl_tensor *w, float *y, int bf) {
    int64_t N = w->ne[0];
    if (w->dtype == SL_F32 && !bf) {
        sl_sgemm(0, 1, M, N, K, 1.0f, x, K, w->data, K, 0.0f, y, N);
        return SL_OK;
    }
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)(M * K + 1)), *wb = NULL;
    if (!xb) return sl_fail(SL_ERR_NOMEM, "moe_expert: out of memory");
    for (int64_t i = 0; i < M * K; i++) xb[i] = to_bf16(x[i]);
    const uint16_t *wp = w->data;
    if (w->dtype == SL_F32) { /* f32 weights under bf16 numerics */
        wb = malloc(sizeof(uint16_t) * (size_t)(N * K));
        if (!wb) {
            free(xb);
            return sl_fail(SL_ERR_NOMEM, "moe_expert: out of memory");
        }
        for (int64_t i = 0; i < N * K; i++) wb[i] = to_bf16(((const float *)w->data)[i]);
        wp = wb;
    }
    sl_gemm_bf16(0, 1, M, N, K, 1.0f, xb, K, wp, K, 0.0f, y, N);
    for (int64_t i = 0; i < M * N; i++) y[i] = round_bf16(y[i]);
    free(xb);
    free(wb);
    return SL_OK;
}

/* Note [Sparse experts]
 * Inference graphs give each expert its own node; the kernel gathers the rows routed to the expert
 * (gate != 0), runs the SwiGLU MLP on just those rows with the packed GEMMs, and scatters
 * gate * result back (zeros elsewhere), so an expert costs FLOPs in proportion to its tokens: top-2 of 8
 * experts costs 2/8 of the dense mixture. The per-row arithmetic is the dense path's, so the two agree. */
sl_status sl_k_moe_expert(sl_tensor *n) {
    sl_tensor *h = n->src[0], *gate = n->src[1], *w1 = n->src[2], *w3 = n->src[3], *w2 = n->src[4];
    int64_t N = h->ne[0], C = h->ne[1], I = w1->ne[0], gs = gate->nb[0], e = n->iparams[0];
    int bf = n->iparams[1];
    const float *ph = h->data, *pg = gate->data;
    float *y = n->data;
    memset(y, 0, sizeof(float) * (size_t)(N * C));
    int64_t M = 0;
    for (int64_t r = 0; r < N; r++) M += pg[r * gs + e] != 0.0f;
    if (!M) return SL_OK;
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)M);
    float *xs = malloc(sizeof(float) * (size_t)(M * C)), *a = malloc(sizeof(float) * (size_t)(M * I)),
          *b = malloc(sizeof(float) * (size_t)(M * I)), *o = malloc(sizeof(float) * (size_t)(M * C));
    sl_status st = SL_OK;
    if (!rows || !xs || !a || !b || !o) st = sl_fail(SL_ERR_NOMEM, "moe_expert: out of memory");
    for (int64_t r = 0, k = 0; st == SL_OK && r < N; r++)
        if (pg[r * gs + e] != 0.0f) {
            rows[k] = r;
            memcpy(xs + k * C, ph + r * C, sizeof(float) * (size_t)C);
            k++;
        }
    if (st == SL_OK) st = rows_linear(xs, M, C, w1, a, bf);
    if (st == SL_OK) st = rows_linear(xs, M, C, w3, b, bf);
    if (st == SL_OK) {
        for (int64_t i = 0; i < M * I; i++) {
            float s = a[i] / (1.0f + expf(-a[i]));
            a[i] = bf ? round_bf16(round_bf16(s) * b[i]) : s * b[i];
        }
        st = rows_linear(a, M, I, w2, o, bf);
    }
    for (int64_t k = 0; st == SL_OK && k < M; k++) {
        float gw = pg[rows[k] * gs + e];
        for (int64_t c = 0; c < C; c++)
            y[rows[k] * C + c] = o[k * C + c] * gw; /* unrounded: Note [bf16 Mixtral experts] (llama.c) */
    }
    free(rows), free(xs), free(a), free(b), free(o);
    return st;
}
