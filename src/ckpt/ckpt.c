/* Sharded asynchronous checkpoints with atomic commit and resharding load. See include/suanli/ckpt.h.
 *
 * Note [Checkpoint commit protocol]
 * 1. Each writing rank snapshots its ranges into host memory and returns to training; a thread writes
 *    ROOT/step-N.tmp/shard-rR.safetensors and shard-rR.json (its entries + checksums), each atomically
 *    (temp name, fsync, rename).
 * 2. When every rank's writer is done (the caller agrees on that), rank 0 merges the sidecars into
 *    manifest.json (atomic), fsyncs the tmp dir, renames it to step-N, fsyncs ROOT, and rewrites
 *    ROOT/latest atomically. A crash before the rename leaves only a .tmp dir that loaders ignore; a crash
 *    after it leaves a complete step dir; `latest` always names a complete one.
 * 3. Loading never trusts `latest` blindly: step dirs are tried newest first, and each must have its
 *    manifest, every shard file, and matching checksums. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/json_util.h"
#include "ckpt/pool_internal.h"
#include "suanli/ckpt.h"
#include "suanli/safetensors.h"

typedef struct {
    char tensor[96];
    int64_t offset, length;
    float *data;      /* into the snapshot buffer */
    const float *src; /* live state, copied by the writer thread before the next optimizer update */
    uint64_t sum;     /* XXH3 of the snapshot's copy, computed as it is copied */
} entry;

struct sl_ckpt_writer {
    pthread_t th;
    int running, joined;
    volatile int done;
    int snap_done; /* the writer copied the live state into buf (guarded by mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    double snap_wait; /* time the training thread waited for the snapshot */
    sl_status status;
    char errmsg[512];
    char dir[4096], file[64];
    char mem_dir[4096]; /* tmp dir of the in-memory copy ("" when off) */
    int rank;
    entry *e;
    int ne, cap;
    float *buf;
    size_t buf_cap, bytes;
    double stall, write_sec;
    double snap_sec, disk_sec; /* the snapshot copy + checksums; the local shard file (O_DIRECT, fsync) */
    int direct;                /* that file went out with O_DIRECT */
    int pooled;                /* pooled node-local storage (sl_ckpt_writer_set_pool) */
    sl_ckpt_pool pool;         /* pool.local_root points at pool_root */
    char pool_root[3800];
    char stepbase[64]; /* "step-NNNNNNN.tmpR" */
    int64_t step;
    struct { /* a pooled commit run by the writer thread (sl_ckpt_writer_commit_pool) */
        int64_t step;
        int world, keep;
        char model_json[1024], layout_json[2048];
    } commit;
    double commit_sec;
    char drain_root[3800]; /* shared tier (sl_ckpt_writer_set_drain): "" off */
    int drain_keep;
    char drain_dir[4096]; /* its step-N.tmpR of the save in flight ("" when off or failed) */
    char *side_text;      /* the last save's sidecar (a pooled commit over comm gathers it) */
};

static sl_status commit_dir(const char *root, int64_t step, int world, int keep, const char *model_json,
                            const char *layout_json, int require_all);

void sl_ckpt_writer_set_drain(sl_ckpt_writer *w, const char *shared_root, int keep) {
    snprintf(w->drain_root, sizeof w->drain_root, "%s", shared_root ? shared_root : "");
    w->drain_keep = keep;
}

void sl_ckpt_writer_set_pool(sl_ckpt_writer *w, const sl_ckpt_pool *p) {
    w->pooled = p != NULL;
    if (!p) return;
    w->pool = *p;
    snprintf(w->pool_root, sizeof w->pool_root, "%s", p->local_root);
    w->pool.local_root = w->pool_root;
}

sl_ckpt_writer *sl_ckpt_writer_new(void) {
    sl_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->done = 1;
    w->snap_done = 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    return w;
}

void sl_ckpt_writer_wait_snapshot(sl_ckpt_writer *w) {
    double t0 = sl_time_sec();
    pthread_mutex_lock(&w->mu);
    while (!w->snap_done) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    w->snap_wait += sl_time_sec() - t0;
}

sl_status sl_ckpt_writer_wait(sl_ckpt_writer *w) {
    if (w->running && !w->joined) {
        pthread_join(w->th, NULL);
        w->joined = 1;
        w->running = 0;
    }
    if (w->status != SL_OK) return sl_fail(w->status, "%s", w->errmsg);
    return SL_OK;
}

void sl_ckpt_writer_free(sl_ckpt_writer *w) {
    if (!w) return;
    sl_ckpt_writer_wait(w);
    free(w->e);
    free(w->side_text);
    sl_free_aligned(w->buf);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

int sl_ckpt_writer_done(sl_ckpt_writer *w) { return w->done; }

const char *sl_ckpt_mem_root(void) {
    const char *e = getenv("SUANLI_MEM_CKPT_DIR");
    return e && *e ? e : NULL;
}

sl_status sl_ckpt_writer_reserve(sl_ckpt_writer *w, size_t floats) {
    if (floats <= w->buf_cap) return SL_OK;
    sl_free_aligned(w->buf);
    /* 4096-aligned for O_DIRECT (Note [Shard write path]). Not touched here: the writer thread faults the
     * pages in during the first snapshot, off the training thread, and a restart does not pay for it */
    w->buf = sl_malloc_aligned_to(sizeof(float) * floats, 4096);
    w->buf_cap = w->buf ? floats : 0;
    if (!w->buf) return sl_fail(SL_ERR_NOMEM, "checkpoint: cannot reserve %zu bytes", floats * sizeof(float));
    return SL_OK;
}
double sl_ckpt_writer_stall(const sl_ckpt_writer *w) { return w->stall + w->snap_wait; }
double sl_ckpt_writer_write_seconds(const sl_ckpt_writer *w) { return w->write_sec; }
void sl_ckpt_writer_times(const sl_ckpt_writer *w, double *snapshot, double *disk, int *direct) {
    *snapshot = w->snap_sec;
    *disk = w->disk_sec;
    *direct = w->direct;
}
size_t sl_ckpt_writer_bytes(const sl_ckpt_writer *w) { return w->bytes; }

static void step_name(char *out, size_t cap, const char *root, int64_t step, const char *suffix) {
    snprintf(out, cap, "%s/step-%07lld%s", root, (long long)step, suffix);
}

static sl_status fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return sl_fail(SL_ERR_IO, "%s: cannot open for fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? SL_OK : sl_fail(SL_ERR_IO, "%s: fsync failed", path);
}

/* Test hook (docs/ENV.md): SUANLI_FAULT_COMMIT_STAGE=k kills the process at stage k of the commit. */
static void fault_point(int stage) {
    const char *e = getenv("SUANLI_FAULT_COMMIT_STAGE");
    if (e && atoi(e) == stage) {
        fprintf(stderr, "suanli: SUANLI_FAULT_COMMIT_STAGE=%d: dying inside the checkpoint commit\n", stage);
        fflush(stderr);
        _exit(137);
    }
}

/* The snapshot: live state -> buffer, each entry's checksum computed over the copy in the same pass while
 * its chunk is in cache (entries a device backend copied out in save_begin are only hashed). */
static void snapshot(sl_ckpt_writer *w) {
    const size_t chunk = (size_t)256 << 10; /* floats: 1 MiB, fits in L2 */
    XXH3_state_t hs;
    for (int i = 0; i < w->ne; i++) {
        entry *e = &w->e[i];
        XXH3_64bits_reset(&hs);
        for (size_t at = 0; at < (size_t)e->length; at += chunk) {
            size_t n = (size_t)e->length - at < chunk ? (size_t)e->length - at : chunk;
            if (e->src) memcpy(e->data + at, e->src + at, sizeof(float) * n);
            XXH3_64bits_update(&hs, e->data + at, sizeof(float) * n);
        }
        e->sum = XXH3_64bits_digest(&hs);
    }
}

/* the sidecar's entries; ts[i] describes entry i, keys[i] its name in the shard file */
static sl_status describe(sl_ckpt_writer *w, sl_st_tensor *ts, char (*keys)[128], cJSON *arr) {
    float *next = w->buf;
    for (int i = 0; i < w->ne; i++) {
        entry *e = &w->e[i];
        if (e->data != next) /* the shard file is the buffer as it is (Note [Shard write path]) */
            return sl_fail(SL_ERR_INTERNAL, "checkpoint writer: entry %d is not where the file expects it",
                           i);
        next += e->length;
        snprintf(keys[i], 128, "%s@%lld", e->tensor, (long long)e->offset);
        ts[i] = (sl_st_tensor){.name = keys[i],
                               .dtype = "F32",
                               .ndim = 1,
                               .shape = {e->length},
                               .data = e->data,
                               .nbytes = sizeof(float) * (size_t)e->length};
        char sum[32];
        snprintf(sum, sizeof sum, "xxh3:%016llx", (unsigned long long)e->sum);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "tensor", e->tensor);
        cJSON_AddStringToObject(o, "key", keys[i]);
        cJSON_AddNumberToObject(o, "offset", (double)e->offset);
        cJSON_AddNumberToObject(o, "length", (double)e->length);
        cJSON_AddStringToObject(o, "checksum", sum);
        cJSON_AddItemToArray(arr, o);
    }
    return SL_OK;
}

/* the shared tier (pooled saves drained to --save): a plain single-directory copy of this rank's shard
 * and its sidecar without placement; failing it only loses that tier for this step */
static void drain_copy(sl_ckpt_writer *w, const cJSON *side, const char *hdr, size_t hlen) {
    char dp[4200];
    cJSON *plain = cJSON_Duplicate(side, 1);
    cJSON_DeleteItemFromObject(plain, "pool");
    char *ptext = plain ? cJSON_PrintUnformatted(plain) : NULL;
    cJSON_Delete(plain);
    snprintf(dp, sizeof dp, "%s/%s", w->drain_dir, w->file);
    sl_status ds =
        ptext ? sl_ckpt_write_file(dp, hdr, hlen, w->buf, w->bytes, SL_CKPT_IO_DIRECT | SL_CKPT_IO_SYNC, NULL)
              : SL_ERR_NOMEM;
    snprintf(dp, sizeof dp, "%s/shard-r%05d.json", w->drain_dir, w->rank);
    if (ds == SL_OK) ds = sl_file_write_atomic(dp, ptext, strlen(ptext));
    if (ds != SL_OK) SL_LOGW("shared checkpoint copy skipped: %s", sl_errmsg());
    free(ptext);
}

static void *writer_main(void *arg) {
    sl_ckpt_writer *w = arg;
    double t0 = sl_time_sec();
    /* Note [Snapshot off the training thread]
     * The saved state (parameters, Adam moments) only changes in the optimizer update at the end of a
     * step; forward and backward just read it. So the copy into the host snapshot runs here, overlapped
     * with the next step's forward/backward, and the trainer waits for it (sl_ckpt_writer_wait_snapshot)
     * only right before its next update. */
    snapshot(w);
    pthread_mutex_lock(&w->mu);
    w->snap_done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    w->snap_sec = sl_time_sec() - t0;
    w->disk_sec = 0;
    w->direct = 0;
    sl_status st = SL_OK;
    sl_st_tensor *ts = calloc((size_t)w->ne + 1, sizeof *ts);
    char(*keys)[128] = calloc((size_t)w->ne + 1, 128);
    cJSON *side = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    char *text = NULL, *hdr = NULL, path[4200], mp[4200];
    size_t hlen = 0;
    sl_ckpt_file_job mc = {0}, lf = {0};
    int mc_started = 0;
    if (!ts || !keys || !side || !arr) {
        st = sl_fail(SL_ERR_NOMEM, "checkpoint writer: out of memory");
        goto done;
    }
    SL_CHECK(describe(w, ts, keys, arr));
    snprintf(path, sizeof path, "%s/%s", w->dir, w->file);
    SL_CHECK(sl_safetensors_header(path, ts, w->ne, NULL, 4096, &hdr, &hlen));
    if (w->mem_dir[0]) { /* the in-memory copy (tmpfs held by the launcher), beside the disk write */
        snprintf(mp, sizeof mp, "%s/%s", w->mem_dir, w->file);
        /* tmpfs: no fsync */
        mc = (sl_ckpt_file_job){.path = mp, .hdr = hdr, .hlen = hlen, .data = w->buf, .dlen = w->bytes};
        if (sl_mkdirs(w->mem_dir) != SL_OK) {
            SL_LOGW("in-memory checkpoint copy skipped: %s", sl_errmsg());
            w->mem_dir[0] = 0;
        } else {
            sl_ckpt_file_job_start(&mc);
            mc_started = 1;
        }
    }
    /* the local shard file (under erasure coding only the blocks are written); with replicas, written by a
     * helper thread while the copies go to the peer hosts: the disk and the transfer overlap */
    lf = (sl_ckpt_file_job){.path = path,
                            .hdr = hdr,
                            .hlen = hlen,
                            .data = w->buf,
                            .dlen = w->bytes,
                            .flags = SL_CKPT_IO_DIRECT | SL_CKPT_IO_SYNC};
    if (!w->pooled) {
        SL_CHECK(sl_ckpt_write_file(path, hdr, hlen, w->buf, w->bytes, lf.flags, &lf.io));
    } else { /* replicas or erasure-coded blocks on the peer hosts (src/ckpt/pool.c) */
        cJSON *placement = NULL;
        if (w->pool.ec_k == 0) sl_ckpt_file_job_start(&lf);
        /* a collective over the pool communicator: taken part in even when the local file failed */
        st = sl_ckpt_pool_spread(&w->pool, w->stepbase, w->step, w->file, hdr, hlen, w->buf, w->bytes,
                                 &placement);
        sl_status ls = sl_ckpt_file_job_join(&lf); /* the local file's failure is the one to report */
        if (ls != SL_OK) st = ls;
        if (st != SL_OK) cJSON_Delete(placement);
        SL_CHECK(st);
        cJSON_AddItemToObject(side, "pool", placement);
    }
    w->disk_sec = lf.io.seconds;
    w->direct = lf.io.direct;
    fault_point(0);
    cJSON_AddNumberToObject(side, "rank", w->rank);
    cJSON_AddStringToObject(side, "file", w->file);
    cJSON_AddItemToObject(side, "entries", arr);
    arr = NULL;
    text = cJSON_PrintUnformatted(side);
    snprintf(path, sizeof path, "%s/shard-r%05d.json", w->dir, w->rank);
    if (!text) {
        st = sl_fail(SL_ERR_NOMEM, "checkpoint writer: out of memory");
        goto done;
    }
    SL_CHECK(sl_file_write_atomic(path, text, strlen(text)));
    free(w->side_text);
    w->side_text = strdup(text);
    if (mc_started) { /* failing the in-memory copy only costs recovery speed */
        mc_started = 0;
        sl_status ms = sl_ckpt_file_job_join(&mc);
        snprintf(mp, sizeof mp, "%s/shard-r%05d.json", w->mem_dir, w->rank);
        if (ms == SL_OK) ms = sl_file_write_atomic(mp, text, strlen(text));
        if (ms != SL_OK) {
            SL_LOGW("in-memory checkpoint copy skipped: %s", sl_errmsg());
            w->mem_dir[0] = 0;
        }
    }
    if (w->drain_dir[0]) drain_copy(w, side, hdr, hlen);
done:
    sl_ckpt_file_job_join(&lf); /* no-ops where already joined or never started */
    if (mc_started) sl_ckpt_file_job_join(&mc);
    if (st != SL_OK) snprintf(w->errmsg, sizeof w->errmsg, "%s", sl_errmsg());
    w->status = st;
    w->write_sec = sl_time_sec() - t0;
    free(ts);
    free(keys);
    free(text);
    sl_free_aligned(hdr);
    cJSON_Delete(arr);
    cJSON_Delete(side);
    __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void *commit_main(void *arg) {
    sl_ckpt_writer *w = arg;
    double t0 = sl_time_sec();
    sl_status st =
        !w->pool.comm
            ? sl_ckpt_pool_commit(&w->pool, w->commit.step, w->commit.world, w->commit.keep,
                                  w->commit.model_json, w->commit.layout_json)
            : sl_ckpt_pool_commit_comm(&w->pool, w->commit.step, w->commit.keep, w->commit.model_json,
                                       w->commit.layout_json, w->side_text ? w->side_text : "");
    if (st != SL_OK) snprintf(w->errmsg, sizeof w->errmsg, "%s", sl_errmsg());
    if (st == SL_OK && w->drain_root[0] && w->rank == 0 &&
        commit_dir(w->drain_root, w->commit.step, w->commit.world, w->drain_keep, w->commit.model_json,
                   w->commit.layout_json, 1) != SL_OK)
        SL_LOGW("shared checkpoint step %lld not committed (the pooled one is): %s",
                (long long)w->commit.step, sl_errmsg());
    w->status = st;
    w->commit_sec = sl_time_sec() - t0;
    __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

sl_status sl_ckpt_writer_commit_pool(sl_ckpt_writer *w, int64_t step, int world, int keep,
                                     const char *model_json, const char *layout_json) {
    if (!w->pooled) return sl_fail(SL_ERR_INVALID, "checkpoint: the writer has no pool");
    SL_TRY(sl_ckpt_writer_wait(w));
    w->commit.step = step;
    w->commit.world = world;
    w->commit.keep = keep;
    snprintf(w->commit.model_json, sizeof w->commit.model_json, "%s", model_json ? model_json : "{}");
    snprintf(w->commit.layout_json, sizeof w->commit.layout_json, "%s", layout_json ? layout_json : "{}");
    w->status = SL_OK;
    w->done = 0;
    w->joined = 0;
    if (sl_thread_spawn(&w->th, commit_main, w) != 0) {
        w->done = 1;
        return sl_fail(SL_ERR_INTERNAL, "checkpoint: cannot start the commit thread");
    }
    w->running = 1;
    return SL_OK;
}

double sl_ckpt_writer_commit_seconds(const sl_ckpt_writer *w) { return w->commit_sec; }

/* Entries of [lo, lo+len) split at parameter boundaries, from host memory src (indexed from lo), or, when
 * src is NULL, from device buffer buf at element boff (indexed from lo): those are copied into the
 * snapshot right here, on the caller's thread (backends are driven from one thread). Each entry names its
 * full tensor and offset in it (Note [Full-tensor coordinates]: a TP shard is runs of it); the last
 * pipeline stage's copy of a tied embedding is not written (the first stage's is the same), nor the other
 * TP ranks' copies of a replicated parameter (TP rank 0's are the same). */
typedef struct {
    sl_ckpt_writer *w;
    const sl_param_info *p;
    const char *kind;
    const float *src;
    const sl_buffer *buf;
    int64_t boff, lo;
    size_t *used;
    sl_status st;
} entry_ctx;

static void add_run(void *u, int64_t full_off, int64_t local_off, int64_t n) {
    entry_ctx *c = u;
    sl_ckpt_writer *w = c->w;
    if (c->st != SL_OK) return;
    if (w->ne == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        entry *ne = realloc(w->e, sizeof(entry) * (size_t)w->cap);
        if (!ne) {
            c->st = sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
            return;
        }
        w->e = ne;
    }
    entry *e = &w->e[w->ne++];
    int64_t at = c->p->offset + local_off - c->lo; /* index from lo */
    snprintf(e->tensor, sizeof e->tensor, "%s/%s", c->kind, c->p->t->name);
    e->offset = full_off;
    e->length = n;
    e->data = w->buf + *c->used;
    e->src = c->src ? c->src + at : NULL;
    if (!c->src)
        c->st = sl_backend_copy_out(c->buf, sizeof(float) * (size_t)(c->boff + at), e->data,
                                    sizeof(float) * (size_t)n);
    *c->used += (size_t)n;
}

static sl_status add_entries(sl_ckpt_writer *w, const sl_model *m, const char *kind, const float *src,
                             const sl_buffer *buf, int64_t boff, int64_t lo, int64_t len, size_t *used) {
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i];
        int64_t a = p->offset > lo ? p->offset : lo;
        int64_t b = p->offset + p->numel < lo + len ? p->offset + p->numel : lo + len;
        /* written once: the first stage's tied embedding, TP rank 0's copy of a replicated parameter */
        int group = p->tp_parts > 0 && m->tp > p->tp_parts ? m->tp / p->tp_parts : 1; /* replicated kv part */
        if (a >= b || p->tied_copy || (m->tp > 1 && p->tp_split == 0 && m->tp_rank != 0) ||
            (group > 1 && m->tp_rank % group != 0))
            continue;
        entry_ctx c = {w, p, kind, src, buf, boff, lo, used, SL_OK};
        sl_param_runs(m, p, a - p->offset, b - p->offset, add_run, &c);
        SL_TRY(c.st);
    }
    return SL_OK;
}

sl_status sl_ckpt_save_begin(sl_ckpt_writer *w, const char *root, const sl_ckpt_state *st) {
    double t0 = sl_time_sec();
    SL_TRY(sl_ckpt_writer_wait(w));
    char tmp[4096], hostroot[3900];
    const char *rc = getenv("SUANLI_RESTART_COUNT");
    char suffix[48];
    snprintf(suffix, sizeof suffix, ".tmp%s", rc ? rc : "");
    if (w->pooled) { /* this rank's node-local directory: ROOT/host-<h> */
        snprintf(hostroot, sizeof hostroot, "%s/host-%d", w->pool_root, w->pool.host);
        root = hostroot;
    }
    step_name(tmp, sizeof tmp, root, st->step, suffix);
    snprintf(w->stepbase, sizeof w->stepbase, "step-%07lld%s", (long long)st->step, suffix);
    w->step = st->step;
    w->drain_dir[0] = 0;
    if (w->pooled && w->drain_root[0]) {
        step_name(w->drain_dir, sizeof w->drain_dir, w->drain_root, st->step, suffix);
        if (sl_mkdirs(w->drain_dir) != SL_OK) {
            SL_LOGW("shared checkpoint copy skipped: %s", sl_errmsg());
            w->drain_dir[0] = 0;
        }
    }
    SL_TRY(sl_mkdirs(tmp));
    size_t need = 0;
    for (int s = 0; s < st->nseg; s++)
        need += (size_t)st->seg[s].len * (size_t)((st->write_params ? 1 : 0) + (st->write_optim ? 2 : 0));
    SL_TRY(sl_ckpt_writer_reserve(w, need));
    w->ne = 0;
    size_t used = 0;
    for (int s = 0; s < st->nseg; s++) {
        const sl_ckpt_seg *g = &st->seg[s];
        if (st->write_params) {
            const float *ps = st->param_shard     ? st->param_shard + g->off
                              : st->m->params_mem ? st->m->params_mem + g->lo
                                                  : NULL;
            if (!ps && st->param_shard_buf) /* ZeRO-3 on the device: the shard's buffer, at seg.off */
                SL_TRY(
                    add_entries(w, st->m, "param", NULL, st->param_shard_buf, g->off, g->lo, g->len, &used));
            else
                SL_TRY(add_entries(w, st->m, "param", ps, st->m->params_buf, g->lo, g->lo, g->len, &used));
        }
        if (st->write_optim) {
            SL_TRY(add_entries(w, st->m, "exp_avg", st->exp_avg ? st->exp_avg + g->off : NULL,
                               st->exp_avg_buf, g->off, g->lo, g->len, &used));
            SL_TRY(add_entries(w, st->m, "exp_avg_sq", st->exp_avg_sq ? st->exp_avg_sq + g->off : NULL,
                               st->exp_avg_sq_buf, g->off, g->lo, g->len, &used));
        }
    }
    w->bytes = used * sizeof(float);
    snprintf(w->dir, sizeof w->dir, "%s", tmp);
    const char *mem = sl_ckpt_mem_root();
    if (mem)
        step_name(w->mem_dir, sizeof w->mem_dir, mem, st->step, suffix);
    else
        w->mem_dir[0] = 0;
    snprintf(w->file, sizeof w->file, "shard-r%05d.safetensors", st->rank);
    w->rank = st->rank;
    w->status = SL_OK;
    w->done = 0;
    w->joined = 0;
    w->snap_done = 0;
    w->snap_wait = 0;
    if (sl_thread_spawn(&w->th, writer_main, w) != 0) {
        w->done = 1;
        w->snap_done = 1;
        return sl_fail(SL_ERR_INTERNAL, "checkpoint: cannot start the writer thread");
    }
    w->running = 1;
    w->stall = sl_time_sec() - t0;
    return SL_OK;
}

/* ---------------- commit ---------------- */

static int cmp_str_desc(const void *a, const void *b) { return strcmp(*(char *const *)b, *(char *const *)a); }

/* step dir names under root, newest first (committed ones only). Caller frees each and the array. */
int sl_ckpt_list_steps(const char *root, char ***out) {
    *out = NULL;
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0, cap = 0;
    char **v = NULL;
    struct dirent *de;
    while ((de = readdir(d))) {
        long long s;
        char tail;
        if (sscanf(de->d_name, "step-%lld%c", &s, &tail) != 1 || strlen(de->d_name) != 12) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nv = realloc(v, sizeof(char *) * (size_t)cap);
            if (!nv) break;
            v = nv;
        }
        v[n++] = strdup(de->d_name);
    }
    closedir(d);
    if (n > 1) qsort(v, (size_t)n, sizeof(char *), cmp_str_desc);
    *out = v;
    return n;
}

sl_status sl_ckpt_rm_rf(const char *path) {
    DIR *d = opendir(path);
    if (!d)
        return unlink(path) == 0 || errno == ENOENT ? SL_OK : sl_fail(SL_ERR_IO, "%s: cannot remove", path);
    struct dirent *de;
    sl_status st = SL_OK;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        if (unlink(p) != 0 && st == SL_OK) st = sl_ckpt_rm_rf(p);
    }
    closedir(d);
    if (rmdir(path) != 0 && st == SL_OK) st = sl_fail(SL_ERR_IO, "%s: cannot remove", path);
    return st;
}

/* Note [Stale temp dirs]
 * A save writes ROOT/step-N.tmpK (K: SUANLI_RESTART_COUNT, "" outside the launcher) and commits it by a
 * rename; `latest` and manifests are written as NAME.tmp.PID and renamed. A death or a failed write (a full
 * disk) in between leaves them: loaders ignore them, but they hold a whole step's shards, and with a full
 * disk they are what keeps the next save from fitting. A restart's setup (rank 0, before any writer of the
 * new attempt runs) removes exactly those names: a directory step-<7 digits>.tmp<digits>, a regular file
 * latest.tmp.<digits>; lstat, so a symlink of such a name is left alone (and never followed). */
static int stale_name(const char *n, int *want_dir) {
    long long v;
    int used = 0;
    if (!strncmp(n, "latest.tmp.", 11) && n[11]) {
        *want_dir = 0;
        return strspn(n + 11, "0123456789") == strlen(n + 11);
    }
    if (strlen(n) < 16 || sscanf(n, "step-%lld%n", &v, &used) != 1 || used != 12 ||
        strspn(n + 5, "0123456789") != 7 || strncmp(n + 12, ".tmp", 4) != 0)
        return 0;
    *want_dir = 1;
    return strspn(n + 16, "0123456789") == strlen(n + 16);
}

sl_status sl_ckpt_remove_uncommitted(const char *root, int64_t step) {
    char tmp[4096], suffix[48];
    const char *rc = getenv("SUANLI_RESTART_COUNT");
    snprintf(suffix, sizeof suffix, ".tmp%s",
             rc ? rc : ""); /* as sl_ckpt_save_begin and the commit name it */
    step_name(tmp, sizeof tmp, root, step, suffix);
    struct stat sb;
    if (lstat(tmp, &sb) != 0 || !S_ISDIR(sb.st_mode)) return SL_OK;
    return sl_ckpt_rm_rf(tmp);
}

int sl_ckpt_remove_stale_tmp(const char *root, char *names, size_t cap) {
    if (names && cap) names[0] = 0;
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int want_dir = 0;
        if (!stale_name(de->d_name, &want_dir)) continue;
        char p[4400];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", root, de->d_name);
        if (lstat(p, &sb) != 0 || (want_dir ? !S_ISDIR(sb.st_mode) : !S_ISREG(sb.st_mode))) continue;
        if ((want_dir ? sl_ckpt_rm_rf(p) : (unlink(p) == 0 ? SL_OK : SL_ERR_IO)) != SL_OK) continue;
        if (names && cap) {
            size_t l = strlen(names);
            snprintf(names + l, cap - l, "%s%s", n ? ", " : "", de->d_name);
        }
        n++;
    }
    closedir(d);
    return n;
}

/* Merge the sidecars (side[r]: rank r's shard-rR.json, or NULL/absent for ranks with nothing to write) into
 * a manifest. A sidecar's "pool" object (its file's placement, src/ckpt/pool.c) goes to pool.files. */
/* side: sidecar paths (texts NULL) or, with texts, names for messages (may be NULL) */
static sl_status manifest_build(int64_t step, int world, const char *model_json, const char *layout_json,
                                char *const *side, int require_all, char *const *texts, const size_t *lens,
                                cJSON **out) {
    sl_status st = SL_OK;
    cJSON *man = cJSON_CreateObject(), *tensors = cJSON_CreateObject(), *files = cJSON_CreateObject();
    *out = NULL;
    cJSON_AddStringToObject(man, "format", "suanli-checkpoint");
    cJSON_AddNumberToObject(man, "version", 1);
    cJSON_AddNumberToObject(man, "step", (double)step);
    cJSON *mj = model_json ? cJSON_Parse(model_json) : NULL;
    cJSON_AddItemToObject(man, "model", mj ? mj : cJSON_CreateObject());
    cJSON *lj = layout_json ? cJSON_Parse(layout_json) : NULL;
    cJSON_AddItemToObject(man, "train", lj ? lj : cJSON_CreateObject());
    cJSON_AddNumberToObject(man, "world", world);
    for (int r = 0; r < world; r++) {
        const char *path = side ? side[r] : NULL;
        char *text;
        size_t len;
        char what[64];
        if (texts) {
            snprintf(what, sizeof what, "rank %d's sidecar", r);
            if (!path) path = what;
        } else if (!path || access(path, F_OK) != 0) {
            if (require_all) {
                st = sl_fail(SL_ERR_IO,
                             "%s: rank %d's sidecar is missing (its host lost?); not committing step %lld",
                             path ? path : "?", r, (long long)step);
                goto done;
            }
            continue; /* ranks with nothing to write */
        }
        cJSON *s;
        if (texts) {
            s = cJSON_ParseWithLength(texts[r], lens[r]);
        } else {
            SL_CHECK(sl_file_read_all(path, &text, &len));
            s = cJSON_ParseWithLength(text, len);
            free(text);
        }
        cJSON *file = s ? cJSON_GetObjectItem(s, "file") : NULL,
              *ents = s ? cJSON_GetObjectItem(s, "entries") : NULL;
        if (!cJSON_IsString(file) || !cJSON_IsArray(ents)) {
            cJSON_Delete(s);
            st = sl_fail(SL_ERR_FORMAT, "%s: malformed sidecar", path);
            goto done;
        }
        cJSON *e;
        cJSON_ArrayForEach(e, ents) {
            const char *tn = cJSON_GetStringValue(cJSON_GetObjectItem(e, "tensor"));
            if (!tn) continue;
            cJSON *t = cJSON_GetObjectItem(tensors, tn);
            if (!t) {
                t = cJSON_CreateObject();
                cJSON_AddStringToObject(t, "dtype", "F32");
                cJSON_AddItemToObject(t, "shards", cJSON_CreateArray());
                cJSON_AddItemToObject(tensors, tn, t);
            }
            cJSON *sh = cJSON_Duplicate(e, 1);
            cJSON_DeleteItemFromObject(sh, "tensor");
            cJSON_AddStringToObject(sh, "file", file->valuestring);
            cJSON_AddItemToArray(cJSON_GetObjectItem(t, "shards"), sh);
        }
        cJSON *pl = cJSON_DetachItemFromObject(s, "pool");
        if (pl) cJSON_AddItemToObject(files, file->valuestring, pl);
        cJSON_Delete(s);
    }
    cJSON_AddItemToObject(man, "tensors", tensors);
    tensors = NULL;
    if (cJSON_GetArraySize(files) > 0) {
        cJSON *pool = cJSON_CreateObject();
        cJSON_AddItemToObject(pool, "files", files);
        cJSON_AddItemToObject(man, "pool", pool);
        files = NULL;
    }
    *out = man;
    man = NULL;
done:
    cJSON_Delete(tensors);
    cJSON_Delete(files);
    cJSON_Delete(man);
    return st;
}

sl_status sl_ckpt_manifest_build(int64_t step, int world, const char *model_json, const char *layout_json,
                                 char *const *side, int require_all, cJSON **out) {
    return manifest_build(step, world, model_json, layout_json, side, require_all, NULL, NULL, out);
}

sl_status sl_ckpt_manifest_build_texts(int64_t step, int world, const char *model_json,
                                       const char *layout_json, char *const *texts, const size_t *lens,
                                       cJSON **out) {
    return manifest_build(step, world, model_json, layout_json, NULL, 1, texts, lens, out);
}

sl_status sl_ckpt_commit(const char *root, int64_t step, int world, int keep, const char *model_json,
                         const char *layout_json) {
    return commit_dir(root, step, world, keep, model_json, layout_json, 0);
}

static sl_status commit_dir(const char *root, int64_t step, int world, int keep, const char *model_json,
                            const char *layout_json, int require_all) {
    char tmp[4096], fin[4096], path[4300];
    const char *rc = getenv("SUANLI_RESTART_COUNT");
    char suffix[48];
    snprintf(suffix, sizeof suffix, ".tmp%s", rc ? rc : "");
    step_name(tmp, sizeof tmp, root, step, suffix);
    step_name(fin, sizeof fin, root, step, "");
    sl_status st = SL_OK;
    cJSON *man = NULL;
    char *text = NULL, **side = calloc((size_t)world, sizeof(char *));
    if (!side) return sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
    for (int r = 0; r < world; r++) {
        snprintf(path, sizeof path, "%s/shard-r%05d.json", tmp, r);
        side[r] = strdup(path);
    }
    SL_CHECK(sl_ckpt_manifest_build(step, world, model_json, layout_json, side, require_all, &man));
    text = cJSON_Print(man);
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    if (!text) {
        st = sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
        goto done;
    }
    /* Note [config.json in the commit]: the step's config.json (the manifest's "model") is written here,
     * before the manifest, and a failed write fails the commit: nothing is renamed and `latest` keeps
     * naming the previous step (a step without it was only found unusable at the next resume). */
    const cJSON *model = cJSON_GetObjectItem(man, "model");
    if (cJSON_IsObject(model) && model->child) {
        char cpath[4300], why[1024];
        snprintf(cpath, sizeof cpath, "%s/config.json", tmp);
        if ((st = sl_file_write_atomic(cpath, model_json, strlen(model_json))) != SL_OK) {
            snprintf(why, sizeof why, "%s", sl_errmsg());
            st = sl_fail(st, "%s (checkpoint step %lld not committed)", why, (long long)step);
            goto done;
        }
    }
    fault_point(1);
    SL_CHECK(sl_file_write_atomic(path, text, strlen(text)));
    fault_point(2);
    SL_CHECK(fsync_path(tmp));
    if (access(fin, F_OK) == 0) SL_CHECK(sl_ckpt_rm_rf(fin)); /* a re-run of the same step replaces it */
    fault_point(3);
    if (rename(tmp, fin) != 0) {
        st = sl_fail(SL_ERR_IO, "%s: cannot rename to %s: %s", tmp, fin, strerror(errno));
        goto done;
    }
    SL_CHECK(fsync_path(root));
    fault_point(4);
    char latest[4200], name[64];
    snprintf(latest, sizeof latest, "%s/latest", root);
    snprintf(name, sizeof name, "step-%07lld\n", (long long)step);
    SL_CHECK(sl_file_write_atomic(latest, name, strlen(name)));
    SL_CHECK(fsync_path(root));
    fault_point(5);
    sl_ckpt_prune(root, step, keep);
done:
    for (int r = 0; r < world; r++) free(side[r]);
    free(side);
    cJSON_Delete(man);
    free(text);
    return st;
}

/* Note [Pruning after a commit]
 * Commits of one history come in step order, so a step dir newer than the one just committed is left from
 * an abandoned history: the run resumed from an older step because the newer ones were damaged (or it
 * was rewound with --load ROOT/step-N). Such a dir is removed: kept, it would count among the `keep`
 * newest and push out the checkpoint just committed (with --save-keep 1 the only valid one, `latest`
 * naming a deleted dir, so the next restart found "no valid checkpoint"), and a valid one would be
 * resumed instead of this history's checkpoints. With keep 0 (--save-keep 0: keep every checkpoint)
 * nothing is removed, the newer dirs included: `latest` names this history's commit, and only a resume
 * that finds no valid `latest` scans the dirs by step. */
void sl_ckpt_prune(const char *root, int64_t step, int keep) {
    char **v, path[4400];
    int n = sl_ckpt_list_steps(root, &v), kept = 0;
    for (int i = 0; i < n; i++) {
        int newer = keep > 0 && strtoll(v[i] + 5, NULL, 10) > step;
        if (newer || (keep > 0 && kept >= keep)) {
            snprintf(path, sizeof path, "%s/%s", root, v[i]);
            sl_ckpt_rm_rf(path);
        } else {
            kept++;
        }
        free(v[i]);
    }
    free(v);
}

/* ---------------- load ---------------- */

typedef struct {
    char dir[4096];
    int trusted; /* the caller verified the checksums already (sl_ckpt_state.verified) */
    cJSON *man;
    int nfiles;
    char *fname[256];
    sl_safetensors *st[256];
} reader;

static void reader_close(reader *r) {
    for (int i = 0; i < r->nfiles; i++) {
        free(r->fname[i]);
        sl_safetensors_close(r->st[i]);
    }
    cJSON_Delete(r->man);
    r->nfiles = 0;
    r->man = NULL;
}

static sl_status reader_open(reader *r, const char *dir) {
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    char path[4200], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    SL_TRY(sl_file_read_all(path, &text, &len));
    r->man = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(r->man)) return sl_fail(SL_ERR_FORMAT, "%s: not a JSON object", path);
    cJSON *fmt = cJSON_GetObjectItem(r->man, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "suanli-checkpoint") != 0)
        return sl_fail(SL_ERR_FORMAT, "%s: field 'format' must be \"suanli-checkpoint\"", path);
    cJSON *step = cJSON_GetObjectItem(r->man, "step");
    if (!sl_json_is_count(step)) /* a range test before any conversion (1e300 was undefined behaviour) */
        return sl_fail(SL_ERR_FORMAT, "%s: field 'step' must be a non-negative integer", path);
    /* a step dir's name and its manifest agree: a copied or renamed step dir would resume at its manifest's
     * step while later saves sort below its name, so every later resume would pick it again */
    char base[256];
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    size_t b0 = dl;
    while (b0 > 0 && dir[b0 - 1] != '/') b0--;
    snprintf(base, sizeof base, "%.*s", (int)(dl - b0 < 255 ? dl - b0 : 255), dir + b0);
    if (!strncmp(base, "step-", 5) && base[5] && strspn(base + 5, "0123456789") == strlen(base + 5) &&
        strtoll(base + 5, NULL, 10) != (long long)step->valuedouble)
        return sl_fail(SL_ERR_FORMAT,
                       "%s: field 'step' is %lld, but the directory is %s (copied or renamed?)", path,
                       (long long)step->valuedouble, base);
    if (!cJSON_IsObject(cJSON_GetObjectItem(r->man, "tensors")))
        return sl_fail(SL_ERR_FORMAT, "%s: field 'tensors' must be an object", path);
    return SL_OK;
}

static sl_status reader_file(reader *r, const char *name, sl_safetensors **out) {
    for (int i = 0; i < r->nfiles; i++)
        if (!strcmp(r->fname[i], name)) {
            *out = r->st[i];
            return SL_OK;
        }
    if (r->nfiles == 256 || strchr(name, '/'))
        return sl_fail(SL_ERR_FORMAT, "%s: bad shard file name '%s'", r->dir, name);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", r->dir, name);
    SL_TRY(sl_safetensors_open(path, &r->st[r->nfiles]));
    r->fname[r->nfiles] = strdup(name);
    *out = r->st[r->nfiles++];
    return SL_OK;
}

/* one shard entry: validated fields, data located and checksum verified */
static sl_status shard_data(reader *r, const char *tname, cJSON *sh, int64_t *off, int64_t *len,
                            const float **data) {
    cJSON *f = cJSON_GetObjectItem(sh, "file"), *k = cJSON_GetObjectItem(sh, "key"),
          *o = cJSON_GetObjectItem(sh, "offset"), *l = cJSON_GetObjectItem(sh, "length"),
          *c = cJSON_GetObjectItem(sh, "checksum");
    if (!cJSON_IsString(f) || !cJSON_IsString(k) || !sl_json_is_count(o) || !sl_json_is_count(l) ||
        !cJSON_IsString(c))
        return sl_fail(SL_ERR_FORMAT,
                       "%s/manifest.json: tensor '%s' has a shard with missing or mistyped fields", r->dir,
                       tname);
    sl_safetensors *st;
    SL_TRY(reader_file(r, f->valuestring, &st));
    const sl_st_tensor *t = sl_safetensors_find(st, k->valuestring);
    if (!t)
        return sl_fail(SL_ERR_FORMAT, "%s/%s: missing tensor '%s'", r->dir, f->valuestring, k->valuestring);
    if (strcmp(t->dtype, "F32") != 0 || t->nbytes != sizeof(float) * (size_t)l->valuedouble)
        return sl_fail(SL_ERR_FORMAT, "%s/%s: '%s' has the wrong size or dtype", r->dir, f->valuestring,
                       k->valuestring);
    char sum[32];
    if (!r->trusted)
        snprintf(sum, sizeof sum, "xxh3:%016llx", (unsigned long long)XXH3_64bits(t->data, t->nbytes));
    if (!r->trusted && strcmp(sum, c->valuestring) != 0)
        return sl_fail(SL_ERR_FORMAT, "%s/%s: checksum mismatch for '%s' (%s, manifest %s)", r->dir,
                       f->valuestring, k->valuestring, sum, c->valuestring);
    *off = (int64_t)o->valuedouble;
    *len = (int64_t)l->valuedouble;
    *data = t->data;
    return SL_OK;
}

/* fill dst[0, len) = tensor elements [lo, lo+len) from the overlapping shards; every element must be covered
 */
static sl_status read_range(reader *r, const char *tname, int64_t numel, int64_t lo, int64_t len,
                            float *dst) {
    cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(r->man, "tensors"), tname);
    if (!t) return sl_fail(SL_ERR_FORMAT, "%s: checkpoint has no tensor '%s'", r->dir, tname);
    cJSON *shards = cJSON_GetObjectItem(t, "shards");
    if (!cJSON_IsArray(shards))
        return sl_fail(SL_ERR_FORMAT, "%s: tensor '%s' has no shard list", r->dir, tname);
    /* shards may overlap: under ZeRO every rank owns (and writes) the tail of a bucket that the rank count
     * does not divide (src/parallel/dp.c for_each_segment), so coverage is the union of the ranges */
    int ns = cJSON_GetArraySize(shards);
    int64_t(*iv)[2] = malloc(sizeof *iv * (size_t)(ns + 1)), covered = 0;
    if (!iv) return sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
    int ni = 0;
    cJSON *sh;
    sl_status st = SL_OK;
    cJSON_ArrayForEach(sh, shards) {
        int64_t so, sl;
        const float *sd;
        if ((st = shard_data(r, tname, sh, &so, &sl, &sd)) != SL_OK) break;
        if (so + sl > numel) {
            st =
                sl_fail(SL_ERR_FORMAT,
                        "%s: tensor '%s' shard [%lld, %lld) exceeds its %lld elements (another model shape?)",
                        r->dir, tname, (long long)so, (long long)(so + sl), (long long)numel);
            break;
        }
        int64_t a = so > lo ? so : lo, b = so + sl < lo + len ? so + sl : lo + len;
        if (a >= b) continue;
        memcpy(dst + (a - lo), (const char *)sd + (a - so) * (int64_t)sizeof(float),
               sizeof(float) * (size_t)(b - a));
        iv[ni][0] = a;
        iv[ni++][1] = b;
    }
    for (int i = 1; i < ni; i++) /* insertion sort by start, then merge */
        for (int k = i; k > 0 && iv[k][0] < iv[k - 1][0]; k--) {
            int64_t t0 = iv[k][0], t1 = iv[k][1];
            iv[k][0] = iv[k - 1][0], iv[k][1] = iv[k - 1][1];
            iv[k - 1][0] = t0, iv[k - 1][1] = t1;
        }
    int64_t end = INT64_MIN;
    for (int i = 0; i < ni; i++) {
        int64_t a = iv[i][0] > end ? iv[i][0] : end;
        if (iv[i][1] > a) covered += iv[i][1] - a;
        if (iv[i][1] > end) end = iv[i][1];
    }
    free(iv);
    SL_TRY(st);
    if (covered != len)
        return sl_fail(SL_ERR_FORMAT,
                       "%s: tensor '%s' elements [%lld, %lld) are not fully covered by its shards", r->dir,
                       tname, (long long)lo, (long long)(lo + len));
    return SL_OK;
}

/* [lo, lo+len) of kind into host dst (indexed from lo), or, when dst is NULL, into device buffer buf at
 * element boff through a host bounce of one tensor piece at a time. A TP-split parameter's piece is read
 * as the span of the full tensor that covers its runs, then scattered (Note [Full-tensor coordinates]). */
typedef struct {
    float *out;        /* the piece, indexed from its first local element */
    const float *full; /* the full tensor's span, indexed from span0 */
    int64_t span0, a;
} scatter_ctx;

static void scatter_run(void *u, int64_t full_off, int64_t local_off, int64_t n) {
    scatter_ctx *c = u;
    memcpy(c->out + (local_off - c->a), c->full + (full_off - c->span0), sizeof(float) * (size_t)n);
}
static void span_run(void *u, int64_t full_off, int64_t local_off, int64_t n) {
    int64_t *s = u;
    (void)local_off;
    if (full_off < s[0]) s[0] = full_off;
    if (full_off + n > s[1]) s[1] = full_off + n;
}

static sl_status read_piece(reader *r, const sl_model *m, const sl_param_info *p, const char *tn, int64_t a,
                            int64_t b, float *out) {
    int64_t fn = sl_param_full_numel(m, p);
    if (p->tp_split == 0 || m->tp <= 1) return read_range(r, tn, fn, a, b - a, out);
    int64_t span[2] = {INT64_MAX, 0};
    sl_param_runs(m, p, a, b, span_run, span);
    float *full = malloc(sizeof(float) * (size_t)(span[1] - span[0]));
    if (!full) return sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
    sl_status st = read_range(r, tn, fn, span[0], span[1] - span[0], full);
    if (st == SL_OK) {
        scatter_ctx c = {out, full, span[0], a};
        sl_param_runs(m, p, a, b, scatter_run, &c);
    }
    free(full);
    return st;
}

static sl_status load_flat(reader *r, const sl_model *m, const char *kind, int64_t lo, int64_t len,
                           float *dst, sl_buffer *buf, int64_t boff) {
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i];
        int64_t a = p->offset > lo ? p->offset : lo,
                b = p->offset + p->numel < lo + len ? p->offset + p->numel : lo + len;
        if (a >= b) continue;
        char tn[128];
        snprintf(tn, sizeof tn, "%s/%s", kind, p->t->name);
        if (dst) {
            SL_TRY(read_piece(r, m, p, tn, a - p->offset, b - p->offset, dst + (a - lo)));
            continue;
        }
        float *tmp = malloc(sizeof(float) * (size_t)(b - a));
        if (!tmp) return sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
        sl_status st = read_piece(r, m, p, tn, a - p->offset, b - p->offset, tmp);
        if (st == SL_OK)
            st = sl_backend_copy_in(buf, sizeof(float) * (size_t)(boff + (a - lo)), tmp,
                                    sizeof(float) * (size_t)(b - a));
        free(tmp);
        SL_TRY(st);
    }
    return SL_OK;
}

/* The manifest's step and train object (adam_t, seed, loss_scaler) into st: no tensor is read */
static sl_status read_train_state(const reader *r, sl_ckpt_state *st) {
    const char *dir = r->dir;
    sl_status s = SL_OK;
    st->step = (int64_t)cJSON_GetObjectItem(r->man, "step")->valuedouble;
    cJSON *tr = cJSON_GetObjectItem(r->man, "train");
    cJSON *at = cJSON_GetObjectItem(tr, "adam_t"), *sd = cJSON_GetObjectItem(tr, "seed");
    /* absent (older checkpoints): the step and the caller's seed; present, they must be valid */
    int sd_ok = cJSON_IsNumber(sd) && sd->valuedouble >= 0 && sd->valuedouble < 18446744073709551616.0;
    if ((at && !sl_json_is_count(at)) || (sd && !sd_ok))
        s = sl_fail(SL_ERR_FORMAT, "%s/manifest.json: field 'train.%s' must be a non-negative integer", dir,
                    at && !sl_json_is_count(at) ? "adam_t" : "seed");
    st->adam_t = sl_json_is_count(at) ? (int64_t)at->valuedouble : st->step;
    if (sd_ok) st->seed = (uint64_t)sd->valuedouble;
    const cJSON *ls = cJSON_GetObjectItem(tr, "loss_scaler"), *sc = cJSON_GetObjectItem(ls, "scale"),
                *gt = cJSON_GetObjectItem(ls, "growth_tracker"),
                *ht = cJSON_GetObjectItem(ls, "hysteresis_tracker"), *sk = cJSON_GetObjectItem(ls, "skipped");
    st->has_scaler = 0;
    if (ls) { /* present: it must be whole, or the resumed run would silently restart its scale */
        if (!(cJSON_IsNumber(sc) && sc->valuedouble > 0 && sc->valuedouble <= 3.4e38) ||
            !sl_json_is_count(gt) || gt->valuedouble > 2147483647.0 || !cJSON_IsNumber(ht) ||
            ht->valuedouble != floor(ht->valuedouble) || fabs(ht->valuedouble) > 2147483647.0 ||
            !sl_json_is_count(sk)) { /* the hysteresis tracker counts down past 0 */
            s = sl_fail(SL_ERR_FORMAT, "%s/manifest.json: train.loss_scaler is not a valid loss-scaler state",
                        dir);
        } else {
            st->has_scaler = 1;
            st->loss_scale = sc->valuedouble;
            st->growth_tracker = (int64_t)gt->valuedouble;
            st->hysteresis_tracker = (int64_t)ht->valuedouble;
            st->skipped = (int64_t)sk->valuedouble;
        }
    }
    return s;
}

sl_status sl_ckpt_load_train_state(const char *dir, sl_ckpt_state *st) {
    reader r;
    sl_status s = reader_open(&r, dir);
    if (s == SL_OK) s = read_train_state(&r, st);
    reader_close(&r);
    return s;
}

sl_status sl_ckpt_load(const char *dir, sl_ckpt_state *st) {
    reader r;
    sl_status s = reader_open(&r, dir);
    r.trusted = st->verified;
    if (s == SL_OK) {
        /* shape check first: a checkpoint of another model gives a clear error */
        for (int i = 0; i < st->m->n_params && s == SL_OK; i++) {
            char tn[128];
            snprintf(tn, sizeof tn, "param/%s", st->m->params[i].t->name);
            if (!cJSON_GetObjectItem(cJSON_GetObjectItem(r.man, "tensors"), tn))
                s = sl_fail(SL_ERR_FORMAT, "%s: checkpoint has no tensor '%s' (saved from another model?)",
                            dir, tn);
        }
    }
    if (s == SL_OK) s = read_train_state(&r, st); /* before the tensors: a bad field costs no read */
    if (s == SL_OK && !st->param_shard && !st->param_shard_buf)
        s = load_flat(&r, st->m, "param", 0, st->m->numel, st->m->params_mem, st->m->params_buf, 0);
    for (int k = 0; k < st->nseg && s == SL_OK; k++) {
        const sl_ckpt_seg *g = &st->seg[k];
        if (st->param_shard || st->param_shard_buf)
            s = load_flat(&r, st->m, "param", g->lo, g->len,
                          st->param_shard ? st->param_shard + g->off : NULL,
                          st->param_shard ? NULL : st->param_shard_buf, g->off);
        if (s != SL_OK) break;
        s = load_flat(&r, st->m, "exp_avg", g->lo, g->len, st->exp_avg ? st->exp_avg + g->off : NULL,
                      st->exp_avg_buf, g->off);
        if (s == SL_OK)
            s = load_flat(&r, st->m, "exp_avg_sq", g->lo, g->len,
                          st->exp_avg_sq ? st->exp_avg_sq + g->off : NULL, st->exp_avg_sq_buf, g->off);
    }
    reader_close(&r);
    return s;
}

/* A step dir's config.json is the manifest's "model" (the trainer writes both from one string); a resume
 * reads the model from config.json, so a missing or damaged one makes the step unusable like a bad shard
 * (the newest valid step is used instead). Checkpoints committed with an empty model ("{}") have none. */
static sl_status check_config(const reader *r) {
    cJSON *model = cJSON_GetObjectItem(r->man, "model");
    if (!cJSON_IsObject(model) || !model->child) return SL_OK;
    char path[4200], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", r->dir);
    SL_TRY(sl_file_read_all(path, &text, &len));
    cJSON *cfg = cJSON_ParseWithLength(text, len);
    free(text);
    int same = cJSON_IsObject(cfg) && cJSON_Compare(model, cfg, 1);
    cJSON_Delete(cfg);
    return same ? SL_OK
                : sl_fail(SL_ERR_FORMAT, "%s: not the model config of its manifest.json (damaged?)", path);
}

sl_status sl_ckpt_verify(const char *dir) {
    reader r;
    sl_status s = reader_open(&r, dir);
    cJSON *t;
    if (s == SL_OK) cJSON_ArrayForEach(t, cJSON_GetObjectItem(r.man, "tensors")) {
            cJSON *sh;
            cJSON_ArrayForEach(sh, cJSON_GetObjectItem(t, "shards")) {
                int64_t o, l;
                const float *d;
                if ((s = shard_data(&r, t->string, sh, &o, &l, &d)) != SL_OK) break;
            }
            if (s != SL_OK) break;
        }
    if (s == SL_OK) s = check_config(&r);
    if (s != SL_OK && cJSON_IsObject(cJSON_GetObjectItem(r.man, "pool")) &&
        strstr(sl_errmsg(), "cannot open")) {
        char msg[1024]; /* one host's copy of a pooled step: the other shard files are on other hosts */
        snprintf(msg, sizeof msg, "%s", sl_errmsg());
        s = sl_fail(
            s,
            "%s (a step dir of one host of a pooled store: its shard files are spread over the "
            "store's host-<h> directories; give the store (--ckpt-local-dir, or suanli ckpt's DIR), or "
            "export it with suanli ckpt gather)",
            msg);
    }
    reader_close(&r);
    return s;
}

sl_status sl_ckpt_inspect(const char *dir, FILE *f) {
    reader r;
    sl_status s = reader_open(&r, dir);
    if (s != SL_OK) {
        reader_close(&r);
        return s;
    }
    char *model = cJSON_PrintUnformatted(cJSON_GetObjectItem(r.man, "model"));
    char *train = cJSON_PrintUnformatted(cJSON_GetObjectItem(r.man, "train"));
    fprintf(f, "checkpoint %s\n  step %lld, world %d\n  model %s\n  train %s\n", dir,
            (long long)cJSON_GetObjectItem(r.man, "step")->valuedouble,
            cJSON_IsNumber(cJSON_GetObjectItem(r.man, "world"))
                ? cJSON_GetObjectItem(r.man, "world")->valueint
                : 1,
            model ? model : "{}", train ? train : "{}");
    free(model);
    free(train);
    int nt = 0, ns = 0;
    double bytes = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(r.man, "tensors")) {
        cJSON *sh;
        int k = 0;
        double n = 0;
        cJSON_ArrayForEach(sh, cJSON_GetObjectItem(t, "shards")) {
            k++;
            cJSON *l = cJSON_GetObjectItem(sh, "length");
            n += cJSON_IsNumber(l) ? l->valuedouble : 0;
        }
        fprintf(f, "  %-40s %s %10.0f elements in %d shard(s)\n", t->string,
                cJSON_GetStringValue(cJSON_GetObjectItem(t, "dtype"))
                    ? cJSON_GetStringValue(cJSON_GetObjectItem(t, "dtype"))
                    : "?",
                n, k);
        nt++;
        ns += k;
        bytes += 4 * n;
    }
    fprintf(f, "  %d tensors, %d shards, %.1f MiB\n", nt, ns, bytes / 1048576.0);
    reader_close(&r);
    return SL_OK;
}

int sl_ckpt_is_checkpoint(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/latest", dir);
    if (access(p, F_OK) == 0) return 1;
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    if (access(p, F_OK) == 0) return 1;
    char **v;
    int n = sl_ckpt_list_steps(dir, &v);
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
    return n > 0;
}

int64_t sl_ckpt_newest_step(const char *root) {
    char **v;
    int n = sl_ckpt_list_steps(root, &v);
    int64_t step = n > 0 ? (int64_t)strtoll(v[0] + 5, NULL, 10) : -1;
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
    return step;
}

sl_status sl_ckpt_find_latest(const char *root, char *out, size_t cap) {
    char p[4200];
    snprintf(p, sizeof p, "%s/manifest.json", root);
    if (access(p, F_OK) == 0) { /* a step dir itself */
        SL_TRY(sl_ckpt_verify(root));
        snprintf(out, cap, "%s", root);
        return SL_OK;
    }
    char **v;
    int n = sl_ckpt_list_steps(root, &v);
    sl_status st = sl_fail(SL_ERR_IO, "%s: no checkpoint", root);
    int found = 0;
    char first_problem[600] = "";
    for (int i = 0; i < n; i++) {
        if (!found) {
            snprintf(p, sizeof p, "%s/%s", root, v[i]);
            sl_status s = sl_ckpt_verify(p);
            if (s == SL_OK) {
                snprintf(out, cap, "%s", p);
                st = SL_OK;
                found = 1;
            } else {
                SL_LOGW("checkpoint %s is not usable (%s); trying an older one", p, sl_errmsg());
                if (!first_problem[0]) snprintf(first_problem, sizeof first_problem, "%s", sl_errmsg());
                st = sl_fail(SL_ERR_FORMAT, "%s: no valid checkpoint (newest: %s)", root, first_problem);
            }
        }
        free(v[i]);
    }
    free(v);
    return st;
}
