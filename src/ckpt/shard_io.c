/* Checkpoint shard files written in one pass from the snapshot buffer (Note [Shard write path]).
 *
 * Note [Shard write path]
 * A shard file is the safetensors header (padded with spaces to a multiple of 4096 bytes, which the format
 * allows) followed by the snapshot buffer as it is: the writer's entries are laid out in the buffer in
 * file order, so nothing is serialised or copied between the snapshot and the disk. The file is written
 * with O_DIRECT in 8 MiB requests from the 4096-aligned buffer: the data goes from the snapshot straight to
 * the device, without the page-cache copy that costs a buffered write a core's worth of memcpy (and that,
 * on a machine whose cores are busy training, is what made buffered writes slow: 14 % of dd), and without
 * evicting the job's own pages. The last partial block is written from a zero-padded aligned copy and the
 * file truncated to its size. A file system that refuses O_DIRECT (EINVAL at open, or at the first write
 * for an alignment it does not accept) gets the same bytes through buffered writes from that point on: the
 * refusal is logged once per process, never an error. SUANLI_CKPT_DIRECT=0 turns O_DIRECT off. Either
 * way the file is written under path.tmp.PID, fsynced, renamed, and its directory fsynced; any failure
 * removes the temp file, so a failed write leaves neither a partial file nor a stray temp. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/pool_internal.h"

#define SL_DIRECT_ALIGN 4096
#define SL_DIRECT_CHUNK ((size_t)8 << 20)

int sl_ckpt_direct_enabled(void) {
    const char *e = getenv("SUANLI_CKPT_DIRECT");
    return !(e && !strcmp(e, "0"));
}

static int g_direct_warned;
static void direct_refused(const char *path, const char *when) {
    if (__atomic_exchange_n(&g_direct_warned, 1, __ATOMIC_RELAXED)) return;
    SL_LOGW("%s: O_DIRECT refused (EINVAL at %s); checkpoint files are written through the page cache", path,
            when);
}

/* write n bytes at off; under O_DIRECT an EINVAL (unaligned length/offset/memory the FS will not take)
 * switches the descriptor to buffered I/O and retries */
static int pwrite_all(int fd, const char *p, size_t n, off_t off, int *direct, const char *path) {
    while (n > 0) {
        size_t want = n > SL_DIRECT_CHUNK ? SL_DIRECT_CHUNK : n;
        ssize_t k = pwrite(fd, p, want, off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EINVAL && *direct) {
            int fl = fcntl(fd, F_GETFL);
            if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT) != 0) return -1;
            *direct = 0;
            direct_refused(path, "write");
            continue;
        }
        if (k <= 0) {
            if (k == 0) errno = EIO;
            return -1;
        }
        p += k;
        n -= (size_t)k;
        off += k;
    }
    return 0;
}

sl_status sl_ckpt_out_open(sl_ckpt_out *o, const char *path, int direct) {
    memset(o, 0, sizeof *o);
    o->t0 = sl_time_sec();
    o->fd = -1;
    snprintf(o->path, sizeof o->path, "%s", path);
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%d", path, (int)getpid());
    o->direct = direct && sl_ckpt_direct_enabled();
    if (o->direct) o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    if (o->direct && o->fd < 0 && errno == EINVAL) {
        o->direct = 0;
        direct_refused(path, "open");
    }
    if (!o->direct) o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o->fd < 0) return sl_fail(SL_ERR_IO, "%s: cannot create: %s", o->tmp, strerror(errno));
    return SL_OK;
}

sl_status sl_ckpt_out_write(sl_ckpt_out *o, const void *p, size_t n, size_t off, size_t cap) {
    if (o->failed) return sl_fail(SL_ERR_IO, "%s: write failed: %s", o->path, strerror(o->err));
    size_t whole = o->direct ? n / SL_DIRECT_ALIGN * SL_DIRECT_ALIGN : n;
    int rc = pwrite_all(o->fd, p, whole, (off_t)off, &o->direct, o->path);
    if (rc == 0 && whole < n) { /* O_DIRECT was refused during the write, or a partial last block */
        size_t rest = n - whole, padded = (rest + SL_DIRECT_ALIGN - 1) / SL_DIRECT_ALIGN * SL_DIRECT_ALIGN;
        const char *q = (const char *)p + whole;
        if (!o->direct) {
            rc = pwrite_all(o->fd, q, rest, (off_t)(off + whole), &o->direct, o->path);
        } else if (whole + padded <= cap) { /* the caller's buffer has room for the zero padding */
            memset((char *)p + n, 0, padded - rest);
            rc = pwrite_all(o->fd, q, padded, (off_t)(off + whole), &o->direct, o->path);
        } else { /* from a zero-padded aligned copy */
            char *tail = sl_malloc_aligned_to(padded, SL_DIRECT_ALIGN);
            if (!tail) {
                errno = ENOMEM;
                rc = -1;
            } else {
                memset(tail, 0, padded);
                memcpy(tail, q, rest);
                rc = pwrite_all(o->fd, tail, padded, (off_t)(off + whole), &o->direct, o->path);
                sl_free_aligned(tail);
            }
        }
        o->padded = 1;
    }
    if (rc != 0) {
        o->failed = 1;
        o->err = errno;
        return sl_fail(SL_ERR_IO, "%s: write failed: %s", o->path, strerror(o->err));
    }
    return SL_OK;
}

sl_status sl_ckpt_out_close(sl_ckpt_out *o, size_t size, int sync, int keep) {
    if (o->fd < 0) return SL_OK;
    const char *what = "write";
    int rc = o->failed ? -1 : 0, e = o->err;
    if (rc == 0 && keep && o->padded) { /* the zero padding of the last block goes */
        what = "truncate";
        rc = ftruncate(o->fd, (off_t)size);
        e = errno;
    }
    if (rc == 0 && keep && sync) {
        what = "fsync";
        rc = fsync(o->fd);
        e = errno;
    }
    if (close(o->fd) != 0 && rc == 0 && keep) {
        what = "close";
        rc = -1;
        e = errno;
    }
    o->fd = -1;
    if (rc == 0 && keep && rename(o->tmp, o->path) != 0) {
        what = "rename";
        rc = -1;
        e = errno;
    }
    if (rc != 0 || !keep) unlink(o->tmp);
    if (!keep) return SL_OK;
    if (rc != 0) return sl_fail(SL_ERR_IO, "%s: %s failed: %s", o->path, what, strerror(e));
    o->seconds = sl_time_sec() - o->t0;
    return SL_OK;
}

sl_status sl_ckpt_write_file(const char *path, const void *hdr, size_t hlen, const void *data, size_t dlen,
                             int flags, sl_ckpt_io *io) {
    sl_ckpt_out o;
    int direct =
        (flags & SL_CKPT_IO_DIRECT) && ((uintptr_t)hdr % SL_DIRECT_ALIGN) == 0 && hlen % SL_DIRECT_ALIGN == 0;
    SL_TRY(sl_ckpt_out_open(&o, path, direct));
    sl_status st = sl_ckpt_out_write(&o, hdr, hlen, 0, hlen);
    if (st == SL_OK) st = sl_ckpt_out_write(&o, data, dlen, hlen, dlen); /* data is not padded in place */
    sl_status cs = sl_ckpt_out_close(&o, hlen + dlen, (flags & SL_CKPT_IO_SYNC) != 0, st == SL_OK);
    if (st != SL_OK) return st;
    SL_TRY(cs);
    if (flags & SL_CKPT_IO_SYNC) {
        char dir[4400];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        sl_fsync_dir(slash ? (dir[0] ? dir : "/") : ".");
    }
    if (io) {
        io->direct = o.direct;
        io->seconds = sl_time_sec() - o.t0;
        io->bytes = hlen + dlen;
    }
    return SL_OK;
}

static void *file_job_main(void *arg) {
    sl_ckpt_file_job *j = arg;
    j->st = sl_ckpt_write_file(j->path, j->hdr, j->hlen, j->data, j->dlen, j->flags, &j->io);
    if (j->st != SL_OK) snprintf(j->err, sizeof j->err, "%s", sl_errmsg());
    return NULL;
}

void sl_ckpt_file_job_start(sl_ckpt_file_job *j) {
    j->running = sl_thread_spawn(&j->th, file_job_main, j) == 0;
    if (!j->running) file_job_main(j);
}

sl_status sl_ckpt_file_job_join(sl_ckpt_file_job *j) {
    if (j->running) pthread_join(j->th, NULL);
    j->running = 0;
    return j->st == SL_OK ? SL_OK : sl_fail(j->st, "%s", j->err);
}
