/* Pooled node-local checkpoint storage, the write side: a rank's shard spread over the hosts as replicas or
 * erasure-coded blocks (sl_ckpt_pool_spread) and the commit on every host (sl_ckpt_pool_commit[_comm]); the
 * restore side is pool.c. Note [Pooled checkpoint store] in pool.c. */
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

void sl_pool_sum_str(char *out, size_t cap, const void *p, size_t n) {
    snprintf(out, cap, "xxh3:%016llx", (unsigned long long)XXH3_64bits(p, n));
}

static void peer_dir(char *out, size_t cap, const sl_ckpt_pool *p, int host, const char *stepbase) {
    snprintf(out, cap, "%s/host-%d/%s", p->local_root, host, stepbase);
}

static sl_status spread_ec(const sl_ckpt_pool *p, const char *stepbase, int64_t step, const char *file,
                           const void *hdr, size_t hlen, const void *data, size_t dlen, cJSON *o) {
    size_t n = hlen + dlen;
    int k = p->ec_k, m = p->ec_m;
    size_t bs = ((n + (size_t)k - 1) / (size_t)k + EC_ALIGN - 1) / EC_ALIGN * EC_ALIGN;
    if (bs == 0) bs = EC_ALIGN;
    uint8_t *blk = sl_malloc_aligned_to(bs * (size_t)(k + m), EC_ALIGN),
            *heads = sl_malloc_aligned_to((size_t)(k + m) * EC_ALIGN, EC_ALIGN);
    if (!blk || !heads) {
        sl_free_aligned(blk);
        sl_free_aligned(heads);
        return sl_fail(SL_ERR_NOMEM, "checkpoint: erasure coding: cannot allocate %zu bytes", bs * (k + m));
    }
    memset(heads, 0, (size_t)(k + m) * EC_ALIGN);
    uint8_t *ptr[SL_EC_MAX_K + SL_EC_MAX_M];
    for (int i = 0; i < k + m; i++) ptr[i] = blk + bs * (size_t)i;
    memset(blk + n, 0, bs * (size_t)k - n);
    memcpy(blk, hdr, hlen);
    memcpy(blk + hlen, data, dlen);
    sl_status st = sl_ckpt_ec_encode(k, m, bs, ptr, ptr + k);
    cJSON_AddNumberToObject(o, "ec_k", k);
    cJSON_AddNumberToObject(o, "ec_m", m);
    cJSON_AddNumberToObject(o, "block_size", (double)bs);
    cJSON_AddNumberToObject(o, "block_header", EC_ALIGN);
    cJSON *arr = cJSON_AddArrayToObject(o, "blocks");
    char stepname[32];
    snprintf(stepname, sizeof stepname, "step-%07lld", (long long)step);
    sl_ckpt_file_job own = {0}; /* block 0, on this host: written beside the exchange */
    char bnames[SL_EC_MAX_K + SL_EC_MAX_M][96], own_path[4500];
    sl_ckpt_pool_stream out[SL_CKPT_POOL_MAX_STREAMS];
    int nout = 0, world = p->comm ? sl_comm_size(p->comm) : 0, me = p->comm ? sl_comm_rank(p->comm) : 0;
    for (int j = 0; j < k + m; j++) {
        int h = (p->host + j) % p->hosts;
        char dir[4300], path[4500], sum[32];
        ec_header *hd = (ec_header *)(heads + (size_t)j * EC_ALIGN);
        *hd = (ec_header){.magic = "SLECBLK1",
                          .k = (uint32_t)k,
                          .m = (uint32_t)m,
                          .index = (uint32_t)j,
                          .step = (uint64_t)step,
                          .file_size = n,
                          .block_size = bs};
        snprintf(hd->stripe, sizeof hd->stripe, "%s/%s", stepname, file);
        snprintf(bnames[j], sizeof bnames[j], "%s.ec%d", file, j);
        if (p->comm && j > 0) { /* Note [Pool transfers over comm] */
            out[nout++] = (sl_ckpt_pool_stream){.dst = sl_ckpt_pool_receiver(me, h, world, p->hosts),
                                                .name = bnames[j],
                                                .head = hd,
                                                .hlen = EC_ALIGN,
                                                .body = ptr[j],
                                                .blen = bs};
        } else if (st == SL_OK) {
            peer_dir(dir, sizeof dir, p, h, stepbase);
            snprintf(path, sizeof path, "%s/%s", dir, bnames[j]);
            st = sl_mkdirs(dir);
            snprintf(own_path, sizeof own_path, "%s", path);
            own = (sl_ckpt_file_job){.path = own_path,
                                     .hdr = hd,
                                     .hlen = EC_ALIGN,
                                     .data = ptr[j],
                                     .dlen = bs,
                                     .flags = SL_CKPT_IO_DIRECT | SL_CKPT_IO_SYNC};
            if (st == SL_OK && p->comm)
                sl_ckpt_file_job_start(&own);
            else if (st == SL_OK)
                st = sl_ckpt_write_file(path, hd, EC_ALIGN, ptr[j], bs, own.flags, NULL);
        }
        sl_pool_sum_str(sum, sizeof sum, ptr[j], bs);
        cJSON *b = cJSON_CreateObject();
        cJSON_AddNumberToObject(b, "index", j);
        cJSON_AddNumberToObject(b, "host", h);
        cJSON_AddStringToObject(b, "file", bnames[j]);
        cJSON_AddStringToObject(b, "checksum", sum);
        cJSON_AddItemToArray(arr, b);
    }
    if (p->comm) { /* collective: taken part in even after a local failure */
        sl_status xs = sl_ckpt_pool_exchange(p, stepbase, out, nout);
        sl_status os = sl_ckpt_file_job_join(&own);
        if (st == SL_OK) st = os != SL_OK ? os : xs;
    }
    sl_free_aligned(blk);
    sl_free_aligned(heads);
    return st;
}

sl_status sl_ckpt_pool_spread(const sl_ckpt_pool *p, const char *stepbase, int64_t step, const char *file,
                              const void *hdr, size_t hlen, const void *data, size_t dlen,
                              cJSON **placement) {
    char dir[4300], path[4500], sum[32];
    *placement = NULL;
    size_t n = hlen + dlen;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "size", (double)n);
    XXH3_state_t hs; /* the whole file's checksum, over its two parts */
    XXH3_64bits_reset(&hs);
    XXH3_64bits_update(&hs, hdr, hlen);
    XXH3_64bits_update(&hs, data, dlen);
    snprintf(sum, sizeof sum, "xxh3:%016llx", (unsigned long long)XXH3_64bits_digest(&hs));
    cJSON_AddStringToObject(o, "checksum", sum);
    sl_status st = SL_OK;
    if (p->ec_k > 0) {
        st = spread_ec(p, stepbase, step, file, hdr, hlen, data, dlen, o);
    } else {
        cJSON *copies = cJSON_AddArrayToObject(o, "copies");
        sl_ckpt_pool_stream out[SL_CKPT_POOL_MAX_STREAMS];
        int nout = 0, world = p->comm ? sl_comm_size(p->comm) : 0, me = p->comm ? sl_comm_rank(p->comm) : 0;
        for (int i = 0; i < p->replicas && st == SL_OK; i++) {
            int h = (p->host + i) % p->hosts;
            cJSON_AddItemToArray(copies, cJSON_CreateNumber(h));
            if (i == 0) continue; /* the writer's own file */
            if (p->comm) {        /* Note [Pool transfers over comm] */
                out[nout++] = (sl_ckpt_pool_stream){.dst = sl_ckpt_pool_receiver(me, h, world, p->hosts),
                                                    .name = file,
                                                    .head = hdr,
                                                    .hlen = hlen,
                                                    .body = data,
                                                    .blen = dlen};
                continue;
            }
            peer_dir(dir, sizeof dir, p, h, stepbase);
            snprintf(path, sizeof path, "%s/%s", dir, file);
            st = sl_mkdirs(dir);
            if (st == SL_OK)
                st = sl_ckpt_write_file(path, hdr, hlen, data, dlen, SL_CKPT_IO_DIRECT | SL_CKPT_IO_SYNC,
                                        NULL);
        }
        if (p->comm) st = sl_ckpt_pool_exchange(p, stepbase, out, nout);
    }
    if (st != SL_OK) {
        cJSON_Delete(o);
        return st;
    }
    *placement = o;
    return SL_OK;
}

/* ---------------- commit ---------------- */

/* step-N.tmpX dirs of earlier attempts (X != this attempt's suffix): writes a killed attempt left */
static void remove_stale_tmp(const char *hroot, const char *suffix) {
    DIR *d = opendir(hroot);
    if (!d) return;
    struct dirent *de;
    char path[4600];
    while ((de = readdir(d))) {
        long long st;
        int used = 0;
        if (sscanf(de->d_name, "step-%lld%n", &st, &used) != 1 ||
            strncmp(de->d_name + used, ".tmp", 4) != 0 || !strcmp(de->d_name + used, suffix))
            continue;
        snprintf(path, sizeof path, "%s/%s", hroot, de->d_name);
        sl_ckpt_rm_rf(path);
    }
    closedir(d);
}

/* the pool's fields of a step's manifest: hosts, rank -> host, redundancy */
static void pool_fields(const sl_ckpt_pool *p, int world, cJSON *man) {
    cJSON *pool = cJSON_GetObjectItem(man, "pool");
    if (!pool) {
        pool = cJSON_CreateObject();
        cJSON_AddItemToObject(pool, "files", cJSON_CreateObject());
        cJSON_AddItemToObject(man, "pool", pool);
    }
    cJSON_AddNumberToObject(pool, "hosts", p->hosts);
    cJSON *rh = cJSON_AddArrayToObject(pool, "rank_host");
    for (int r = 0; r < world; r++)
        cJSON_AddItemToArray(rh, cJSON_CreateNumber(sl_ckpt_pool_host_of(r, world, p->hosts)));
    char red[32];
    if (p->ec_k > 0)
        snprintf(red, sizeof red, "ec %d+%d", p->ec_k, p->ec_m);
    else
        snprintf(red, sizeof red, "replicas %d", p->replicas);
    cJSON_AddStringToObject(pool, "redundancy", red);
}

/* commit one host's step dir: manifest and config into step-N.tmpX, fsync, rename, latest, prune */
static sl_status commit_host(const sl_ckpt_pool *p, int h, const char *stepbase, const char *fin_base,
                             const char *text, const char *model_json, int keep) {
    char hroot[4300], tmp[4400], fin[4400], path[4600];
    snprintf(hroot, sizeof hroot, "%s/host-%d", p->local_root, h);
    snprintf(tmp, sizeof tmp, "%s/%s", hroot, stepbase);
    snprintf(fin, sizeof fin, "%s/%s", hroot, fin_base);
    SL_TRY(sl_mkdirs(tmp));
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    SL_TRY(sl_file_write_atomic(path, text, strlen(text)));
    if (model_json) {
        snprintf(path, sizeof path, "%s/config.json", tmp);
        SL_TRY(sl_file_write_atomic(path, model_json, strlen(model_json)));
    }
    sl_fsync_dir(tmp);
    if (access(fin, F_OK) == 0) SL_TRY(sl_ckpt_rm_rf(fin));
    if (rename(tmp, fin) != 0)
        return sl_fail(SL_ERR_IO, "%s: cannot rename to %s: %s", tmp, fin, strerror(errno));
    sl_fsync_dir(hroot);
    char name[64];
    snprintf(path, sizeof path, "%s/latest", hroot);
    snprintf(name, sizeof name, "%s\n", fin_base);
    SL_TRY(sl_file_write_atomic(path, name, strlen(name)));
    sl_fsync_dir(hroot);
    sl_ckpt_prune(hroot, strtoll(fin_base + 5, NULL, 10), keep);
    remove_stale_tmp(hroot, stepbase + strlen(fin_base));
    return SL_OK;
}

static void commit_names(int64_t step, char *stepbase, size_t scap, char *fin_base, size_t fcap) {
    const char *rc = getenv("SUANLI_RESTART_COUNT");
    snprintf(stepbase, scap, "step-%07lld.tmp%s", (long long)step, rc ? rc : "");
    snprintf(fin_base, fcap, "step-%07lld", (long long)step);
}

sl_status sl_ckpt_pool_commit(const sl_ckpt_pool *p, int64_t step, int world, int keep,
                              const char *model_json, const char *layout_json) {
    char stepbase[64], fin_base[32], path[4600];
    commit_names(step, stepbase, sizeof stepbase, fin_base, sizeof fin_base);
    sl_status st = SL_OK;
    cJSON *man = NULL;
    char *text = NULL, **side = calloc((size_t)world, sizeof(char *));
    if (!side) return sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
    for (int r = 0; r < world; r++) {
        snprintf(path, sizeof path, "%s/host-%d/%s/shard-r%05d.json", p->local_root,
                 sl_ckpt_pool_host_of(r, world, p->hosts), stepbase, r);
        side[r] = strdup(path);
    }
    SL_CHECK(sl_ckpt_manifest_build(step, world, model_json, layout_json, side, 1, &man));
    pool_fields(p, world, man);
    text = cJSON_Print(man);
    if (!text) {
        st = sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
        goto done;
    }
    for (int h = 0; h < p->hosts; h++)
        SL_CHECK(commit_host(p, h, stepbase, fin_base, text, model_json, keep));
done:
    for (int r = 0; r < world; r++) free(side[r]);
    free(side);
    cJSON_Delete(man);
    free(text);
    return st;
}

sl_status sl_ckpt_pool_commit_comm(const sl_ckpt_pool *p, int64_t step, int keep, const char *model_json,
                                   const char *layout_json, const char *side) {
    sl_comm *c = p->comm;
    int world = sl_comm_size(c), me = sl_comm_rank(c);
    char stepbase[64], fin_base[32];
    commit_names(step, stepbase, sizeof stepbase, fin_base, sizeof fin_base);
    int64_t len = (int64_t)strlen(side), *lens = calloc((size_t)world, sizeof *lens);
    size_t *counts = calloc((size_t)world, sizeof *counts), *displs = calloc((size_t)world, sizeof *displs);
    char *all = NULL, **texts = calloc((size_t)world, sizeof *texts), *text = NULL;
    cJSON *man = NULL;
    sl_status st =
        lens && counts && displs && texts ? SL_OK : sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
    /* past the allocations, every rank takes part in every collective below whatever happened locally (an
     * allocation failure leaves the exchange: the job fails, and the peers see this rank go) */
    if (st != SL_OK) goto out;
    if (sl_comm_all_gather(c, &len, lens, 1, SL_COMM_I64) != SL_OK) {
        st = sl_fail(SL_ERR_PEER, "checkpoint commit: exchanging sidecars: %s", sl_errmsg());
        goto out;
    }
    size_t total = 0;
    for (int r = 0; r < world; r++) {
        counts[r] = (size_t)lens[r];
        displs[r] = total;
        total += counts[r];
    }
    all = malloc(total + 1);
    if (!all) {
        st = sl_fail(SL_ERR_NOMEM, "checkpoint commit: out of memory");
        goto out;
    }
    if (sl_comm_all_gatherv(c, side, all, counts, displs, SL_COMM_U8) != SL_OK) {
        st = sl_fail(SL_ERR_PEER, "checkpoint commit: exchanging sidecars: %s", sl_errmsg());
        goto out;
    }
    for (int r = 0; r < world; r++) texts[r] = all + displs[r];
    if (st == SL_OK)
        st = sl_ckpt_manifest_build_texts(step, world, model_json, layout_json, texts, counts, &man);
    if (st == SL_OK) {
        pool_fields(p, world, man);
        text = cJSON_Print(man);
        if (!text) st = sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
    }
    int leader = me == sl_ckpt_pool_first_rank(p->host, world, p->hosts);
    if (st == SL_OK && leader) st = commit_host(p, p->host, stepbase, fin_base, text, model_json, keep);
    int32_t bad = st != SL_OK, any = 0;
    if (sl_comm_all_reduce(c, &bad, &any, 1, SL_COMM_I32, SL_COMM_MAX) != SL_OK) {
        if (st == SL_OK) st = sl_fail(SL_ERR_PEER, "checkpoint commit: %s", sl_errmsg());
    } else if (any && st == SL_OK) {
        st = sl_fail(SL_ERR_IO, "checkpoint commit of step %lld failed on another host", (long long)step);
    }
out:
    free(lens);
    free(counts);
    free(displs);
    free(all);
    free(texts);
    free(text);
    cJSON_Delete(man);
    return st;
}
