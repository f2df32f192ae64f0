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
 *    a read of host h's file is done by h's first rank and broadcast to the others (Note [Pooled restore]).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/pool_internal.h"

enum { PIECE = 8 << 20 };

typedef struct {
    int32_t src, dst; /* ranks */
    int64_t hlen, blen;
    char name[88]; /* file name in the receiver's host step dir */
} stream_desc;
_Static_assert(sizeof(stream_desc) == 112, "stream descriptor is 112 bytes");

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

/* The disk side of an exchange: a thread that writes round t's received pieces while round t+1's travel.
 * The exchange thread posts round t after its receives completed, and reuses buffer t % 2 for round t+2
 * only once the disk thread has written round t. A failed write is kept (local) and later rounds are not
 * written, but the exchange goes on: the peers never wait on a rank whose disk failed. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    incoming *in;
    int nin, quit;
    int64_t posted, written; /* rounds handed to the disk thread, and written by it */
    sl_status local;
    char err[512];
} disk_side;

/* write round t's pieces (the disk thread, or the exchange thread when no disk thread could start) */
static void disk_round(disk_side *ds, int64_t t) {
    pthread_mutex_lock(&ds->mu);
    int ok = ds->local == SL_OK;
    pthread_mutex_unlock(&ds->mu);
    sl_status st = SL_OK;
    for (int k = 0; k < ds->nin && ok && st == SL_OK; k++) {
        incoming *x = &ds->in[k];
        int part;
        int64_t off, len;
        if (!x->open || !piece_of(x->d, t, &part, &off, &len)) continue;
        st = sl_ckpt_out_write(&x->out, x->buf[t % 2], (size_t)len, (size_t)(part ? x->d->hlen + off : off),
                               PIECE);
    }
    pthread_mutex_lock(&ds->mu);
    if (st != SL_OK && ds->local == SL_OK) {
        ds->local = st;
        snprintf(ds->err, sizeof ds->err, "%s", sl_errmsg());
    }
    ds->written = t + 1;
    pthread_cond_broadcast(&ds->cv);
    pthread_mutex_unlock(&ds->mu);
}

static void *disk_main(void *arg) {
    disk_side *ds = arg;
    pthread_mutex_lock(&ds->mu);
    for (;;) {
        while (ds->written == ds->posted && !ds->quit) pthread_cond_wait(&ds->cv, &ds->mu);
        if (ds->written == ds->posted) break; /* quit, everything written */
        int64_t t = ds->written;
        pthread_mutex_unlock(&ds->mu);
        disk_round(ds, t);
        pthread_mutex_lock(&ds->mu);
    }
    pthread_mutex_unlock(&ds->mu);
    return NULL;
}

/* wait until the disk thread has written rounds < t (t <= 0: no wait) */
static void disk_wait(disk_side *ds, int64_t t) {
    pthread_mutex_lock(&ds->mu);
    while (ds->written < t) pthread_cond_wait(&ds->cv, &ds->mu);
    pthread_mutex_unlock(&ds->mu);
}

static void disk_post(disk_side *ds, int64_t t) {
    pthread_mutex_lock(&ds->mu);
    ds->posted = t + 1;
    pthread_cond_broadcast(&ds->cv);
    pthread_mutex_unlock(&ds->mu);
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
    pthread_mutex_init(&ds.mu, NULL);
    pthread_cond_init(&ds.cv, NULL);
    pthread_t disk_th;
    int threaded = nin > 0 && local == SL_OK && sl_thread_spawn(&disk_th, disk_main, &ds) == 0;
    for (int64_t t = 0; t < rounds && st == SL_OK; t++) {
        int nreq = 0;
        sl_status ps = SL_OK;
        if (threaded) disk_wait(&ds, t - 1); /* buffers t % 2 are free once round t - 2 is written */
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
        if (st == SL_OK && ps != SL_OK)
            st = sl_fail(ps, "checkpoint transfer, piece %lld of %lld: %s", (long long)t, (long long)rounds,
                         sl_errmsg());
        if (st == SL_OK && threaded)
            disk_post(&ds, t);
        else if (st == SL_OK && nin > 0)
            disk_round(&ds, t);
    }
    if (threaded) {
        pthread_mutex_lock(&ds.mu);
        ds.quit = 1;
        pthread_cond_broadcast(&ds.cv);
        pthread_mutex_unlock(&ds.mu);
        pthread_join(disk_th, NULL);
    }
    if (local == SL_OK && ds.local != SL_OK) local = sl_fail(ds.local, "%s", ds.err);
    pthread_cond_destroy(&ds.cv);
    pthread_mutex_destroy(&ds.mu);
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
