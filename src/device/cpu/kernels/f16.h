/* IEEE binary16 (SL_F16) on the CPU: bulk f32 <-> f16 conversions (scalar reference + F16C / AVX-512
 * paths chosen at run time) and the f16 kernels (CAST rows, MATMUL of f16 x f16 with fp32 accumulation). */
#ifndef SL_CPU_F16_H
#define SL_CPU_F16_H
#include "suanli/tensor.h"

/* n values, round to nearest even (sl_f32_to_f16); the *_ref forms are the scalar oracle. */
void sl_f16_from_f32(uint16_t *dst, const float *src, int64_t n);
void sl_f16_to_f32_n(float *dst, const uint16_t *src, int64_t n);
void sl_f16_from_f32_ref(uint16_t *dst, const float *src, int64_t n);
void sl_f16_to_f32_ref(float *dst, const uint16_t *src, int64_t n);
/* "avx512", "f16c" or "scalar": the path sl_f16_from_f32 takes (SUANLI_ISA narrows it) */
const char *sl_f16_path_name(void);
/* MATMUL with f16 operands: see Note [f16 GEMM] in f16.c */
sl_status sl_k_matmul_f16(sl_tensor *n);
#endif
