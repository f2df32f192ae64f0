/* Shared by the file-based fuzz targets: a per-process scratch path on /dev/shm (tmpfs: ~40x the
 * executions per second of /tmp on this host's disk), removed when the fuzzer exits. */
#ifndef SL_FUZZ_UTIL_H
#define SL_FUZZ_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_fuzz_path[96], g_fuzz_dir_files[4][128];

static inline void fuzz_cleanup(void) {
    for (int i = 0; i < 4; i++)
        if (g_fuzz_dir_files[i][0]) unlink(g_fuzz_dir_files[i]);
    if (g_fuzz_path[0] && unlink(g_fuzz_path) != 0) rmdir(g_fuzz_path);
}

/* "/dev/shm/sl-fuzz-TAG-PID" + suffix (a file), created on first call; dir != 0 makes it a directory */
static inline const char *fuzz_scratch(const char *tag, const char *suffix, int dir) {
    if (!g_fuzz_path[0]) {
        snprintf(g_fuzz_path, sizeof g_fuzz_path, "/dev/shm/sl-fuzz-%s-%d%s", tag, (int)getpid(), suffix);
        if (dir) mkdir(g_fuzz_path, 0700);
        atexit(fuzz_cleanup);
    }
    return g_fuzz_path;
}

/* a file inside the scratch directory, also removed at exit (at most 4) */
static inline const char *fuzz_scratch_file(int i, const char *name) {
    if (!g_fuzz_dir_files[i][0])
        snprintf(g_fuzz_dir_files[i], sizeof g_fuzz_dir_files[i], "%s/%s", g_fuzz_path, name);
    return g_fuzz_dir_files[i];
}
#endif
