/* Elementwise and data-movement kernels (port of src/device/opencl/kernels/elementwise.cl; semantics:
 * src/device/cpu/kernels/elementwise.c and llama_ops.c): cu_ew (every 32-bit elementwise op over a strided
 * 5-D iteration space), cu_ew16 (16-bit copies, f32 <-> bf16 and f32 <-> f16 casts, bf16 rounding), cu_sum_to.
 * The f16 conversions are the CPU's sl_f32_to_f16 / sl_f16_to_f32 (common.cuh): Note [CUDA f16 storage]. */
#include "common.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

__global__ void k_ew(uint32_t *o, cu_v5 nbo, const uint32_t *a, cu_v5 nba, const uint32_t *b, cu_v5 nbb, cu_v5 ne,
                     int64_t n, int op, float f) {
    CU_LOOP(i, n) {
        int64_t po = off5(i, ne, nbo);
        if (op == CU_EW_FILL) {
            o[po] = __float_as_uint(f);
            continue;
        }
        uint32_t ua = a[off5(i, ne, nba)];
        if (op == CU_EW_COPY_A) {
            o[po] = ua;
            continue;
        }
        float x = __uint_as_float(ua), y = 0.0f;
        if (op == CU_EW_ADD || op == CU_EW_MUL || op == CU_EW_GELU_BACK || op == CU_EW_SILU_BACK ||
            op == CU_EW_COPY_B) {
            uint32_t ub = b[off5(i, ne, nbb)];
            if (op == CU_EW_COPY_B) {
                o[po] = ub;
                continue;
            }
            y = __uint_as_float(ub);
        }
        float r;
        switch (op) {
        case CU_EW_ADD:
            r = x + y;
            break;
        case CU_EW_MUL:
            r = x * y;
            break;
        case CU_EW_SCALE:
            r = x * f;
            break;
        case CU_EW_GELU:
            r = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
            break;
        case CU_EW_GELU_BACK: {
            float u = GELU_K * (x + 0.044715f * x * x * x), t = tanhf(u);
            float sech2 = 1.0f - t * t, du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
            r = y * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);
            break;
        }
        case CU_EW_SILU:
            r = x / (1.0f + expf(-x));
            break;
        case CU_EW_SILU_BACK: {
            float sg = 1.0f / (1.0f + expf(-x));
            r = y * sg * (1.0f + x * (1.0f - sg));
            break;
        }
        default:
            r = x;
        }
        o[po] = __float_as_uint(r);
    }
}

static int64_t count5(const cu_v5 &ne) { return ne.v[0] * ne.v[1] * ne.v[2] * ne.v[3] * ne.v[4]; }

extern "C" cudaError_t cu_ew(cudaStream_t s, int op, float f, void *o, cu_v5 nbo, const void *a, cu_v5 nba,
                             const void *b, cu_v5 nbb, cu_v5 ne) {
    int64_t n = count5(ne);
    if (n <= 0) return cudaSuccess;
    k_ew<<<cu_blocks(n), CU_THREADS, 0, s>>>((uint32_t *)o, nbo, (const uint32_t *)a, nba, (const uint32_t *)b, nbb,
                                             ne, n, op, f);
    return CU_LAUNCHED();
}

__global__ void k_ew16(void *o_, cu_v5 nbo, const void *a_, cu_v5 nba, cu_v5 ne, int64_t n, int op) {
    CU_LOOP(i, n) {
        int64_t po = off5(i, ne, nbo), pa = off5(i, ne, nba);
        if (op == CU_EW16_COPY)
            ((uint16_t *)o_)[po] = ((const uint16_t *)a_)[pa];
        else if (op == CU_EW16_F32_TO_BF16)
            ((uint16_t *)o_)[po] = f32_to_bf16(((const float *)a_)[pa]);
        else if (op == CU_EW16_BF16_TO_F32)
            ((float *)o_)[po] = bf16_to_f32(((const uint16_t *)a_)[pa]);
        else if (op == CU_EW16_F32_TO_F16)
            ((uint16_t *)o_)[po] = f32_to_f16(((const float *)a_)[pa]);
        else if (op == CU_EW16_F16_TO_F32)
            ((float *)o_)[po] = f16_to_f32(((const uint16_t *)a_)[pa]);
        else
            ((float *)o_)[po] = bf16_to_f32(f32_to_bf16(((const float *)a_)[pa]));
    }
}

extern "C" cudaError_t cu_ew16(cudaStream_t s, int op, void *o, cu_v5 nbo, const void *a, cu_v5 nba, cu_v5 ne) {
    int64_t n = count5(ne);
    if (n <= 0) return cudaSuccess;
    k_ew16<<<cu_blocks(n), CU_THREADS, 0, s>>>(o, nbo, a, nba, ne, n, op);
    return CU_LAUNCHED();
}

/* one thread per output element; the reduced elements are added in row-major order, as the CPU does */
__global__ void k_sum_to(float *o, const float *a, cu_v5 ne, cu_v5 nba, cu_v5 neo, int64_t n_out) {
    CU_LOOP(i, n_out) {
        int64_t c[5], rem = i, m = 1;
        int red[5];
        for (int d = 4; d >= 0; d--) {
            c[d] = rem % neo.v[d];
            rem /= neo.v[d];
            red[d] = neo.v[d] != ne.v[d];
            if (red[d]) m *= ne.v[d];
        }
        int64_t base = 0;
        for (int d = 0; d < 5; d++)
            if (!red[d]) base += c[d] * nba.v[d];
        float acc = 0.0f;
        for (int64_t r = 0; r < m; r++) {
            int64_t rr = r, p = base;
            for (int d = 4; d >= 0; d--)
                if (red[d]) {
                    p += (rr % ne.v[d]) * nba.v[d];
                    rr /= ne.v[d];
                }
            acc += a[p];
        }
        o[i] = acc;
    }
}

extern "C" cudaError_t cu_sum_to(cudaStream_t s, float *o, const float *a, cu_v5 ne, cu_v5 nba, cu_v5 neo,
                                 int64_t n_out) {
    if (n_out <= 0) return cudaSuccess;
    k_sum_to<<<cu_blocks(n_out), CU_THREADS, 0, s>>>(o, a, ne, nba, neo, n_out);
    return CU_LAUNCHED();
}
