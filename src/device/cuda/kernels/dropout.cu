/* Hidden dropout (SL_OP_DROPOUT; port of src/device/opencl/kernels/dropout.cl, semantics: sl_k_dropout in
 * src/device/cpu/kernels/elementwise.c): o = x * m, or r + x * m with a residual r (the product rounded, then
 * the add: nvcc --fmad=false), m the multipliers of Note [CUDA dropout] (common.cuh). The node is nb blocks
 * of blk contiguous elements: one block (nb = 1) whose element i is number i of the site, or, for a sequence
 * shard (seq > 0), batch row b of (B, Tl, R) holding positions [t0, + Tl) of a sequence of seq, whose element
 * i is number (b seq + t0) R + i. One thread per counter block of four numbers (per = blk / 4 + 2 blocks a
 * row cover any alignment), so each Philox block is drawn once. Compiled by nvcc, not yet run on a GPU. */
#include "common.cuh"

__global__ void k_dropout(float *o, const float *x, const float *r, int64_t nb, int64_t blk, int64_t per,
                          int64_t R, int64_t seq, int64_t t0, cu_drop d) {
    CU_LOOP(g, nb * per) {
        int64_t b = g / per, q = g % per;
        uint64_t eb = seq > 0 ? (uint64_t)((b * seq + t0) * R) : (uint64_t)(b * blk);
        uint64_t c = (eb >> 2) + (uint64_t)q;
        cu_u4 w = philox4x32(d.seed, d.hi, c);
        for (uint32_t l = 0; l < 4; l++) {
            uint64_t e = 4 * c + l;
            if (e < eb || e >= eb + (uint64_t)blk) continue;
            int64_t i = b * blk + (int64_t)(e - eb);
            float v = x[i] * (w.w[l] >= d.thr ? d.keep : 0.0f);
            o[i] = r ? r[i] + v : v;
        }
    }
}

extern "C" cudaError_t cu_dropout(cudaStream_t s, float *o, const float *x, const float *r, int64_t nb,
                                  int64_t blk, int64_t R, int64_t seq, int64_t t0, cu_drop d) {
    int64_t per = blk / 4 + 2;
    if (nb * blk <= 0) return cudaSuccess;
    k_dropout<<<cu_blocks(nb * per), CU_THREADS, 0, s>>>(o, x, r, nb, blk, per, R, seq, t0, d);
    return CU_LAUNCHED();
}
