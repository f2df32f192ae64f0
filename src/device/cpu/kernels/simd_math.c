/* ISA choice of the non-GEMM kernels (see simd_math.h, vec_kernels.h). */
#include "device/cpu/kernels/simd_math.h"

#include "device/cpu/kernels/vec_kernels.h"
#include "suanli/base.h"

static int g_forced = -1;
static const sl_vec_ops *g_vec_test;

void sl_vec_set_for_test(const sl_vec_ops *ops) { g_vec_test = ops; }

static int detected(void) {
    const sl_cpu_features *f = sl_cpu_features_get();
    if (f->avx512f && f->avx512bw && f->avx512vl && f->fma) return SL_KISA_AVX512;
    if (f->avx2 && f->fma) return SL_KISA_AVX2;
    return SL_KISA_SCALAR;
}

int sl_kern_isa(void) {
    int d = detected();
    return g_forced >= 0 && g_forced < d ? g_forced : d;
}

void sl_kern_isa_force(int isa) { g_forced = isa; }

const char *sl_kern_isa_name(int isa) {
    return isa == SL_KISA_AVX512 ? "avx512" : isa == SL_KISA_AVX2 ? "avx2" : "scalar";
}

const sl_vec_ops *sl_vec(void) {
    if (g_vec_test) return g_vec_test;
#if SL_HAVE_X86
    switch (sl_kern_isa()) {
    case SL_KISA_AVX512:
        return &sl_vec_ops_avx512;
    case SL_KISA_AVX2:
        return &sl_vec_ops_avx2;
    default:
        return NULL;
    }
#else
    return NULL;
#endif
}
