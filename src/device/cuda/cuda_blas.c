/* cuBLAS, loaded when the CUDA backend first initialises a device (Note [cuBLAS loaded on first use]).
 *
 * Note [cuBLAS loaded on first use]
 * libcublas pulls in libcublasLt (540 MB on disk for CUDA 13), and loading the pair costs a process about
 * 150 MiB of resident memory (relocations and the pages the loader touches) before anything runs. Linked
 * into the library, every `suanli` process paid that on a machine with the toolkit, whatever its device:
 * the CPU trainer's peak RSS for GPT-2 124M rose from 2,056 to 2,207 MiB, and `suanli --help` to 211 MiB.
 * So the library links only the CUDA runtime (0.6 MiB; the nvcc-built kernels register with it at start-up)
 * and opens cuBLAS with dlopen the first time a CUDA device is set up: first from the toolkit directory the
 * build was configured with (SL_CUDA_LIBDIR), then by soname through the loader's search path. Only the
 * handful of entry points the backend calls are resolved; each pointer's type is taken from cuBLAS's own
 * declaration (__typeof__), so a changed signature fails to compile instead of failing at run time.
 * tests/cli/test_startup_rss checks that no cuBLAS library is among the executable's needed libraries. */
#include <dlfcn.h>
#include <stdio.h>

#include "device/cuda/cuda_internal.h"

#ifndef SL_CUDA_LIBDIR
#define SL_CUDA_LIBDIR ""
#endif
#define CU_STR2(x) #x
#define CU_STR(x) CU_STR2(x)
#define CU_BLAS_SONAME "libcublas.so." CU_STR(CUBLAS_VER_MAJOR)

cu_blas_api g_blas;

sl_status cu_blas_load(char *err, size_t cap) {
    if (g_blas.handle) return SL_OK;
    char path[1024];
    void *h = NULL;
    const char *why = "";
    if (SL_CUDA_LIBDIR[0]) {
        snprintf(path, sizeof path, "%s/%s", SL_CUDA_LIBDIR, CU_BLAS_SONAME);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        h = dlopen(CU_BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
        if (!h) why = dlerror();
    }
    if (!h) {
        snprintf(err, cap, "cuda backend: cannot load cuBLAS (%s: %s)", CU_BLAS_SONAME,
                 why ? why : "not found");
        return SL_ERR_UNSUPPORTED;
    }
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"cublasCreate_v2", (void **)&g_blas.create},
        {"cublasSetStream_v2", (void **)&g_blas.set_stream},
        {"cublasGemmEx", (void **)&g_blas.gemm_ex},
        {"cublasGemmStridedBatchedEx", (void **)&g_blas.gemm_strided_batched_ex},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (!*syms[i].slot) {
            snprintf(err, cap,
                     "cuda backend: %s has no %s (a cuBLAS older than the headers the backend was "
                     "built with?)",
                     CU_BLAS_SONAME, syms[i].name);
            dlclose(h);
            return SL_ERR_UNSUPPORTED;
        }
    }
    g_blas.handle = h;
    return SL_OK;
}
