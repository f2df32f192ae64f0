/* SentencePiece `tokenizer.model`: a serialized ModelProto (sentencepiece_model.proto), read by hand.
 *
 * Note [tokenizer.model fields read]
 *   ModelProto      1 pieces (repeated SentencePiece), 2 trainer_spec, 3 normalizer_spec,
 *                   5 denormalizer_spec (refused unless empty)
 *   SentencePiece   1 piece (string), 2 score (float), 3 type (NORMAL=1 UNKNOWN=2 CONTROL=3 USER_DEFINED=4
 *                   UNUSED=5 BYTE=6; default NORMAL)
 *   TrainerSpec     3 model_type (UNIGRAM=1 default, BPE=2; WORD=3 and CHAR=4 are refused),
 *                   24 treat_whitespace_as_suffix (refused if true), 35 byte_fallback, 40 unk_id,
 *                   41 bos_id, 42 eos_id, 44 unk_surface
 *   NormalizerSpec  1 name, 2 precompiled_charsmap, 3 add_dummy_prefix (default true),
 *                   4 remove_extra_whitespaces (default true), 5 escape_whitespaces (default true)
 *   Every other field is skipped by wire type. The normalizer is the stored charsmap, applied exactly as
 *   sentencepiece does (so nmt_nfkc, nfkc, *_cf and custom rule sets all work); a spec whose name asks for
 *   normalization but carries no charsmap is refused, since the rules are not in the file.
 *   Checks, each a one-line error naming the file and field: truncation and bad wire types, a piece that is
 *   empty, invalid UTF-8, duplicated, of unknown type, or a BYTE piece not spelled <0xNN> (or with
 *   byte_fallback off); exactly one UNKNOWN piece; ids of bos/eos in range.
 */
#include <math.h>
#include <string.h>
#include <utf8proc.h>

#include "data/sp_internal.h"

typedef struct {
    const uint8_t *p, *end;
} pb;

static int pb_varint(pb *b, uint64_t *v) {
    uint64_t r = 0;
    for (int sh = 0; sh < 64; sh += 7) {
        if (b->p >= b->end) return 0;
        uint8_t c = *b->p++;
        r |= (uint64_t)(c & 0x7F) << sh;
        if (!(c & 0x80)) {
            *v = r;
            return 1;
        }
    }
    return 0;
}

/* next field: 1 ok, 0 end of message, -1 malformed */
static int pb_next(pb *b, uint32_t *field, uint32_t *wire, uint64_t *val, pb *sub) {
    if (b->p >= b->end) return 0;
    uint64_t key;
    if (!pb_varint(b, &key) || (key >> 3) == 0 || (key >> 3) > 0x1FFFFFFF) return -1;
    *field = (uint32_t)(key >> 3);
    *wire = (uint32_t)(key & 7);
    switch (*wire) {
    case 0:
        return pb_varint(b, val) ? 1 : -1;
    case 1:
        if (b->end - b->p < 8) return -1;
        memcpy(val, b->p, 8);
        b->p += 8;
        return 1;
    case 5: {
        if (b->end - b->p < 4) return -1;
        uint32_t v =
            (uint32_t)b->p[0] | (uint32_t)b->p[1] << 8 | (uint32_t)b->p[2] << 16 | (uint32_t)b->p[3] << 24;
        *val = v;
        b->p += 4;
        return 1;
    }
    case 2:
        if (!pb_varint(b, val) || *val > (uint64_t)(b->end - b->p)) return -1;
        sub->p = b->p;
        sub->end = b->p + *val;
        b->p += *val;
        return 1;
    default:
        return -1;
    }
}

#define BAD(...) sl_fail(SL_ERR_FORMAT, __VA_ARGS__)

static sl_status want_wire(const char *path, const char *field, uint32_t wire, uint32_t want) {
    if (wire != want) return BAD("%s: %s: wire type %u, expected %u", path, field, wire, want);
    return SL_OK;
}

static char *dup_n(const uint8_t *s, size_t n) {
    char *r = malloc(n + 1);
    if (r) {
        memcpy(r, s, n);
        r[n] = 0;
    }
    return r;
}

void sl__sp_free(sl__sp_model *m) {
    if (!m) return;
    for (int i = 0; m->piece && i < m->n; i++) free(m->piece[i]);
    free(m->piece);
    free(m->len);
    free(m->score);
    free(m->type);
    free(m->unk_surface);
    free(m->norm_name);
    sl__charsmap_free(&m->cmap);
    free(m->user);
    free(m->hash);
    free(m->rhash);
    free(m->pfx);
    free(m);
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = SL_FNV_INIT;
    for (size_t i = 0; i < n; i++) h = sl__fnv_step(h, (unsigned char)s[i]);
    return h;
}

static int map_find_h(const sl__sp_model *m, const int *tab, const char *s, size_t n, uint64_t h) {
    for (size_t i = h & (m->hcap - 1);; i = (i + 1) & (m->hcap - 1)) {
        int id = tab[i];
        if (id < 0) return -1;
        if (m->len[id] == n && !memcmp(m->piece[id], s, n)) return id;
    }
}

static int map_find(const sl__sp_model *m, const int *tab, const char *s, size_t n) {
    return map_find_h(m, tab, s, n, hash_bytes(s, n));
}

int sl__sp_lookup_h(const sl__sp_model *m, const char *s, size_t n, uint64_t h) {
    return map_find_h(m, m->hash, s, n, h);
}

int sl__sp_is_prefix(const sl__sp_model *m, uint64_t h) {
    h |= 1;
    for (size_t i = (h >> 7) & (m->pcap - 1);; i = (i + 1) & (m->pcap - 1)) {
        if (m->pfx[i] == h) return 1;
        if (!m->pfx[i]) return 0;
    }
}

static sl_status build_prefixes(const char *path, sl__sp_model *m) {
    size_t total = 0;
    for (int i = 0; i < m->n; i++) total += m->len[i];
    m->pcap = 16;
    while (m->pcap < 2 * total) m->pcap *= 2;
    if (!(m->pfx = calloc(m->pcap, sizeof(uint64_t))))
        return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < m->n; i++) {
        int t = m->type[i];
        if (t != SL_SP_NORMAL && t != SL_SP_USER_DEFINED && t != SL_SP_UNUSED) continue;
        if (m->len[i] > m->max_len) m->max_len = m->len[i];
        uint64_t h = SL_FNV_INIT;
        for (uint32_t k = 0; k < m->len[i]; k++) {
            h = sl__fnv_step(h, (unsigned char)m->piece[i][k]);
            uint64_t key = h | 1;
            size_t j = (key >> 7) & (m->pcap - 1);
            while (m->pfx[j] && m->pfx[j] != key) j = (j + 1) & (m->pcap - 1);
            m->pfx[j] = key;
        }
    }
    return SL_OK;
}

static void map_put(const sl__sp_model *m, int *tab, int id) {
    size_t i = hash_bytes(m->piece[id], m->len[id]) & (m->hcap - 1);
    while (tab[i] >= 0) i = (i + 1) & (m->hcap - 1);
    tab[i] = id;
}

int sl__sp_lookup(const sl__sp_model *m, const char *s, size_t n) { return map_find(m, m->hash, s, n); }

int sl__sp_piece_to_id(const sl__sp_model *m, const char *s, size_t n) {
    int id = map_find(m, m->rhash, s, n);
    if (id < 0) id = map_find(m, m->hash, s, n);
    return id < 0 ? m->unk_id : id;
}

typedef struct {
    char **piece;
    uint32_t *len;
    float *score;
    uint8_t *type;
    int n, cap;
} piece_vec;

static sl_status parse_piece(const char *path, int idx, pb b, piece_vec *v) {
    if (v->n == v->cap) {
        int nc = v->cap ? 2 * v->cap : 1024;
        char **p = realloc(v->piece, sizeof(char *) * (size_t)nc);
        if (p) v->piece = p;
        uint32_t *l = realloc(v->len, sizeof(uint32_t) * (size_t)nc);
        if (l) v->len = l;
        float *s = realloc(v->score, sizeof(float) * (size_t)nc);
        if (s) v->score = s;
        uint8_t *t = realloc(v->type, (size_t)nc);
        if (t) v->type = t;
        if (!p || !l || !s || !t) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
        v->cap = nc;
    }
    char *str = NULL;
    size_t sl = 0;
    float score = 0;
    uint64_t type = SL_SP_NORMAL;
    uint32_t f, w;
    uint64_t val;
    pb sub;
    int r;
    while ((r = pb_next(&b, &f, &w, &val, &sub)) == 1) {
        if (f == 1) {
            if (w != 2) {
                free(str);
                return BAD("%s: pieces[%d].piece: wire type %u, expected 2", path, idx, w);
            }
            free(str);
            sl = (size_t)(sub.end - sub.p);
            if (!(str = dup_n(sub.p, sl))) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
        } else if (f == 2) {
            if (w != 5) {
                free(str);
                return BAD("%s: pieces[%d].score: wire type %u, expected 5", path, idx, w);
            }
            uint32_t u = (uint32_t)val;
            memcpy(&score, &u, 4);
        } else if (f == 3) {
            type = val;
            if (w != 0 || type < SL_SP_NORMAL || type > SL_SP_BYTE) {
                free(str);
                return BAD("%s: pieces[%d].type: %llu is not a SentencePiece type (1..6)", path, idx,
                           (unsigned long long)type);
            }
        }
    }
    if (r < 0) {
        free(str);
        return BAD("%s: pieces[%d]: truncated or malformed protobuf", path, idx);
    }
    if (!str || !sl) {
        free(str);
        return BAD("%s: pieces[%d].piece: empty piece", path, idx);
    }
    if (utf8proc_decompose((const utf8proc_uint8_t *)str, (utf8proc_ssize_t)sl, NULL, 0, 0) < 0 ||
        strlen(str) != sl) {
        free(str);
        return BAD("%s: pieces[%d].piece: not valid UTF-8", path, idx);
    }
    if (!isfinite(score)) {
        free(str);
        return BAD("%s: pieces[%d].score: not finite", path, idx);
    }
    v->piece[v->n] = str;
    v->len[v->n] = (uint32_t)sl;
    v->score[v->n] = score;
    v->type[v->n] = (uint8_t)type;
    v->n++;
    return SL_OK;
}

static sl_status parse_trainer(const char *path, pb b, sl__sp_model *m) {
    uint32_t f, w;
    uint64_t val;
    pb sub;
    int r;
    while ((r = pb_next(&b, &f, &w, &val, &sub)) == 1) {
        int vint = w == 0 && (f == 3 || f == 24 || f == 35 || f == 40 || f == 41 || f == 42);
        if ((f == 3 || f == 24 || f == 35 || f == 40 || f == 41 || f == 42) && !vint)
            return BAD("%s: trainer_spec field %u: wire type %u, expected 0", path, f, w);
        switch (f) {
        case 3:
            if (val != SL_SP_UNIGRAM && val != SL_SP_BPE)
                return sl_fail(SL_ERR_UNSUPPORTED,
                               "%s: trainer_spec.model_type: %llu (%s) is not supported (UNIGRAM=1, BPE=2)",
                               path, (unsigned long long)val,
                               val == 3   ? "WORD"
                               : val == 4 ? "CHAR"
                                          : "unknown");
            m->model_type = (int)val;
            break;
        case 24:
            if (val)
                return sl_fail(SL_ERR_UNSUPPORTED,
                               "%s: trainer_spec.treat_whitespace_as_suffix is not supported", path);
            break;
        case 35:
            m->byte_fallback = val != 0;
            break;
        case 40:
            m->unk_id = (int32_t)(int64_t)val;
            break;
        case 41:
            m->bos_id = (int32_t)(int64_t)val;
            break;
        case 42:
            m->eos_id = (int32_t)(int64_t)val;
            break;
        case 44:
            SL_TRY(want_wire(path, "trainer_spec.unk_surface", w, 2));
            free(m->unk_surface);
            if (!(m->unk_surface = dup_n(sub.p, (size_t)(sub.end - sub.p))))
                return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
            break;
        default:
            break;
        }
    }
    if (r < 0) return BAD("%s: trainer_spec: truncated or malformed protobuf", path);
    return SL_OK;
}

static sl_status parse_normalizer(const char *path, const char *what, pb b, sl__sp_model *m, int deno) {
    uint32_t f, w;
    uint64_t val;
    pb sub;
    int r;
    const uint8_t *cm = NULL;
    size_t cml = 0;
    char field[64];
    while ((r = pb_next(&b, &f, &w, &val, &sub)) == 1) {
        snprintf(field, sizeof field, "%s field %u", what, f);
        if (f == 1 || f == 2 || f == 6) SL_TRY(want_wire(path, field, w, 2));
        if (f >= 3 && f <= 5) SL_TRY(want_wire(path, field, w, 0));
        if (f == 1 && !deno) {
            free(m->norm_name);
            if (!(m->norm_name = dup_n(sub.p, (size_t)(sub.end - sub.p))))
                return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
        } else if (f == 2) {
            cm = sub.p;
            cml = (size_t)(sub.end - sub.p);
        } else if (f == 3 && !deno) {
            m->add_dummy_prefix = val != 0;
        } else if (f == 4 && !deno) {
            m->remove_extra_ws = val != 0;
        } else if (f == 5 && !deno) {
            m->escape_ws = val != 0;
        }
    }
    if (r < 0) return BAD("%s: %s: truncated or malformed protobuf", path, what);
    if (deno) {
        if (cml)
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: denormalizer_spec.precompiled_charsmap is not supported",
                           path);
        return SL_OK;
    }
    return sl__charsmap_init(&m->cmap, cm, cml, path, "normalizer_spec.precompiled_charsmap");
}

static sl_status finish(const char *path, sl__sp_model *m) {
    if (m->n == 0) return BAD("%s: pieces: the model has no pieces", path);
    const char *nm = m->norm_name ? m->norm_name : "";
    if (!m->cmap.n_units && *nm && strcmp(nm, "identity") != 0)
        return sl_fail(
            SL_ERR_UNSUPPORTED,
            "%s: normalizer_spec.name '%s' has no precompiled_charsmap (only stored rules are applied)", path,
            nm);
    m->hcap = 16;
    while (m->hcap < 2 * (size_t)m->n) m->hcap *= 2;
    m->hash = malloc(sizeof(int) * m->hcap);
    m->rhash = malloc(sizeof(int) * m->hcap);
    m->user = malloc(sizeof(int) * (size_t)m->n);
    if (!m->hash || !m->rhash || !m->user) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
    memset(m->hash, 0xff, sizeof(int) * m->hcap);
    memset(m->rhash, 0xff, sizeof(int) * m->hcap);
    int unk = -1;
    m->min_score = INFINITY;
    m->max_score = 1.17549435e-38f; /* FLT_MIN, as sentencepiece starts it */
    for (int i = 0; i < 256; i++) m->byte_id[i] = -1;
    for (int i = 0; i < m->n; i++) {
        int t = m->type[i];
        int normal = t == SL_SP_NORMAL || t == SL_SP_USER_DEFINED || t == SL_SP_UNUSED;
        int *tab = normal ? m->hash : m->rhash;
        if (map_find(m, tab, m->piece[i], m->len[i]) >= 0)
            return BAD("%s: pieces[%d].piece: '%s' is already defined", path, i, m->piece[i]);
        map_put(m, tab, i);
        if (t == SL_SP_USER_DEFINED) m->user[m->n_user++] = i;
        if (t == SL_SP_NORMAL) {
            if (m->score[i] < m->min_score) m->min_score = m->score[i];
            if (m->score[i] > m->max_score) m->max_score = m->score[i];
        }
        if (t == SL_SP_UNKNOWN) {
            if (unk >= 0) return BAD("%s: pieces[%d]: a second UNKNOWN piece (first: %d)", path, i, unk);
            unk = i;
        }
        if (t == SL_SP_BYTE) {
            unsigned v = 0;
            char canon[8] = "";
            if (!m->byte_fallback)
                return BAD("%s: pieces[%d]: BYTE piece '%s' but trainer_spec.byte_fallback is false", path, i,
                           m->piece[i]);
            if (m->len[i] == 6 && sscanf(m->piece[i], "<0x%2X", &v) == 1 && v < 256)
                snprintf(canon, sizeof canon, "<0x%02X>", v);
            if (strcmp(canon, m->piece[i]) != 0)
                return BAD("%s: pieces[%d].piece: BYTE piece '%s' is not <0xNN>", path, i, m->piece[i]);
            m->byte_id[v] = i;
        }
    }
    if (unk < 0) return BAD("%s: pieces: no UNKNOWN piece (unk is not defined)", path);
    if (m->unk_id != unk)
        return BAD("%s: trainer_spec.unk_id: %d, but the UNKNOWN piece is %d", path, m->unk_id, unk);
    if (!isfinite(m->min_score)) m->min_score = 3.40282347e38f; /* FLT_MAX: no NORMAL piece */
    for (int b = 0; b < 256; b++)
        if (m->byte_id[b] < 0) m->byte_id[b] = m->unk_id;
    if (m->bos_id >= m->n || (m->bos_id >= 0 && m->type[m->bos_id] != SL_SP_CONTROL)) m->bos_id = -1;
    if (m->eos_id >= m->n || (m->eos_id >= 0 && m->type[m->eos_id] != SL_SP_CONTROL)) m->eos_id = -1;
    if (!m->unk_surface && !(m->unk_surface = strdup(" \xE2\x81\x87 ")))
        return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
    SL_TRY(build_prefixes(path, m));
    /* user-defined symbols match longest first */
    for (int i = 1; i < m->n_user; i++)
        for (int j = i; j > 0 && m->len[m->user[j]] > m->len[m->user[j - 1]]; j--) {
            int t = m->user[j];
            m->user[j] = m->user[j - 1];
            m->user[j - 1] = t;
        }
    return SL_OK;
}

sl_status sl__sp_parse(const uint8_t *buf, size_t len, const char *path, sl__sp_model **out) {
    *out = NULL;
    sl__sp_model *m = calloc(1, sizeof *m);
    if (!m) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
    m->model_type = SL_SP_UNIGRAM;
    m->add_dummy_prefix = m->remove_extra_ws = m->escape_ws = 1;
    m->bos_id = 1;
    m->eos_id = 2;
    piece_vec v = {0};
    pb b = {buf, buf + len}, sub;
    uint32_t f, w;
    uint64_t val;
    int r, seen_trainer = 0;
    sl_status st = SL_OK;
    while (st == SL_OK && (r = pb_next(&b, &f, &w, &val, &sub)) == 1) {
        if (f == 1) {
            st = w == 2 ? parse_piece(path, v.n, sub, &v)
                        : BAD("%s: pieces[%d]: wire type %u, expected 2", path, v.n, w);
        } else if (f == 2) {
            st = w == 2 ? parse_trainer(path, sub, m)
                        : BAD("%s: trainer_spec: wire type %u, expected 2", path, w);
            seen_trainer = 1;
        } else if (f == 3) {
            st = w == 2 ? parse_normalizer(path, "normalizer_spec", sub, m, 0)
                        : BAD("%s: normalizer_spec: wire type %u, expected 2", path, w);
        } else if (f == 5) {
            st = w == 2 ? parse_normalizer(path, "denormalizer_spec", sub, m, 1)
                        : BAD("%s: denormalizer_spec: wire type %u, expected 2", path, w);
        }
    }
    if (st == SL_OK && r < 0)
        st = BAD("%s: truncated or malformed protobuf at byte %zu", path, (size_t)(b.p - buf));
    m->piece = v.piece;
    m->len = v.len;
    m->score = v.score;
    m->type = v.type;
    m->n = v.n;
    if (st == SL_OK && !seen_trainer)
        st = BAD("%s: trainer_spec: missing (not a SentencePiece model?)", path);
    if (st == SL_OK) st = finish(path, m);
    if (st != SL_OK) {
        sl__sp_free(m);
        return st;
    }
    *out = m;
    return SL_OK;
}

/* ---------------- precompiled charsmap (darts-clone double array) ---------------- */

sl_status sl__charsmap_init(sl__charsmap *c, const uint8_t *blob, size_t len, const char *path,
                            const char *field) {
    memset(c, 0, sizeof *c);
    if (!len) return SL_OK;
    if (len <= 4) return BAD("%s: %s: blob of %zu bytes is too short", path, field, len);
    uint32_t ts =
        (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 | (uint32_t)blob[3] << 24;
    if (ts >= len - 4 || ts % 4 || ts == 0)
        return BAD("%s: %s: trie size %u does not fit the %zu-byte blob", path, field, ts, len);
    c->n_units = ts / 4;
    c->norm_len = len - 4 - ts;
    c->units = malloc(ts);
    c->norm = malloc(c->norm_len + 1);
    if (!c->units || !c->norm) {
        sl__charsmap_free(c);
        return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
    }
    for (size_t i = 0; i < c->n_units; i++) {
        const uint8_t *q = blob + 4 + 4 * i;
        c->units[i] = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    }
    memcpy(c->norm, blob + 4 + ts, c->norm_len);
    c->norm[c->norm_len] = 0;
    return SL_OK;
}

void sl__charsmap_free(sl__charsmap *c) {
    free(c->units);
    free(c->norm);
    memset(c, 0, sizeof *c);
}

/* darts-clone unit fields */
#define DA_HAS_LEAF(u) (((u) >> 8) & 1)
#define DA_VALUE(u) ((u)&0x7FFFFFFFu)
#define DA_LABEL(u) ((u) & (0x80000000u | 0xFFu))
#define DA_OFFSET(u) (((u) >> 10) << (((u) & (1u << 9)) >> 6))

size_t sl__charsmap_match(const sl__charsmap *c, const uint8_t *s, size_t n, const char **rep) {
    if (!c->n_units) return 0;
    size_t node = DA_OFFSET(c->units[0]), best = 0;
    for (size_t i = 0; i < n; i++) {
        node ^= s[i];
        if (node >= c->n_units) break;
        uint32_t u = c->units[node];
        if (DA_LABEL(u) != s[i]) break;
        node ^= DA_OFFSET(u);
        if (node >= c->n_units) break;
        if (DA_HAS_LEAF(u)) {
            uint32_t v = DA_VALUE(c->units[node]);
            if (v < c->norm_len) { /* a bad offset is no rule (never read outside the blob) */
                best = i + 1;
                *rep = c->norm + v;
            }
        }
    }
    return best;
}
