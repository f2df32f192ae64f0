/* ATen's float summation order (Note [ATen's summation order] in aten_sum.c), for kernels whose sums
 * must round as PyTorch's CPU kernels round theirs. */
#ifndef SL_CPU_ATEN_SUM_H
#define SL_CPU_ATEN_SUM_H
#include <stdint.h>

/* sum of p[0 .. n) as torch.sum over a contiguous last dimension of that length */
float sl_aten_row_sum(const float *p, int64_t n);
/* out[c] = sum over rows r < R of p[r * ld + c], for c < C, as torch.sum over the outer dimension of a
 * (R, C) row-major tensor with row stride ld (each column in ATen's order for its place in the row) */
void sl_aten_col_sums(const float *p, int64_t R, int64_t C, int64_t ld, float *out);
#endif
