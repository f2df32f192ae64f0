/* Causal multi-head attention with grouped KV heads. The forward pass saves only the per-row logsumexp
 * of the scaled scores, lse (B, NH, T), in the node's aux area; backward recomputes the probabilities.
 * sl_k_attention[_back] run the flash-style SIMD kernel (vec_attention.inc); the *_ref kernels are the
 * scalar reference (row by row, the tests' oracle) with the same aux contract. Both take a sliding window
 * (iparams[1] > 0: query t sees keys max(0, t - window + 1) .. t). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/simd_math.h"
#include "device/cpu/kernels/vec_kernels.h"

/* Note [Eager half attention numerics]
 * iparams[2] = 1 (bf16) or 2 (f16) on SL_OP_ATTENTION: the numerics of an eager softmax(q k^T / sqrt(hs)) v
 * under torch.autocast, where each of those ops returns a half tensor (Note [Half autocast] in gpt2.c):
 * forward s = h(h(q.k) * scale), P = h(softmax(s)) (the softmax itself in fp32), o = h(P v); backward
 * dP = h(dy.v), dv = h(P^T dy), dS = h(P (dP - sum(P dP))), dS' = h(dS * scale), dq = h(dS' k), dk = h(dS'^T
 * q) with h() the rounding to the half type and every dot product accumulated in fp32. Under GQA each query
 * head's dk/dv is rounded and then summed with rounding (the backward of transformers' repeat_kv in half).
 * iparams[2] = 3 (f16) or 4 (bf16): as transformers' eager attention computes it under autocast:
 * softmax(s, dtype=float32) keeps P in fp32 (the next matmul's autocast cast rounds it for P v and dv), so
 * the softmax backward uses the fp32 P and only dS is rounded (where its gradient reaches the half scores);
 * under GQA the keys repeated are the fp32 ones after RoPE (the cast to half follows), so the kernel reads
 * k rounded to half (k is the fp32 RoPE output) and the group's dk is summed in fp32 (dv is still summed in
 * half: the values are the half linear output).
 * These run in the scalar reference kernels (the flash kernel has no rounding points). */
static inline float hround(float x, int mode) {
    if (mode == 2 || mode == 3) return sl_f16_to_f32(sl_f32_to_f16(x));
    return mode ? sl_round_bf16_f32(x) : x; /* sl_bf16_to_f32(sl_f32_to_bf16(x)), branch-free */
}
static int p32(int mode) { return mode == 3 || mode == 4; } /* softmax P kept in fp32 */
/* the softmax's exp: libm's in fp32, simd_math.h's sl_exp_acc in the half modes (rounded once from double,
 * like libm's; its vector twins give the same bits: Note [Rounded exp]) */
static inline float aexp(float x, int mode) { return mode ? sl_exp_acc(x) : expf(x); }

/* the (batch, head) plane of the full probability tensor that local head h of batch b is (Note [Dropout from
 * counters]: under TP the node holds heads [HEAD0, + NH) of HEADS) */
static int64_t drop_plane(const sl_tensor *f, int64_t b, int64_t h, int64_t NH) {
    int64_t heads = f->iparams[SL_DROPOUT_IP_HEADS] > 0 ? f->iparams[SL_DROPOUT_IP_HEADS] : NH;
    return b * heads + f->iparams[SL_DROPOUT_IP_HEAD0] + h;
}

/* Note [Attention dropout bits] (suanli/tensor.h): a forward node's mask area */
typedef struct drop_bits {
    unsigned char *hdr; /* NULL: no room for the bits (no dropout, or a node built without it) */
    uint16_t *bits;     /* row (b, h, t) at ((b NH + h) T + t) rw */
    int64_t rw;
} drop_bits;
static drop_bits drop_bits_of(const sl_tensor *f) {
    drop_bits d = {NULL, NULL, 0};
    int64_t B = f->src[0]->ne[0], T = f->src[0]->ne[1], NH = f->src[0]->ne[2];
    size_t lse = sizeof(float) * (size_t)(B * NH * T);
    if (!(f->fparams[0] > 0.0f) || f->aux_bytes < lse + sl_attn_dropout_bits_bytes(B, NH, T)) return d;
    d.hdr = (unsigned char *)f->data + sl_nbytes(f) + lse;
    d.bits = (uint16_t *)(void *)(d.hdr + 32);
    d.rw = 4 * ((T + 63) / 64);
    return d;
}
/* the mask's header (Note [Dropout bits], kernels.h), naming seed, stream and site (hi), p and T */
static void drop_bits_set(const drop_bits *d, uint64_t seed, uint64_t hi, float p, int64_t T, int valid) {
    if (d->hdr) sl_k_drop_header_set(d->hdr, seed, hi, p, T, valid);
}
static int drop_bits_valid(const drop_bits *d, uint64_t seed, uint64_t hi, float p, int64_t T) {
    return d->hdr && sl_k_drop_header_valid(d->hdr, seed, hi, p, T);
}
sl_status sl_k_attention_ref(sl_tensor *n) {
    sl_tensor *q = n->src[0], *k = n->src[1], *v = n->src[2];
    int hm = n->iparams[2]; /* Note [Eager half attention numerics] */
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
    int64_t grp = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
    const float *pq = q->data, *pk = k->data, *pv = v->data;
    float *out = n->data;
    float *lse = (float *)((char *)n->data + sl_nbytes(n));
    int64_t win = n->iparams[1];
    uint64_t dseed = 0, dhi = 0;
    float dp = sl_dropout_params(n, &dseed, &dhi); /* Note [Dropout from counters] (src/ops/build.c) */
    float *P = malloc(sizeof(float) * (size_t)(B * NH * T > 0 ? B * NH * T : 1) * (size_t)(T ? T : 1) * 2);
    if (!P) return sl_fail(SL_ERR_NOMEM, "attention_ref: out of memory");
    float *Mk = P + (size_t)(B * NH * T) * (size_t)T;
    const drop_bits db = drop_bits_of(n); /* Note [Attention dropout bits]: stored for the backward */
    drop_bits_set(&db, dseed, dhi, dp, T, 0);
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t idx = 0; idx < B * NH * T; idx++) {
        int64_t t = idx % T, h = (idx / T) % NH, b = idx / (T * NH), kh = h / grp;
        const float *qr = pq + b * q->nb[0] + t * q->nb[1] + h * q->nb[2];
        float *p = P + idx * T;
        float mx = -INFINITY;
        int64_t j0 = win > 0 && t - win + 1 > 0 ? t - win + 1 : 0;
        for (int64_t j = j0; j <= t; j++) {
            const float *kr = pk + b * k->nb[0] + j * k->nb[1] + kh * k->nb[2];
            float s = 0;
            for (int64_t d = 0; d < hs; d++) s += qr[d] * (p32(hm) ? hround(kr[d], hm) : kr[d]);
            s = hm ? hround(hround(s, hm) * scale, hm) : s * scale;
            p[j] = s;
            if (s > mx) mx = s;
        }
        float sum = 0;
        for (int64_t j = j0; j <= t; j++) {
            p[j] = aexp(p[j] - mx, hm);
            sum += p[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = j0; j <= t; j++) p[j] = hround(p[j] * inv, hm);
        lse[(b * NH + h) * T + t] = mx + logf(sum);
        float *mk = Mk + idx * T; /* element (b, h, t, j) of P is number idx * T + j */
        if (dp > 0) {
            sl_rng_dropout(dseed, dhi, (uint64_t)((drop_plane(n, b, h, NH) * T + t) * T), t + 1, dp, mk);
            if (db.hdr) sl_k_bits_pack(SL_KISA_SCALAR)(mk, t + 1, db.bits + ((b * NH + h) * T + t) * db.rw);
        }
        float *o = out + (b * T + t) * NH * hs + h * hs;
        for (int64_t d = 0; d < hs; d++) o[d] = 0;
        for (int64_t j = j0; j <= t; j++) {
            const float *vr = pv + b * v->nb[0] + j * v->nb[1] + kh * v->nb[2];
            float pj = dp > 0 ? p[j] * mk[j] : p[j];
            for (int64_t d = 0; d < hs; d++) o[d] += pj * vr[d];
        }
        if (hm)
            for (int64_t d = 0; d < hs; d++) o[d] = hround(o[d], hm);
    }
    free(P);
    if (dp > 0) drop_bits_set(&db, dseed, dhi, dp, T, 1);
    return SL_OK;
}

/* Output packed (B, T, NH + 2*NKV, hs): dq | dk | dv. Work is split over (b, kv head) so that the
 * accumulations into dk/dv have a single writer: deterministic and race-free. */
sl_status sl_k_attention_back_ref(sl_tensor *n) {
    sl_tensor *f = n->src[0], *q = n->src[1], *k = n->src[2], *v = n->src[3], *g = n->src[4];
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
    int64_t grp = NH / NKV, W = NH + 2 * NKV, win = n->iparams[1];
    float scale = 1.0f / sqrtf((float)hs);
    int hm = f->iparams[2]; /* Note [Eager half attention numerics] */
    const float *lse = (const float *)((const char *)f->data + sl_nbytes(f));
    const float *pq = q->data, *pk = k->data, *pv = v->data, *pg = g->data;
    float *out = n->data;
    int64_t gb = g->nb[0], gt = g->nb[1];
    /* per (b, kv head): p, dp (T each) and, for half numerics, one query head's dk | dv (2 T hs) */
    uint64_t dseed = 0, dhi = 0;
    float dpr = sl_dropout_params(f, &dseed, &dhi); /* the forward's mask, regenerated */
    size_t per = 3 * (size_t)(T ? T : 1) + (hm ? 2 * (size_t)T * (size_t)hs : 0);
    float *buf = malloc(sizeof(float) * per * (size_t)(B * NKV > 0 ? B * NKV : 1));
    if (!buf) return sl_fail(SL_ERR_NOMEM, "attention_back_ref: out of memory");
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bk = 0; bk < B * NKV; bk++) {
        int64_t b = bk / NKV, kh = bk % NKV;
        float *p = buf + per * (size_t)bk, *dp = p + T, *mk = dp + T, *hk = mk + T,
              *hv = hm ? hk + T * hs : NULL;
        for (int64_t j = 0; j < T; j++) {
            memset(out + (b * T + j) * W * hs + (NH + kh) * hs, 0, sizeof(float) * (size_t)hs);
            memset(out + (b * T + j) * W * hs + (NH + NKV + kh) * hs, 0, sizeof(float) * (size_t)hs);
        }
        for (int64_t h = kh * grp; h < (kh + 1) * grp; h++) {
            if (hm) memset(hk, 0, sizeof(float) * 2 * (size_t)(T * hs));
            for (int64_t t = 0; t < T; t++) {
                const float *go = pg + b * gb + t * gt + h * hs;
                const float *qr = pq + b * q->nb[0] + t * q->nb[1] + h * q->nb[2];
                float *dq = out + (b * T + t) * W * hs + h * hs;
                float l = lse[(b * NH + h) * T + t], dot = 0;
                int64_t j0 = win > 0 && t - win + 1 > 0 ? t - win + 1 : 0;
                if (dpr > 0)
                    sl_rng_dropout(dseed, dhi, (uint64_t)((drop_plane(f, b, h, NH) * T + t) * T), t + 1, dpr,
                                   mk);
                for (int64_t j = j0; j <= t; j++) {
                    const float *kr = pk + b * k->nb[0] + j * k->nb[1] + kh * k->nb[2];
                    const float *vr = pv + b * v->nb[0] + j * v->nb[1] + kh * v->nb[2];
                    float s = 0, sd = 0;
                    for (int64_t d = 0; d < hs; d++) {
                        s += qr[d] * (p32(hm) ? hround(kr[d], hm) : kr[d]);
                        sd += go[d] * vr[d];
                    }
                    float sc = hm ? hround(hround(s, hm) * scale, hm) : s * scale; /* the forward's scores */
                    p[j] = p32(hm) ? aexp(sc - l, hm) : hround(aexp(sc - l, hm), hm); /* fp32 P: softmax' */
                    dp[j] = hround(sd, hm);
                    if (dpr > 0) dp[j] *= mk[j]; /* d(P m) / dP: the kept scale; dot = rowsum(dO * O) */
                    dot += p[j] * dp[j];
                }
                for (int64_t d = 0; d < hs; d++) dq[d] = 0;
                for (int64_t j = j0; j <= t; j++) {
                    float ds = hm ? hround(hround(p[j] * (dp[j] - dot), hm) * scale, hm)
                                  : p[j] * (dp[j] - dot) * scale;
                    const float *kr = pk + b * k->nb[0] + j * k->nb[1] + kh * k->nb[2];
                    float *dk = hm ? hk + j * hs : out + (b * T + j) * W * hs + (NH + kh) * hs;
                    float *dv = hm ? hv + j * hs : out + (b * T + j) * W * hs + (NH + NKV + kh) * hs;
                    float pj = p32(hm) ? hround(p[j], hm) : p[j]; /* P v used the rounded P */
                    if (dpr > 0) pj *= mk[j];
                    for (int64_t d = 0; d < hs; d++) {
                        dq[d] += ds * (p32(hm) ? hround(kr[d], hm) : kr[d]);
                        dk[d] += ds * qr[d];
                        dv[d] += pj * go[d];
                    }
                }
                if (hm)
                    for (int64_t d = 0; d < hs; d++) dq[d] = hround(dq[d], hm);
            }
            for (int64_t j = 0; hm && j < T; j++) { /* this head's h(dk), h(dv) into the group's sums */
                float *dk = out + (b * T + j) * W * hs + (NH + kh) * hs, *dv = dk + NKV * hs;
                for (int64_t d = 0; d < hs; d++) {
                    /* 3/4: transformers repeats the fp32 (post-RoPE) keys, so their sum is fp32 */
                    dk[d] = p32(hm) ? dk[d] + hround(hk[j * hs + d], hm)
                                    : hround(dk[d] + hround(hk[j * hs + d], hm), hm);
                    dv[d] = hround(dv[d] + hround(hv[j * hs + d], hm), hm);
                }
            }
        }
    }
    free(buf);
    return SL_OK;
}

/* Note [Eager half attention, vectorized]
 * sl_k_attention_half[_back] compute exactly what the reference kernels above compute, element for element:
 * the same fp32 operations in the same order, the same rounding points, the same exp (sl_exp_acc, Note
 * [Rounded exp]) and libm logf. Only the loops are turned so that they vectorize: a score s(t, j) = sum_d
 * q[t][d] k[j][d] is accumulated for a run of keys j at once from a transposed copy of k (kt[d][j], rounded
 * to the half type once where the mode reads rounded keys), so each lane keeps the reference's order over d;
 * the accumulations over d (the output, dq, dk, dv) were already lane-wise. Floating-point contraction is off
 * for these functions (an FMA would round differently from the reference's multiply-then-add).
 * tests/ops/test_kernels_simd.c checks them bit for bit against the reference kernels. They took the
 * eager-half attention of GPT-2 124M bf16 (B4 T64) from 19 % of the step to 11 % (forward 2.2x, backward 1.7x
 * faster; docs/BENCHMARKS.md); it was 14 % -> 11.5 % on 2026-12-05, once the rounding points also ran in
 * vector lanes (half_fwd_row, half_back_plane). Those loops still kept their sums in memory (a store-to-load
 * round trip per step of each sum); the sums now live in vector registers (VSUM: dots over keys, P V, dq, and
 * dk / dv summed over blocks of HB_ROWS query rows, each element still in the reference's order over t), expf
 * runs in a loop of its own, and a row's scratch is per thread: 10.6 % -> 3.5 % of the Zen 4 bf16 step (bench
 * kernels
 * --only attention: forward 1.13 -> 0.65 ms, backward 2.41 -> 1.56 ms per layer call). One row's sum over
 * d is a chain of dependent adds, so the rows now go four at a time (dots4, rows_sum4: eight independent
 * chains that share their loads; the dk / dv sums take four keys at once), the dropout multipliers come
 * from the vector Philox (drop_mask), and the transposed copies are 16 x 16 register transposes. Zen 4,
 * 1 thread (docs/BENCHMARKS.md "Zen 4, fourth visit"): GPT-2 124M shape forward 1.43 -> 1.16 ms, backward
 * 3.55 -> 2.63 ms; the baby model's bf16 step with dropout 0.2 spent 6.7 s of 16.5 s per 300 steps in
 * attention, now 4.1 s of 13.7 s. libm's expf (one call per element, ~20 % of what was left) then gave way
 * to sl_exp_acc in vector lanes (exp_row; the reference kernels call its scalar twin): rounded once from
 * double like libm's, so the alignment with autocast stays where it was (the bf16 Llama's step-0
 * gradients: 0.001 of d_ref, against 0.025 with the fast 1.24-ulp sl_exp_poly); the baby bf16 step 4 %
 * faster at 1 thread (side by side), GPT-2 124M shape forward 1.26-1.39 -> 1.11-1.33 ms, backward 2.54-2.59
 * -> 2.29-2.34 ms. What is left is mostly the per-row serial sums. Tried: the dot products as FMAs (exact
 * where both operands are half values, which the model guarantees for some operands only): within 5-10 %
 * of this, noise on this host, not kept. */
#ifdef __clang__
#define SL_NO_CONTRACT _Pragma("clang fp contract(off)")
#define SL_NO_CONTRACT_ATTR
#else
#define SL_NO_CONTRACT
#define SL_NO_CONTRACT_ATTR __attribute__((optimize("fp-contract=off")))
#endif

/* PER_ISA(MAKE, NAME) builds a function body for the baseline and, on x86, for AVX-512 and AVX2 (wider lanes,
 * the same per-lane operations) as NAME_base, NAME_avx512, NAME_avx2; ISA_CALL(NAME, isa, args...) calls the
 * one the kernel ISA (sl_kern_isa) picks. */
#if SL_HAVE_X86
#define PER_ISA(MAKE, NAME)                                                                                  \
    MAKE(NAME##_base, )                                                                                      \
    MAKE(NAME##_avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))))              \
    MAKE(NAME##_avx2, __attribute__((target("avx2,fma"))))
#define ISA_CALL(NAME, ISA, ...)                                                                             \
    ((ISA) >= SL_KISA_AVX512 ? NAME##_avx512(__VA_ARGS__)                                                    \
     : (ISA) >= SL_KISA_AVX2 ? NAME##_avx2(__VA_ARGS__)                                                      \
                             : NAME##_base(__VA_ARGS__))
#else
#define PER_ISA(MAKE, NAME) MAKE(NAME##_base, )
#define ISA_CALL(NAME, ISA, ...) ((void)(ISA), NAME##_base(__VA_ARGS__))
#endif

/* (B, NKV, hs, Tp) copies, Tp = T rounded up to 16 (tpad): kt[d][j] = k[j][d] (rounded to the half type when
 * `round`), and vt likewise; the padding is zero, so that the register dots (dots_t) read whole vectors */
static int64_t tpad(int64_t T) { return (T + 15) & ~(int64_t)15; }
#if SL_HAVE_X86
#define SL_TR16_ATTR __attribute__((target("avx512f")))
#include "device/cpu/kernels/transpose_simd.h"
/* One (b, kv head) plane of transposed() in 16 x 16 tiles transposed in registers, for hs a multiple of 16
 * and no rounding or the bf16 one (sl_round_bf16_f32 in integer lanes: the same bits). The scalar loop
 * below stored one float per instruction with a 4 Tp-byte stride: 4.9 % of the baby model's bf16 step. */
SL_TR16_ATTR static void transposed_plane_avx512(const float *src, int64_t ld, int64_t T, int64_t hs,
                                                 int64_t Tp, int round_bf16, float *dst) {
    for (int64_t j0 = 0; j0 < Tp; j0 += 16)
        for (int64_t d0 = 0; d0 < hs; d0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                r[i] = j0 + i < T ? _mm512_loadu_ps(src + (j0 + i) * ld + d0) : _mm512_setzero_ps();
                if (round_bf16) r[i] = sl_round_bf16_avx512(r[i]);
            }
            sl_tr16_ps(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (d0 + i) * Tp + j0, r[i]);
        }
}
#endif
SL_NO_CONTRACT_ATTR static float *transposed(const sl_tensor *x, int hm, int round) {
    int64_t B = x->ne[0], T = x->ne[1], NKV = x->ne[2], hs = x->ne[3], Tp = tpad(T);
    /* 32 zero floats past the end: dots4 reads runs of 32 keys from a multiple of 16 */
    float *r = malloc(sizeof(float) * (size_t)(B * NKV * hs * Tp + 32));
    if (!r) return NULL;
    memset(r + B * NKV * hs * Tp, 0, sizeof(float) * 32);
    const float *px = x->data;
#if SL_HAVE_X86
    const int fast = sl_kern_isa() >= SL_KISA_AVX512 && hs % 16 == 0 && (!round || hm == 1 || hm == 4);
#endif
#pragma omp parallel for schedule(static)
    for (int64_t bk = 0; bk < B * NKV; bk++) {
        int64_t b = bk / NKV, h = bk % NKV;
        float *dst = r + bk * hs * Tp;
#if SL_HAVE_X86
        if (fast) {
            transposed_plane_avx512(px + b * x->nb[0] + h * x->nb[2], x->nb[1], T, hs, Tp, round, dst);
            continue;
        }
#endif
        for (int64_t j = 0; j < T; j++) {
            const float *src = px + b * x->nb[0] + j * x->nb[1] + h * x->nb[2];
            for (int64_t d = 0; d < hs; d++) dst[d * Tp + j] = round ? hround(src[d], hm) : src[d];
        }
        for (int64_t d = 0; d < hs; d++)
            for (int64_t j = T; j < Tp; j++) dst[d * Tp + j] = 0;
    }
    return r;
}

/* Sums in vector registers: 16 lanes of GCC's generic vectors (one zmm, two ymm or four xmm, per the
 * function's target), loaded and stored through memcpy (unaligned). `acc += a * x` with contraction off is
 * the reference's multiply then add in each lane; up to four accumulators are independent chains, so the
 * sums run at the adder's throughput instead of a store-to-load round trip per step (Note [Eager half
 * attention, vectorized]). */
typedef float sl_vf16 __attribute__((vector_size(64)));
#define VLD(v, p) memcpy(&(v), (p), sizeof(sl_vf16))
#define VST(p, v) memcpy((p), &(v), sizeof(sl_vf16))
/* NV (1..4) accumulators s0..s3 over the 16-lane columns [c, c + 16 NV) of rows xr(i), i = 0 .. n-1, scaled
 * by the scalar ai(i): s_v = sum over i in order of ai(i) * xr(i)[c + 16 v] */
#define VSUM_NV(NV, n, ai, xr, c)                                                                            \
    for (int64_t i_ = 0; i_ < (n); i_++) {                                                                   \
        const float av_ = (ai), *xv_ = (xr) + (c);                                                           \
        sl_vf16 x_;                                                                                          \
        VLD(x_, xv_);                                                                                        \
        s0 += av_ * x_;                                                                                      \
        if ((NV) > 1) {                                                                                      \
            VLD(x_, xv_ + 16);                                                                               \
            s1 += av_ * x_;                                                                                  \
        }                                                                                                    \
        if ((NV) > 2) {                                                                                      \
            VLD(x_, xv_ + 32);                                                                               \
            s2 += av_ * x_;                                                                                  \
        }                                                                                                    \
        if ((NV) > 3) {                                                                                      \
            VLD(x_, xv_ + 48);                                                                               \
            s3 += av_ * x_;                                                                                  \
        }                                                                                                    \
    }
/* the sums of VSUM_NV for nv = 1..4 (a runtime value), started from init[0 .. 16 nv) (NULL: zero) and
 * stored to tmp[0 .. 16 nv) */
#define VSUM_FROM(nv, n, ai, xr, c, init, tmp)                                                               \
    do {                                                                                                     \
        sl_vf16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};                                                      \
        const float *in_ = (init);                                                                           \
        if (in_) {                                                                                           \
            VLD(s0, in_);                                                                                    \
            if ((nv) > 1) VLD(s1, in_ + 16);                                                                 \
            if ((nv) > 2) VLD(s2, in_ + 32);                                                                 \
            if ((nv) > 3) VLD(s3, in_ + 48);                                                                 \
        }                                                                                                    \
        switch (nv) {                                                                                        \
        case 1:                                                                                              \
            VSUM_NV(1, n, ai, xr, c) break;                                                                  \
        case 2:                                                                                              \
            VSUM_NV(2, n, ai, xr, c) break;                                                                  \
        case 3:                                                                                              \
            VSUM_NV(3, n, ai, xr, c) break;                                                                  \
        default:                                                                                             \
            VSUM_NV(4, n, ai, xr, c) break;                                                                  \
        }                                                                                                    \
        VST(tmp, s0);                                                                                        \
        VST(tmp + 16, s1);                                                                                   \
        VST(tmp + 32, s2);                                                                                   \
        VST(tmp + 48, s3);                                                                                   \
    } while (0)
#define VSUM(nv, n, ai, xr, c, tmp) VSUM_FROM(nv, n, ai, xr, c, (const float *)NULL, tmp)

/* acc[j] = sum over d (in order) of a[d] * xt[d][j] for j in [j0, j1]; xt's rows are ldx apart and readable
 * to the next multiple of 16 past j1 (transposed()'s padding). Built for AVX-512, AVX2 and the baseline
 * (the same per-lane operations) and chosen by the kernel ISA (sl_kern_isa). */
#define DOTS_T_BODY                                                                                          \
    SL_NO_CONTRACT                                                                                           \
    float tmp[64];                                                                                           \
    for (int64_t jb = j0 & ~(int64_t)15; jb <= j1; jb += 64) {                                               \
        int64_t nv = (j1 - jb) / 16 + 1, lo = jb > j0 ? jb : j0, hi = j1 < jb + 63 ? j1 : jb + 63;           \
        VSUM(nv, hs, a[i_], xt + i_ * ldx, jb, tmp);                                                         \
        for (int64_t j = lo; j <= hi; j++) acc[j] = tmp[j - jb];                                             \
    }
#define DOTS_T_FN(NAME, ATTR)                                                                                \
    SL_NO_CONTRACT_ATTR ATTR static void NAME(const float *a, const float *xt, int64_t ldx, int64_t hs,      \
                                              int64_t j0, int64_t j1, float *acc) {                          \
        DOTS_T_BODY                                                                                          \
    }
PER_ISA(DOTS_T_FN, dots_t)
static void dots_t(const float *a, const float *xt, int64_t ldx, int64_t hs, int64_t j0, int64_t j1,
                   float *acc) {
    ISA_CALL(dots_t, sl_kern_isa(), a, xt, ldx, hs, j0, j1, acc);
}

/* out[d] (+)= sum over i = i0 .. i1 (in order) of w[i ldw] * x_i[d], x_i = x + i * ldx, for d < hs (a
 * multiple of 16: the caller checks); with `add` the sums start from out's values, else from zero. The sums
 * are held in registers: out is read (add) and written once. Per ISA like dots_t. */
#define ROWS_SUM_BODY                                                                                        \
    SL_NO_CONTRACT                                                                                           \
    float tmp[64];                                                                                           \
    for (int64_t c = 0; c < hs; c += 64) {                                                                   \
        int64_t nv = (hs - c) / 16 < 4 ? (hs - c) / 16 : 4;                                                  \
        VSUM_FROM(nv, i1 - i0 + 1, w[(i0 + i_) * ldw], x + (i0 + i_) * ldx, c, add ? out + c : NULL, tmp);   \
        memcpy(out + c, tmp, sizeof(float) * (size_t)(16 * nv));                                             \
    }
#define ROWS_SUM_FN(NAME, ATTR)                                                                              \
    SL_NO_CONTRACT_ATTR ATTR static void NAME(const float *w, int64_t ldw, const float *x, int64_t ldx,      \
                                              int64_t hs, int64_t i0, int64_t i1, float *out, int add) {     \
        ROWS_SUM_BODY                                                                                        \
    }
PER_ISA(ROWS_SUM_FN, rows_sum)
static void rows_sum(const float *w, int64_t ldw, const float *x, int64_t ldx, int64_t hs, int64_t i0,
                     int64_t i1, float *out, int add) {
    ISA_CALL(rows_sum, sl_kern_isa(), w, ldw, x, ldx, hs, i0, i1, out, add);
}

/* Four rows at once. Each lane's sum over d (dots4) or over i (rows_sum4) is a chain of dependent adds, so
 * one row's 32-long dot with two vectors of keys ran at the adder's latency, not its throughput; four rows
 * that share the loads make eight independent chains (and keep every lane's order: the same bits). */

/* acc[r lacc + j] = sum over d (in order) of a[r la + d] * xt[d][j] for r < 4 and j in [j0, j1], as dots_t;
 * xt is read in runs of 32 from j0 rounded down to 16: readable to 32 past that (transposed()'s tail) */
#define DOTS4_ACC(R)                                                                                         \
    {                                                                                                        \
        const float a_ = a[(R)*la + d];                                                                      \
        s##R##0 += a_ * x0;                                                                                  \
        s##R##1 += a_ * x1;                                                                                  \
    }
#define DOTS4_BODY                                                                                           \
    SL_NO_CONTRACT                                                                                           \
    float tmp[4][32];                                                                                        \
    for (int64_t jb = j0 & ~(int64_t)15; jb <= j1; jb += 32) {                                               \
        sl_vf16 s00 = {0}, s01 = {0}, s10 = {0}, s11 = {0}, s20 = {0}, s21 = {0}, s30 = {0}, s31 = {0};      \
        const float *xp = xt + jb;                                                                           \
        for (int64_t d = 0; d < hs; d++, xp += ldx) {                                                        \
            sl_vf16 x0, x1;                                                                                  \
            VLD(x0, xp);                                                                                     \
            VLD(x1, xp + 16);                                                                                \
            DOTS4_ACC(0) DOTS4_ACC(1) DOTS4_ACC(2) DOTS4_ACC(3)                                              \
        }                                                                                                    \
        int64_t lo = jb > j0 ? jb : j0, hi = j1 < jb + 31 ? j1 : jb + 31;                                    \
        /* a whole run of 32 straight to acc; a partial one through tmp (acc may hold nothing past j1) */    \
        const int whole = lo == jb && hi == jb + 31;                                                         \
        float *d0 = whole ? acc + jb : tmp[0], *d1 = whole ? acc + lacc + jb : tmp[1],                       \
              *d2 = whole ? acc + 2 * lacc + jb : tmp[2], *d3 = whole ? acc + 3 * lacc + jb : tmp[3];        \
        VST(d0, s00);                                                                                        \
        VST(d0 + 16, s01);                                                                                   \
        VST(d1, s10);                                                                                        \
        VST(d1 + 16, s11);                                                                                   \
        VST(d2, s20);                                                                                        \
        VST(d2 + 16, s21);                                                                                   \
        VST(d3, s30);                                                                                        \
        VST(d3 + 16, s31);                                                                                   \
        if (!whole)                                                                                          \
            for (int r = 0; r < 4; r++)                                                                      \
                for (int64_t j = lo; j <= hi; j++) acc[r * lacc + j] = tmp[r][j - jb];                       \
    }
#define DOTS4_FN(NAME, ATTR)                                                                                 \
    SL_NO_CONTRACT_ATTR ATTR static void NAME(const float *a, int64_t la, const float *xt, int64_t ldx,      \
                                              int64_t hs, int64_t j0, int64_t j1, float *acc,                \
                                              int64_t lacc) {                                                \
        DOTS4_BODY                                                                                           \
    }
PER_ISA(DOTS4_FN, dots4)
static void dots4(const float *a, int64_t la, const float *xt, int64_t ldx, int64_t hs, int64_t j0,
                  int64_t j1, float *acc, int64_t lacc) {
    ISA_CALL(dots4, sl_kern_isa(), a, la, xt, ldx, hs, j0, j1, acc, lacc);
}

/* out[r lout + d] (+)= sum over i = lo[r] .. hi[r] (in order) of w[r lwr + i lwi] * x[i ldx + d], for r < 4
 * and d < hs (a multiple of 16), as rows_sum on each row; lo and hi non-decreasing in r and lo[3] <= hi[0]
 * (the caller checks): the rows' own heads (i < lo[3]) and tails (i > hi[0]) alone, the common range with
 * the four rows' sums side by side */
#define RS4_ONE(R, i)                                                                                        \
    {                                                                                                        \
        const float w_ = w[(R)*lwr + (i)*lwi], *xv_ = x + (i)*ldx + c;                                       \
        sl_vf16 x_;                                                                                          \
        VLD(x_, xv_);                                                                                        \
        s##R##0 += w_ * x_;                                                                                  \
        if (nv > 1) {                                                                                        \
            VLD(x_, xv_ + 16);                                                                               \
            s##R##1 += w_ * x_;                                                                              \
        }                                                                                                    \
    }
#define RS4_INIT(R)                                                                                          \
    sl_vf16 s##R##0 = {0}, s##R##1 = {0};                                                                    \
    if (add) {                                                                                               \
        VLD(s##R##0, out + (R)*lout + c);                                                                    \
        if (nv > 1) VLD(s##R##1, out + (R)*lout + c + 16);                                                   \
    }
#define RS4_STORE(R)                                                                                         \
    VST(out + (R)*lout + c, s##R##0);                                                                        \
    if (nv > 1) VST(out + (R)*lout + c + 16, s##R##1);
#define RS4_COMMON(R)                                                                                        \
    {                                                                                                        \
        const float w_ = w[(R)*lwr + i * lwi];                                                               \
        s##R##0 += w_ * x0;                                                                                  \
        if (nv > 1) s##R##1 += w_ * x1;                                                                      \
    }
#define ROWS_SUM4_BODY                                                                                       \
    SL_NO_CONTRACT                                                                                           \
    for (int64_t c = 0; c < hs; c += 32) {                                                                   \
        const int nv = hs - c >= 32 ? 2 : 1;                                                                 \
        RS4_INIT(0);                                                                                         \
        RS4_INIT(1);                                                                                         \
        RS4_INIT(2);                                                                                         \
        RS4_INIT(3);                                                                                         \
        for (int64_t i = lo[0]; i < lo[3]; i++) {                                                            \
            RS4_ONE(0, i);                                                                                   \
        }                                                                                                    \
        for (int64_t i = lo[1]; i < lo[3]; i++) {                                                            \
            RS4_ONE(1, i);                                                                                   \
        }                                                                                                    \
        for (int64_t i = lo[2]; i < lo[3]; i++) {                                                            \
            RS4_ONE(2, i);                                                                                   \
        }                                                                                                    \
        for (int64_t i = lo[3]; i <= hi[0]; i++) {                                                           \
            sl_vf16 x0, x1 = {0};                                                                            \
            VLD(x0, x + i * ldx + c);                                                                        \
            if (nv > 1) VLD(x1, x + i * ldx + c + 16);                                                       \
            RS4_COMMON(0);                                                                                   \
            RS4_COMMON(1);                                                                                   \
            RS4_COMMON(2);                                                                                   \
            RS4_COMMON(3);                                                                                   \
        }                                                                                                    \
        for (int64_t i = hi[0] + 1; i <= hi[1]; i++) {                                                       \
            RS4_ONE(1, i);                                                                                   \
        }                                                                                                    \
        for (int64_t i = hi[0] + 1; i <= hi[2]; i++) {                                                       \
            RS4_ONE(2, i);                                                                                   \
        }                                                                                                    \
        for (int64_t i = hi[0] + 1; i <= hi[3]; i++) {                                                       \
            RS4_ONE(3, i);                                                                                   \
        }                                                                                                    \
        RS4_STORE(0);                                                                                        \
        RS4_STORE(1);                                                                                        \
        RS4_STORE(2);                                                                                        \
        RS4_STORE(3);                                                                                        \
    }
#define ROWS_SUM4_FN(NAME, ATTR)                                                                             \
    SL_NO_CONTRACT_ATTR ATTR static void NAME(const float *w, int64_t lwr, int64_t lwi, const float *x,      \
                                              int64_t ldx, int64_t hs, const int64_t lo[4],                  \
                                              const int64_t hi[4], float *out, int64_t lout, int add) {      \
        ROWS_SUM4_BODY                                                                                       \
    }
PER_ISA(ROWS_SUM4_FN, rows_sum4)
static void rows_sum4(const float *w, int64_t lwr, int64_t lwi, const float *x, int64_t ldx, int64_t hs,
                      const int64_t lo[4], const int64_t hi[4], float *out, int64_t lout, int add) {
    ISA_CALL(rows_sum4, sl_kern_isa(), w, lwr, lwi, x, ldx, hs, lo, hi, out, lout, add);
}

/* The dropout multipliers of the half kernels: this ISA's vector Philox (bitwise sl_rng_dropout, the
 * reference kernels' generator; tests/ops/test_kernels_simd.c test_dropout_mask) or sl_rng_dropout itself.
 * The scalar generator took 8.7 % of the baby model's bf16 step (dropout 0.2). */
typedef void (*drop_mask_fn)(uint64_t seed, uint64_t hi, uint64_t e0, int64_t n, float p, float *out);
static drop_mask_fn drop_mask(void) {
    const sl_vec_ops *v = sl_vec();
    return v ? v->dropout_mask : sl_rng_dropout;
}

/* y[j] = e^(x[j] - m) for j in j0 .. j1 (y may be x): sl_exp_acc's bits in every ISA (its vector twins give
 * them for every float: checked exhaustively, and on a sample in tests/ops/test_kernels_simd.c). libm's
 * expf, called per element, was ~20 % of the half attention. */
typedef void (*exp_row_fn)(const float *x, float m, float *y, int64_t j0, int64_t j1);
static void exp_row_base(const float *x, float m, float *y, int64_t j0, int64_t j1) {
    for (int64_t j = j0; j <= j1; j++) y[j] = sl_exp_acc(x[j] - m);
}
#if SL_HAVE_X86
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) static void
exp_row_avx512(const float *x, float m, float *y, int64_t j0, int64_t j1) {
    const __m512 vm = _mm512_set1_ps(m);
    for (int64_t j = j0; j <= j1; j += 16) {
        const int64_t left = j1 - j + 1;
        const __mmask16 k = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        _mm512_mask_storeu_ps(y + j, k,
                              sl_exp_acc_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm)));
    }
}
__attribute__((target("avx2,fma"))) static void exp_row_avx2(const float *x, float m, float *y, int64_t j0,
                                                             int64_t j1) {
    const __m256 vm = _mm256_set1_ps(m);
    int64_t j = j0;
    for (; j + 7 <= j1; j += 8)
        _mm256_storeu_ps(y + j, sl_exp_acc_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm)));
    for (; j <= j1; j++) y[j] = sl_exp_acc(x[j] - m);
}
#endif
static exp_row_fn exp_row(int isa) {
#if SL_HAVE_X86
    if (isa >= SL_KISA_AVX512) return exp_row_avx512;
    if (isa >= SL_KISA_AVX2) return exp_row_avx2;
#endif
    (void)isa;
    return exp_row_base;
}

/* Query rows (b, h, t0 .. t0 + 3) of sl_k_attention_half (fewer at the end of T), built per ISA (PER_ISA):
 * the scores of four rows at once (dots4) and their outputs (rows_sum4) where hs is a multiple of 16, row by
 * row otherwise; the max over a row is taken after the scores are rounded (the same comparisons in the same
 * order). */
typedef struct half_fwd_ctx {
    drop_mask_fn mask;
    exp_row_fn ex;
    sl_bits_pack_fn pack; /* Note [Attention dropout bits]: the mask stored (NULL: not) */
    uint16_t *mbits;
    int64_t mrw;
    const float *pq, *pv, *kt;
    float *out, *lse;
    const sl_tensor *n, *q, *v;
    int64_t T, NH, hs, NKV, grp, win;
    float scale, dp;
    uint64_t dseed, dhi;
    int hm;
} half_fwd_ctx;
enum { HF_ROWS = 4 }; /* query rows per block of the forward */

/* row t's probabilities p[j0 .. t] from its scores, its logsumexp, and its dropout multipliers mk */
#define HALF_FWD_SOFTMAX(p, mk, t, j0)                                                                       \
    {                                                                                                        \
        float mx = -INFINITY;                                                                                \
        if (hm == 1 || hm == 4) /* bf16: the branch-free rounding vectorizes */                              \
            _Pragma("omp simd") for (int64_t j = j0; j <= t; j++) p[j] =                                     \
                sl_round_bf16_f32(sl_round_bf16_f32(p[j]) * scale);                                          \
        else                                                                                                 \
            for (int64_t j = j0; j <= t; j++)                                                                \
                p[j] = hm ? hround(hround(p[j], hm) * scale, hm) : p[j] * scale;                             \
        for (int64_t j = j0; j <= t; j++)                                                                    \
            if (p[j] > mx) mx = p[j];                                                                        \
        float sum = 0; /* the exps (vector), then the sum (in a register) */                                 \
        ex(p, mx, p, j0, t);                                                                                 \
        for (int64_t j = j0; j <= t; j++) sum += p[j];                                                       \
        float inv = 1.0f / sum;                                                                              \
        if (hm == 1 || hm == 4)                                                                              \
            _Pragma("omp simd") for (int64_t j = j0; j <= t; j++) p[j] = sl_round_bf16_f32(p[j] * inv);      \
        else                                                                                                 \
            for (int64_t j = j0; j <= t; j++) p[j] = hround(p[j] * inv, hm);                                 \
        lse[(b * NH + h) * T + t] = mx + logf(sum);                                                          \
        if (dp > 0) {                                                                                        \
            mask(dseed, dhi, (uint64_t)((drop_plane(n, b, h, NH) * T + t) * T), t + 1, dp, mk);              \
            if (x->mbits) x->pack(mk, t + 1, x->mbits + ((b * NH + h) * T + t) * x->mrw);                    \
            for (int64_t j = j0; j <= t; j++) mk[j] *= p[j]; /* the weights: the mask applied first */       \
        }                                                                                                    \
    }
/* row t's output rounded, from its weights w[j0 .. t] (p, or the masked p) */
#define HALF_FWD_OUT(w, t, j0)                                                                               \
    {                                                                                                        \
        float *o = out + (b * T + t) * NH * hs + h * hs;                                                     \
        const float *w_ = (w);                                                                               \
        if (hs % 16 == 0) /* in registers (rows_sum) */                                                      \
            rows_sum(w_, 1, vb, v->nb[1], hs, j0, t, o, 0);                                                  \
        else {                                                                                               \
            for (int64_t d = 0; d < hs; d++) o[d] = 0;                                                       \
            for (int64_t j = j0; j <= t; j++) {                                                              \
                const float *vr = vb + j * v->nb[1], pj = w_[j];                                             \
                _Pragma("omp simd") for (int64_t d = 0; d < hs; d++) o[d] += pj * vr[d];                     \
            }                                                                                                \
        }                                                                                                    \
    }
#define HALF_FWD_ROUND_OUT(t)                                                                                \
    {                                                                                                        \
        float *o = out + (b * T + t) * NH * hs + h * hs;                                                     \
        if (hm == 1 || hm == 4)                                                                              \
            _Pragma("omp simd") for (int64_t d = 0; d < hs; d++) o[d] = sl_round_bf16_f32(o[d]);             \
        else                                                                                                 \
            for (int64_t d = 0; d < hs; d++) o[d] = hround(o[d], hm);                                        \
    }
#define HALF_FWD_BLOCK_BODY                                                                                  \
    const int64_t nTb = (T + HF_ROWS - 1) / HF_ROWS, Tp = tpad(T);                                           \
    int64_t t0 = (blk % nTb) * HF_ROWS, h = (blk / nTb) % NH, b = blk / (nTb * NH), kh = h / grp;            \
    int64_t nr = T - t0 < HF_ROWS ? T - t0 : HF_ROWS, j0[HF_ROWS], tt[HF_ROWS];                              \
    for (int64_t r = 0; r < nr; r++) {                                                                       \
        tt[r] = t0 + r;                                                                                      \
        j0[r] = win > 0 && tt[r] - win + 1 > 0 ? tt[r] - win + 1 : 0;                                        \
    }                                                                                                        \
    const float *qr = pq + b * q->nb[0] + t0 * q->nb[1] + h * q->nb[2];                                      \
    const float *ktb = kt + (b * NKV + kh) * hs * Tp;                                                        \
    const float *vb = pv + b * v->nb[0] + kh * v->nb[2];                                                     \
    /* per row r: probabilities at rows + 2 r Tp, weights (p times the mask) Tp after them */                \
    const int four = nr == HF_ROWS && hs % 16 == 0;                                                          \
    if (four) dots4(qr, q->nb[1], ktb, Tp, hs, j0[0], tt[HF_ROWS - 1], rows, 2 * Tp);                        \
    for (int64_t r = 0; r < nr; r++) {                                                                       \
        float *p = rows + 2 * r * Tp, *mk = p + Tp;                                                          \
        if (!four) dots_t(qr + r * q->nb[1], ktb, Tp, hs, j0[r], tt[r], p);                                  \
        HALF_FWD_SOFTMAX(p, mk, tt[r], j0[r])                                                                \
    }                                                                                                        \
    const int64_t wo = dp > 0 ? Tp : 0; /* the weights: p, or the masked p */                                \
    if (four && j0[HF_ROWS - 1] <= tt[0])                                                                    \
        rows_sum4(rows + wo, 2 * Tp, 1, vb, v->nb[1], hs, j0, tt, out + (b * T + t0) * NH * hs + h * hs,     \
                  NH * hs, 0);                                                                               \
    else                                                                                                     \
        for (int64_t r = 0; r < nr; r++) HALF_FWD_OUT(rows + 2 * r * Tp + wo, tt[r], j0[r])                  \
    for (int64_t r = 0; r < nr; r++) HALF_FWD_ROUND_OUT(tt[r])

#define HALF_FWD_BLOCK_FN(NAME, ATTR)                                                                        \
    SL_NO_CONTRACT_ATTR ATTR static void NAME(const half_fwd_ctx *x, int64_t blk, float *rows) {             \
        SL_NO_CONTRACT                                                                                       \
        const drop_mask_fn mask = x->mask;                                                                   \
        const exp_row_fn ex = x->ex;                                                                         \
        const float *pq = x->pq, *pv = x->pv, *kt = x->kt;                                                   \
        float *out = x->out, *lse = x->lse;                                                                  \
        const sl_tensor *n = x->n, *q = x->q, *v = x->v;                                                     \
        const int64_t T = x->T, NH = x->NH, hs = x->hs, NKV = x->NKV, grp = x->grp, win = x->win;            \
        const float scale = x->scale, dp = x->dp;                                                            \
        const uint64_t dseed = x->dseed, dhi = x->dhi;                                                       \
        const int hm = x->hm;                                                                                \
        HALF_FWD_BLOCK_BODY                                                                                  \
    }
PER_ISA(HALF_FWD_BLOCK_FN, half_fwd_block)

SL_NO_CONTRACT_ATTR sl_status sl_k_attention_half(sl_tensor *n) {
    SL_NO_CONTRACT
    sl_tensor *q = n->src[0], *k = n->src[1], *v = n->src[2];
    int hm = n->iparams[2];
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
    int64_t grp = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
    const float *pq = q->data, *pv = v->data;
    float *out = n->data;
    float *lse = (float *)((char *)n->data + sl_nbytes(n));
    int64_t win = n->iparams[1];
    uint64_t dseed = 0, dhi = 0;
    float dp = sl_dropout_params(n, &dseed, &dhi);
    /* a block's probabilities and weights (2 Tp floats per row) per thread: the blocks are independent */
    const int nt = omp_get_max_threads();
    const size_t rstride = 2 * HF_ROWS * (size_t)tpad(T ? T : 1) + 16; /* threads' rows on separate lines */
    float *rows = malloc(sizeof(float) * rstride * (size_t)nt);
    float *kt = transposed(k, hm, p32(hm));
    if (!rows || !kt) {
        free(rows);
        free(kt);
        return sl_fail(SL_ERR_NOMEM, "attention: out of memory");
    }
    int isa = sl_kern_isa();
    const drop_bits db = drop_bits_of(n);
    drop_bits_set(&db, dseed, dhi, dp, T, 0);
    half_fwd_ctx x = {.mask = drop_mask(),
                      .ex = exp_row(isa),
                      .pack = sl_k_bits_pack(isa),
                      .mbits = dp > 0 ? db.bits : NULL,
                      .mrw = db.rw,
                      .pq = pq,
                      .pv = pv,
                      .kt = kt,
                      .out = out,
                      .lse = lse,
                      .n = n,
                      .q = q,
                      .v = v,
                      .T = T,
                      .NH = NH,
                      .hs = hs,
                      .NKV = NKV,
                      .grp = grp,
                      .win = win,
                      .scale = scale,
                      .dp = dp,
                      .dseed = dseed,
                      .dhi = dhi,
                      .hm = hm};
#pragma omp parallel num_threads(nt)
    {
        float *mine = rows + rstride * (size_t)omp_get_thread_num();
        const int64_t nblk = B * NH * ((T + HF_ROWS - 1) / HF_ROWS);
#pragma omp for schedule(dynamic, 1)
        for (int64_t blk = 0; blk < nblk; blk++) ISA_CALL(half_fwd_block, isa, &x, blk, mine);
    }
    free(rows);
    free(kt);
    if (dp > 0) drop_bits_set(&db, dseed, dhi, dp, T, 1);
    return SL_OK;
}

/* One (batch, kv head) plane of sl_k_attention_half_back, built per ISA (PER_ISA: the same per-lane
 * operations in the same order; contraction off): the dq / dk / dv updates and
 * the rounding of dq and of the group's dk / dv sums run in vector lanes (sl_round_bf16_f32 is branch-free;
 * the f16 modes stay scalar). GPT-2 124M bf16, B4 T64, 2 threads: 3.9 -> 2.8-3.0 ms per call, the forward
 * rows 1.7 -> 1.4 ms (docs/BENCHMARKS.md). */
typedef struct half_back_ctx {
    drop_mask_fn mask;
    exp_row_fn ex;
    sl_bits_unpack_fn unpack; /* Note [Attention dropout bits]: the forward's mask read back (NULL: drawn) */
    const uint16_t *mbits;
    int64_t mrw;
    float keep;
    const float *pq, *pk, *pg, *lse, *kt, *vt;
    float *out;
    const sl_tensor *f, *q, *k;
    int64_t B, T, NH, hs, NKV, grp, W, win, gb, gt;
    float scale, dpr;
    uint64_t dseed, dhi;
    int hm;
} half_back_ctx;

enum { HB_ROWS = 16 }; /* query rows per block of the dk / dv sums (a multiple of HF_ROWS) */
/* row t (index r of its group of HF_ROWS): its probabilities, dS and P rows into the block's DS / PJ, from
 * its scores ss and dO . v sums sd (j0 .. t) */
#define HALF_BACK_ROW(r, t, j0)                                                                              \
    {                                                                                                        \
        float *p = P4 + (r)*Tp, *dp = DP4 + (r)*Tp, *mk = MK4 + (r)*Tp, *ss = SS4 + (r)*Tp,                  \
              *sd = SD4 + (r)*Tp;                                                                            \
        float *dsr = DS + ((t)-t0) * T, *pjr = PJ + ((t)-t0) * T;                                            \
        float l = lse[(b * NH + h) * T + (t)], dot = 0;                                                      \
        if (dpr > 0 && x->mbits)                                                                             \
            x->unpack(x->mbits + ((b * NH + h) * T + (t)) * x->mrw, (t) + 1, x->keep, mk);                   \
        else if (dpr > 0)                                                                                    \
            mask(dseed, dhi, (uint64_t)((drop_plane(f, b, h, NH) * T + (t)) * T), (t) + 1, dpr, mk);         \
        /* the reference's per-j statements split into loops: the roundings in vector lanes (bf16), the exps \
         * (vector), and the sum of P dP (dot stays in a register) */                                        \
        if (hm == 1 || hm == 4) _Pragma("omp simd") for (int64_t j = j0; j <= (t); j++) {                    \
                ss[j] = sl_round_bf16_f32(sl_round_bf16_f32(ss[j]) * scale);                                 \
                dp[j] = sl_round_bf16_f32(sd[j]);                                                            \
            }                                                                                                \
        else                                                                                                 \
            for (int64_t j = j0; j <= (t); j++) {                                                            \
                ss[j] = hround(hround(ss[j], hm) * scale, hm);                                               \
                dp[j] = hround(sd[j], hm);                                                                   \
            }                                                                                                \
        if (dpr > 0)                                                                                         \
            for (int64_t j = j0; j <= (t); j++) dp[j] *= mk[j];                                              \
        ex(ss, l, p, j0, (t));                                                                               \
        if (hm == 1)                                                                                         \
            _Pragma("omp simd") for (int64_t j = j0; j <= (t); j++) p[j] = sl_round_bf16_f32(p[j]);          \
        else if (!p32(hm))                                                                                   \
            for (int64_t j = j0; j <= (t); j++) p[j] = hround(p[j], hm);                                     \
        for (int64_t j = j0; j <= (t); j++) dot += p[j] * dp[j];                                             \
        /* the row's dS and dv weights, kept for the block's dk / dv sums below */                           \
        if (hm == 1 || hm == 4) {                                                                            \
            _Pragma("omp simd") for (int64_t j = j0; j <= (t); j++) dsr[j] =                                 \
                sl_round_bf16_f32(sl_round_bf16_f32(p[j] * (dp[j] - dot)) * scale);                          \
            if (hm == 4)                                                                                     \
                _Pragma("omp simd") for (int64_t j = j0; j <= (t); j++) pjr[j] = sl_round_bf16_f32(p[j]);    \
            else                                                                                             \
                memcpy(pjr + j0, p + j0, sizeof(float) * (size_t)((t)-j0 + 1));                              \
        } else                                                                                               \
            for (int64_t j = j0; j <= (t); j++) {                                                            \
                dsr[j] = hround(hround(p[j] * (dp[j] - dot), hm) * scale, hm);                               \
                pjr[j] = p32(hm) ? hround(p[j], hm) : p[j];                                                  \
            }                                                                                                \
        if (dpr > 0)                                                                                         \
            for (int64_t j = j0; j <= (t); j++) pjr[j] *= mk[j];                                             \
    }
/* row t's dq from its dS row, rounded */
#define HALF_BACK_DQ(t, j0)                                                                                  \
    {                                                                                                        \
        float *dq = out + (b * T + (t)) * W * hs + h * hs;                                                   \
        const float *dsr = DS + ((t)-t0) * T;                                                                \
        if (hs % 16 == 0)                                                                                    \
            rows_sum(dsr, 1, kr, hs, hs, j0, (t), dq, 0);                                                    \
        else {                                                                                               \
            for (int64_t d = 0; d < hs; d++) dq[d] = 0;                                                      \
            for (int64_t j = j0; j <= (t); j++) {                                                            \
                const float ds = dsr[j], *krj = kr + j * hs;                                                 \
                _Pragma("omp simd") for (int64_t d = 0; d < hs; d++) dq[d] += ds * krj[d];                   \
            }                                                                                                \
        }                                                                                                    \
    }
#define HALF_BACK_ROUND_DQ(t)                                                                                \
    {                                                                                                        \
        float *dq = out + (b * T + (t)) * W * hs + h * hs;                                                   \
        if (hm == 1 || hm == 4) /* bf16: the branch-free rounding vectorizes */                              \
            _Pragma("omp simd") for (int64_t d = 0; d < hs; d++) dq[d] = sl_round_bf16_f32(dq[d]);           \
        else                                                                                                 \
            for (int64_t d = 0; d < hs; d++) dq[d] = hround(dq[d], hm);                                      \
    }
/* the window's first key of query row t */
#define HB_J0(t) (win > 0 && (t)-win + 1 > 0 ? (t)-win + 1 : 0)
#define HALF_BACK_PLANE_BODY                                                                                 \
    int64_t b = bk / NKV, kh = bk % NKV;                                                                     \
    const int64_t Tp = tpad(T);                                                                              \
    float *P4 = buf, *DP4 = P4 + HF_ROWS * Tp, *MK4 = DP4 + HF_ROWS * Tp, *SS4 = MK4 + HF_ROWS * Tp,         \
          *SD4 = SS4 + HF_ROWS * Tp, *hk = SD4 + HF_ROWS * Tp, *hv = hk + T * hs, *kr = hv + T * hs,         \
          *DS = kr + T * hs, *PJ = DS + HB_ROWS * T;                                                         \
    const float *ktb = kt + bk * hs * Tp, *vtb = vt + bk * hs * Tp;                                          \
    for (int64_t j = 0; j < T; j++) { /* the keys by rows (rounded as kt is: transposed()) */                \
        const float *kj = pk + b * k->nb[0] + j * k->nb[1] + kh * k->nb[2];                                  \
        if (p32(hm))                                                                                         \
            for (int64_t d = 0; d < hs; d++) kr[j * hs + d] = hround(kj[d], hm);                             \
        else                                                                                                 \
            memcpy(kr + j * hs, kj, sizeof(float) * (size_t)hs);                                             \
        memset(out + (b * T + j) * W * hs + (NH + kh) * hs, 0, sizeof(float) * (size_t)hs);                  \
        memset(out + (b * T + j) * W * hs + (NH + NKV + kh) * hs, 0, sizeof(float) * (size_t)hs);            \
    }                                                                                                        \
    for (int64_t h = kh * grp; h < (kh + 1) * grp; h++) {                                                    \
        memset(hk, 0, sizeof(float) * 2 * (size_t)(T * hs));                                                 \
        const float *qh = pq + b * q->nb[0] + h * q->nb[2], *gh = pg + b * gb + h * hs;                      \
        for (int64_t t0 = 0; t0 < T; t0 += HB_ROWS) {                                                        \
            int64_t t1 = t0 + HB_ROWS < T ? t0 + HB_ROWS : T;                                                \
            for (int64_t g0 = t0; g0 < t1; g0 += HF_ROWS) { /* groups of HF_ROWS query rows */               \
                const int64_t nr = t1 - g0 < HF_ROWS ? t1 - g0 : HF_ROWS;                                    \
                const int four = nr == HF_ROWS && hs % 16 == 0;                                              \
                int64_t j0[HF_ROWS], tt[HF_ROWS];                                                            \
                for (int64_t r = 0; r < nr; r++) {                                                           \
                    tt[r] = g0 + r;                                                                          \
                    j0[r] = HB_J0(tt[r]);                                                                    \
                }                                                                                            \
                if (four) {                                                                                  \
                    dots4(qh + g0 * q->nb[1], q->nb[1], ktb, Tp, hs, j0[0], tt[HF_ROWS - 1], SS4, Tp);       \
                    dots4(gh + g0 * gt, gt, vtb, Tp, hs, j0[0], tt[HF_ROWS - 1], SD4, Tp);                   \
                }                                                                                            \
                for (int64_t r = 0; r < nr; r++) {                                                           \
                    if (!four) {                                                                             \
                        dots_t(qh + tt[r] * q->nb[1], ktb, Tp, hs, j0[r], tt[r], SS4 + r * Tp);              \
                        dots_t(gh + tt[r] * gt, vtb, Tp, hs, j0[r], tt[r], SD4 + r * Tp);                    \
                    }                                                                                        \
                    HALF_BACK_ROW(r, tt[r], j0[r])                                                           \
                }                                                                                            \
                if (four && j0[HF_ROWS - 1] <= tt[0])                                                        \
                    rows_sum4(DS + (g0 - t0) * T, T, 1, kr, hs, hs, j0, tt,                                  \
                              out + (b * T + g0) * W * hs + h * hs, W * hs, 0);                              \
                else                                                                                         \
                    for (int64_t r = 0; r < nr; r++) HALF_BACK_DQ(tt[r], j0[r])                              \
                for (int64_t r = 0; r < nr; r++) HALF_BACK_ROUND_DQ(tt[r])                                   \
            }                                                                                                \
            /* dk[j] += dS[t][j] q_t and dv[j] += P[t][j] dO_t over the block's rows t in order (each        \
             * element of dk / dv is summed over t ascending, block after block, as in the reference); four  \
             * keys at once where hs allows it */                                                            \
            int64_t jlo = win > 0 && t0 - win + 1 > 0 ? t0 - win + 1 : 0;                                    \
            for (int64_t j = jlo; j < t1;) {                                                                 \
                int64_t ta[HF_ROWS], tb[HF_ROWS];                                                            \
                for (int r = 0; r < HF_ROWS; r++) {                                                          \
                    ta[r] = (j + r > t0 ? j + r : t0) - t0;                                                  \
                    tb[r] = (win > 0 && j + r + win - 1 < t1 - 1 ? j + r + win - 1 : t1 - 1) - t0;           \
                }                                                                                            \
                if (hs % 16 == 0 && j + HF_ROWS <= t1 && ta[HF_ROWS - 1] <= tb[0]) {                         \
                    rows_sum4(DS + j, 1, T, qh + t0 * q->nb[1], q->nb[1], hs, ta, tb, hk + j * hs, hs, 1);   \
                    rows_sum4(PJ + j, 1, T, gh + t0 * gt, gt, hs, ta, tb, hv + j * hs, hs, 1);               \
                    j += HF_ROWS;                                                                            \
                    continue;                                                                                \
                }                                                                                            \
                if (ta[0] <= tb[0]) {                                                                        \
                    float *dk = hk + j * hs, *dv = hv + j * hs;                                              \
                    if (hs % 16 == 0) {                                                                      \
                        rows_sum(DS + j, T, qh + t0 * q->nb[1], q->nb[1], hs, ta[0], tb[0], dk, 1);          \
                        rows_sum(PJ + j, T, gh + t0 * gt, gt, hs, ta[0], tb[0], dv, 1);                      \
                    } else                                                                                   \
                        for (int64_t t = ta[0] + t0; t <= tb[0] + t0; t++) {                                 \
                            const float ds = DS[(t - t0) * T + j], pj = PJ[(t - t0) * T + j];                \
                            const float *qr = qh + t * q->nb[1], *go = gh + t * gt;                          \
                            _Pragma("omp simd") for (int64_t d = 0; d < hs; d++) {                           \
                                dk[d] += ds * qr[d];                                                         \
                                dv[d] += pj * go[d];                                                         \
                            }                                                                                \
                        }                                                                                    \
                }                                                                                            \
                j++;                                                                                         \
            }                                                                                                \
        }                                                                                                    \
        for (int64_t j = 0; j < T; j++) {                                                                    \
            float *dk = out + (b * T + j) * W * hs + (NH + kh) * hs, *dv = dk + NKV * hs;                    \
            const float *hkj = hk + j * hs, *hvj = hv + j * hs;                                              \
            if (hm == 1) _Pragma("omp simd") for (int64_t d = 0; d < hs; d++) {                              \
                    dk[d] = sl_round_bf16_f32(dk[d] + sl_round_bf16_f32(hkj[d]));                            \
                    dv[d] = sl_round_bf16_f32(dv[d] + sl_round_bf16_f32(hvj[d]));                            \
                }                                                                                            \
            else if (hm == 4)                                                                                \
                _Pragma("omp simd") for (int64_t d = 0; d < hs; d++) {                                       \
                    dk[d] = dk[d] + sl_round_bf16_f32(hkj[d]);                                               \
                    dv[d] = sl_round_bf16_f32(dv[d] + sl_round_bf16_f32(hvj[d]));                            \
                }                                                                                            \
            else                                                                                             \
                for (int64_t d = 0; d < hs; d++) {                                                           \
                    dk[d] = p32(hm) ? dk[d] + hround(hkj[d], hm) : hround(dk[d] + hround(hkj[d], hm), hm);   \
                    dv[d] = hround(dv[d] + hround(hvj[d], hm), hm);                                          \
                }                                                                                            \
        }                                                                                                    \
    }

#define HALF_BACK_PLANE_FN(NAME, ATTR)                                                                       \
    SL_NO_CONTRACT_ATTR ATTR static void NAME(const half_back_ctx *x, int64_t bk, float *buf) {              \
        SL_NO_CONTRACT                                                                                       \
        const drop_mask_fn mask = x->mask;                                                                   \
        const exp_row_fn ex = x->ex;                                                                         \
        const float *pq = x->pq, *pk = x->pk, *pg = x->pg, *lse = x->lse, *kt = x->kt, *vt = x->vt;          \
        float *out = x->out;                                                                                 \
        const sl_tensor *f = x->f, *q = x->q, *k = x->k;                                                     \
        const int64_t T = x->T, NH = x->NH, hs = x->hs, NKV = x->NKV, grp = x->grp, W = x->W, win = x->win;  \
        const int64_t gb = x->gb, gt = x->gt;                                                                \
        const float scale = x->scale, dpr = x->dpr;                                                          \
        const uint64_t dseed = x->dseed, dhi = x->dhi;                                                       \
        const int hm = x->hm;                                                                                \
        HALF_BACK_PLANE_BODY                                                                                 \
    }
PER_ISA(HALF_BACK_PLANE_FN, half_back_plane)

SL_NO_CONTRACT_ATTR sl_status sl_k_attention_half_back(sl_tensor *n) {
    SL_NO_CONTRACT
    sl_tensor *f = n->src[0], *q = n->src[1], *k = n->src[2], *v = n->src[3], *g = n->src[4];
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
    int64_t grp = NH / NKV, W = NH + 2 * NKV, win = n->iparams[1];
    float scale = 1.0f / sqrtf((float)hs);
    int hm = f->iparams[2];
    const float *lse = (const float *)((const char *)f->data + sl_nbytes(f));
    const float *pq = q->data, *pg = g->data;
    float *out = n->data;
    int64_t gb = g->nb[0], gt = g->nb[1];
    uint64_t dseed = 0, dhi = 0;
    float dpr = sl_dropout_params(f, &dseed, &dhi);
    /* per thread, for the (b, kv head) plane it works on: p, dp, mask, the scores, dO . v (Tp each for each
     * of a group's HF_ROWS rows), one query head's h(dk) | h(dv) (2 T hs), the keys as the products read them
     * (T hs, rounded in modes 3/4), and a block's dS and P (2 HB_ROWS T); 16 floats apart so that threads do
     * not share a cache line */
    const int nt = omp_get_max_threads();
    size_t per = 5 * HF_ROWS * (size_t)tpad(T ? T : 1) + 3 * (size_t)T * (size_t)hs +
                 2 * (size_t)HB_ROWS * (size_t)T + 16;
    float *buf = malloc(sizeof(float) * per * (size_t)nt);
    float *kt = transposed(k, hm, p32(hm)), *vt = transposed(v, hm, 0);
    if (!buf || !kt || !vt) {
        free(buf);
        free(kt);
        free(vt);
        return sl_fail(SL_ERR_NOMEM, "attention_back: out of memory");
    }
    int isa = sl_kern_isa();
    const drop_bits db = drop_bits_of(f);
    half_back_ctx x = {.mask = drop_mask(),
                       .ex = exp_row(isa),
                       .unpack = sl_k_bits_unpack(isa),
                       .mbits = dpr > 0 && drop_bits_valid(&db, dseed, dhi, dpr, T) ? db.bits : NULL,
                       .mrw = db.rw,
                       .keep = (float)(1.0 / (1.0 - (double)dpr)), /* the drawing's multiplier (rng.c) */
                       .pq = pq,
                       .pk = k->data,
                       .k = k,
                       .pg = pg,
                       .lse = lse,
                       .kt = kt,
                       .vt = vt,
                       .out = out,
                       .f = f,
                       .q = q,
                       .B = B,
                       .T = T,
                       .NH = NH,
                       .hs = hs,
                       .NKV = NKV,
                       .grp = grp,
                       .W = W,
                       .win = win,
                       .gb = gb,
                       .gt = gt,
                       .scale = scale,
                       .dpr = dpr,
                       .dseed = dseed,
                       .dhi = dhi,
                       .hm = hm};
#pragma omp parallel num_threads(nt)
    {
        float *mine = buf + per * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (int64_t bk = 0; bk < B * NKV; bk++) ISA_CALL(half_back_plane, isa, &x, bk, mine);
    }
    free(buf);
    free(kt);
    free(vt);
    return SL_OK;
}

static sl_attn_args attn_args(sl_tensor *q, sl_tensor *k, sl_tensor *v, int64_t win) {
    sl_attn_args a = {.B = q->ne[0], .T = q->ne[1], .NH = q->ne[2], .NKV = k->ne[2], .hs = q->ne[3]};
    a.q = q->data;
    a.k = k->data;
    a.v = v->data;
    for (int d = 0; d < 3; d++) {
        a.qs[d] = q->nb[d];
        a.ks[d] = k->nb[d];
        a.vs[d] = v->nb[d];
    }
    a.scale = 1.0f / sqrtf((float)a.hs);
    a.win = win;
    return a;
}

static void attn_dropout_args(sl_attn_args *a, const sl_tensor *fwd) {
    a->drop_p = sl_dropout_params(fwd, &a->drop_seed, &a->drop_hi);
    a->drop_heads = fwd->iparams[SL_DROPOUT_IP_HEADS] > 0 ? fwd->iparams[SL_DROPOUT_IP_HEADS] : a->NH;
    a->drop_h0 = fwd->iparams[SL_DROPOUT_IP_HEAD0];
}

sl_status sl_k_attention(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    if (n->iparams[2]) return sl_k_attention_half(n); /* Note [Eager half attention, vectorized] */
    if (!v || n->src[0]->ne[3] > SL_ATTN_MAX_HS) return sl_k_attention_ref(n);
    sl_attn_args a = attn_args(n->src[0], n->src[1], n->src[2], n->iparams[1]);
    attn_dropout_args(&a, n);
    a.out = n->data;
    a.lse = (float *)((char *)n->data + sl_nbytes(n));
    const drop_bits db = drop_bits_of(n); /* this kernel stores no mask: the header names none */
    drop_bits_set(&db, 0, 0, 0.0f, 0, 0);
    v->attn_fwd(&a);
    return SL_OK;
}

sl_status sl_k_attention_back(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    sl_tensor *f = n->src[0], *g = n->src[4];
    if (f->iparams[2]) return sl_k_attention_half_back(n);
    if (!v || n->src[1]->ne[3] > SL_ATTN_MAX_HS || g->nb[g->ndim - 1] != 1) return sl_k_attention_back_ref(n);
    sl_attn_args a = attn_args(n->src[1], n->src[2], n->src[3], n->iparams[1]);
    attn_dropout_args(&a, f);
    a.out = f->data;
    a.lse = (float *)((char *)f->data + sl_nbytes(f));
    a.dy = g->data;
    a.dys[0] = g->nb[0];
    a.dys[1] = g->nb[1];
    a.dqkv = n->data;
    v->attn_bwd(&a);
    return SL_OK;
}
