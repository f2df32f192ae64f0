/* State kernels: AdamW over one span (Note [AdamW order of operations] in src/device/cpu/kernels/optim.c:
 * the same single-precision operations in the same order, no contraction) and the gradient sum of squares
 * in double (the CPU's chunk and lane order; needs cl_khr_fp64). Scale and fill are k_ew. */
#pragma OPENCL FP_CONTRACT OFF

kernel void k_adamw(global float *p, long po, global const float *g, long go, global float *m, global float *v, long so,
                    float decay, float gscale, float b1, float b2, float eps, float step_size, float bc2_sqrt) {
    long k = get_global_id(0);
    float gk = g[go + k] * gscale;
    float pk = p[po + k] * decay;
    float mk = m[so + k], vk = v[so + k];
    mk += (1.0f - b1) * (gk - mk);
    vk = vk * b2 + (1.0f - b2) * gk * gk;
    float denom = sqrt(vk) / bc2_sqrt + eps;
    pk += -step_size * (mk / denom);
    m[so + k] = mk;
    v[so + k] = vk;
    p[po + k] = pk;
}

#ifdef SL_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
/* part[c] = sum of squares of chunk c (65536 elements) of x[off .. off + n): 8 lanes (lane j takes
 * k = j mod 8) combined as ((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7)), then the tail; exactly the CPU's order */
kernel void k_sumsq(global const float *x, long off, long n, global double *part) {
    long c = get_global_id(0), a = c * 65536, e = a + 65536 < n ? a + 65536 : n;
    global const float *g = x + off + a;
    long len = e - a, k = 0;
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; k + 8 <= len; k += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)g[k + j] * (double)g[k + j];
    double s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; k < len; k++) s += (double)g[k] * (double)g[k];
    part[c] = s;
}
#endif
