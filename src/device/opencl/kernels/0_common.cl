/* Helpers used by several kernel files. The sources are compiled as one program in file-name order, so
 * this file's name sorts first: counter-based dropout masks (Note [Dropout from counters], src/ops/build.c;
 * attention.cl, attention_half.cl, dropout.cl) and the roundings to bf16 / f16 (gemm_reg.cl,
 * attention_half.cl).
 *
 * Note [OpenCL dropout]
 * philox4x32 is src/base/rng.c's sl_philox4x32 bit for bit (mul_hi gives the high words of the 32 x 32
 * products), so a kernel draws the CPU's mask: element e of a dropout site is kept iff word e % 4 of
 * Philox-4x32-10(key = seed, counter = (hi, e / 4)) >= thr, thr = sl_dropout_threshold(p), and a kept value
 * is multiplied by keep = (float)(1 / (1 - p)) computed on the host in double, as torch and the CPU do. The
 * host passes seed, hi = stream * 2^16 + site, thr and keep (drop = 0: no dropout, the multiplier is 1 and
 * no word is drawn). */
#pragma OPENCL FP_CONTRACT OFF
#ifdef SL_FP64 /* the device has doubles: the files after this one use them where the CPU does */
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

inline uint4 philox4x32(ulong key, ulong hi, ulong lo) {
    uint c0 = (uint)lo, c1 = (uint)(lo >> 32), c2 = (uint)hi, c3 = (uint)(hi >> 32);
    uint k0 = (uint)key, k1 = (uint)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint l0 = 0xD2511F53u * c0, h0 = mul_hi(0xD2511F53u, c0);
        uint l1 = 0xCD9E8D57u * c2, h1 = mul_hi(0xCD9E8D57u, c2);
        uint n0 = h1 ^ c1 ^ k0, n2 = h0 ^ c3 ^ k1;
        c0 = n0;
        c1 = l1;
        c2 = n2;
        c3 = l0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return (uint4)(c0, c1, c2, c3);
}

inline uint word4(uint4 w, uint l) { return l == 0 ? w.s0 : l == 1 ? w.s1 : l == 2 ? w.s2 : w.s3; }

/* the last counter block drawn, so consecutive elements of a row draw each block once */
typedef struct drop_cache {
    ulong c;
    uint4 w;
    int valid;
} drop_cache;

/* the dropout multiplier of element e: keep or 0 */
inline float drop_at(drop_cache *dc, ulong seed, ulong hi, ulong e, uint thr, float keep) {
    ulong c = e >> 2;
    if (!dc->valid || dc->c != c) {
        dc->w = philox4x32(seed, hi, c);
        dc->c = c;
        dc->valid = 1;
    }
    return word4(dc->w, (uint)(e & 3)) >= thr ? keep : 0.0f;
}

/* x rounded to bf16 and widened back, exactly as sl_f32_to_bf16 (round to nearest even; a NaN keeps its high
 * half with the quiet bit set) */
inline float rbf16(float x) {
    uint u = as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return as_float((u & 0xffff0000u) | 0x00400000u);
    return as_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
inline float16 rbf16_16(float16 v) {
    uint16 u = as_uint16(v);
    uint16 r = (u + (uint16)(0x7fffu) + ((u >> (uint16)(16)) & (uint16)(1u))) & (uint16)(0xffff0000u);
    uint16 q = (u & (uint16)(0xffff0000u)) | (uint16)(0x00400000u);
    return as_float16(select(r, q, (u & (uint16)(0x7fffffffu)) > (uint16)(0x7f800000u)));
}
/* x rounded to IEEE binary16 (nearest even, overflow to inf) and widened back: the CAST kernels' rounding,
 * through the core vstore_half_rte / vload_half (no cl_khr_fp16 needed) */
inline float rf16(float x) {
    ushort h;
    vstore_half_rte(x, 0, (private half *)&h);
    return vload_half(0, (private const half *)&h);
}
