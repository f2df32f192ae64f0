/* suanli/data.h — token shards, tokenizers (byte-level, byte-level BPE), the deterministic loader,
 * and `data prepare`.
 *
 * Usage:
 *   sl_prepare_opts po = {.input = "data/tinyshakespeare.txt", .output_dir = "out/tok",
 *                         .tokenizer_type = "bpe", .vocab_size = 4096, .val_fraction = 0.1};
 *   if (sl_data_prepare(&po) != SL_OK) { fprintf(stderr, "%s\n", sl_errmsg()); return 1; }
 *
 *   sl_dataset *ds;
 *   SL_TRY(sl_dataset_open("out/tok", "train", &ds));
 *   int V = sl_dataset_vocab_size(ds);                 // refuse a model with a different vocab
 *   int32_t *x = malloc(B * T * 4), *y = malloc(B * T * 4);
 *   sl_dataset_samples(ds, T, seed, step, 0, B, x, y);  // samples 0..B-1 of step: a pure function of
 *                                                      // (seed, step, sample), whatever the batch layout
 *   sl_dataset_close(ds);
 *
 *   sl_tokenizer *tok;
 *   SL_TRY(sl_tokenizer_load("out/tok", &tok));         // or "out/tok/tokenizer.json"
 *   int32_t *ids; int64_t n;
 *   sl_tokenizer_encode(tok, "Hello", 5, &ids, &n);      // ids owned by caller: free(ids)
 *   char buf[64]; int nb = sl_tokenizer_decode_token(tok, ids[0], buf, sizeof buf);
 *   sl_tokenizer_free(tok);
 *
 * Files (all little-endian; see src/data/README.md):
 *   DIR/train_000.bin, train_001.bin ...   token shards of the train split (numbered without gaps)
 *   DIR/val_000.bin ...                    token shards of the val split (the last val_fraction of the text)
 *   DIR/tokenizer.json                     the tokenizer that produced them
 * Shard = 64-byte header (magic "SLTOKSH1", version, header size, token width 2|4, vocab size, token count,
 * XXH3-64 of the payload) followed by the tokens. Readers validate every field, the file size, the checksum
 * and that every token is < vocab size.
 *
 *   sl_hf_tokenizer *ht;                                 // a Hugging Face tokenizer.json
 *   SL_TRY(sl_hf_tokenizer_load("path/to/Llama-dir/tokenizer.json", &ht));
 *   int32_t *hids; int hn;
 *   SL_TRY(sl_hf_tokenizer_encode(ht, "Hello 世界", 1, &hids, &hn));   // hids owned: free()
 *   sl_hf_tokenizer_free(ht);
 *
 * Thread-safety: a loaded sl_tokenizer and an open sl_dataset are read-only; encode/decode/batch may be
 * called concurrently from many threads.
 */
#ifndef SUANLI_DATA_H
#define SUANLI_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "suanli/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------
 * Tokenizers
 * ---------------------------------------------------------------------------------------------- */
typedef struct sl_tokenizer sl_tokenizer;

#define SL_BPE_MAX_VOCAB (1 << 20) /* accepted range of a BPE vocab: [257, SL_BPE_MAX_VOCAB] */

/* Load a tokenizer from `path`: a file, or a directory holding tokenizer.json (else tokenizer.model).
 * The file may be suanli's tokenizer.json (type "byte" | "bpe"; verified: type, vocab size, merges
 * consistent with the token bytes), a Hugging Face tokenizer.json (type "hf") or a SentencePiece
 * tokenizer.model (type "sentencepiece"); the last two go through sl_hf_tokenizer_* (encode without special
 * tokens; text must be valid UTF-8). *out owned: _free. */
sl_status sl_tokenizer_load(const char *path, sl_tokenizer **out);
/* "tokenizer.model" for a SentencePiece model, else "tokenizer.json": the name it is saved under in a
 * prepared directory. Static string. */
const char *sl_tokenizer_file_name(const sl_tokenizer *tok);
/* SL_OK if the tokenizers at a and b (files or directories, as sl_tokenizer_load) are the same: same type
 * family, vocab size, every id's token, and the same ids for a multilingual probe text. Otherwise
 * SL_ERR_INVALID with a one-line message naming both and the first difference (load errors pass through).
 * For `train --init-from`: refuse data whose tokenizer is not the model's. */
sl_status sl_tokenizer_files_match(const char *a, const char *b);
/* The byte-level tokenizer: vocab 256, id = byte value. */
sl_status sl_tokenizer_new_byte(sl_tokenizer **out);
/* Train a byte-level BPE on `text` (GPT-2-style pre-split into words, merges never cross words).
 * vocab_size in [257, SL_BPE_MAX_VOCAB]. If the text runs out of pairs before vocab_size is reached, the
 * tokenizer is smaller (check sl_tokenizer_vocab_size). */
sl_status sl_tokenizer_train_bpe(const char *text, size_t len, int vocab_size, sl_tokenizer **out);
/* Save as JSON (atomic write). */
sl_status sl_tokenizer_save(const sl_tokenizer *tok, const char *path);
const char *sl_tokenizer_type(const sl_tokenizer *tok); /* "byte" | "bpe" | "hf" | "sentencepiece"; static */
int sl_tokenizer_vocab_size(const sl_tokenizer *tok);
/* Encode len bytes of text (any bytes; need not be valid UTF-8 nor NUL-terminated). *ids malloc'd and
 * owned by the caller (free); *ids may be NULL when *n == 0. */
sl_status sl_tokenizer_encode(const sl_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                              int64_t *n);
/* Copy the bytes of token `id` into buf (no NUL added); returns the number of bytes of the token (which may
 * be more than cap: then only cap bytes were written), or -1 if id is out of range. Token bytes may be a
 * partial UTF-8 sequence. */
int sl_tokenizer_decode_token(const sl_tokenizer *tok, int32_t id, char *buf, int cap);
/* Decode n ids into a malloc'd, NUL-terminated buffer (*out owned by caller); *len excludes the NUL.
 * SL_ERR_INVALID if an id is out of range. */
sl_status sl_tokenizer_decode(const sl_tokenizer *tok, const int32_t *ids, int64_t n, char **out,
                              size_t *len);
void sl_tokenizer_free(sl_tokenizer *tok);

/* ------------------------------------------------------------------------------------------------
 * Token shards
 * ---------------------------------------------------------------------------------------------- */
#define SL_SHARD_MAGIC "SLTOKSH1"
#define SL_SHARD_VERSION 1
#define SL_SHARD_HEADER_BYTES 64

typedef struct sl_shard_header {
    uint32_t version;      /* SL_SHARD_VERSION */
    uint32_t header_bytes; /* SL_SHARD_HEADER_BYTES */
    uint32_t token_bytes;  /* 2 if vocab_size <= 65536, else 4 */
    uint32_t vocab_size;
    uint64_t num_tokens;
    uint64_t checksum; /* XXH3-64 of the payload bytes */
} sl_shard_header;

/* Write tokens (each must be in [0, vocab_size)) as one shard, atomically. */
sl_status sl_shard_write(const char *path, const int32_t *tokens, int64_t n, int vocab_size);
/* Read and validate a whole shard (header, size, checksum, token range). *tokens malloc'd (caller frees);
 * hdr may be NULL. Errors name the file and the field, e.g. "x.bin: bad magic". */
sl_status sl_shard_read(const char *path, sl_shard_header *hdr, int32_t **tokens, int64_t *n);

/* ------------------------------------------------------------------------------------------------
 * data prepare: text file -> tokenizer.json + train/val shards
 * ---------------------------------------------------------------------------------------------- */
typedef struct sl_prepare_stats {
    int64_t input_bytes;
    int64_t train_tokens, val_tokens;
    int train_shards, val_shards;
    int vocab_size;       /* of the written tokenizer */
    double tokenizer_sec; /* BPE training time (0 for byte) */
    double encode_sec, total_sec;
} sl_prepare_stats;

typedef struct sl_prepare_opts {
    const char *input;          /* text file */
    const char *output_dir;     /* created if missing */
    const char *tokenizer_type; /* "byte" | "bpe"; ignored with tokenizer_file */
    const char *tokenizer_file; /* optional: tokenize with this file (any sl_tokenizer_load accepts: suanli
                                   or HF tokenizer.json, SentencePiece tokenizer.model), copied into DIR */
    int vocab_size;             /* bpe only; in [257, SL_BPE_MAX_VOCAB]. byte: 0 or 256 */
    double val_fraction;        /* in (0, 1); 0 means the default 0.1. The LAST fraction of the text is val */
    int64_t shard_tokens;       /* max tokens per shard; 0 = default (SL_SHARD_DEFAULT_TOKENS) */
    sl_prepare_stats *stats;    /* optional out, filled on success */
} sl_prepare_opts;
#define SL_SHARD_DEFAULT_TOKENS ((int64_t)1 << 27)

/* Writes DIR/train_NNN.bin, DIR/val_NNN.bin, DIR/tokenizer.json (or, with a SentencePiece tokenizer_file,
 * DIR/tokenizer.model; the other name is removed). The BPE is trained on the train part only; a
 * tokenizer_file's text split is moved back to a UTF-8 character boundary.
 * Atomic: every file is written to a temporary name first; on failure nothing new is left behind.
 * Stale shards of an earlier, larger prepare in DIR are removed. */
sl_status sl_data_prepare(const sl_prepare_opts *o);

/* ------------------------------------------------------------------------------------------------
 * Dataset (memory-mapped shards of one split) and the deterministic batch sampler
 * ---------------------------------------------------------------------------------------------- */
typedef struct sl_dataset sl_dataset;

/* mmap DIR/<split>_000.bin, _001.bin ... (until the first missing number); validates every header, the
 * checksum and token range, that all shards agree on vocab size, and (if DIR/tokenizer.json exists) that
 * the tokenizer's vocab size matches. split: "train" | "val". */
sl_status sl_dataset_open(const char *dir, const char *split, sl_dataset **out);
int sl_dataset_vocab_size(const sl_dataset *ds);
int64_t sl_dataset_num_tokens(const sl_dataset *ds); /* all shards of the split, concatenated */
int sl_dataset_num_shards(const sl_dataset *ds);
/* Copy tokens [start, start+n) of the concatenated split into out (for sequential eval). */
sl_status sl_dataset_read(const sl_dataset *ds, int64_t start, int64_t n, int32_t *out);
/* Fill inputs and targets (each B*T int32, row-major [B][T]; targets[b][t] = token after inputs[b][t]) with
 * B windows of T+1 consecutive tokens. Window b's start is uniform in [0, N-T-1], a pure function of
 * (seed, step, rank, micro, b, split): Philox stream = (split<<62 | rank<<31 | micro),
 * counter = step*B + b. SL_ERR_INVALID if the split has fewer than T+1 tokens or B, T, rank, micro < 0. */
sl_status sl_dataset_batch(const sl_dataset *ds, int B, int T, uint64_t seed, uint64_t step, int rank,
                           int micro, int32_t *inputs, int32_t *targets);
/* Fill inputs and targets (each n*T int32, row-major [n][T]) with global samples first .. first+n-1 of
 * optimizer step `step`: sample g is a window of T+1 consecutive tokens whose start is uniform in
 * [0, N-T-1], a pure function of (seed, split, step, g) only (Philox stream = split<<62 | 1<<61 | step,
 * counter = g), so a step's samples do not depend on how they are split into micro-batches or ranks.
 * The trainer's batches (src/train/run.c): micro-batch `micro` (= dp_rank*accum + local micro) of B rows
 * holds samples micro*B .. micro*B+B-1. SL_ERR_INVALID if the split has fewer than T+1 tokens, n or T < 1,
 * first < 0 or step >= 2^61. */
sl_status sl_dataset_samples(const sl_dataset *ds, int T, uint64_t seed, uint64_t step, int64_t first, int n,
                             int32_t *inputs, int32_t *targets);
void sl_dataset_close(sl_dataset *ds);

/* ------------------------------------------------------------------------------------------------
 * Hugging Face tokenizer.json and SentencePiece tokenizer.model (src/data/hf_tokenizer.c, sp_*.c):
 * byte-level BPE (GPT-2, Llama-3, Qwen2 style), SentencePiece-style BPE tokenizer.json (Llama-2, Mistral,
 * Mixtral, Baichuan2: Metaspace or Prepend/Replace, byte_fallback, fuse_unk), and tokenizer.model
 * (SentencePiece BPE or Unigram with its stored normalizer, byte fallback).
 * ---------------------------------------------------------------------------------------------- */
typedef struct sl_hf_tokenizer sl_hf_tokenizer;
/* path: a tokenizer.json, or a SentencePiece tokenizer.model (a file not named *.json whose first byte is not
 * '{' or '['). Errors are
 * one line naming the file and the field. */
sl_status sl_hf_tokenizer_load(const char *path, sl_hf_tokenizer **out);
void sl_hf_tokenizer_free(sl_hf_tokenizer *t);
/* Text (UTF-8) -> ids; added/special tokens in the text are matched verbatim; add_special: apply the
 * post-processor template (e.g. Llama-3's BOS). *ids owned: free(). */
sl_status sl_hf_tokenizer_encode(const sl_hf_tokenizer *t, const char *text, int add_special, int32_t **ids,
                                 int *n);
/* One id -> its bytes (for streaming: byte-level decoding; U+2581 reads as ' ', <0xNN> as the byte, control
 * pieces as nothing); returns the byte count written (<= cap), -1 if unknown id. */
int sl_hf_tokenizer_decode_one(const sl_hf_tokenizer *t, int32_t id, char *buf, int cap);
/* ids -> text as the file's decoder does (tokenizers' decode / sentencepiece's DecodeIds: byte fallback
 * runs, the leading space of add_dummy_prefix dropped, ...). skip_special: drop special added tokens
 * (tokenizer.json; a tokenizer.model always drops control pieces). *out malloc'd, NUL-terminated;
 * SL_ERR_INVALID for an unknown id. */
sl_status sl_hf_tokenizer_decode(const sl_hf_tokenizer *t, const int32_t *ids, int n, int skip_special,
                                 char **out, size_t *len);
int sl_hf_tokenizer_vocab_size(const sl_hf_tokenizer *t);
/* id of a token string (added or vocabulary), -1 if absent */
int sl_hf_tokenizer_token_id(const sl_hf_tokenizer *t, const char *tok);

#ifdef __cplusplus
}
#endif
#endif
