/* Pooled node-local checkpoint storage: replicas or erasure-coded blocks across hosts. See
 * include/suanli/ckpt.h.
 *
 * Note [Pooled checkpoint store]
 * Layout: ROOT/host-<h>/step-NNNNNNN/ is host h's node-local directory for one step. Rank r (host
 * h = rank*hosts/world) has the shard file's bytes in memory (header + snapshot, Note [Shard write path])
 * and, on its writer thread, off the training thread:
 *  - replicas k: writes shard-rR.safetensors into its own host dir and the step dirs of hosts
 *    h+1 .. h+k-1 (mod hosts), each from memory (O_DIRECT, nothing read back);
 *  - erasure code k+m: cuts the bytes into k data blocks (zero-padded to a common 64-byte multiple), computes
 *    m parity blocks (ec.c) and writes block j as shard-rR.safetensors.ec<j> on host h+j; the full file is
 *    never written. Each block starts with a 128-byte header naming its stripe (step and shard file),
 *    k, m and its index, so a block of another stripe is recognised as such, not as a checksum mismatch.
 *    The header is zero-padded to 4096 bytes and blocks are 4096-byte multiples, so block files go out
 *    with O_DIRECT like shard files (Note [Shard write path]); the manifest records the padded length as
 *    "block_header" (checkpoints written before it have none: 128, unpadded).
 * The placement (hosts, sizes, XXH3 of every copy and block) goes into the rank's sidecar; rank 0's commit
 * puts it under the manifest's "pool" and writes the same manifest and config.json into every host's
 * step-N.tmp dir before renaming it to step-N (per host: manifest, fsync, rename, `latest`, prune). A restore
 * takes the manifest from any host that has one, then for each shard file the first intact copy (size and
 * checksum match) or any k intact blocks, and writes a plain step dir that sl_ckpt_load reads. With a pool
 * communicator (every multi-rank training job) the copies and blocks, the commit and the restore's reads
 * travel over sl_comm and each rank touches only its own host's directory (pool_comm.c, Note [Pool transfers
 * over comm]); without one (the library used from one process, the offline `suanli ckpt` tools) the owning
 * rank writes into, and the restore reads from, every host directory itself. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/json_util.h"
#include "ckpt/pool_internal.h"

enum { RESTORE_ALIGN = 4096 }; /* received and rebuilt files: O_DIRECT into .restore */

int sl_ckpt_pool_host_of(int rank, int world, int hosts) {
    if (world <= 0 || hosts <= 1) return 0;
    return (int)((int64_t)rank * hosts / world);
}

int sl_ckpt_ec_available(void) { return sl_ec_available(); }

sl_status sl_ckpt_pool_parse_ec(const char *s, int *k, int *m) {
    int used = 0;
    if (!s || sscanf(s, "%d+%d%n", k, m, &used) != 2 || s[used] || *k < 1 || *k > SL_EC_MAX_K || *m < 1 ||
        *m > SL_EC_MAX_M)
        return sl_fail(SL_ERR_INVALID, "--ckpt-ec: expected K+M with 1 <= K <= %d and 1 <= M <= %d, got '%s'",
                       SL_EC_MAX_K, SL_EC_MAX_M, s ? s : "");
    return SL_OK;
}

sl_status sl_ckpt_pool_check(const sl_ckpt_pool *p) {
    if (!p->local_root || !*p->local_root) return sl_fail(SL_ERR_INVALID, "--ckpt-local-dir: empty path");
    if (p->hosts < 1 || p->host < 0 || p->host >= p->hosts)
        return sl_fail(SL_ERR_INVALID, "--hosts: host %d of %d hosts", p->host, p->hosts);
    if (p->ec_k > 0) {
        if (p->replicas > 1)
            return sl_fail(SL_ERR_INVALID, "--ckpt-ec: give either --ckpt-replicas or --ckpt-ec, not both");
        if (!sl_ec_available())
            return sl_fail(SL_ERR_UNSUPPORTED,
                           "--ckpt-ec: this build has no erasure coding (install libisal-dev and rebuild)");
        if (p->ec_k + p->ec_m > p->hosts)
            return sl_fail(
                SL_ERR_INVALID,
                "--ckpt-ec %d+%d: needs %d hosts, this job has %d (suanli run --hosts, SUANLI_HOSTS)",
                p->ec_k, p->ec_m, p->ec_k + p->ec_m, p->hosts);
        return SL_OK;
    }
    if (p->replicas < 1 || p->replicas > p->hosts)
        return sl_fail(SL_ERR_INVALID,
                       "--ckpt-replicas %d: needs 1..%d (the job's hosts; suanli run --hosts, SUANLI_HOSTS)",
                       p->replicas, p->hosts);
    return SL_OK;
}

/* ---------------- restore ---------------- */

/* host dirs present: 1 + the largest h of ROOT/host-<h> (0: none) */
static int hosts_present(const char *root) {
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int h, used = 0;
        if (sscanf(de->d_name, "host-%d%n", &h, &used) == 1 && !de->d_name[used] && h >= 0 && h < 100000 &&
            h + 1 > n)
            n = h + 1;
    }
    closedir(d);
    return n;
}

int sl_ckpt_is_pool(const char *dir) { return hosts_present(dir) > 0; }

/* step numbers that some host dir holds (committed names), newest first, without duplicates */
static int pool_steps(const char *root, int scan, int64_t **out) {
    int n = 0, cap = 0;
    int64_t *v = NULL;
    for (int h = 0; h < scan; h++) {
        char hroot[4300], **names;
        snprintf(hroot, sizeof hroot, "%s/host-%d", root, h);
        int k = sl_ckpt_list_steps(hroot, &names);
        for (int i = 0; i < k; i++) {
            int64_t s = atoll(names[i] + 5);
            free(names[i]);
            int dup = 0;
            for (int j = 0; j < n; j++) dup |= v[j] == s;
            if (dup) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                int64_t *nv = realloc(v, sizeof(int64_t) * (size_t)cap);
                if (!nv) continue;
                v = nv;
            }
            v[n++] = s;
        }
        free(names);
    }
    for (int i = 1; i < n; i++) /* insertion sort, descending */
        for (int j = i; j > 0 && v[j] > v[j - 1]; j--) {
            int64_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    *out = v;
    return n;
}

typedef struct {
    const char *root;
    char step_name[32];
    int hosts; /* of the job: placements must be below */
    char *report;
    size_t rcap;
    /* lock step over comm (sl_ckpt_pool_restore): the hosts' first ranks, rank = host; me: this host */
    sl_comm *lc;
    int me;
    int nowrite; /* lock step, but dest lives on another host: take part in every agreement, write nothing */
    char xfer[1024]; /* the first read that failed because the transfer did (Note [Transfer failures]) */
} ctx;

/* a failure of the hosts' communication (a lost peer, a passed deadline), which a restart can cure: Note
 * [Peer failures in a pooled restore] */
static int peer_failure(sl_status st) { return st == SL_ERR_PEER || st == SL_ERR_TIMEOUT; }

/* Note [Transfer failures]
 * Over the leaders' communicator a file of another host arrives by a transfer (read_host, the streams of
 * pool_comm.c). A read that failed because the transfer did (the peer host unreachable, the connection
 * reset, a piece cut short, a deadline passed) was folded into the same reasons as a file that is not there
 * ("no host holds a readable manifest.json", "no intact copy of ..."): `suanli ckpt inspect` reported data
 * missing, and `verify` / `gather` ended with the exit status of missing or damaged data. A communicator
 * that failed stays failed (sl_comm_async_error), so a failed read is a transfer failure exactly when the
 * communicator is in error afterwards: xfer_failed keeps the first one's reason (it names the host, and the
 * communicator's message names the peer rank, which on the leaders' communicator is the host, and with TCP
 * its address) and the read ends at once with SL_ERR_PEER (xfer_status), which the callers keep as it is and
 * `suanli ckpt` reports with its own exit status (src/cli/cmd_ckpt.c). Tests: tests/fault/test_ckpt_pool.c
 * (test_tools_peer: SUANLI_FAULT_RESTORE_EXIT / _STALL under `suanli ckpt`). */
static int xfer_failed(ctx *c, const char *why) {
    if (!c->lc || sl_comm_async_error(c->lc) == SL_OK) return 0;
    if (!c->xfer[0]) snprintf(c->xfer, sizeof c->xfer, "%s", why);
    return 1;
}

static sl_status xfer_status(ctx *c) { return sl_fail(SL_ERR_PEER, "%s", c->xfer); }

/* a read of root's step that failed with the hosts' communication (msg: why), as inspect, verify, gather
 * and the restore report it */
static sl_status peer_lost(const char *root, const char *step_name, const char *msg) {
    return sl_fail(SL_ERR_PEER,
                   "%s: %s: a peer host was lost or missed the deadline (not missing or damaged "
                   "data): %s",
                   root, step_name, msg);
}

/* Lock step: every host's leader learns whether any of them failed at a local step (writing its restore
 * copy), so that all leave the assembly together; the status to go on with (a peer failure elsewhere stays
 * one: SL_ERR_PEER) */
static sl_status agree(ctx *c, sl_status st) {
    if (!c->lc) return st;
    int32_t bad = st == SL_OK ? 0 : peer_failure(st) ? 2 : 1, any = 0;
    char msg[1024]; /* the collective clears the thread's message: a local failure keeps its own */
    snprintf(msg, sizeof msg, "%s", st != SL_OK ? sl_errmsg() : "");
    if (sl_comm_all_reduce(c->lc, &bad, &any, 1, SL_COMM_I32, SL_COMM_MAX) != SL_OK)
        return st != SL_OK ? sl_fail(st, "%s", msg) : sl_fail(SL_ERR_PEER, "pooled restore: %s", sl_errmsg());
    if (any == 2 && st == SL_OK)
        return sl_fail(SL_ERR_PEER, "pooled restore: another host lost a peer host (communication failed)");
    if (any && st == SL_OK) return sl_fail(SL_ERR_IO, "pooled restore: failed on another host");
    return st != SL_OK ? sl_fail(st, "%s", msg) : st;
}

static void note(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(ctx *c, const char *fmt, ...) {
    if (!c->report) return;
    size_t len = strlen(c->report);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->report + len, c->rcap - len, fmt, ap);
    va_end(ap);
}

/* the file at ROOT/host-h/step/name with an expected size (SIZE_MAX: any): 1 and *buf (*got bytes), or 0
 * and a reason in why */
static int read_local(ctx *c, int h, const char *name, size_t want, char **buf, size_t *got, char *why,
                      size_t wcap) {
    char path[4600];
    snprintf(path, sizeof path, "%s/host-%d/%s/%s", c->root, h, c->step_name, name);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(why, wcap, "host %d: %s missing", h, name);
        return 0;
    }
    if (want == SIZE_MAX) want = (size_t)sb.st_size;
    if ((size_t)sb.st_size != want) {
        snprintf(why, wcap, "host %d: %s is %lld bytes, %s than the recorded %zu", h, name,
                 (long long)sb.st_size, (size_t)sb.st_size < want ? "smaller" : "larger", want);
        return 0;
    }
    size_t n = 0;
    if (sl_file_read_all(path, buf, &n) != SL_OK) {
        snprintf(why, wcap, "host %d: %s unreadable", h, name);
        return 0;
    }
    if (n != want) {
        free(*buf);
        snprintf(why, wcap, "host %d: %s changed size while read", h, name);
        return 0;
    }
    *got = n;
    return 1;
}

/* read_local of host h's file, by h's leader in lock step (Note [Pool transfers over comm]): it reads its
 * own disk and broadcasts the outcome and the bytes to the other hosts' leaders */
static int read_host(ctx *c, int h, const char *name, size_t want, char **buf, size_t *got, char *why,
                     size_t wcap) {
    if (!c->lc) return read_local(c, h, name, want, buf, got, why, wcap);
    struct {
        int64_t ok, n;
        char why[496];
    } m;
    memset(&m, 0, sizeof m);
    char *b = NULL;
    size_t n = 0;
    if (h == c->me) {
        m.ok = read_local(c, h, name, want, &b, &n, m.why, sizeof m.why);
        m.n = (int64_t)n;
    }
    if (sl_comm_broadcast(c->lc, &m, &m, sizeof m, SL_COMM_U8, h) != SL_OK) {
        snprintf(why, wcap, "host %d: %s: transfer failed: %s", h, name, sl_errmsg());
        free(b);
        return 0;
    }
    if (!m.ok) {
        snprintf(why, wcap, "%s", m.why);
        return 0;
    }
    if (h != c->me) { /* NUL-terminated like sl_file_read_all's: manifests are parsed and written as text */
        b = sl_malloc_aligned_to((size_t)m.n + 1, RESTORE_ALIGN); /* aligned for the O_DIRECT restore write */
        if (b) b[m.n] = 0;
    }
    int32_t lack = b == NULL, any = 0; /* a leader without the memory: nobody sends, all report it */
    sl_status rs = sl_comm_all_reduce(c->lc, &lack, &any, 1, SL_COMM_I32, SL_COMM_MAX);
    if (rs != SL_OK || any) {
        snprintf(why, wcap, "host %d: %s: %s%s", h, name,
                 rs != SL_OK ? "transfer failed: " : "a host has no memory to receive it",
                 rs != SL_OK ? sl_errmsg() : "");
        free(b);
        return 0;
    }
    if (sl_comm_broadcast(c->lc, b, b, (size_t)m.n, SL_COMM_U8, h) != SL_OK) {
        snprintf(why, wcap, "host %d: %s: transfer failed: %s", h, name, sl_errmsg());
        free(b);
        return 0;
    }
    *buf = b;
    *got = (size_t)m.n;
    return 1;
}

static int read_checked(ctx *c, int h, const char *name, size_t want, char **buf, char *why, size_t wcap) {
    size_t got;
    return read_host(c, h, name, want, buf, &got, why, wcap);
}

static int host_ok(ctx *c, int h, const char *file, char *err, size_t cap) {
    if (h >= 0 && h < c->hosts) return 1;
    snprintf(err, cap, "manifest places %s on host %d, which is not in this job (hosts 0..%d)", file, h,
             c->hosts - 1);
    return 0;
}

/* one replicated file, over the leaders' communicator (Note [Pooled restore stream]): the copies streamed in
 * turn until one is intact; with dest, every leader but nowrite ones ends with it there: the holder of the
 * intact copy as a hard link to its own file (made before the stream, removed if the copy is not intact),
 * the others as the received bytes; *wst: this leader's write status (the caller agrees on it). */
static sl_status stream_replica(ctx *c, const char *file, cJSON *copies, size_t size, const char *sum,
                                const char *dest, sl_status *wst) {
    char why[1024] = "", one[700], got[32], from[4600];
    int used = -1;
    cJSON *h;
    cJSON_ArrayForEach(h, copies) {
        if (used >= 0 && !c->report)
            break; /* inspect looks at every copy; a restore stops at the first intact */
        int hh = h->valueint, linked = 0;
        const char *to = NULL;
        snprintf(from, sizeof from, "%s/host-%d/%s/%s", c->root, hh, c->step_name, file);
        if (dest && !c->nowrite && used < 0) {
            if (hh == c->me && link(from, dest) == 0)
                linked = 1;
            else
                to = dest;
        }
        sl_status ws;
        int ok = sl_ckpt_pool_restore_stream(c->lc, hh, from, file, size, to, sum, got, sizeof got, &ws, one,
                                             sizeof one);
        if (ok && strcmp(got, sum) != 0) {
            ok = 0;
            snprintf(one, sizeof one, "host %d: %s checksum mismatch (%s, manifest %s)", hh, file, got, sum);
        }
        if (!ok) {
            if (linked) unlink(dest);
            if (xfer_failed(c, one)) return xfer_status(c); /* not a missing copy: Note [Transfer failures] */
            note(c, "    %s copy on host %d: %s\n", file, hh,
                 strstr(one, "checksum mismatch") ? "checksum mismatch" : strchr(one, ':') + 2);
            snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? "; " : "", one);
            continue;
        }
        note(c, "    %s copy on host %d: ok\n", file, hh);
        if (used < 0) {
            used = hh;
            *wst = ws;
        }
    }
    if (used < 0) return sl_fail(SL_ERR_FORMAT, "%s: no intact copy of %s (%s)", c->step_name, file, why);
    if (why[0] && !c->report) SL_LOGW("%s: %s; using the copy on host %d", c->step_name, why, used);
    return SL_OK;
}

/* one replicated file: the first intact copy (*src_host: its host); over the leaders' communicator, the
 * copy goes straight to dest instead (stream_replica; *out NULL, *wst its write) */
static sl_status fetch_replica(ctx *c, const char *file, cJSON *o, size_t size, const char *sum,
                               const char *dest, char **out, int *src_host, sl_status *wst) {
    cJSON *copies = cJSON_GetObjectItem(o, "copies"), *h;
    char why[1024] = "", one[700], got[32];
    if (!cJSON_IsArray(copies))
        return sl_fail(SL_ERR_FORMAT, "%s: manifest pool entry of %s has no copies", c->step_name, file);
    cJSON_ArrayForEach(h, copies) {
        if (!cJSON_IsNumber(h) || !host_ok(c, h->valueint, file, one, sizeof one))
            return sl_fail(SL_ERR_FORMAT, "%s: %s", c->step_name, cJSON_IsNumber(h) ? one : "bad host entry");
    }
    *out = NULL;
    *wst = SL_OK;
    if (c->lc) return stream_replica(c, file, copies, size, sum, dest, wst);
    char *keep = NULL;
    int used = -1;
    cJSON_ArrayForEach(h, copies) {
        char *buf;
        if (keep && !c->report) break; /* inspect looks at every copy; a restore stops at the first intact */
        if (!read_checked(c, h->valueint, file, size, &buf, one, sizeof one)) {
            note(c, "    %s copy on host %d: %s\n", file, h->valueint, strchr(one, ':') + 2);
            snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? "; " : "", one);
            continue;
        }
        sl_pool_sum_str(got, sizeof got, buf, size);
        if (strcmp(got, sum) != 0) {
            free(buf);
            note(c, "    %s copy on host %d: checksum mismatch\n", file, h->valueint);
            snprintf(why + strlen(why), sizeof why - strlen(why),
                     "%shost %d: %s checksum mismatch (%s, manifest %s)", why[0] ? "; " : "", h->valueint,
                     file, got, sum);
            continue;
        }
        note(c, "    %s copy on host %d: ok\n", file, h->valueint);
        if (keep) {
            free(buf);
            continue;
        }
        keep = buf;
        used = h->valueint;
    }
    if (!keep) return sl_fail(SL_ERR_FORMAT, "%s: no intact copy of %s (%s)", c->step_name, file, why);
    if (why[0] && !c->report) SL_LOGW("%s: %s; using the copy on host %d", c->step_name, why, used);
    *src_host = used;
    *out = keep;
    return SL_OK;
}

/* a block file's header against the manifest's entry: 1, or 0 with a reason */
static int ec_header_ok(ctx *c, const ec_header *h0, int h, const char *fname, const char *file, int index,
                        int k, int m, size_t bs, size_t size, char *why, size_t wcap) {
    ec_header hd = *h0;
    char want[80];
    snprintf(want, sizeof want, "%s/%s", c->step_name, file);
    hd.stripe[sizeof hd.stripe - 1] = 0;
    if (memcmp(hd.magic, "SLECBLK1", 8) != 0) {
        snprintf(why, wcap, "host %d: %s is not an erasure-code block", h, fname);
        return 0;
    }
    if (strcmp(hd.stripe, want) != 0 || hd.index != (uint32_t)index || hd.k != (uint32_t)k ||
        hd.m != (uint32_t)m || hd.block_size != bs || hd.file_size != size) {
        snprintf(why, wcap, "host %d: %s is block %u of stripe '%s' (%u+%u), not block %d of '%s' (%d+%d)", h,
                 fname, hd.index, hd.stripe, hd.k, hd.m, index, want, k, m);
        return 0;
    }
    return 1;
}

/* one block of an erasure-coded file into dst (block_size bytes); 0 with a reason when unusable */
static int fetch_block(ctx *c, cJSON *b, const char *file, int k, int m, size_t bs, size_t hb, size_t size,
                       uint8_t *dst, int *index, char *why, size_t wcap) {
    cJSON *ix = cJSON_GetObjectItem(b, "index"), *hh = cJSON_GetObjectItem(b, "host"),
          *fn = cJSON_GetObjectItem(b, "file"), *cs = cJSON_GetObjectItem(b, "checksum");
    *index = cJSON_IsNumber(ix) ? ix->valueint : -1;
    int h = hh->valueint;
    char *buf;
    if (!read_checked(c, h, fn->valuestring, hb + bs, &buf, why, wcap)) return 0;
    ec_header hd;
    memcpy(&hd, buf, sizeof hd);
    int ok = 0;
    if (ec_header_ok(c, &hd, h, fn->valuestring, file, *index, k, m, bs, size, why, wcap)) {
        char got[32];
        sl_pool_sum_str(got, sizeof got, buf + hb, bs);
        if (strcmp(got, cs->valuestring) != 0)
            snprintf(why, wcap, "host %d: %s checksum mismatch (%s, manifest %s)", h, fn->valuestring, got,
                     cs->valuestring);
        else {
            memcpy(dst, buf + hb, bs);
            ok = 1;
        }
    }
    free(buf);
    return ok;
}

/* an erasure-coded file's manifest entry: k, m, block size, header length, the blocks (checked) */
static sl_status ec_entry(ctx *c, const char *file, cJSON *o, size_t size, int *k_, int *m_, size_t *bs_,
                          size_t *hb_, cJSON **blocks_) {
    cJSON *jk = cJSON_GetObjectItem(o, "ec_k"), *jm = cJSON_GetObjectItem(o, "ec_m"),
          *jb = cJSON_GetObjectItem(o, "block_size"), *blocks = cJSON_GetObjectItem(o, "blocks"), *b,
          *jh = cJSON_GetObjectItem(o, "block_header");
    int k = cJSON_IsNumber(jk) ? jk->valueint : 0, m = cJSON_IsNumber(jm) ? jm->valueint : 0;
    size_t bs = sl_json_is_count(jb) ? (size_t)jb->valuedouble : 0;
    /* the block files' header length: padded to EC_ALIGN, or 128 (checkpoints from before the padding) */
    size_t hb = !jh ? sizeof(ec_header) : sl_json_is_count(jh) ? (size_t)jh->valuedouble : 0;
    if (k < 1 || k > SL_EC_MAX_K || m < 1 || m > SL_EC_MAX_M || bs * (size_t)k < size ||
        (hb != sizeof(ec_header) && hb != EC_ALIGN) || !cJSON_IsArray(blocks) ||
        cJSON_GetArraySize(blocks) != k + m)
        return sl_fail(SL_ERR_FORMAT, "%s: manifest: erasure-code entry of %s is malformed", c->step_name,
                       file);
    char one[700];
    cJSON_ArrayForEach(b, blocks) {
        cJSON *hh = cJSON_GetObjectItem(b, "host"), *fn = cJSON_GetObjectItem(b, "file"),
              *cs = cJSON_GetObjectItem(b, "checksum");
        if (!cJSON_IsNumber(hh) || !cJSON_IsString(fn) || !cJSON_IsString(cs) || strchr(fn->valuestring, '/'))
            return sl_fail(SL_ERR_FORMAT, "%s: manifest: a block of %s has missing or mistyped fields",
                           c->step_name, file);
        if (!host_ok(c, hh->valueint, file, one, sizeof one))
            return sl_fail(SL_ERR_FORMAT, "%s: %s", c->step_name, one);
    }
    *k_ = k;
    *m_ = m;
    *bs_ = bs;
    *hb_ = hb;
    *blocks_ = blocks;
    return SL_OK;
}

static sl_status fetch_ec(ctx *c, const char *file, cJSON *o, size_t size, const char *sum, char **out) {
    int k = 0, m = 0;
    size_t bs = 0, hb = 0;
    cJSON *blocks = NULL, *b;
    SL_TRY(ec_entry(c, file, o, size, &k, &m, &bs, &hb, &blocks));
    char one[700];
    uint8_t *blk = sl_malloc_aligned(bs * (size_t)(k + m)), *ptr[SL_EC_MAX_K + SL_EC_MAX_M];
    if (!blk) return sl_fail(SL_ERR_NOMEM, "checkpoint: cannot allocate %zu bytes", bs * (size_t)(k + m));
    int present[SL_EC_MAX_K + SL_EC_MAX_M] = {0}, have = 0, lost_data = 0;
    char why[2048] = "";
    for (int i = 0; i < k + m; i++) ptr[i] = blk + bs * (size_t)i;
    cJSON_ArrayForEach(b, blocks) {
        int idx;
        int ok = 0;
        cJSON *ix = cJSON_GetObjectItem(b, "index");
        idx = cJSON_IsNumber(ix) ? ix->valueint : -1;
        if (idx < 0 || idx >= k + m || present[idx]) {
            snprintf(one, sizeof one, "block index %d out of place", idx);
        } else {
            ok = fetch_block(c, b, file, k, m, bs, hb, size, ptr[idx], &idx, one, sizeof one);
        }
        int h = cJSON_GetObjectItem(b, "host")->valueint;
        if (ok) {
            present[idx] = 1;
            have++;
            note(c, "    %s block %d (%s) on host %d: ok\n", file, idx, idx < k ? "data" : "parity", h);
        } else {
            note(c, "    %s block %d on host %d: %s\n", file, idx, h,
                 strchr(one, ':') ? strchr(one, ':') + 2 : one);
            snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? "; " : "", one);
            if (idx >= 0 && idx < k) lost_data++;
        }
    }
    sl_status st = SL_OK;
    if (have < k) {
        st = sl_fail(SL_ERR_FORMAT,
                     "%s: %s cannot be rebuilt: %d of its %d+%d blocks are intact, %d needed (%s)",
                     c->step_name, file, have, k, m, k, why);
    } else {
        if (why[0] && !c->report)
            SL_LOGW("%s: %s: %s; %s from %d intact blocks", c->step_name, file, why,
                    lost_data ? "rebuilding it" : "reading it", have);
        if (lost_data) st = sl_ckpt_ec_decode(k, m, bs, ptr, present);
    }
    char got[32];
    if (st == SL_OK) {
        sl_pool_sum_str(got, sizeof got, blk, size);
        if (strcmp(got, sum) != 0)
            st = sl_fail(SL_ERR_FORMAT, "%s: %s rebuilt from its blocks has checksum %s, manifest %s",
                         c->step_name, file, got, sum);
    }
    if (st == SL_OK) {
        *out = sl_malloc_aligned_to(size ? size : 1, RESTORE_ALIGN);
        if (!*out)
            st = sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
        else
            memcpy(*out, blk, size);
    }
    sl_free_aligned(blk);
    return st;
}

/* Note [Pooled restore stream], erasure-coded files (a restore over the leaders' communicator): each block's
 * holder first checks its file (size, header) and says so; then k of the blocks that passed, data blocks
 * first, travel in pieces, round t carrying piece t of each (one piece per block in memory, at most 64 MiB
 * in all), and the lost data blocks' piece t is decoded from them. Every block's pieces are hashed as they
 * come or are rebuilt and checked, at the end, against the block's checksum in the manifest; the file's
 * data blocks are the file, so the file is verified block by block (its own checksum would need its bytes
 * in order, which decoding round by round does not give). A block that turns out corrupt is dropped and the
 * file streamed again from the remaining ones. dest (with !nowrite) gets the file's bytes, renamed into
 * place when every block checked out; *wst is this leader's write status. Inspect (c->report) first
 * streams every block that passed its header check and reports each, then rebuilds as a restore would. */
typedef struct {
    int host, ok;
    const char *fname, *cs;
} ec_blk;

enum { EC_N = SL_EC_MAX_K + SL_EC_MAX_M };

/* the piece size: 8 MiB, less when the blocks' pieces would take over 64 MiB */
static size_t ec_piece(int n, size_t bs) {
    size_t p = ((size_t)64 << 20) / (size_t)n / EC_ALIGN * EC_ALIGN;
    if (p > ((size_t)8 << 20)) p = (size_t)8 << 20;
    return p < bs ? p : bs ? bs : EC_ALIGN; /* an empty file's blocks: no rounds */
}

/* one erasure-coded file's stream: the blocks, and the state of the current attempt */
typedef struct {
    ctx *c;
    const char *file;
    int k, m, n;
    size_t bs, hb, size, piece;
    int64_t np;
    ec_blk B[EC_N];
    int fd[EC_N]; /* the holder's open block files */
    uint8_t *pb[EC_N];
    char why[2048];
    /* an attempt: the blocks streamed (S[0..ns)), the lost data blocks, the holders' read failures */
    int S[EC_N], ns, present[EC_N], lost_data, rerr[EC_N];
    XXH3_state_t hs[EC_N];
} ec_stream;

static void ecs_why(ec_stream *e, const char *one) {
    size_t len = strlen(e->why);
    snprintf(e->why + len, sizeof e->why - len, "%s%s", len ? "; " : "", one);
}

/* each block's holder checks its file (size, header) and says so; the good ones stay open */
static sl_status ecs_headers(ec_stream *e, cJSON *blocks) {
    ctx *c = e->c;
    struct {
        int64_t ok;
        char why[496];
    } msg;
    cJSON *b;
    cJSON_ArrayForEach(b, blocks) {
        cJSON *ix = cJSON_GetObjectItem(b, "index");
        int idx = cJSON_IsNumber(ix) ? ix->valueint : -1, h = cJSON_GetObjectItem(b, "host")->valueint;
        const char *fname = cJSON_GetObjectItem(b, "file")->valuestring;
        if (idx < 0 || idx >= e->n || e->B[idx].fname) {
            char one[64];
            snprintf(one, sizeof one, "block index %d out of place", idx);
            note(c, "    %s block %d on host %d: %s\n", e->file, idx, h, one);
            ecs_why(e, one);
            continue;
        }
        e->B[idx] = (ec_blk){h, 0, fname, cJSON_GetObjectItem(b, "checksum")->valuestring};
        memset(&msg, 0, sizeof msg);
        if (h == c->me) {
            char path[4600];
            struct stat sb;
            ec_header hd;
            size_t want = e->hb + e->bs;
            snprintf(path, sizeof path, "%s/host-%d/%s/%s", c->root, h, c->step_name, fname);
            int f = open(path, O_RDONLY | O_CLOEXEC);
            if (f < 0)
                snprintf(msg.why, sizeof msg.why, "host %d: %s %s", h, fname,
                         errno == ENOENT ? "missing" : "unreadable");
            else if (fstat(f, &sb) != 0 || pread(f, &hd, sizeof hd, 0) != (ssize_t)sizeof hd)
                snprintf(msg.why, sizeof msg.why, "host %d: %s unreadable", h, fname);
            else if ((size_t)sb.st_size != want)
                snprintf(msg.why, sizeof msg.why, "host %d: %s is %lld bytes, %s than the recorded %zu", h,
                         fname, (long long)sb.st_size, (size_t)sb.st_size < want ? "smaller" : "larger",
                         want);
            else
                msg.ok = ec_header_ok(c, &hd, h, fname, e->file, idx, e->k, e->m, e->bs, e->size, msg.why,
                                      sizeof msg.why);
            if (msg.ok) {
                e->fd[idx] = f;
                posix_fadvise(f, 0, 0, POSIX_FADV_SEQUENTIAL);
            } else if (f >= 0)
                close(f);
        }
        if (sl_comm_broadcast(c->lc, &msg, &msg, sizeof msg, SL_COMM_U8, h) != SL_OK)
            return sl_fail(SL_ERR_PEER, "%s: %s: block %d: transfer failed: %s", c->step_name, e->file, idx,
                           sl_errmsg());
        e->B[idx].ok = (int)msg.ok;
        if (!msg.ok) {
            note(c, "    %s block %d on host %d: %s\n", e->file, idx, h,
                 strchr(msg.why, ':') ? strchr(msg.why, ':') + 2 : msg.why);
            ecs_why(e, msg.why);
        }
    }
    return SL_OK;
}

/* the rounds of an attempt: piece t of every block in S, the lost data blocks' piece t decoded, every
 * block hashed, and the file's bytes written to out (open_) */
static sl_status ecs_rounds(ec_stream *e, sl_ckpt_out *out, int open_, sl_status *ws, char *werr,
                            size_t wcap) {
    ctx *c = e->c;
    sl_status st = SL_OK;
    for (int i = 0; i < e->n; i++) {
        XXH3_64bits_reset(&e->hs[i]);
        e->rerr[i] = 0;
    }
    for (int64_t t = 0; t < e->np && st == SL_OK; t++) {
        size_t at = (size_t)t * e->piece, len = e->bs - at < e->piece ? e->bs - at : e->piece;
        for (int q = 0; q < e->ns && st == SL_OK; q++) {
            int j = e->S[q];
            if (e->B[j].host == c->me) { /* a failed read sends zeros and is told after the rounds */
                size_t got = 0;
                while (!e->rerr[j] && got < len) {
                    ssize_t r = pread(e->fd[j], e->pb[j] + got, len - got, (off_t)(e->hb + at + got));
                    if (r < 0 && errno == EINTR) continue;
                    if (r <= 0)
                        e->rerr[j] = 1;
                    else
                        got += (size_t)r;
                }
                if (got < len) memset(e->pb[j] + got, 0, len - got);
            }
            if (sl_comm_broadcast(c->lc, e->pb[j], e->pb[j], len, SL_COMM_U8, e->B[j].host) != SL_OK)
                st = sl_fail(SL_ERR_PEER, "%s: %s: block %d: transfer failed: %s", c->step_name, e->file, j,
                             sl_errmsg());
            else
                XXH3_64bits_update(&e->hs[j], e->pb[j], len);
        }
        if (st == SL_OK && e->lost_data) {
            st = sl_ckpt_ec_decode(e->k, e->m, len, e->pb, e->present);
            for (int i = 0; i < e->k && st == SL_OK; i++)
                if (!e->present[i]) XXH3_64bits_update(&e->hs[i], e->pb[i], len);
        }
        for (int i = 0; i < e->k && st == SL_OK && open_ && *ws == SL_OK; i++) {
            size_t off = (size_t)i * e->bs + at;
            if (off >= e->size) continue;
            *ws = sl_ckpt_out_write(out, e->pb[i], e->size - off < len ? e->size - off : len, off, e->piece);
            if (*ws != SL_OK) snprintf(werr, wcap, "%s", sl_errmsg());
        }
    }
    return st;
}

/* after the rounds: the holders' reads, then every streamed block's checksum (survey: each reported; a
 * bad one dropped, *redo outside a survey) and the rebuilt blocks' */
static sl_status ecs_check(ec_stream *e, int survey, int *redo) {
    ctx *c = e->c;
    struct {
        int64_t ok;
        char why[496];
    } msg;
    char one[700], got[32];
    *redo = 0;
    for (int q = 0; q < e->ns; q++) {
        int j = e->S[q];
        memset(&msg, 0, sizeof msg);
        msg.ok = !e->rerr[j];
        if (e->rerr[j])
            snprintf(msg.why, sizeof msg.why, "host %d: %s unreadable", e->B[j].host, e->B[j].fname);
        if (sl_comm_broadcast(c->lc, &msg, &msg, sizeof msg, SL_COMM_U8, e->B[j].host) != SL_OK)
            return sl_fail(SL_ERR_PEER, "%s: %s: transfer failed: %s", c->step_name, e->file, sl_errmsg());
        snprintf(got, sizeof got, "xxh3:%016llx", (unsigned long long)XXH3_64bits_digest(&e->hs[j]));
        if (!msg.ok)
            snprintf(one, sizeof one, "%s", msg.why);
        else if (strcmp(got, e->B[j].cs) != 0)
            snprintf(one, sizeof one, "host %d: %s checksum mismatch (%s, manifest %s)", e->B[j].host,
                     e->B[j].fname, got, e->B[j].cs);
        else {
            if (survey)
                note(c, "    %s block %d (%s) on host %d: ok\n", e->file, j, j < e->k ? "data" : "parity",
                     e->B[j].host);
            continue;
        }
        if (survey)
            note(c, "    %s block %d on host %d: %s\n", e->file, j, e->B[j].host,
                 strstr(one, "checksum mismatch") ? "checksum mismatch" : strchr(one, ':') + 2);
        e->B[j].ok = 0; /* dropped: the next attempt takes another block */
        *redo = !survey;
        ecs_why(e, one);
    }
    for (int i = 0; i < e->k && !*redo && !survey; i++) {
        snprintf(got, sizeof got, "xxh3:%016llx", (unsigned long long)XXH3_64bits_digest(&e->hs[i]));
        if (!e->present[i] && strcmp(got, e->B[i].cs) != 0)
            return sl_fail(SL_ERR_FORMAT,
                           "%s: %s: data block %d rebuilt from its blocks has checksum %s, manifest %s",
                           c->step_name, e->file, i, got, e->B[i].cs);
    }
    return SL_OK;
}

/* choose the attempt's blocks: k of the good ones (data first), or every good one in a survey */
static sl_status ecs_choose(ec_stream *e, int survey, int *have) {
    e->ns = e->lost_data = *have = 0;
    for (int i = 0; i < e->n; i++) {
        *have += e->B[i].ok;
        e->present[i] = e->B[i].ok && (e->ns < e->k || survey);
        if (e->present[i]) e->S[e->ns++] = i;
    }
    for (int i = 0; i < e->k && !survey; i++) e->lost_data += !e->present[i];
    if (e->ns < e->k && !survey)
        return sl_fail(SL_ERR_FORMAT,
                       "%s: %s cannot be rebuilt: %d of its %d+%d blocks are intact, %d needed (%s)",
                       e->c->step_name, e->file, *have, e->k, e->m, e->k, e->why);
    for (int i = 0; i < e->k; i++) /* a data block without an entry (an index out of place) */
        if (!e->B[i].cs)
            return sl_fail(SL_ERR_FORMAT,
                           "%s: manifest: block %d of %s has no entry, its bytes cannot be checked",
                           e->c->step_name, i, e->file);
    return SL_OK;
}

static sl_status stream_ec(ctx *c, const char *file, cJSON *o, size_t size, const char *dest,
                           sl_status *wst) {
    ec_stream *e = calloc(1, sizeof *e);
    if (!e) return sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
    cJSON *blocks = NULL;
    sl_status st = ec_entry(c, file, o, size, &e->k, &e->m, &e->bs, &e->hb, &blocks);
    e->c = c;
    e->file = file;
    e->size = size;
    e->n = e->k + e->m;
    for (int i = 0; i < EC_N; i++) e->fd[i] = -1;
    if (st == SL_OK) st = ecs_headers(e, blocks);
    if (st == SL_OK) {
        e->piece = ec_piece(e->n, e->bs);
        e->np = (int64_t)((e->bs + e->piece - 1) / e->piece);
        int32_t lack = 0, any = 0;
        for (int i = 0; i < e->n; i++) lack |= !(e->pb[i] = sl_malloc_aligned_to(e->piece, EC_ALIGN));
        sl_status rs = sl_comm_all_reduce(c->lc, &lack, &any, 1, SL_COMM_I32, SL_COMM_MAX);
        if (rs != SL_OK || any)
            st = sl_fail(rs != SL_OK ? SL_ERR_PEER : SL_ERR_NOMEM, "%s: %s: %s%s", c->step_name, file,
                         rs != SL_OK ? "transfer failed: " : "a host has no memory for the restore's pieces",
                         rs != SL_OK ? sl_errmsg() : "");
    }
    int writing = dest && !c->nowrite, survey = c->report != NULL, have = 0, redo = 0;
    *wst = SL_OK;
    /* attempts with k of the blocks that are still good; inspect first surveys every block (streamed and
     * checked, each one reported), then rebuilds as a restore would */
    while (st == SL_OK && (st = ecs_choose(e, survey, &have)) == SL_OK) {
        sl_ckpt_out out;
        sl_status ws = SL_OK;
        char werr[512] = "";
        int open_ = writing && !survey && (ws = sl_ckpt_out_open(&out, dest, 1)) == SL_OK;
        if (ws != SL_OK) snprintf(werr, sizeof werr, "%s", sl_errmsg());
        st = ecs_rounds(e, &out, open_, &ws, werr, sizeof werr);
        if (st == SL_OK) st = ecs_check(e, survey, &redo);
        int keep = st == SL_OK && !redo;
        if (open_) {
            sl_status cs = sl_ckpt_out_close(&out, size, 0, keep && ws == SL_OK);
            if (keep && ws == SL_OK && cs != SL_OK) {
                ws = cs;
                snprintf(werr, sizeof werr, "%s", sl_errmsg());
            }
        }
        if (st != SL_OK) break;
        if (redo || survey) {
            survey = 0;
            continue;
        }
        if (e->why[0] && !c->report)
            SL_LOGW("%s: %s: %s; %s from %d intact blocks", c->step_name, file, e->why,
                    e->lost_data ? "rebuilding it" : "reading it", have);
        if (ws != SL_OK) *wst = sl_fail(ws, "%s", werr);
        break;
    }
    for (int i = 0; i < EC_N; i++) {
        sl_free_aligned(e->pb[i]);
        if (e->fd[i] >= 0) close(e->fd[i]);
    }
    free(e);
    return st;
}

/* the manifest of a step from the first host that has a well-formed one (text and config.json) */
static sl_status step_manifest(ctx *c, int scan, cJSON **man, char **text, char **config, size_t *clen) {
    char path[4600], first[4700] = "";
    *man = NULL;
    *text = *config = NULL;
    for (int h = 0; h < scan; h++) {
        char *t, why[600];
        size_t n;
        snprintf(path, sizeof path, "%s/host-%d/%s/manifest.json", c->root, h, c->step_name);
        if (!read_host(c, h, "manifest.json", SIZE_MAX, &t, &n, why, sizeof why)) {
            if (xfer_failed(c, why)) return xfer_status(c); /* Note [Transfer failures] */
            continue;
        }
        cJSON *j = cJSON_ParseWithLength(t, n);
        cJSON *fmt = cJSON_GetObjectItem(j, "format"), *pool = cJSON_GetObjectItem(j, "pool");
        if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "suanli-checkpoint") != 0 ||
            !cJSON_IsObject(pool) || !cJSON_IsObject(cJSON_GetObjectItem(pool, "files")) ||
            !cJSON_IsNumber(cJSON_GetObjectItem(j, "step"))) {
            if (!first[0]) snprintf(first, sizeof first, "%s: not a pooled suanli manifest", path);
            cJSON_Delete(j);
            free(t);
            continue;
        }
        if (!read_host(c, h, "config.json", SIZE_MAX, config, clen, why, sizeof why)) {
            *config = NULL;
            if (xfer_failed(c, why)) {
                cJSON_Delete(j);
                free(t);
                return xfer_status(c);
            }
        }
        /* config.json is the manifest's "model" (one string, written on every host): a host whose copy is
         * missing or damaged gets it from the manifest, as the restored step dir must hold it */
        cJSON *model = cJSON_GetObjectItem(j, "model"),
              *cj = *config ? cJSON_ParseWithLength(*config, *clen) : NULL;
        if (cJSON_IsObject(model) && model->child && !(cJSON_IsObject(cj) && cJSON_Compare(model, cj, 1))) {
            free(*config);
            *config = cJSON_PrintUnformatted(model);
            *clen = *config ? strlen(*config) : 0;
        }
        cJSON_Delete(cj);
        *man = j;
        *text = t;
        if (c->hosts <= 0) {
            cJSON *jh = cJSON_GetObjectItem(pool, "hosts");
            c->hosts = cJSON_IsNumber(jh) ? jh->valueint : scan;
        }
        return SL_OK;
    }
    return sl_fail(SL_ERR_FORMAT, "%s: no host holds a readable manifest.json of %s%s%s", c->root,
                   c->step_name, first[0] ? "; " : "", first);
}

/* assemble one step into dest (NULL: verify only) */
static sl_status assemble_step(ctx *c, int scan, const char *dest) {
    cJSON *man;
    char *text, *config;
    size_t clen = 0;
    SL_TRY(step_manifest(c, scan, &man, &text, &config, &clen));
    sl_status st = SL_OK;
    char path[4600];
    if (dest) {
        if (!c->nowrite && access(dest, F_OK) == 0) st = sl_ckpt_rm_rf(dest);
        if (st == SL_OK && !c->nowrite) st = sl_mkdirs(dest);
        SL_CHECK(agree(c, st));
    }
    cJSON *f, *files = cJSON_GetObjectItem(cJSON_GetObjectItem(man, "pool"), "files"),
              *jw = cJSON_GetObjectItem(man, "world");
    /* every rank of a pooled job writes one shard file: a manifest without one is incomplete */
    for (int r = 0; cJSON_IsNumber(jw) && r < jw->valueint; r++) {
        char fn[64];
        snprintf(fn, sizeof fn, "shard-r%05d.safetensors", r);
        if (!cJSON_GetObjectItem(files, fn)) {
            st = sl_fail(SL_ERR_FORMAT, "%s: manifest lists no %s (rank %d of %d)", c->step_name, fn, r,
                         jw->valueint);
            goto done;
        }
    }
    cJSON_ArrayForEach(f, files) {
        cJSON *js = cJSON_GetObjectItem(f, "size"), *jc = cJSON_GetObjectItem(f, "checksum");
        if (!sl_json_is_count(js) || !cJSON_IsString(jc) || strchr(f->string, '/')) {
            st = sl_fail(SL_ERR_FORMAT, "%s: manifest: pool entry '%s' has missing or mistyped fields",
                         c->step_name, f->string);
            goto done;
        }
        char *buf = NULL;
        size_t size = (size_t)js->valuedouble;
        int src = -1, ec = cJSON_GetObjectItem(f, "blocks") != NULL;
        sl_status wst = SL_OK;
        if (dest) snprintf(path, sizeof path, "%s/%s", dest, f->string);
        if (ec && c->lc) /* streamed (into dest) (Note [Pooled restore stream]) */
            st = stream_ec(c, f->string, f, size, dest ? path : NULL, &wst);
        else if (ec)
            st = fetch_ec(c, f->string, f, size, jc->valuestring, &buf);
        else
            st = fetch_replica(c, f->string, f, size, jc->valuestring, dest ? path : NULL, &buf, &src, &wst);
        if (st == SL_OK && c->lc && dest) { /* streamed into place: agree on the writes */
            st = agree(c, wst);
        } else if (st == SL_OK && dest) {
            /* Note [Restore copies]: a verified copy is hard-linked when it lives on this file system (the
             * hosts of one machine, or the holder's own copy in a stream: stream_replica), rebuilt and
             * received files are written; neither is fsynced: .restore is a cache that the loader verifies
             * again (XXH3 of every tensor) and that the next restart rebuilds. Written files go out with
             * O_DIRECT from aligned buffers: through the page cache, a 512 MiB replica met the kernel's
             * dirty page throttling and took 2.6 s (the load then reads it cold, 0.4 s); a lost-host restart
             * of GPT-2 124M on 2 hosts went from 10.0-11.2 s to 5.2-5.3 s (docs/BENCHMARKS.md) */
            char from[4600];
            snprintf(from, sizeof from, "%s/host-%d/%s/%s", c->root, src, c->step_name, f->string);
            if (c->nowrite)
                ;
            else if (src < 0 || link(from, path) != 0)
                /* received or rebuilt: O_DIRECT from an aligned buffer, no page-cache copy */
                st = sl_ckpt_write_file(path, NULL, 0, buf, size,
                                        (uintptr_t)buf % RESTORE_ALIGN == 0 ? SL_CKPT_IO_DIRECT : 0, NULL);
            st = agree(c, st); /* a local failure: every leader leaves here (reads were the same for all) */
        }
        free(buf);
        if (st != SL_OK) goto done;
    }
    if (dest) {
        snprintf(path, sizeof path, "%s/manifest.json", dest);
        if (!c->nowrite) st = sl_ckpt_write_file(path, NULL, 0, text, strlen(text), 0, NULL);
        if (st == SL_OK && config && !c->nowrite) {
            snprintf(path, sizeof path, "%s/config.json", dest);
            st = sl_ckpt_write_file(path, NULL, 0, config, clen, 0, NULL);
        }
        st = agree(c, st);
    }
done:
    cJSON_Delete(man);
    free(text);
    free(config);
    return st;
}

/* Lock step: the union of the steps the hosts hold (each leader lists its own host dir), newest first */
enum { MAX_LISTED = 64 };
static int pool_steps_comm(const char *root, sl_comm *lc, int me, int64_t **out) {
    int hosts = sl_comm_size(lc);
    int64_t mine[MAX_LISTED], *all = malloc(sizeof mine * (size_t)hosts), *v = NULL;
    *out = NULL;
    for (int i = 0; i < MAX_LISTED; i++) mine[i] = -1;
    char hroot[4300], **names;
    snprintf(hroot, sizeof hroot, "%s/host-%d", root, me);
    int k = sl_ckpt_list_steps(hroot, &names); /* newest first: the newest MAX_LISTED of this host */
    for (int i = 0; i < k; i++) {
        if (i < MAX_LISTED) mine[i] = atoll(names[i] + 5);
        free(names[i]);
    }
    if (k > 0) free(names);
    if (!all || sl_comm_all_gather(lc, mine, all, MAX_LISTED, SL_COMM_I64) != SL_OK) {
        free(all);
        return -1;
    }
    int n = 0;
    v = malloc(sizeof mine * (size_t)hosts);
    for (int i = 0; v && i < hosts * MAX_LISTED; i++) {
        if (all[i] < 0) continue;
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= v[j] == all[i];
        if (!dup) v[n++] = all[i];
    }
    for (int i = 1; i < n; i++) /* insertion sort, descending */
        for (int j = i; j > 0 && v[j] > v[j - 1]; j--) {
            int64_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    free(all);
    *out = v;
    return v ? n : -1;
}

/* the step dirs under dest, step-N.tmp ones of a killed restore included */
static sl_status empty_restore(const char *dest) {
    sl_status st = SL_OK;
    sl_ckpt_remove_stale_tmp(dest, NULL, 0);
    char **v, path[4400];
    int nv = sl_ckpt_list_steps(dest, &v);
    for (int k = 0; k < nv; k++) {
        snprintf(path, sizeof path, "%s/%s", dest, v[k]);
        sl_status rs = sl_ckpt_rm_rf(path);
        if (st == SL_OK) st = rs;
        free(v[k]);
    }
    if (nv > 0) free(v);
    return st;
}

sl_status sl_ckpt_pool_restore_remove(const char *dest) {
    SL_TRY(empty_restore(dest));
    char path[4400];
    snprintf(path, sizeof path, "%s/latest", dest);
    if (unlink(path) != 0 && errno != ENOENT)
        return sl_fail(SL_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    if (rmdir(dest) != 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST)
        return sl_fail(SL_ERR_IO, "%s: cannot remove: %s", dest, strerror(errno));
    return SL_OK;
}

/* Test hooks (docs/ENV.md), on the first attempt (SUANLI_RESTART_COUNT unset or 0), right after the
 * lock-step listing of the steps in a pooled read over comm (a restore, or `suanli ckpt
 * inspect|verify|gather` under `suanli run`): SUANLI_FAULT_RESTORE_EXIT=h makes host h's leader die
 * (_exit 137, a lost host); SUANLI_FAULT_RESTORE_STALL=h:S makes it sleep S seconds and go on (alive but
 * silent past the communicators' deadline, SUANLI_COMM_TIMEOUT). */
static void restore_fault(int me) {
    const char *rc = getenv("SUANLI_RESTART_COUNT"), *ex = getenv("SUANLI_FAULT_RESTORE_EXIT"),
               *stall = getenv("SUANLI_FAULT_RESTORE_STALL");
    char *end;
    if (rc && strcmp(rc, "0") != 0) return;
    if (ex && *ex && strtol(ex, &end, 10) == me && !*end) {
        fprintf(stderr, "suanli: SUANLI_FAULT_RESTORE_EXIT=%s: host %d's leader dying inside a pooled read\n",
                ex, me);
        fflush(stderr);
        _exit(137);
    }
    if (stall && *stall && strtol(stall, &end, 10) == me && *end == ':') {
        unsigned sec = (unsigned)strtoul(end + 1, NULL, 10);
        fprintf(stderr,
                "suanli: SUANLI_FAULT_RESTORE_STALL=%s: host %d's leader stalling %u s in a pooled read\n",
                stall, me, sec);
        fflush(stderr);
        while (sec > 0) sec = sleep(sec);
    }
}

/* Note [Peer failures in a pooled restore]
 * A step that cannot be assembled sends the restore on to an older step, and when none is left it ends as
 * SL_ERR_FORMAT "no complete pooled checkpoint": the pool's data is missing or damaged, which a restart
 * cannot cure (the job's exit status 2, not retried). A failure of the leaders' communication is not about
 * the data: a lost host, or one silent past SUANLI_COMM_TIMEOUT (a stalled disk). Once a communicator fails
 * every later operation on it fails too ("communicator already failed"), so the older steps would fail the
 * same way and the run would end as "no complete pooled checkpoint", exit 2, never retried by `suanli run
 * --max-restarts` or the Slurm script. So the step loop stops at the first peer failure and returns
 * SL_ERR_PEER with its message. It is recognised by the status (the step listing, agree(), the streams'
 * transfers) or, where a transfer failure was folded into a reason ("host 1: manifest.json: transfer failed"
 * in read_host, a copy not received in stream_replica: they read as missing data), by the communicator's
 * sticky error (sl_comm_async_error). Every leader sees it: the one whose collective failed first, and the
 * others when their next collective with it fails; agree() carries the class too (2: a peer failure), for a
 * leader whose own failure was one while the agreement itself still went through. src/train/job.c (Note
 * [Pooled restore]) turns it into a runtime failure on every rank (exit 1, restartable); not exit 75, which
 * the Slurm script requeues without counting, so a failure that recurs would loop forever. Tests:
 * tests/fault/test_ckpt_pool.c (SUANLI_FAULT_RESTORE_EXIT, SUANLI_FAULT_RESTORE_STALL). */

/* nowrite: under lock step, this host only reads and sends (dest is written by another host) */
static sl_status gather(const char *root, int hosts, int64_t step, const char *dest, int64_t *got,
                        sl_comm *lc, int me, int nowrite) {
    int scan = lc ? hosts : hosts_present(root);
    if (hosts > scan) scan = hosts;
    int64_t *steps = NULL;
    int n = lc ? pool_steps_comm(root, lc, me, &steps) : pool_steps(root, scan, &steps);
    if (n < 0)
        return sl_fail(SL_ERR_PEER, "%s: pooled restore: listing the hosts' steps: %s", root, sl_errmsg());
    if (lc) restore_fault(me);
    char tmp[4200], fin[4200], first[1200] = "";
    sl_status st = sl_fail(SL_ERR_IO, "%s: no pooled checkpoint (no host-*/step-* directories)", root);
    int tried = 0, lost = 0;
    if (dest && n > 0 && !nowrite) {
        /* dest (a restart's .restore) holds only what an earlier restore assembled, never read again:
         * removed first, partial step-N.tmp dirs of a killed restore included, so that a disk the old copy
         * filled has room for the new one (Note [Stale temp dirs] in ckpt.c) */
        (void)empty_restore(dest);
    }
    if (dest && n > 0) {
        ctx c0 = {.lc = lc};
        if ((st = agree(&c0, nowrite ? SL_OK : sl_mkdirs(dest))) != SL_OK) n = 0;
        if (lc && peer_failure(st)) {
            char name[32];
            snprintf(name, sizeof name, "step-%07lld", (long long)steps[0]);
            st = peer_lost(root, name, sl_errmsg());
            lost = 1;
        }
    }
    for (int i = 0; i < n; i++) {
        if (step >= 0 && steps[i] != step) continue;
        tried++;
        ctx c = {.root = root, .hosts = hosts, .lc = lc, .me = me, .nowrite = nowrite};
        snprintf(c.step_name, sizeof c.step_name, "step-%07lld", (long long)steps[i]);
        if (dest) {
            snprintf(tmp, sizeof tmp, "%s/%s.tmp", dest, c.step_name);
            snprintf(fin, sizeof fin, "%s/%s", dest, c.step_name);
        }
        st = assemble_step(&c, scan, dest ? tmp : NULL);
        int commit = st == SL_OK && dest; /* the same on every host: the assembly agreed */
        if (commit && !nowrite) {
            if (access(fin, F_OK) == 0) st = sl_ckpt_rm_rf(fin);
            if (st == SL_OK && rename(tmp, fin) != 0)
                st = sl_fail(SL_ERR_IO, "%s: cannot rename to %s: %s", tmp, fin, strerror(errno));
            if (st == SL_OK) {
                char path[4300], name[48];
                snprintf(path, sizeof path, "%s/latest", dest);
                snprintf(name, sizeof name, "%s\n", c.step_name);
                st = sl_file_write_atomic(path, name, strlen(name));
                sl_fsync_dir(dest);
                char **v; /* only the assembled step stays (it may be older than one assembled before) */
                int nv = sl_ckpt_list_steps(dest, &v);
                for (int k = 0; k < nv; k++) {
                    snprintf(path, sizeof path, "%s/%s", dest, v[k]);
                    if (strcmp(v[k], c.step_name) != 0) sl_ckpt_rm_rf(path);
                    free(v[k]);
                }
                free(v);
            }
        }
        if (commit) st = agree(&c, st);
        if (st == SL_OK) {
            if (got) *got = steps[i];
            break;
        }
        if (dest && !nowrite) sl_ckpt_rm_rf(tmp);
        /* a peer failure: no older step is tried (Note [Peer failures in a pooled restore]) */
        if (lc && (peer_failure(st) || sl_comm_async_error(lc) != SL_OK)) {
            st = peer_lost(root, c.step_name, sl_errmsg());
            lost = 1;
            break;
        }
        if (!first[0]) snprintf(first, sizeof first, "%s", sl_errmsg());
        if (step < 0)
            SL_LOGW("pooled checkpoint %s/%s is not usable (%s); trying an older one", root, c.step_name,
                    sl_errmsg());
    }
    if (lost)
        ; /* SL_ERR_PEER, its message */
    else if (step >= 0 && !tried && n > 0)
        st = sl_fail(SL_ERR_IO, "%s: no host holds step-%07lld", root, (long long)step);
    else if (st != SL_OK && first[0])
        st = sl_fail(SL_ERR_FORMAT, "%s: no complete pooled checkpoint (newest: %s)", root, first);
    free(steps);
    return st;
}

sl_status sl_ckpt_pool_gather(const char *root, int hosts, int64_t step, const char *dest, int64_t *got) {
    return gather(root, hosts, step, dest, got, NULL, 0, 0);
}

sl_status sl_ckpt_pool_gather_comm(const char *root, sl_comm *hosts, int64_t step, const char *dest,
                                   int64_t *got) {
    int me = sl_comm_rank(hosts);
    return gather(root, sl_comm_size(hosts), step, dest, got, hosts, me, me != 0);
}

sl_status sl_ckpt_pool_restore(const sl_ckpt_pool *p, sl_comm *leaders, const char *dest, int64_t *got) {
    if (!leaders || sl_comm_size(leaders) != p->hosts || sl_comm_rank(leaders) != p->host)
        return sl_fail(SL_ERR_INVALID,
                       "pooled restore: the leaders' communicator must have one rank per host");
    return gather(p->local_root, p->hosts, -1, dest, got, leaders, p->host, 0);
}

/* lc: lock step over the hosts' communicator (rank = host, each reading only its own directory); the
 * report is printed by host 0 */
static sl_status inspect(const char *root, int hosts, FILE *f, sl_comm *lc) {
    int me = lc ? sl_comm_rank(lc) : 0, scan = lc ? sl_comm_size(lc) : hosts_present(root);
    if (hosts > scan) scan = hosts;
    if (me != 0) f = NULL;
    int64_t *steps = NULL;
    int n = lc ? pool_steps_comm(root, lc, me, &steps) : pool_steps(root, scan, &steps);
    if (lc && n > 0) restore_fault(me);
    if (n <= 0) {
        free(steps);
        return n < 0 ? sl_fail(SL_ERR_PEER, "%s: listing the hosts' steps: %s", root, sl_errmsg())
                     : sl_fail(SL_ERR_IO, "%s: no pooled checkpoint (no host-*/step-* directories)", root);
    }
    char *report = calloc(1, 1 << 16);
    if (!report) {
        free(steps);
        return sl_fail(SL_ERR_NOMEM, "%s: out of memory", root);
    }
    ctx c = {.root = root, .hosts = hosts, .report = report, .rcap = 1 << 16, .lc = lc, .me = me};
    snprintf(c.step_name, sizeof c.step_name, "step-%07lld", (long long)steps[0]);
    free(steps);
    cJSON *man;
    char *text, *config;
    size_t clen;
    sl_status st = step_manifest(&c, scan, &man, &text, &config, &clen);
    if (st != SL_OK) {
        free(report);
        if (lc && (peer_failure(st) || sl_comm_async_error(lc) != SL_OK))
            return peer_lost(root, c.step_name, sl_errmsg()); /* Note [Transfer failures] */
        return st;
    }
    cJSON *pool = cJSON_GetObjectItem(man, "pool");
    const char *red = cJSON_GetStringValue(cJSON_GetObjectItem(pool, "redundancy"));
    if (f)
        fprintf(f, "pooled checkpoint %s, newest %s: %d hosts, redundancy %s, %d shard files\n", root,
                c.step_name, c.hosts, red ? red : "?",
                cJSON_GetArraySize(cJSON_GetObjectItem(pool, "files")));
    cJSON *rh = cJSON_GetObjectItem(pool, "rank_host"), *e;
    if (cJSON_IsArray(rh) && f) {
        fprintf(f, "  rank -> host:");
        int r = 0;
        cJSON_ArrayForEach(e, rh) fprintf(f, " %d->%d", r++, e->valueint);
        fprintf(f, "\n");
    }
    /* which host directories exist: each host looks at its own under lock step */
    int32_t *present = calloc((size_t)(c.hosts > scan ? c.hosts : scan) + 1, sizeof(int32_t));
    char p[4400];
    if (present && lc) {
        snprintf(p, sizeof p, "%s/host-%d", root, me);
        int32_t mine = access(p, F_OK) == 0;
        if (sl_comm_all_gather(lc, &mine, present, 1, SL_COMM_I32) != SL_OK) st = SL_ERR_PEER;
    }
    for (int h = 0; present && st == SL_OK && h < c.hosts; h++) {
        snprintf(p, sizeof p, "%s/host-%d", root, h);
        int here = lc ? (h < scan && present[h]) : access(p, F_OK) == 0;
        if (!here && f) fprintf(f, "  host %d: directory missing (lost host?)\n", h);
    }
    free(present);
    cJSON_Delete(man);
    free(text);
    free(config);
    if (st != SL_OK) {
        free(report);
        return peer_lost(root, c.step_name, sl_errmsg());
    }
    st = assemble_step(&c, scan, NULL);
    if (st != SL_OK && lc && (peer_failure(st) || sl_comm_async_error(lc) != SL_OK)) {
        free(report); /* the survey so far is no verdict: Note [Transfer failures] */
        return peer_lost(root, c.step_name, sl_errmsg());
    }
    if (f) fputs(report, f);
    if (st == SL_OK && f) fprintf(f, "  every shard file of %s can be rebuilt\n", c.step_name);
    free(report);
    return st;
}

sl_status sl_ckpt_pool_inspect(const char *root, int hosts, FILE *f) { return inspect(root, hosts, f, NULL); }

sl_status sl_ckpt_pool_inspect_comm(const char *root, sl_comm *hosts, FILE *f) {
    return inspect(root, sl_comm_size(hosts), f, hosts);
}
