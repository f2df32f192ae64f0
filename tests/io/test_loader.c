/* Dataset loader: multi-shard mmap, determinism in (seed, step, rank, micro), targets = inputs shifted,
 * windows are consecutive tokens of the stream (across shard boundaries), and the error paths. */
#include <string.h>

#include "io_testutil.h"
#include "suanli/data.h"
#include "testutil.h"

#define V 10007
/* Token at global position p of the synthetic stream (N < V, so a window's first token is its start). */
static int32_t tok_at(int64_t p) { return (int32_t)(p % V); }

static void write_split(const char *dir, const char *split, const int64_t *sizes, int nshards, int vocab) {
    int64_t pos = 0;
    for (int s = 0; s < nshards; s++) {
        int32_t *t = malloc((size_t)(sizes[s] ? sizes[s] : 1) * sizeof *t);
        for (int64_t i = 0; i < sizes[s]; i++) t[i] = tok_at(pos + i) % vocab;
        char path[700];
        snprintf(path, sizeof path, "%s/%s_%03d.bin", dir, split, s);
        TU_CHECK(sl_shard_write(path, t, sizes[s], vocab) == SL_OK, "%s", sl_errmsg());
        pos += sizes[s];
        free(t);
    }
}

enum { B = 8, T = 64 };

/* reads across shard boundaries, the batch sampler's windows, determinism and coverage */
static void test_reads(sl_dataset *ds, const char *dir) {
    /* sequential read across boundaries */
    int32_t seq[100];
    TU_CHECK(sl_dataset_read(ds, 2980, 100, seq) == SL_OK, "%s", sl_errmsg());
    int ok = 1;
    for (int i = 0; i < 100; i++) ok &= seq[i] == tok_at(2980 + i);
    TU_CHECK(ok, "sequential read across shards wrong");
    TU_CHECK(sl_dataset_read(ds, 8000, 18, seq) == SL_ERR_INVALID, "read past the end accepted");
    TU_CHECK(sl_dataset_read(ds, -1, 2, seq) == SL_ERR_INVALID, "negative start accepted");

    int32_t x[B * T], y[B * T], x2[B * T], y2[B * T];
    TU_CHECK(sl_dataset_batch(ds, B, T, 1234, 7, 0, 0, x, y) == SL_OK, "%s", sl_errmsg());
    /* every row is T+1 consecutive tokens: inputs consecutive, targets = inputs shifted by one */
    int consecutive = 1, shifted = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int32_t in = x[b * T + t], tg = y[b * T + t];
            if (t + 1 < T) shifted &= tg == x[b * T + t + 1];
            consecutive &= tg == (in + 1) % V;
        }
    TU_CHECK(consecutive, "windows are not consecutive stream tokens");
    TU_CHECK(shifted, "targets are not inputs shifted by one");

    /* determinism: same arguments, same batch (also from a second open of the same data) */
    sl_dataset *ds2 = NULL;
    TU_CHECK(sl_dataset_open(dir, "train", &ds2) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(sl_dataset_batch(ds2, B, T, 1234, 7, 0, 0, x2, y2) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(!memcmp(x, x2, sizeof x) && !memcmp(y, y2, sizeof y),
             "same (seed,step,rank,micro) gave different batches");
    sl_dataset_close(ds2);

    /* different step / rank / micro / seed give different batches */
    struct {
        uint64_t seed, step;
        int rank, micro;
        const char *what;
    } v[] = {
        {1234, 8, 0, 0, "step"}, {1234, 7, 1, 0, "rank"}, {1234, 7, 0, 1, "micro"}, {99, 7, 0, 0, "seed"}};
    for (int k = 0; k < 4; k++) {
        TU_CHECK(sl_dataset_batch(ds, B, T, v[k].seed, v[k].step, v[k].rank, v[k].micro, x2, y2) == SL_OK,
                 "%s", sl_errmsg());
        TU_CHECK(memcmp(x, x2, sizeof x) != 0, "changing %s did not change the batch", v[k].what);
    }
    /* rows within a batch differ (positions independent) */
    int rows_differ = 0;
    for (int b = 1; b < B; b++) rows_differ += memcmp(x, x + b * T, T * sizeof *x) != 0;
    TU_CHECK(rows_differ == B - 1, "rows of one batch repeat");
    /* window b of step s is counter s*B + b of its stream (Note [Deterministic batches]): consecutive steps
     * take fresh counters, so step 1 at B/2 rows is the second half of step 0 at B rows */
    TU_CHECK(sl_dataset_batch(ds, B, T, 1234, 0, 0, 0, x, y) == SL_OK &&
                 sl_dataset_batch(ds, B / 2, T, 1234, 1, 0, 0, x2, y2) == SL_OK &&
                 !memcmp(x2, x + (B / 2) * T, (B / 2) * T * sizeof *x),
             "step 1 of B/2 rows is not counters B/2..B-1 of the stream");

    /* coverage: over many draws, starts land in every shard and near both ends (uniform in [0, N-T-1]) */
    int64_t N = sl_dataset_num_tokens(ds), lo = N, hi = 0, hits_mid = 0;
    for (uint64_t s = 0; s < 4000; s++) {
        int32_t a[1 * 16], c[1 * 16];
        sl_dataset_batch(ds, 1, 16, 5, s, 3, 2, a, c);
        int64_t st = a[0]; /* tokens are their own positions */
        if (st < lo) lo = st;
        if (st > hi) hi = st;
        if (st + 16 > 3000 && st < 3017) hits_mid++; /* window touches the 17-token middle shard */
    }
    TU_CHECK(lo < 200 && hi > N - 17 - 200, "starts not spread over [0, N-T-1]: lo %lld hi %lld",
             (long long)lo, (long long)hi);
    TU_CHECK(hits_mid > 0, "no window touched the middle shard in 4000 draws");

    TU_CHECK(sl_dataset_batch(ds, 0, 4, 1, 0, 0, 0, x, y) == SL_ERR_INVALID, "B=0 accepted");
    TU_CHECK(sl_dataset_batch(ds, 1, 4, 1, 0, -1, 0, x, y) == SL_ERR_INVALID, "rank -1 accepted");
}

/* a split only just long enough: T+1 == N works, T+1 > N is refused; two valid starts are both drawn */
static void test_short_split(const char *dir) {
    /* too short: T+1 > tokens */
    sl_dataset *dv = NULL;
    TU_CHECK(sl_dataset_open(dir, "val", &dv) == SL_OK, "%s", sl_errmsg());
    if (dv) {
        int32_t a[64], c[64];
        TU_CHECK(sl_dataset_batch(dv, 1, 39, 1, 0, 0, 0, a, c) == SL_OK, "T+1 == N must work: %s",
                 sl_errmsg());
        TU_CHECK(sl_dataset_batch(dv, 1, 40, 1, 0, 0, 0, a, c) == SL_ERR_INVALID, "T+1 > N accepted");
        TU_CHECK(iot_contains(sl_errmsg(), "fewer than"), "message: %s", sl_errmsg());
        /* T = N - 2: exactly two valid starts, 0 and 1 (a window's first token is its start); 64 draws of
         * each sampler must use both, and never a third */
        enum { R = 64, T2 = 38 };
        int32_t *bx = malloc(sizeof(int32_t) * R * T2), *by = malloc(sizeof(int32_t) * R * T2);
        for (int fn = 0; fn < 2; fn++) {
            sl_status st = fn ? sl_dataset_samples(dv, T2, 5, 3, 0, R, bx, by)
                              : sl_dataset_batch(dv, R, T2, 5, 3, 0, 0, bx, by);
            int seen[3] = {0, 0, 0};
            for (int r = 0; r < R; r++) seen[bx[(size_t)r * T2] <= 1 ? bx[(size_t)r * T2] : 2]++;
            TU_CHECK(st == SL_OK && seen[0] > 0 && seen[1] > 0 && seen[2] == 0,
                     "%s with two valid starts: start 0 %d times, start 1 %d, others %d",
                     fn ? "sl_dataset_samples" : "sl_dataset_batch", seen[0], seen[1], seen[2]);
        }
        free(bx);
        free(by);
        sl_dataset_close(dv);
    }
}

static void test_twin_splits(void) {
    /* the split is part of the stream: train and val holding the same tokens draw different windows for the
     * same (seed, step, sample) (Note [Deterministic batches]) */
    char twin[600];
    snprintf(twin, sizeof twin, "%s", tu_tmpdir("loader-twin"));
    int64_t ts[1] = {400};
    write_split(twin, "train", ts, 1, V);
    write_split(twin, "val", ts, 1, V);
    sl_dataset *tt = NULL, *tw = NULL;
    TU_CHECK(sl_dataset_open(twin, "train", &tt) == SL_OK && sl_dataset_open(twin, "val", &tw) == SL_OK,
             "twin splits: %s", sl_errmsg());
    if (tt && tw) {
        int32_t ax[16 * 8], ay[16 * 8], vx[16 * 8], vy[16 * 8];
        TU_CHECK(sl_dataset_samples(tt, 8, 11, 2, 0, 16, ax, ay) == SL_OK &&
                     sl_dataset_samples(tw, 8, 11, 2, 0, 16, vx, vy) == SL_OK && memcmp(ax, vx, sizeof ax),
                 "sl_dataset_samples: train and val draw the same windows");
        TU_CHECK(sl_dataset_batch(tt, 16, 8, 11, 2, 0, 0, ax, ay) == SL_OK &&
                     sl_dataset_batch(tw, 16, 8, 11, 2, 0, 0, vx, vy) == SL_OK && memcmp(ax, vx, sizeof ax),
                 "sl_dataset_batch: train and val draw the same windows");
    }
    sl_dataset_close(tt);
    sl_dataset_close(tw);
    iot_cleanup(twin);
}

static void test_samples(sl_dataset *ds, const char *dir) {
    /* sl_dataset_samples: sample g of a step is a pure function of (seed, split, step, g), so any split of
     * a global batch into micro-batches draws the same windows (Note [Deterministic batches]) */
    int32_t gx[B * T], gy[B * T], px[B * T], py[B * T];
    TU_CHECK(sl_dataset_samples(ds, T, 1234, 7, 0, B, gx, gy) == SL_OK, "%s", sl_errmsg());
    int same = 1, cons = 1;
    for (int parts = 2; parts <= B; parts *= 2) { /* micro-batches of B/parts rows */
        int mb = B / parts;
        for (int m = 0; m < parts; m++)
            TU_CHECK(sl_dataset_samples(ds, T, 1234, 7, (int64_t)m * mb, mb, px + m * mb * T,
                                        py + m * mb * T) == SL_OK,
                     "%s", sl_errmsg());
        same &= !memcmp(gx, px, sizeof gx) && !memcmp(gy, py, sizeof gy);
    }
    TU_CHECK(same, "splitting a global batch into micro-batches changed its samples");
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) cons &= gy[b * T + t] == (gx[b * T + t] + 1) % V;
    TU_CHECK(cons, "sl_dataset_samples windows are not consecutive stream tokens");
    sl_dataset *ds3 = NULL;
    TU_CHECK(sl_dataset_open(dir, "train", &ds3) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(ds3 && sl_dataset_samples(ds3, T, 1234, 7, 0, B, px, py) == SL_OK && !memcmp(gx, px, sizeof gx),
             "same (seed, step, samples) from a second open gave other windows");
    sl_dataset_close(ds3);
    TU_CHECK(sl_dataset_samples(ds, T, 1234, 8, 0, B, px, py) == SL_OK && memcmp(gx, px, sizeof gx),
             "changing the step did not change the samples");
    TU_CHECK(sl_dataset_samples(ds, T, 99, 7, 0, B, px, py) == SL_OK && memcmp(gx, px, sizeof gx),
             "changing the seed did not change the samples");
    TU_CHECK(sl_dataset_samples(ds, T, 1234, 7, B, B, px, py) == SL_OK && memcmp(gx, px, sizeof gx),
             "samples B..2B-1 repeat samples 0..B-1");
    TU_CHECK(sl_dataset_samples(ds, T, 1234, 7, -1, 1, px, py) == SL_ERR_INVALID, "first -1 accepted");
    TU_CHECK(sl_dataset_samples(ds, T, 1234, 7, 0, 0, px, py) == SL_ERR_INVALID, "n=0 accepted");
    TU_CHECK(sl_dataset_samples(ds, T, 1234, 1ull << 61, 0, 1, px, py) == SL_ERR_INVALID,
             "step 2^61 accepted");
}

/* errors at open: an unknown split, a missing shard, vocab mismatches, a corrupted shard */
static void test_open_errors(const char *dir) {
    sl_dataset *bad = NULL;
    TU_CHECK(sl_dataset_open(dir, "test", &bad) == SL_ERR_INVALID && !bad, "unknown split accepted");
    char empty[512];
    snprintf(empty, sizeof empty, "%s", tu_tmpdir("loader-empty"));
    TU_CHECK(sl_dataset_open(empty, "train", &bad) != SL_OK && !bad, "empty dir accepted");
    TU_CHECK(iot_contains(sl_errmsg(), "train_000.bin"), "message should name the missing shard: %s",
             sl_errmsg());

    /* shards disagreeing on vocab */
    char mix[512];
    snprintf(mix, sizeof mix, "%s", tu_tmpdir("loader-mix"));
    int64_t one[1] = {100};
    write_split(mix, "train", one, 1, V);
    {
        int32_t t[10] = {0};
        char p[700];
        snprintf(p, sizeof p, "%s/train_001.bin", mix);
        sl_shard_write(p, t, 10, 512);
    }
    TU_CHECK(sl_dataset_open(mix, "train", &bad) == SL_ERR_FORMAT && !bad,
             "vocab mismatch between shards accepted");
    TU_CHECK(iot_contains(sl_errmsg(), "train_001.bin") && iot_contains(sl_errmsg(), "vocab_size"),
             "message: %s", sl_errmsg());

    /* tokenizer.json whose vocab disagrees with the shards */
    char tv[512];
    snprintf(tv, sizeof tv, "%s", tu_tmpdir("loader-tok"));
    write_split(tv, "train", one, 1, V);
    sl_tokenizer *bt;
    sl_tokenizer_new_byte(&bt);
    char tp[700];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", tv);
    sl_tokenizer_save(bt, tp);
    sl_tokenizer_free(bt);
    TU_CHECK(sl_dataset_open(tv, "train", &bad) == SL_ERR_FORMAT && !bad,
             "tokenizer/shard vocab mismatch accepted");
    TU_CHECK(iot_contains(sl_errmsg(), "tokenizer.json"), "message: %s", sl_errmsg());

    /* a corrupted shard in the middle fails the open with the file named */
    char cp[700];
    snprintf(cp, sizeof cp, "%s/train_001.bin", dir);
    size_t l;
    char *raw = iot_read(cp, &l);
    raw[0] = 'Z';
    iot_write(cp, raw, l);
    free(raw);
    TU_CHECK(sl_dataset_open(dir, "train", &bad) == SL_ERR_FORMAT && !bad, "corrupt shard accepted");
    TU_CHECK(iot_contains(sl_errmsg(), "train_001.bin") && iot_contains(sl_errmsg(), "magic"), "message: %s",
             sl_errmsg());
    iot_cleanup(empty), iot_cleanup(mix), iot_cleanup(tv);
}

int main(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("loader"));
    int64_t sizes[3] = {3000, 17, 5000}; /* a tiny middle shard: windows must straddle it */
    write_split(dir, "train", sizes, 3, V);
    int64_t vs[1] = {40};
    write_split(dir, "val", vs, 1, V);

    sl_dataset *ds = NULL;
    TU_CHECK(sl_dataset_open(dir, "train", &ds) == SL_OK, "%s", sl_errmsg());
    if (!ds) return tu_finish("test_io_loader");
    TU_CHECK(sl_dataset_vocab_size(ds) == V, "vocab %d", sl_dataset_vocab_size(ds));
    TU_CHECK(sl_dataset_num_tokens(ds) == 8017, "num tokens %lld", (long long)sl_dataset_num_tokens(ds));
    TU_CHECK(sl_dataset_num_shards(ds) == 3, "shards %d", sl_dataset_num_shards(ds));

    test_reads(ds, dir);
    test_short_split(dir);
    test_twin_splits();
    test_samples(ds, dir);
    sl_dataset_close(ds);
    test_open_errors(dir);
    iot_cleanup(dir);
    return tu_finish("test_io_loader");
}
