/* Tokenizer object: the byte-level tokenizer, token tables, tokenizer.json load/save, decode.
 * BPE training and encoding live in tokenizer_bpe.c.
 *
 * Note [tokenizer.json]
 *   {"format": "suanli-tokenizer", "version": 1, "type": "byte" | "bpe", "vocab_size": V,
 *    "pretokenizer": "gpt2-bytes-v1",            (bpe only)
 *    "merges": [[a, b], ...],                    (bpe only; merge r makes id 256 + r from ids a, b < 256 + r)
 *    "tokens": ["68656c6c6f", ...]}              (bpe only; hex bytes of ids 256..V-1, redundant: checked)
 *   Ids 0..255 are always the single bytes. Load rebuilds every token from the merges and refuses the file if
 *   vocab_size, merges and tokens disagree, so a hand-edited or truncated tokenizer cannot silently change
 *   the meaning of ids.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_internal.h"

#define TOK_FORMAT "suanli-tokenizer"
#define TOK_VERSION 1
#define TOK_PRETOK "gpt2-bytes-v1"

void sl_tokenizer_free(sl_tokenizer *t) {
    if (!t) return;
    sl_hf_tokenizer_free(t->hf);
    free(t->src);
    free(t->merges);
    free(t->off);
    free(t->len);
    free(t->bytes);
    free(t->hkeys);
    free(t->hrank);
    free(t);
}

static sl_status alloc_tables(sl_tokenizer *t, size_t nbytes) {
    t->off = malloc((size_t)t->vocab * sizeof *t->off);
    t->len = malloc((size_t)t->vocab * sizeof *t->len);
    t->bytes = malloc(nbytes ? nbytes : 1);
    if (!t->off || !t->len || !t->bytes) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    return SL_OK;
}

sl_status sl_tokenizer_new_byte(sl_tokenizer **out) {
    *out = NULL;
    sl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    t->type = SL_TOK_BYTE;
    t->vocab = 256;
    sl_status st = alloc_tables(t, 256);
    if (st != SL_OK) {
        sl_tokenizer_free(t);
        return st;
    }
    for (int i = 0; i < 256; i++) {
        t->off[i] = (uint32_t)i;
        t->len[i] = 1;
        t->bytes[i] = (uint8_t)i;
    }
    *out = t;
    return SL_OK;
}

sl_status sl__tokenizer_from_merges(const int32_t *merges, int nmerges, sl_tokenizer **out) {
    *out = NULL;
    if (nmerges < 0 || nmerges > SL_BPE_MAX_VOCAB - 256)
        return sl_fail(SL_ERR_INVALID, "tokenizer: %d merges out of range", nmerges);
    sl_status st = SL_OK;
    sl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    t->type = SL_TOK_BPE;
    t->vocab = 256 + nmerges;
    t->nmerges = nmerges;
    t->merges = malloc(((size_t)nmerges * 2 + 1) * sizeof *t->merges);
    if (!t->merges) {
        st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    if (nmerges) memcpy(t->merges, merges, (size_t)nmerges * 2 * sizeof *merges);
    /* token lengths first, then bytes */
    t->off = malloc((size_t)t->vocab * sizeof *t->off);
    t->len = malloc((size_t)t->vocab * sizeof *t->len);
    if (!t->off || !t->len) {
        st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    size_t total = 256;
    for (int i = 0; i < 256; i++) t->len[i] = 1;
    for (int r = 0; r < nmerges; r++) {
        int32_t a = merges[2 * r], b = merges[2 * r + 1];
        if (a < 0 || b < 0 || a >= 256 + r || b >= 256 + r) {
            st = sl_fail(SL_ERR_FORMAT, "tokenizer: merge %d joins ids (%d, %d) not defined before id %d", r,
                         a, b, 256 + r);
            goto done;
        }
        uint64_t l = (uint64_t)t->len[a] + t->len[b];
        if (l > (1u << 30)) {
            st = sl_fail(SL_ERR_FORMAT, "tokenizer: merge %d makes a token of %llu bytes", r,
                         (unsigned long long)l);
            goto done;
        }
        t->len[256 + r] = (uint32_t)l;
        total += l;
        if (total > ((size_t)1 << 31)) {
            st = sl_fail(SL_ERR_FORMAT, "tokenizer: token bytes exceed 2 GiB");
            goto done;
        }
    }
    t->bytes = malloc(total);
    if (!t->bytes) {
        st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    for (int i = 0; i < 256; i++) {
        t->off[i] = (uint32_t)i;
        t->bytes[i] = (uint8_t)i;
    }
    size_t pos = 256;
    for (int r = 0; r < nmerges; r++) {
        int32_t a = merges[2 * r], b = merges[2 * r + 1], id = 256 + r;
        t->off[id] = (uint32_t)pos;
        memcpy(t->bytes + pos, t->bytes + t->off[a], t->len[a]);
        memcpy(t->bytes + pos + t->len[a], t->bytes + t->off[b], t->len[b]);
        pos += t->len[id];
    }
    /* merge lookup table at load factor <= 1/2 */
    t->hcap = 16;
    while (t->hcap < (size_t)nmerges * 2 + 2) t->hcap <<= 1;
    t->hkeys = malloc(t->hcap * sizeof *t->hkeys);
    t->hrank = malloc(t->hcap * sizeof *t->hrank);
    if (!t->hkeys || !t->hrank) {
        st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    memset(t->hkeys, 0xff, t->hcap * sizeof *t->hkeys);
    for (int r = 0; r < nmerges; r++) {
        uint64_t key = ((uint64_t)(uint32_t)merges[2 * r] << 32) | (uint32_t)merges[2 * r + 1];
        size_t mask = t->hcap - 1, h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & mask;
        while (t->hkeys[h] != UINT64_MAX && t->hkeys[h] != key) h = (h + 1) & mask;
        if (t->hkeys[h] == key) {
            st = sl_fail(SL_ERR_FORMAT, "tokenizer: merge %d (%d, %d) duplicates merge %d", r, merges[2 * r],
                         merges[2 * r + 1], t->hrank[h]);
            goto done;
        }
        t->hkeys[h] = key;
        t->hrank[h] = r;
    }
    *out = t;
    t = NULL;
done:
    sl_tokenizer_free(t);
    return st;
}

const char *sl_tokenizer_type(const sl_tokenizer *t) {
    if (t->type == SL_TOK_HF) return sl__hf_tokenizer_is_model(t->hf) ? "sentencepiece" : "hf";
    return t->type == SL_TOK_BYTE ? "byte" : "bpe";
}
int sl_tokenizer_vocab_size(const sl_tokenizer *t) { return t->vocab; }

const char *sl_tokenizer_file_name(const sl_tokenizer *t) {
    return t->type == SL_TOK_HF && sl__hf_tokenizer_is_model(t->hf) ? "tokenizer.model" : "tokenizer.json";
}

int sl_tokenizer_decode_token(const sl_tokenizer *t, int32_t id, char *buf, int cap) {
    if (id < 0 || id >= t->vocab) return -1;
    if (t->type == SL_TOK_HF) {
        char tmp[1024];
        int k = sl_hf_tokenizer_decode_one(t->hf, id, tmp, sizeof tmp);
        if (k > 0 && cap > 0) memcpy(buf, tmp, (size_t)(k < cap ? k : cap));
        return k;
    }
    uint32_t l = t->len[id];
    uint32_t c = cap > 0 ? ((uint32_t)cap < l ? (uint32_t)cap : l) : 0;
    if (c) memcpy(buf, t->bytes + t->off[id], c);
    return (int)l;
}

sl_status sl_tokenizer_decode(const sl_tokenizer *t, const int32_t *ids, int64_t n, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (t->type == SL_TOK_HF) {
        if (n > 0x7FFFFFFF)
            return sl_fail(SL_ERR_INVALID, "tokenizer: %lld ids in one decode call", (long long)n);
        return sl_hf_tokenizer_decode(t->hf, ids, (int)n, 0, out, len);
    }
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab)
            return sl_fail(SL_ERR_INVALID, "tokenizer: id %d at position %lld outside vocab [0, %d)", ids[i],
                           (long long)i, t->vocab);
        total += t->len[ids[i]];
    }
    char *s = malloc(total + 1);
    if (!s) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory decoding %zu bytes", total);
    size_t p = 0;
    for (int64_t i = 0; i < n; i++) {
        memcpy(s + p, t->bytes + t->off[ids[i]], t->len[ids[i]]);
        p += t->len[ids[i]];
    }
    s[p] = 0;
    *out = s;
    *len = p;
    return SL_OK;
}

/* Note [Parallel encode]
 * Words are encoded independently, so a long text is cut at word boundaries (found by one sequential
 * pre-split pass, which is cheap next to BPE) into chunks encoded by OpenMP threads; chunk c writes its ids
 * at offset start(c) (a chunk never has more ids than bytes), then the pieces are packed. The result is
 * identical to the sequential encode. */
#define ENCODE_CHUNK ((size_t)1 << 22)
static sl_status encode_parallel(const sl_tokenizer *t, const uint8_t *text, size_t len, int32_t *out,
                                 int64_t *n) {
    int nthr = sl_threads_get();
    if (len < 2 * ENCODE_CHUNK || nthr <= 1) return sl__bpe_encode(t, text, len, out, n);
    size_t nch = (len + ENCODE_CHUNK - 1) / ENCODE_CHUNK;
    size_t *start = malloc((nch + 1) * sizeof *start);
    int64_t *cnt = calloc(nch, sizeof *cnt);
    sl_status *cst = calloc(nch, sizeof *cst);
    if (!start || !cnt || !cst) {
        free(start), free(cnt), free(cst);
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t k = 0, i = 0;
    start[k++] = 0;
    while (i < len) {
        i += sl__pretok_next(text, len, i);
        if (k < nch && i >= k * ENCODE_CHUNK && i < len) start[k++] = i;
    }
    nch = k;
    start[nch] = len;
#pragma omp parallel for schedule(dynamic, 1)
    for (long c = 0; c < (long)nch; c++)
        cst[c] = sl__bpe_encode(t, text + start[c], start[c + 1] - start[c], out + start[c], &cnt[c]);
    sl_status st = SL_OK;
    int64_t pos = 0;
    for (size_t c = 0; c < nch; c++) {
        if (cst[c] != SL_OK) {
            st = sl_fail(cst[c], "tokenizer: encoding chunk %zu failed", c);
            break;
        }
        memmove(out + pos, out + start[c], (size_t)cnt[c] * sizeof *out);
        pos += cnt[c];
    }
    *n = pos;
    free(start), free(cnt), free(cst);
    return st;
}

sl_status sl_tokenizer_encode(const sl_tokenizer *t, const char *text, size_t len, int32_t **ids,
                              int64_t *n) {
    *ids = NULL;
    *n = 0;
    if (len == 0) return SL_OK;
    if (!text) return sl_fail(SL_ERR_INVALID, "tokenizer: NULL text");
    if (t->type == SL_TOK_HF) {
        int k = 0;
        SL_TRY(sl__hf_tokenizer_encode_n(t->hf, text, len, 0, ids, &k));
        *n = k;
        return SL_OK;
    }
    int32_t *out = malloc(len * sizeof *out); /* never more tokens than bytes */
    if (!out) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
    if (t->type == SL_TOK_BYTE) {
        for (size_t i = 0; i < len; i++) out[i] = (uint8_t)text[i];
        *n = (int64_t)len;
    } else {
        sl_status st = encode_parallel(t, (const uint8_t *)text, len, out, n);
        if (st != SL_OK) {
            free(out);
            return st;
        }
        int32_t *shrunk = realloc(out, (size_t)(*n ? *n : 1) * sizeof *out);
        if (shrunk) out = shrunk;
    }
    *ids = out;
    return SL_OK;
}

/* ---- JSON ---- */
static const char hexd[] = "0123456789abcdef";

sl_status sl_tokenizer_save(const sl_tokenizer *t, const char *path) {
    if (t->type == SL_TOK_HF) return sl_file_write_atomic(path, t->src, t->src_len);
    sl_status st = SL_OK;
    char *txt = NULL, *hex = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
    cJSON_AddStringToObject(root, "format", TOK_FORMAT);
    cJSON_AddNumberToObject(root, "version", TOK_VERSION);
    cJSON_AddStringToObject(root, "type", sl_tokenizer_type(t));
    cJSON_AddNumberToObject(root, "vocab_size", t->vocab);
    if (t->type == SL_TOK_BPE) {
        cJSON_AddStringToObject(root, "pretokenizer", TOK_PRETOK);
        cJSON *m = cJSON_AddArrayToObject(root, "merges");
        cJSON *tk = cJSON_AddArrayToObject(root, "tokens");
        uint32_t maxl = 1;
        for (int i = 0; i < t->vocab; i++)
            if (t->len[i] > maxl) maxl = t->len[i];
        hex = malloc((size_t)maxl * 2 + 1);
        if (!m || !tk || !hex) {
            st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (int r = 0; r < t->nmerges; r++) {
            cJSON *pair = cJSON_CreateIntArray(t->merges + 2 * r, 2);
            if (!pair) {
                st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
            cJSON_AddItemToArray(m, pair);
            int id = 256 + r;
            const uint8_t *b = t->bytes + t->off[id];
            for (uint32_t k = 0; k < t->len[id]; k++) {
                hex[2 * k] = hexd[b[k] >> 4];
                hex[2 * k + 1] = hexd[b[k] & 15];
            }
            hex[2 * t->len[id]] = 0;
            cJSON_AddItemToArray(tk, cJSON_CreateString(hex));
        }
    }
    txt = cJSON_PrintUnformatted(root);
    if (!txt) {
        st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    size_t L = strlen(txt);
    txt[L] = '\n'; /* replace NUL: write L+1 bytes */
    st = sl_file_write_atomic(path, txt, L + 1);
done:
    free(hex);
    free(txt);
    cJSON_Delete(root);
    return st;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static sl_status resolve_path(const char *path, char *buf, size_t cap) {
    struct stat sb;
    if (stat(path, &sb) != 0) return sl_fail(SL_ERR_IO, "%s: tokenizer not found", path);
    if (S_ISDIR(sb.st_mode)) { /* tokenizer.json, else a SentencePiece tokenizer.model */
        snprintf(buf, cap, "%s/tokenizer.json", path);
        if (access(buf, F_OK) != 0) {
            snprintf(buf, cap, "%s/tokenizer.model", path);
            if (access(buf, F_OK) != 0) snprintf(buf, cap, "%s/tokenizer.json", path);
        }
    } else
        snprintf(buf, cap, "%s", path);
    return SL_OK;
}

/* Parse and check the common fields; returns the root (caller deletes) or NULL with an error recorded. */
static cJSON *parse_json(const char *path, sl_status *st, int *vocab, int *type) {
    char *txt;
    size_t len;
    *st = sl_file_read_all(path, &txt, &len);
    if (*st != SL_OK) return NULL;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        *st = sl_fail(SL_ERR_FORMAT, "%s: not a JSON object", path);
        return NULL;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(root, "type");
    const cJSON *vs = cJSON_GetObjectItemCaseSensitive(root, "vocab_size");
    if (!cJSON_IsString(f) || strcmp(f->valuestring, TOK_FORMAT) != 0)
        *st = sl_fail(SL_ERR_FORMAT, "%s: field 'format' is not \"%s\"", path, TOK_FORMAT);
    else if (!cJSON_IsNumber(v) || v->valuedouble != TOK_VERSION)
        *st = sl_fail(SL_ERR_FORMAT, "%s: unsupported 'version' (this build reads %d)", path, TOK_VERSION);
    else if (!cJSON_IsString(ty) || (strcmp(ty->valuestring, "byte") && strcmp(ty->valuestring, "bpe")))
        *st = sl_fail(SL_ERR_FORMAT, "%s: field 'type' must be \"byte\" or \"bpe\"", path);
    else if (!cJSON_IsNumber(vs) || vs->valuedouble < 256 || vs->valuedouble > SL_BPE_MAX_VOCAB ||
             vs->valuedouble != (double)(int)vs->valuedouble)
        *st = sl_fail(SL_ERR_FORMAT, "%s: field 'vocab_size' missing or out of range", path);
    else
        *st = SL_OK;
    if (*st != SL_OK) {
        cJSON_Delete(root);
        return NULL;
    }
    *vocab = (int)vs->valuedouble;
    *type = strcmp(ty->valuestring, "byte") ? SL_TOK_BPE : SL_TOK_BYTE;
    return root;
}

sl_status sl__tokenizer_json_vocab(const char *path, int *vocab) {
    sl_status st;
    int type;
    cJSON *root = parse_json(path, &st, vocab, &type);
    cJSON_Delete(root);
    return st;
}

/* Note [One tokenizer object]
 *   sl_tokenizer also holds a Hugging Face tokenizer.json or a SentencePiece tokenizer.model (type "hf" /
 *   "sentencepiece", SL_TOK_HF): a file that is not JSON, or JSON without suanli's "format" field, is
 *   loaded with sl_hf_tokenizer_load and encode/decode/save go through it (save writes the file's bytes
 *   back unchanged), so `data prepare`, the loader and training see one API whatever the file. */
static sl_status load_hf(const char *path, sl_tokenizer **out) {
    sl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    t->type = SL_TOK_HF;
    sl_status st = sl_file_read_all(path, &t->src, &t->src_len);
    if (st == SL_OK) st = sl_hf_tokenizer_load(path, &t->hf);
    if (st != SL_OK) {
        sl_tokenizer_free(t);
        return st;
    }
    t->vocab = sl_hf_tokenizer_vocab_size(t->hf);
    *out = t;
    return SL_OK;
}

/* suanli's own tokenizer.json (or a file parse_json should report on) rather than an HF/SentencePiece one */
static int is_suanli_json(const char *path) {
    char *txt;
    size_t n;
    if (sl_file_read_all(path, &txt, &n) != SL_OK) return 1; /* let parse_json report it */
    size_t i = 0;
    while (i < n && (txt[i] == ' ' || txt[i] == '\n' || txt[i] == '\r' || txt[i] == '\t')) i++;
    int r;
    if (i == n || (txt[i] != '{' && txt[i] != '['))
        r = n == 0; /* not JSON: a tokenizer.model (an empty file is reported as JSON) */
    else
        r = memmem(txt, n, "\"" TOK_FORMAT "\"", strlen(TOK_FORMAT) + 2) || !memmem(txt, n, "\"model\"", 7);
    free(txt);
    return r;
}

sl_status sl_tokenizer_load(const char *path_in, sl_tokenizer **out) {
    *out = NULL;
    char path[4096];
    SL_TRY(resolve_path(path_in, path, sizeof path));
    if (!is_suanli_json(path)) return load_hf(path, out);
    sl_status st;
    int vocab, type;
    int32_t *merges = NULL;
    sl_tokenizer *t = NULL;
    cJSON *root = parse_json(path, &st, &vocab, &type);
    if (!root) return st;
    if (type == SL_TOK_BYTE) {
        if (vocab != 256) {
            st = sl_fail(SL_ERR_FORMAT, "%s: byte tokenizer must have vocab_size 256, not %d", path, vocab);
            goto done;
        }
        SL_CHECK(sl_tokenizer_new_byte(&t));
        goto done;
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pretokenizer");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "merges");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, TOK_PRETOK) != 0) {
        st = sl_fail(SL_ERR_FORMAT, "%s: field 'pretokenizer' is not \"%s\"", path, TOK_PRETOK);
        goto done;
    }
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != vocab - 256) {
        st = sl_fail(SL_ERR_FORMAT, "%s: field 'merges' must be an array of vocab_size-256 = %d pairs", path,
                     vocab - 256);
        goto done;
    }
    if (!cJSON_IsArray(tk) || cJSON_GetArraySize(tk) != vocab - 256) {
        st = sl_fail(SL_ERR_FORMAT, "%s: field 'tokens' must be an array of vocab_size-256 = %d strings",
                     path, vocab - 256);
        goto done;
    }
    int nm = vocab - 256;
    merges = malloc(((size_t)nm * 2 + 1) * sizeof *merges);
    if (!merges) {
        st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    int r = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, m) {
        const cJSON *a = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) ||
            a->valuedouble != (double)(int32_t)a->valuedouble ||
            b->valuedouble != (double)(int32_t)b->valuedouble) {
            st = sl_fail(SL_ERR_FORMAT, "%s: merges[%d] is not a pair of integer ids", path, r);
            goto done;
        }
        merges[2 * r] = (int32_t)a->valuedouble;
        merges[2 * r + 1] = (int32_t)b->valuedouble;
        r++;
    }
    st = sl__tokenizer_from_merges(merges, nm, &t);
    if (st != SL_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", sl_errmsg()); /* sl_errmsg's buffer is the destination */
        st = sl_fail(st, "%s: %s", path, why);
        goto done;
    }
    r = 0;
    cJSON_ArrayForEach(e, tk) {
        int id = 256 + r;
        const char *s = cJSON_IsString(e) ? e->valuestring : NULL;
        size_t sl = s ? strlen(s) : 0;
        int ok = s && sl == 2 * (size_t)t->len[id];
        for (uint32_t k = 0; ok && k < t->len[id]; k++) {
            int hi = hexval(s[2 * k]), lo = hexval(s[2 * k + 1]);
            ok = hi >= 0 && lo >= 0 && (uint8_t)(hi * 16 + lo) == t->bytes[t->off[id] + k];
        }
        if (!ok) {
            st = sl_fail(SL_ERR_FORMAT, "%s: tokens[%d] (id %d) does not match the bytes its merge produces",
                         path, r, id);
            goto done;
        }
        r++;
    }
done:
    cJSON_Delete(root);
    free(merges);
    if (st != SL_OK) {
        sl_tokenizer_free(t);
        return st;
    }
    *out = t;
    return SL_OK;
}

/* ---- tokenizer identity (train --init-from: the data's tokenizer must be the model's) ---- */

static const char k_probe[] =
    "Hello, world! The quick brown fox\n\t  jumps 12345 3.14 don't\r\n"
    "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82 "
    "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd int main(void) { return 0; } \xef\xac\x81 caf\xc3\xa9";

/* the stored token string of id (HF/SentencePiece) or its bytes (suanli byte/bpe); 0 if none */
static int token_of(const sl_tokenizer *t, int32_t id, const char **s, size_t *n) {
    if (t->type == SL_TOK_HF) {
        *s = sl__hf_tokenizer_piece(t->hf, id);
        *n = *s ? strlen(*s) : 0;
        return *s != NULL;
    }
    *s = (const char *)t->bytes + t->off[id];
    *n = t->len[id];
    return 1;
}

sl_status sl_tokenizer_files_match(const char *a, const char *b) {
    sl_tokenizer *ta = NULL, *tb = NULL;
    int32_t *ia = NULL, *ib = NULL;
    int64_t na = 0, nb = 0;
    sl_status st = sl_tokenizer_load(a, &ta);
    if (st == SL_OK) st = sl_tokenizer_load(b, &tb);
    if (st != SL_OK) goto done;
    if ((ta->type == SL_TOK_HF) != (tb->type == SL_TOK_HF) ||
        (ta->type != SL_TOK_HF && ta->type != tb->type)) {
        st = sl_fail(SL_ERR_INVALID, "tokenizers differ: %s is %s, %s is %s", a, sl_tokenizer_type(ta), b,
                     sl_tokenizer_type(tb));
        goto done;
    }
    if (ta->vocab != tb->vocab) {
        st = sl_fail(SL_ERR_INVALID, "tokenizers differ: %s has %d tokens, %s has %d", a, ta->vocab, b,
                     tb->vocab);
        goto done;
    }
    for (int32_t id = 0; id < ta->vocab; id++) {
        const char *sa, *sb;
        size_t la, lb;
        int ha = token_of(ta, id, &sa, &la), hb = token_of(tb, id, &sb, &lb);
        if (ha != hb || la != lb || (la && memcmp(sa, sb, la))) {
            st =
                sl_fail(SL_ERR_INVALID, "tokenizers differ: token %d is '%.*s' in %s but '%.*s' in %s", id,
                        (int)(la > 40 ? 40 : la), ha ? sa : "", a, (int)(lb > 40 ? 40 : lb), hb ? sb : "", b);
            goto done;
        }
    }
    SL_CHECK(sl_tokenizer_encode(ta, k_probe, sizeof k_probe - 1, &ia, &na));
    SL_CHECK(sl_tokenizer_encode(tb, k_probe, sizeof k_probe - 1, &ib, &nb));
    int64_t k = 0;
    while (k < na && k < nb && ia[k] == ib[k]) k++;
    if (k < na || k < nb)
        st = sl_fail(SL_ERR_INVALID,
                     "tokenizers differ: same vocabulary, but %s and %s encode a probe text differently "
                     "(first at id %lld)",
                     a, b, (long long)k);
done:
    free(ia);
    free(ib);
    sl_tokenizer_free(ta);
    sl_tokenizer_free(tb);
    return st;
}
