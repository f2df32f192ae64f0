/* AVX-512 instantiation of vec_kernels.inc (16 fp32 lanes; tails by lane masks). */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/simd_math.h"
#include "device/cpu/kernels/vec_kernels.h"

#if SL_HAVE_X86
#pragma GCC push_options
/* fp-contract off: a product is fused into an add only where the source says VFMA (exact cancellation
 * in e.g. layernorm backward with C = 1 depends on it) */
#pragma GCC optimize("fp-contract=off")
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")

typedef __m512 vf;
#define VL 16
#define VZERO _mm512_setzero_ps()
#define VSET1 _mm512_set1_ps
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VMAX _mm512_max_ps
#define VFMA _mm512_fmadd_ps   /* a*b + c */
#define VFNMA _mm512_fnmadd_ps /* c - a*b */
#define VEXP sl_exp_avx512
#define VTANH sl_tanh_avx512
#define VHSUM _mm512_reduce_add_ps
#define VHMAX _mm512_reduce_max_ps
/* n in [0, VL]: lanes >= n read as `fill` / are not written */
#define VLOADN(p, n, fill) _mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)((1u << (n)) - 1u), (p))
#define VSTOREN(p, v, n) _mm512_mask_storeu_ps((p), (__mmask16)((1u << (n)) - 1u), (v))
#define FN(name) v512_##name
#define VEC_TABLE sl_vec_ops_avx512
#define VEC_NAME "avx512"

#include "device/cpu/kernels/vec_kernels.inc"

#pragma GCC pop_options
#else
const sl_vec_ops sl_vec_ops_avx512 = {0};
#endif
