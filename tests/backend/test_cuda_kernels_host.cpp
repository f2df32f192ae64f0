/* The CUDA backend's kernel bodies run on the host (scripts/cuda_kernels_on_host.sh prepares them: launchers
 * removed, CU_LOOP a sequential loop, shims for the intrinsics) and checked against the CPU's definitions:
 * Philox-4x32-10 (sl_philox4x32), f16 / bf16 conversions (sl_f32_to_f16, sl_f16_to_f32, sl_f32_to_bf16),
 * DROPOUT (sl_rng_dropout's masks, flat and on a sequence shard, with and without the residual), the f32
 * attention forward and backward with dropout and TP head offsets (the reference's formulas, masks from
 * sl_rng_dropout), and the eager half attention's parallel backward (attention_half.cuh) against the serial
 * port of src/device/opencl/kernels/attention_half.cl below, bit for bit. No GPU needed; it says nothing
 * about launches, memory or nvcc's code generation. */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "device/cuda/cuda_kernels.h"
#include "suanli/base.h" /* sl_philox4x32, sl_rng_dropout, the f16 / bf16 conversions */
#undef __device__
#undef __forceinline__
#undef __global__
#define __device__
#define __forceinline__ inline
#define __global__ static
#define CU_LOOP(i, n) for (int64_t i = 0; i < (n); i++)
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }
using std::exp;
using std::log;
#include "common_host.h"
#include "dropout.inc"
#include "attention.inc"
#include "attention_half.inc"
/* the serial reference: k_attention_half_back as first ported from attention_half.cl (one thread per
 * (b, kv head)) */
__global__ void serial_back(float *out, const float *lse, const float *q, cu_v5 qs, const float *k, cu_v5 ks,
                            const float *v, cu_v5 vs, const float *g, cu_v5 gs, int64_t B, int64_t T,
                            int64_t NH, int64_t NKV, int64_t hs, int64_t win, float scale, int hm, cu_drop dr,
                            float *S) {
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

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}
static int fails = 0;
static long long checks = 0;
#define CHECK(c, ...)                                                                                        \
    do {                                                                                                     \
        checks++;                                                                                            \
        if (!(c)) {                                                                                          \
            fails++;                                                                                         \
            printf("FAIL: " __VA_ARGS__);                                                                    \
            printf("\n");                                                                                    \
        }                                                                                                    \
    } while (0)
int main() {
    /* Philox */
    for (uint64_t c = 0; c < 1000; c++) {
        uint32_t o[4];
        sl_philox4x32(0x5eed0000cafeull + c * 7, c * 131 + 5, c * 977, o);
        cu_u4 w = philox4x32(0x5eed0000cafeull + c * 7, c * 131 + 5, c * 977);
        CHECK(!memcmp(o, w.w, 16), "philox %llu", (unsigned long long)c);
    }
    /* f16 both ways: every half, and floats around every rounding boundary */
    for (uint32_t h = 0; h < 65536; h++) {
        float a = sl_f16_to_f32((uint16_t)h), b = f16_to_f32((uint16_t)h);
        CHECK(!memcmp(&a, &b, 4), "f16_to_f32 %u", h);
    }
    for (uint64_t u = 0; u < (1ull << 32); u += 997) {
        float f;
        uint32_t uu = (uint32_t)u;
        memcpy(&f, &uu, 4);
        CHECK(sl_f32_to_f16(f) == f32_to_f16(f), "f32_to_f16 %08x", uu);
        CHECK(sl_f32_to_bf16(f) == f32_to_bf16(f), "f32_to_bf16 %08x", uu);
        if (fails > 20) return 1;
    }
    /* DROPOUT: flat and sequence shard, with and without a residual */
    float p = 0.3f;
    for (int shard = 0; shard <= 1; shard++)
        for (int res = 0; res <= 1; res++) {
            int64_t Bn = 3, Tl = 5, R = 7, seq = 13, t0 = 3, N = Bn * Tl * R;
            std::vector<float> x(N), r(N), o(N), mk(N);
            uint64_t s = 99;
            for (int64_t i = 0; i < N; i++) x[i] = frand(&s), r[i] = frand(&s);
            cu_drop d = {1,
                         sl_dropout_threshold(p),
                         0x1234567890ull,
                         sl_dropout_ctr_hi(5, 9),
                         (float)(1.0 / (1.0 - (double)p)),
                         0,
                         0};
            int64_t nb = shard ? Bn : 1, blk = N / nb;
            k_dropout(o.data(), x.data(), res ? r.data() : nullptr, nb, blk, blk / 4 + 2,
                      shard ? blk / Tl : 0, shard ? seq : 0, t0, d);
            for (int64_t b = 0; b < nb; b++) {
                uint64_t e0 = shard ? (uint64_t)((b * seq + t0) * R) : 0;
                sl_rng_dropout(0x1234567890ull, sl_dropout_ctr_hi(5, 9), e0, blk, p, mk.data() + b * blk);
            }
            int bad = 0;
            for (int64_t i = 0; i < N; i++) {
                float v = x[i] * mk[i], w = res ? r[i] + v : v;
                bad += memcmp(&w, &o[i], 4) != 0;
            }
            CHECK(!bad, "dropout shard %d res %d: %d elements", shard, res, bad);
        }
    /* f32 attention with dropout and TP head offsets against the reference's formulas (masks by
     * sl_rng_dropout) */
    for (int win = 0; win <= 3; win += 3) {
        int64_t B = 2, T = 9, NH = 4, NKV = 2, hs = 8, W = NH + 2 * NKV, heads = NH + 3, head0 = 2,
                grp = NH / NKV;
        uint64_t sd = 777 + win;
        std::vector<float> q(B * T * NH * hs), k(B * T * NKV * hs), v(B * T * NKV * hs), g(B * T * NH * hs);
        for (auto *x : {&q, &k, &v, &g})
            for (auto &e : *x) e = frand(&sd) * 3;
        cu_v5 qs = {{T * NH * hs, NH * hs, hs, 0, 0}}, ks = {{T * NKV * hs, NKV * hs, hs, 0, 0}},
              gs = {{T * NH * hs, NH * hs, 0, 0, 0}};
        float pd = 0.25f, scale = 1.0f / sqrtf((float)hs);
        uint64_t seed = 0x5eed0000cafeull, hi = sl_dropout_ctr_hi(11, 7);
        cu_drop dr = {1, sl_dropout_threshold(pd), seed, hi, (float)(1.0 / (1.0 - (double)pd)), heads, head0};
        std::vector<float> o(B * T * NH * hs), lse(B * NH * T), ro(o.size()), mk(T);
        k_attention(o.data(), lse.data(), q.data(), qs, k.data(), ks, v.data(), ks, B, T, NH, NKV, hs, win,
                    scale, dr);
        std::vector<float> out(B * T * W * hs), Ds(B * NH * T), rout(out.size(), 0.0f), rD(B * NH * T);
        k_attention_back_dq(out.data(), Ds.data(), lse.data(), q.data(), qs, k.data(), ks, v.data(), ks,
                            g.data(), gs, B, T, NH, NKV, hs, win, scale, dr);
        k_attention_back_dkv(out.data(), Ds.data(), lse.data(), q.data(), qs, k.data(), ks, v.data(), ks,
                             g.data(), gs, B, T, NH, NKV, hs, win, scale, dr);
        auto dot = [&](const float *a, const float *b) {
            float s = 0;
            for (int64_t d = 0; d < hs; d++) s += a[d] * b[d];
            return s;
        };
        int bad = 0, badb = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < NH; h++)
                for (int64_t t = 0; t < T; t++) {
                    int64_t kh = h / grp, j0 = win > 0 && t - win + 1 > 0 ? t - win + 1 : 0;
                    const float *qr = &q[b * qs.v[0] + t * qs.v[1] + h * hs],
                                *gr = &g[b * gs.v[0] + t * gs.v[1] + h * hs];
                    sl_rng_dropout(seed, hi, (uint64_t)(((b * heads + head0 + h) * T + t) * T), t + 1, pd,
                                   mk.data());
                    float mx = -INFINITY, sum = 0, l = lse[(b * NH + h) * T + t];
                    for (int64_t j = j0; j <= t; j++)
                        mx = fmaxf(mx, dot(qr, &k[b * ks.v[0] + j * ks.v[1] + kh * hs]) * scale);
                    for (int64_t j = j0; j <= t; j++)
                        sum += expf(dot(qr, &k[b * ks.v[0] + j * ks.v[1] + kh * hs]) * scale - mx);
                    float inv = 1.0f / sum, acc[64] = {0};
                    for (int64_t j = j0; j <= t; j++) {
                        float pj =
                            expf(dot(qr, &k[b * ks.v[0] + j * ks.v[1] + kh * hs]) * scale - mx) * inv * mk[j];
                        for (int64_t d = 0; d < hs; d++)
                            acc[d] += pj * v[b * ks.v[0] + j * ks.v[1] + kh * hs + d];
                    }
                    for (int64_t d = 0; d < hs; d++) bad += acc[d] != o[(b * T + t) * NH * hs + h * hs + d];
                    /* backward: D, dq */
                    float D = 0, dq[64] = {0};
                    for (int64_t j = j0; j <= t; j++) {
                        float pp = expf(dot(qr, &k[b * ks.v[0] + j * ks.v[1] + kh * hs]) * scale - l),
                              dp = dot(gr, &v[b * ks.v[0] + j * ks.v[1] + kh * hs]) * mk[j];
                        D += pp * dp;
                    }
                    rD[(b * NH + h) * T + t] = D;
                    for (int64_t j = j0; j <= t; j++) {
                        const float *kr = &k[b * ks.v[0] + j * ks.v[1] + kh * hs];
                        float pp = expf(dot(qr, kr) * scale - l),
                              dp = dot(gr, &v[b * ks.v[0] + j * ks.v[1] + kh * hs]) * mk[j];
                        float ds = pp * (dp - D) * scale;
                        for (int64_t d = 0; d < hs; d++) dq[d] += ds * kr[d];
                    }
                    for (int64_t d = 0; d < hs; d++) badb += dq[d] != out[(b * T + t) * W * hs + h * hs + d];
                }
        for (int64_t b = 0; b < B; b++)
            for (int64_t kh = 0; kh < NKV; kh++)
                for (int64_t j = 0; j < T; j++) {
                    float dk[64] = {0}, dv[64] = {0};
                    const float *kr = &k[b * ks.v[0] + j * ks.v[1] + kh * hs],
                                *vr = &v[b * ks.v[0] + j * ks.v[1] + kh * hs];
                    for (int64_t h = kh * grp; h < (kh + 1) * grp; h++)
                        for (int64_t t = j; t < (win > 0 && j + win < T ? j + win : T); t++) {
                            const float *qr = &q[b * qs.v[0] + t * qs.v[1] + h * hs],
                                        *gr = &g[b * gs.v[0] + t * gs.v[1] + h * hs];
                            sl_rng_dropout(seed, hi, (uint64_t)(((b * heads + head0 + h) * T + t) * T), t + 1,
                                           pd, mk.data());
                            int64_t row = (b * NH + h) * T + t;
                            float pp = expf(dot(qr, kr) * scale - lse[row]), dp = dot(gr, vr) * mk[j];
                            float ds = pp * (dp - rD[row]) * scale, pm = pp * mk[j];
                            for (int64_t d = 0; d < hs; d++) dk[d] += ds * qr[d], dv[d] += pm * gr[d];
                        }
                    for (int64_t d = 0; d < hs; d++) {
                        badb += dk[d] != out[(b * T + j) * W * hs + (NH + kh) * hs + d];
                        badb += dv[d] != out[(b * T + j) * W * hs + (NH + NKV + kh) * hs + d];
                    }
                }
        CHECK(!bad, "attention forward with dropout, win %d: %d elements", win, bad);
        CHECK(!badb, "attention backward with dropout, win %d: %d elements", win, badb);
        /* half modes: parallel backward == the serial port of attention_half.cl */
        for (int hm = 1; hm <= 4; hm++) {
            std::vector<float> P(B * NH * T * 2 * T), o1(out.size(), 7.0f), o2(out.size(), -3.0f);
            std::vector<float> S1(B * NKV * (3 * T + 2 * T * hs)), S2(B * NH * T * (1 + 2 * hs));
            k_attention_half(o.data(), lse.data(), q.data(), qs, k.data(), ks, v.data(), ks, B, T, NH, NKV,
                             hs, win, scale, hm, dr, P.data());
            serial_back(o1.data(), lse.data(), q.data(), qs, k.data(), ks, v.data(), ks, g.data(), gs, B, T,
                        NH, NKV, hs, win, scale, hm, dr, S1.data());
            float *Dsum = S2.data(), *Hk = Dsum + B * NH * T, *Hv = Hk + B * NH * T * hs;
            k_attention_half_dq(o2.data(), Dsum, lse.data(), q.data(), qs, k.data(), ks, v.data(), ks,
                                g.data(), gs, B, T, NH, NKV, hs, win, scale, hm, dr);
            k_attention_half_kv(Hk, Hv, Dsum, lse.data(), q.data(), qs, k.data(), ks, v.data(), ks, g.data(),
                                gs, B, T, NH, NKV, hs, win, scale, hm, dr);
            k_attention_half_combine(o2.data(), Hk, Hv, B, T, NH, NKV, hs, hm);
            CHECK(!memcmp(o1.data(), o2.data(), o1.size() * 4),
                  "half backward mode %d win %d: parallel != serial", hm, win);
        }
    }
    printf("cuda kernels on the host: %d failures (%lld checks)\n", fails, checks);
    return fails != 0;
}
