/* Elementwise and data-movement kernels: cont, cast, add, mul, scale, sum_to, acc, zeros, scatter_add,
 * concat, gelu. The *_ref kernels are generic strided loops over a 5-D iteration space (the scalar
 * reference, the tests' oracle); sl_k_* run the SIMD bodies of vec_kernels.inc on the layouts that
 * occur in practice (contiguous, row-broadcast bias, rows with uniform strides) and fall back to the
 * reference otherwise. */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/f16.h"
#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/simd_math.h"
#include "device/cpu/kernels/vec_kernels.h"

sl_it5 sl_it5_of(const sl_tensor *t) {
    sl_it5 r;
    int pad = 5 - t->ndim;
    for (int d = 0; d < 5; d++) {
        r.ne[d] = d < pad ? 1 : t->ne[d - pad];
        r.nb[d] = d < pad ? 0 : t->nb[d - pad];
    }
    return r;
}

sl_it5 sl_it5_broadcast(const sl_tensor *b, const sl_tensor *out) {
    sl_it5 o = sl_it5_of(out), r = sl_it5_of(b);
    for (int d = 0; d < 5; d++) {
        if (r.ne[d] != o.ne[d]) r.nb[d] = 0; /* broadcast dim (size 1) */
        r.ne[d] = o.ne[d];
    }
    return r;
}

#define LOOP4(it)                                                                                            \
    for (int64_t i0 = 0; i0 < (it).ne[0]; i0++)                                                              \
        for (int64_t i1 = 0; i1 < (it).ne[1]; i1++)                                                          \
            for (int64_t i2 = 0; i2 < (it).ne[2]; i2++)                                                      \
                for (int64_t i3 = 0; i3 < (it).ne[3]; i3++)
#define OFF4(it) (i0 * (it).nb[0] + i1 * (it).nb[1] + i2 * (it).nb[2] + i3 * (it).nb[3])

sl_status sl_k_cont(sl_tensor *n) {
    sl_tensor *a = n->src[0];
    sl_it5 ia = sl_it5_of(a), io = sl_it5_of(n);
    int64_t n4 = io.ne[4];
    size_t es = sl_dtype_size(n->dtype);
    if (es == 4) {
        const float *src = a->data;
        float *dst = n->data;
        LOOP4(io) {
            const float *s = src + OFF4(ia);
            float *d = dst + OFF4(io);
            int64_t sb = ia.nb[4];
            for (int64_t i = 0; i < n4; i++) d[i] = s[i * sb];
        }
    } else {
        const uint16_t *src = a->data;
        uint16_t *dst = n->data;
        LOOP4(io) {
            const uint16_t *s = src + OFF4(ia);
            uint16_t *d = dst + OFF4(io);
            for (int64_t i = 0; i < n4; i++) d[i] = s[i * ia.nb[4]];
        }
    }
    return SL_OK;
}

/* contiguous f32 <-> bf16: one flat loop over all threads that the compiler vectorizes (sl_f32_to_bf16's
 * rounding with the NaN test as a select: the same bits), built for AVX-512BW, AVX2 and the baseline and
 * chosen at run time. Autocast casts every weight twice per step (Note [Recomputed weight casts]); the
 * per-row scalar loop below took a quarter of GPT-2 124M's bf16 step. */
#define CAST_F32_BF16_BODY                                                                                   \
    _Pragma("omp parallel for simd schedule(static) if (m > 65536)") for (int64_t i = 0; i < m; i++) {       \
        uint32_t u;                                                                                          \
        memcpy(&u, src + i, 4);                                                                              \
        uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;                          \
        dst[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);                                        \
    }
#define CAST_BF16_F32_BODY                                                                                   \
    _Pragma("omp parallel for simd schedule(static) if (m > 65536)") for (int64_t i = 0; i < m; i++) {       \
        uint32_t u = (uint32_t)src[i] << 16;                                                                 \
        memcpy(dst + i, &u, 4);                                                                              \
    }
static void f2b_base(const float *src, uint16_t *dst, int64_t m) { CAST_F32_BF16_BODY }
static void b2f_base(const uint16_t *src, float *dst, int64_t m) { CAST_BF16_F32_BODY }
#if SL_HAVE_X86
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void f2b_avx512(const float *src, uint16_t *dst,
                                                                            int64_t m) {
    CAST_F32_BF16_BODY
}
__attribute__((target("avx2"))) static void f2b_avx2(const float *src, uint16_t *dst, int64_t m) {
    CAST_F32_BF16_BODY
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void b2f_avx512(const uint16_t *src, float *dst,
                                                                            int64_t m) {
    CAST_BF16_F32_BODY
}
__attribute__((target("avx2"))) static void b2f_avx2(const uint16_t *src, float *dst, int64_t m) {
    CAST_BF16_F32_BODY
}
#endif

/* the kernel ISA (sl_kern_isa: CPUID, SUANLI_ISA, or a test's sl_kern_isa_force) */
static int cast_isa(void) {
#if SL_HAVE_X86
    const sl_cpu_features *f = sl_cpu_features_get();
    int k = sl_kern_isa();
    if (k >= SL_KISA_AVX512 && f->avx512bw && f->avx512vl) return 2;
    if (k >= SL_KISA_AVX2) return 1;
#endif
    return 0;
}

static void cast_f32_bf16_flat(const float *src, uint16_t *dst, int64_t m) {
    switch (cast_isa()) {
#if SL_HAVE_X86
    case 2:
        f2b_avx512(src, dst, m);
        return;
    case 1:
        f2b_avx2(src, dst, m);
        return;
#endif
    default:
        f2b_base(src, dst, m);
    }
}

static void cast_bf16_f32_flat(const uint16_t *src, float *dst, int64_t m) {
    switch (cast_isa()) {
#if SL_HAVE_X86
    case 2:
        b2f_avx512(src, dst, m);
        return;
    case 1:
        b2f_avx2(src, dst, m);
        return;
#endif
    default:
        b2f_base(src, dst, m);
    }
}

void sl_k_cast_f32_bf16(const float *src, uint16_t *dst, int64_t n) { cast_f32_bf16_flat(src, dst, n); }

sl_status sl_k_cast(sl_tensor *n) {
    sl_tensor *a = n->src[0];
    sl_it5 ia = sl_it5_of(a), io = sl_it5_of(n);
    int64_t n4 = io.ne[4];
    if (a->dtype == n->dtype) return sl_k_cont(n);
    if (sl_is_contiguous(a) && sl_is_contiguous(n)) {
        if (a->dtype == SL_F32 && n->dtype == SL_BF16) {
            cast_f32_bf16_flat(a->data, n->data, sl_nelements(n));
            return SL_OK;
        }
        if (a->dtype == SL_BF16 && n->dtype == SL_F32) {
            cast_bf16_f32_flat(a->data, n->data, sl_nelements(n));
            return SL_OK;
        }
    }
    if (a->dtype == SL_F32 && n->dtype == SL_BF16) {
        const float *src = a->data;
        uint16_t *dst = n->data;
        LOOP4(io) {
            const float *s = src + OFF4(ia);
            uint16_t *d = dst + OFF4(io);
            for (int64_t i = 0; i < n4; i++) d[i] = sl_f32_to_bf16(s[i * ia.nb[4]]);
        }
    } else if (a->dtype == SL_BF16 && n->dtype == SL_F32) {
        const uint16_t *src = a->data;
        float *dst = n->data;
        LOOP4(io) {
            const uint16_t *s = src + OFF4(ia);
            float *d = dst + OFF4(io);
            for (int64_t i = 0; i < n4; i++) d[i] = sl_bf16_to_f32(s[i * ia.nb[4]]);
        }
    } else if (a->dtype == SL_F32 && n->dtype == SL_F16) { /* rows through the F16C/AVX-512 converters */
        LOOP4(io) {
            const float *s = (const float *)a->data + OFF4(ia);
            uint16_t *d = (uint16_t *)n->data + OFF4(io);
            if (ia.nb[4] == 1)
                sl_f16_from_f32(d, s, n4);
            else
                for (int64_t i = 0; i < n4; i++) d[i] = sl_f32_to_f16(s[i * ia.nb[4]]);
        }
    } else if (a->dtype == SL_F16 && n->dtype == SL_F32) {
        LOOP4(io) {
            const uint16_t *s = (const uint16_t *)a->data + OFF4(ia);
            float *d = (float *)n->data + OFF4(io);
            if (ia.nb[4] == 1)
                sl_f16_to_f32_n(d, s, n4);
            else
                for (int64_t i = 0; i < n4; i++) d[i] = sl_f16_to_f32(s[i * ia.nb[4]]);
        }
    } else {
        return sl_fail(SL_ERR_UNSUPPORTED, "cast %s -> %s", sl_dtype_name(a->dtype), sl_dtype_name(n->dtype));
    }
    return SL_OK;
}

static sl_status binary(sl_tensor *n, int is_mul) {
    sl_tensor *a = n->src[0], *b = n->src[1];
    sl_it5 io = sl_it5_of(n), ia = sl_it5_of(a), ib = sl_it5_broadcast(b, n);
    const float *pa = a->data, *pb = b->data;
    float *po = n->data;
    int64_t n4 = io.ne[4];
    int64_t outer = io.ne[0] * io.ne[1] * io.ne[2] * io.ne[3];
    int unit = ia.nb[4] == 1 && ib.nb[4] <= 1;
#pragma omp parallel for schedule(static) if (outer * n4 > 32768)
    for (int64_t r = 0; r < outer; r++) {
        int64_t i3 = r % io.ne[3], i2 = (r / io.ne[3]) % io.ne[2],
                i1 = (r / (io.ne[3] * io.ne[2])) % io.ne[1], i0 = r / (io.ne[3] * io.ne[2] * io.ne[1]);
        const float *x = pa + OFF4(ia), *y = pb + OFF4(ib);
        float *o = po + OFF4(io);
        if (unit && ib.nb[4] == 1) {
            if (is_mul)
#pragma omp simd
                for (int64_t i = 0; i < n4; i++) o[i] = x[i] * y[i];
            else
#pragma omp simd
                for (int64_t i = 0; i < n4; i++) o[i] = x[i] + y[i];
        } else if (unit) { /* y is a scalar along the row */
            float yv = y[0];
            if (is_mul)
                for (int64_t i = 0; i < n4; i++) o[i] = x[i] * yv;
            else
                for (int64_t i = 0; i < n4; i++) o[i] = x[i] + yv;
        } else {
            for (int64_t i = 0; i < n4; i++) {
                float xv = x[i * ia.nb[4]], yv = y[i * ib.nb[4]];
                o[i] = is_mul ? xv * yv : xv + yv;
            }
        }
    }
    return SL_OK;
}

sl_status sl_k_add_ref(sl_tensor *n) { return binary(n, 0); }
sl_status sl_k_mul_ref(sl_tensor *n) { return binary(n, 1); }

/* The outer 4 dims of an iteration form address a single row index r with offset r * ld. */
static int fold_rows(const sl_it5 *it, int64_t *ld) {
    int64_t l = -1, span = 1;
    for (int d = 3; d >= 0; d--) {
        if (it->ne[d] == 1) continue;
        if (l < 0) {
            l = it->nb[d];
            span = it->ne[d];
        } else if (it->nb[d] == l * span) {
            span *= it->ne[d];
        } else {
            return 0;
        }
    }
    *ld = l < 0 ? 0 : l;
    return 1;
}

static sl_status binary_fast(sl_tensor *n, int op) {
    const sl_vec_ops *v = sl_vec();
    sl_tensor *a = n->src[0], *b = n->src[1];
    if (v) {
        sl_it5 io = sl_it5_of(n), ia = sl_it5_of(a), ib = sl_it5_broadcast(b, n);
        int64_t C = io.ne[4], R = sl_nelements(n) / (C ? C : 1), lo, la, lb;
        if (C > 0 && R > 0 && io.nb[4] == 1 && ia.nb[4] == 1 && ib.nb[4] == 1 && fold_rows(&io, &lo) &&
            fold_rows(&ia, &la) && fold_rows(&ib, &lb)) {
            if (R == 1 || (lo == C && la == C && lb == C))
                v->binary_flat(a->data, b->data, n->data, R * C, op);
            else
                v->binary_rows(a->data, la, b->data, lb, n->data, lo, R, C, op);
            return SL_OK;
        }
    }
    return binary(n, op);
}

sl_status sl_k_add(sl_tensor *n) { return binary_fast(n, 0); }
sl_status sl_k_mul(sl_tensor *n) { return binary_fast(n, 1); }

sl_status sl_k_scale(sl_tensor *n) {
    sl_tensor *a = n->src[0];
    sl_it5 ia = sl_it5_of(a), io = sl_it5_of(n);
    float s = n->fparams[0];
    const float *pa = a->data;
    float *po = n->data;
    LOOP4(io) {
        const float *x = pa + OFF4(ia);
        float *o = po + OFF4(io);
        for (int64_t i = 0; i < io.ne[4]; i++) o[i] = x[i * ia.nb[4]] * s;
    }
    return SL_OK;
}

float sl_dropout_params(const sl_tensor *n, uint64_t *seed, uint64_t *ctr_hi) {
    const int32_t *ip = n->iparams;
    if (!ip[SL_DROPOUT_IP_ON] || !(n->fparams[0] > 0)) return 0.0f;
    *seed = (uint64_t)(uint32_t)ip[SL_DROPOUT_IP_SEED_LO] | (uint64_t)(uint32_t)ip[SL_DROPOUT_IP_SEED_HI]
                                                                << 32;
    uint64_t stream = (uint64_t)(uint32_t)ip[SL_DROPOUT_IP_STREAM_LO] |
                      (uint64_t)(uint32_t)ip[SL_DROPOUT_IP_STREAM_HI] << 32;
    *ctr_hi = sl_dropout_ctr_hi(stream, ip[SL_DROPOUT_IP_SITE]);
    return n->fparams[0];
}

/* o = x * m (+ r): the product rounded, then the add, as add(r, dropout(x)) computes it (Note [Hidden dropout
 * bits]; contraction off, so no FMA joins them on any target) */
__attribute__((optimize("fp-contract=off"))) static void
drop_apply(const float *x, const float *r, const float *m, float *o, uint16_t *oh, int64_t c) {
    if (oh)
        for (int64_t i = 0; i < c; i++) oh[i] = sl_f32_to_bf16(x[i] * m[i]);
    else if (r)
        for (int64_t i = 0; i < c; i++) o[i] = r[i] + x[i] * m[i];
    else
        for (int64_t i = 0; i < c; i++) o[i] = x[i] * m[i];
}

/* Contiguous in and out (the builder makes them so). Chunks of 1024 elements: each draws its own mask from
 * the counters, so the partition over threads changes nothing. A sequence shard (iparams SEQ > 0) is
 * (B, Tl, R) of a (B, SEQ, R) tensor at positions T0..: batch row b's block starts at full index
 * (b SEQ + T0) R. src1: a residual added (sl_dropout_add). Chunk k's mask is kept as bits at words
 * [64 k, 64 k + 64) of a forward node's aux area, or read from its forward node's (src2) there (Note
 * [Hidden dropout bits], src/ops/build.c). */
sl_status sl_k_dropout(sl_tensor *n) {
    const float *x = n->src[0]->data, *res = n->src[1] ? (const float *)n->src[1]->data : NULL;
    float *o = n->data;
    int64_t N = sl_nelements(n);
    uint64_t seed = 0, hi = 0;
    float p = sl_dropout_params(n, &seed, &hi);
    const size_t need = sl_dropout_bits_bytes(n);
    unsigned char *own = n->aux_bytes >= need ? (unsigned char *)n->data + sl_nbytes(n) : NULL;
    const sl_tensor *f = n->src[2];
    const unsigned char *fwd =
        f && f->aux_bytes >= need ? (const unsigned char *)f->data + sl_nbytes(f) : NULL;
    if (own) sl_k_drop_header_set(own, 0, 0, 0.0f, 0, 0); /* valid only once the bits are all written */
    uint16_t *oh = n->dtype == SL_BF16 ? n->data : NULL;  /* Note [Half outputs] (src/graph/fuse.c) */
    if (p == 0.0f) {
        if (oh) {
            sl_k_cast_f32_bf16(x, oh, N);
        } else if (res) {
            const sl_vec_ops *v = sl_vec();
            if (v)
                v->binary_flat(res, x, o, N, 0);
            else
                for (int64_t i = 0; i < N; i++) o[i] = res[i] + x[i];
        } else if (o != x) {
            memcpy(o, x, sizeof(float) * (size_t)N);
        }
        return SL_OK;
    }
    const sl_vec_ops *v = sl_vec();
    const int isa = sl_kern_isa();
    const uint16_t *rbits =
        fwd && sl_k_drop_header_valid(fwd, seed, hi, p, N) ? (const uint16_t *)(fwd + 32) : NULL;
    uint16_t *wbits = own ? (uint16_t *)(void *)(own + 32) : NULL;
    const sl_bits_pack_fn pack = sl_k_bits_pack(isa);
    const sl_bits_unpack_fn unpack = sl_k_bits_unpack(isa);
    const float keep = (float)(1.0 / (1.0 - (double)p));
    int64_t seq = n->iparams[SL_DROPOUT_IP_SEQ], t0 = n->iparams[SL_DROPOUT_IP_T0];
    int64_t nb = seq > 0 && n->ndim >= 2 ? n->ne[0] : 1, blk = N / (nb ? nb : 1);
    int64_t R = seq > 0 && n->ndim >= 2 && n->ne[1] > 0 ? blk / n->ne[1] : 0;
    int64_t per = (blk + 1023) / 1024, chunks = nb * per;
#pragma omp parallel for schedule(static) if (N > 16384)
    for (int64_t k = 0; k < chunks; k++) {
        float m[1024];
        int64_t b = k / per, c0 = (k % per) * 1024, at = b * blk + c0;
        int64_t c = blk - c0 < 1024 ? blk - c0 : 1024;
        uint64_t e = seq > 0 && n->ndim >= 2 ? (uint64_t)((b * seq + t0) * R + c0) : (uint64_t)at;
        if (rbits)
            unpack(rbits + 64 * k, c, keep, m);
        else if (v)
            v->dropout_mask(seed, hi, e, c, p, m);
        else
            sl_rng_dropout(seed, hi, e, c, p, m);
        if (wbits) pack(m, c, wbits + 64 * k);
        if (v)
            v->dropout_apply(x + at, res ? res + at : NULL, m, o + at, oh ? oh + at : NULL, c);
        else
            drop_apply(x + at, res ? res + at : NULL, m, o + at, oh ? oh + at : NULL, c);
    }
    if (own) sl_k_drop_header_set(own, seed, hi, p, N, 1);
    return SL_OK;
}

/* a bf16 source (the bias gradient of a Linear under autocast) is summed in f32 into an f32 output, each
 * value widened exactly: the sums of the widened tensor (sl_sum_to in build.c) */
sl_status sl_k_sum_to_ref(sl_tensor *n) {
    sl_tensor *a = n->src[0];
    float *po = n->data;
    const float *pa = a->data;
    int64_t no = sl_nelements(n);
    int64_t C = n->ndim ? n->ne[n->ndim - 1] : 1;
    const int bf = a->dtype == SL_BF16;
    /* fast path: contiguous (R, C) -> (C): parallel over columns, rows summed in order */
    if (sl_is_contiguous(a) && n->ndim == 1 && a->ne[a->ndim - 1] == C) {
        int64_t R = sl_nelements(a) / (C ? C : 1);
        const uint16_t *ph = a->data;
#pragma omp parallel for schedule(static)
        for (int64_t c0 = 0; c0 < C; c0 += 64) {
            int64_t c1 = c0 + 64 < C ? c0 + 64 : C;
            float acc[64] = {0};
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = c0; c < c1; c++)
                    acc[c - c0] += bf ? sl_bf16_to_f32(ph[r * C + c]) : pa[r * C + c];
            for (int64_t c = c0; c < c1; c++) po[c] = acc[c - c0];
        }
        return SL_OK;
    }
    if (bf)
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "sum_to '%s': a bf16 source must be a contiguous (rows, %lld) tensor", n->name,
                       (long long)C);
    memset(po, 0, sizeof(float) * (size_t)no);
    sl_it5 ia = sl_it5_of(a), io = sl_it5_broadcast(n, a);
    /* io: output strides with 0 on reduced dims; io.nb assumes contiguous output */
    LOOP4(ia) {
        const float *x = pa + OFF4(ia);
        float *o = po + OFF4(io);
        for (int64_t i = 0; i < ia.ne[4]; i++) o[i * io.nb[4]] += x[i * ia.nb[4]];
    }
    return SL_OK;
}

/* d = s over m floats, in parallel chunks when large. */
static void copy_flat(float *d, const float *s, int64_t m) {
    const int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static) if (m > chunk)
    for (int64_t a = 0; a < m; a += chunk)
        memcpy(d + a, s + a, sizeof(float) * (size_t)(m - a < chunk ? m - a : chunk));
}

sl_status sl_k_acc_ref(sl_tensor *n) {
    sl_tensor *dst = n->src[0], *src = n->src[1];
    SL_ASSERT(n->data == dst->data);
    sl_it5 id = sl_it5_of(dst), is = sl_it5_of(src);
    float *pd = dst->data;
    const float *ps = src->data;
    const int copy = n->iparams[0]; /* Note [Overwriting first gradient writes] */
    if (sl_is_contiguous(dst) && sl_is_contiguous(src)) {
        int64_t m = sl_nelements(dst);
        if (copy) {
            copy_flat(pd, ps, m);
            return SL_OK;
        }
#pragma omp parallel for simd schedule(static) if (m > 65536)
        for (int64_t i = 0; i < m; i++) pd[i] += ps[i];
        return SL_OK;
    }
    /* same element count, maybe different shapes: only contiguous pairs are supported above */
    SL_ASSERT(sl_same_shape(dst, src));
    LOOP4(id) {
        float *d = pd + OFF4(id);
        const float *s = ps + OFF4(is);
        for (int64_t i = 0; i < id.ne[4]; i++)
            d[i * id.nb[4]] = (copy ? 0.0f : d[i * id.nb[4]]) + s[i * is.nb[4]];
    }
    return SL_OK;
}

sl_status sl_k_zeros(sl_tensor *n) {
    memset(n->data, 0, sl_nbytes(n));
    return SL_OK;
}

sl_status sl_k_scatter_add(sl_tensor *n) {
    sl_tensor *src = n->src[1];
    float *pd = n->data;
    const float *ps = src->data;
    int vnd = n->iparams[5];
    sl_it5 is = sl_it5_of(src), iv = is;
    int pad = 5 - vnd;
    for (int d = 0; d < 5; d++) iv.nb[d] = d < pad ? 0 : n->iparams[1 + d - pad];
    pd += n->iparams[0];
    if (iv.nb[4] == 1 && is.nb[4] == 1) { /* unit-stride rows (e.g. the q/k/v slices of a fused QKV) */
        int64_t n4 = is.ne[4];
        LOOP4(is) {
            float *d = pd + OFF4(iv);
            const float *s = ps + OFF4(is);
#pragma omp simd
            for (int64_t i = 0; i < n4; i++) d[i] += s[i];
        }
        return SL_OK;
    }
    LOOP4(is) {
        float *d = pd + OFF4(iv);
        const float *s = ps + OFF4(is);
        for (int64_t i = 0; i < is.ne[4]; i++) d[i * iv.nb[4]] += s[i * is.nb[4]];
    }
    return SL_OK;
}

sl_status sl_k_concat(sl_tensor *n) {
    sl_tensor *a = n->src[0], *b = n->src[1];
    int dim = n->iparams[0];
    size_t es = sl_dtype_size(n->dtype);
    /* copy a and b into the corresponding slices of the contiguous output, element by element */
    for (int part = 0; part < 2; part++) {
        sl_tensor *s = part ? b : a;
        sl_it5 is = sl_it5_of(s), io = sl_it5_of(n);
        for (int d = 0; d < 5; d++) io.ne[d] = is.ne[d];
        int64_t base = part ? a->ne[dim] * n->nb[dim] : 0;
        char *po = (char *)n->data + base * (int64_t)es;
        const char *ps = s->data;
        LOOP4(is) {
            for (int64_t i = 0; i < is.ne[4]; i++)
                memcpy(po + (OFF4(io) + i * io.nb[4]) * (int64_t)es,
                       ps + (OFF4(is) + i * is.nb[4]) * (int64_t)es, es);
        }
    }
    return SL_OK;
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* GELU, GELU_BACK and LAYERNORM write f32, or bf16 where a graph pass gave them the dtype of the cast that
 * followed (Note [Half outputs], src/graph/fuse.c): the f32 value rounded as the CAST kernel rounds */
sl_status sl_k_gelu_ref(sl_tensor *n) {
    sl_tensor *a = n->src[0];
    if (!sl_is_contiguous(a)) return sl_fail(SL_ERR_UNSUPPORTED, "gelu: non-contiguous input");
    const float *x = a->data;
    float *y = n->data;
    uint16_t *yh = n->dtype == SL_BF16 ? n->data : NULL;
    int64_t m = sl_nelements(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++) {
        float v = x[i];
        float r = 0.5f * v * (1.0f + tanhf(GELU_K * (v + 0.044715f * v * v * v)));
        if (yh)
            yh[i] = sl_f32_to_bf16(r);
        else
            y[i] = r;
    }
    return SL_OK;
}

sl_status sl_k_gelu_back_ref(sl_tensor *n) {
    sl_tensor *a = n->src[0], *g = n->src[1];
    if (!sl_is_contiguous(a) || !sl_is_contiguous(g))
        return sl_fail(SL_ERR_UNSUPPORTED, "gelu_back: non-contiguous input");
    const float *x = a->data, *dy = g->data;
    float *dx = n->data;
    uint16_t *dxh = n->dtype == SL_BF16 ? n->data : NULL;
    int64_t m = sl_nelements(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++) {
        float v = x[i];
        float u = GELU_K * (v + 0.044715f * v * v * v);
        float t = tanhf(u);
        float sech2 = 1.0f - t * t;
        float du = GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
        float r = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * sech2 * du);
        if (dxh)
            dxh[i] = sl_f32_to_bf16(r);
        else
            dx[i] = r;
    }
    return SL_OK;
}

sl_status sl_k_sum_to(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    sl_tensor *a = n->src[0];
    int64_t C = n->ndim ? n->ne[n->ndim - 1] : 1;
    if (v && sl_is_contiguous(a) && n->ndim == 1 && a->ne[a->ndim - 1] == C && C > 0) {
        v->sum_rows(a->data, C, sl_nelements(a) / C, C, n->data, a->dtype == SL_BF16);
        return SL_OK;
    }
    return sl_k_sum_to_ref(n);
}

sl_status sl_k_acc(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    sl_tensor *dst = n->src[0], *src = n->src[1];
    if (v && sl_is_contiguous(dst) && sl_is_contiguous(src) && !n->iparams[0]) {
        SL_ASSERT(n->data == dst->data);
        v->binary_flat(dst->data, src->data, dst->data, sl_nelements(dst), 0);
        return SL_OK;
    }
    return sl_k_acc_ref(n);
}

sl_status sl_k_gelu(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    sl_tensor *a = n->src[0];
    if (!v || !sl_is_contiguous(a)) return sl_k_gelu_ref(n);
    v->gelu_fwd(a->data, n->data, n->dtype == SL_BF16 ? n->data : NULL, sl_nelements(n));
    return SL_OK;
}

sl_status sl_k_gelu_back(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    sl_tensor *a = n->src[0], *g = n->src[1];
    if (!v || !sl_is_contiguous(a) || !sl_is_contiguous(g)) return sl_k_gelu_back_ref(n);
    v->gelu_bwd(a->data, g->data, n->data, n->dtype == SL_BF16 ? n->data : NULL, sl_nelements(n));
    return SL_OK;
}
