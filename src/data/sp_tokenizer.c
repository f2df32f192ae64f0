/* SentencePiece encoding and decoding (the model comes from sp_model.c), as sentencepiece 0.2 does it.
 *
 * Note [SentencePiece encode]
 *   1. Normalize (normalizer.cc): at each position take the longest user-defined symbol (kept verbatim),
 *      else the longest charsmap rule, else one UTF-8 character (a malformed byte becomes U+FFFD). With
 *      remove_extra_whitespaces: leading spaces are dropped, runs of spaces collapse to one and trailing
 *      ones are dropped. add_dummy_prefix puts one U+2581 in front; escape_whitespaces turns ' ' into U+2581.
 *   2. Model. BPE (bpe_model.cc): start from characters (user-defined symbols frozen) and repeatedly
 *      join the adjacent pair whose concatenation is a piece of highest score, leftmost on ties; pieces of
 *      type UNUSED are split back into the pair that made them. Unigram (unigram_model.cc,
 *      EncodeOptimized): Viterbi over every piece that starts at a character boundary, score = the piece's
 *      score (user-defined: bytes * max_score - 0.1), a character no piece covers costs
 *      min_score - 10; scores add up and compare in float (what the released wheel computes: every
 *      tie in the fixture corpus resolves as it does only with float sums); ties keep the earlier start.
 *   3. An unknown piece becomes its UTF-8 bytes as <0xNN> pieces with byte_fallback; without it, a run of
 *      unknown pieces is one <unk>.
 *   Decode (sentencepiece_processor.cc): control pieces vanish, <unk> reads as unk_surface, runs of byte
 *   pieces are decoded as UTF-8 (each invalid byte U+FFFD), U+2581 reads as ' ', and the leading U+2581 of
 *   the first visible piece is dropped (with remove_extra_whitespaces: of every piece until text appears).
 */
#include <string.h>
#include <utf8proc.h>

#include "data/sp_internal.h"

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static int sb_put(sbuf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) return 0;
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 1;
}

static const char k_ws[] = "\xE2\x96\x81"; /* U+2581 */

static size_t one_char_len(const uint8_t *s, size_t n) {
    static const uint8_t tab[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t k = tab[s[0] >> 4];
    return k < n ? k : n;
}

/* one normalized prefix: *rep (*rl bytes) replaces *consumed input bytes */
static void norm_prefix(const sl__sp_model *m, const uint8_t *s, size_t n, const char **rep, size_t *rl,
                        size_t *consumed) {
    for (int u = 0; u < m->n_user; u++) {
        int id = m->user[u];
        if (m->len[id] <= n && !memcmp(s, m->piece[id], m->len[id])) {
            *rep = (const char *)s;
            *rl = *consumed = m->len[id];
            return;
        }
    }
    const char *r = NULL;
    size_t k = sl__charsmap_match(&m->cmap, s, n, &r);
    if (k) {
        *rep = r;
        *rl = strlen(r);
        *consumed = k;
        return;
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t c = utf8proc_iterate(s, (utf8proc_ssize_t)(n < 4 ? n : 4), &cp);
    if (c <= 0) {
        *rep = "\xEF\xBF\xBD";
        *rl = 3;
        *consumed = 1;
        return;
    }
    *rep = (const char *)s;
    *rl = *consumed = (size_t)c;
}

static int sp_normalize(const sl__sp_model *m, const uint8_t *s, size_t n, sbuf *out) {
    const char *rep;
    size_t rl, used;
    const char *space = m->escape_ws ? k_ws : " ";
    size_t spl = strlen(space);
    if (m->remove_extra_ws)
        while (n) {
            norm_prefix(m, s, n, &rep, &rl, &used);
            if (rl != 1 || rep[0] != ' ') break;
            s += used;
            n -= used;
        }
    if (!n) return 1;
    if (m->add_dummy_prefix && !sb_put(out, space, spl)) return 0;
    int prev_space = m->remove_extra_ws;
    while (n) {
        norm_prefix(m, s, n, &rep, &rl, &used);
        while (prev_space && rl && rep[0] == ' ') rep++, rl--;
        if (rl) {
            for (size_t i = 0; i < rl; i++)
                if (!(rep[i] == ' ' ? sb_put(out, space, spl) : sb_put(out, rep + i, 1))) return 0;
            prev_space = rep[rl - 1] == ' ';
        }
        s += used;
        n -= used;
        if (!m->remove_extra_ws) prev_space = 0;
    }
    if (m->remove_extra_ws)
        while (out->n >= spl && !memcmp(out->p + out->n - spl, space, spl)) out->n -= spl;
    return 1;
}

/* ---------------- priority BPE ---------------- */

typedef struct {
    double prio;
    int left, right;
    uint32_t llen, rlen;
    int32_t merged;
} hent;

static int hless(const hent *a, const hent *b) {
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

typedef struct {
    hent *h;
    size_t n, cap;
} heap;

static int heap_push(heap *q, hent e) {
    if (q->n == q->cap) {
        size_t nc = q->cap ? 2 * q->cap : 64;
        hent *p = realloc(q->h, nc * sizeof *p);
        if (!p) return 0;
        q->h = p;
        q->cap = nc;
    }
    size_t i = q->n++;
    while (i && hless(&e, &q->h[(i - 1) / 2])) {
        q->h[i] = q->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    q->h[i] = e;
    return 1;
}

static hent heap_pop(heap *q) {
    hent top = q->h[0], last = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && hless(&q->h[c + 1], &q->h[c])) c++;
        if (!hless(&q->h[c], &last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n) q->h[i] = last;
    return top;
}

static int try_pair(heap *q, const sl__bpe_sym *s, int a, int b, sl__bpe_pair_fn fn, const void *ctx) {
    if (a < 0 || b < 0 || s[a].frozen || s[b].frozen) return 1;
    hent e = {0, a, b, s[a].len, s[b].len, -1};
    if (!fn(ctx, &s[a], &s[b], &e.prio, &e.merged)) return 1;
    return heap_push(q, e);
}

sl_status sl__bpe_merge(sl__bpe_sym *s, int n, sl__bpe_pair_fn fn, const void *ctx, int32_t **tree) {
    heap q = {0};
    int32_t *tr = NULL;
    int nt = 0;
    if (tree) {
        *tree = NULL;
        if (n > 1 && !(tr = malloc(sizeof(int32_t) * 3 * (size_t)n)))
            return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    int ok = 1;
    for (int i = 1; i < n && ok; i++) ok = try_pair(&q, s, i - 1, i, fn, ctx);
    while (ok && q.n) {
        hent e = heap_pop(&q);
        sl__bpe_sym *a = &s[e.left], *b = &s[e.right];
        if (!a->len || !b->len || a->next != e.right || a->len != e.llen || b->len != e.rlen) continue;
        if (tr) {
            tr[3 * nt] = a->node >= 0 ? a->node : -a->id - 2;
            tr[3 * nt + 1] = b->node >= 0 ? b->node : -b->id - 2;
            tr[3 * nt + 2] = e.merged;
            a->node = nt++;
        }
        a->id = e.merged;
        a->len += b->len;
        a->next = b->next;
        if (b->next >= 0) s[b->next].prev = e.left;
        b->len = 0;
        ok = try_pair(&q, s, a->prev, e.left, fn, ctx) && try_pair(&q, s, e.left, a->next, fn, ctx);
    }
    free(q.h);
    if (!ok) {
        free(tr);
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (tree) *tree = tr;
    return SL_OK;
}

/* ---------------- model encode ---------------- */

typedef struct {
    const sl__sp_model *m;
    const char *text;
} sp_ctx;

static int sp_pair(const void *ctx, const sl__bpe_sym *a, const sl__bpe_sym *b, double *prio,
                   int32_t *merged) {
    const sp_ctx *c = ctx;
    int id = sl__sp_lookup(c->m, c->text + a->start, a->len + b->len);
    if (id < 0) return 0;
    *prio = -(double)c->m->score[id];
    *merged = id;
    return 1;
}

typedef struct {
    int32_t **ids;
    int *n, *cap;
    int prev_unk;
} out_ids;

static int push_id(out_ids *o, int32_t id) {
    if (*o->n == *o->cap) {
        int nc = *o->cap ? 2 * *o->cap : 256;
        int32_t *p = realloc(*o->ids, sizeof(int32_t) * (size_t)nc);
        if (!p) return 0;
        *o->ids = p;
        *o->cap = nc;
    }
    (*o->ids)[(*o->n)++] = id;
    return 1;
}

/* step 3: byte fallback / fusing of unknown pieces */
static int emit(const sl__sp_model *m, out_ids *o, const char *w, size_t wl, int32_t id) {
    int unk = m->type[id] == SL_SP_UNKNOWN;
    int ok = 1;
    if (unk && m->byte_fallback) {
        for (size_t i = 0; i < wl && ok; i++) ok = push_id(o, m->byte_id[(unsigned char)w[i]]);
    } else if (!(unk && o->prev_unk)) {
        ok = push_id(o, id);
    }
    o->prev_unk = unk;
    return ok;
}

/* ids of a merged BPE symbol, splitting UNUSED pieces back into their parts (iterative) */
static int reseg(const sl__sp_model *m, const int32_t *tree, int32_t ref, int32_t *stack, out_ids *o,
                 const char *w, size_t wl) {
    int sp = 0;
    stack[sp++] = ref;
    while (sp) {
        int32_t r = stack[--sp];
        int32_t id = r >= 0 ? tree[3 * r + 2] : -r - 2;
        if (r >= 0 && m->type[id] == SL_SP_UNUSED) {
            stack[sp++] = tree[3 * r + 1];
            stack[sp++] = tree[3 * r];
            continue;
        }
        /* byte fallback needs the piece text: only leaves can be unknown, and they are single symbols */
        if (!emit(m, o, r >= 0 ? m->piece[id] : w, r >= 0 ? m->len[id] : wl, id)) return 0;
    }
    return 1;
}

static sl_status encode_bpe(const sl__sp_model *m, const char *t, size_t n, out_ids *o) {
    int ns = 0;
    sl__bpe_sym *s = malloc(sizeof *s * (n ? n : 1));
    int32_t *stack = malloc(sizeof(int32_t) * (n + 2));
    if (!s || !stack) {
        free(s);
        free(stack);
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (size_t i = 0; i < n;) {
        size_t k = 0;
        int frozen = 0;
        for (int u = 0; u < m->n_user && !k; u++) {
            int id = m->user[u];
            if (m->len[id] <= n - i && !memcmp(t + i, m->piece[id], m->len[id])) k = m->len[id], frozen = 1;
        }
        if (!k) k = one_char_len((const uint8_t *)t + i, n - i);
        s[ns] =
            (sl__bpe_sym){sl__sp_piece_to_id(m, t + i, k), (uint32_t)i, (uint32_t)k, ns - 1, -1, -1, frozen};
        ns++;
        i += k;
    }
    if (ns) s[ns - 1].next = -1;
    for (int i = 0; i + 1 < ns; i++) s[i].next = i + 1;
    sp_ctx c = {m, t};
    int32_t *tree = NULL;
    sl_status st = sl__bpe_merge(s, ns, sp_pair, &c, &tree);
    for (int i = 0; st == SL_OK && ns && i >= 0; i = s[i].next) {
        int32_t ref = s[i].node >= 0 ? s[i].node : -s[i].id - 2;
        if (!reseg(m, tree, ref, stack, o, t + s[i].start, s[i].len))
            st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    free(tree);
    free(stack);
    free(s);
    return st;
}

static sl_status encode_unigram(const sl__sp_model *m, const char *t, size_t n, out_ids *o) {
    float *best = malloc(sizeof(float) * (n + 1));
    int *from = malloc(sizeof(int) * (n + 1)), *bid = malloc(sizeof(int) * (n + 1));
    if (!best || !from || !bid) {
        free(best);
        free(from);
        free(bid);
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (size_t i = 0; i <= n; i++) best[i] = 0, from[i] = -1, bid[i] = -1;
    const float unk_score = m->min_score - 10.0f;
    for (size_t st = 0; st < n;) {
        const float here = best[st];
        size_t mblen = one_char_len((const uint8_t *)t + st, n - st);
        int single = 0;
        uint64_t h = SL_FNV_INIT;
        size_t lim = n - st < m->max_len ? n - st : m->max_len;
        for (size_t k = 1; k <= lim; k++) { /* every byte prefix, as the trie walks it */
            h = sl__fnv_step(h, (unsigned char)t[st + k - 1]);
            if (!sl__sp_is_prefix(m, h)) break;
            int id = sl__sp_lookup_h(m, t + st, k, h);
            if (id < 0 || m->type[id] == SL_SP_UNUSED) continue;
            float score = m->type[id] == SL_SP_USER_DEFINED ? (float)((double)((float)k * m->max_score) - 0.1)
                                                            : m->score[id];
            float cand = score + here;
            size_t e = st + k;
            if (from[e] == -1 || cand > best[e]) {
                best[e] = (float)cand;
                from[e] = (int)st;
                bid[e] = id;
            }
            if (k == mblen) single = 1;
        }
        if (!single) {
            float cand = unk_score + here;
            size_t e = st + mblen;
            if (from[e] == -1 || cand > best[e]) {
                best[e] = cand;
                from[e] = (int)st;
                bid[e] = m->unk_id;
            }
        }
        st += mblen;
    }
    /* backtrack into `from` order, then emit left to right */
    int cnt = 0;
    for (size_t e = n; e > 0; e = (size_t)from[e]) cnt++;
    int *path = malloc(sizeof(int) * (size_t)(cnt ? cnt : 1));
    sl_status st = SL_OK;
    if (!path) st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    int k = cnt;
    for (size_t e = n; path && e > 0; e = (size_t)from[e]) path[--k] = (int)e;
    for (int i = 0; st == SL_OK && i < cnt; i++) {
        size_t e = (size_t)path[i], b = (size_t)from[e];
        if (!emit(m, o, t + b, e - b, bid[e])) st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    free(path);
    free(best);
    free(from);
    free(bid);
    return st;
}

sl_status sl__sp_encode(const sl__sp_model *m, const char *text, size_t len, int32_t **ids, int *n,
                        int *cap) {
    sbuf nb = {0};
    if (!sp_normalize(m, (const uint8_t *)text, len, &nb)) {
        free(nb.p);
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (nb.n > 0x7FFFFFF0u) {
        free(nb.p);
        return sl_fail(SL_ERR_INVALID, "tokenizer: text of %zu bytes is too long for one encode call", len);
    }
    out_ids o = {ids, n, cap, 0};
    sl_status st = SL_OK;
    if (nb.n)
        st = m->model_type == SL_SP_BPE ? encode_bpe(m, nb.p, nb.n, &o) : encode_unigram(m, nb.p, nb.n, &o);
    free(nb.p);
    return st;
}

/* ---------------- decode ---------------- */

static int byte_of(const sl__sp_model *m, int32_t id) {
    unsigned v = 0;
    return sscanf(m->piece[id] + 3, "%2X", &v) == 1 ? (int)v : 0;
}

static int flush_bytes(sbuf *out, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(b + i, (utf8proc_ssize_t)(n - i < 4 ? n - i : 4), &cp);
        if (k <= 0) {
            if (!sb_put(out, "\xEF\xBF\xBD", 3)) return 0;
            i++;
        } else {
            if (!sb_put(out, b + i, (size_t)k)) return 0;
            i += (size_t)k;
        }
    }
    return 1;
}

static int put_piece(sbuf *out, const char *p, size_t n) {
    for (size_t i = 0; i < n;) {
        if (n - i >= 3 && !memcmp(p + i, k_ws, 3)) {
            if (!sb_put(out, " ", 1)) return 0;
            i += 3;
        } else {
            if (!sb_put(out, p + i, 1)) return 0;
            i++;
        }
    }
    return 1;
}

sl_status sl__sp_decode(const sl__sp_model *m, const int32_t *ids, int n, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    sbuf o = {0};
    uint8_t *bytes = malloc((size_t)(n > 0 ? n : 1));
    if (!bytes || !sb_put(&o, "", 0)) {
        free(bytes);
        free(o.p);
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t nb = 0;
    int is_bos_ws = 1, bos_ws_seen = 0, ok = 1;
    for (int i = 0; i < n && ok; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= m->n) {
            free(bytes);
            free(o.p);
            return sl_fail(SL_ERR_INVALID, "tokenizer: id %d out of range [0, %d)", id, m->n);
        }
        if (m->type[id] == SL_SP_BYTE) {
            bytes[nb++] = (uint8_t)byte_of(m, id);
            continue;
        }
        ok = flush_bytes(&o, bytes, nb);
        nb = 0;
        if (bos_ws_seen || o.n) is_bos_ws = 0;
        bos_ws_seen = 0;
        if (m->type[id] == SL_SP_CONTROL) continue;
        if (m->type[id] == SL_SP_UNKNOWN) {
            ok = ok && sb_put(&o, m->unk_surface, strlen(m->unk_surface));
            continue;
        }
        const char *p = m->piece[id];
        size_t pl = m->len[id];
        if (is_bos_ws && (m->add_dummy_prefix || m->remove_extra_ws) && pl >= 3 && !memcmp(p, k_ws, 3)) {
            p += 3;
            pl -= 3;
            bos_ws_seen = !m->remove_extra_ws;
        }
        ok = ok && put_piece(&o, p, pl);
    }
    ok = ok && flush_bytes(&o, bytes, nb);
    free(bytes);
    if (!ok) {
        free(o.p);
        return sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    *out = o.p;
    *len = o.n;
    return SL_OK;
}

int sl__sp_decode_one(const sl__sp_model *m, int32_t id, char *buf, int cap) {
    if (id < 0 || id >= m->n) return -1;
    int t = m->type[id];
    if (t == SL_SP_CONTROL) return 0;
    if (t == SL_SP_BYTE) {
        if (cap > 0) buf[0] = (char)byte_of(m, id);
        return cap > 0;
    }
    const char *p = t == SL_SP_UNKNOWN ? m->unk_surface : m->piece[id];
    size_t n = strlen(p);
    int w = 0;
    for (size_t i = 0; i < n && w < cap;) {
        if (t != SL_SP_UNKNOWN && n - i >= 3 && !memcmp(p + i, k_ws, 3)) {
            buf[w++] = ' ';
            i += 3;
        } else {
            buf[w++] = p[i++];
        }
    }
    return w;
}
