/* k_gemm: C = op(A) op(B) [+ bias] [+ C], fp32, tiled in local memory, for GPU-type devices (Note [OpenCL
 * GEMM tiles] in opencl_backend.c; CPU-type devices use k_gemm_reg in gemm_reg.cl). TS and TK come from the build options. A work-group computes a TS x TS block of C;
 * work-item (tx, ty) computes the 4 x 4 elements (ty + i*TS/4, tx + j*TS/4), so neighbouring work-items
 * read neighbouring local-memory words. Up to three batch dims (bne) with their own strides per operand. */
#pragma OPENCL FP_CONTRACT OFF

#define WPT 4
#define RTS (TS / WPT)

kernel __attribute__((reqd_work_group_size(RTS, RTS, 1))) void
k_gemm(int M, int N, int K, global const float *A, long ao, long lda, int tA, global const float *B, long bo, long ldb,
       int tB, global float *C, long co, long ldc, int beta1, global const float *bias, long biaso, int has_bias,
       long4 bne, long4 bsa, long4 bsb, long4 bsc) {
    local float As[TK][TS + 1]; /* +1: the row-major loads write columns at stride TS + 1 words, which */
    local float Bs[TK][TS + 1]; /* lands consecutive work-items in different local-memory banks */
    const int tx = get_local_id(0), ty = get_local_id(1), tid = ty * RTS + tx;
    const int col0 = get_group_id(0) * TS, row0 = get_group_id(1) * TS;
    long z = get_global_id(2);
    long i2 = z % bne.s2, i1 = (z / bne.s2) % bne.s1, i0 = z / (bne.s2 * bne.s1);
    A += ao + i0 * bsa.s0 + i1 * bsa.s1 + i2 * bsa.s2;
    B += bo + i0 * bsb.s0 + i1 * bsb.s1 + i2 * bsb.s2;
    C += co + i0 * bsc.s0 + i1 * bsc.s1 + i2 * bsc.s2;
    float acc[WPT][WPT];
    for (int i = 0; i < WPT; i++)
        for (int j = 0; j < WPT; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int e = tid; e < TK * TS; e += RTS * RTS) {
            int kk, mm;
            if (tA) { /* A^T: rows of A are k, consecutive m are adjacent */
                kk = e / TS, mm = e % TS;
            } else {
                mm = e / TK, kk = e % TK;
            }
            int gm = row0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? (tA ? A[(long)gk * lda + gm] : A[(long)gm * lda + gk]) : 0.0f;
            int nn, k2;
            if (tB) {
                nn = e / TK, k2 = e % TK;
            } else {
                k2 = e / TS, nn = e % TS;
            }
            int gn = col0 + nn, gk2 = k0 + k2;
            Bs[k2][nn] = (gn < N && gk2 < K) ? (tB ? B[(long)gn * ldb + gk2] : B[(long)gk2 * ldb + gn]) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TK; kk++) {
            float a[WPT], b[WPT];
            for (int i = 0; i < WPT; i++) a[i] = As[kk][ty + i * RTS];
            for (int j = 0; j < WPT; j++) b[j] = Bs[kk][tx + j * RTS];
            for (int i = 0; i < WPT; i++)
                for (int j = 0; j < WPT; j++) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < WPT; i++) {
        int gm = row0 + ty + i * RTS;
        if (gm >= M) continue;
        for (int j = 0; j < WPT; j++) {
            int gn = col0 + tx + j * RTS;
            if (gn >= N) continue;
            float v = acc[i][j];
            if (has_bias) v += bias[biaso + gn];
            global float *c = C + (long)gm * ldc + gn;
            if (beta1) v = *c + v;
            *c = v;
        }
    }
}
