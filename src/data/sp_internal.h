/* Private: SentencePiece models (sp_model.c reads tokenizer.model, sp_tokenizer.c encodes/decodes) and the
 * pieces shared with hf_tokenizer.c (score/rank-priority BPE merging, the precompiled-charsmap trie).
 * Not a public API. */
#ifndef SL_SP_INTERNAL_H
#define SL_SP_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "suanli/base.h"

/* ModelProto.SentencePiece.Type */
enum { SL_SP_NORMAL = 1, SL_SP_UNKNOWN, SL_SP_CONTROL, SL_SP_USER_DEFINED, SL_SP_UNUSED, SL_SP_BYTE };
/* TrainerSpec.model_type */
enum { SL_SP_UNIGRAM = 1, SL_SP_BPE = 2 };

/* The double array (darts-clone) of a NormalizerSpec.precompiled_charsmap: blob = u32 trie size, trie
 * units, NUL-terminated replacement strings. */
typedef struct sl__charsmap {
    uint32_t *units;
    size_t n_units;
    char *norm; /* replacement strings, NUL-terminated (a copy with one extra NUL) */
    size_t norm_len;
} sl__charsmap;
/* Validate and copy a blob; errors name path and field. An empty blob gives an empty map (identity). */
sl_status sl__charsmap_init(sl__charsmap *c, const uint8_t *blob, size_t len, const char *path,
                            const char *field);
void sl__charsmap_free(sl__charsmap *c);
/* Longest rule matching a prefix of s[0..n): its length (0 if none) and *rep (NUL-terminated). */
size_t sl__charsmap_match(const sl__charsmap *c, const uint8_t *s, size_t n, const char **rep);

typedef struct sl__sp_model {
    int n;                                            /* pieces = vocab size */
    char **piece;                                     /* [n] NUL-terminated UTF-8 */
    uint32_t *len;                                    /* [n] bytes */
    float *score;                                     /* [n] */
    uint8_t *type;                                    /* [n] SL_SP_* */
    int model_type;                                   /* SL_SP_UNIGRAM | SL_SP_BPE */
    int byte_fallback;                                /* trainer_spec.byte_fallback */
    int add_dummy_prefix, remove_extra_ws, escape_ws; /* normalizer_spec */
    int unk_id, bos_id, eos_id;                       /* bos/eos: -1 if not a CONTROL piece */
    char *unk_surface;                                /* decode of <unk>, default " \u2047 " */
    char *norm_name;                                  /* normalizer_spec.name */
    sl__charsmap cmap;
    int byte_id[256]; /* id of <0xNN>, or unk_id */
    float min_score, max_score;
    int *user; /* USER_DEFINED ids (matched verbatim, longest first) */
    int n_user;
    int *hash;  /* open addressing over NORMAL/USER_DEFINED/UNUSED pieces; -1 = empty */
    int *rhash; /* the other pieces (reserved) */
    size_t hcap;
    uint64_t *pfx; /* FNV-1a hashes (|1) of every byte prefix of the hashed pieces; 0 = empty */
    size_t pcap;
    uint32_t max_len; /* longest hashed piece, bytes */
} sl__sp_model;

#define SL_FNV_INIT 1469598103934665603ull
static inline uint64_t sl__fnv_step(uint64_t h, unsigned char c) { return (h ^ c) * 1099511628211ull; }

/* Parse a serialized ModelProto (`path` names errors). *out owned: sl__sp_free. */
sl_status sl__sp_parse(const uint8_t *buf, size_t len, const char *path, sl__sp_model **out);
void sl__sp_free(sl__sp_model *m);
/* id of a NORMAL/USER_DEFINED/UNUSED piece, -1 if none */
int sl__sp_lookup(const sl__sp_model *m, const char *s, size_t n);
/* the same with h = FNV-1a of s (computed incrementally by the caller) */
int sl__sp_lookup_h(const sl__sp_model *m, const char *s, size_t n, uint64_t h);
/* may a hashed piece start with a string of FNV-1a hash h? (false positives only) */
int sl__sp_is_prefix(const sl__sp_model *m, uint64_t h);
/* SentencePiece's PieceToId: reserved pieces, then the others, else unk_id */
int sl__sp_piece_to_id(const sl__sp_model *m, const char *s, size_t n);

/* Encode UTF-8 text (len bytes, validated by the caller) into ids appended to *ids (capacity *cap,
 * count *n; realloc'd). */
sl_status sl__sp_encode(const sl__sp_model *m, const char *text, size_t len, int32_t **ids, int *n, int *cap);
/* SentencePiece's DecodeIds: malloc'd NUL-terminated *out. SL_ERR_INVALID for an id out of range. */
sl_status sl__sp_decode(const sl__sp_model *m, const int32_t *ids, int n, char **out, size_t *len);
/* One id's surface (U+2581 -> ' ', byte pieces -> the byte, control -> nothing); -1 if out of range. */
int sl__sp_decode_one(const sl__sp_model *m, int32_t id, char *buf, int cap);

/* ---- BPE merging by priority (sp_tokenizer.c), shared by tokenizer.model and tokenizer.json BPE ---- */
typedef struct sl__bpe_sym {
    int32_t id;     /* current token id (or -1) */
    uint32_t start; /* byte range in the text */
    uint32_t len;
    int prev, next; /* linked list; len == 0 marks a merged-away symbol */
    int node;       /* merge-tree node (sentencepiece resegmentation), -1 for a leaf */
    int frozen;     /* never merged (user-defined symbols) */
} sl__bpe_sym;
/* If (a, b) may merge: return 1 with *prio (lower merges first; ties: leftmost first) and *merged. */
typedef int (*sl__bpe_pair_fn)(const void *ctx, const sl__bpe_sym *a, const sl__bpe_sym *b, double *prio,
                               int32_t *merged);
/* Merge s[0..n) (linked 0 -> 1 -> ... -> n-1) until no pair applies. *tree (if non-NULL) receives
 * malloc'd [merges][3] = (left node-or-leaf, right, id) records referenced by sym.node; leaves are
 * encoded as -(leaf id) - 2. */
sl_status sl__bpe_merge(sl__bpe_sym *s, int n, sl__bpe_pair_fn fn, const void *ctx, int32_t **tree);
#endif
