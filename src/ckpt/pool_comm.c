/* Pooled checkpoint transfers over sl_comm: the bytes a rank sends to its peer hosts (replicas, erasure-code
 * blocks), the commit's sidecars, and the restore's file reads. See Note [Pool transfers over comm].
 *
 * Note [Pool transfers over comm]
 * With sl_ckpt_pool.comm set (the trainer sets a communicator of the job's ranks that only the writer
 * threads use), no rank opens another host's directory during a run: a node-local disk is only reachable
 * from its own node, as on a cluster without a shared file system.
 *  - Save (writer threads, every rank): each rank's outgoing streams (a replica of its shard file, or one
 *    erasure-code block with its header) are described in fixed-size records and all-gathered, so every
 *    rank knows every stream, its receiver and its length. The bytes then move in rounds: in round t every
 *    stream's piece t (8 MiB pieces of the head, then of the body) is sent and received inside one group
 *    call, so no ordering of blocking sends can deadlock and each receiver holds one piece per incoming
 *    stream. The receiver of host h' for a stream from rank s is the rank of h' with s's local index (modulo
 *    h''s rank count); it writes the stream into its own host directory (temp name, fsync, rename). Each
 *    incoming stream has two piece buffers: a disk thread writes round t's pieces while round t+1's travel,
 *    with O_DIRECT where the pieces fall on 4096-byte offsets (a shard file's head is padded to 4096, Note
 *    [Shard write path]), so a received replica costs one copy (the transfer) and no page-cache copy or
 *    writeback; the sender meanwhile writes its own file on another thread (ckpt.c). Before, pieces were
 *    written through the page cache between the rounds: a save of GPT-2 124M with 2 replicas took 5.5-7.7 s
 *    in the background and slowed the training steps by half; now 1.2-1.8 s (docs/BENCHMARKS.md). A
 *    receiver whose disk fails keeps taking part in the rounds and reports the failure at the end, so the
 *    peers never wait on a rank that left the exchange.
 *  - Commit (writer threads, every rank): the sidecars are all-gathered, every rank builds the same
 *    manifest from them, the first rank of each host commits its own host's step dir, and the ranks agree on
 *    the result by all-reduce.
 *  - Restore (pool.c, training thread): the first ranks of the hosts run the same assembly in lock step;
 *    a read of host h's file is done by h's first rank and broadcast to the others (Note [Pooled restore]),
 *    in pieces (Note [Pooled restore stream]: below for replicated files, pool.c for erasure-coded ones).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ckpt/pool_internal.h"

enum { PIECE = SL_CKPT_POOL_PIECE };
typedef sl_ckpt_pool_stream_desc stream_desc;

int sl_ckpt_pool_first_rank(int host, int world, int hosts) {
    int r = 0;
    while (r < world && sl_ckpt_pool_host_of(r, world, hosts) < host) r++;
    return r;
}

int sl_ckpt_pool_receiver(int src, int host, int world, int hosts) {
    int first = sl_ckpt_pool_first_rank(host, world, hosts),
        next = sl_ckpt_pool_first_rank(host + 1, world, hosts);
    int sfirst = sl_ckpt_pool_first_rank(sl_ckpt_pool_host_of(src, world, hosts), world, hosts);
    int count = next - first;
    return first + (src - sfirst) % (count > 0 ? count : 1);
}

static int64_t pieces(int64_t n) { return (n + PIECE - 1) / PIECE; }

/* piece t of a stream: its part (0 head, 1 body), offset and length; 0 if the stream has no piece t */
static int piece_of(const stream_desc *d, int64_t t, int *part, int64_t *off, int64_t *len) {
    int64_t ph = pieces(d->hlen), pb = pieces(d->blen);
    if (t < ph) {
        *part = 0;
        *off = t * PIECE;
        *len = d->hlen - *off < PIECE ? d->hlen - *off : PIECE;
        return 1;
    }
    if (t < ph + pb) {
        *part = 1;
        *off = (t - ph) * PIECE;
        *len = d->blen - *off < PIECE ? d->blen - *off : PIECE;
        return 1;
    }
    return 0;
}

typedef struct {
    const stream_desc *d;
    char *buf[2]; /* pieces t with t % 2 == b, received while the other is on its way to the disk */
    sl_ckpt_out out;
    int open; /* out holds a temp file */
} incoming;

/* A thread that runs fn(arg, t) for t = 0, 1, ... in order, as the caller posts them: the disk side of an
 * exchange (round t's pieces written while round t+1's travel), and the holder's reads and the receivers'
 * writes of a restore stream (Note [Pooled restore stream]). Where no thread can start, post runs fn on the
 * caller's. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void (*fn)(void *arg, int64_t t);
    void *arg;
    int64_t posted, done; /* rounds handed over, and finished */
    int quit, threaded;
    pthread_t th;
} piece_worker;

static void *worker_main(void *arg) {
    piece_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->done == w->posted && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (w->done == w->posted) break; /* quit, everything done */
        int64_t t = w->done;
        pthread_mutex_unlock(&w->mu);
        w->fn(w->arg, t);
        pthread_mutex_lock(&w->mu);
        w->done = t + 1;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void worker_start(piece_worker *w, void (*fn)(void *, int64_t), void *arg) {
    memset(w, 0, sizeof *w);
    w->fn = fn;
    w->arg = arg;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->threaded = sl_thread_spawn(&w->th, worker_main, w) == 0;
}

/* hand round t (the next one) over */
static void worker_post(piece_worker *w, int64_t t) {
    if (!w->threaded) {
        w->fn(w->arg, t);
        w->posted = w->done = t + 1;
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->posted = t + 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* wait until rounds < t are done (t <= 0: no wait) */
static void worker_wait(piece_worker *w, int64_t t) {
    pthread_mutex_lock(&w->mu);
    while (w->done < t) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* every posted round done, the thread gone */
static void worker_stop(piece_worker *w) {
    if (w->threaded) {
        pthread_mutex_lock(&w->mu);
        w->quit = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->th, NULL);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

/* The disk side of an exchange, run by a piece_worker: buffer t % 2 is reused for round t + 2 only once
 * round t is written. A failed write is kept (local) and later rounds are not written, but the exchange
 * goes on: the peers never wait on a rank whose disk failed. local and err belong to the worker until it
 * stops. */
typedef struct {
    incoming *in;
    int nin;
    sl_status local;
    char err[512];
} disk_side;

static void disk_round(void *arg, int64_t t) {
    disk_side *ds = arg;
    sl_status st = SL_OK;
    for (int k = 0; k < ds->nin && ds->local == SL_OK && st == SL_OK; k++) {
        incoming *x = &ds->in[k];
        int part;
        int64_t off, len;
        if (!x->open || !piece_of(x->d, t, &part, &off, &len)) continue;
        st = sl_ckpt_out_write(&x->out, x->buf[t % 2], (size_t)len, (size_t)(part ? x->d->hlen + off : off),
                               PIECE);
    }
    if (st != SL_OK && ds->local == SL_OK) {
        ds->local = st;
        snprintf(ds->err, sizeof ds->err, "%s", sl_errmsg());
    }
}

/* The streams with a piece in round t, for a failed round's message: "NAME to rank D, NAME from rank S"
 * (the transport's message names the peer that failed; this names the files at stake). */
static void round_streams(char *buf, size_t cap, const stream_desc *mine, int nout, const incoming *in,
                          int nin, int64_t t) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < nout + nin && n < cap; i++) {
        const stream_desc *d = i < nout ? &mine[i] : in[i - nout].d;
        int part;
        int64_t off, len;
        if (!piece_of(d, t, &part, &off, &len)) continue;
        int k = snprintf(buf + n, cap - n, "%s%.*s %s rank %d", n ? ", " : "", (int)sizeof d->name, d->name,
                         i < nout ? "to" : "from", i < nout ? d->dst : d->src);
        n += k > 0 ? (size_t)k : 0;
    }
}

sl_status sl_ckpt_pool_exchange(const sl_ckpt_pool *p, const char *stepbase, const sl_ckpt_pool_stream *out,
                                int nout) {
    sl_comm *c = p->comm;
    int world = sl_comm_size(c), me = sl_comm_rank(c);
    if (nout > SL_CKPT_POOL_MAX_STREAMS)
        return sl_fail(SL_ERR_INTERNAL, "checkpoint transfer: %d streams (at most %d)", nout,
                       SL_CKPT_POOL_MAX_STREAMS);
    stream_desc mine[SL_CKPT_POOL_MAX_STREAMS];
    memset(mine, 0, sizeof mine);
    for (int i = 0; i < SL_CKPT_POOL_MAX_STREAMS; i++) mine[i].src = mine[i].dst = -1;
    for (int i = 0; i < nout; i++) {
        mine[i].src = me;
        mine[i].dst = out[i].dst;
        mine[i].hlen = (int64_t)out[i].hlen;
        mine[i].blen = (int64_t)out[i].blen;
        snprintf(mine[i].name, sizeof mine[i].name, "%s", out[i].name);
    }
    size_t per = sizeof mine;
    stream_desc *all = malloc(per * (size_t)world);
    if (!all) return sl_fail(SL_ERR_NOMEM, "checkpoint transfer: out of memory");
    sl_status st = sl_comm_all_gather(c, mine, all, per, SL_COMM_U8);
    if (st != SL_OK) {
        free(all);
        return sl_fail(st, "checkpoint transfer: exchanging stream descriptors: %s", sl_errmsg());
    }
    int nall = world * SL_CKPT_POOL_MAX_STREAMS, nin = 0;
    int64_t rounds = 0;
    for (int i = 0; i < nall; i++) {
        const stream_desc *d = &all[i];
        if (d->src < 0) continue;
        int64_t n = pieces(d->hlen) + pieces(d->blen);
        if (n > rounds) rounds = n;
        if (d->dst == me) nin++;
    }
    incoming *in = calloc((size_t)(nin ? nin : 1), sizeof *in);
    sl_status local = in ? SL_OK : sl_fail(SL_ERR_NOMEM, "checkpoint transfer: out of memory");
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/host-%d/%s", p->local_root, p->host, stepbase);
    if (in && nin > 0) local = sl_mkdirs(dir);
    for (int i = 0, k = 0; in && i < nall; i++) { /* incoming streams in (src, index) order */
        const stream_desc *d = &all[i];
        if (d->src < 0 || d->dst != me) continue;
        incoming *x = &in[k++];
        x->d = d;
        for (int b = 0; b < 2; b++) {
            x->buf[b] = sl_malloc_aligned_to(PIECE, 4096);
            if (!x->buf[b] && local == SL_OK)
                local = sl_fail(SL_ERR_NOMEM, "checkpoint transfer: out of memory");
        }
        char path[4500];
        snprintf(path, sizeof path, "%.4300s/%.*s", dir, (int)sizeof d->name, d->name);
        if (local == SL_OK && strchr(d->name, '/'))
            local = sl_fail(SL_ERR_INTERNAL, "checkpoint transfer: bad file name '%s'", d->name);
        /* O_DIRECT where the pieces fall on 4096-byte offsets (Note [Shard write path]) */
        if (local == SL_OK) {
            local = sl_ckpt_out_open(&x->out, path, d->hlen % 4096 == 0);
            x->open = local == SL_OK;
        }
    }
    if (!in) nin = 0;
    /* scratch for an incoming stream that could not be set up: its pieces are still received */
    char *sink = local != SL_OK && nin > 0 ? sl_malloc_aligned(PIECE) : NULL;
    sl_comm_req *req[2 * SL_CKPT_POOL_MAX_STREAMS + 1], **reqs = req;
    int cap_req = 2 * SL_CKPT_POOL_MAX_STREAMS + 1;
    if (nout + nin > cap_req) {
        reqs = calloc((size_t)(nout + nin), sizeof *reqs);
        if (!reqs) {
            for (int k = 0; k < nin; k++) {
                if (in[k].open) sl_ckpt_out_close(&in[k].out, 0, 0, 0); /* removes the temp file */
                for (int b = 0; b < 2; b++) sl_free_aligned(in[k].buf[b]);
            }
            sl_free_aligned(sink);
            free(in);
            free(all);
            return sl_fail(SL_ERR_NOMEM, "checkpoint transfer: out of memory");
        }
    }
    disk_side ds = {.in = in, .nin = nin, .local = local};
    piece_worker disk;
    int writing = nin > 0 && local == SL_OK; /* else nothing is written: the pieces are only received */
    if (writing) worker_start(&disk, disk_round, &ds);
    for (int64_t t = 0; t < rounds && st == SL_OK; t++) {
        int nreq = 0;
        sl_status ps = SL_OK;
        if (writing) worker_wait(&disk, t - 1); /* buffers t % 2 are free once round t - 2 is written */
        sl_comm_group_start(); /* submitted together at group_end, completed by the waits below */
        for (int i = 0; i < nout; i++) {
            int part;
            int64_t off, len;
            if (!piece_of(&mine[i], t, &part, &off, &len)) continue;
            const char *b = part ? out[i].body : out[i].head;
            sl_status s1 = sl_comm_send_async(c, b + off, (size_t)len, SL_COMM_U8, out[i].dst, &reqs[nreq]);
            if (s1 == SL_OK)
                nreq++;
            else if (ps == SL_OK)
                ps = s1;
        }
        for (int k = 0; k < nin; k++) {
            int part;
            int64_t off, len;
            if (!piece_of(in[k].d, t, &part, &off, &len)) continue;
            char *dst = in[k].buf[t % 2] ? in[k].buf[t % 2] : sink;
            if (!dst) { /* no memory even for the sink: the exchange cannot go on */
                st = sl_fail(SL_ERR_NOMEM, "checkpoint transfer: out of memory");
                break;
            }
            sl_status s1 = sl_comm_recv_async(c, dst, (size_t)len, SL_COMM_U8, in[k].d->src, &reqs[nreq]);
            if (s1 == SL_OK)
                nreq++;
            else if (ps == SL_OK)
                ps = s1;
        }
        sl_status gs = sl_comm_group_end();
        if (ps == SL_OK) ps = gs;
        for (int q = 0; q < nreq; q++) {
            sl_status ws = sl_comm_wait(reqs[q]);
            if (ps == SL_OK) ps = ws;
        }
        if (st == SL_OK && ps != SL_OK) { /* the incoming temp files are removed below */
            char err[1024], what[400];
            snprintf(err, sizeof err, "%s", sl_errmsg());
            round_streams(what, sizeof what, mine, nout, in, nin, t);
            st = sl_fail(ps, "checkpoint transfer of %s, piece %lld of %lld: %s", what, (long long)t + 1,
                         (long long)rounds, err);
        }
        if (st == SL_OK && writing) worker_post(&disk, t);
    }
    if (writing) worker_stop(&disk);
    if (local == SL_OK && ds.local != SL_OK) local = sl_fail(ds.local, "%s", ds.err);
    for (int k = 0; k < nin; k++) { /* finish: truncate, fsync, rename; or remove the temp file */
        incoming *x = &in[k];
        int keep = st == SL_OK && local == SL_OK;
        sl_status cs =
            x->open ? sl_ckpt_out_close(&x->out, (size_t)(x->d->hlen + x->d->blen), 1, keep) : SL_OK;
        if (keep && cs != SL_OK) local = cs;
        for (int b = 0; b < 2; b++) sl_free_aligned(x->buf[b]);
    }
    if (reqs != req) free(reqs);
    if (st == SL_OK && local == SL_OK && nin > 0) sl_fsync_dir(dir);
    sl_free_aligned(sink);
    free(in);
    free(all);
    if (st == SL_OK && local != SL_OK) st = local;
    return st;
}

/* Note [Pooled restore stream]
 * A restore moves each replicated file from one holder host to the other hosts' leaders (Note [Pooled
 * restore]). It used to move whole files: the holder read the file into memory, broadcast it, and every
 * leader hashed it and then wrote it, one stage after the other, with the file's size in memory on every
 * host. Now the file travels in PIECE-sized pieces through two buffers per leader: the holder's worker
 * reads piece t+1 from its disk while piece t is broadcast, every leader hashes each piece as it arrives
 * (XXH3 streaming: the same value as over the whole file), and a receiver's worker writes piece t into its
 * temp file (O_DIRECT) while piece t+1 travels. The file is renamed into place only when the hash matches
 * the manifest's, so a copy that turns out corrupt leaves nothing behind and the next copy is streamed the
 * same way. A read error on the holder part-way does not stop the rounds (the peers would wait): it goes
 * out in the status broadcast after the last piece. Memory per leader: two pieces, whatever the file size.
 * The header broadcast carries the holder's size check, so a missing or wrong-sized copy costs one small
 * broadcast. Measured in docs/BENCHMARKS.md ("Pooled restore in pieces"). */
typedef struct {
    int64_t ok, n;
    char why[496];
} stream_head;

typedef struct {
    int fd; /* holder: the file */
    char *buf[2];
    int64_t size;
    int rerr; /* holder: a read failed (errno), or the file ended early (-1) */
    sl_ckpt_out out;
    int writing; /* out holds a temp file */
    sl_status wst;
    char werr[512];
} rstream;

static int64_t piece_len(const rstream *r, int64_t t) {
    int64_t off = t * PIECE;
    return r->size - off < PIECE ? r->size - off : PIECE;
}

/* holder's worker: piece t from the disk into buf[t % 2] (after a failure: zeros, the rounds go on) */
static void rs_read(void *arg, int64_t t) {
    rstream *r = arg;
    char *b = r->buf[t % 2];
    int64_t len = piece_len(r, t), got = 0;
    while (!r->rerr && got < len) {
        ssize_t k = pread(r->fd, b + got, (size_t)(len - got), (off_t)(t * PIECE + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            r->rerr = k < 0 ? errno : -1;
        else
            got += k;
    }
    if (got < len) memset(b + got, 0, (size_t)(len - got));
}

/* a receiver's worker: piece t into its temp file (after a failure: nothing more) */
static void rs_write(void *arg, int64_t t) {
    rstream *r = arg;
    if (r->wst != SL_OK) return;
    r->wst = sl_ckpt_out_write(&r->out, r->buf[t % 2], (size_t)piece_len(r, t), (size_t)(t * PIECE), PIECE);
    if (r->wst != SL_OK) snprintf(r->werr, sizeof r->werr, "%s", sl_errmsg());
}

int sl_ckpt_pool_restore_stream(sl_comm *lc, int holder, const char *path, const char *name, size_t want,
                                const char *dest, const char *want_sum, char *got, size_t gcap,
                                sl_status *wst, char *why, size_t wcap) {
    int me = sl_comm_rank(lc);
    rstream r = {.fd = -1};
    stream_head m;
    memset(&m, 0, sizeof m);
    *wst = SL_OK;
    if (me == holder) {
        struct stat sb;
        r.fd = open(path, O_RDONLY | O_CLOEXEC);
        if (r.fd < 0 && errno == ENOENT)
            snprintf(m.why, sizeof m.why, "host %d: %s missing", holder, name);
        else if (r.fd < 0 || fstat(r.fd, &sb) != 0)
            snprintf(m.why, sizeof m.why, "host %d: %s unreadable", holder, name);
        else if (want != SIZE_MAX && (size_t)sb.st_size != want)
            snprintf(m.why, sizeof m.why, "host %d: %s is %lld bytes, %s than the recorded %zu", holder, name,
                     (long long)sb.st_size, (size_t)sb.st_size < want ? "smaller" : "larger", want);
        else {
            m.ok = 1;
            m.n = (int64_t)sb.st_size;
            posix_fadvise(r.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        }
    }
    int ok = 0;
    if (sl_comm_broadcast(lc, &m, &m, sizeof m, SL_COMM_U8, holder) != SL_OK)
        snprintf(why, wcap, "host %d: %s: transfer failed: %s", holder, name, sl_errmsg());
    else if (!m.ok)
        snprintf(why, wcap, "%s", m.why);
    else
        ok = 1;
    if (!ok) {
        if (r.fd >= 0) close(r.fd);
        return 0;
    }
    r.size = m.n;
    for (int b = 0; b < 2; b++) r.buf[b] = sl_malloc_aligned_to(PIECE, 4096);
    int32_t lack = !r.buf[0] || !r.buf[1], any = 0; /* a leader without the memory: all report it */
    sl_status rs = sl_comm_all_reduce(lc, &lack, &any, 1, SL_COMM_I32, SL_COMM_MAX);
    if (rs != SL_OK || any) {
        snprintf(why, wcap, "host %d: %s: %s%s", holder, name,
                 rs != SL_OK ? "transfer failed: " : "a host has no memory to receive it",
                 rs != SL_OK ? sl_errmsg() : "");
        ok = 0;
    }
    if (ok && dest) {
        *wst = sl_ckpt_out_open(&r.out, dest, 1);
        r.writing = *wst == SL_OK;
        r.wst = *wst;
        if (*wst != SL_OK) snprintf(r.werr, sizeof r.werr, "%s", sl_errmsg());
    }
    XXH3_state_t hs;
    XXH3_64bits_reset(&hs);
    int64_t np = ok ? (r.size + PIECE - 1) / PIECE : 0;
    piece_worker w;
    int reader = me == holder && np > 0, writer = me != holder && r.writing;
    if (reader || writer) worker_start(&w, reader ? rs_read : rs_write, &r);
    if (reader) worker_post(&w, 0);
    for (int64_t t = 0; ok && t < np; t++) {
        char *b = r.buf[t % 2];
        size_t len = (size_t)piece_len(&r, t);
        if (reader) {
            worker_wait(&w, t + 1);                 /* piece t read */
            if (t + 1 < np) worker_post(&w, t + 1); /* into the other buffer, broadcast last round */
        }
        if (writer) worker_wait(&w, t - 1); /* buffer t % 2 written out (piece t - 2) */
        if (sl_comm_broadcast(lc, b, b, len, SL_COMM_U8, holder) != SL_OK) {
            snprintf(why, wcap, "host %d: %s: transfer failed: %s", holder, name, sl_errmsg());
            ok = 0;
            break;
        }
        XXH3_64bits_update(&hs, b, len);
        if (writer)
            worker_post(&w, t);
        else if (r.writing && r.wst == SL_OK)
            rs_write(&r, t); /* the holder writes too: no link possible */
    }
    if (reader || writer) worker_stop(&w);
    if (ok) { /* the holder's reads, told after the last piece */
        memset(&m, 0, sizeof m);
        m.ok = !r.rerr;
        if (r.rerr)
            snprintf(m.why, sizeof m.why, "host %d: %s %s", holder, name,
                     r.rerr < 0 ? "changed size while read" : "unreadable");
        if (sl_comm_broadcast(lc, &m, &m, sizeof m, SL_COMM_U8, holder) != SL_OK) {
            snprintf(why, wcap, "host %d: %s: transfer failed: %s", holder, name, sl_errmsg());
            ok = 0;
        } else if (!m.ok) {
            snprintf(why, wcap, "%s", m.why);
            ok = 0;
        }
    }
    if (ok) snprintf(got, gcap, "xxh3:%016llx", (unsigned long long)XXH3_64bits_digest(&hs));
    if (r.writing) {
        int keep = ok && r.wst == SL_OK && strcmp(got, want_sum) == 0;
        sl_status cs = sl_ckpt_out_close(&r.out, (size_t)r.size, 0, keep);
        if (r.wst == SL_OK && keep && cs != SL_OK) {
            r.wst = cs;
            snprintf(r.werr, sizeof r.werr, "%s", sl_errmsg());
        }
    }
    if (r.wst != SL_OK) *wst = sl_fail(r.wst, "%s", r.werr);
    if (r.fd >= 0) close(r.fd);
    for (int b = 0; b < 2; b++) sl_free_aligned(r.buf[b]);
    return ok;
}
