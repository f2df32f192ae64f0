/* IEEE binary16 kernels of the CPU backend (issue 19): conversions and the f16 matmul. */
#include "device/cpu/kernels/f16.h"

#include <string.h>

#include "device/cpu/kernels/kernels.h"
#include "suanli/base.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SL_F16_X86 1
#endif

void sl_f16_from_f32_ref(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = sl_f32_to_f16(src[i]);
}
void sl_f16_to_f32_ref(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = sl_f16_to_f32(src[i]);
}

#ifdef SL_F16_X86
__attribute__((target("avx,f16c"))) static void from_f32_f16c(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(
            (__m128i *)(dst + i),
            _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    sl_f16_from_f32_ref(dst + i, src + i, n - i);
}
__attribute__((target("avx,f16c"))) static void to_f32_f16c(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    sl_f16_to_f32_ref(dst + i, src + i, n - i);
}
__attribute__((target("avx512f"))) static void from_f32_avx512(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256(
            (__m256i *)(dst + i),
            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    sl_f16_from_f32_ref(dst + i, src + i, n - i);
}
__attribute__((target("avx512f"))) static void to_f32_avx512(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    sl_f16_to_f32_ref(dst + i, src + i, n - i);
}
#endif

typedef enum { P_SCALAR, P_F16C, P_AVX512 } f16_path;
static f16_path path(void) {
    const sl_cpu_features *f = sl_cpu_features_get();
    if (f->avx512f) return P_AVX512; /* VCVTPS2PH/VCVTPH2PS zmm forms are AVX512F */
    if (f->f16c) return P_F16C;
    return P_SCALAR;
}
const char *sl_f16_path_name(void) {
    static const char *const names[] = {"scalar", "f16c", "avx512"};
    return names[path()];
}

void sl_f16_from_f32(uint16_t *dst, const float *src, int64_t n) {
#ifdef SL_F16_X86
    switch (path()) {
    case P_AVX512:
        from_f32_avx512(dst, src, n);
        return;
    case P_F16C:
        from_f32_f16c(dst, src, n);
        return;
    default:
        break;
    }
#endif
    sl_f16_from_f32_ref(dst, src, n);
}
void sl_f16_to_f32_n(float *dst, const uint16_t *src, int64_t n) {
#ifdef SL_F16_X86
    switch (path()) {
    case P_AVX512:
        to_f32_avx512(dst, src, n);
        return;
    case P_F16C:
        to_f32_f16c(dst, src, n);
        return;
    default:
        break;
    }
#endif
    sl_f16_to_f32_ref(dst, src, n);
}

/* Note [f16 GEMM]
 * The CPU has no fp16 dot-product instructions we target (AVX512_FP16 accumulates in fp16), so an f16 x f16
 * MATMUL widens both operands to f32 (exactly: every f16 is an f32) and runs the f32 GEMM, whose
 * accumulation is fp32: the numerics of an fp32-accumulating f16 GEMM, the speed of the f32 one plus the
 * widening pass. Each operand's whole storage span (first to last element, gaps included, so every stride
 * and view layout carries over unchanged) is widened into a scratch buffer allocated per call. The node is
 * then run as an f32 MATMUL on a copy of itself whose sources point at the scratch. */
static int64_t span_of(const sl_tensor *t) {
    int64_t s = 1;
    for (int d = 0; d < t->ndim; d++) s += (t->ne[d] - 1) * t->nb[d];
    return s;
}

sl_status sl_k_matmul_f16(sl_tensor *n) {
    sl_tensor a = *n->src[0], b = *n->src[1], node = *n;
    SL_ASSERT(a.dtype == SL_F16 && b.dtype == SL_F16);
    int64_t sa = span_of(&a), sb = span_of(&b);
    float *wa = sl_malloc_aligned(sizeof(float) * (size_t)(sa + sb));
    if (!wa)
        return sl_fail(SL_ERR_NOMEM, "matmul f16: out of memory for %lld widened elements",
                       (long long)(sa + sb));
    sl_f16_to_f32_n(wa, a.data, sa);
    sl_f16_to_f32_n(wa + sa, b.data, sb);
    a.dtype = b.dtype = SL_F32;
    a.data = wa;
    b.data = wa + sa;
    node.src[0] = &a;
    node.src[1] = &b;
    sl_status st = sl_k_matmul(&node);
    sl_free_aligned(wa);
    return st;
}
