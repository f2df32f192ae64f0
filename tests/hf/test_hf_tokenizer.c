/* tokenizer.json byte-level BPE vs HF `tokenizers` (fixtures: scripts/gen_hf_fixtures.py): GPT-2 style
 * (ByteLevel regex), Llama-3 style (Split regex + ByteLevel, ignore_merges, BOS template) and Qwen2 style
 * (+ NFC) on a multilingual text (English, Chinese, code, emoji, combining marks, whitespace runs,
 * special tokens). Ids must be identical, decoding must give tokenizers' decode; malformed files and
 * unsupported features give one-line errors. */
#include <cjson/cJSON.h>
#include <string.h>

#include "suanli/data.h"
#include "testutil.h"

static void check_style(const char *style) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/hf/tok_%s/expected.json", SL_SOURCE_DIR, style);
    char *text;
    size_t len;
    TU_CHECK(sl_file_read_all(path, &text, &len) == SL_OK, "%s", sl_errmsg());
    cJSON *r = cJSON_ParseWithLength(text, len);
    free(text);
    snprintf(path, sizeof path, "%s/tests/fixtures/hf/tok_%s/tokenizer.json", SL_SOURCE_DIR, style);
    sl_hf_tokenizer *t = NULL;
    sl_status st = sl_hf_tokenizer_load(path, &t);
    TU_CHECK(st == SL_OK, "load %s: %s", style, sl_errmsg());
    if (st != SL_OK) return;
    const char *in = cJSON_GetObjectItem(r, "text")->valuestring;
    for (int sp = 0; sp < 2; sp++) {
        const cJSON *want = cJSON_GetObjectItem(r, sp ? "ids_special" : "ids");
        int32_t *ids;
        int n;
        TU_CHECK(sl_hf_tokenizer_encode(t, in, sp, &ids, &n) == SL_OK, "encode: %s", sl_errmsg());
        int nw = cJSON_GetArraySize(want), first = -1;
        for (int i = 0; i < n && i < nw && first < 0; i++)
            if (ids[i] != cJSON_GetArrayItem(want, i)->valueint) first = i;
        if (first < 0 && n != nw) first = n < nw ? n : nw;
        printf("tok_%-7s add_special=%d: %d ids, %s\n", style, sp, n,
               first < 0 ? "identical to tokenizers" : "DIFFERENT");
        TU_CHECK(first < 0, "%s: ids differ at %d (got %d want %d, n %d vs %d)", style, first,
                 first < n ? ids[first] : -1, first < nw ? cJSON_GetArrayItem(want, first)->valueint : -1, n,
                 nw);
        if (!sp) { /* decode */
            size_t cap = 8 * (size_t)n + 16, o = 0;
            char *buf = malloc(cap);
            for (int i = 0; i < n; i++) {
                int k = sl_hf_tokenizer_decode_one(t, ids[i], buf + o, (int)(cap - o));
                TU_CHECK(k >= 0, "decode id %d", ids[i]);
                if (k > 0) o += (size_t)k;
            }
            buf[o] = 0;
            TU_CHECK(!strcmp(buf, cJSON_GetObjectItem(r, "decoded")->valuestring),
                     "%s: decode differs from tokenizers'", style);
            free(buf);
        }
        free(ids);
    }
    /* invalid UTF-8 is an error, not a crash */
    int32_t *ids;
    int n;
    TU_CHECK(sl_hf_tokenizer_encode(t, "ok \xff\xfe bad", 0, &ids, &n) == SL_ERR_INVALID,
             "invalid utf-8 must fail");
    TU_CHECK(sl_hf_tokenizer_encode(t, "", 0, &ids, &n) == SL_OK && n == 0, "empty text");
    free(ids);
    sl_hf_tokenizer_free(t);
    cJSON_Delete(r);
}

static void expect_bad(const char *json, const char *needle) {
    const char *d = tu_tmpdir("hftok");
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", d);
    FILE *f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
    sl_hf_tokenizer *t = NULL;
    sl_status st = sl_hf_tokenizer_load(path, &t);
    TU_CHECK(st != SL_OK && strstr(sl_errmsg(), needle), "bad tokenizer (%s): got '%s'", needle,
             st == SL_OK ? "OK" : sl_errmsg());
    sl_hf_tokenizer_free(t);
}

/* every truncation (in 331-byte steps) and a byte flip every 97 bytes of a real tokenizer.json: each must
 * load or fail with a message, never crash (ASan/UBSan builds make this a memory-safety check) */
static void mutations(void) {
    char path[1024], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/tests/fixtures/hf/tok_qwen2/tokenizer.json", SL_SOURCE_DIR);
    TU_CHECK(sl_file_read_all(path, &text, &len) == SL_OK, "read");
    const char *d = tu_tmpdir("hftokmut");
    char mp[1024];
    snprintf(mp, sizeof mp, "%s/tokenizer.json", d);
    int loaded = 0, failed = 0;
    for (size_t cut = 0; cut < len; cut += 331) {
        FILE *f = fopen(mp, "wb");
        fwrite(text, 1, cut, f);
        fclose(f);
        sl_hf_tokenizer *t = NULL;
        if (sl_hf_tokenizer_load(mp, &t) == SL_OK)
            loaded++;
        else
            failed += sl_errmsg()[0] != 0;
        sl_hf_tokenizer_free(t);
    }
    for (size_t at = 0; at < len; at += 97) {
        char old = text[at];
        text[at] = (char)(old ^ 0x5a);
        FILE *f = fopen(mp, "wb");
        fwrite(text, 1, len, f);
        fclose(f);
        text[at] = old;
        sl_hf_tokenizer *t = NULL;
        if (sl_hf_tokenizer_load(mp, &t) == SL_OK) {
            int32_t *ids;
            int n;
            if (sl_hf_tokenizer_encode(t, "mutated 你好 😀 text", 1, &ids, &n) == SL_OK) free(ids);
            loaded++;
        } else {
            failed += sl_errmsg()[0] != 0;
        }
        sl_hf_tokenizer_free(t);
    }
    printf("tokenizer.json mutations: %d loaded, %d refused with a message\n", loaded, failed);
    TU_CHECK(failed > 0, "mutations must be refused");
    free(text);
}

int main(void) {
    mutations();
    check_style("gpt2");
    check_style("llama3");
    check_style("qwen2");
    const char *bl = "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}";
    expect_bad("[1, 2]", "not a JSON object");
    /* strings spliced into the text must be valid UTF-8 (Note [Strings the encoder splices into the text];
     * the first was a heap over-read found by fuzz_tokenizer) */
    expect_bad("{\"added_tokens\": [{\"id\": 0, \"content\": \"\xbd\xa0x\"}], \"model\": {\"type\": \"BPE\", "
               "\"vocab\": {}, \"merges\": []}}",
               "an added token's 'content' is not valid UTF-8 (byte 0)");
    expect_bad("{\"normalizer\": {\"type\": \"Prepend\", \"prepend\": \"a\xe4\"}, \"model\": {\"type\": "
               "\"BPE\", \"vocab\": {}, \"merges\": []}}",
               "normalizer Prepend 'prepend' is not valid UTF-8 (byte 1)");
    expect_bad("{\"x\": 1}", "missing field 'model'");
    expect_bad("{\"model\": {\"type\": \"Unigram\"}}", "model type 'Unigram'");
    expect_bad("{\"model\": {\"type\": \"BPE\", \"merges\": []}}", "model.vocab");
    expect_bad("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}",
               "model.vocab['a']");
    expect_bad("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
               "model.merges[0]");
    expect_bad("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}}", "model.merges[0]");
    expect_bad("{\"normalizer\": {\"type\": \"NFKD\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, "
               "\"merges\": []}}",
               "normalizer 'NFKD'");
    expect_bad("{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"prepend_scheme\": \"sometimes\"}, \"model\": "
               "{\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
               "Metaspace: prepend_scheme");
    expect_bad("{\"decoder\": {\"type\": \"WordPiece\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, "
               "\"merges\": []}}",
               "decoder 'WordPiece'");
    expect_bad(
        "{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \"_\"}, "
        "\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
        "String");
    expect_bad("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": "
               "\"Isolated\"}, "
               "\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
               "regex");
    char buf[512];
    snprintf(buf, sizeof buf, "{%s, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
             bl);
    expect_bad(buf, "byte 0x00");
    expect_bad("{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {}, \"merges\": []}}",
               "byte_fallback");
    return tu_finish("test_hf_tokenizer");
}
