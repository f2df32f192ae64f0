/* What a process pays before it does anything (Note [cuBLAS loaded on first use],
 * src/device/cuda/cuda_blas.c): `suanli help` must not load the accelerators' large libraries. Every library
 * the executable is linked against is mapped and relocated at start, so linking cuBLAS (which pulls cuBLASLt)
 * made every `suanli` process 211 MiB resident before its first instruction, and the CPU trainer's peak RSS
 * 151 MiB larger. The bound below is far above what start-up needs (5.7 MiB measured in release, ~30 MiB
 * under ASan's shadow) and far below what one such library costs (cuBLAS + cuBLASLt: 150 MiB), so it fails
 * exactly when a heavy library is linked again. Where the CUDA backend is built, the lazy loader itself is
 * checked: it must find cuBLAS and every entry point the backend calls, without a GPU. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "suanli/base.h"
#include "testutil.h"

#ifdef SL_HAVE_CUDA
sl_status cu_blas_load(char *err, size_t cap); /* src/device/cuda/cuda_blas.c */
#endif

int main(void) {
    const char *cli = getenv("SUANLI_CLI");
    TU_CHECK(cli && *cli, "SUANLI_CLI names the suanli executable");
    pid_t pid = fork();
    TU_CHECK(pid >= 0, "fork");
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(cli, cli, "help", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    TU_CHECK(wait4(pid, &status, 0, &ru) == pid, "wait4");
    TU_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "suanli help exits 0 (status %d)", status);
    double mib = (double)ru.ru_maxrss / 1024.0;
    printf("suanli help: peak RSS %.1f MiB\n", mib);
    TU_CHECK(mib < 64.0,
             "suanli help peaks at %.1f MiB: a large library is linked again (cuBLAS alone: 150 MiB)", mib);
#ifdef SL_HAVE_CUDA
    char err[1024] = "";
    sl_status st = cu_blas_load(err, sizeof err);
    TU_CHECK(st == SL_OK, "cuBLAS loads on demand: %s", err);
    TU_CHECK(cu_blas_load(err, sizeof err) == SL_OK, "a second load is a no-op");
    printf("cuBLAS loaded on demand\n");
#endif
    return tu_finish("test_startup");
}
