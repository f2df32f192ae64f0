/* Private helpers shared by the files of src/data. Not a public API. */
#ifndef SL_DATA_INTERNAL_H
#define SL_DATA_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "suanli/data.h"

/* ---- shards.c ---- */
/* Serialize a shard (header + payload) into a malloc'd buffer. Tokens must be in [0, vocab). */
sl_status sl__shard_encode(const char *what, const int32_t *tokens, int64_t n, int vocab_size, void **buf,
                           size_t *len);
/* Validate a shard image of fsize bytes (header fields, size, checksum, token range). Errors name `path`. */
sl_status sl__shard_validate(const char *path, const uint8_t *p, size_t fsize, sl_shard_header *hdr);
/* Token i of a validated payload. */
static inline int32_t sl__shard_token(const uint8_t *payload, uint32_t width, int64_t i) {
    const uint8_t *q = payload + (size_t)i * width;
    if (width == 2) return (int32_t)((uint32_t)q[0] | ((uint32_t)q[1] << 8));
    return (int32_t)((uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) |
                     ((uint32_t)q[3] << 24));
}

/* ---- tokenizer.json (tokenizer.c) ---- */
/* Read the vocab_size field of a tokenizer.json without building the tokenizer; -1 + message on error. */
sl_status sl__tokenizer_json_vocab(const char *path, int *vocab);

/* ---- hf_tokenizer.c ---- */
/* sl_hf_tokenizer_encode of len bytes (need not be NUL-terminated; must be valid UTF-8) */
sl_status sl__hf_tokenizer_encode_n(const sl_hf_tokenizer *t, const char *text, size_t len, int add_special,
                                    int32_t **ids, int *n);
/* the stored string of token id (U+2581 piece, byte-level symbols or added token), NULL if none */
const char *sl__hf_tokenizer_piece(const sl_hf_tokenizer *t, int32_t id);
/* 1 if loaded from a SentencePiece tokenizer.model, 0 for a tokenizer.json */
int sl__hf_tokenizer_is_model(const sl_hf_tokenizer *t);

/* ---- tokenizer pre-split (tokenizer_bpe.c) ---- */
/* Length of the GPT-2-style pre-token starting at text[i] (>= 1 when i < len). */
size_t sl__pretok_next(const uint8_t *text, size_t len, size_t i);

/* ---- tokenizer object (tokenizer.c, tokenizer_bpe.c) ---- */
enum { SL_TOK_BYTE = 0, SL_TOK_BPE = 1, SL_TOK_HF = 2 };
struct sl_tokenizer {
    int type;
    sl_hf_tokenizer *hf; /* SL_TOK_HF: a Hugging Face tokenizer.json or SentencePiece tokenizer.model */
    char *src;           /* SL_TOK_HF: the file's bytes, written back by sl_tokenizer_save */
    size_t src_len;
    int vocab;
    int nmerges;
    int32_t *merges; /* [nmerges][2]: merge r joins (a, b) into id 256 + r */
    uint32_t *off;   /* [vocab] token bytes = bytes[off[i] .. off[i]+len[i]) */
    uint32_t *len;
    uint8_t *bytes;
    uint64_t *hkeys; /* merge lookup, open addressing: key a<<32|b, UINT64_MAX = empty */
    int32_t *hrank;
    size_t hcap; /* power of two */
};
/* Build a BPE tokenizer from merges (validates ids). Takes no ownership of `merges`. */
sl_status sl__tokenizer_from_merges(const int32_t *merges, int nmerges, sl_tokenizer **out);
/* Rank of merge (a, b), or -1. */
static inline int32_t sl__merge_rank(const struct sl_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = t->hcap - 1;
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & mask;
    for (;;) {
        if (t->hkeys[h] == key) return t->hrank[h];
        if (t->hkeys[h] == UINT64_MAX) return -1;
        h = (h + 1) & mask;
    }
}
sl_status sl__bpe_encode(const struct sl_tokenizer *t, const uint8_t *text, size_t len, int32_t *out,
                         int64_t *n);
#endif
