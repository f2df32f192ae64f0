/* tokenizer.json (HF `tokenizers`) for byte-level BPE: GPT-2, Llama-3 and Qwen2 style.
 *
 * Pipeline (as in `tokenizers`): split the text on added tokens (matched verbatim, longest first) ->
 * normalizer (none or NFC via utf8proc) -> pre-tokenizer (Split with a regex, behavior Isolated, and/or
 * ByteLevel with GPT-2's regex; compiled with PCRE2 in UTF+UCP mode) -> bytes mapped to GPT-2's
 * printable code points -> BPE by merge rank (ignore_merges: a piece found whole in the vocabulary
 * is one token) -> post-processor (TemplateProcessing: special tokens around the sequence).
 * Anything else in the file (another model type, normalizer, pre-tokenizer or behavior) is refused with
 * a one-line error naming the field, rather than tokenized differently. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <string.h>
#include <utf8proc.h>

#include "suanli/data.h"

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

struct sl_hf_tokenizer {
    strmap vocab;  /* byte-level token string -> id */
    char **id_tok; /* id -> token string (borrowed from vocab keys or added) */
    int n_ids;     /* max id + 1 */
    pairmap merges;
    int ignore_merges, nfc, byte_level, add_prefix_space;
    pcre2_code *split[MAX_SPLITS];
    int n_split;
    added_tok *added;
    int n_added;
    int prefix[4], n_prefix, suffix[4], n_suffix; /* TemplateProcessing ids */
    char byte_str[256][4];                        /* byte -> UTF-8 of its printable code point */
    int cp_byte[512];                             /* code point -> byte (-1 if none) */
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
    return sl_fail(
        SL_ERR_UNSUPPORTED,
        "%s: pre_tokenizer type '%s' is not supported (byte-level BPE: ByteLevel, Split, Sequence)", path,
        ty);
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
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "%s: model.byte_fallback (SentencePiece-style BPE) is not supported", path);
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
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(r, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const cJSON *nt = cJSON_GetObjectItemCaseSensitive(norm, "type");
        const cJSON *one = norm;
        if (cJSON_IsString(nt) && !strcmp(nt->valuestring, "Sequence")) {
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
            one = cJSON_GetArraySize(l) == 1 ? cJSON_GetArrayItem(l, 0) : NULL;
            nt = cJSON_GetObjectItemCaseSensitive(one, "type");
            if (cJSON_GetArraySize(l) == 0) nt = NULL, one = NULL;
        }
        if (one) {
            if (!cJSON_IsString(nt) || strcmp(nt->valuestring, "NFC") != 0)
                return sl_fail(SL_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported (none or NFC)", path,
                               cJSON_IsString(nt) ? nt->valuestring : "?");
            t->nfc = 1;
        }
    }
    SL_TRY(parse_pretok(t, path, cJSON_GetObjectItemCaseSensitive(r, "pre_tokenizer")));
    if (!t->byte_level)
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "%s: pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)", path);
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(r, "decoder"),
                *dt = cJSON_GetObjectItemCaseSensitive(dec, "type");
    if (dec && !cJSON_IsNull(dec) && (!cJSON_IsString(dt) || strcmp(dt->valuestring, "ByteLevel") != 0))
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: decoder '%s' is not supported (ByteLevel)", path,
                       cJSON_IsString(dt) ? dt->valuestring : "?");
    for (int b = 0; b < 256; b++)
        if (strmap_get(&t->vocab, t->byte_str[b], strlen(t->byte_str[b])) < 0)
            return sl_fail(SL_ERR_FORMAT, "%s: model.vocab lacks the byte-level symbol for byte 0x%02x", path,
                           b);
    return parse_post(t, path, cJSON_GetObjectItemCaseSensitive(r, "post_processor"));
}

sl_status sl_hf_tokenizer_load(const char *path, sl_hf_tokenizer **out) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    SL_TRY(sl_file_read_all(path, &text, &len));
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

static sl_status encode_segment(const sl_hf_tokenizer *t, const char *s, size_t n, int first, idvec *out,
                                pcre2_match_data *md) {
    if (!n) return SL_OK;
    unsigned char *norm = NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t len = n;
    if (t->nfc) {
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &norm,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0)
            return sl_fail(SL_ERR_INVALID, "tokenizer: text is not valid UTF-8 (%s)", utf8proc_errmsg(r));
        p = norm;
        len = (size_t)r;
    }
    sl_status st = SL_OK;
    unsigned char *tmp = NULL;
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
    *ids = NULL;
    *n = 0;
    size_t len = strlen(text);
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

int sl_hf_tokenizer_decode_one(const sl_hf_tokenizer *t, int32_t id, char *buf, int cap) {
    if (id < 0 || id >= t->n_ids || !t->id_tok[id]) return -1;
    const char *s = t->id_tok[id];
    for (int a = 0; a < t->n_added; a++)
        if (t->added[a].id == id) {
            int l = (int)strlen(s);
            if (l > cap) l = cap;
            memcpy(buf, s, (size_t)l);
            return l;
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

int sl_hf_tokenizer_vocab_size(const sl_hf_tokenizer *t) { return t->n_ids; }

int sl_hf_tokenizer_token_id(const sl_hf_tokenizer *t, const char *tok) {
    for (int a = 0; a < t->n_added; a++)
        if (!strcmp(t->added[a].content, tok)) return t->added[a].id;
    return strmap_get(&t->vocab, tok, strlen(tok));
}
