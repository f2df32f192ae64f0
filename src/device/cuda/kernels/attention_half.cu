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
 * row (2 T floats). Backward: the reference's (and OpenCL's) one item per (b, kv head) split three ways,
 * each value computed by the same operations in the same order (attention_half.cuh): a thread per query row
 * (b, h, t) for D_t and dq_t, a thread per key row and query head (b, h, j) for that head's dk_j / dv_j sums
 * (rows t ascending, the reference's order), and a thread per (b, kv head, j) rounding the group's heads into
 * dk_j / dv_j in head order (scratch: B NH T (1 + 2 hs) floats). tests/backend/test_cuda_kernels_host.cpp
 * runs these bodies on the CPU (scripts/cuda_kernels_on_host.sh) and finds the split bitwise equal to the
 * serial port of attention_half.cl in all four modes, with dropout and a window. Dropout of the
 * probabilities as in attention.cu (Note [CUDA dropout]). The rows are still serial loops over T (no tiles,
 * no shared memory): a numerics path first. Compiled by nvcc, not yet run on a GPU. */
#include "common.cuh"

#include "attention_half.cuh"


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

__global__ void k_attention_half_dq(float *out, float *Dsum, const float *lse, const float *q, cu_v5 qs,
                                    const float *k, cu_v5 ks, const float *v, cu_v5 vs, const float *g, cu_v5 gs,
                                    int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs, int64_t win,
                                    float scale, int hm, cu_drop dr) {
    CU_LOOP(idx, B * NH * T) {
        int64_t t = idx % T, h = (idx / T) % NH, b = idx / (T * NH);
        half_dq_row(out, Dsum, lse, q, qs, k, ks, v, vs, g, gs, T, NH, NKV, hs, win, scale, hm, dr, b, h, t);
    }
}

__global__ void k_attention_half_kv(float *Hk, float *Hv, const float *Dsum, const float *lse, const float *q,
                                    cu_v5 qs, const float *k, cu_v5 ks, const float *v, cu_v5 vs, const float *g,
                                    cu_v5 gs, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                                    int64_t win, float scale, int hm, cu_drop dr) {
    CU_LOOP(idx, B * NH * T) {
        int64_t j = idx % T, h = (idx / T) % NH, b = idx / (T * NH);
        half_kv_row(Hk, Hv, Dsum, lse, q, qs, k, ks, v, vs, g, gs, T, NH, NKV, hs, win, scale, hm, dr, b, h, j);
    }
}

__global__ void k_attention_half_combine(float *out, const float *Hk, const float *Hv, int64_t B, int64_t T,
                                         int64_t NH, int64_t NKV, int64_t hs, int hm) {
    CU_LOOP(idx, B * NKV * T) {
        int64_t j = idx % T, kh = (idx / T) % NKV, b = idx / (T * NKV);
        half_kv_combine(out, Hk, Hv, T, NH, NKV, hs, hm, b, kh, j);
    }
}

/* S: B NH T (1 + 2 hs) floats: D per row, then the per-head dk and dv sums */
extern "C" cudaError_t cu_attention_half_back(cudaStream_t s, float *out, const float *lse, const float *q,
                                              cu_v5 qs, const float *k, cu_v5 ks, const float *v, cu_v5 vs,
                                              const float *g, cu_v5 gs, int64_t B, int64_t T, int64_t NH,
                                              int64_t NKV, int64_t hs, int64_t win, float scale, int hm,
                                              cu_drop d, float *S) {
    int64_t rows = B * NH * T;
    if (rows <= 0) return cudaSuccess;
    float *Dsum = S, *Hk = S + rows, *Hv = Hk + rows * hs;
    k_attention_half_dq<<<cu_blocks(rows), CU_THREADS, 0, s>>>(out, Dsum, lse, q, qs, k, ks, v, vs, g, gs, B, T,
                                                               NH, NKV, hs, win, scale, hm, d);
    cudaError_t e = CU_LAUNCHED();
    if (e != cudaSuccess) return e;
    k_attention_half_kv<<<cu_blocks(rows), CU_THREADS, 0, s>>>(Hk, Hv, Dsum, lse, q, qs, k, ks, v, vs, g, gs, B,
                                                               T, NH, NKV, hs, win, scale, hm, d);
    e = CU_LAUNCHED();
    if (e != cudaSuccess) return e;
    k_attention_half_combine<<<cu_blocks(B * NKV * T), CU_THREADS, 0, s>>>(out, Hk, Hv, B, T, NH, NKV, hs, hm);
    return CU_LAUNCHED();
}
