/* SentencePiece tokenizers vs the `sentencepiece` and `tokenizers` packages (fixtures:
 * scripts/gen_sp_fixtures.py, tests/fixtures/sp): a BPE tokenizer.model (vocab 32000, identity
 * normalizer, Llama-2 settings), a Unigram tokenizer.model (nmt_nfkc, remove_extra_whitespaces) and the BPE
 * as a Llama-2-style tokenizer.json. On every document of the mixed corpus (tinyshakespeare in 30-line
 * blocks + extra.txt: Chinese, code, emoji, whitespace runs, digits, NFKC-sensitive and rare characters;
 * about 1.48 MB) the ids must equal the reference's, and decode must equal the reference's decode
 * (FNV-1a per document; for the BPE models that is the text itself). Malformed models give one-line
 * errors naming the file and field. */
#include <string.h>
#include <unistd.h>

#include "suanli/data.h"
#include "testutil.h"

#define RS '\x1e'

typedef struct {
    char **s;
    size_t *n;
    int count;
} docs;

static char *g_shake, *g_extra;

static void add_doc(docs *d, char *s, size_t n) {
    d->s = realloc(d->s, sizeof(char *) * (size_t)(d->count + 1));
    d->n = realloc(d->n, sizeof(size_t) * (size_t)(d->count + 1));
    d->s[d->count] = s;
    d->n[d->count++] = n;
}

/* the generator's documents(): 30-line blocks of tinyshakespeare (+ "\n"), then extra.txt split on RS */
static docs build_docs(void) {
    docs d = {0};
    char path[1024];
    size_t len;
    snprintf(path, sizeof path, "%s/data/tinyshakespeare.txt", SL_SOURCE_DIR);
    TU_CHECK(sl_file_read_all(path, &g_shake, &len) == SL_OK, "%s", sl_errmsg());
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += g_shake[i] == '\n';
    size_t pos = 0;
    for (size_t l = 0; l < lines; l += 30) {
        size_t end = pos;
        int k = 0;
        while (end < len && k < 30) {
            if (g_shake[end] == '\n' && ++k == 30) break;
            end++;
        }
        /* block = lines [l, l+30) joined by \n, plus \n */
        size_t n = end - pos;
        char *s = malloc(n + 2);
        memcpy(s, g_shake + pos, n);
        s[n] = '\n';
        s[n + 1] = 0;
        add_doc(&d, s, n + 1);
        pos = end + 1;
        if (end >= len) break;
    }
    snprintf(path, sizeof path, "%s/tests/fixtures/sp/extra.txt", SL_SOURCE_DIR);
    TU_CHECK(sl_file_read_all(path, &g_extra, &len) == SL_OK, "%s", sl_errmsg());
    size_t a = 0;
    for (size_t i = 0; i <= len; i++)
        if (i == len || g_extra[i] == RS) {
            char *s = malloc(i - a + 1);
            memcpy(s, g_extra + a, i - a);
            s[i - a] = 0;
            add_doc(&d, s, i - a);
            a = i + 1;
        }
    return d;
}

typedef struct {
    uint32_t ndocs;
    uint32_t *counts;
    uint64_t *fnv;
    uint16_t *ids;
    char *raw;
} ref_ids;

static int read_ref(const char *name, ref_ids *r) {
    char path[1024];
    size_t len;
    snprintf(path, sizeof path, "%s/tests/fixtures/sp/ids_%s.bin", SL_SOURCE_DIR, name);
    if (sl_file_read_all(path, &r->raw, &len) != SL_OK) return 0;
    TU_CHECK(len >= 16 && !memcmp(r->raw, "SLSPIDS1", 8), "%s: bad header", path);
    memcpy(&r->ndocs, r->raw + 8, 4);
    r->counts = (uint32_t *)(void *)(r->raw + 16);
    r->fnv = (uint64_t *)(void *)(r->raw + 16 + 4 * (size_t)r->ndocs);
    r->ids = (uint16_t *)(void *)(r->raw + 16 + 12 * (size_t)r->ndocs);
    return 1;
}

static uint64_t fnv64(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static void check_model(const char *file, const char *ref_name, const docs *d, int exact_roundtrip) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/sp/%s", SL_SOURCE_DIR, file);
    sl_hf_tokenizer *t = NULL;
    double t0 = sl_time_sec();
    sl_status st = sl_hf_tokenizer_load(path, &t);
    TU_CHECK(st == SL_OK, "load %s: %s", file, sl_errmsg());
    if (st != SL_OK) return;
    double t1 = sl_time_sec();
    ref_ids r = {0};
    TU_CHECK(read_ref(ref_name, &r), "reference ids_%s.bin", ref_name);
    if (!r.raw) return;
    TU_CHECK((int)r.ndocs == d->count, "%s: %u reference documents, %d rebuilt", file, r.ndocs, d->count);
    size_t off = 0, bytes = 0, ids_total = 0;
    int bad_docs = 0, bad_dec = 0, bad_rt = 0, shown = 0;
    double enc = 0;
    for (int i = 0; i < d->count && i < (int)r.ndocs; i++) {
        int32_t *ids;
        int n;
        double a = sl_time_sec();
        st = sl_hf_tokenizer_encode(t, d->s[i], 0, &ids, &n);
        enc += sl_time_sec() - a;
        TU_CHECK(st == SL_OK, "%s doc %d: %s", file, i, sl_errmsg());
        if (st != SL_OK) break;
        int first = -1;
        for (int k = 0; k < n && k < (int)r.counts[i] && first < 0; k++)
            if (ids[k] != r.ids[off + (size_t)k]) first = k;
        if (first < 0 && n != (int)r.counts[i]) first = n < (int)r.counts[i] ? n : (int)r.counts[i];
        if (first >= 0) {
            bad_docs++;
            if (shown++ < 3)
                printf("  %s doc %d: ids differ at %d (got %d, want %d; %d vs %u ids)\n", file, i, first,
                       first < n ? ids[first] : -1,
                       first < (int)r.counts[i] ? r.ids[off + (size_t)first] : -1, n, r.counts[i]);
        }
        char *txt;
        size_t tl;
        st = sl_hf_tokenizer_decode(t, ids, n, 0, &txt, &tl);
        TU_CHECK(st == SL_OK, "%s doc %d decode: %s", file, i, sl_errmsg());
        if (st == SL_OK) {
            uint64_t want_fnv;
            memcpy(&want_fnv, (const char *)r.fnv + 8 * (size_t)i, 8); /* unaligned in the file */
            bad_dec += fnv64(txt, tl) != want_fnv;
            bad_rt += exact_roundtrip && (tl != d->n[i] || memcmp(txt, d->s[i], tl));
            if (!exact_roundtrip && i % 7 == 0) { /* what decode gives encodes to the same ids */
                int32_t *ids2;
                int n2;
                if (sl_hf_tokenizer_encode(t, txt, 0, &ids2, &n2) == SL_OK) {
                    bad_rt += n2 != n || memcmp(ids, ids2, sizeof(int32_t) * (size_t)n);
                    free(ids2);
                }
            }
            free(txt);
        }
        off += r.counts[i];
        bytes += d->n[i];
        ids_total += (size_t)n;
        free(ids);
    }
    printf("%-20s load %.3f s; %d documents, %zu bytes, %zu ids in %.2f s: %s ids, %d decodes differ, "
           "%d round-trip failures\n",
           file, t1 - t0, d->count, bytes, ids_total, enc, bad_docs ? "DIFFERENT" : "identical", bad_dec,
           bad_rt);
    TU_CHECK(bad_docs == 0, "%s: %d documents with ids different from the reference", file, bad_docs);
    TU_CHECK(bad_dec == 0, "%s: %d documents decode differently from the reference", file, bad_dec);
    TU_CHECK(bad_rt == 0, "%s: %d round-trip failures", file, bad_rt);
    TU_CHECK(bytes >= 1000000, "%s: compared only %zu bytes", file, bytes);
    /* streaming decode_one agrees with decode for a byte-fallback-free prefix; special handling */
    int32_t *ids;
    int n;
    TU_CHECK(sl_hf_tokenizer_encode(t, "Hello world", 1, &ids, &n) == SL_OK && n >= 2, "encode");
    TU_CHECK(ids[0] == sl_hf_tokenizer_token_id(t, "<s>"), "%s: add_special must prepend <s>", file);
    char buf[64];
    int k = sl_hf_tokenizer_decode_one(t, ids[0], buf, sizeof buf);
    int is_json = strstr(file, ".json") != NULL; /* tokenizer.json: added tokens read verbatim */
    TU_CHECK(is_json ? k == 3 && !memcmp(buf, "<s>", 3) : k == 0, "%s: <s> in a stream gives %d bytes", file,
             k);
    free(ids);
    TU_CHECK(sl_hf_tokenizer_encode(t, "bad \xff utf8", 0, &ids, &n) == SL_ERR_INVALID, "invalid UTF-8");
    TU_CHECK(sl_hf_tokenizer_encode(t, "", 0, &ids, &n) == SL_OK && n == 0, "empty text");
    free(ids);
    free(r.raw);
    sl_hf_tokenizer_free(t);
}

/* ---------------- malformed models ---------------- */

typedef struct {
    uint8_t b[4096];
    size_t n;
} pbw;

static void w_varint(pbw *w, uint64_t v) {
    do {
        w->b[w->n++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
}
static void w_key(pbw *w, int f, int wire) { w_varint(w, (uint64_t)f << 3 | (uint64_t)wire); }
static void w_bytes(pbw *w, int f, const void *s, size_t n) {
    w_key(w, f, 2);
    w_varint(w, n);
    memcpy(w->b + w->n, s, n);
    w->n += n;
}
static void w_piece(pbw *w, const char *s, float score, int type) {
    pbw p = {.n = 0};
    w_bytes(&p, 1, s, strlen(s));
    w_key(&p, 2, 5);
    memcpy(p.b + p.n, &score, 4);
    p.n += 4;
    if (type != 1) {
        w_key(&p, 3, 0);
        w_varint(&p, (uint64_t)type);
    }
    w_bytes(w, 1, p.b, p.n);
}
static void w_trainer(pbw *w, int model_type, int byte_fallback) {
    pbw p = {.n = 0};
    w_key(&p, 3, 0);
    w_varint(&p, (uint64_t)model_type);
    if (byte_fallback) {
        w_key(&p, 35, 0);
        w_varint(&p, 1);
    }
    w_bytes(w, 2, p.b, p.n);
}

static void expect_model(const pbw *w, const char *needle, const char *what) {
    const char *d = tu_tmpdir("spbad");
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.model", d);
    FILE *f = fopen(path, "wb");
    fwrite(w->b, 1, w->n, f);
    fclose(f);
    sl_hf_tokenizer *t = NULL;
    sl_status st = sl_hf_tokenizer_load(path, &t);
    if (!needle) {
        TU_CHECK(st == SL_OK, "%s: must load: %s", what, sl_errmsg());
    } else {
        const char *m = st == SL_OK ? "OK" : sl_errmsg();
        TU_CHECK(st != SL_OK && strstr(m, needle) && strstr(m, "tokenizer.model") && !strchr(m, '\n'),
                 "%s: want one line with '%s', got '%s'", what, needle, m);
        if (st != SL_OK) printf("  refused (%s): %s\n", what, strrchr(m, '/') ? strrchr(m, '/') + 1 : m);
    }
    sl_hf_tokenizer_free(t);
}

static void bad_models(void) {
    pbw w = {.n = 0};
    w_piece(&w, "<unk>", 0, 2);
    w_piece(&w, "<s>", 0, 3);
    w_piece(&w,
            "\xE2\x96\x81"
            "a",
            -1, 1);
    w_piece(&w, "a", -2, 1);
    w_trainer(&w, 2, 0);
    expect_model(&w, NULL, "minimal BPE model");
    pbw t = w;
    t.n -= 3;
    expect_model(&t, "truncated", "truncated protobuf");
    t = w;
    t.n = 0;
    w_piece(&t, "<unk>", 0, 2);
    w_trainer(&t, 3, 0);
    expect_model(&t, "trainer_spec.model_type", "model type WORD");
    t.n = 0;
    w_piece(&t, "<unk>", 0, 2);
    w_piece(&t, "x", 0, 9);
    w_trainer(&t, 1, 0);
    expect_model(&t, "pieces[1].type", "piece type 9");
    t.n = 0;
    w_piece(&t, "<unk>", 0, 2);
    w_piece(&t, "<0xZZ>", 0, 6);
    w_trainer(&t, 1, 1);
    expect_model(&t, "pieces[1].piece", "bad byte piece");
    t.n = 0;
    w_piece(&t, "<unk>", 0, 2);
    w_piece(&t, "<0x41>", 0, 6);
    w_trainer(&t, 1, 0);
    expect_model(&t, "byte_fallback", "byte piece without byte_fallback");
    t.n = 0;
    w_piece(&t, "<unk>", 0, 2);
    w_piece(&t, "ab", 0, 1);
    w_piece(&t, "ab", 0, 1);
    w_trainer(&t, 1, 0);
    expect_model(&t, "already defined", "duplicate piece");
    t.n = 0;
    w_piece(&t, "a", 0, 1);
    w_trainer(&t, 1, 0);
    expect_model(&t, "UNKNOWN", "no unk piece");
    t.n = 0;
    w_piece(&t, "<unk>", 0, 2);
    w_piece(&t, "", 0, 1);
    w_trainer(&t, 1, 0);
    expect_model(&t, "pieces[1].piece", "empty piece");
    t.n = 0;
    w_piece(&t, "<unk>", 0, 2);
    w_trainer(&t, 1, 0);
    {
        pbw ns = {.n = 0};
        w_bytes(&ns, 1, "nmt_nfkc", 8);
        w_bytes(&t, 3, ns.b, ns.n);
    }
    expect_model(&t, "normalizer_spec.name", "normalizer without rules");
    t.n = 0;
    w_piece(&t, "<unk>", 0, 2);
    w_trainer(&t, 1, 0);
    {
        pbw ns = {.n = 0};
        uint8_t blob[12] = {200, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
        w_bytes(&ns, 2, blob, sizeof blob);
        w_bytes(&t, 3, ns.b, ns.n);
    }
    expect_model(&t, "precompiled_charsmap", "broken charsmap");
    t.n = 0;
    w_piece(&t, "<unk>", 0, 2);
    expect_model(&t, "trainer_spec", "no trainer_spec");
}

/* every truncation (in 7919-byte steps) and byte flips of a real model: load or fail, never crash */
static void mutations(const docs *d) {
    char path[1024], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/tests/fixtures/sp/unigram.model", SL_SOURCE_DIR);
    TU_CHECK(sl_file_read_all(path, &text, &len) == SL_OK, "read");
    const char *dir = tu_tmpdir("spmut");
    char mp[1024];
    snprintf(mp, sizeof mp, "%s/tokenizer.model", dir);
    int loaded = 0, failed = 0;
    for (size_t step = 0; step < 2; step++)
        for (size_t at = 1; at < len; at += step ? 4999 : 7919) {
            char old = text[at];
            FILE *f = fopen(mp, "wb");
            if (step) text[at] = (char)(old ^ 0x5a);
            fwrite(text, 1, step ? len : at, f);
            fclose(f);
            text[at] = old;
            sl_hf_tokenizer *t = NULL;
            if (sl_hf_tokenizer_load(mp, &t) == SL_OK) {
                int32_t *ids;
                int n;
                if (sl_hf_tokenizer_encode(t, d->s[d->count - 1], 1, &ids, &n) == SL_OK) {
                    char *o;
                    size_t ol;
                    if (sl_hf_tokenizer_decode(t, ids, n, 0, &o, &ol) == SL_OK) free(o);
                    free(ids);
                }
                loaded++;
            } else {
                failed += sl_errmsg()[0] != 0 && !strchr(sl_errmsg(), '\n');
            }
            sl_hf_tokenizer_free(t);
        }
    printf("tokenizer.model mutations: %d loaded, %d refused with a one-line message\n", loaded, failed);
    TU_CHECK(failed > 0, "mutations must be refused");
    free(text);
}

static void generic_api(void) {
    char a[1024], b[1024], c[1024];
    snprintf(a, sizeof a, "%s/tests/fixtures/sp/bpe.model", SL_SOURCE_DIR);
    snprintf(b, sizeof b, "%s/tests/fixtures/sp/bpe.tokenizer.json", SL_SOURCE_DIR);
    snprintf(c, sizeof c, "%s/tests/fixtures/sp/unigram.model", SL_SOURCE_DIR);
    sl_tokenizer *t = NULL;
    TU_CHECK(sl_tokenizer_load(a, &t) == SL_OK, "sl_tokenizer_load(.model): %s", sl_errmsg());
    if (t) {
        TU_CHECK(!strcmp(sl_tokenizer_type(t), "sentencepiece") && sl_tokenizer_vocab_size(t) == 32000,
                 "type %s vocab %d", sl_tokenizer_type(t), sl_tokenizer_vocab_size(t));
        TU_CHECK(!strcmp(sl_tokenizer_file_name(t), "tokenizer.model"), "file name");
        const char *txt = "Round trip: 你好, 世界 😀\n\tend";
        int32_t *ids;
        int64_t n;
        char *o;
        size_t ol;
        TU_CHECK(sl_tokenizer_encode(t, txt, strlen(txt), &ids, &n) == SL_OK && n > 0, "encode");
        TU_CHECK(sl_tokenizer_decode(t, ids, n, &o, &ol) == SL_OK && ol == strlen(txt) && !memcmp(o, txt, ol),
                 "sl_tokenizer round trip");
        free(o);
        free(ids);
        sl_tokenizer_free(t);
    }
    TU_CHECK(sl_tokenizer_load(b, &t) == SL_OK && !strcmp(sl_tokenizer_type(t), "hf"), "load json: %s",
             sl_errmsg());
    sl_tokenizer_free(t);
    TU_CHECK(sl_tokenizer_files_match(a, b) == SL_OK, "bpe.model and its tokenizer.json must match: %s",
             sl_errmsg());
    TU_CHECK(sl_tokenizer_files_match(a, a) == SL_OK, "a file matches itself");
    sl_status st = sl_tokenizer_files_match(a, c);
    TU_CHECK(st == SL_ERR_INVALID && strstr(sl_errmsg(), "bpe.model") && strstr(sl_errmsg(), "unigram.model"),
             "bpe vs unigram must differ: %s", st == SL_OK ? "OK" : sl_errmsg());
    if (st != SL_OK) printf("files_match(bpe, unigram): %s\n", strrchr(sl_errmsg(), '/') + 1);
}

/* `data prepare --tokenizer-file`: shards hold exactly the file's ids, the file is copied, and the
 * loader and sl_tokenizer_files_match accept the directory */
static void prepare(const docs *d) {
    const char *dir = tu_tmpdir("spprep");
    char in[1024], out[1024], model[1024], cmd[4096], buf[8192];
    snprintf(in, sizeof in, "%s/corpus.txt", dir);
    snprintf(out, sizeof out, "%s/data", dir);
    snprintf(model, sizeof model, "%s/tests/fixtures/sp/bpe.model", SL_SOURCE_DIR);
    FILE *f = fopen(in, "wb");
    for (int i = d->count - 400; i < d->count; i++) fwrite(d->s[i], 1, d->n[i], f); /* CJK, emoji, code... */
    fclose(f);
    sl_prepare_stats S;
    sl_prepare_opts o = {
        .input = in, .output_dir = out, .tokenizer_file = model, .val_fraction = 0.1, .stats = &S};
    sl_status st = sl_data_prepare(&o);
    TU_CHECK(st == SL_OK, "prepare --tokenizer-file: %s", sl_errmsg());
    if (st != SL_OK) return;
    char *text, *copy, *orig;
    size_t len, cl, ol;
    snprintf(cmd, sizeof cmd, "%s/tokenizer.model", out);
    TU_CHECK(sl_file_read_all(cmd, &copy, &cl) == SL_OK && sl_file_read_all(model, &orig, &ol) == SL_OK &&
                 cl == ol && !memcmp(copy, orig, cl),
             "DIR/tokenizer.model must be a copy of the file");
    free(copy);
    free(orig);
    TU_CHECK(sl_tokenizer_files_match(out, model) == SL_OK, "files_match(dir, model): %s", sl_errmsg());
    sl_tokenizer *tok;
    TU_CHECK(sl_tokenizer_load(model, &tok) == SL_OK, "load");
    TU_CHECK(sl_file_read_all(in, &text, &len) == SL_OK, "read");
    size_t ntrain = len - (size_t)((double)len * 0.1);
    while (((unsigned char)text[ntrain] & 0xC0) == 0x80) ntrain--;
    int32_t *want;
    int64_t nw;
    TU_CHECK(sl_tokenizer_encode(tok, text, ntrain, &want, &nw) == SL_OK, "encode");
    sl_dataset *ds;
    st = sl_dataset_open(out, "train", &ds);
    TU_CHECK(st == SL_OK, "dataset_open: %s", sl_errmsg());
    if (st == SL_OK) {
        TU_CHECK(sl_dataset_vocab_size(ds) == 32000 && sl_dataset_num_tokens(ds) == nw,
                 "vocab %d, %lld tokens", sl_dataset_vocab_size(ds), (long long)sl_dataset_num_tokens(ds));
        int32_t *got = malloc(sizeof(int32_t) * (size_t)nw);
        TU_CHECK(sl_dataset_read(ds, 0, nw, got) == SL_OK && !memcmp(got, want, sizeof(int32_t) * (size_t)nw),
                 "train shard ids must be the tokenizer's");
        free(got);
        sl_dataset_close(ds);
    }
    printf("prepare --tokenizer-file bpe.model: %zu bytes -> train %lld / val %lld tokens, vocab %d\n", len,
           (long long)S.train_tokens, (long long)S.val_tokens, S.vocab_size);
    free(want);
    free(text);
    sl_tokenizer_free(tok);
    /* the CLI: tokenizer.json this time (replacing the .model), then the conflicting flags */
    snprintf(cmd, sizeof cmd,
             "%s data prepare --input %s --output-prefix %s --tokenizer-file "
             "%s/tests/fixtures/sp/bpe.tokenizer.json 2>&1",
             tu_cli(), in, out, SL_SOURCE_DIR);
    int rc = tu_run(cmd, buf, sizeof buf);
    TU_CHECK(rc == 0 && strstr(buf, "tokenizer.json: hf"), "CLI prepare: rc %d: %s", rc, buf);
    snprintf(cmd, sizeof cmd, "%s/tokenizer.model", out);
    TU_CHECK(access(cmd, F_OK) != 0, "the earlier tokenizer.model must be removed");
    TU_CHECK(sl_tokenizer_files_match(out, model) == SL_OK, "json-prepared dir matches the .model: %s",
             sl_errmsg());
    snprintf(cmd, sizeof cmd,
             "%s data prepare --input %s --output-prefix %s --tokenizer-file %s --vocab-size 9 2>&1",
             tu_cli(), in, out, model);
    rc = tu_run(cmd, buf, sizeof buf);
    TU_CHECK(rc == 2 && strstr(buf, "conflicts"), "CLI conflict: rc %d: %s", rc, buf);
    snprintf(cmd, sizeof cmd, "%s data prepare --input %s --output-prefix %s/bad --tokenizer-file %s 2>&1",
             tu_cli(), in, dir, in);
    rc = tu_run(cmd, buf, sizeof buf);
    TU_CHECK(rc != 0 && strstr(buf, "corpus.txt") && !strstr(buf, "\n\n"), "bad tokenizer file: rc %d: %s",
             rc, buf);
    printf("CLI with a text file as tokenizer: %s", buf);
    /* train --save on SentencePiece data copies tokenizer.model, and generate --load samples with it (it
     * looked for tokenizer.json only: "tokenizer not found", exit 2) */
    snprintf(
        cmd, sizeof cmd,
        "%s data prepare --input %s --output-prefix %s/spdata --tokenizer-file %s && %s train --data-path "
        "%s/spdata --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 8 "
        "--micro-batch-size 1 --train-iters 1 --eval-iters 1 --threads 1 --save %s/sprun && %s generate "
        "--load %s/sprun --prompt hello --max-new-tokens 3 --threads 1",
        tu_cli(), in, dir, model, tu_cli(), dir, dir, tu_cli(), dir);
    rc = tu_run(cmd, buf, sizeof buf);
    TU_CHECK(rc == 0 && strstr(buf, "[generated 3 tokens"),
             "generate --load of a SentencePiece run: rc %d: %s", rc, buf);
}

int main(void) {
    docs d = build_docs();
    printf("%d documents\n", d.count);
    bad_models();
    check_model("bpe.model", "bpe", &d, 1);
    check_model("unigram.model", "unigram", &d, 0);
    {
        char p[1024];
        snprintf(p, sizeof p, "%s/tests/fixtures/sp/ids_bpe_json.bin", SL_SOURCE_DIR);
        FILE *f = fopen(p, "rb");
        if (f) fclose(f);
        check_model("bpe.tokenizer.json", f ? "bpe_json" : "bpe", &d, 1);
    }
    generic_api();
    prepare(&d);
    mutations(&d);
    for (int i = 0; i < d.count; i++) free(d.s[i]);
    free(d.s);
    free(d.n);
    free(g_shake);
    free(g_extra);
    return tu_finish("test_sp_tokenizer");
}
