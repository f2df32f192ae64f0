/* Hidden dropout (SL_OP_DROPOUT; semantics: sl_k_dropout in src/device/cpu/kernels/elementwise.c): o = x * m,
 * or r + x * m with a residual r (the product rounded, then the add: FP_CONTRACT is off), m the multipliers
 * of Note [OpenCL dropout] (0_common.cl). The node is nb blocks of blk contiguous elements: one block (nb =
 * 1) whose element i is number i of the site, or, for a sequence shard (seq > 0), batch row b of (B, Tl, R)
 * holding positions [t0, + Tl) of a sequence of seq, whose element i is number (b seq + t0) R + i. One
 * work-item per counter block of four numbers (per + 1 blocks a row cover any alignment), so each Philox
 * block is drawn once. */
#pragma OPENCL FP_CONTRACT OFF

kernel void k_dropout(global float *o, long oo, global const float *x, long xo, global const float *r, long ro,
                      int has_r, long blk, long per, long R, long seq, long t0, ulong seed, ulong hi, uint thr,
                      float keep) {
    long g = get_global_id(0), b = g / per, q = g % per;
    ulong eb = seq > 0 ? (ulong)((b * seq + t0) * R) : (ulong)(b * blk);
    ulong c = (eb >> 2) + (ulong)q;
    uint4 w = philox4x32(seed, hi, c);
    for (uint l = 0; l < 4; l++) {
        ulong e = 4 * c + l;
        if (e < eb || e >= eb + (ulong)blk) continue;
        long i = b * blk + (long)(e - eb);
        float v = x[xo + i] * (word4(w, l) >= thr ? keep : 0.0f);
        o[oo + i] = has_r ? r[ro + i] + v : v;
    }
}
