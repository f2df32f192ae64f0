/* The checkpoint shard write path (Note [Shard write path], src/ckpt/shard_io.c):
 * - O_DIRECT from aligned buffers: the file holds exactly header + data (a length that is not a multiple of
 *   the 4096-byte block, so the zero-padded tail block and the truncate are exercised) and reports direct;
 * - the kernel refusing O_DIRECT mid-file (a data pointer 4 bytes off alignment: EINVAL on the first data
 *   write) and SUANLI_CKPT_DIRECT=0: the same bytes through the page cache, reported as buffered;
 * - a write that fails part-way (RLIMIT_FSIZE below the file size: EFBIG after some bytes went out), with
 *   and without O_DIRECT: an error naming the file and the call, the previous file at that path untouched,
 *   no temp file left;
 * - the same file written in pieces (sl_ckpt_out: a received replica): exact bytes with the last piece padded
 *   in the caller's buffer or from a copy, nothing left by a discarded file, and a failure part-way that
 *   names the file and leaves no temp;
 * - the pooled exchange over 2 thread ranks (sl_ckpt_pool_exchange: double-buffered pieces, a disk thread):
 *   each receiver's file is bitwise the sender's bytes; a receiver whose step directory cannot be made, and
 *   receivers whose writes fail part-way, report it naming the file once the exchange is over, the sender
 *   side completes (nothing hangs), and no temp file is left;
 * - the pooled restore stream over 3 thread ranks (sl_ckpt_pool_restore_stream, Note [Pooled restore
 *   stream]: a file of 2 pieces and a partial one read by its holder and received by the others): each
 *   receiver's file is bitwise the holder's and the hash the file's XXH3; with the wrong checksum nothing
 *   is kept; a missing or wrong-sized copy is reported the same on every rank, naming host and file; the
 *   holder writes too when asked; an empty file; a receiver whose directory is missing, and receivers whose
 *   writes fail part-way, report it naming the file while the others keep theirs; no temp file is left;
 * - end to end through the writer (sl_ckpt_save_begin + commit) for a 1-layer GPT-2: the shard's data
 *   starts 4096-aligned, the disk and in-memory copies verify and load back bitwise (params and both
 *   moments, the oracle being the state that was saved), and one flipped data byte is a checksum mismatch
 *   naming the tensor, in either copy;
 * - the restart's choice (Note [One verification per restart]) through the CLI: with the in-memory copy as
 *   new as the disk's, a corrupt disk copy is never read (no warning) and the run resumes from memory; a
 *   corrupt in-memory copy is detected and the disk copy used; both resumes reproduce the uninterrupted
 *   run's final weights bitwise. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ckpt/pool_internal.h"
#include "suanli/ckpt.h"
#include "suanli/comm.h"
#include "suanli/safetensors.h"
#include "testutil.h"

static const char *dir;

/* temp files in directory d (default: the test's directory) */
static int count_tmp_at(const char *d) { return tu_count_names(d, ".tmp."); }
static int count_tmp(void) { return count_tmp_at(dir); }

static void test_direct_and_fallback(void) {
    const size_t hlen = 4096, dlen = ((size_t)3 << 20) + 1000; /* 3 MiB + a partial block */
    char *hdr = sl_malloc_aligned_to(hlen, 4096), *data = sl_malloc_aligned_to(dlen + 4096, 4096), path[600];
    for (size_t i = 0; i < hlen; i++) hdr[i] = (char)(i * 7 + 1);
    for (size_t i = 0; i < dlen + 4096; i++) data[i] = (char)(i * 131 + (i >> 12));
    snprintf(path, sizeof path, "%s/direct.bin", dir);
    char pp[600];
    snprintf(pp, sizeof pp, "%s/probe", dir);
    int pfd = open(pp, O_WRONLY | O_CREAT | O_DIRECT, 0644); /* does this file system take O_DIRECT? */
    int fs_direct = pfd >= 0;
    if (pfd >= 0) close(pfd);
    unlink(pp);

    sl_ckpt_io io = {0};
    sl_status st = sl_ckpt_write_file(path, hdr, hlen, data, dlen, SL_CKPT_IO_DIRECT | SL_CKPT_IO_SYNC, &io);
    TU_CHECK(st == SL_OK && tu_file_is(path, hdr, hlen, data, dlen), "O_DIRECT write: exact bytes (%s)",
             sl_errmsg());
    TU_CHECK(io.direct == fs_direct && io.bytes == hlen + dlen, "O_DIRECT used where the FS takes it: %d %d",
             io.direct, fs_direct);

    /* data 4 bytes off alignment: the kernel refuses the O_DIRECT write, the rest goes buffered */
    st = sl_ckpt_write_file(path, hdr, hlen, data + 4, dlen, SL_CKPT_IO_DIRECT | SL_CKPT_IO_SYNC, &io);
    TU_CHECK(st == SL_OK && tu_file_is(path, hdr, hlen, data + 4, dlen) && io.direct == 0,
             "O_DIRECT refused mid-file: buffered fallback, exact bytes (direct %d, %s)", io.direct,
             sl_errmsg());

    setenv("SUANLI_CKPT_DIRECT", "0", 1);
    st = sl_ckpt_write_file(path, hdr, hlen, data, dlen, SL_CKPT_IO_DIRECT | SL_CKPT_IO_SYNC, &io);
    TU_CHECK(st == SL_OK && tu_file_is(path, hdr, hlen, data, dlen) && io.direct == 0,
             "SUANLI_CKPT_DIRECT=0: buffered, exact bytes");
    unsetenv("SUANLI_CKPT_DIRECT");

    /* a partial write failure: the file size limit stops the write after 1 MiB */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    for (int d = 0; d < 2; d++) {
        TU_CHECK(sl_ckpt_write_file(path, hdr, hlen, data, dlen, SL_CKPT_IO_SYNC, NULL) == SL_OK,
                 "previous file");
        lim = old;
        lim.rlim_cur = (rlim_t)1 << 20;
        setrlimit(RLIMIT_FSIZE, &lim);
        st = sl_ckpt_write_file(path, hdr, hlen, data + 4096, dlen,
                                (d ? SL_CKPT_IO_DIRECT : 0) | SL_CKPT_IO_SYNC, &io);
        setrlimit(RLIMIT_FSIZE, &old);
        TU_CHECK(st == SL_ERR_IO && strstr(sl_errmsg(), "direct.bin: write failed"),
                 "partial write fails with a message naming the file (%s): %s", d ? "O_DIRECT" : "buffered",
                 sl_errmsg());
        TU_CHECK(tu_file_is(path, hdr, hlen, data, dlen),
                 "partial write (%s): the previous file is untouched", d ? "O_DIRECT" : "buffered");
        TU_CHECK(count_tmp() == 0, "partial write (%s): no temp file left", d ? "O_DIRECT" : "buffered");
    }
    unlink(path);
    sl_free_aligned(hdr);
    sl_free_aligned(data);
}

/* sl_ckpt_out: a 4096-byte head and a body in 1 MiB pieces with a partial last one */
static void test_pieces(void) {
    const size_t hlen = 4096, piece = (size_t)1 << 20, blen = 2 * piece + 1000;
    char *hdr = sl_malloc_aligned_to(hlen, 4096), *body = sl_malloc_aligned_to(blen, 4096),
         *buf = sl_malloc_aligned_to(piece, 4096), path[600];
    for (size_t i = 0; i < hlen; i++) hdr[i] = (char)(i * 5 + 3);
    for (size_t i = 0; i < blen; i++) body[i] = (char)(i * 97 + (i >> 13));
    snprintf(path, sizeof path, "%s/pieces.bin", dir);
    for (int room = 0; room < 2; room++) { /* the last piece padded in buf (room) or from a copy */
        sl_ckpt_out o;
        sl_status st = sl_ckpt_out_open(&o, path, 1);
        if (st == SL_OK) st = sl_ckpt_out_write(&o, hdr, hlen, 0, hlen);
        for (size_t off = 0; off < blen && st == SL_OK; off += piece) {
            size_t n = blen - off < piece ? blen - off : piece;
            memcpy(buf, body + off, n);
            st = sl_ckpt_out_write(&o, buf, n, hlen + off, room ? piece : n);
        }
        sl_status cs = sl_ckpt_out_close(&o, hlen + blen, 1, st == SL_OK);
        TU_CHECK(st == SL_OK && cs == SL_OK && tu_file_is(path, hdr, hlen, body, blen) && count_tmp() == 0,
                 "file in pieces (%s): exact bytes (%s)", room ? "padded in place" : "padded copy",
                 sl_errmsg());
    }
    /* a discarded file leaves nothing; the previous file at the path is untouched */
    sl_ckpt_out o;
    TU_CHECK(sl_ckpt_out_open(&o, path, 1) == SL_OK && sl_ckpt_out_write(&o, hdr, hlen, 0, hlen) == SL_OK &&
                 sl_ckpt_out_close(&o, hlen, 1, 0) == SL_OK && count_tmp() == 0 &&
                 tu_file_is(path, hdr, hlen, body, blen),
             "discarded file in pieces: no temp, previous file untouched");
    /* the file size limit stops the second piece: the error names the file, the close discards */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = piece;
    sl_status st = sl_ckpt_out_open(&o, path, 1);
    setrlimit(RLIMIT_FSIZE, &lim);
    if (st == SL_OK) st = sl_ckpt_out_write(&o, hdr, hlen, 0, hlen);
    for (size_t off = 0; off < blen && st == SL_OK; off += piece)
        st = sl_ckpt_out_write(&o, body + off, blen - off < piece ? blen - off : piece, hlen + off, piece);
    setrlimit(RLIMIT_FSIZE, &old);
    TU_CHECK(st == SL_ERR_IO && strstr(sl_errmsg(), "pieces.bin: write failed"),
             "a piece past the size limit fails naming the file: %s", sl_errmsg());
    TU_CHECK(sl_ckpt_out_write(&o, hdr, hlen, 0, hlen) == SL_ERR_IO, "a failed file refuses later pieces");
    TU_CHECK(sl_ckpt_out_close(&o, hlen + blen, 1, 0) == SL_OK && count_tmp() == 0 &&
                 tu_file_is(path, hdr, hlen, body, blen),
             "failed file in pieces: no temp, previous file untouched");
    unlink(path);
    sl_free_aligned(hdr);
    sl_free_aligned(body);
    sl_free_aligned(buf);
}

typedef struct {
    sl_comm *comm;
    const char *root;
    const char *head, *body;
    size_t hlen, blen;
    sl_status st;
    char err[512];
} xchg_rank;

static void *xchg_main(void *arg) {
    xchg_rank *r = arg;
    int me = sl_comm_rank(r->comm);
    sl_ckpt_pool p = {.local_root = r->root, .hosts = 2, .host = me, .replicas = 2, .comm = r->comm};
    char name[64];
    snprintf(name, sizeof name, "shard-r%05d.safetensors", me);
    sl_ckpt_pool_stream s = {
        .dst = 1 - me, .name = name, .head = r->head, .hlen = r->hlen, .body = r->body, .blen = r->blen};
    r->st = sl_ckpt_pool_exchange(&p, "step-0000001", &s, 1);
    if (r->st != SL_OK) snprintf(r->err, sizeof r->err, "%s", sl_errmsg());
    return NULL;
}

/* count temp files under root/host-h/step-0000001 */
static int count_tmp_in(const char *root, int h) {
    char d[700];
    snprintf(d, sizeof d, "%s/host-%d/step-0000001", root, h);
    return count_tmp_at(d);
}

/* writes past `bytes` fail with EFBIG (SIGXFSZ ignored) until the returned limit is restored */
static struct rlimit limit_file_size(rlim_t bytes) {
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lim);
    return old;
}

/* the pooled exchange between 2 thread ranks, each its own host: a 4096-byte head (O_DIRECT) or a 128-byte
 * one (buffered, as an erasure-code block's), and a body of 2 pieces and a partial one */
static void test_exchange(void) {
    const size_t blen = ((size_t)16 << 20) + 1000;
    char *heads[2], *bodies[2], root[600], cmd[1400];
    for (int r = 0; r < 2; r++) {
        heads[r] = sl_malloc_aligned_to(4096, 4096);
        bodies[r] = sl_malloc_aligned_to(blen, 4096);
        for (size_t i = 0; i < 4096; i++) heads[r][i] = (char)(i * 3 + r + 1);
        for (size_t i = 0; i < blen; i++)
            bodies[r][i] =
                (char)(i * 151 + (i >> 12) + (i >> 23) * 37 + 7 * r); /* each 8 MiB piece differs */
    }
    snprintf(root, sizeof root, "%s/pool", dir);
    /* case 0: 4096-byte heads; 1: 128-byte heads; 2: host 1's step dir cannot be made (host-1 is a file);
     * 3: both receivers' writes fail part-way (the size limit) */
    for (int c = 0; c < 4; c++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", root, root);
        TU_CHECK(system(cmd) == 0, "fresh pool root");
        if (c == 2) {
            snprintf(cmd, sizeof cmd, "%s/host-1", root);
            FILE *f = fopen(cmd, "w");
            if (f) fclose(f);
        }
        sl_comm *comms[2];
        TU_CHECK(sl_comm_init_loopback(2, comms, NULL) == SL_OK, "loopback comms: %s", sl_errmsg());
        xchg_rank rk[2];
        pthread_t th[2];
        struct rlimit old = {0, 0};
        if (c == 3) old = limit_file_size((rlim_t)8 << 20);
        for (int r = 0; r < 2; r++) {
            rk[r] = (xchg_rank){.comm = comms[r],
                                .root = root,
                                .head = heads[r],
                                .hlen = c == 1 ? 128 : 4096,
                                .body = bodies[r],
                                .blen = blen};
            pthread_create(&th[r], NULL, xchg_main, &rk[r]);
        }
        for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
        if (c == 3) setrlimit(RLIMIT_FSIZE, &old);
        for (int r = 0; r < 2; r++) sl_comm_free(comms[r]);
        for (int h = 0; h < 2; h++) { /* host h received rank 1-h's stream */
            char path[800];
            snprintf(path, sizeof path, "%s/host-%d/step-0000001/shard-r%05d.safetensors", root, h, 1 - h);
            int s = 1 - h;
            if (c < 2 || (c == 2 && h == 0)) {
                TU_CHECK(rk[h].st == SL_OK && tu_file_is(path, heads[s], rk[s].hlen, bodies[s], blen),
                         "exchange case %d: host %d holds rank %d's bytes (%s)", c, h, s, rk[h].err);
            } else {
                TU_CHECK(rk[h].st == SL_ERR_IO || rk[h].st == SL_ERR_INVALID,
                         "exchange case %d: host %d reports its failed disk (status %d)", c, h, rk[h].st);
                TU_CHECK(strstr(rk[h].err, c == 2 ? "host-1" : "write failed") != NULL,
                         "exchange case %d: host %d's message names what failed: %s", c, h, rk[h].err);
                TU_CHECK(access(path, F_OK) != 0, "exchange case %d: no file at %s", c, path);
            }
            TU_CHECK(count_tmp_in(root, h) == 0, "exchange case %d: no temp file on host %d", c, h);
        }
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    TU_CHECK(system(cmd) == 0, "cleanup pool root");
    for (int r = 0; r < 2; r++) {
        sl_free_aligned(heads[r]);
        sl_free_aligned(bodies[r]);
    }
}

typedef struct {
    sl_comm *comm;
    const char *path, *dest, *sum;
    size_t want;
    int ok;
    sl_status wst;
    char got[32], why[600], err[512];
} stream_rank;

static void *stream_main(void *arg) {
    stream_rank *r = arg;
    r->ok = sl_ckpt_pool_restore_stream(r->comm, 1, r->path, "f.bin", r->want, r->dest, r->sum, r->got,
                                        sizeof r->got, &r->wst, r->why, sizeof r->why);
    if (r->wst != SL_OK) snprintf(r->err, sizeof r->err, "%s", sl_errmsg());
    return NULL;
}

/* the restore stream between 3 thread ranks, rank 1 holding the file */
static void test_restore_stream(void) {
    const size_t n = ((size_t)16 << 20) + 1000;
    char *bytes = malloc(n), src[700], sum[32], bad[] = "xxh3:0000000000000000", cmd[1400], d[600];
    for (size_t i = 0; i < n; i++)
        bytes[i] = (char)(i * 131 + (i >> 13) + (i >> 23) * 37 + 5); /* each 8 MiB piece differs */
    snprintf(d, sizeof d, "%s/rs", dir);
    snprintf(src, sizeof src, "%s/src.bin", d);
    /* cases: 0 all receive; 1 a wrong checksum; 2 the file missing; 3 the file larger than recorded; 4 the
     * holder writes too; 5 rank 2's directory missing; 6 an empty file; 7 the size limit stops the writes */
    for (int c = 0; c < 8; c++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", d, d);
        TU_CHECK(system(cmd) == 0, "fresh directory");
        size_t len = c == 6 ? 0 : n;
        if (c != 2) TU_CHECK(sl_file_write_atomic(src, bytes, len) == SL_OK, "source file: %s", sl_errmsg());
        snprintf(sum, sizeof sum, "xxh3:%016llx", (unsigned long long)XXH3_64bits(bytes, len));
        sl_comm *comms[3];
        TU_CHECK(sl_comm_init_loopback(3, comms, NULL) == SL_OK, "loopback comms: %s", sl_errmsg());
        stream_rank rk[3];
        char dests[3][700];
        pthread_t th[3];
        struct rlimit old = {0, 0};
        if (c == 7) old = limit_file_size((rlim_t)8 << 20);
        for (int r = 0; r < 3; r++) {
            snprintf(dests[r], sizeof dests[r], c == 5 && r == 2 ? "%s/gone/r%d.bin" : "%s/r%d.bin", d, r);
            rk[r] = (stream_rank){.comm = comms[r],
                                  .path = src,
                                  .dest = r != 1 || c == 4 ? dests[r] : NULL,
                                  .sum = c == 1 ? bad : sum,
                                  .want = c == 3 ? n - 1 : SIZE_MAX};
            pthread_create(&th[r], NULL, stream_main, &rk[r]);
        }
        for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
        if (c == 7) setrlimit(RLIMIT_FSIZE, &old);
        for (int r = 0; r < 3; r++) sl_comm_free(comms[r]);
        for (int r = 0; r < 3; r++) {
            stream_rank *x = &rk[r];
            if (c == 2 || c == 3) {
                TU_CHECK(!x->ok && strstr(x->why, c == 2 ? "host 1: f.bin missing"
                                                         : "host 1: f.bin is 16778216 bytes, larger than the "
                                                           "recorded 16778215"),
                         "stream case %d: rank %d told why: %s", c, r, x->why);
                TU_CHECK(access(dests[r], F_OK) != 0, "stream case %d: nothing at %s", c, dests[r]);
                continue;
            }
            TU_CHECK(x->ok && strcmp(x->got, sum) == 0,
                     "stream case %d: rank %d: ok %d, hash %s (file %s): %s", c, r, x->ok, x->got, sum,
                     x->why);
            int writes = x->dest != NULL, fails = (c == 5 && r == 2) || (c == 7 && writes);
            if (fails) {
                TU_CHECK(x->wst == SL_ERR_IO && strstr(x->err, c == 5 ? "gone/r2.bin" : "write failed"),
                         "stream case %d: rank %d's failed write named: %s", c, r, x->err);
            } else {
                TU_CHECK(x->wst == SL_OK, "stream case %d: rank %d wrote: %s", c, r, x->err);
            }
            int kept = writes && !fails && c != 1;
            TU_CHECK(kept ? tu_file_is(dests[r], bytes, len, "", 0) : access(dests[r], F_OK) != 0,
                     "stream case %d: rank %d %s", c, r, kept ? "holds the bytes" : "kept nothing");
        }
        TU_CHECK(count_tmp_at(d) == 0, "stream case %d: no temp file", c);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    TU_CHECK(system(cmd) == 0, "cleanup");
    free(bytes);
}

static sl_model *tiny_model(uint64_t seed) {
    sl_gpt2_config cfg = {1, 2, 32, 64, 16};
    sl_model *m = NULL;
    if (sl_gpt2_new(&cfg, &m) != SL_OK) return NULL;
    sl_model_init_weights_ex(m, seed);
    return m;
}

/* flip one byte 64 bytes before the end of path (inside the data) */
static void flip(const char *path) {
    int fd = open(path, O_RDWR);
    struct stat sb;
    fstat(fd, &sb);
    unsigned char c;
    pread(fd, &c, 1, sb.st_size - 64);
    c ^= 0xff;
    pwrite(fd, &c, 1, sb.st_size - 64);
    close(fd);
}

static void flip_in(const char *d, const char *rel) {
    char p[900];
    snprintf(p, sizeof p, "%s/%s", d, rel);
    flip(p);
}

/* path's contents replaced by text; returns text, or NULL when the file cannot be written */
static char *put_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fputs(text, f);
    fclose(f);
    return (char *)text;
}
/* step's manifest with the shard list of its first tensor replaced by `shards` (JSON text); returns the
 * original manifest text (to put back with put_text) or NULL */
static char *manifest_shards(const char *step, const char *shards) {
    char path[800], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/manifest.json", step);
    if (sl_file_read_all(path, &text, &len) != SL_OK) return NULL;
    cJSON *man = cJSON_Parse(text), *t = cJSON_GetObjectItem(man, "tensors");
    t = t ? t->child : NULL;
    cJSON *sh = cJSON_Parse(shards);
    char *edited = NULL;
    if (t && sh && cJSON_ReplaceItemInObject(t, "shards", sh)) {
        sh = NULL;
        edited = cJSON_Print(man);
    }
    cJSON_Delete(sh);
    cJSON_Delete(man);
    if (!edited || !put_text(path, edited)) {
        free(edited);
        free(text);
        return NULL;
    }
    free(edited);
    return text;
}

/* a single rank's full state of model m at step 3 (weights and the AdamW moments a1, a2 over seg) */
static sl_ckpt_state step3_state(sl_model *m, sl_ckpt_seg *seg, float *a1, float *a2) {
    sl_ckpt_state s = {.m = m,
                       .seg = seg,
                       .nseg = 1,
                       .exp_avg = a1,
                       .exp_avg_sq = a2,
                       .write_params = 1,
                       .write_optim = 1,
                       .step = 3,
                       .adam_t = 3,
                       .rank = 0,
                       .world = 1};
    return s;
}

static void test_writer(void) {
    char root[600], mem[600], p[800];
    snprintf(root, sizeof root, "%s/ck", dir);
    snprintf(mem, sizeof mem, "%s/mem", dir);
    setenv("SUANLI_MEM_CKPT_DIR", mem, 1);
    sl_model *m = tiny_model(7), *m2 = tiny_model(8);
    TU_CHECK(m && m2, "models");
    if (!m || !m2) return;
    int64_t n = m->numel;
    float *a1 = malloc(sizeof(float) * (size_t)n), *a2 = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        a1[i] = (float)i * 1e-3f;
        a2[i] = 1.0f / (float)(i + 1);
    }
    sl_ckpt_seg seg = {0, n, 0};
    sl_ckpt_state s = step3_state(m, &seg, a1, a2);
    sl_ckpt_writer *w = sl_ckpt_writer_new();
    TU_CHECK(sl_ckpt_save_begin(w, root, &s) == SL_OK, "save_begin: %s", sl_errmsg());
    sl_ckpt_writer_wait_snapshot(w);
    TU_CHECK(sl_ckpt_writer_wait(w) == SL_OK, "write: %s", sl_errmsg());
    TU_CHECK(sl_ckpt_commit(root, 3, 1, 0, "{}", "{}") == SL_OK, "commit disk: %s", sl_errmsg());
    TU_CHECK(sl_ckpt_commit(mem, 3, 1, 1, "{}", "{}") == SL_OK, "commit mem: %s", sl_errmsg());
    double snap, disk;
    int direct;
    sl_ckpt_writer_times(w, &snap, &disk, &direct);
    TU_CHECK(disk > 0 && sl_ckpt_writer_bytes(w) == sizeof(float) * 3 * (size_t)n, "writer times, bytes");
    sl_ckpt_writer_free(w);

    const char *copies[2] = {root, mem};
    for (int c = 0; c < 2; c++) {
        char step[700];
        snprintf(step, sizeof step, "%s/step-0000003", copies[c]);
        snprintf(p, sizeof p, "%s/shard-r00000.safetensors", step);
        sl_safetensors *f = NULL;
        TU_CHECK(sl_safetensors_open(p, &f) == SL_OK, "%s opens: %s", p, sl_errmsg());
        if (f) {
            char *text;
            size_t len;
            sl_file_read_all(p, &text, &len);
            uint64_t hl = 0;
            for (int i = 0; i < 8; i++) hl |= (uint64_t)(unsigned char)text[i] << (8 * i);
            TU_CHECK((8 + hl) % 4096 == 0, "%s: data starts at %llu, a multiple of 4096", p,
                     (unsigned long long)(8 + hl));
            free(text);
            sl_safetensors_close(f);
        }
        TU_CHECK(sl_ckpt_verify(step) == SL_OK, "%s verifies: %s", step, sl_errmsg());
        float *c1 = calloc((size_t)n, sizeof(float)), *c2 = calloc((size_t)n, sizeof(float));
        sl_ckpt_state l = {.m = m2, .seg = &seg, .nseg = 1, .exp_avg = c1, .exp_avg_sq = c2};
        TU_CHECK(sl_ckpt_load(step, &l) == SL_OK && l.step == 3, "%s loads: %s", step, sl_errmsg());
        TU_CHECK(!memcmp(m2->params_mem, m->params_mem, sizeof(float) * (size_t)n) &&
                     !memcmp(c1, a1, sizeof(float) * (size_t)n) && !memcmp(c2, a2, sizeof(float) * (size_t)n),
                 "%s: params and moments bitwise equal to the saved state", step);
        /* a tensor whose shards do not cover it (its shard list emptied: that verifies, every listed shard
         * being intact) is refused by the load, not loaded with a hole */
        char man[800];
        snprintf(man, sizeof man, "%s/manifest.json", step);
        char *orig = manifest_shards(step, "[]");
        TU_CHECK(orig && sl_ckpt_verify(step) == SL_OK, "%s: empty shard list verifies", step);
        l.verified = 0;
        TU_CHECK(sl_ckpt_load(step, &l) == SL_ERR_FORMAT && strstr(sl_errmsg(), "not fully covered"),
                 "%s: a tensor with no shards is refused: %s", step, sl_errmsg());
        if (orig) put_text(man, orig);
        free(orig);
        TU_CHECK(sl_ckpt_load(step, &l) == SL_OK, "%s: loads again with its manifest back: %s", step,
                 sl_errmsg());
        flip(p);
        sl_status vs = sl_ckpt_verify(step);
        TU_CHECK(vs == SL_ERR_FORMAT && strstr(sl_errmsg(), "checksum mismatch for 'exp_avg_sq/"),
                 "%s: a flipped data byte is a checksum mismatch of the last tensor: %s", step, sl_errmsg());
        l.verified = 0;
        TU_CHECK(sl_ckpt_load(step, &l) == SL_ERR_FORMAT && strstr(sl_errmsg(), "checksum mismatch"),
                 "%s: the load verifies too", step);
        free(c1);
        free(c2);
    }
    unsetenv("SUANLI_MEM_CKPT_DIR");
    free(a1);
    free(a2);
    sl_model_free(m);
    sl_model_free(m2);
}

/* a commit whose config.json cannot be written (a non-empty directory in its place: the rename onto it
 * fails) fails naming the file, and publishes nothing: no step dir, no `latest`; once the path is free the
 * same step commits with its config.json (Note [config.json in the commit] in src/ckpt/ckpt.c) */
static void test_commit_config(void) {
    char root[600], p[900];
    snprintf(root, sizeof root, "%s/cc", dir);
    sl_model *m = tiny_model(9);
    TU_CHECK(m != NULL, "model");
    if (!m) return;
    int64_t n = m->numel;
    float *a1 = calloc((size_t)n, sizeof(float)), *a2 = calloc((size_t)n, sizeof(float));
    sl_ckpt_seg seg = {0, n, 0};
    sl_ckpt_state s = step3_state(m, &seg, a1, a2);
    const char *model_json = "{\"architecture\": \"gpt2\", \"n_layer\": 1}";
    sl_ckpt_writer *w = sl_ckpt_writer_new();
    TU_CHECK(sl_ckpt_save_begin(w, root, &s) == SL_OK, "save_begin: %s", sl_errmsg());
    sl_ckpt_writer_wait_snapshot(w);
    TU_CHECK(sl_ckpt_writer_wait(w) == SL_OK, "write: %s", sl_errmsg());
    snprintf(p, sizeof p, "%s/step-0000003.tmp/config.json/blocker", root);
    TU_CHECK(sl_mkdirs(p) == SL_OK, "plant %s", p);
    sl_status st = sl_ckpt_commit(root, 3, 1, 0, model_json, "{}");
    TU_CHECK(st == SL_ERR_IO && strstr(sl_errmsg(), "step-0000003.tmp/config.json") &&
                 strstr(sl_errmsg(), "checkpoint step 3 not committed"),
             "a failed config.json write fails the commit: %d %s", st, sl_errmsg());
    snprintf(p, sizeof p, "%s/step-0000003", root);
    TU_CHECK(access(p, F_OK) != 0, "no step dir published without its config.json");
    snprintf(p, sizeof p, "%s/latest", root);
    TU_CHECK(access(p, F_OK) != 0, "no latest written");
    snprintf(p, sizeof p, "%s/step-0000003.tmp/config.json", root);
    TU_CHECK(sl_ckpt_rm_rf(p) == SL_OK, "unblock");
    TU_CHECK(sl_ckpt_commit(root, 3, 1, 0, model_json, "{}") == SL_OK, "commit once writable: %s",
             sl_errmsg());
    snprintf(p, sizeof p, "%s/step-0000003", root);
    TU_CHECK(sl_ckpt_verify(p) == SL_OK, "the committed step verifies (config.json included): %s",
             sl_errmsg());
    snprintf(p, sizeof p, "%s/step-0000003/config.json", root);
    char *text = NULL;
    size_t len = 0;
    TU_CHECK(sl_file_read_all(p, &text, &len) == SL_OK && len == strlen(model_json) &&
                 !memcmp(text, model_json, len),
             "config.json holds the model config");
    free(text);
    sl_ckpt_writer_free(w);
    sl_model_free(m);
    free(a1);
    free(a2);
}

#define TINY                                                                                                 \
    "--data-path data --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "              \
    "--micro-batch-size 2 --train-iters 8 --lr-decay-iters 8 --eval-interval 0 --eval-iters 1 --threads 1"

static char out[1 << 16];
static int cli_run(const char *mem, const char *args) {
    char pre[1400];
    snprintf(pre, sizeof pre, "cd %s && SUANLI_MEM_CKPT_DIR=%s timeout 300", dir, mem);
    return tu_runf(out, sizeof out, pre, "%s %s", tu_cli(), args);
}

static void test_restart_choice(void) {
    char cmd[2000], a[700], b[700];
    snprintf(cmd, sizeof cmd,
             "sh -c 'head -c 20000 %s/data/tinyshakespeare.txt > s.txt && %s data prepare --input s.txt "
             "--output-prefix data'",
             SL_SOURCE_DIR, tu_cli());
    int rc = tu_runf(out, sizeof out, "cd", "%s && %s", dir, cmd);
    TU_CHECK(rc == 0, "prepare: %s", out);
    /* the uninterrupted run: disk copies of steps 4 and 8, the in-memory copy of step 8 */
    rc = cli_run("mem1", "train " TINY " --save d1 --save-interval 4");
    TU_CHECK(rc == 0, "base: %s", out);
    flip_in(dir, "d1/step-0000008/shard-r00000.safetensors");
    rc = cli_run("mem1", "train " TINY " --save d1 --load d1 --save-interval 4");
    TU_CHECK(rc == 0 && strstr(out, "resumed from in-memory copy mem1/step-0000008") &&
                 !strstr(out, "not usable"),
             "in-memory copy first, the corrupt disk copy not read: rc %d %s", rc, out);
    snprintf(a, sizeof a, "%s/d1/model.safetensors", dir);
    rc = cli_run("mem2", "train " TINY " --save d2 --save-interval 4");
    TU_CHECK(rc == 0, "base 2: %s", out);
    snprintf(b, sizeof b, "%s/d2/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "resumed from memory: final weights bitwise equal to the uninterrupted run");
    flip_in(dir, "mem2/step-0000008/shard-r00000.safetensors");
    rc = cli_run("mem2", "train " TINY " --save d2 --load d2 --save-interval 4");
    TU_CHECK(rc == 0 && strstr(out, "mem2/step-0000008 is not usable") && strstr(out, "checksum mismatch") &&
                 strstr(out, "resumed from d2/step-0000008"),
             "a corrupt in-memory copy is detected and the disk copy used: rc %d %s", rc, out);
    TU_CHECK(tu_same_file(a, b), "resumed from disk: final weights bitwise equal to the uninterrupted run");
}

/* the entries of dir/sub whose names start with "step-" (-1: no such directory) */
static int step_entries(const char *sub) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, sub);
    DIR *d = opendir(p);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += !strncmp(e->d_name, "step-", 5);
    closedir(d);
    return n;
}

#define TINY12                                                                                               \
    "--data-path data --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "              \
    "--micro-batch-size 2 --train-iters 12 --lr-decay-iters 12 --eval-interval 0 --eval-iters 1 --threads 1"

/* Notes [In-memory roots on every node] and [A partial in-memory copy is not committed] (src/train/job.c):
 * two launchers on this machine as two nodes of one job (--nnodes 2, pretend hosts by SUANLI_COMM_HOSTNAME),
 * each with its own in-memory root. Node 1's root held every save's uncommitted step-N.tmp0 (and a stale one
 * of an earlier attempt) until the launcher exited: its first local rank now removes both. Node 0's root,
 * rank 0's, was committed with node 0's shards only, and a restart failed loading it: it is dropped too. */
static void test_mem_roots_nodes(void) {
    char pre[900];
    int port = 12000 + (int)((getpid() + 7919) % 20000); /* below the ephemeral range */
    TU_CHECK(tu_runf(out, sizeof out, "cd", "%s && mkdir -p nmB/step-0000099.tmp3", dir) == 0, "plant: %s",
             out);
    snprintf(pre, sizeof pre, "cd %s && timeout 200 sh -c", dir);
    int rc =
        tu_runf(out, sizeof out, pre,
                "'SUANLI_COMM_HOSTNAME=nodeA SUANLI_MEM_CKPT_DIR=nmA %s run -n 2 --nnodes 2 --node-rank 0 "
                "--master 127.0.0.1:%d -- %s train " TINY12 " --save dn --save-interval 4 > nA.log 2>&1 & "
                "p=$!; SUANLI_COMM_HOSTNAME=nodeB SUANLI_MEM_CKPT_DIR=nmB %s run -n 2 --nnodes 2 "
                "--node-rank 1 --master 127.0.0.1:%d -- %s train " TINY12 " --save dn --save-interval 4 "
                "> nB.log 2>&1; r1=$?; wait $p; r0=$?; cat nA.log nB.log; echo rc $r0 $r1'",
                tu_cli(), port, tu_cli(), tu_cli(), port, tu_cli());
    TU_CHECK(rc == 0 && strstr(out, "rc 0 0") && strstr(out, "trained 12 steps"),
             "two nodes, an in-memory root each: rc %d %s", rc, out);
    /* node 0's root holds ranks 0 and 1's shards only: not committed either (Note [A partial in-memory copy
     * is not committed]) */
    TU_CHECK(step_entries("nmA") == 0, "node 0's root: no partial copy committed or left (%d step entries)",
             step_entries("nmA"));
    TU_CHECK(step_entries("nmB") == 0, "node 1's root: no step copies left (%d step entries)",
             step_entries("nmB"));
    TU_CHECK(tu_runf(out, sizeof out, "cd",
                     "%s && grep -q 'removed 1 temp file(s) of interrupted saves from nmB: "
                     "step-0000099.tmp3' nB.log",
                     dir) == 0,
             "node 1's first rank removed the stale temp dir at setup");
    /* rank 3 (node 1) killed at step 10, both launchers restart: the ranks resume from the disk copy (step 4
     * or 8, as far as the commits got; node 0's partial in-memory copy was committed, chosen by ranks 0 and
     * 1, and failed to load: "checkpoint has no tensor", exit 2, not restarted); final weights bitwise those
     * of the run above */
    port = 12000 + (int)((getpid() + 104729) % 20000);
    rc = tu_runf(out, sizeof out, pre,
                 "'export SUANLI_FAULT_KILL_AT_STEP=10 SUANLI_FAULT_RANK=3; SUANLI_COMM_HOSTNAME=nodeA "
                 "SUANLI_MEM_CKPT_DIR=nmA %s run -n 2 --nnodes 2 --node-rank 0 --max-restarts 1 --master "
                 "127.0.0.1:%d -- %s train " TINY12 " --save dk --load dk --save-interval 4 > kA.log 2>&1 & "
                 "p=$!; SUANLI_COMM_HOSTNAME=nodeB SUANLI_MEM_CKPT_DIR=nmB %s run -n 2 --nnodes 2 "
                 "--node-rank 1 --max-restarts 1 --master 127.0.0.1:%d -- %s train " TINY12
                 " --save dk --load dk --save-interval 4 > kB.log 2>&1; r1=$?; wait $p; r0=$?; cat kA.log "
                 "kB.log; echo rc $r0 $r1'",
                 tu_cli(), port, tu_cli(), tu_cli(), port, tu_cli());
    TU_CHECK(rc == 0 && strstr(out, "rc 0 0") && strstr(out, "resumed from dk/step-0000") &&
                 !strstr(out, "in-memory copy") && !strstr(out, "no tensor"),
             "two nodes, rank 3 killed: resumed from the disk copy: rc %d %s", rc, out);
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/dn/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/dk/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b),
             "two nodes, rank 3 killed: final weights bitwise equal to the uninterrupted run");
}

#define TINY4                                                                                                \
    "--data-path data --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "              \
    "--micro-batch-size 2 --train-iters 4 --lr-decay-iters 8 --eval-interval 0 --eval-iters 1 --threads 1"

static int one_line(void) {
    const char *nl = strchr(out, '\n');
    return nl && nl[1] == 0;
}

/* a resume refuses another --seed (Note [A resume keeps the seed] in src/train/job.c): exit 2, one line
 * naming --seed, both values and the checkpoint, nothing written; the same seed resumes; a manifest without
 * train.seed (older checkpoints) takes the run's; --load of a final model (weights only) is not a resume */
static void test_resume_seed(void) {
    tu_watch(dir);
    int rc = cli_run("mem3", "train " TINY4 " --save s1 --save-interval 4");
    TU_CHECK(rc == 0, "s1: %s", out);
    const char *loads[] = {"--save s1 --load s1", "--save s1b --load s1/step-0000004"};
    for (int k = 0; k < 2; k++) {
        char args[600];
        snprintf(args, sizeof args, "train " TINY4 " --train-iters 8 %s --save-interval 4 --seed 7",
                 loads[k]);
        rc = cli_run("mem3", args);
        TU_CHECK(rc == 2 && one_line() && strstr(out, "--seed 7 differs from the seed 1234") &&
                     strstr(out, "step-0000004 was trained with") && strstr(out, "pass --seed 1234"),
                 "%s --seed 7: rc %d: %s", loads[k], rc, out);
        TU_CHECK(tu_unchanged(), "%s --seed 7: nothing written", loads[k]);
    }
    /* the seed is checked from the manifest before the state is loaded: a copy of step 4 whose manifest
     * names param/wte otherwise (checksums intact, so it verifies) fails the load with the seed it was
     * trained with, and is refused for the seed, not the load, with another one */
    rc =
        tu_runf(out, sizeof out, "cd",
                "%s && mkdir -p sx && cp -r s1/step-0000004 sx/ && sed -i 's|\"param/wte\"|\"param/wte_x\"|' "
                "sx/step-0000004/manifest.json && grep -c param/wte_x sx/step-0000004/manifest.json",
                dir);
    TU_CHECK(rc == 0 && atoi(out) == 1, "rename param/wte in a copy of step 4: rc %d %s", rc, out);
    tu_watch(dir);
    rc = cli_run("mem3",
                 "train " TINY4 " --train-iters 8 --save sx1 --load sx/step-0000004 --save-interval 4");
    TU_CHECK(rc == 2 && strstr(out, "checkpoint has no tensor 'param/wte'"),
             "the renamed tensor fails the load (seed 1234): rc %d %s", rc, out);
    rc =
        cli_run("mem3", "train " TINY4 " --train-iters 8 --save sx1 --load sx/step-0000004 --save-interval 4 "
                        "--seed 7");
    TU_CHECK(rc == 2 && one_line() &&
                 strstr(out, "--seed 7 differs from the seed 1234 that sx/step-0000004") &&
                 !strstr(out, "no tensor"),
             "--seed 7: refused before the load: rc %d %s", rc, out);
    TU_CHECK(tu_unchanged(), "--seed 7 before the load: nothing written");
    rc = cli_run("mem3", "train " TINY4 " --train-iters 8 --save s1 --load s1 --save-interval 4 --seed 1234");
    TU_CHECK(rc == 0 && strstr(out, "resumed from"), "the same seed resumes: rc %d %s", rc, out);
    /* a checkpoint written before the manifest recorded the seed: compatible with any --seed */
    char man[800], *text = NULL;
    size_t len;
    snprintf(man, sizeof man, "%s/s1/step-0000008/manifest.json", dir);
    cJSON *o = sl_file_read_all(man, &text, &len) == SL_OK ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    TU_CHECK(o && cJSON_IsNumber(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "train"), "seed")) &&
                 cJSON_GetObjectItem(cJSON_GetObjectItem(o, "train"), "seed")->valuedouble == 1234,
             "the manifest records train.seed 1234");
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(o, "train"), "seed");
    text = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (text) put_text(man, text);
    free(text);
    rc = cli_run("mem4", "train " TINY4 " --train-iters 9 --save s1 --load s1 --save-interval 4 --seed 7");
    TU_CHECK(rc == 0 && strstr(out, "resumed from s1/step-0000008 at step 8"),
             "a manifest without train.seed resumes with --seed 7: rc %d %s", rc, out);
    /* weights only (a dir with model.safetensors and no checkpoint): a fresh run, any seed */
    rc = tu_runf(out, sizeof out, "cd", "%s && mkdir -p w && cp s1/model.safetensors s1/config.json w/", dir);
    TU_CHECK(rc == 0, "copy the final weights: %s", out);
    rc = cli_run("mem5", "train " TINY4 " --load w --save s3 --seed 7");
    TU_CHECK(rc == 0 && !strstr(out, "resumed from"), "--load weights with another seed: rc %d %s", rc, out);
}

/* a restart's setup removes what interrupted saves left under --save (and the in-memory root): step-N.tmpK
 * dirs and latest.tmp.PID files (Note [Stale temp dirs] in src/ckpt/ckpt.c); a real checkpoint, user files
 * with similar names and a symlink (and its target) are untouched */
static void test_stale_tmp(void) {
    int rc = cli_run("mem6", "train " TINY4 " --save st --save-interval 4");
    TU_CHECK(rc == 0, "st: %s", out);
    rc = tu_runf(out, sizeof out, "cd",
                 "%s && mkdir -p st/step-0000002.tmp3 st/step-0000008.tmp st/step-0000002.tmp3.bak "
                 "st/step-2.tmp mine mem6/step-0000006.tmp1 && echo x > "
                 "st/step-0000002.tmp3/shard-r00000.safetensors && "
                 "echo x > st/latest.tmp.4242 && echo keep > st/notes.tmp && echo keep > mine/data && "
                 "ln -s ../mine st/step-0000009.tmp && cp -r st/step-0000004 st4",
                 dir);
    TU_CHECK(rc == 0, "plant: %s", out);
    rc = cli_run("mem6", "train " TINY4 " --save st --load st --save-interval 4");
    TU_CHECK(rc == 0 && strstr(out, "removed 3 temp file(s) of interrupted saves from st: ") &&
                 strstr(out, "removed 1 temp file(s) of interrupted saves from mem6: step-0000006.tmp1"),
             "stale temp files reported: rc %d %s", rc, out);
    const char *gone[] = {"st/step-0000002.tmp3", "st/step-0000008.tmp", "st/latest.tmp.4242",
                          "mem6/step-0000006.tmp1"};
    const char *kept[] = {"st/step-0000002.tmp3.bak", "st/step-2.tmp", "st/notes.tmp",
                          "st/step-0000009.tmp",      "mine/data",     "st/latest"};
    char p[900], q[900];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, gone[i]);
        TU_CHECK(access(p, F_OK) != 0, "%s removed", gone[i]);
    }
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, kept[i]);
        TU_CHECK(access(p, F_OK) == 0, "%s kept", kept[i]);
    }
    const char *files[] = {"manifest.json", "config.json", "shard-r00000.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/st/step-0000004/%s", dir, files[i]);
        snprintf(q, sizeof q, "%s/st4/%s", dir, files[i]);
        TU_CHECK(tu_same_file(p, q), "the checkpoint's %s untouched", files[i]);
    }
}

int main(void) {
    dir = tu_tmpdir("ckpt_io");
    test_direct_and_fallback();
    test_pieces();
    test_exchange();
    test_restore_stream();
    test_writer();
    test_commit_config();
    test_restart_choice();
    test_mem_roots_nodes();
    test_resume_seed();
    test_stale_tmp();
    return tu_finish("test_ckpt_io");
}
