/* The dataset: memory-mapped shards of one split and the deterministic batch sampler.
 *
 * Note [Deterministic batches]
 *   Training draws by global sample (sl_dataset_samples): sample g of optimizer step `step` starts at
 *       u = sl_rng_u64(seed, stream, g),  stream = split<<62 | 1<<61 | step
 *       start = floor(u * (N - T) / 2^64)                  (uniform in [0, N-T-1], no modulo bias)
 *   so the G samples of a step are a pure function of (seed, split, step, g in [0, G)), whatever the
 *   micro-batch size, accumulation and DP split that consume them (the trainer hands micro-batch m of DP
 *   rank r with B rows samples g = (r*accum + m)*B + b, as Megatron does), any batch can be re-drawn after
 *   a restart from (seed, step) alone, and no loader state is saved.
 *   The older per-micro-batch sampler (sl_dataset_batch) draws window b of micro-batch `micro` on rank
 *   `rank` from stream = split<<62 | rank<<31 | micro, counter = step*B + b, so its samples depend on B;
 *   bit 61 keeps the two families of streams apart. Windows may straddle shard boundaries: shards are
 *   consecutive pieces of one token stream.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_internal.h"

typedef struct sl_shard_map {
    const uint8_t *map; /* whole file */
    size_t size;
    const uint8_t *payload;
    int64_t ntok;
    int64_t first; /* global index of the first token */
} sl_shard_map;

struct sl_dataset {
    sl_shard_map *shards;
    int nshards;
    int vocab;
    uint32_t width;
    int64_t ntok;
    int split_id; /* 0 train, 1 val */
};

static sl_status map_file(const char *path, const uint8_t **map, size_t *size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return sl_fail(SL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return sl_fail(SL_ERR_IO, "%s: not a regular file", path);
    }
    *size = (size_t)sb.st_size;
    if (*size == 0) {
        close(fd);
        *map = NULL;
        return SL_OK;
    }
    void *m = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return sl_fail(SL_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    *map = m;
    return SL_OK;
}

void sl_dataset_close(sl_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->nshards; i++)
        if (ds->shards[i].map) munmap((void *)ds->shards[i].map, ds->shards[i].size);
    free(ds->shards);
    free(ds);
}

sl_status sl_dataset_open(const char *dir, const char *split, sl_dataset **out) {
    *out = NULL;
    if (!dir || !split) return sl_fail(SL_ERR_INVALID, "dataset: dir and split are required");
    int split_id;
    if (!strcmp(split, "train"))
        split_id = 0;
    else if (!strcmp(split, "val"))
        split_id = 1;
    else
        return sl_fail(SL_ERR_INVALID, "dataset: unknown split '%s' (expected train or val)", split);
    sl_status st = SL_OK;
    sl_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return sl_fail(SL_ERR_NOMEM, "dataset: out of memory");
    ds->split_id = split_id;
    char path[4096];
    int cap = 0;
    for (int i = 0;; i++) {
        snprintf(path, sizeof path, "%s/%s_%03d.bin", dir, split, i);
        if (access(path, F_OK) != 0) break;
        if (ds->nshards == cap) {
            cap = cap ? 2 * cap : 8;
            sl_shard_map *ns = realloc(ds->shards, (size_t)cap * sizeof *ns);
            if (!ns) {
                st = sl_fail(SL_ERR_NOMEM, "dataset: out of memory");
                goto done;
            }
            ds->shards = ns;
        }
        sl_shard_map *s = &ds->shards[ds->nshards];
        memset(s, 0, sizeof *s);
        SL_CHECK(map_file(path, &s->map, &s->size));
        ds->nshards++;
        sl_shard_header h;
        SL_CHECK(sl__shard_validate(path, s->map, s->size, &h));
        if (i == 0) {
            ds->vocab = (int)h.vocab_size;
            ds->width = h.token_bytes;
        } else if ((int)h.vocab_size != ds->vocab) {
            st = sl_fail(SL_ERR_FORMAT, "%s: vocab_size %u differs from %s_000.bin's %d", path, h.vocab_size,
                         split, ds->vocab);
            goto done;
        }
        s->payload = s->map + SL_SHARD_HEADER_BYTES;
        s->ntok = (int64_t)h.num_tokens;
        s->first = ds->ntok;
        ds->ntok += s->ntok;
    }
    if (ds->nshards == 0) {
        st = sl_fail(SL_ERR_IO, "%s/%s_000.bin: no shards for split '%s' (run 'suanli data prepare')", dir,
                     split, split);
        goto done;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, F_OK) != 0) snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    if (access(path, F_OK) == 0) {
        sl_tokenizer *tok;
        SL_CHECK(sl_tokenizer_load(path, &tok));
        int tv = sl_tokenizer_vocab_size(tok);
        sl_tokenizer_free(tok);
        if (tv != ds->vocab) {
            st = sl_fail(SL_ERR_FORMAT, "%s: vocab_size %d does not match the %s shards' vocab_size %d", path,
                         tv, split, ds->vocab);
            goto done;
        }
    }
    *out = ds;
    ds = NULL;
done:
    sl_dataset_close(ds);
    return st;
}

int sl_dataset_vocab_size(const sl_dataset *ds) { return ds->vocab; }
int64_t sl_dataset_num_tokens(const sl_dataset *ds) { return ds->ntok; }
int sl_dataset_num_shards(const sl_dataset *ds) { return ds->nshards; }

/* Index of the shard holding global token g (0 <= g < ntok). */
static int find_shard(const sl_dataset *ds, int64_t g) {
    int lo = 0, hi = ds->nshards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ds->shards[mid].first <= g)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void copy_tokens(const sl_dataset *ds, int64_t start, int64_t n, int32_t *out) {
    int s = find_shard(ds, start);
    int64_t g = start;
    while (n > 0) {
        const sl_shard_map *sh = &ds->shards[s];
        int64_t local = g - sh->first;
        int64_t take = sh->ntok - local;
        if (take > n) take = n;
        for (int64_t i = 0; i < take; i++) *out++ = sl__shard_token(sh->payload, ds->width, local + i);
        n -= take;
        g += take;
        s++;
    }
}

sl_status sl_dataset_read(const sl_dataset *ds, int64_t start, int64_t n, int32_t *out) {
    if (start < 0 || n < 0 || start > ds->ntok || n > ds->ntok - start)
        return sl_fail(SL_ERR_INVALID, "dataset: read [%lld, %lld) outside [0, %lld)", (long long)start,
                       (long long)(start + n), (long long)ds->ntok);
    if (n > 0) copy_tokens(ds, start, n, out);
    return SL_OK;
}

sl_status sl_dataset_batch(const sl_dataset *ds, int B, int T, uint64_t seed, uint64_t step, int rank,
                           int micro, int32_t *inputs, int32_t *targets) {
    if (B <= 0 || T <= 0)
        return sl_fail(SL_ERR_INVALID, "dataset: batch shape B=%d T=%d must be positive", B, T);
    if (rank < 0 || micro < 0)
        return sl_fail(SL_ERR_INVALID, "dataset: rank %d and micro %d must be >= 0", rank, micro);
    if (ds->ntok < (int64_t)T + 1)
        return sl_fail(SL_ERR_INVALID, "dataset: split has %lld tokens, fewer than T+1 = %d for one window",
                       (long long)ds->ntok, T + 1);
    uint64_t stream =
        ((uint64_t)ds->split_id << 62) | ((uint64_t)(uint32_t)rank << 31) | (uint64_t)(uint32_t)micro;
    uint64_t range = (uint64_t)(ds->ntok - T); /* number of valid starts */
    for (int b = 0; b < B; b++) {
        uint64_t u = sl_rng_u64(seed, stream, step * (uint64_t)B + (uint64_t)b);
        int64_t start = (int64_t)(((unsigned __int128)u * range) >> 64);
        copy_tokens(ds, start, T, inputs + (size_t)b * T); /* no allocation in the step loop */
        copy_tokens(ds, start + 1, T, targets + (size_t)b * T);
    }
    return SL_OK;
}

sl_status sl_dataset_samples(const sl_dataset *ds, int T, uint64_t seed, uint64_t step, int64_t first, int n,
                             int32_t *inputs, int32_t *targets) {
    if (n <= 0 || T <= 0)
        return sl_fail(SL_ERR_INVALID, "dataset: batch shape n=%d T=%d must be positive", n, T);
    if (first < 0)
        return sl_fail(SL_ERR_INVALID, "dataset: first sample %lld must be >= 0", (long long)first);
    if (step >= (1ull << 61))
        return sl_fail(SL_ERR_INVALID, "dataset: step %llu exceeds 2^61", (unsigned long long)step);
    if (ds->ntok < (int64_t)T + 1)
        return sl_fail(SL_ERR_INVALID, "dataset: split has %lld tokens, fewer than T+1 = %d for one window",
                       (long long)ds->ntok, T + 1);
    uint64_t stream = ((uint64_t)ds->split_id << 62) | (1ull << 61) | step;
    uint64_t range = (uint64_t)(ds->ntok - T); /* number of valid starts */
    for (int b = 0; b < n; b++) {
        uint64_t u = sl_rng_u64(seed, stream, (uint64_t)first + (uint64_t)b);
        int64_t start = (int64_t)(((unsigned __int128)u * range) >> 64);
        copy_tokens(ds, start, T, inputs + (size_t)b * T); /* no allocation in the step loop */
        copy_tokens(ds, start + 1, T, targets + (size_t)b * T);
    }
    return SL_OK;
}
