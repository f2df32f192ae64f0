/* Hugging Face tokenizer.json and SentencePiece tokenizer.model behind one object (sl_hf_tokenizer).
 *
 * Byte-level BPE (GPT-2, Llama-3 and Qwen2 style), as in `tokenizers`: split the text on added tokens
 * (matched verbatim, longest first) -> normalizer (none or NFC via utf8proc) -> pre-tokenizer (Split with a
 * regex, behavior Isolated, and/or ByteLevel with GPT-2's regex; compiled with PCRE2 in UTF+UCP mode) ->
 * bytes mapped to GPT-2's printable code points -> BPE by merge rank (ignore_merges: a piece found whole in
 * the vocabulary is one token) -> post-processor (TemplateProcessing: special tokens around the sequence).
 *
 * Note [SentencePiece-style tokenizer.json]
 *   Llama-2, Mistral, Mixtral and Baichuan2 ship a BPE over U+2581-spelled pieces instead: normalizer
 *   Sequence[Prepend("▁"), Replace(" ", "▁")] (older files) or a Metaspace pre-tokenizer
 *   (replacement, prepend_scheme always|first|never, split; newer files), model BPE with byte_fallback
 *   (a character missing from the vocab becomes its <0xNN> byte tokens) and fuse_unk (consecutive unknown
 *   characters are one unk_token), merges by rank with a heap (sl__bpe_merge; leftmost on ties, as
 *   `tokenizers` orders its queue), and the decoder Sequence[Replace("▁", " "), ByteFallback, Fuse,
 *   Strip(" ", 1, 0)] or Metaspace. Normalizer steps: NFC, NFKC (utf8proc), Prepend, Replace (String
 *   patterns). A file without a ByteLevel pre-tokenizer takes this path.
 *
 * tokenizer.model (a SentencePiece ModelProto: a file not named *.json, not starting with '{' or '[') is read
 * by sp_model.c and encoded by sp_tokenizer.c; add_special prepends the model's bos piece, as Llama's
 * tokenizer does. Anything else in a file (another model type, normalizer, pre-tokenizer, decoder or
 * behavior) is refused with a one-line error naming the file and field, rather than tokenized differently. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <string.h>
#include <utf8proc.h>

#include "data/data_internal.h"
#include "data/sp_internal.h"

/* ---------------- small hash maps ---------------- */

typedef struct {
    char **keys;
    int *vals;
    size_t cap, n;
} strmap;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int strmap_init(strmap *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 16) m->cap *= 2;
    m->keys = calloc(m->cap, sizeof(char *));
    m->vals = calloc(m->cap, sizeof(int));
    m->n = 0;
    return m->keys && m->vals;
}

static void strmap_free(strmap *m) {
    for (size_t i = 0; m->keys && i < m->cap; i++) free(m->keys[i]);
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* -1 if absent */
static int strmap_get(const strmap *m, const char *s, size_t n) {
    for (size_t i = fnv(s, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const char *k = m->keys[i];
        if (!k) return -1;
        if (strlen(k) == n && !memcmp(k, s, n)) return m->vals[i];
    }
}

/* returns 0 on OOM; existing keys keep their first value (returns 2) */
static int strmap_put(strmap *m, const char *s, int v) {
    size_t n = strlen(s);
    size_t i = fnv(s, n) & (m->cap - 1);
    for (; m->keys[i]; i = (i + 1) & (m->cap - 1))
        if (!strcmp(m->keys[i], s)) return 2;
    if (!(m->keys[i] = strdup(s))) return 0;
    m->vals[i] = v;
    m->n++;
    return 1;
}

typedef struct {
    uint64_t *keys; /* (a+1) << 32 | (b+1); 0 = empty */
    int *rank, *merged;
    size_t cap;
} pairmap;

static int pairmap_init(pairmap *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 16) m->cap *= 2;
    m->keys = calloc(m->cap, sizeof(uint64_t));
    m->rank = calloc(m->cap, sizeof(int));
    m->merged = calloc(m->cap, sizeof(int));
    return m->keys && m->rank && m->merged;
}

static void pairmap_free(pairmap *m) {
    free(m->keys);
    free(m->rank);
    free(m->merged);
}

static size_t pair_slot(const pairmap *m, uint64_t k) {
    size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & (m->cap - 1);
    while (m->keys[i] && m->keys[i] != k) i = (i + 1) & (m->cap - 1);
    return i;
}

static uint64_t pair_key(int a, int b) { return ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)(b + 1); }

/* ---------------- the tokenizer ---------------- */

#define MAX_SPLITS 4
typedef struct {
    char *content;
    int id, special;
} added_tok;

enum { NORM_NFC, NORM_NFKC, NORM_PREPEND, NORM_REPLACE };
enum { DEC_BYTELEVEL = 16, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
#define MAX_STEPS 8
typedef struct {
    int kind;
    char *a, *b;     /* Prepend: a; Replace: a -> b; Strip/Metaspace: a = the character */
    int start, stop; /* Strip; Metaspace: start = prepend scheme */
} step;
enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS };

struct sl_hf_tokenizer {
    sl__sp_model *sp; /* tokenizer.model; then only id_tok/n_ids below are used */
    strmap vocab;     /* token string -> id (byte-level symbols, or U+2581 pieces) */
    char **id_tok;    /* id -> token string (borrowed from vocab keys or added) */
    int n_ids;        /* max id + 1 */
    pairmap merges;
    int ignore_merges, byte_level, add_prefix_space;
    pcre2_code *split[MAX_SPLITS];
    int n_split;
    added_tok *added;
    int n_added;
    int prefix[4], n_prefix, suffix[4], n_suffix; /* TemplateProcessing ids */
    char byte_str[256][4];                        /* byte -> UTF-8 of its printable code point */
    int cp_byte[512];                             /* code point -> byte (-1 if none) */
    /* SentencePiece-style tokenizer.json (Note [SentencePiece-style tokenizer.json]) */
    int byte_fallback, fuse_unk, unk_id;
    int byte_tok[256]; /* id of <0xNN>, -1 if absent */
    step norm[MAX_STEPS], dec[MAX_STEPS];
    int n_norm, n_dec;
    int meta, meta_prepend, meta_split; /* Metaspace pre-tokenizer */
    char meta_rep[8];
};

static const char *k_gpt2_regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static void byte_tables(sl_hf_tokenizer *t) {
    /* GPT-2 bytes_to_unicode: printable latin-1 bytes map to themselves, the rest to 256.. */
    int n = 0;
    for (int i = 0; i < 512; i++) t->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = keep ? b : 256 + n++;
        t->cp_byte[cp] = b;
        utf8proc_uint8_t buf[4];
        utf8proc_ssize_t k = utf8proc_encode_char(cp, buf);
        memcpy(t->byte_str[b], buf, (size_t)k);
        t->byte_str[b][k] = 0;
    }
}

void sl_hf_tokenizer_free(sl_hf_tokenizer *t) {
    if (!t) return;
    sl__sp_free(t->sp);
    for (int i = 0; i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    for (int i = 0; i < t->n_dec; i++) free(t->dec[i].a), free(t->dec[i].b);
    strmap_free(&t->vocab);
    free(t->id_tok);
    pairmap_free(&t->merges);
    for (int i = 0; i < t->n_split; i++) pcre2_code_free(t->split[i]);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t);
}

static sl_status add_split(sl_hf_tokenizer *t, const char *path, const char *pattern) {
    if (t->n_split >= MAX_SPLITS)
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: too many pre_tokenizer splits", path);
    int err;
    PCRE2_SIZE off;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return sl_fail(SL_ERR_FORMAT, "%s: pre_tokenizer regex at offset %zu: %s", path, (size_t)off,
                       (const char *)msg);
    }
    t->split[t->n_split++] = re;
    return SL_OK;
}

static sl_status parse_pretok(sl_hf_tokenizer *t, const char *path, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return SL_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "?";
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e, *l = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        cJSON_ArrayForEach(e, l) SL_TRY(parse_pretok(t, path, e));
        return SL_OK;
    }
    if (!strcmp(ty, "ByteLevel")) {
        t->byte_level = 1;
        t->add_prefix_space = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space"));
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        if (!ur || cJSON_IsTrue(ur)) SL_TRY(add_split(t, path, k_gpt2_regex));
        return SL_OK;
    }
    if (!strcmp(ty, "Metaspace")) {
        const cJSON *rep = cJSON_GetObjectItemCaseSensitive(p, "replacement"),
                    *ps = cJSON_GetObjectItemCaseSensitive(p, "prepend_scheme"),
                    *aps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space"),
                    *sp = cJSON_GetObjectItemCaseSensitive(p, "split");
        const char *r = cJSON_IsString(rep) ? rep->valuestring : "\xE2\x96\x81";
        if (!*r || strlen(r) >= sizeof t->meta_rep)
            return sl_fail(SL_ERR_FORMAT, "%s: pre_tokenizer Metaspace: bad replacement", path);
        snprintf(t->meta_rep, sizeof t->meta_rep, "%s", r);
        t->meta = 1;
        t->meta_split = !sp || cJSON_IsTrue(sp);
        t->meta_prepend = PREPEND_ALWAYS;
        if (cJSON_IsString(ps)) {
            const char *v = ps->valuestring;
            t->meta_prepend = !strcmp(v, "always")  ? PREPEND_ALWAYS
                              : !strcmp(v, "first") ? PREPEND_FIRST
                              : !strcmp(v, "never") ? PREPEND_NEVER
                                                    : -1;
            if (t->meta_prepend < 0)
                return sl_fail(SL_ERR_FORMAT,
                               "%s: pre_tokenizer Metaspace: prepend_scheme '%s' is not "
                               "always, first or never",
                               path, v);
        } else if (cJSON_IsFalse(aps)) {
            t->meta_prepend = PREPEND_NEVER;
        }
        return SL_OK;
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        if (!cJSON_IsString(rx))
            return sl_fail(SL_ERR_UNSUPPORTED,
                           "%s: pre_tokenizer Split: only {\"Regex\": ...} patterns are supported", path);
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0)
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: pre_tokenizer Split: behavior must be \"Isolated\"",
                           path);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "invert")))
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: pre_tokenizer Split: invert is not supported", path);
        return add_split(t, path, rx->valuestring);
    }
    return sl_fail(SL_ERR_UNSUPPORTED,
                   "%s: pre_tokenizer type '%s' is not supported (ByteLevel, Split, Metaspace, Sequence)",
                   path, ty);
}

static sl_status parse_post(sl_hf_tokenizer *t, const char *path, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return SL_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "?";
    if (!strcmp(ty, "ByteLevel")) return SL_OK; /* offsets only */
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e, *l = cJSON_GetObjectItemCaseSensitive(p, "processors");
        cJSON_ArrayForEach(e, l) SL_TRY(parse_post(t, path, e));
        return SL_OK;
    }
    if (strcmp(ty, "TemplateProcessing") != 0)
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: post_processor type '%s' is not supported", path, ty);
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single"),
                *sp = cJSON_GetObjectItemCaseSensitive(p, "special_tokens"), *e;
    int seen_seq = 0;
    cJSON_ArrayForEach(e, single) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        if (!s) {
            seen_seq = 1;
            continue;
        }
        const cJSON *idn = cJSON_GetObjectItemCaseSensitive(s, "id");
        const cJSON *ent =
            cJSON_IsString(idn) ? cJSON_GetObjectItemCaseSensitive(sp, idn->valuestring) : NULL;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(ent, "ids"), *x;
        if (!cJSON_IsArray(ids))
            return sl_fail(SL_ERR_FORMAT, "%s: post_processor: special token '%s' has no ids", path,
                           cJSON_IsString(idn) ? idn->valuestring : "?");
        cJSON_ArrayForEach(x, ids) {
            int *arr = seen_seq ? t->suffix : t->prefix, *n = seen_seq ? &t->n_suffix : &t->n_prefix;
            if (!cJSON_IsNumber(x) || *n >= 4)
                return sl_fail(SL_ERR_FORMAT, "%s: post_processor: bad special token ids", path);
            arr[(*n)++] = x->valueint;
        }
    }
    return SL_OK;
}

/* {"String": s} pattern of Replace; NULL (and a message) otherwise */
static const char *string_pattern(const char *path, const char *what, const cJSON *p, sl_status *st) {
    const cJSON *s =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "String");
    if (!cJSON_IsString(s) || !s->valuestring[0]) {
        *st = sl_fail(SL_ERR_UNSUPPORTED,
                      "%s: %s Replace: only non-empty {\"String\": ...} patterns are supported", path, what);
        return NULL;
    }
    return s->valuestring;
}

static sl_status add_step(step *arr, int *n, const char *path, const char *what, step s) {
    if (*n >= MAX_STEPS) {
        free(s.a);
        free(s.b);
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: %s: more than %d steps", path, what, MAX_STEPS);
    }
    if ((s.kind == NORM_PREPEND || s.kind == NORM_REPLACE || s.kind == DEC_REPLACE || s.kind == DEC_STRIP ||
         s.kind == DEC_METASPACE) &&
        (!s.a || ((s.kind == NORM_REPLACE || s.kind == DEC_REPLACE) && !s.b))) {
        free(s.a);
        free(s.b);
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    arr[(*n)++] = s;
    return SL_OK;
}

/* Note [Strings the encoder splices into the text]
 * The encoder validates the text as UTF-8 once and then runs the pre-tokenizer regexes with
 * PCRE2_NO_UTF_CHECK. Added tokens cut the text into segments and normalizers insert strings, so those
 * strings must be valid UTF-8 too: an added token whose content is a partial character (fuzz_tokenizer
 * found "\xbd\xa0..." cutting "\xe4\xbd\xa0" in two) leaves a segment ending inside a character, and PCRE2
 * then reads past the segment. Such files are refused at load. */
static sl_status utf8_field(const char *path, const char *what, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return sl_fail(SL_ERR_FORMAT, "%s: %s is not valid UTF-8 (byte %zu)", path, what, i);
        i += (size_t)k;
    }
    return SL_OK;
}

static sl_status parse_norm(sl_hf_tokenizer *t, const char *path, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return SL_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "?";
    sl_status st = SL_OK;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e, *l = cJSON_GetObjectItemCaseSensitive(p, "normalizers");
        cJSON_ArrayForEach(e, l) SL_TRY(parse_norm(t, path, e));
        return SL_OK;
    }
    if (!strcmp(ty, "NFC"))
        return add_step(t->norm, &t->n_norm, path, "normalizer", (step){NORM_NFC, 0, 0, 0, 0});
    if (!strcmp(ty, "NFKC"))
        return add_step(t->norm, &t->n_norm, path, "normalizer", (step){NORM_NFKC, 0, 0, 0, 0});
    if (!strcmp(ty, "Prepend")) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(p, "prepend");
        if (!cJSON_IsString(v))
            return sl_fail(SL_ERR_FORMAT, "%s: normalizer Prepend: missing 'prepend'", path);
        SL_TRY(utf8_field(path, "normalizer Prepend 'prepend'", v->valuestring));
        return add_step(t->norm, &t->n_norm, path, "normalizer",
                        (step){NORM_PREPEND, strdup(v->valuestring), 0, 0, 0});
    }
    if (!strcmp(ty, "Replace")) {
        const char *pat = string_pattern(path, "normalizer", p, &st);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(p, "content");
        if (!pat) return st;
        if (!cJSON_IsString(c))
            return sl_fail(SL_ERR_FORMAT, "%s: normalizer Replace: missing 'content'", path);
        SL_TRY(utf8_field(path, "normalizer Replace 'pattern'", pat));
        SL_TRY(utf8_field(path, "normalizer Replace 'content'", c->valuestring));
        return add_step(t->norm, &t->n_norm, path, "normalizer",
                        (step){NORM_REPLACE, strdup(pat), strdup(c->valuestring), 0, 0});
    }
    return sl_fail(SL_ERR_UNSUPPORTED,
                   "%s: normalizer '%s' is not supported (NFC, NFKC, Prepend, Replace, Sequence)", path, ty);
}

static sl_status parse_dec(sl_hf_tokenizer *t, const char *path, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return SL_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "?";
    sl_status st = SL_OK;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e, *l = cJSON_GetObjectItemCaseSensitive(p, "decoders");
        cJSON_ArrayForEach(e, l) SL_TRY(parse_dec(t, path, e));
        return SL_OK;
    }
    if (!strcmp(ty, "ByteLevel"))
        return add_step(t->dec, &t->n_dec, path, "decoder", (step){DEC_BYTELEVEL, 0, 0, 0, 0});
    if (!strcmp(ty, "ByteFallback"))
        return add_step(t->dec, &t->n_dec, path, "decoder", (step){DEC_BYTEFALLBACK, 0, 0, 0, 0});
    if (!strcmp(ty, "Fuse"))
        return add_step(t->dec, &t->n_dec, path, "decoder", (step){DEC_FUSE, 0, 0, 0, 0});
    if (!strcmp(ty, "Replace")) {
        const char *pat = string_pattern(path, "decoder", p, &st);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(p, "content");
        if (!pat) return st;
        if (!cJSON_IsString(c)) return sl_fail(SL_ERR_FORMAT, "%s: decoder Replace: missing 'content'", path);
        return add_step(t->dec, &t->n_dec, path, "decoder",
                        (step){DEC_REPLACE, strdup(pat), strdup(c->valuestring), 0, 0});
    }
    if (!strcmp(ty, "Strip")) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(p, "content"),
                    *a = cJSON_GetObjectItemCaseSensitive(p, "start"),
                    *b = cJSON_GetObjectItemCaseSensitive(p, "stop");
        if (!cJSON_IsString(c) || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valuedouble < 0 ||
            b->valuedouble < 0 || a->valuedouble > 1e6 || b->valuedouble > 1e6)
            return sl_fail(SL_ERR_FORMAT, "%s: decoder Strip needs 'content', 'start' and 'stop'", path);
        return add_step(t->dec, &t->n_dec, path, "decoder",
                        (step){DEC_STRIP, strdup(c->valuestring), 0, a->valueint, b->valueint});
    }
    if (!strcmp(ty, "Metaspace")) {
        const cJSON *rep = cJSON_GetObjectItemCaseSensitive(p, "replacement"),
                    *ps = cJSON_GetObjectItemCaseSensitive(p, "prepend_scheme"),
                    *aps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space");
        int never = (cJSON_IsString(ps) && !strcmp(ps->valuestring, "never")) || cJSON_IsFalse(aps);
        return add_step(t->dec, &t->n_dec, path, "decoder",
                        (step){DEC_METASPACE, strdup(cJSON_IsString(rep) ? rep->valuestring : "\xE2\x96\x81"),
                               0, never ? PREPEND_NEVER : PREPEND_ALWAYS, 0});
    }
    return sl_fail(
        SL_ERR_UNSUPPORTED,
        "%s: decoder '%s' is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace)", path,
        ty);
}

static int cmp_added_len(const void *a, const void *b) {
    const added_tok *x = a, *y = b;
    size_t lx = strlen(x->content), ly = strlen(y->content);
    return lx == ly ? x->id - y->id : (lx < ly ? 1 : -1);
}

static sl_status parse(sl_hf_tokenizer *t, const char *path, const cJSON *r) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(r, "model");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(model)) return sl_fail(SL_ERR_FORMAT, "%s: missing field 'model'", path);
    if (mt && (!cJSON_IsString(mt) || strcmp(mt->valuestring, "BPE") != 0))
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (BPE only)", path,
                       cJSON_IsString(mt) ? mt->valuestring : "?");
    t->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    t->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"));
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix"),
                *ew = cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix"),
                *dr = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if ((cJSON_IsString(cs) && cs->valuestring[0]) || (cJSON_IsString(ew) && ew->valuestring[0]))
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "%s: model.continuing_subword_prefix / end_of_word_suffix are not supported", path);
    if (cJSON_IsNumber(dr) && dr->valuedouble > 0)
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: model.dropout is not supported (deterministic encoding only)",
                       path);
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"),
                *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(r, "added_tokens"), *e;
    if (!cJSON_IsObject(vocab)) return sl_fail(SL_ERR_FORMAT, "%s: missing field 'model.vocab'", path);
    if (!cJSON_IsArray(merges)) return sl_fail(SL_ERR_FORMAT, "%s: missing field 'model.merges'", path);
    int nv = cJSON_GetArraySize(vocab), na = cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0;
    if (!strmap_init(&t->vocab, (size_t)nv) || !pairmap_init(&t->merges, (size_t)cJSON_GetArraySize(merges)))
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    int maxid = -1;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (1 << 24) ||
            e->valuedouble != (int)e->valuedouble)
            return sl_fail(SL_ERR_FORMAT, "%s: model.vocab['%s'] must be an id in [0, 2^24)", path,
                           e->string);
        if (!strmap_put(&t->vocab, e->string, e->valueint))
            return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        if (e->valueint > maxid) maxid = e->valueint;
    }
    t->added = calloc((size_t)(na ? na : 1), sizeof(added_tok));
    if (!t->added) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id"),
                    *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 24) ||
            !cJSON_IsString(c) || !c->valuestring[0])
            return sl_fail(SL_ERR_FORMAT, "%s: added_tokens entry %d needs an 'id' and a non-empty 'content'",
                           path, t->n_added);
        /* Note [Strings the encoder splices into the text] */
        SL_TRY(utf8_field(path, "an added token's 'content'", c->valuestring));
        added_tok *a = &t->added[t->n_added++];
        a->content = strdup(c->valuestring);
        a->id = id->valueint;
        a->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
        if (!a->content) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        if (a->id > maxid) maxid = a->id;
    }
    qsort(t->added, (size_t)t->n_added, sizeof(added_tok), cmp_added_len);
    t->n_ids = maxid + 1;
    t->id_tok = calloc((size_t)(t->n_ids ? t->n_ids : 1), sizeof(char *));
    if (!t->id_tok) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < t->vocab.cap; i++)
        if (t->vocab.keys[i]) t->id_tok[t->vocab.vals[i]] = t->vocab.keys[i];
    for (int i = 0; i < t->n_added; i++) t->id_tok[t->added[i].id] = t->added[i].content;
    int rank = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *a = NULL, *b = NULL;
        char buf[512];
        if (cJSON_IsString(e)) { /* "a b" */
            const char *sp = strchr(e->valuestring, ' ');
            size_t la = sp ? (size_t)(sp - e->valuestring) : 0;
            if (!sp || la >= sizeof buf)
                return sl_fail(SL_ERR_FORMAT, "%s: model.merges[%d] must be \"a b\"", path, rank);
            memcpy(buf, e->valuestring, la);
            buf[la] = 0;
            a = buf;
            b = sp + 1;
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 0)) && cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring;
            b = cJSON_GetArrayItem(e, 1)->valuestring;
        } else {
            return sl_fail(SL_ERR_FORMAT, "%s: model.merges[%d] must be \"a b\" or [a, b]", path, rank);
        }
        int ia = strmap_get(&t->vocab, a, strlen(a)), ib = strmap_get(&t->vocab, b, strlen(b));
        size_t la = strlen(a), lb = strlen(b);
        char *ab = malloc(la + lb + 1);
        if (!ab) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        memcpy(ab, a, la);
        memcpy(ab + la, b, lb + 1);
        int im = strmap_get(&t->vocab, ab, la + lb);
        free(ab);
        if (ia < 0 || ib < 0 || im < 0)
            return sl_fail(SL_ERR_FORMAT,
                           "%s: model.merges[%d] ('%s' '%s') uses a token missing from the vocab", path, rank,
                           a, b);
        size_t s = pair_slot(&t->merges, pair_key(ia, ib));
        if (!t->merges.keys[s]) { /* first occurrence wins */
            t->merges.keys[s] = pair_key(ia, ib);
            t->merges.rank[s] = rank;
            t->merges.merged[s] = im;
        }
        rank++;
    }
    SL_TRY(parse_norm(t, path, cJSON_GetObjectItemCaseSensitive(r, "normalizer")));
    SL_TRY(parse_pretok(t, path, cJSON_GetObjectItemCaseSensitive(r, "pre_tokenizer")));
    SL_TRY(parse_dec(t, path, cJSON_GetObjectItemCaseSensitive(r, "decoder")));
    if (t->byte_level && !t->n_dec) t->dec[t->n_dec++] = (step){DEC_BYTELEVEL, 0, 0, 0, 0};
    for (int i = 0; i < t->n_dec; i++)
        if ((t->dec[i].kind == DEC_BYTELEVEL) != t->byte_level)
            return sl_fail(SL_ERR_UNSUPPORTED,
                           t->byte_level
                               ? "%s: decoder: a ByteLevel pre-tokenizer needs the ByteLevel decoder"
                               : "%s: decoder: ByteLevel without a ByteLevel pre-tokenizer",
                           path);
    if (t->byte_level) {
        if (t->meta)
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: pre_tokenizer: Metaspace together with ByteLevel", path);
        for (int b = 0; b < 256; b++)
            if (strmap_get(&t->vocab, t->byte_str[b], strlen(t->byte_str[b])) < 0)
                return sl_fail(SL_ERR_FORMAT, "%s: model.vocab lacks the byte-level symbol for byte 0x%02x",
                               path, b);
    } else {
        if (t->n_split)
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: pre_tokenizer Split without ByteLevel is not supported",
                           path);
        for (int b = 0; b < 256; b++) {
            char bt[8];
            snprintf(bt, sizeof bt, "<0x%02X>", b);
            t->byte_tok[b] = strmap_get(&t->vocab, bt, 6);
            if (t->byte_fallback && t->byte_tok[b] < 0)
                return sl_fail(SL_ERR_FORMAT, "%s: model.byte_fallback is set but model.vocab lacks '%s'",
                               path, bt);
        }
        const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
        t->unk_id =
            cJSON_IsString(unk) ? strmap_get(&t->vocab, unk->valuestring, strlen(unk->valuestring)) : -1;
        if (cJSON_IsString(unk) && t->unk_id < 0)
            return sl_fail(SL_ERR_FORMAT, "%s: model.unk_token '%s' is not in model.vocab", path,
                           unk->valuestring);
    }
    return parse_post(t, path, cJSON_GetObjectItemCaseSensitive(r, "post_processor"));
}

sl_status sl_hf_tokenizer_load(const char *path, sl_hf_tokenizer **out) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    SL_TRY(sl_file_read_all(path, &text, &len));
    size_t lead = 0;
    while (lead < len &&
           (text[lead] == ' ' || text[lead] == '\n' || text[lead] == '\r' || text[lead] == '\t'))
        lead++;
    size_t pl = strlen(path);
    int json_name = pl >= 5 && !strcmp(path + pl - 5, ".json");
    if (len && !json_name &&
        (lead == len || (text[lead] != '{' && text[lead] != '['))) { /* tokenizer.model */
        sl_hf_tokenizer *t = calloc(1, sizeof *t);
        sl_status st = t ? sl__sp_parse((const uint8_t *)text, len, path, &t->sp)
                         : sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        free(text);
        if (st == SL_OK) {
            t->n_ids = t->sp->n;
            if (!(t->id_tok = malloc(sizeof(char *) * (size_t)t->n_ids)))
                st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
            for (int i = 0; st == SL_OK && i < t->n_ids; i++) t->id_tok[i] = t->sp->piece[i];
        }
        if (st != SL_OK) {
            sl_hf_tokenizer_free(t);
            return st;
        }
        *out = t;
        return SL_OK;
    }
    cJSON *r = cJSON_ParseWithLength(text, len);
    free(text);
    if (!r || !cJSON_IsObject(r)) {
        cJSON_Delete(r);
        return sl_fail(SL_ERR_FORMAT, "%s: not a JSON object", path);
    }
    sl_hf_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(r);
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    byte_tables(t);
    sl_status st = parse(t, path, r);
    cJSON_Delete(r);
    if (st != SL_OK) {
        sl_hf_tokenizer_free(t);
        return st;
    }
    *out = t;
    return SL_OK;
}

/* ---------------- encoding ---------------- */

typedef struct {
    int32_t *ids;
    int n, cap;
} idvec;

static int push(idvec *v, int32_t id) {
    if (v->n == v->cap) {
        int nc = v->cap ? 2 * v->cap : 64;
        int32_t *p = realloc(v->ids, sizeof(int32_t) * (size_t)nc);
        if (!p) return 0;
        v->ids = p;
        v->cap = nc;
    }
    v->ids[v->n++] = id;
    return 1;
}

/* BPE over one pre-token (raw bytes) */
static sl_status bpe(const sl_hf_tokenizer *t, const unsigned char *s, size_t n, idvec *out) {
    if (!n) return SL_OK;
    char *mapped = malloc(4 * n + 1);
    int *sym = malloc(sizeof(int) * n);
    if (!mapped || !sym) {
        free(mapped);
        free(sym);
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t ml = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = strlen(t->byte_str[s[i]]);
        memcpy(mapped + ml, t->byte_str[s[i]], k);
        ml += k;
        sym[i] = strmap_get(&t->vocab, t->byte_str[s[i]], k);
    }
    int whole = t->ignore_merges ? strmap_get(&t->vocab, mapped, ml) : -1;
    size_t ns = n;
    sl_status st = SL_OK;
    if (whole >= 0) {
        sym[0] = whole;
        ns = 1;
    } else {
        for (;;) { /* merge the lowest-ranked adjacent pair (leftmost on ties) */
            int best = -1, brank = 0, bm = 0;
            for (size_t i = 0; i + 1 < ns; i++) {
                size_t slot = pair_slot(&t->merges, pair_key(sym[i], sym[i + 1]));
                if (t->merges.keys[slot] && (best < 0 || t->merges.rank[slot] < brank)) {
                    best = (int)i;
                    brank = t->merges.rank[slot];
                    bm = t->merges.merged[slot];
                }
            }
            if (best < 0) break;
            sym[best] = bm;
            memmove(sym + best + 1, sym + best + 2, sizeof(int) * (ns - (size_t)best - 2));
            ns--;
        }
    }
    for (size_t i = 0; i < ns && st == SL_OK; i++)
        if (!push(out, sym[i])) st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    free(mapped);
    free(sym);
    return st;
}

/* apply split stage `k` to [s, s+n); pieces go to the next stage, the last stage runs BPE */
static sl_status pretok(const sl_hf_tokenizer *t, int k, const unsigned char *s, size_t n, idvec *out,
                        pcre2_match_data *md) {
    if (k == t->n_split) return bpe(t, s, n, out);
    size_t pos = 0, gap = 0;
    while (pos <= n) {
        int rc = pcre2_match(t->split[k], (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return sl_fail(SL_ERR_INTERNAL, "tokenizer: regex match failed (%d)", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (b == a) { /* empty match: step one UTF-8 character */
            size_t nx = a + 1;
            while (nx < n && (s[nx] & 0xC0) == 0x80) nx++;
            pos = nx;
            if (a >= n) break;
            continue;
        }
        if (a > gap) SL_TRY(pretok(t, k + 1, s + gap, a - gap, out, md));
        SL_TRY(pretok(t, k + 1, s + a, b - a, out, md));
        gap = pos = b;
    }
    if (gap < n) SL_TRY(pretok(t, k + 1, s + gap, n - gap, out, md));
    return SL_OK;
}

/* normalizer steps over [s, s+n): *out malloc'd (NUL-terminated) */
static sl_status normalize(const sl_hf_tokenizer *t, const char *s, size_t n, char **out, size_t *len) {
    char *cur = malloc(n + 1);
    if (!cur) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(cur, s, n);
    cur[n] = 0;
    size_t cl = n;
    for (int k = 0; k < t->n_norm; k++) {
        const step *st = &t->norm[k];
        char *nx = NULL;
        size_t nl = 0;
        if (st->kind == NORM_NFC || st->kind == NORM_NFKC) {
            utf8proc_uint8_t *m = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)cl, &m,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE |
                                                  (st->kind == NORM_NFKC ? UTF8PROC_COMPAT : 0));
            if (r < 0) {
                free(cur);
                return sl_fail(SL_ERR_INVALID, "tokenizer: text is not valid UTF-8 (%s)", utf8proc_errmsg(r));
            }
            nx = (char *)m;
            nl = (size_t)r;
        } else if (st->kind == NORM_PREPEND) {
            if (!cl) continue;
            size_t pl = strlen(st->a);
            if ((nx = malloc(pl + cl + 1))) {
                memcpy(nx, st->a, pl);
                memcpy(nx + pl, cur, cl + 1);
                nl = pl + cl;
            }
        } else { /* NORM_REPLACE */
            size_t pl = strlen(st->a), rl = strlen(st->b), cnt = 0;
            for (const char *q = cur; (q = strstr(q, st->a)); q += pl) cnt++;
            if ((nx = malloc(cl + cnt * rl + 1))) {
                const char *q = cur, *h;
                while ((h = strstr(q, st->a))) {
                    memcpy(nx + nl, q, (size_t)(h - q));
                    nl += (size_t)(h - q);
                    memcpy(nx + nl, st->b, rl);
                    nl += rl;
                    q = h + pl;
                }
                memcpy(nx + nl, q, cl - (size_t)(q - cur) + 1);
                nl += cl - (size_t)(q - cur);
            }
        }
        free(cur);
        if (!nx) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        cur = nx;
        cl = nl;
    }
    *out = cur;
    *len = cl;
    return SL_OK;
}

typedef struct {
    const sl_hf_tokenizer *t;
} hf_ctx;

static int hf_pair(const void *ctx, const sl__bpe_sym *a, const sl__bpe_sym *b, double *prio,
                   int32_t *merged) {
    const sl_hf_tokenizer *t = ((const hf_ctx *)ctx)->t;
    if (a->id < 0 || b->id < 0) return 0;
    size_t slot = pair_slot(&t->merges, pair_key(a->id, b->id));
    if (!t->merges.keys[slot]) return 0;
    *prio = t->merges.rank[slot];
    *merged = t->merges.merged[slot];
    return 1;
}

/* BPE over U+2581 pieces with byte fallback and fused unknowns (`tokenizers` BPE::merge_word) */
static sl_status bpe_chars(const sl_hf_tokenizer *t, const char *s, size_t n, idvec *out) {
    if (!n) return SL_OK;
    int whole = t->ignore_merges ? strmap_get(&t->vocab, s, n) : -1;
    if (whole >= 0) return push(out, whole) ? SL_OK : sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    sl__bpe_sym *sym = malloc(sizeof *sym * n * 1);
    if (!sym) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    int ns = 0, unk_open = 0;
    sl_status st = SL_OK;
    for (size_t i = 0; i < n && st == SL_OK;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        size_t cl = k > 0 ? (size_t)k : 1;
        int id = strmap_get(&t->vocab, s + i, cl);
        if (id >= 0) {
            sym[ns] = (sl__bpe_sym){id, (uint32_t)i, (uint32_t)cl, ns - 1, -1, -1, 0};
            ns++;
            unk_open = 0;
        } else if (t->byte_fallback) {
            for (size_t b = 0; b < cl; b++, ns++)
                sym[ns] = (sl__bpe_sym){
                    t->byte_tok[(unsigned char)s[i + b]], (uint32_t)(i + b), 1, ns - 1, -1, -1, 0};
            unk_open = 0;
        } else if (t->unk_id >= 0) {
            if (unk_open && t->fuse_unk) {
                sym[ns - 1].len += (uint32_t)cl;
            } else {
                sym[ns] = (sl__bpe_sym){t->unk_id, (uint32_t)i, (uint32_t)cl, ns - 1, -1, -1, 0};
                ns++;
            }
            unk_open = 1;
        } else {
            st = sl_fail(SL_ERR_INVALID,
                         "tokenizer: character at byte %zu is not in the vocabulary and the model "
                         "has no unk_token",
                         i);
        }
        i += cl;
    }
    for (int i = 0; i < ns; i++) sym[i].next = i + 1 < ns ? i + 1 : -1;
    hf_ctx c = {t};
    if (st == SL_OK) st = sl__bpe_merge(sym, ns, hf_pair, &c, NULL);
    for (int i = 0; st == SL_OK && ns && i >= 0; i = sym[i].next)
        if (!push(out, sym[i].id)) st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    free(sym);
    return st;
}

/* Metaspace: ' ' -> replacement, prepend by scheme, split before each replacement (MergedWithNext) */
static sl_status metaspace(const sl_hf_tokenizer *t, const char *s, size_t n, int first, idvec *out) {
    const char *rep = t->meta_rep;
    size_t rl = strlen(rep), cnt = 0;
    for (size_t i = 0; i < n; i++) cnt += s[i] == ' ';
    char *b = malloc(n + (cnt + 1) * rl + 1);
    if (!b) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    size_t bl = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(b + bl, rep, rl);
            bl += rl;
        } else {
            b[bl++] = s[i];
        }
    }
    int starts = bl >= rl && !memcmp(b, rep, rl);
    if (!starts && (t->meta_prepend == PREPEND_ALWAYS || (t->meta_prepend == PREPEND_FIRST && first))) {
        memmove(b + rl, b, bl);
        memcpy(b, rep, rl);
        bl += rl;
    }
    sl_status st = SL_OK;
    size_t w = 0;
    for (size_t i = 1; t->meta_split && i + rl <= bl && st == SL_OK; i++)
        if (!memcmp(b + i, rep, rl)) {
            st = bpe_chars(t, b + w, i - w, out);
            w = i;
        }
    if (st == SL_OK) st = bpe_chars(t, b + w, bl - w, out);
    free(b);
    return st;
}

static sl_status encode_segment(const sl_hf_tokenizer *t, const char *s, size_t n, int first, idvec *out,
                                pcre2_match_data *md) {
    if (!n) return SL_OK;
    char *norm = NULL;
    size_t len = 0;
    SL_TRY(normalize(t, s, n, &norm, &len));
    const unsigned char *p = (const unsigned char *)norm;
    sl_status st = SL_OK;
    unsigned char *tmp = NULL;
    if (!t->byte_level) {
        st = t->meta ? metaspace(t, norm, len, first, out) : bpe_chars(t, norm, len, out);
        free(norm);
        return st;
    }
    if (t->add_prefix_space && first && len && p[0] != ' ') {
        tmp = malloc(len + 1);
        if (!tmp)
            st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        else {
            tmp[0] = ' ';
            memcpy(tmp + 1, p, len);
            p = tmp;
            len++;
        }
    }
    if (st == SL_OK) st = pretok(t, 0, p, len, out, md);
    free(tmp);
    free(norm);
    return st;
}

sl_status sl_hf_tokenizer_encode(const sl_hf_tokenizer *t, const char *text, int add_special, int32_t **ids,
                                 int *n) {
    return sl__hf_tokenizer_encode_n(t, text, strlen(text), add_special, ids, n);
}

sl_status sl__hf_tokenizer_encode_n(const sl_hf_tokenizer *t, const char *text, size_t len, int add_special,
                                    int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    /* the regex engine runs in UTF mode without re-checking: reject invalid input up front */
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0) return sl_fail(SL_ERR_INVALID, "tokenizer: text is not valid UTF-8 (byte offset %zu)", i);
        i += (size_t)k;
    }
    idvec v = {0};
    sl_status st = SL_OK;
    if (t->sp) {
        if (add_special && t->sp->bos_id >= 0 && !push(&v, t->sp->bos_id))
            return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        st = sl__sp_encode(t->sp, text, len, &v.ids, &v.n, &v.cap);
        if (st != SL_OK) {
            free(v.ids);
            return st;
        }
        if (!v.ids) v.ids = malloc(sizeof(int32_t));
        if (!v.ids) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        *ids = v.ids;
        *n = v.n;
        return SL_OK;
    }
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    if (!md) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    if (add_special)
        for (int i = 0; i < t->n_prefix && st == SL_OK; i++)
            if (!push(&v, t->prefix[i])) st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    size_t seg = 0, i = 0;
    int first = 1;
    while (st == SL_OK && i < len) {
        int hit = -1;
        for (int a = 0; a < t->n_added && hit < 0; a++) {
            size_t al = strlen(t->added[a].content);
            if (al <= len - i && !memcmp(text + i, t->added[a].content, al)) hit = a;
        }
        if (hit < 0) {
            i++;
            continue;
        }
        st = encode_segment(t, text + seg, i - seg, first, &v, md);
        first = 0;
        if (st == SL_OK && !push(&v, t->added[hit].id))
            st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        i += strlen(t->added[hit].content);
        seg = i;
    }
    if (st == SL_OK) st = encode_segment(t, text + seg, len - seg, first, &v, md);
    if (add_special)
        for (int k = 0; k < t->n_suffix && st == SL_OK; k++)
            if (!push(&v, t->suffix[k])) st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    pcre2_match_data_free(md);
    if (st != SL_OK) {
        free(v.ids);
        return st;
    }
    if (!v.ids) v.ids = malloc(sizeof(int32_t));
    *ids = v.ids;
    *n = v.n;
    return SL_OK;
}

static int is_added(const sl_hf_tokenizer *t, int32_t id, int *special) {
    for (int a = 0; a < t->n_added; a++)
        if (t->added[a].id == id) {
            if (special) *special = t->added[a].special;
            return 1;
        }
    return 0;
}

/* <0xNN> -> NN, else -1 */
static int byte_token(const char *s) {
    unsigned v;
    char c[8];
    if (strlen(s) != 6 || sscanf(s, "<0x%2X", &v) != 1) return -1;
    snprintf(c, sizeof c, "<0x%02X>", v);
    return strcmp(c, s) ? -1 : (int)v;
}

int sl_hf_tokenizer_decode_one(const sl_hf_tokenizer *t, int32_t id, char *buf, int cap) {
    if (t->sp) return sl__sp_decode_one(t->sp, id, buf, cap);
    if (id < 0 || id >= t->n_ids || !t->id_tok[id]) return -1;
    const char *s = t->id_tok[id];
    if (cap <= 0) return 0;
    if (is_added(t, id, NULL)) {
        int l = (int)strlen(s);
        if (l > cap) l = cap;
        memcpy(buf, s, (size_t)l);
        return l;
    }
    if (!t->byte_level) { /* U+2581 pieces: the byte of <0xNN>, else the piece with the replacement as ' ' */
        int b = t->byte_fallback ? byte_token(s) : -1;
        if (b >= 0) {
            buf[0] = (char)b;
            return 1;
        }
        const char *rep = t->meta ? t->meta_rep : "\xE2\x96\x81";
        size_t rl = strlen(rep), n = strlen(s);
        int w = 0;
        for (size_t i = 0; i < n && w < cap;) {
            if (n - i >= rl && !memcmp(s + i, rep, rl)) {
                buf[w++] = ' ';
                i += rl;
            } else {
                buf[w++] = s[i++];
            }
        }
        return w;
    }
    int n = 0;
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    utf8proc_ssize_t len = (utf8proc_ssize_t)strlen(s);
    while (len > 0 && n < cap) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p, len, &cp);
        if (k <= 0) break;
        if (cp >= 0 && cp < 512 && t->cp_byte[cp] >= 0) buf[n++] = (char)t->cp_byte[cp];
        p += k;
        len -= k;
    }
    return n;
}

/* ---------------- sequence decoding ---------------- */

typedef struct {
    char **s;
    int n;
} strvec;

static void sv_free(strvec *v) {
    for (int i = 0; i < v->n; i++) free(v->s[i]);
    free(v->s);
}

/* replace every occurrence of a by b in *s */
static int str_replace(char **s, const char *a, const char *b) {
    size_t al = strlen(a), bl = strlen(b), cnt = 0, n = strlen(*s);
    for (const char *q = *s; (q = strstr(q, a)); q += al) cnt++;
    if (!cnt) return 1;
    char *r = malloc(n + cnt * bl + 1), *w = r;
    if (!r) return 0;
    const char *q = *s, *h;
    while ((h = strstr(q, a))) {
        memcpy(w, q, (size_t)(h - q));
        w += h - q;
        memcpy(w, b, bl);
        w += bl;
        q = h + al;
    }
    strcpy(w, q);
    free(*s);
    *s = r;
    return 1;
}

static int dec_step(const sl_hf_tokenizer *t, const step *d, strvec *v) {
    if (d->kind == DEC_REPLACE) {
        for (int i = 0; i < v->n; i++)
            if (!str_replace(&v->s[i], d->a, d->b)) return 0;
    } else if (d->kind == DEC_BYTELEVEL) {
        for (int i = 0; i < v->n; i++) {
            const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)v->s[i];
            utf8proc_ssize_t len = (utf8proc_ssize_t)strlen(v->s[i]);
            char *o = malloc((size_t)len + 1);
            size_t k = 0;
            if (!o) return 0;
            while (len > 0) {
                utf8proc_int32_t cp;
                utf8proc_ssize_t c = utf8proc_iterate(p, len, &cp);
                if (c <= 0) break;
                if (cp >= 0 && cp < 512 && t->cp_byte[cp] >= 0) o[k++] = (char)t->cp_byte[cp];
                p += c;
                len -= c;
            }
            o[k] = 0;
            free(v->s[i]);
            v->s[i] = o;
        }
    } else if (d->kind ==
               DEC_BYTEFALLBACK) { /* runs of <0xNN>: one string if valid UTF-8, else U+FFFD each */
        int w = 0;
        for (int i = 0; i < v->n;) {
            if (byte_token(v->s[i]) < 0) {
                v->s[w++] = v->s[i++];
                continue;
            }
            int j = i;
            while (j < v->n && byte_token(v->s[j]) >= 0) j++;
            char *b = malloc((size_t)(j - i) * 3 + 1);
            if (!b) return 0;
            for (int k = i; k < j; k++) b[k - i] = (char)byte_token(v->s[k]);
            b[j - i] = 0;
            int valid = utf8proc_decompose((const utf8proc_uint8_t *)b, j - i, NULL, 0, 0) >= 0 &&
                        (int)strlen(b) == j - i;
            for (int k = i; k < j; k++) free(v->s[k]);
            if (valid) {
                v->s[w++] = b;
            } else {
                free(b);
                for (int k = i; k < j; k++) v->s[w++] = strdup("\xEF\xBF\xBD");
            }
            i = j;
        }
        v->n = w;
        for (int i = 0; i < w; i++)
            if (!v->s[i]) return 0;
    } else if (d->kind == DEC_FUSE) {
        size_t tot = 0;
        for (int i = 0; i < v->n; i++) tot += strlen(v->s[i]);
        char *f = malloc(tot + 1), *w = f;
        if (!f) return 0;
        for (int i = 0; i < v->n; i++) {
            size_t l = strlen(v->s[i]);
            memcpy(w, v->s[i], l);
            w += l;
            free(v->s[i]);
        }
        *w = 0;
        v->s[0] = f;
        v->n = 1;
    } else if (d->kind == DEC_STRIP) {
        size_t cl = strlen(d->a);
        for (int i = 0; i < v->n && cl; i++) {
            char *x = v->s[i];
            size_t n = strlen(x), a = 0;
            for (int k = 0; k < d->start && n - a >= cl && !memcmp(x + a, d->a, cl); k++) a += cl;
            for (int k = 0; k < d->stop && n - a >= cl && !memcmp(x + n - cl, d->a, cl); k++) n -= cl;
            memmove(x, x + a, n - a);
            x[n - a] = 0;
        }
    } else { /* DEC_METASPACE: replacement -> ' ', dropped altogether in the first token */
        for (int i = 0; i < v->n; i++)
            if (!str_replace(&v->s[i], d->a, i == 0 && d->start != PREPEND_NEVER ? "" : " ")) return 0;
    }
    return 1;
}

sl_status sl_hf_tokenizer_decode(const sl_hf_tokenizer *t, const int32_t *ids, int n, int skip_special,
                                 char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (t->sp) return sl__sp_decode(t->sp, ids, n, out, len);
    strvec v = {calloc((size_t)(n > 0 ? n : 1), sizeof(char *)), 0};
    if (!v.s) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    for (int i = 0; i < n; i++) {
        int special = 0;
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->id_tok[ids[i]]) {
            sv_free(&v);
            return sl_fail(SL_ERR_INVALID, "tokenizer: id %d is not in the vocabulary", ids[i]);
        }
        if (is_added(t, ids[i], &special) && special && skip_special) continue;
        if (!(v.s[v.n++] = strdup(t->id_tok[ids[i]]))) {
            sv_free(&v);
            return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        }
    }
    /* added tokens are emitted verbatim by tokenizers' decoders too: only the model's tokens decode */
    int ok = 1;
    for (int k = 0; k < t->n_dec && ok && v.n; k++) ok = dec_step(t, &t->dec[k], &v);
    size_t tot = 0;
    for (int i = 0; ok && i < v.n; i++) tot += strlen(v.s[i]);
    char *r = ok ? malloc(tot + 1) : NULL;
    if (r) {
        size_t w = 0;
        for (int i = 0; i < v.n; i++) {
            size_t l = strlen(v.s[i]);
            memcpy(r + w, v.s[i], l);
            w += l;
        }
        r[w] = 0;
        *out = r;
        *len = w;
    }
    sv_free(&v);
    return r ? SL_OK : sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
}

int sl_hf_tokenizer_vocab_size(const sl_hf_tokenizer *t) { return t->n_ids; }

const char *sl__hf_tokenizer_piece(const sl_hf_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->id_tok[id] : NULL;
}

int sl__hf_tokenizer_is_model(const sl_hf_tokenizer *t) { return t->sp != NULL; }

int sl_hf_tokenizer_token_id(const sl_hf_tokenizer *t, const char *tok) {
    if (t->sp) {
        int id = sl__sp_piece_to_id(t->sp, tok, strlen(tok));
        return id == t->sp->unk_id && strcmp(t->sp->piece[id], tok) ? -1 : id;
    }
    for (int a = 0; a < t->n_added; a++)
        if (!strcmp(t->added[a].content, tok)) return t->added[a].id;
    return strmap_get(&t->vocab, tok, strlen(tok));
}
