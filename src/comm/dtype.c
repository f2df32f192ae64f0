/* Element types, reduction kernels, f16 conversion, names. */
#pragma GCC optimize("O3") /* the reduction loops are memory bound; let GCC vectorise them */
#include <math.h>
#include <string.h>

#include "comm/comm_internal.h"

static const size_t dtype_sizes[] = {4, 2, 2, 8, 4, 8, 1};
static const char *dtype_names[] = {"f32", "bf16", "f16", "f64", "i32", "i64", "u8"};
static const char *redop_names[] = {"sum", "prod", "max", "min", "avg"};
static const char *transport_names[] = {"auto", "shm", "tcp", "mpi", "loopback", "hybrid"};
static const char *algo_names[] = {"auto", "ring", "rd", "direct", "hier"};
_Static_assert(sizeof dtype_sizes / sizeof dtype_sizes[0] == SL_COMM_DTYPE_COUNT, "dtype table");
_Static_assert(sizeof dtype_names / sizeof dtype_names[0] == SL_COMM_DTYPE_COUNT, "dtype table");
_Static_assert(sizeof redop_names / sizeof redop_names[0] == SL_COMM_REDOP_COUNT, "redop table");
_Static_assert(sizeof transport_names / sizeof transport_names[0] == SL_COMM_TRANSPORT_COUNT, "tp");
_Static_assert(sizeof algo_names / sizeof algo_names[0] == SL_COMM_ALGO_COUNT, "algo table");

size_t sl_comm_dtype_size(sl_comm_dtype dt) {
    return (unsigned)dt < SL_COMM_DTYPE_COUNT ? dtype_sizes[dt] : 0;
}
const char *sl_comm_dtype_name(sl_comm_dtype dt) {
    return (unsigned)dt < SL_COMM_DTYPE_COUNT ? dtype_names[dt] : "?";
}
const char *sl_comm_redop_name(sl_comm_redop op) {
    return (unsigned)op < SL_COMM_REDOP_COUNT ? redop_names[op] : "?";
}
const char *sl_comm_transport_name(sl_comm_transport_kind k) {
    return (unsigned)k < SL_COMM_TRANSPORT_COUNT ? transport_names[k] : "?";
}
const char *sl_comm_algo_name(sl_comm_algo a) {
    return (unsigned)a < SL_COMM_ALGO_COUNT ? algo_names[a] : "?";
}

uint16_t sl_comm_f32_to_f16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    uint32_t u = v.u, sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (u >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow (rounds) -> inf */
    if (u < 0x38800000u) {                                   /* subnormal or zero in f16 */
        if (u < 0x33000000u) return (uint16_t)sign;          /* < half the smallest subnormal */
        uint32_t m = (u & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(u >> 23); /* value = m * 2^(e-150) = r * 2^-24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = u - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t h = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float sl_comm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        if (m == 0)
            u = sign;
        else { /* subnormal: normalise */
            int k = 0;
            while (!(m & 0x400u)) {
                m <<= 1;
                k++;
            }
            m &= 0x3ffu;
            u = sign | ((uint32_t)(127 - 15 + 1 - k) << 23) | (m << 13);
        }
    } else if (e == 31)
        u = sign | 0x7f800000u | (m << 13);
    else
        u = sign | ((e + 112) << 23) | (m << 13);
    union {
        uint32_t u;
        float f;
    } v = {u};
    return v.f;
}

#define OP_SUM(x, y) ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MAX(x, y) ((x) > (y) ? (x) : (y))
#define OP_MIN(x, y) ((x) < (y) ? (x) : (y))

/* The reduction loops are compiled twice, for AVX2 and for the baseline, and the loader picks one by
 * CPUID (ifunc). Element-wise IEEE operations in the same order: both give the same bits. AVX2 measured
 * +20 % on the window all-reduce and +30 % on the staged one at 1 MiB (in-cache; docs/BENCHMARKS-comm.md). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SL_CLONES
#endif
#define DEF_NATIVE(NAME, T, OPM)                                                                             \
    SL_CLONES static void NAME(void *d_, const void *a_, const void *b_, size_t n) {                         \
        T *d = d_;                                                                                           \
        const T *a = a_, *b = b_;                                                                            \
        for (size_t i = 0; i < n; i++) d[i] = OPM(a[i], b[i]);                                               \
    }
#define DEF_HALF(NAME, TO32, FROM32, OPM)                                                                    \
    SL_CLONES static void NAME(void *d_, const void *a_, const void *b_, size_t n) {                         \
        uint16_t *d = d_;                                                                                    \
        const uint16_t *a = a_, *b = b_;                                                                     \
        for (size_t i = 0; i < n; i++) {                                                                     \
            float x = TO32(a[i]), y = TO32(b[i]);                                                            \
            d[i] = FROM32(OPM(x, y));                                                                        \
        }                                                                                                    \
    }
#define DEF_ALL(T, SUF)                                                                                      \
    DEF_NATIVE(sum_##SUF, T, OP_SUM)                                                                         \
    DEF_NATIVE(prod_##SUF, T, OP_PROD)                                                                       \
    DEF_NATIVE(max_##SUF, T, OP_MAX)                                                                         \
    DEF_NATIVE(min_##SUF, T, OP_MIN)
DEF_ALL(float, f32)
DEF_ALL(double, f64)
DEF_NATIVE(max_i32, int32_t, OP_MAX)
DEF_NATIVE(min_i32, int32_t, OP_MIN)
DEF_NATIVE(max_i64, int64_t, OP_MAX)
DEF_NATIVE(min_i64, int64_t, OP_MIN)
#define DEF_HALF_ALL(SUF, TO32, FROM32)                                                                      \
    DEF_HALF(sum_##SUF, TO32, FROM32, OP_SUM)                                                                \
    DEF_HALF(prod_##SUF, TO32, FROM32, OP_PROD)                                                              \
    DEF_HALF(max_##SUF, TO32, FROM32, OP_MAX)                                                                \
    DEF_HALF(min_##SUF, TO32, FROM32, OP_MIN)
DEF_HALF_ALL(bf16, sl_bf16_to_f32, sl_f32_to_bf16)
DEF_HALF_ALL(f16, sl_comm_f16_to_f32, sl_comm_f32_to_f16)

/* Integer sum/prod wrap like unsigned arithmetic (no UB on overflow). */
SL_CLONES static void sum_i32w(void *d_, const void *a_, const void *b_, size_t n) {
    int32_t *d = d_;
    const int32_t *a = a_, *b = b_;
    for (size_t i = 0; i < n; i++) d[i] = (int32_t)((uint32_t)a[i] + (uint32_t)b[i]);
}
SL_CLONES static void prod_i32w(void *d_, const void *a_, const void *b_, size_t n) {
    int32_t *d = d_;
    const int32_t *a = a_, *b = b_;
    for (size_t i = 0; i < n; i++) d[i] = (int32_t)((uint32_t)a[i] * (uint32_t)b[i]);
}
SL_CLONES static void sum_i64w(void *d_, const void *a_, const void *b_, size_t n) {
    int64_t *d = d_;
    const int64_t *a = a_, *b = b_;
    for (size_t i = 0; i < n; i++) d[i] = (int64_t)((uint64_t)a[i] + (uint64_t)b[i]);
}
SL_CLONES static void prod_i64w(void *d_, const void *a_, const void *b_, size_t n) {
    int64_t *d = d_;
    const int64_t *a = a_, *b = b_;
    for (size_t i = 0; i < n; i++) d[i] = (int64_t)((uint64_t)a[i] * (uint64_t)b[i]);
}

typedef void (*kern_fn)(void *, const void *, const void *, size_t);
/* indexed [dtype][op]; AVG uses SUM */
static const kern_fn kernels[SL_COMM_DTYPE_COUNT - 1][4] = {
    {sum_f32, prod_f32, max_f32, min_f32},   {sum_bf16, prod_bf16, max_bf16, min_bf16},
    {sum_f16, prod_f16, max_f16, min_f16},   {sum_f64, prod_f64, max_f64, min_f64},
    {sum_i32w, prod_i32w, max_i32, min_i32}, {sum_i64w, prod_i64w, max_i64, min_i64},
};

void sl_comm_reduce_kernel(sl_comm_dtype dt, sl_comm_redop op, void *dst, const void *a, const void *b,
                           size_t n) {
    SL_ASSERT((unsigned)dt < SL_COMM_U8 && (unsigned)op < SL_COMM_REDOP_COUNT);
    if (n == 0) return;
    kernels[dt][op == SL_COMM_AVG ? 0 : op](dst, a, b, n);
}

void sl_comm_div_kernel(sl_comm_dtype dt, void *x, size_t n, int divisor) {
    if (divisor == 1 || n == 0) return;
    switch (dt) {
    case SL_COMM_F32: {
        float *p = x;
        for (size_t i = 0; i < n; i++) p[i] /= (float)divisor;
    } break;
    case SL_COMM_F64: {
        double *p = x;
        for (size_t i = 0; i < n; i++) p[i] /= (double)divisor;
    } break;
    case SL_COMM_BF16: {
        uint16_t *p = x;
        for (size_t i = 0; i < n; i++) p[i] = sl_f32_to_bf16(sl_bf16_to_f32(p[i]) / (float)divisor);
    } break;
    case SL_COMM_F16: {
        uint16_t *p = x;
        for (size_t i = 0; i < n; i++) p[i] = sl_comm_f32_to_f16(sl_comm_f16_to_f32(p[i]) / (float)divisor);
    } break;
    case SL_COMM_I32: {
        int32_t *p = x;
        for (size_t i = 0; i < n; i++) p[i] /= divisor;
    } break;
    case SL_COMM_I64: {
        int64_t *p = x;
        for (size_t i = 0; i < n; i++) p[i] /= divisor;
    } break;
    default:
        SL_ASSERT(0);
    }
}
