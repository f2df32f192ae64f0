/* Llama-family kernels (port of src/device/opencl/kernels/llama.cl; semantics:
 * src/device/cpu/kernels/llama_ops.c): rotate-half RoPE, the top-k routing gate, the sparse MoE expert of
 * inference. RoPE has its half-precision numerics too (bf: the port of k_rope in ../opencl/kernels/llama.cl,
 * compiled by nvcc, not yet run on a GPU); the bf16-numerics MOE_EXPERT is refused by supports_op. */
#include "common.cuh"

/* y (B,T,NH,hs) contiguous; inv (hs/2): inverse frequencies computed on the host as the CPU does (Note [RoPE
 * numerics]); cos/sin of the float angle in double, as the CPU does. Half numerics: bf = 1 (bf16) or 2 (f16)
 * rounds every product and sum as the CPU does, round_cs also cos and sin first. */
__device__ __forceinline__ float rope_round(float x, int bf) { return bf == 2 ? rf16(x) : rbf16(x); }
__global__ void k_rope(float *y, const float *x, cu_v5 xs, const float *inv, int64_t B, int64_t T, int64_t NH,
                       int64_t hs, int64_t pos0, float sgn, int bf, int round_cs) {
    int64_t nh2 = hs / 2;
    CU_LOOP(idx, B * T * NH * nh2) {
        int64_t i = idx % nh2, h = (idx / nh2) % NH, t = (idx / (nh2 * NH)) % T, b = idx / (nh2 * NH * T);
        float ang = (float)(pos0 + t) * inv[i];
        float cs = (float)cos((double)ang), sn = sgn * (float)sin((double)ang);
        const float *xr = x + b * xs.v[0] + t * xs.v[1] + h * xs.v[2];
        float *yr = y + ((b * T + t) * NH + h) * hs;
        float x1 = xr[i], x2 = xr[i + nh2];
        if (round_cs) cs = rope_round(cs, bf), sn = rope_round(sn, bf);
        if (bf) {
            yr[i] = rope_round(rope_round(x1 * cs, bf) + rope_round(-x2 * sn, bf), bf);
            yr[i + nh2] = rope_round(rope_round(x2 * cs, bf) + rope_round(x1 * sn, bf), bf);
            continue;
        }
        yr[i] = x1 * cs - x2 * sn;
        yr[i + nh2] = x2 * cs + x1 * sn;
    }
}

extern "C" cudaError_t cu_rope(cudaStream_t s, float *y, const float *x, cu_v5 xs, const float *inv, int64_t B,
                               int64_t T, int64_t NH, int64_t hs, int64_t pos0, float sgn, int bf,
                               int round_cs) {
    int64_t n = B * T * NH * (hs / 2);
    if (n <= 0) return cudaSuccess;
    k_rope<<<cu_blocks(n), CU_THREADS, 0, s>>>(y, x, xs, inv, B, T, NH, hs, pos0, sgn, bf, round_cs);
    return CU_LAUNCHED();
}

/* softmax over the top-k logits of each row, zero elsewhere; ties go to the lower index */
__global__ void k_topk_gate(float *y, const float *x, int64_t xs, int64_t N, int64_t E, int k) {
    CU_LOOP(r, N) {
        const float *xr = x + r * xs;
        float *yr = y + r * E;
        for (int64_t e = 0; e < E; e++) yr[e] = 0.0f;
        float mx = -INFINITY;
        for (int j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++)
                if (yr[e] == 0.0f && (best < 0 || xr[e] > xr[best])) best = e;
            yr[best] = 1.0f; /* marker */
            if (xr[best] > mx) mx = xr[best];
        }
        double sm = 0;
        for (int64_t e = 0; e < E; e++)
            if (yr[e] != 0.0f) sm += exp((double)xr[e] - mx);
        for (int64_t e = 0; e < E; e++)
            if (yr[e] != 0.0f) yr[e] = (float)(exp((double)xr[e] - mx) / sm);
    }
}

extern "C" cudaError_t cu_topk_gate(cudaStream_t s, float *y, const float *x, int64_t xs, int64_t N, int64_t E,
                                    int k) {
    if (N <= 0) return cudaSuccess;
    k_topk_gate<<<cu_blocks(N), CU_THREADS, 0, s>>>(y, x, xs, N, E, k);
    return CU_LAUNCHED();
}

/* step 1: a[r, i] = silu(h_r . w1_i) * (h_r . w3_i) for the rows routed to e (gate[r, e] != 0) */
__global__ void k_moe_up(float *a, const float *hh, const float *gate, int64_t gs, int64_t e, const float *w1,
                         const float *w3, int64_t N, int64_t C, int64_t I) {
    CU_LOOP(idx, N * I) {
        int64_t r = idx / I, i = idx % I;
        if (gate[r * gs + e] == 0.0f) continue;
        const float *hr = hh + r * C, *p1 = w1 + i * C, *p3 = w3 + i * C;
        float u = 0.0f, g = 0.0f;
        for (int64_t c = 0; c < C; c++) {
            u += hr[c] * p1[c];
            g += hr[c] * p3[c];
        }
        float sl = u / (1.0f + expf(-u));
        a[idx] = sl * g;
    }
}

/* step 2: y[r, c] = gate[r, e] * (a_r . w2_c), zero for rows not routed to e */
__global__ void k_moe_down(float *y, const float *a, const float *gate, int64_t gs, int64_t e, const float *w2,
                           int64_t N, int64_t C, int64_t I) {
    CU_LOOP(idx, N * C) {
        int64_t r = idx / C, c = idx % C;
        float gw = gate[r * gs + e];
        if (gw == 0.0f) {
            y[idx] = 0.0f;
            continue;
        }
        const float *ar = a + r * I, *wr = w2 + c * I;
        float sm = 0.0f;
        for (int64_t i = 0; i < I; i++) sm += ar[i] * wr[i];
        y[idx] = sm * gw;
    }
}

extern "C" cudaError_t cu_moe_up(cudaStream_t s, float *a, const float *h, const float *gate, int64_t gs,
                                 int64_t e, const float *w1, const float *w3, int64_t N, int64_t C, int64_t I) {
    if (N * I <= 0) return cudaSuccess;
    k_moe_up<<<cu_blocks(N * I), CU_THREADS, 0, s>>>(a, h, gate, gs, e, w1, w3, N, C, I);
    return CU_LAUNCHED();
}

extern "C" cudaError_t cu_moe_down(cudaStream_t s, float *y, const float *a, const float *gate, int64_t gs,
                                   int64_t e, const float *w2, int64_t N, int64_t C, int64_t I) {
    if (N * C <= 0) return cudaSuccess;
    k_moe_down<<<cu_blocks(N * C), CU_THREADS, 0, s>>>(y, a, gate, gs, e, w2, N, C, I);
    return CU_LAUNCHED();
}
