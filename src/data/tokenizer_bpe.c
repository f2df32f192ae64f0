/* Byte-level BPE: GPT-2-style pre-split, training with incremental pair counts, encoding by merge rank.
 *
 * Note [Pre-split]
 *   Text is cut into words with the GPT-2 rule
 *       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   evaluated on bytes: "letters" are ASCII letters and every byte >= 0x80 (so UTF-8 letters of any script,
 *   and also invalid UTF-8, stay inside words), "digits" are ASCII digits, whitespace is " \t\n\v\f\r".
 *   Merges never cross words; a word is at least one byte, so the split is total and encode->decode is
 *   the identity on any byte string.
 *
 * Note [BPE training]
 *   Words are counted once (hash map); the unique words are laid out as doubly linked lists of symbols (one
 *   position per byte). A hash map keeps count(a, b) summed over words (weighted by word frequency) and, per
 *   pair, the positions where it occurred (entries may go stale; they are checked when used). A max-heap of
 *   (count, a, b) with lazy invalidation gives the best pair; ties go to the smaller (a, b), so training is
 *   deterministic. Merging (a, b) -> c visits only the recorded occurrences, left to right: unlink b, and
 *   update the counts of the (prev, a) -> (prev, c) and (b, next) -> (c, next) neighbours. Cost per merge is
 *   proportional to the pair's occurrences, not to the corpus or the length of the words (a megabyte of text
 *   without spaces, e.g. Chinese, is one long word).
 *
 * Note [BPE encoding]
 *   Per word: symbols in a linked list, a min-heap of (rank, position) over adjacent pairs that have a merge;
 *   pop the lowest rank (leftmost on ties), skip stale entries, merge, push the two new neighbour pairs.
 *   O(n log n) per word, so a megabyte without spaces is still fast.
 */
#define _GNU_SOURCE
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <string.h>

#include "data/data_internal.h"

/* ---------------------------------------------------------------------------------------------- */
/* pre-split                                                                                      */
enum { C_L, C_N, C_S, C_P };
static inline int bclass(uint8_t c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return C_L;
    if (c >= '0' && c <= '9') return C_N;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return C_S;
    return C_P;
}

size_t sl__pretok_next(const uint8_t *s, size_t len, size_t i) {
    if (i >= len) return 0;
    uint8_t c = s[i];
    if (c == '\'' && i + 1 < len) {
        uint8_t d = s[i + 1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return 2;
        if (i + 2 < len) {
            uint8_t e = s[i + 2];
            if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) return 3;
        }
    }
    size_t j = i;
    if (c == ' ' && i + 1 < len && bclass(s[i + 1]) != C_S) j = i + 1; /* " ?X+" */
    int k = bclass(s[j]);
    if (k != C_S) {
        size_t e = j + 1;
        while (e < len && bclass(s[e]) == k) e++;
        return e - i;
    }
    size_t e = i + 1;
    while (e < len && bclass(s[e]) == C_S) e++;
    if (e == len) return e - i;       /* trailing whitespace: one word */
    if (e - i >= 2) return e - i - 1; /* \s+(?!\S): leave the last one to prefix the next word */
    return 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* encoding                                                                                       */
typedef struct {
    int32_t rank, pos;
} enc_ent;

static inline int enc_less(enc_ent x, enc_ent y) {
    return x.rank < y.rank || (x.rank == y.rank && x.pos < y.pos);
}
static void enc_push(enc_ent *h, int *n, enc_ent e) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!enc_less(e, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}
static enc_ent enc_pop(enc_ent *h, int *n) {
    enc_ent top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        enc_ent best = last;
        if (l < *n && enc_less(h[l], best)) m = l, best = h[l];
        if (r < *n && enc_less(h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

sl_status sl__bpe_encode(const struct sl_tokenizer *t, const uint8_t *text, size_t len, int32_t *out,
                         int64_t *n) {
    size_t cap = 0;
    int32_t *id = NULL, *nx = NULL, *pv = NULL;
    enc_ent *heap = NULL;
    int64_t no = 0;
    sl_status st = SL_OK;
    for (size_t i = 0; i < len;) {
        size_t wl = sl__pretok_next(text, len, i);
        if (wl == 1) {
            out[no++] = text[i];
            i += 1;
            continue;
        }
        if (wl > (size_t)INT32_MAX / 4) {
            st = sl_fail(SL_ERR_INVALID, "tokenizer: word of %zu bytes too long to encode", wl);
            goto done;
        }
        if (wl > cap) {
            size_t nc = cap ? cap : 64;
            while (nc < wl) nc *= 2;
            free(id), free(nx), free(pv), free(heap);
            id = malloc(nc * sizeof *id);
            nx = malloc(nc * sizeof *nx);
            pv = malloc(nc * sizeof *pv);
            heap = malloc(3 * nc * sizeof *heap);
            cap = nc;
            if (!id || !nx || !pv || !heap) {
                st = sl_fail(SL_ERR_NOMEM, "tokenizer: out of memory");
                goto done;
            }
        }
        int W = (int)wl, nh = 0;
        for (int k = 0; k < W; k++) {
            id[k] = text[i + (size_t)k];
            nx[k] = k + 1 < W ? k + 1 : -1;
            pv[k] = k - 1;
        }
        for (int k = 0; k + 1 < W; k++) {
            int32_t r = sl__merge_rank(t, id[k], id[k + 1]);
            if (r >= 0) enc_push(heap, &nh, (enc_ent){r, k});
        }
        while (nh > 0) {
            enc_ent e = enc_pop(heap, &nh);
            int p = e.pos;
            if (id[p] < 0 || nx[p] < 0) continue; /* dead or last */
            int q = nx[p];
            if (sl__merge_rank(t, id[p], id[q]) != e.rank) continue; /* stale */
            id[p] = 256 + e.rank;
            id[q] = -1;
            nx[p] = nx[q];
            if (nx[q] >= 0) pv[nx[q]] = p;
            if (pv[p] >= 0) {
                int32_t r = sl__merge_rank(t, id[pv[p]], id[p]);
                if (r >= 0) enc_push(heap, &nh, (enc_ent){r, pv[p]});
            }
            if (nx[p] >= 0) {
                int32_t r = sl__merge_rank(t, id[p], id[nx[p]]);
                if (r >= 0) enc_push(heap, &nh, (enc_ent){r, p});
            }
        }
        for (int k = 0; k >= 0; k = nx[k]) out[no++] = id[k];
        i += wl;
    }
    *n = no;
done:
    free(id), free(nx), free(pv), free(heap);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* training                                                                                       */
typedef struct {
    int32_t *v;
    int n, cap;
} ivec;
static int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        int nc = a->cap ? 2 * a->cap : 4;
        int32_t *nv = realloc(a->v, (size_t)nc * sizeof *nv);
        if (!nv) return -1;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct {
    int32_t a, b;
    int64_t count;
    ivec occ;  /* positions p where (sym[p], sym[nxt[p]]) was (a, b) when recorded; validated on use */
    int stamp; /* last merge round that pushed it to the heap */
} pair_t;

typedef struct {
    int64_t count;
    int32_t a, b;
} heap_ent;

typedef struct {
    /* all unique words, concatenated: one position per symbol, linked within its word */
    int32_t npos;
    int32_t *sym, *nxt, *prv; /* sym -1 = merged away; nxt/prv -1 at word ends */
    int32_t *word;            /* word index of each position */
    int64_t *freq;            /* per word */
    /* pairs */
    pair_t *pairs;
    int np, pcap;
    uint64_t *hkeys;
    int32_t *hval;
    size_t hcap;
    /* heap */
    heap_ent *heap;
    size_t nh, hcapacity;
    ivec touched;
} trainer;

static inline int heap_better(heap_ent x, heap_ent y) {
    if (x.count != y.count) return x.count > y.count;
    if (x.a != y.a) return x.a < y.a;
    return x.b < y.b;
}
static int heap_push(trainer *T, heap_ent e) {
    if (T->nh == T->hcapacity) {
        size_t nc = T->hcapacity ? 2 * T->hcapacity : 1024;
        heap_ent *nh = realloc(T->heap, nc * sizeof *nh);
        if (!nh) return -1;
        T->heap = nh;
        T->hcapacity = nc;
    }
    size_t i = T->nh++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_better(e, T->heap[p])) break;
        T->heap[i] = T->heap[p];
        i = p;
    }
    T->heap[i] = e;
    return 0;
}
static heap_ent heap_pop(trainer *T) {
    heap_ent top = T->heap[0], last = T->heap[--T->nh];
    size_t i = 0, n = T->nh;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        heap_ent best = last;
        if (l < n && heap_better(T->heap[l], best)) m = l, best = T->heap[l];
        if (r < n && heap_better(T->heap[r], best)) m = r;
        if (m == i) break;
        T->heap[i] = T->heap[m];
        i = m;
    }
    if (n > 0) T->heap[i] = last;
    return top;
}

static inline size_t phash(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & mask;
}

/* Index of pair (a, b), creating it if absent; -1 on OOM. */
static int pair_get(trainer *T, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    if ((size_t)(T->np + 1) * 2 > T->hcap) { /* grow and rehash */
        size_t nc = T->hcap ? 2 * T->hcap : 1024;
        uint64_t *nk = malloc(nc * sizeof *nk);
        int32_t *nv = malloc(nc * sizeof *nv);
        if (!nk || !nv) {
            free(nk), free(nv);
            return -1;
        }
        memset(nk, 0xff, nc * sizeof *nk);
        for (size_t i = 0; i < T->hcap; i++) {
            if (T->hkeys[i] == UINT64_MAX) continue;
            size_t h = phash(T->hkeys[i], nc - 1);
            while (nk[h] != UINT64_MAX) h = (h + 1) & (nc - 1);
            nk[h] = T->hkeys[i];
            nv[h] = T->hval[i];
        }
        free(T->hkeys), free(T->hval);
        T->hkeys = nk, T->hval = nv, T->hcap = nc;
    }
    size_t mask = T->hcap - 1, h = phash(key, mask);
    while (T->hkeys[h] != UINT64_MAX) {
        if (T->hkeys[h] == key) return T->hval[h];
        h = (h + 1) & mask;
    }
    if (T->np == T->pcap) {
        int nc = T->pcap ? 2 * T->pcap : 1024;
        pair_t *np = realloc(T->pairs, (size_t)nc * sizeof *np);
        if (!np) return -1;
        T->pairs = np;
        T->pcap = nc;
    }
    int idx = T->np++;
    T->pairs[idx] = (pair_t){a, b, 0, {0}, -1};
    T->hkeys[h] = key;
    T->hval[h] = idx;
    return idx;
}

/* count(a,b) += delta and remember the pair as touched; pos >= 0 records an occurrence. */
static int pair_add(trainer *T, int32_t a, int32_t b, int64_t delta, int32_t pos) {
    int p = pair_get(T, a, b);
    if (p < 0) return -1;
    pair_t *P = &T->pairs[p];
    P->count += delta;
    if (pos >= 0 && ivec_push(&P->occ, pos)) return -1;
    return ivec_push(&T->touched, p);
}

static void trainer_free(trainer *T) {
    for (int i = 0; i < T->np; i++) free(T->pairs[i].occ.v);
    free(T->pairs), free(T->hkeys), free(T->hval), free(T->heap), free(T->touched.v);
    free(T->sym), free(T->nxt), free(T->prv), free(T->word), free(T->freq);
}

/* Count the unique words of the text and lay them out as linked symbol lists in T. */
static sl_status count_words(trainer *T, const uint8_t *text, size_t len) {
    sl_status st = SL_OK;
    size_t hcap = 1024, nuniq = 0, wcap = 1024;
    int32_t *slot = malloc(hcap * sizeof *slot); /* word index or -1 */
    size_t *woff = malloc(wcap * sizeof *woff), *wl = malloc(wcap * sizeof *wl);
    uint64_t *whash = malloc(wcap * sizeof *whash);
    int64_t *freq = malloc(wcap * sizeof *freq);
    if (!slot || !woff || !wl || !whash || !freq) goto oom;
    memset(slot, 0xff, hcap * sizeof *slot);
    size_t total = 0;
    for (size_t i = 0; i < len;) {
        size_t n = sl__pretok_next(text, len, i);
        uint64_t hv = XXH3_64bits(text + i, n);
        size_t h = (size_t)hv & (hcap - 1);
        while (slot[h] >= 0) {
            int32_t w = slot[h];
            if (whash[w] == hv && wl[w] == n && !memcmp(text + woff[w], text + i, n)) break;
            h = (h + 1) & (hcap - 1);
        }
        if (slot[h] >= 0) {
            freq[slot[h]]++;
        } else {
            if (nuniq == wcap) {
                wcap *= 2;
                size_t *a = realloc(woff, wcap * sizeof *a);
                if (a) woff = a;
                size_t *b = realloc(wl, wcap * sizeof *b);
                if (b) wl = b;
                uint64_t *c = realloc(whash, wcap * sizeof *c);
                if (c) whash = c;
                int64_t *d = realloc(freq, wcap * sizeof *d);
                if (d) freq = d;
                if (!a || !b || !c || !d) goto oom;
            }
            if (total + n >= (size_t)INT32_MAX / 2) {
                st = sl_fail(SL_ERR_INVALID, "bpe: training text too large (unique words exceed 2^30 bytes)");
                goto done;
            }
            woff[nuniq] = i, wl[nuniq] = n, whash[nuniq] = hv, freq[nuniq] = 1;
            slot[h] = (int32_t)nuniq++;
            total += n;
            if (nuniq * 2 > hcap) {
                size_t nc = hcap * 2;
                int32_t *ns = malloc(nc * sizeof *ns);
                if (!ns) goto oom;
                memset(ns, 0xff, nc * sizeof *ns);
                for (size_t w = 0; w < nuniq; w++) {
                    size_t g = (size_t)whash[w] & (nc - 1);
                    while (ns[g] >= 0) g = (g + 1) & (nc - 1);
                    ns[g] = (int32_t)w;
                }
                free(slot);
                slot = ns, hcap = nc;
            }
        }
        i += n;
    }
    T->npos = (int32_t)total;
    T->freq = freq, freq = NULL;
    T->sym = malloc((total + 1) * sizeof *T->sym);
    T->nxt = malloc((total + 1) * sizeof *T->nxt);
    T->prv = malloc((total + 1) * sizeof *T->prv);
    T->word = malloc((total + 1) * sizeof *T->word);
    if (!T->sym || !T->nxt || !T->prv || !T->word) goto oom;
    size_t pos = 0;
    for (size_t w = 0; w < nuniq; w++) {
        for (size_t k = 0; k < wl[w]; k++, pos++) {
            T->sym[pos] = text[woff[w] + k];
            T->word[pos] = (int32_t)w;
            T->prv[pos] = k ? (int32_t)pos - 1 : -1;
            T->nxt[pos] = k + 1 < wl[w] ? (int32_t)pos + 1 : -1;
        }
    }
    goto done;
oom:
    st = sl_fail(SL_ERR_NOMEM, "bpe: out of memory counting words");
done:
    free(slot), free(woff), free(wl), free(whash), free(freq);
    return st;
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

sl_status sl_tokenizer_train_bpe(const char *text, size_t len, int vocab_size, sl_tokenizer **out) {
    *out = NULL;
    if (vocab_size < 257 || vocab_size > SL_BPE_MAX_VOCAB)
        return sl_fail(SL_ERR_INVALID, "bpe: vocab size %d out of range [257, %d]", vocab_size,
                       SL_BPE_MAX_VOCAB);
    if (len > 0 && !text) return sl_fail(SL_ERR_INVALID, "bpe: NULL text");
    trainer T;
    memset(&T, 0, sizeof T);
    sl_status st = SL_OK;
    int nm_target = vocab_size - 256, nm = 0;
    int32_t *merges = malloc((size_t)nm_target * 2 * sizeof *merges);
    if (!merges) return sl_fail(SL_ERR_NOMEM, "bpe: out of memory");
    SL_CHECK(count_words(&T, (const uint8_t *)text, len));
    int32_t *sym = T.sym, *nxt = T.nxt, *prv = T.prv;
    /* initial pair counts and occurrences */
    for (int32_t i = 0; i < T.npos; i++)
        if (nxt[i] >= 0 && pair_add(&T, sym[i], sym[nxt[i]], T.freq[T.word[i]], i)) goto oom;
    for (int p = 0; p < T.np; p++)
        if (heap_push(&T, (heap_ent){T.pairs[p].count, T.pairs[p].a, T.pairs[p].b})) goto oom;
    T.touched.n = 0;
    while (nm < nm_target && T.nh > 0) {
        heap_ent e = heap_pop(&T);
        int p = pair_get(&T, e.a, e.b);
        if (p < 0) goto oom;
        if (T.pairs[p].count != e.count || e.count <= 0) continue; /* stale entry */
        int32_t a = e.a, b = e.b, c = 256 + nm;
        int round = nm + 1;
        merges[2 * nm] = a, merges[2 * nm + 1] = b;
        nm++;
        /* Occurrences left to right (positions of a word are increasing), so (a, a) runs merge like the
         * reference: "aaa" -> "c a". New pairs all contain c, so this list is not appended to meanwhile. */
        ivec occ = T.pairs[p].occ;
        T.pairs[p].occ = (ivec){0};
        qsort(occ.v, (size_t)occ.n, sizeof *occ.v, cmp_i32);
        for (int k = 0; k < occ.n; k++) {
            int32_t i = occ.v[k];
            if (k > 0 && i == occ.v[k - 1]) continue;
            int32_t j = nxt[i];
            if (sym[i] != a || j < 0 || sym[j] != b) continue; /* stale: merged away or changed since */
            int64_t f = T.freq[T.word[i]];
            int32_t pp = prv[i], nn = nxt[j];
            if (pair_add(&T, a, b, -f, -1)) goto oom;
            if (pp >= 0) {
                if (pair_add(&T, sym[pp], a, -f, -1) || pair_add(&T, sym[pp], c, f, pp)) goto oom;
            }
            if (nn >= 0) {
                if (pair_add(&T, b, sym[nn], -f, -1) || pair_add(&T, c, sym[nn], f, i)) goto oom;
            }
            sym[i] = c;
            sym[j] = -1;
            nxt[i] = nn;
            if (nn >= 0) prv[nn] = i;
        }
        free(occ.v);
        p = pair_get(&T, a, b);
        SL_ASSERT(T.pairs[p].count == 0);
        for (int i = 0; i < T.touched.n; i++) {
            pair_t *P = &T.pairs[T.touched.v[i]];
            SL_ASSERT(P->count >= 0);
            if (P->count > 0 && P->stamp != round) {
                P->stamp = round;
                if (heap_push(&T, (heap_ent){P->count, P->a, P->b})) goto oom;
            }
        }
        T.touched.n = 0;
    }
    if (nm < nm_target)
        SL_LOGW("bpe: text has no more pairs to merge; vocab is %d instead of %d", 256 + nm, vocab_size);
    SL_CHECK(sl__tokenizer_from_merges(merges, nm, out));
    goto done;
oom:
    st = sl_fail(SL_ERR_NOMEM, "bpe: out of memory during training");
done:
    free(merges);
    trainer_free(&T);
    return st;
}
