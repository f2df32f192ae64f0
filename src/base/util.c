/* Time, threads, aligned memory, whole-file and atomic-file I/O, directories. */
#define _GNU_SOURCE
#include "suanli/base.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

double sl_time_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void sl_threads_set(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

int sl_threads_get(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Note [Huge pages for large buffers]
 * A bf16 7B model streams 13.5 GB of weights per decoded token: on 4 KiB pages, 3.3 million TLB entries a
 * token, and every buffer faults in 4 KiB at a time when it is first written. Where transparent huge pages
 * are in `madvise` mode (Debian's default), a buffer of at least HUGE_MIN bytes is therefore placed on
 * 2 MiB boundaries, its size rounded up to whole 2 MiB pages, and marked MADV_HUGEPAGE before anyone
 * touches it: model weights, gradients, optimizer state, the activation arena. Smaller buffers keep 4 KiB
 * pages (the tail of a huge page would be resident unused). Measured in docs/BENCHMARKS.md ("Huge pages").
 * SUANLI_HUGEPAGES=0 turns it off (A/B runs); where madvise fails (THP `never`, or none) the buffer simply
 * keeps 4 KiB pages. */
enum { HUGE_MIN = 32 << 20, HUGE_PAGE = 2 << 20 };
static int hugepages_on(void) {
    static int on = -1; /* racing first calls read the same value */
    int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("SUANLI_HUGEPAGES");
        v = !(e && !strcmp(e, "0"));
        __atomic_store_n(&on, v, __ATOMIC_RELAXED);
    }
    return v;
}

void *sl_malloc_aligned(size_t bytes) {
    if (bytes == 0) bytes = 64;
    void *p = NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= HUGE_MIN && hugepages_on()) {
        size_t len = (bytes + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
        if (posix_memalign(&p, HUGE_PAGE, len) != 0) return NULL;
        (void)madvise(p, len, MADV_HUGEPAGE); /* advice: where it fails, 4 KiB pages */
        return p;
    }
#endif
    if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63) != 0) return NULL;
    return p;
}
void sl_free_aligned(void *p) { free(p); }
void *sl_malloc_aligned_to(size_t bytes, size_t align) {
    if (bytes == 0) bytes = align;
    void *p = NULL;
    if (posix_memalign(&p, align, (bytes + align - 1) & ~(align - 1)) != 0) return NULL;
    return p;
}

sl_status sl_file_read_all(const char *path, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return sl_fail(SL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb; /* a directory opens, and its size reads as LONG_MAX */
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        return sl_fail(SL_ERR_IO, "%s: is a directory", path);
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return sl_fail(SL_ERR_IO, "%s: cannot seek", path);
    }
    long n = ftell(f);
    if (n < 0) {
        fclose(f);
        return sl_fail(SL_ERR_IO, "%s: cannot determine size", path);
    }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return sl_fail(SL_ERR_NOMEM, "%s: out of memory reading %ld bytes", path, n);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(buf);
        return sl_fail(SL_ERR_IO, "%s: short read", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = (size_t)n;
    return SL_OK;
}

sl_status sl_file_write_synced(const char *path, const void *data, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return sl_fail(SL_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlink(path);
            return sl_fail(SL_ERR_IO, "%s: write failed: %s", path, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return sl_fail(SL_ERR_IO, "%s: fsync failed: %s", path, strerror(e));
    }
    if (close(fd) != 0) {
        int e = errno;
        unlink(path);
        return sl_fail(SL_ERR_IO, "%s: close failed: %s", path, strerror(e));
    }
    return SL_OK;
}

sl_status sl_file_write_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    sl_status st = sl_file_write_synced(tmp, data, len);
    if (st != SL_OK) return sl_fail(st, "%s: %s", path, sl_errmsg()[0] ? sl_errmsg() : "write failed");
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return sl_fail(SL_ERR_IO, "%s: rename failed: %s", path, strerror(e));
    }
    return SL_OK;
}

void sl_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

sl_status sl_mkdirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return sl_fail(SL_ERR_INVALID, "bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return sl_fail(SL_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
            buf[i] = c;
        }
    }
    return sl_dir_check_writable(path);
}

sl_status sl_dir_check_writable(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) return sl_fail(SL_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return sl_fail(SL_ERR_IO, "%s: not a directory", path);
    if (access(path, W_OK | X_OK) != 0) return sl_fail(SL_ERR_IO, "%s: directory not writable", path);
    return SL_OK;
}

/* Note [Shared-memory names]
 * The shm transport names each rank's segment "<prefix>-<nonce>-r<rank>", prefix = sl-<token>, and
 * unlinks it as soon as every peer has mapped it, so a healthy or a cleanly failing job leaves nothing
 * in /dev/shm. A rank killed (SIGKILL, or the launcher's teardown) between creating its segment and
 * that point cannot unlink it; the launcher, which knows the token, sweeps "<prefix>-*" once all of
 * the job's local ranks are gone. */
void sl_shm_job_prefix(const char *token, char *out, size_t cap) {
    if (!cap) return;
    size_t o = (size_t)snprintf(out, cap, "sl-");
    if (o >= cap) o = cap - 1;
    for (size_t i = 0; token && token[i] && o + 1 < cap && i < 40; i++) {
        char c = token[i];
        out[o++] = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ? c : '_';
    }
    out[o] = 0;
}

int sl_shm_sweep_job(const char *token) {
    char pre[64];
    sl_shm_job_prefix(token, pre, sizeof pre);
    size_t pl = strlen(pre);
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, pre, pl) != 0 || e->d_name[pl] != '-') continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        n += shm_unlink(name) == 0;
    }
    closedir(d);
    return n;
}
