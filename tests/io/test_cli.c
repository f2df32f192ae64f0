/* `suanli data prepare | info` end to end: real corpus with byte and bpe tokenizers, multi-shard output and
 * stale-shard cleanup, and every bad-input path: exit 2, one line naming the problem, nothing half-written.
 */
#include <string.h>
#include <sys/stat.h>

#include "io_testutil.h"
#include "suanli/data.h"
#include "testutil.h"

static char out[65536];

static int run(const char *fmt, const char *a, const char *b) {
    char cmd[4096], full[4300];
    snprintf(cmd, sizeof cmd, fmt, a ? a : "", b ? b : "");
    snprintf(full, sizeof full, "%s data %s", tu_cli(), cmd);
    return tu_run(full, out, sizeof out);
}

/* A bad invocation: exit 2, exactly one line, mentioning `word`; nothing new written into `dir`, and no
 * entry anywhere under the test's directory created, removed or modified (tu_watch in main). */
static void bad(const char *what, const char *args, const char *dir, const char *word) {
    int before = dir ? iot_count_entries(dir, NULL) : 0;
    int rc = run("%s", args, NULL);
    TU_CHECK(rc == 2, "%s: exit %d, want 2; output: %s", what, rc, out);
    TU_CHECK(iot_count_lines(out) == 1, "%s: want one line, got: %s", what, out);
    TU_CHECK(iot_contains(out, word), "%s: output should mention '%s': %s", what, word, out);
    if (dir) TU_CHECK(iot_count_entries(dir, NULL) == before, "%s: files were written into %s", what, dir);
    TU_CHECK(tu_unchanged(), "%s: the run changed the test directory", what);
}

int main(void) {
    char base[512], d[700], args[2048];
    snprintf(base, sizeof base, "%s", tu_tmpdir("cli"));
    tu_watch(base);

    /* byte tokenizer on the corpus */
    snprintf(d, sizeof d, "%s/byte", base);
    int rc = run("prepare --input " IOT_CORPUS " --output-prefix %s --tokenizer-type byte", d, NULL);
    TU_CHECK(rc == 0, "byte prepare exit %d: %s", rc, out);
    printf("%s", out);
    TU_CHECK(iot_contains(out, "1003855 tokens") && iot_contains(out, "111539 tokens"),
             "byte split should be 90/10 of 1115394 bytes: %s", out);
    sl_dataset *ds = NULL;
    TU_CHECK(sl_dataset_open(d, "val", &ds) == SL_OK, "%s", sl_errmsg());
    if (ds) {
        /* val is the LAST 10% of the text, byte for byte */
        size_t clen;
        char *corpus = iot_read(IOT_CORPUS, &clen);
        int64_t n = sl_dataset_num_tokens(ds);
        int32_t *v = malloc((size_t)n * sizeof *v);
        sl_dataset_read(ds, 0, n, v);
        int same = n == 111539;
        for (int64_t i = 0; same && i < n; i++) same = v[i] == (uint8_t)corpus[clen - (size_t)n + (size_t)i];
        TU_CHECK(same, "val split is not the last 10%% of the input");
        free(v), free(corpus);
        sl_dataset_close(ds);
    }
    TU_CHECK(run("info %s", d, NULL) == 0 && iot_contains(out, "checksums ok"), "info: %s", out);

    /* bpe 512 */
    snprintf(d, sizeof d, "%s/bpe", base);
    rc = run("prepare --input " IOT_CORPUS " --output-prefix %s --tokenizer-type bpe --vocab-size 512", d,
             NULL);
    TU_CHECK(rc == 0, "bpe prepare exit %d: %s", rc, out);
    printf("%s", out);
    TU_CHECK(iot_contains(out, "vocab 512"), "output: %s", out);
    sl_dataset *tr = NULL;
    TU_CHECK(sl_dataset_open(d, "train", &tr) == SL_OK, "%s", sl_errmsg());
    if (tr) {
        TU_CHECK(sl_dataset_vocab_size(tr) == 512, "vocab %d", sl_dataset_vocab_size(tr));
        TU_CHECK(sl_dataset_num_tokens(tr) < 1003855 * 2 / 3, "bpe 512 train tokens %lld not < 2/3 of bytes",
                 (long long)sl_dataset_num_tokens(tr));
        /* decode(train shards) == first 90% of the text */
        sl_tokenizer *tok = NULL;
        TU_CHECK(sl_tokenizer_load(d, &tok) == SL_OK, "%s", sl_errmsg());
        int64_t n = sl_dataset_num_tokens(tr);
        int32_t *ids = malloc((size_t)n * sizeof *ids);
        sl_dataset_read(tr, 0, n, ids);
        char *txt = NULL;
        size_t tl = 0;
        size_t clen;
        char *corpus = iot_read(IOT_CORPUS, &clen);
        TU_CHECK(tok && sl_tokenizer_decode(tok, ids, n, &txt, &tl) == SL_OK && tl == 1003855 &&
                     !memcmp(txt, corpus, tl),
                 "decoded train shards differ from the text");
        free(txt), free(ids), free(corpus);
        sl_tokenizer_free(tok);
        sl_dataset_close(tr);
    }

    /* many shards, then a re-prepare into the same dir removes the stale ones */
    snprintf(d, sizeof d, "%s/multi", base);
    rc = run("prepare --input " IOT_CORPUS " --output-prefix %s --val-fraction 0.25 --shard-tokens 100000", d,
             NULL);
    TU_CHECK(rc == 0 && iot_contains(out, "9 shards") && iot_contains(out, "3 shards"), "multi-shard: %s",
             out);
    snprintf(args, sizeof args, "%s/train_008.bin", d);
    TU_CHECK(iot_exists(args), "train_008.bin missing");
    TU_CHECK(run("info %s", d, NULL) == 0 && iot_contains(out, "836546 tokens in 9 shard"), "info: %s", out);
    rc = run("prepare --input=" IOT_CORPUS " --output-prefix=%s --tokenizer-type=byte", d, NULL);
    TU_CHECK(rc == 0, "re-prepare: %s", out);
    TU_CHECK(!iot_exists(args), "stale train_008.bin left behind");
    TU_CHECK(iot_count_entries(d, ".bin") == 2 && iot_count_entries(d, NULL) == 3, "dir should hold 3 files");

    /* ---- bad input ---- */
    snprintf(d, sizeof d, "%s/bad", base);
    mkdir(d, 0755);
    snprintf(args, sizeof args, "prepare --input %s/missing.txt --output-prefix %s", base, d);
    bad("missing input", args, d, "missing.txt");
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s --tokenizer-type wordpiece",
             IOT_CORPUS, d);
    bad("unknown tokenizer", args, d, "wordpiece");
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s --tokenizer-type bpe --vocab-size 100",
             IOT_CORPUS, d);
    bad("vocab too small", args, d, "--vocab-size 100");
    snprintf(args, sizeof args,
             "prepare --input %s --output-prefix %s --tokenizer-type bpe --vocab-size 99999999999",
             IOT_CORPUS, d);
    bad("vocab too large", args, d, "vocab size");
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s --tokenizer-type bpe --vocab-size 5l2",
             IOT_CORPUS, d);
    bad("vocab non-numeric", args, d, "'5l2'");
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s --tokenizer-type bpe", IOT_CORPUS, d);
    bad("bpe without vocab", args, d, "--vocab-size");
    snprintf(args, sizeof args,
             "prepare --input %s --output-prefix %s --tokenizer-type byte --vocab-size 512", IOT_CORPUS, d);
    bad("byte with vocab 512", args, d, "256");
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s --val-fraction 1.5", IOT_CORPUS, d);
    bad("val fraction", args, d, "--val-fraction");
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s --frobnicate 3", IOT_CORPUS, d);
    bad("unknown flag", args, d, "--frobnicate");
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s --vocab-size", IOT_CORPUS, d);
    bad("flag without value", args, d, "needs a value");
    /* an empty --tokenizer-file silently fell back to the byte tokenizer ("byte from , vocab 256") */
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s/tfempty --tokenizer-file ''",
             IOT_CORPUS, base);
    bad("empty tokenizer file", args, d, "--tokenizer-file: empty value");
    snprintf(args, sizeof args, "prepare --output-prefix %s", d);
    bad("no input", args, d, "--input");
    bad("unknown subcommand", "shuffle", NULL, "shuffle");
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s/dir", IOT_CORPUS,
             d); /* input is a dir */
    char dd[800];
    snprintf(dd, sizeof dd, "%s/adir", d);
    mkdir(dd, 0755);
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s/o", dd, d);
    bad("input is a directory", args, NULL, "not a regular file");
    snprintf(dd, sizeof dd, "%s/empty.txt", d);
    iot_write(dd, "", 0);
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s/o", dd, d);
    bad("empty input", args, NULL, "empty");
    /* refused after the output directory was made: the directories made go again */
    snprintf(dd, sizeof dd, "%s/one.txt", d);
    iot_write(dd, "x", 1);
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s/new/sub", dd, d);
    rc = run("%s", args, NULL);
    TU_CHECK(rc == 2 && iot_count_lines(out) == 1 && iot_contains(out, "too small"), "input too small: %d %s",
             rc, out);
    snprintf(dd, sizeof dd, "%s/new", d);
    TU_CHECK(!iot_exists(dd), "input too small: %s was left behind", dd);
    /* text the tokenizer cannot encode: the message names the input and where its split starts */
    snprintf(dd, sizeof dd, "%s/latin1.txt", d);
    const char *latin1 = "caf\xe9 au lait, th\xe9 vert, cr\xe8me br\xfbl\xe9";
    iot_write(dd, latin1, strlen(latin1));
    snprintf(args, sizeof args,
             "prepare --input %s --output-prefix %s --tokenizer-file %s/hf/llama/tokenizer.json", dd, d,
             SL_SOURCE_DIR "/tests/fixtures");
    bad("not UTF-8", args, d, "latin1.txt (train split, from byte 0): ");
    /* output dir not writable: a path below a regular file (works as root too) */
    snprintf(args, sizeof args, "prepare --input %s --output-prefix %s/sub", IOT_CORPUS, IOT_CORPUS);
    bad("output under a regular file", args, NULL, "not writable");

    /* failure after the shards were written (tokenizer.json is a directory, so its rename fails):
     * nothing of this run may remain, and no temporary file either */
    snprintf(d, sizeof d, "%s/late", base);
    snprintf(dd, sizeof dd, "%s/tokenizer.json/x", d);
    mkdir(d, 0755);
    snprintf(dd, sizeof dd, "%s/tokenizer.json", d);
    mkdir(dd, 0755);
    snprintf(dd, sizeof dd, "%s/tokenizer.json/keep", d);
    mkdir(dd, 0755);
    rc = run("prepare --input " IOT_CORPUS " --output-prefix %s", d, NULL);
    TU_CHECK(rc == 1, "late failure: exit %d, want 1: %s", rc, out);
    TU_CHECK(iot_count_lines(out) == 1 && iot_contains(out, "tokenizer.json"), "late failure message: %s",
             out);
    TU_CHECK(iot_count_entries(d, NULL) == 1, "late failure left files behind in %s", d);

    /* info on a corrupted dataset */
    snprintf(d, sizeof d, "%s/byte/val_000.bin", base);
    size_t l;
    char *raw = iot_read(d, &l);
    raw[l - 2] ^= 0x40; /* low byte: the token stays < 256, only the checksum can catch it */
    iot_write(d, raw, l);
    free(raw);
    snprintf(d, sizeof d, "%s/byte", base);
    rc = run("info %s", d, NULL);
    TU_CHECK(rc == 1 && iot_contains(out, "val_000.bin") && iot_contains(out, "checksum mismatch"),
             "info on corrupt: %d %s", rc, out);
    iot_cleanup(base);
    return tu_finish("test_io_cli");
}
