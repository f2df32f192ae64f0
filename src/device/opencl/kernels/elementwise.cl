/* Elementwise and data-movement kernels: k_ew (every 32-bit elementwise op over a strided 5-D iteration
 * space), k_ew16 (16-bit copies and f32 <-> bf16 casts), k_sum_to (broadcast reduction).
 * Semantics: src/device/cpu/kernels/elementwise.c and llama_ops.c (silu). Offsets and strides are in
 * elements; the 5-D shape and strides travel as long8 (lanes 0..4). FP_CONTRACT is off in every file so
 * the compiler never fuses a multiply and an add the CPU reference rounds separately. */
#pragma OPENCL FP_CONTRACT OFF

#define EW_ADD 0
#define EW_MUL 1
#define EW_COPY_A 2
#define EW_SCALE 3
#define EW_GELU 4
#define EW_GELU_BACK 5
#define EW_SILU 6
#define EW_SILU_BACK 7
#define EW_FILL 8
#define EW_COPY_B 9
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* tanh(u) = 1 - 2 / (exp(2u) + 1): PoCL's tanh made GELU 2x the CPU backend's share of a training step
 * (docs/BENCHMARKS.md); this form is one exp and one division, exact at the limits (exp overflow -> 1,
 * underflow -> -1), within a few ulps of 1 elsewhere, which is the part GELU uses (1 + t) */
inline float tanh_fast(float u) { return 1.0f - 2.0f / (exp(2.0f * u) + 1.0f); }

/* element offset of linear index i (row-major over ne) for strides nb */
inline long off5(long i, long8 ne, long8 nb) {
    long i4 = i % ne.s4, r = i / ne.s4;
    long i3 = r % ne.s3;
    r /= ne.s3;
    long i2 = r % ne.s2;
    r /= ne.s2;
    long i1 = r % ne.s1, i0 = r / ne.s1;
    return i0 * nb.s0 + i1 * nb.s1 + i2 * nb.s2 + i3 * nb.s3 + i4 * nb.s4;
}

kernel void k_ew(global uint *o, long oo, long8 nbo, global const uint *a, long ao, long8 nba, global const uint *b,
                 long bo, long8 nbb, long8 ne, int op, float f) {
    long i = get_global_id(0);
    long po = oo + off5(i, ne, nbo);
    if (op == EW_FILL) {
        o[po] = as_uint(f);
        return;
    }
    uint ua = a[ao + off5(i, ne, nba)];
    if (op == EW_COPY_A) {
        o[po] = ua;
        return;
    }
    float x = as_float(ua), y = 0.0f;
    if (op == EW_ADD || op == EW_MUL || op == EW_GELU_BACK || op == EW_SILU_BACK || op == EW_COPY_B) {
        uint ub = b[bo + off5(i, ne, nbb)];
        if (op == EW_COPY_B) {
            o[po] = ub;
            return;
        }
        y = as_float(ub);
    }
    float r;
    switch (op) {
    case EW_ADD:
        r = x + y;
        break;
    case EW_MUL:
        r = x * y;
        break;
    case EW_SCALE:
        r = x * f;
        break;
    case EW_GELU:
        r = 0.5f * x * (1.0f + tanh_fast(GELU_K * (x + 0.044715f * x * x * x)));
        break;
    case EW_GELU_BACK: {
        float u = GELU_K * (x + 0.044715f * x * x * x), t = tanh_fast(u);
        float sech2 = 1.0f - t * t, du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        r = y * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);
        break;
    }
    case EW_SILU:
        r = x / (1.0f + exp(-x));
        break;
    case EW_SILU_BACK: {
        float sg = 1.0f / (1.0f + exp(-x));
        r = y * sg * (1.0f + x * (1.0f - sg));
        break;
    }
    default:
        r = x;
    }
    o[po] = as_uint(r);
}

/* Note [OpenCL contiguous elementwise]
 * k_ew decodes a 5-D index per operand (15 64-bit divisions per element): on PoCL's CPU device that kept
 * the add of a 256 x 768 residual at ~0.2 GB/s. When the output and a are contiguous, k_ewc takes the flat
 * index, and b is either contiguous too (bper 0) or repeats with period bper (a bias over the leading
 * rows): b[i % bper]. Same arithmetic as k_ew, element for element. */
#define TANH_FAST(u) (1.0f - 2.0f / (exp(2.0f * (u)) + 1.0f)) /* tanh_fast for any float type */
#define EW_APPLY(NAME, T)                                                                                    \
    inline T NAME(int op, T x, T y, float f) {                                                               \
        switch (op) {                                                                                        \
        case EW_ADD:                                                                                         \
            return x + y;                                                                                    \
        case EW_MUL:                                                                                         \
            return x * y;                                                                                    \
        case EW_SCALE:                                                                                       \
            return x * f;                                                                                    \
        case EW_GELU:                                                                                        \
            return 0.5f * x * (1.0f + TANH_FAST(GELU_K * (x + 0.044715f * x * x * x)));                      \
        case EW_GELU_BACK: {                                                                                 \
            T u = GELU_K * (x + 0.044715f * x * x * x), t = TANH_FAST(u);                                    \
            T sech2 = 1.0f - t * t, du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);                         \
            return y * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);                                          \
        }                                                                                                    \
        case EW_SILU:                                                                                        \
            return x / (1.0f + exp(-x));                                                                     \
        case EW_SILU_BACK: {                                                                                 \
            T sg = 1.0f / (1.0f + exp(-x));                                                                  \
            return y * sg * (1.0f + x * (1.0f - sg));                                                        \
        }                                                                                                    \
        case EW_FILL:                                                                                        \
            return (T)(f);                                                                                   \
        case EW_COPY_B:                                                                                      \
            return y;                                                                                        \
        default:                                                                                             \
            return x;                                                                                        \
        }                                                                                                    \
    }
EW_APPLY(ew_apply, float)
EW_APPLY(ew_apply16, float16)

kernel void k_ewc(global uint *o, long oo, global const uint *a, long ao, global const uint *b, long bo, long bper,
                  int op, float f) {
    long i = get_global_id(0);
    if (op == EW_FILL) {
        o[oo + i] = as_uint(f);
        return;
    }
    uint ua = a[ao + i];
    if (op == EW_COPY_A) { /* bit copies: 32-bit data of any dtype */
        o[oo + i] = ua;
        return;
    }
    uint ub = b[bo + (bper ? i % bper : i)];
    o[oo + i] = op == EW_COPY_B ? ub : as_uint(ew_apply(op, as_float(ua), as_float(ub), f));
}

/* Note [OpenCL vector elementwise]
 * With o, a and b all contiguous (k_ewc's bper 0), k_ewv takes 16 elements per work-item as float16: the
 * op is one switch per 16 elements, and exp runs as PoCL's vector exp. k_ewc (one element per work-item,
 * the op switched per element, exp called per element) ran GELU over 256 x 3072 at ~4 ns per element on
 * PoCL's CPU device: GELU and its backward were 9.7 % of the GPT-2 124M step, more than attention.
 * The arithmetic is k_ewc's, lane by lane (ew_apply16 is ew_apply over float16). */
kernel void k_ewv(global uint *o, long oo, global const uint *a, long ao, global const uint *b, long bo, long n,
                  int op, float f) {
    const long i0 = get_global_id(0) * 16;
    o += oo, a += ao, b += bo;
    if (i0 + 16 <= n) {
        uint16 r;
        if (op == EW_FILL)
            r = (uint16)(as_uint(f));
        else if (op == EW_COPY_A)
            r = vload16(0, a + i0);
        else if (op == EW_COPY_B)
            r = vload16(0, b + i0);
        else
            r = as_uint16(ew_apply16(op, as_float16(vload16(0, a + i0)), as_float16(vload16(0, b + i0)), f));
        vstore16(r, 0, o + i0);
        return;
    }
    for (long i = i0; i < n; i++)
        o[i] = op == EW_FILL     ? as_uint(f)
               : op == EW_COPY_A ? a[i]
               : op == EW_COPY_B ? b[i]
                                 : as_uint(ew_apply(op, as_float(a[i]), as_float(b[i]), f));
}

/* o[i] = sum over r < R of a[r * P + i] (a contiguous, reduced over its leading rows, in row order as the
 * CPU adds them): the bias gradient */
kernel void k_sum_rows(global float *o, long oo, global const float *a, long ao, long R, long P) {
    long i = get_global_id(0);
    float acc = 0.0f;
    for (long r = 0; r < R; r++) acc += a[ao + r * P + i];
    o[oo + i] = acc;
}
/* the same over a bf16 a, each value widened exactly (the bias gradient of a Linear whose output is rounded
 * to bf16: Note [Rounded Linear outputs] in src/device/cpu/kernels/gemm.c, sl_sum_to in src/ops/build.c) */
kernel void k_sum_rows_b(global float *o, long oo, global const ushort *a, long ao, long R, long P) {
    long i = get_global_id(0);
    float acc = 0.0f;
    for (long r = 0; r < R; r++) acc += as_float((uint)a[ao + r * P + i] << 16);
    o[oo + i] = acc;
}

/* round to nearest even, quiet NaN (sl_f32_to_bf16 in suanli/base.h) */
inline ushort to_bf16(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40);
    return (ushort)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* op 0: 16-bit copy, 1: f32 -> bf16, 2: bf16 -> f32, 3: f32 -> f16, 4: f16 -> f32. The f16 conversions
 * are vstore_half_rte / vload_half, core OpenCL 1.2 (no cl_khr_fp16 needed: f16 is storage only, all
 * arithmetic stays f32; Note [OpenCL f16 storage] in opencl_ops.c). */
kernel void k_ew16(global uchar *o_, long oo, long8 nbo, global const uchar *a_, long ao, long8 nba, long8 ne, int op) {
    long i = get_global_id(0);
    long po = oo + off5(i, ne, nbo), pa = ao + off5(i, ne, nba);
    if (op == 0)
        ((global ushort *)o_)[po] = ((global const ushort *)a_)[pa];
    else if (op == 1)
        ((global ushort *)o_)[po] = to_bf16(((global const float *)a_)[pa]);
    else if (op == 2)
        ((global float *)o_)[po] = as_float((uint)((global const ushort *)a_)[pa] << 16);
    else if (op == 3)
        vstore_half_rte(((global const float *)a_)[pa], po, (global half *)o_);
    else
        ((global float *)o_)[po] = vload_half(pa, (global const half *)a_);
}

/* k_ew16 over contiguous tensors, 16 elements per work-item (Note [OpenCL vector elementwise]): the bf16 casts
 * and 16-bit copies as vectors, the f16 conversions element by element, without the 5-D index arithmetic
 * (which made the casts of a --bf16 GPT-2 124M step 68 % of it on PoCL's CPU device) */
kernel void k_ew16v(global uchar *o_, long oo, global const uchar *a_, long ao, long n, int op) {
    const long i0 = get_global_id(0) * 16, i1 = min(n, i0 + 16);
    global const float *af = (global const float *)a_ + ao;
    global const ushort *ah = (global const ushort *)a_ + ao;
    global float *of = (global float *)o_ + oo;
    global ushort *oh = (global ushort *)o_ + oo;
    if (i1 - i0 == 16 && op <= 2) {
        if (op == 0) {
            vstore16(vload16(0, ah + i0), 0, oh + i0);
        } else if (op == 1) { /* to_bf16 in lanes */
            uint16 u = as_uint16(vload16(0, af + i0));
            uint16 r = (u + (uint16)(0x7fffu) + ((u >> (uint16)(16)) & (uint16)(1u))) >> (uint16)(16);
            uint16 q = (u >> (uint16)(16)) | (uint16)(0x40u);
            vstore16(convert_ushort16(select(r, q, (u & (uint16)(0x7fffffffu)) > (uint16)(0x7f800000u))), 0, oh + i0);
        } else {
            vstore16(as_float16(convert_uint16(vload16(0, ah + i0)) << (uint16)(16)), 0, of + i0);
        }
        return;
    }
    for (long i = i0; i < i1; i++) {
        if (op == 0)
            oh[i] = ah[i];
        else if (op == 1)
            oh[i] = to_bf16(af[i]);
        else if (op == 2)
            of[i] = as_float((uint)ah[i] << 16);
        else if (op == 3)
            vstore_half_rte(af[i], oo + i, (global half *)o_);
        else
            of[i] = vload_half(ao + i, (global const half *)a_);
    }
}

/* o (contiguous, shape neo) = sum of a (shape ne, strides nba) over the dims where neo is 1 and ne is not.
 * One work-item per output element; the reduced elements are added in row-major order, as the CPU does. */
kernel void k_sum_to(global float *o, long oo, global const float *a, long ao, long8 ne, long8 nba, long8 neo) {
    long i = get_global_id(0);
    long c[5], n[5], s[5], red[5], m = 1;
    long rem = i;
    n[0] = ne.s0, n[1] = ne.s1, n[2] = ne.s2, n[3] = ne.s3, n[4] = ne.s4;
    s[0] = nba.s0, s[1] = nba.s1, s[2] = nba.s2, s[3] = nba.s3, s[4] = nba.s4;
    long q[5] = {neo.s0, neo.s1, neo.s2, neo.s3, neo.s4};
    for (int d = 4; d >= 0; d--) {
        c[d] = rem % q[d];
        rem /= q[d];
        red[d] = q[d] != n[d];
        if (red[d]) m *= n[d];
    }
    long base = ao;
    for (int d = 0; d < 5; d++)
        if (!red[d]) base += c[d] * s[d];
    float acc = 0.0f;
    for (long r = 0; r < m; r++) {
        long rr = r, p = base;
        for (int d = 4; d >= 0; d--)
            if (red[d]) {
                p += (rr % n[d]) * s[d];
                rr /= n[d];
            }
        acc += a[p];
    }
    o[oo + i] = acc;
}
