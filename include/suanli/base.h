/* suanli/base.h — status codes, logging, CPU features, counter-based RNG, timing.
 *
 * Usage:
 *   sl_status st = sl_file_read_all("x.bin", &buf, &n);
 *   if (st != SL_OK) { fprintf(stderr, "%s\n", sl_errmsg()); return 2; }
 *
 *   uint64_t r = sl_rng_u64(seed, stream, counter);   // reproducible from (seed, stream, counter)
 *   if (sl_cpu_features()->avx512f) { ... }
 *
 * Error convention: library functions return sl_status. On failure they record a one-line message
 * (thread-local) that the caller can fetch with sl_errmsg(). Only the CLI turns a status into an
 * exit code. Programmer errors (broken invariants) use SL_ASSERT and abort loudly.
 */
#ifndef SUANLI_BASE_H
#define SUANLI_BASE_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sl_status {
    SL_OK = 0,
    SL_ERR_INVALID,     /* bad argument, flag, config value */
    SL_ERR_IO,          /* file could not be read/written */
    SL_ERR_FORMAT,      /* file exists but its contents are malformed */
    SL_ERR_NOMEM,       /* allocation failed */
    SL_ERR_UNSUPPORTED, /* op/dtype/feature not supported by this backend/build */
    SL_ERR_TIMEOUT,     /* a deadline passed */
    SL_ERR_PEER,        /* a remote rank failed or disconnected */
    SL_ERR_ABORTED,     /* operation was aborted */
    SL_ERR_INTERNAL,    /* should not happen */
    SL_STATUS_COUNT
} sl_status;

const char *sl_status_name(sl_status st);

/* Record an error message (printf-style) for the current thread and return `st`. */
sl_status sl_fail(sl_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last recorded error message of this thread ("" if none). Borrowed pointer. */
const char *sl_errmsg(void);
void sl_clear_error(void);

/* Propagate a failing status to a cleanup label named `done` with variable `st` in scope. */
#define SL_CHECK(expr)                                                                                       \
    do {                                                                                                     \
        st = (expr);                                                                                         \
        if (st != SL_OK) goto done;                                                                          \
    } while (0)
#define SL_TRY(expr)                                                                                         \
    do {                                                                                                     \
        sl_status st_ = (expr);                                                                              \
        if (st_ != SL_OK) return st_;                                                                        \
    } while (0)

/* Programmer errors: always checked, abort with location. */
#define SL_ASSERT(cond)                                                                                      \
    do {                                                                                                     \
        if (!(cond)) sl_assert_fail(#cond, __FILE__, __LINE__);                                              \
    } while (0)
#ifdef __cplusplus
#define SL_NORETURN [[noreturn]] /* C++ has no _Noreturn */
#else
#define SL_NORETURN _Noreturn
#endif
SL_NORETURN void sl_assert_fail(const char *cond, const char *file, int line);

/* ---- logging ---- */
typedef enum { SL_LOG_ERROR = 0, SL_LOG_WARN, SL_LOG_INFO, SL_LOG_DEBUG, SL_LOG_LEVEL_COUNT } sl_log_level;
void sl_log_set_level(sl_log_level lvl); /* default from SUANLI_LOG (error|warn|info|debug), else info */
sl_log_level sl_log_get_level(void);
void sl_log(sl_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define SL_LOGE(...) sl_log(SL_LOG_ERROR, __VA_ARGS__)
#define SL_LOGW(...) sl_log(SL_LOG_WARN, __VA_ARGS__)
#define SL_LOGI(...) sl_log(SL_LOG_INFO, __VA_ARGS__)
#define SL_LOGD(...) sl_log(SL_LOG_DEBUG, __VA_ARGS__)

/* ---- CPU features (CPUID), overridable with SUANLI_ISA=scalar|avx2|avx512|amx (each narrows what CPUID
 * found: avx512 leaves AMX out; amx or unset keeps everything) ---- */
typedef struct sl_cpu_features {
    int avx2, fma, avx512f, avx512bw, avx512vl, avx512_bf16, avx512_vnni, f16c;
    int amx_bf16; /* AMX-TILE + AMX-BF16, enabled by the OS, and this process allowed to use them */
    int zen;      /* vendor AuthenticAMD or HygonGenuine (Zen cores): memory-stream tuning, not ISA */
} sl_cpu_features;
const sl_cpu_features *sl_cpu_features_get(void); /* detected & cached; respects SUANLI_ISA */
const char *sl_cpu_isa_name(void);                /* "avx512", "avx2" or "scalar" */

/* ---- counter-based RNG (Philox-4x32-10) ----
 * Every random number is a pure function of (seed, stream, counter), so streams are reproducible
 * from (seed, step, rank) regardless of how many numbers were drawn before. */
void sl_philox4x32(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]);
uint64_t sl_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter);
double sl_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter); /* [0,1) */
/* Fill n floats ~ N(mean, std) using Box-Muller over the counter sequence starting at 0. */
void sl_rng_fill_normal(float *out, int64_t n, uint64_t seed, uint64_t stream, float mean, float std);
/* Dropout multipliers for elements e0 .. e0+n-1 of one counter stream (Note [Dropout from counters]):
 * element e draws u = sl_philox4x32(seed, ctr_hi, e / 4)[e % 4] and is kept (out = 1 / (1 - p)) iff
 * u >= sl_dropout_threshold(p), else dropped (out = 0). p in [0, 1). */
uint32_t sl_dropout_threshold(float p);
uint64_t sl_dropout_ctr_hi(uint64_t stream, int site); /* stream * 2^16 + site, site in [0, 2^16) */
void sl_rng_dropout(uint64_t seed, uint64_t ctr_hi, uint64_t e0, int64_t n, float p, float *out);

/* ---- time ---- */
double sl_time_sec(void); /* monotonic */

/* ---- threads (OpenMP-backed) ---- */
void sl_threads_set(int n); /* n <= 0: leave default */
int sl_threads_get(void);
/* Shared-machine mode (Note [Binding on a shared machine], src/base/threads.c): on = 1 with n > 1 binds the
 * OpenMP team of n threads one CPU each (unless the user binds via OMP_PROC_BIND / OMP_PLACES /
 * GOMP_CPU_AFFINITY) and lets the GEMM deal work in units; on = 0 or n = 1 restores the original mask.
 * Returns 1 when the team is bound. Call between parallel regions. */
int sl_threads_shared_mode(int n, int on);
int sl_threads_shared(void); /* the mode's flag, for kernels */
/* pthread_create with the process's original CPU mask (not a bound master's single CPU) */
int sl_thread_spawn(pthread_t *th, void *(*fn)(void *), void *arg);

/* ---- small helpers ---- */
void *sl_malloc_aligned(size_t bytes); /* 64-byte aligned, NULL on failure; free with sl_free_aligned */
void sl_free_aligned(void *p);
/* align-byte aligned (a power of two >= sizeof(void *), e.g. 4096 for O_DIRECT), size rounded up to align */
void *sl_malloc_aligned_to(size_t bytes, size_t align);
/* Read a whole file. *out is owned by caller (free()). */
sl_status sl_file_read_all(const char *path, char **out, size_t *len);
/* Write a file and fsync it (no rename); on failure the partial file is removed. */
sl_status sl_file_write_synced(const char *path, const void *data, size_t len);
/* Atomically write a file: write to path.tmp.PID, fsync, rename. Nothing is left half-written. */
sl_status sl_file_write_atomic(const char *path, const void *data, size_t len);
/* fsync a directory so renames in it are durable (best effort: errors are ignored). */
void sl_fsync_dir(const char *dir);
/* mkdir -p; fails with a message naming the path if it is not a writable directory. */
sl_status sl_mkdirs(const char *path);
sl_status sl_dir_check_writable(const char *path);

/* ---- shared-memory names of a job (see Note [Shared-memory names] in util.c) ---- */
/* Write "sl-<token sanitised to [A-Za-z0-9_], at most 40 chars>" into out; the prefix of every POSIX
 * shared-memory object the communicator creates for a job with this rendezvous token. */
void sl_shm_job_prefix(const char *token, char *out, size_t cap);
/* Remove /dev/shm objects named "<prefix>-*" of a finished job (left when a rank died before its peers
 * had mapped its segment). Call only when no rank of the job on this host is alive. Returns the count. */
int sl_shm_sweep_job(const char *token);

/* bf16 <-> f32, round-to-nearest-even; NaN stays NaN */
static inline uint16_t sl_f32_to_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}
static inline float sl_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}

/* IEEE binary16 <-> f32 (issue 19). f32 -> f16 rounds to nearest even; values >= 65520 become inf; NaN
 * stays NaN with its top payload bits, quieted (what the F16C instruction VCVTPS2PH does, so the scalar and
 * SIMD paths of src/device/cpu/kernels/f16.c agree bit for bit); f16 -> f32 is exact. */
static inline uint16_t sl_f32_to_f16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    uint32_t sign = (v.u >> 16) & 0x8000u, ax = v.u & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN */
    if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 65536 (and inf): inf */
    if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero; the float add rounds to nearest even */
        union {
            uint32_t u;
            float f;
        } a = {ax}, magic = {(uint32_t)((127 - 15) + (23 - 10) + 1) << 23};
        a.f += magic.f;
        return (uint16_t)(sign | (a.u - magic.u));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd; /* rebias and round; a carry into inf is right */
    return (uint16_t)(sign | (ax >> 13));
}
static inline float sl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);
    } else if (e == 0) {
        if (!mant) {
            u = sign;
        } else { /* subnormal: normalise */
            int sh = 0;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                sh++;
            }
            u = sign | ((uint32_t)(127 - 15 + 1 - sh) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else {
        u = sign | ((e + 127 - 15) << 23) | (mant << 13);
    }
    union {
        uint32_t u;
        float f;
    } v = {u};
    return v.f;
}

#ifdef __cplusplus
}
#endif
#endif
