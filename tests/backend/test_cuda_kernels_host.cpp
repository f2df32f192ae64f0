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
/* inert shims for the kernels that are compiled but not checked here (warp reductions, shared memory,
 * atomics): a single "thread" */
struct host_dim3 {
    unsigned x, y, z;
};
static host_dim3 threadIdx, blockIdx, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
static inline void host_dims_used() { (void)blockDim, (void)gridDim; }
#undef __shared__
#define __shared__ static
static inline void __syncthreads() {}
static inline int atomicCAS(int *a, int cmp, int v) {
    int o = *a;
    if (o == cmp) *a = v;
    return o;
}
static inline float atomicAdd(float *a, float v) {
    float o = *a;
    *a = o + v;
    return o;
}
static inline float warp_sum(float v) { return v; }
static inline float warp_max(float v) { return v; }
using std::exp;
using std::log;
#include "common_host.h"
#include "dropout.inc"
#include "attention.inc"
#include "attention_half.inc"
#include "elementwise.inc"
#include "llama.inc"
#include "loss.inc"
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
    /* cu_ew16's f16 casts (strided 5-D form) */
    {
        int64_t n = 4099;
        std::vector<float> x(n), back(n);
        std::vector<uint16_t> h(n);
        uint64_t sd = 5;
        for (int64_t i = 0; i < n; i++) x[i] = frand(&sd) * (i % 7 == 0 ? 2e5f : i % 5 == 0 ? 1e-6f : 30.0f);
        cu_v5 ne = {{1, 1, 1, 1, n}}, nb = {{0, 0, 0, n, 1}};
        k_ew16(h.data(), nb, x.data(), nb, ne, n, CU_EW16_F32_TO_F16);
        k_ew16(back.data(), nb, h.data(), nb, ne, n, CU_EW16_F16_TO_F32);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            float w = sl_f16_to_f32(sl_f32_to_f16(x[i]));
            bad += h[i] != sl_f32_to_f16(x[i]) || memcmp(&w, &back[i], 4) != 0;
        }
        CHECK(!bad, "ew16 f16 casts: %d elements", bad);
    }
    /* RoPE's half numerics (Note [RoPE numerics]) against sl_k_rope's formulas */
    for (int mode = 0; mode <= 6; mode++) {
        int64_t B = 2, T = 5, NH = 3, hs = 8, half = hs / 2, pos0 = 7;
        int bf = mode == 1 || mode == 5 ? 1 : mode == 2 || mode == 6 ? 2 : 0, rcs = mode == 1 || mode == 2;
        std::vector<float> x(B * T * NH * hs), y(x.size()), inv(half);
        uint64_t sd = 17 + mode;
        for (auto &e : x) e = frand(&sd) * 4;
        for (int64_t i = 0; i < half; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)hs);
        cu_v5 xs = {{T * NH * hs, NH * hs, hs, 0, 0}};
        float sgn = mode == 3 ? -1.0f : 1.0f;
        k_rope(y.data(), x.data(), xs, inv.data(), B, T, NH, hs, pos0, sgn, bf, rcs);
        auto rt = [&](float f) {
            return bf == 2 ? sl_f16_to_f32(sl_f32_to_f16(f)) : sl_bf16_to_f32(sl_f32_to_bf16(f));
        };
        int bad = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t h = 0; h < NH; h++)
                    for (int64_t i = 0; i < half; i++) {
                        float ang = (float)(pos0 + t) * inv[i];
                        float cs = (float)cos((double)ang), sn = sgn * (float)sin((double)ang);
                        if (rcs) cs = rt(cs), sn = rt(sn);
                        const float *xr = &x[((b * T + t) * NH + h) * hs];
                        float x1 = xr[i], x2 = xr[i + half], y1, y2;
                        if (bf) {
                            y1 = rt(rt(x1 * cs) + rt(-x2 * sn));
                            y2 = rt(rt(x2 * cs) + rt(x1 * sn));
                        } else {
                            y1 = x1 * cs - x2 * sn;
                            y2 = x2 * cs + x1 * sn;
                        }
                        const float *yr = &y[((b * T + t) * NH + h) * hs];
                        bad += memcmp(&y1, &yr[i], 4) != 0 || memcmp(&y2, &yr[i + half], 4) != 0;
                    }
        CHECK(!bad, "rope mode %d: %d elements", mode, bad);
    }
    /* the vocabulary-parallel ops (sl_k_ce_vp_stats / sl_k_ce_vp / sl_k_ce_vp_back, the shard embedding) */
    {
        int64_t N = 6, V = 5, C = 3, lo = 5, P = 2;
        int32_t ids[6] = {0, 5, 9, 7, -1, 12}, tg[6] = {3, 5, 9, -1, 6, 2};
        std::vector<float> tab(V * C), emb(N * C), x(N * V), lse(N), st(N * 2), gst(P * N * 2), glse(N),
            out(1);
        uint64_t sd = 3;
        for (auto &e : tab) e = frand(&sd);
        for (auto &e : x) e = frand(&sd) * 5;
        int flag[2] = {0, 0};
        k_embedding_shard(emb.data(), tab.data(), ids, N, V, C, lo, flag);
        int bad = flag[0] != 1 || flag[1] != -1;
        for (int64_t r = 0; r < N; r++)
            for (int64_t c = 0; c < C; c++) {
                int64_t k = (int64_t)ids[r] - lo;
                float want = ids[r] >= 0 && k >= 0 && k < V ? tab[k * C + c] : 0.0f;
                bad += emb[r * C + c] != want;
            }
        std::vector<float> d(V * C, 0.0f), g(N * C);
        for (auto &e : g) e = frand(&sd);
        k_embedding_back_shard_ordered(d.data(), ids, g.data(), N, V, C, lo);
        for (int64_t c = 0; c < C; c++)
            for (int64_t k = 0; k < V; k++) {
                float want = 0;
                for (int64_t i = 0; i < N; i++)
                    if ((int64_t)ids[i] - lo == k) want += g[i * C + c];
                bad += d[k * C + c] != want;
            }
        CHECK(!bad, "vocab-shard embedding and its backward");
        for (int64_t i = 0; i < N; i++) { /* the shard's logsumexp, as the CPU's lse_rows computes it */
            float mx = -INFINITY, sm = 0;
            for (int64_t j = 0; j < V; j++) mx = fmaxf(mx, x[i * V + j]);
            for (int64_t j = 0; j < V; j++) sm += expf(x[i * V + j] - mx);
            lse[i] = mx + logf(sm);
        }
        k_ce_vp_stats(st.data(), lse.data(), x.data(), tg, N, V, lo);
        bad = 0;
        for (int64_t i = 0; i < N; i++) {
            int64_t j = (int64_t)tg[i] - lo;
            bad +=
                st[2 * i] != lse[i] || st[2 * i + 1] != (tg[i] >= 0 && j >= 0 && j < V ? x[i * V + j] : 0.0f);
        }
        for (int64_t r = 0; r < P; r++) /* a group of two: this shard's stats and another's */
            for (int64_t i = 0; i < N; i++) {
                gst[(r * N + i) * 2] = r ? frand(&sd) + 2 : st[2 * i];
                gst[(r * N + i) * 2 + 1] =
                    r ? (tg[i] >= 0 && (tg[i] < lo || tg[i] >= lo + V) ? frand(&sd) : 0) : st[2 * i + 1];
            }
        k_ce_vp(out.data(), glse.data(), tg, gst.data(), N, P);
        double total = 0;
        int64_t cnt = 0;
        for (int64_t i = 0; i < N; i++) { /* sl_k_ce_vp */
            float M = -INFINITY, tl = 0, s = 0;
            for (int64_t r = 0; r < P; r++)
                M = fmaxf(M, gst[(r * N + i) * 2]), tl += gst[(r * N + i) * 2 + 1];
            for (int64_t r = 0; r < P; r++) s += expf(gst[(r * N + i) * 2] - M);
            float li = M + logf(s);
            bad += glse[i] != li;
            if (tg[i] >= 0) total += (double)li - (double)tl, cnt++;
        }
        bad += out[0] != (cnt ? (float)(total / (double)cnt) : 0.0f);
        CHECK(!bad, "CE_VP_STATS / CE_VP");
        /* the scale dloss / count of targets >= 0 (k_ce_mean mode 2 is a block reduction: not run here) */
        float scale = 1.5f / (float)cnt;
        bad = 0;
        std::vector<float> dx(N * V);
        k_ce_back(dx.data(), glse.data(), x.data(), tg, &scale, N, V, lo);
        for (int64_t i = 0; i < N; i++) /* sl_k_ce_vp_back's scalar form */
            for (int64_t j = 0; j < V; j++) {
                float want = tg[i] < 0 ? 0.0f : expf(x[i * V + j] - glse[i]) * scale;
                if (tg[i] >= 0 && (int64_t)tg[i] - lo == j) want -= scale;
                bad += memcmp(&want, &dx[i * V + j], 4) != 0;
            }
        CHECK(!bad, "CE_VP_BACK (count of targets >= 0, the shard's tlo)");
    }
    printf("cuda kernels on the host: %d failures (%lld checks)\n", fails, checks);
    return fails != 0;
}
