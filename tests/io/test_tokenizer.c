/* Tokenizers: pre-split vs GPT-2's rule, BPE training vs a naive reference trainer (same merges), encoding vs
 * a naive reference encoder (same ids), exact round trips (corpus and edge cases), compression, save/load and
 * rejection of tampered tokenizer.json files. */
#include <string.h>

#include "data/data_internal.h"
#include "io_testutil.h"
#include "suanli/data.h"
#include "testutil.h"

static int roundtrip(const sl_tokenizer *tok, const char *s, size_t n, const char *what) {
    int32_t *ids = NULL;
    int64_t m = 0;
    char *d = NULL;
    size_t dl = 0;
    int ok = sl_tokenizer_encode(tok, s, n, &ids, &m) == SL_OK;
    ok = ok && m <= (int64_t)n;
    for (int64_t i = 0; ok && i < m; i++) ok = ids[i] >= 0 && ids[i] < sl_tokenizer_vocab_size(tok);
    ok = ok && sl_tokenizer_decode(tok, ids, m, &d, &dl) == SL_OK && dl == n && (n == 0 || !memcmp(d, s, n));
    /* decode_token agrees with decode */
    size_t pos = 0;
    for (int64_t i = 0; ok && i < m; i++) {
        char b[4096];
        int k = sl_tokenizer_decode_token(tok, ids[i], b, sizeof b);
        ok = k > 0 && k <= (int)sizeof b && pos + (size_t)k <= n && !memcmp(b, s + pos, (size_t)k);
        pos += (size_t)k;
    }
    TU_CHECK(ok, "round trip failed for %s (%s, %zu bytes -> %lld ids): %s", what, sl_tokenizer_type(tok), n,
             (long long)m, sl_errmsg());
    free(ids);
    free(d);
    return ok;
}

static void check_split(const char *s, const char *const *want, int nwant) {
    size_t n = strlen(s), i = 0;
    int k = 0, ok = 1;
    while (i < n) {
        size_t l = sl__pretok_next((const uint8_t *)s, n, i);
        if (l == 0 || k >= nwant || strlen(want[k]) != l || memcmp(want[k], s + i, l)) {
            ok = 0;
            break;
        }
        i += l;
        k++;
    }
    TU_CHECK(ok && k == nwant, "pre-split of \"%s\" differs at word %d", s, k);
}

/* ---- naive reference BPE: full recount per merge, all word occurrences kept separately ---- */
static int naive_train(const char *text, size_t len, int nmerges, int32_t *merges) {
    int cap = 256 + nmerges;
    int64_t *cnt = malloc((size_t)cap * cap * sizeof *cnt);
    size_t nw = 0;
    size_t *wl = malloc(len * sizeof *wl), *wo = malloc(len * sizeof *wo);
    int32_t *sym = malloc(len * sizeof *sym);
    for (size_t i = 0; i < len;) {
        size_t l = sl__pretok_next((const uint8_t *)text, len, i);
        wo[nw] = i;
        wl[nw++] = l;
        for (size_t k = 0; k < l; k++) sym[i + k] = (uint8_t)text[i + k];
        i += l;
    }
    int m = 0;
    for (; m < nmerges; m++) {
        memset(cnt, 0, (size_t)cap * cap * sizeof *cnt);
        for (size_t w = 0; w < nw; w++)
            for (size_t k = 0; k + 1 < wl[w]; k++) cnt[(size_t)sym[wo[w] + k] * cap + sym[wo[w] + k + 1]]++;
        int64_t best = 0;
        int ba = -1, bb = -1;
        for (int a = 0; a < 256 + m; a++)
            for (int b = 0; b < 256 + m; b++)
                if (cnt[(size_t)a * cap + b] > best) best = cnt[(size_t)a * cap + b], ba = a, bb = b;
        if (best == 0) break;
        merges[2 * m] = ba, merges[2 * m + 1] = bb;
        for (size_t w = 0; w < nw; w++) {
            int32_t *s = sym + wo[w];
            size_t o = 0;
            for (size_t k = 0; k < wl[w];) {
                if (k + 1 < wl[w] && s[k] == ba && s[k + 1] == bb)
                    s[o++] = 256 + m, k += 2;
                else
                    s[o++] = s[k++];
            }
            wl[w] = o;
        }
    }
    free(cnt), free(wl), free(wo), free(sym);
    return m;
}

/* GPT-2's bpe(): repeatedly merge every occurrence (left to right) of the lowest-ranked adjacent pair. */
static int64_t naive_encode(const sl_tokenizer *t, const char *text, size_t len, int32_t *out) {
    int64_t no = 0;
    int32_t *s = malloc((len + 1) * sizeof *s);
    for (size_t i = 0; i < len;) {
        size_t l = sl__pretok_next((const uint8_t *)text, len, i);
        for (size_t k = 0; k < l; k++) s[k] = (uint8_t)text[i + k];
        for (;;) {
            int32_t best = -1;
            for (size_t k = 0; k + 1 < l; k++) {
                int32_t r = sl__merge_rank(t, s[k], s[k + 1]);
                if (r >= 0 && (best < 0 || r < best)) best = r;
            }
            if (best < 0) break;
            int32_t a = t->merges[2 * best], b = t->merges[2 * best + 1];
            size_t o = 0;
            for (size_t k = 0; k < l;) {
                if (k + 1 < l && s[k] == a && s[k + 1] == b)
                    s[o++] = 256 + best, k += 2;
                else
                    s[o++] = s[k++];
            }
            l = o;
        }
        for (size_t k = 0; k < l; k++) out[no++] = s[k];
        i += sl__pretok_next((const uint8_t *)text, len, i);
    }
    free(s);
    return no;
}

static void expect_load_fail(const char *dir, const char *name, const char *json, const char *word) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s.json", dir, name);
    iot_write(p, json, strlen(json));
    sl_tokenizer *t = NULL;
    sl_status st = sl_tokenizer_load(p, &t);
    TU_CHECK(st != SL_OK && !t, "%s: tampered tokenizer accepted", name);
    TU_CHECK(iot_contains(sl_errmsg(), p) && iot_contains(sl_errmsg(), word),
             "%s: message should name file and '%s': %s", name, word, sl_errmsg());
    sl_tokenizer_free(t);
}

int main(void) {
    /* pre-split follows GPT-2's regex */
    {
        const char *w[] = {"Hello", " world", "'s", " ", " end", "\n"};
        check_split("Hello world's  end\n", w, 6);
    }
    {
        const char *w[] = {"a", "1", "b", "2", " 33", "!!?", "\t", "x"};
        check_split("a1b2 33!!?\tx", w, 8);
    }
    {
        const char *w[] = {"don", "'t"};
        check_split("don't", w, 2);
    }
    {
        const char *w[] = {"   "};
        check_split("   ", w, 1);
    }
    {
        const char *w[] = {"x", "  ", " y"};
        check_split("x   y", w, 3);
    }
    {
        const char *w[] = {"\xc3\xa9", " \xc3\xbc"};
        check_split("\xc3\xa9 \xc3\xbc", w, 2);
    }
    {
        const char *w[] = {"'re", "'"};
        check_split("'re'", w, 2);
    }
    {
        const char *w[] = {"\n", "\n", "A"};
        check_split("\n\nA", w, 3);
    }

    size_t clen;
    char *corpus = iot_read(IOT_CORPUS, &clen);
    TU_CHECK(corpus && clen > 1000000, "corpus %s missing", IOT_CORPUS);
    if (!corpus) return tu_finish("test_io_tokenizer");

    /* byte tokenizer */
    sl_tokenizer *bt;
    TU_CHECK(sl_tokenizer_new_byte(&bt) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(sl_tokenizer_vocab_size(bt) == 256, "byte vocab");
    roundtrip(bt, corpus, clen, "corpus");
    {
        int32_t *ids;
        int64_t n;
        sl_tokenizer_encode(bt,
                            "\xff\x00"
                            "A",
                            3, &ids, &n);
        TU_CHECK(n == 3 && ids[0] == 255 && ids[1] == 0 && ids[2] == 65, "byte ids are the bytes");
        free(ids);
    }

    /* BPE training = naive reference on a slice (identical merges, ties to the smaller pair) */
    {
        size_t sl = 40000;
        int nm = 200;
        int32_t *ref = malloc((size_t)nm * 2 * sizeof *ref);
        int nref = naive_train(corpus, sl, nm, ref);
        sl_tokenizer *t = NULL;
        TU_CHECK(sl_tokenizer_train_bpe(corpus, sl, 256 + nm, &t) == SL_OK, "%s", sl_errmsg());
        if (t) {
            TU_CHECK(t->nmerges == nref, "merges %d vs reference %d", t->nmerges, nref);
            int first_diff = -1;
            for (int i = 0; i < nref && i < t->nmerges && first_diff < 0; i++)
                if (t->merges[2 * i] != ref[2 * i] || t->merges[2 * i + 1] != ref[2 * i + 1]) first_diff = i;
            TU_CHECK(first_diff < 0, "merge %d differs: (%d,%d) vs reference (%d,%d)", first_diff,
                     first_diff >= 0 ? t->merges[2 * first_diff] : 0,
                     first_diff >= 0 ? t->merges[2 * first_diff + 1] : 0,
                     first_diff >= 0 ? ref[2 * first_diff] : 0,
                     first_diff >= 0 ? ref[2 * first_diff + 1] : 0);
            /* encoding = GPT-2's greedy-by-rank reference, on text the tokenizer did not see */
            size_t el = 60000;
            const char *etext = corpus + 500000;
            int32_t *want = malloc(el * sizeof *want), *got = NULL;
            int64_t nwant = naive_encode(t, etext, el, want), ngot = 0;
            sl_tokenizer_encode(t, etext, el, &got, &ngot);
            TU_CHECK(ngot == nwant && !memcmp(got, want, (size_t)ngot * sizeof *got),
                     "encode differs from the reference (%lld vs %lld ids)", (long long)ngot,
                     (long long)nwant);
            free(want), free(got);
            sl_tokenizer_free(t);
        }
        free(ref);
    }

    /* same oracle on long words full of (a, a) runs: left-to-right overlap semantics, no spaces at all */
    {
        size_t sl = 6000;
        char *txt = malloc(sl);
        for (size_t i = 0; i < sl; i++) txt[i] = "aaab\xe4\xb8"[sl_rng_u64(3, 0, i) % 6];
        for (size_t i = 500; i < 900; i++) txt[i] = 'a'; /* one long run */
        int nm = 150;
        int32_t *ref = malloc((size_t)nm * 2 * sizeof *ref);
        int nref = naive_train(txt, sl, nm, ref);
        sl_tokenizer *t = NULL;
        TU_CHECK(sl_tokenizer_train_bpe(txt, sl, 256 + nm, &t) == SL_OK, "%s", sl_errmsg());
        if (t) {
            int same = t->nmerges == nref;
            for (int i = 0; same && i < nref; i++)
                same = t->merges[2 * i] == ref[2 * i] && t->merges[2 * i + 1] == ref[2 * i + 1];
            TU_CHECK(same, "runs text: merges differ from the reference (%d vs %d merges)", t->nmerges, nref);
            int32_t *want = malloc(sl * sizeof *want), *got = NULL;
            int64_t nwant = naive_encode(t, txt, sl, want), ngot = 0;
            sl_tokenizer_encode(t, txt, sl, &got, &ngot);
            TU_CHECK(ngot == nwant && !memcmp(got, want, (size_t)ngot * sizeof *got),
                     "runs text: encode differs");
            free(want), free(got);
            sl_tokenizer_free(t);
        }
        free(ref), free(txt);
    }

    /* one 500 KB word (text without spaces, like Chinese): training cost must not scale with word length */
    {
        size_t sl = 500000;
        char *txt = malloc(sl);
        for (size_t i = 0; i < sl; i++) txt[i] = (char)('a' + sl_rng_u64(4, 0, i) % 10);
        double w0 = sl_time_sec();
        sl_tokenizer *t = NULL;
        TU_CHECK(sl_tokenizer_train_bpe(txt, sl, 1024, &t) == SL_OK, "%s", sl_errmsg());
        double w1 = sl_time_sec();
        printf("bpe train: one 500 KB word, vocab 1024: %.3f s\n", w1 - w0);
        if (t) roundtrip(t, txt, sl, "long word");
        sl_tokenizer_free(t);
        free(txt);
    }

    /* training a tiny text runs out of pairs: smaller vocab, not an error */
    {
        sl_tokenizer *t = NULL;
        TU_CHECK(sl_tokenizer_train_bpe("abab", 4, 1000, &t) == SL_OK, "%s", sl_errmsg());
        TU_CHECK(t && sl_tokenizer_vocab_size(t) == 258, "vocab of 'abab' = %d, want 258 (ab, abab)",
                 t ? sl_tokenizer_vocab_size(t) : -1);
        sl_tokenizer_free(t);
        TU_CHECK(sl_tokenizer_train_bpe("abc", 3, 256, &t) == SL_ERR_INVALID && !t,
                 "vocab 256 accepted for bpe");
        TU_CHECK(sl_tokenizer_train_bpe("abc", 3, SL_BPE_MAX_VOCAB + 1, &t) == SL_ERR_INVALID,
                 "huge vocab accepted");
    }

    /* full corpus: vocab 512 and 4096; time, compression, round trip */
    sl_tokenizer *b512 = NULL, *b4k = NULL;
    double t0 = sl_time_sec();
    TU_CHECK(sl_tokenizer_train_bpe(corpus, clen, 512, &b512) == SL_OK, "%s", sl_errmsg());
    double t1 = sl_time_sec();
    TU_CHECK(sl_tokenizer_train_bpe(corpus, clen, 4096, &b4k) == SL_OK, "%s", sl_errmsg());
    double t2 = sl_time_sec();
    TU_CHECK(b512 && b4k && sl_tokenizer_vocab_size(b512) == 512 && sl_tokenizer_vocab_size(b4k) == 4096,
             "vocab sizes");
    if (!b512 || !b4k) return tu_finish("test_io_tokenizer");
    int32_t *ids;
    int64_t n512, n4k;
    double t3 = sl_time_sec();
    sl_tokenizer_encode(b512, corpus, clen, &ids, &n512);
    double t4 = sl_time_sec();
    free(ids);
    sl_tokenizer_encode(b4k, corpus, clen, &ids, &n4k);
    free(ids);
    printf(
        "bpe train: vocab 512 %.3f s, vocab 4096 %.3f s; encode (512) %.3f s; tokens: bytes %zu, bpe512 %lld "
        "(%.2f B/tok), bpe4096 %lld (%.2f B/tok)\n",
        t1 - t0, t2 - t1, t4 - t3, clen, (long long)n512, (double)clen / n512, (long long)n4k,
        (double)clen / n4k);
    TU_CHECK(n512 < (int64_t)clen * 2 / 3, "bpe 512 gave %lld tokens for %zu bytes", (long long)n512, clen);
    TU_CHECK(n4k < n512, "bpe 4096 (%lld) should compress more than bpe 512 (%lld)", (long long)n4k,
             (long long)n512);
    roundtrip(b512, corpus, clen, "corpus");
    roundtrip(b4k, corpus, clen, "corpus");

    /* a 10 MB text goes through the parallel chunked encoder: must equal the sequential one */
    {
        size_t bl = 9 * clen;
        char *bigt = malloc(bl);
        for (size_t r = 0; r < 9; r++) memcpy(bigt + r * clen, corpus, clen);
        for (size_t r = 1; r < 9; r++) bigt[r * clen + 7 * r] = (char)(0x80 + r); /* vary the copies */
        sl_threads_set(2);
        int32_t *par = NULL, *seq = malloc(bl * sizeof *seq);
        int64_t npar = 0, nseq = 0;
        double p0 = sl_time_sec();
        TU_CHECK(sl_tokenizer_encode(b4k, bigt, bl, &par, &npar) == SL_OK, "%s", sl_errmsg());
        double p1 = sl_time_sec();
        TU_CHECK(sl__bpe_encode(b4k, (const uint8_t *)bigt, bl, seq, &nseq) == SL_OK, "%s", sl_errmsg());
        double p2 = sl_time_sec();
        printf("encode 10 MB (vocab 4096): %.3f s with %d threads, %.3f s sequential\n", p1 - p0,
               sl_threads_get(), p2 - p1);
        TU_CHECK(npar == nseq && par && !memcmp(par, seq, (size_t)nseq * sizeof *seq),
                 "parallel encode differs from sequential (%lld vs %lld ids)", (long long)npar,
                 (long long)nseq);
        free(par), free(seq), free(bigt);
    }

    /* edge cases, both tokenizers */
    const sl_tokenizer *toks[3] = {bt, b512, b4k};
    size_t big = 300000;
    char *ws = malloc(big), *nospace = malloc(big), *rnd = malloc(big);
    for (size_t i = 0; i < big; i++) {
        ws[i] = " \n\t \r  \n"[i % 8 == 7 ? (i / 8) % 8 : 0];
        nospace[i] = "the"[i % 3];
        rnd[i] = (char)(sl_rng_u64(7, 0, i) & 0xff);
    }
    static const char all[256] = {0};
    char allb[256];
    for (int i = 0; i < 256; i++) allb[i] = (char)i;
    (void)all;
    for (int k = 0; k < 3; k++) {
        const sl_tokenizer *t = toks[k];
        roundtrip(t, "", 0, "empty");
        roundtrip(t, "a", 1, "single byte");
        roundtrip(t, "\xff", 1, "single 0xff");
        roundtrip(t, "\xc3", 1, "lone UTF-8 lead byte");
        roundtrip(t, "caf\xc3\xa9 \xe2\x82 \xc0\xaf \xed\xa0\x80 z\xff\xfe", 17, "invalid UTF-8");
        roundtrip(t, allb, 256, "all 256 bytes");
        roundtrip(t, "          ", 10, "whitespace run");
        roundtrip(t, ws, big, "long mixed whitespace");
        roundtrip(t, nospace, big, "300 KB without spaces");
        roundtrip(t, rnd, big, "random bytes");
        roundtrip(t, "x", 1, "x");
    }
    {
        double e0 = sl_time_sec();
        int32_t *i2;
        int64_t n2;
        sl_tokenizer_encode(b4k, nospace, big, &i2, &n2);
        double e1 = sl_time_sec();
        printf("encode one 300 KB word (vocab 4096): %.2f s\n", e1 - e0); /* informative; no timing bar */
        free(i2);
    }
    TU_CHECK(sl_tokenizer_decode_token(b4k, 4096, NULL, 0) == -1, "out-of-range id decoded");
    TU_CHECK(sl_tokenizer_decode_token(b4k, -1, NULL, 0) == -1, "negative id decoded");
    {
        char tiny[2];
        int id = 0;
        for (int i = 256; i < 4096; i++)
            if (b4k->len[i] > 2) {
                id = i;
                break;
            }
        int k = sl_tokenizer_decode_token(b4k, id, tiny, 2);
        TU_CHECK(k == (int)b4k->len[id] && tiny[0] == (char)b4k->bytes[b4k->off[id]],
                 "short buffer: returns full length");
        int32_t badid = 5000;
        char *d;
        size_t dl;
        TU_CHECK(sl_tokenizer_decode(b4k, &badid, 1, &d, &dl) == SL_ERR_INVALID,
                 "decode of id 5000 accepted");
    }

    /* save / load (file path and directory path) gives the same tokenizer */
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("tok"));
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    TU_CHECK(sl_tokenizer_save(b4k, p) == SL_OK, "%s", sl_errmsg());
    sl_tokenizer *l1 = NULL, *l2 = NULL;
    TU_CHECK(sl_tokenizer_load(p, &l1) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(sl_tokenizer_load(dir, &l2) == SL_OK, "load from dir: %s", sl_errmsg());
    if (l1 && l2) {
        TU_CHECK(!strcmp(sl_tokenizer_type(l1), "bpe") && sl_tokenizer_vocab_size(l1) == 4096,
                 "loaded type/vocab");
        int32_t *a, *b;
        int64_t na, nb;
        sl_tokenizer_encode(b4k, corpus, 200000, &a, &na);
        sl_tokenizer_encode(l2, corpus, 200000, &b, &nb);
        TU_CHECK(na == nb && !memcmp(a, b, (size_t)na * 4), "loaded tokenizer encodes differently");
        free(a), free(b);
    }
    sl_tokenizer_free(l1), sl_tokenizer_free(l2);
    snprintf(p, sizeof p, "%s/byte.json", dir);
    TU_CHECK(sl_tokenizer_save(bt, p) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(sl_tokenizer_load(p, &l1) == SL_OK && !strcmp(sl_tokenizer_type(l1), "byte"), "byte load: %s",
             sl_errmsg());
    sl_tokenizer_free(l1);

    /* tampered files */
    const char *hdr = "{\"format\":\"suanli-tokenizer\",\"version\":1,";
    char js[2048];
    snprintf(js, sizeof js,
             "%s\"type\":\"bpe\",\"vocab_size\":258,\"pretokenizer\":\"gpt2-bytes-v1\","
             "\"merges\":[[104,101],[256,108]],\"tokens\":[\"6865\",\"68656c\"]}",
             hdr);
    {
        char okp[700];
        snprintf(okp, sizeof okp, "%s/ok.json", dir);
        iot_write(okp, js, strlen(js));
        TU_CHECK(sl_tokenizer_load(okp, &l1) == SL_OK, "hand-written valid tokenizer rejected: %s",
                 sl_errmsg());
        sl_tokenizer_free(l1);
    }
    snprintf(js, sizeof js,
             "%s\"type\":\"bpe\",\"vocab_size\":258,\"pretokenizer\":\"gpt2-bytes-v1\","
             "\"merges\":[[104,101],[256,108]],\"tokens\":[\"6865\",\"68656d\"]}",
             hdr);
    expect_load_fail(dir, "tok-bytes", js, "tokens[1]");
    snprintf(js, sizeof js,
             "%s\"type\":\"bpe\",\"vocab_size\":259,\"pretokenizer\":\"gpt2-bytes-v1\","
             "\"merges\":[[104,101],[256,108]],\"tokens\":[\"6865\",\"68656c\"]}",
             hdr);
    expect_load_fail(dir, "vocab-count", js, "merges");
    snprintf(js, sizeof js,
             "%s\"type\":\"bpe\",\"vocab_size\":258,\"pretokenizer\":\"gpt2-bytes-v1\","
             "\"merges\":[[257,101],[256,108]],\"tokens\":[\"6865\",\"68656c\"]}",
             hdr);
    expect_load_fail(dir, "future-id", js, "merge 0");
    snprintf(js, sizeof js,
             "%s\"type\":\"bpe\",\"vocab_size\":258,\"pretokenizer\":\"gpt2-bytes-v1\","
             "\"merges\":[[104,101],[104,101]],\"tokens\":[\"6865\",\"6865\"]}",
             hdr);
    expect_load_fail(dir, "dup-merge", js, "duplicates");
    snprintf(js, sizeof js, "%s\"type\":\"wordpiece\",\"vocab_size\":258}", hdr);
    expect_load_fail(dir, "type", js, "type");
    snprintf(js, sizeof js, "%s\"type\":\"byte\",\"vocab_size\":300}", hdr);
    expect_load_fail(dir, "byte-vocab", js, "vocab_size");
    expect_load_fail(dir, "notjson", "merges: [1, 2", "JSON");
    expect_load_fail(dir, "format", "{\"format\":\"hf\",\"version\":1,\"type\":\"byte\",\"vocab_size\":256}",
                     "format");
    snprintf(p, sizeof p, "%s/nope", dir);
    TU_CHECK(sl_tokenizer_load(p, &l1) == SL_ERR_IO && iot_contains(sl_errmsg(), "nope"), "missing file: %s",
             sl_errmsg());

    free(ws), free(nospace), free(rnd);
    sl_tokenizer_free(bt), sl_tokenizer_free(b512), sl_tokenizer_free(b4k);
    free(corpus);
    iot_cleanup(dir);
    return tu_finish("test_io_tokenizer");
}
