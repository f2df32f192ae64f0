/* libFuzzer target: the prompt encoder (text -> ids) of every tokenizer kind suanli loads, on arbitrary
 * bytes: suanli's byte-level BPE and byte tokenizers (`--load`), byte-level BPE tokenizer.json files
 * (GPT-2, Llama-3: `--model`), a Metaspace/byte-fallback tokenizer.json and SentencePiece BPE and Unigram
 * tokenizer.model files (the fixtures of tests/fixtures/sp). The first input byte picks the tokenizer, the
 * rest is the text. Every id must be in the vocabulary and decode; the byte-level tokenizers must also
 * round-trip exactly (decode(encode(text)) == text: they have no normalizer and map every byte), so a
 * mismatch aborts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/data.h"

#define N_HF 5
static const char *const k_hf[N_HF] = {"hf/tok_gpt2/tokenizer.json", "hf/tok_llama3/tokenizer.json",
                                       "sp/bpe.tokenizer.json", "sp/bpe.model", "sp/unigram.model"};
static const int k_hf_roundtrip[N_HF] = {1, 1, 0, 0, 0};
static sl_hf_tokenizer *g_hf[N_HF];
static sl_tokenizer *g_own[2]; /* trained byte-level BPE, byte */

static void init(void) {
    char p[4096];
    for (int i = 0; i < N_HF; i++) {
        snprintf(p, sizeof p, "%s/tests/fixtures/%s", SL_SOURCE_DIR, k_hf[i]);
        if (sl_hf_tokenizer_load(p, &g_hf[i]) != SL_OK) {
            fprintf(stderr, "fuzz_prompt: %s\n", sl_errmsg());
            abort();
        }
    }
    static const char text[] =
        "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, "
        "speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish? "
        "int main(void) { return 0; } 12345 67890 \xe4\xbd\xa0\xe5\xa5\xbd";
    if (sl_tokenizer_train_bpe(text, sizeof text - 1, 300, &g_own[0]) != SL_OK ||
        sl_tokenizer_new_byte(&g_own[1]) != SL_OK) {
        fprintf(stderr, "fuzz_prompt: %s\n", sl_errmsg());
        abort();
    }
}

static void hf_case(int k, const char *text) {
    const sl_hf_tokenizer *t = g_hf[k];
    int32_t *ids = NULL;
    int n = 0, V = sl_hf_tokenizer_vocab_size(t);
    if (sl_hf_tokenizer_encode(t, text, 0, &ids, &n) != SL_OK) {
        free(ids);
        return;
    }
    char buf[256];
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V || sl_hf_tokenizer_decode_one(t, ids[i], buf, sizeof buf) < 0) abort();
    char *out = NULL;
    size_t len = 0;
    if (sl_hf_tokenizer_decode(t, ids, n, 0, &out, &len) != SL_OK) abort(); /* its own ids must decode */
    if (k_hf_roundtrip[k] && (len != strlen(text) || memcmp(out, text, len) != 0)) {
        fprintf(stderr, "fuzz_prompt: %s does not round-trip\n", k_hf[k]);
        abort();
    }
    free(out);
    free(ids);
}

static void own_case(int k, const char *text, size_t len) {
    const sl_tokenizer *t = g_own[k];
    int32_t *ids = NULL;
    int64_t n = 0;
    if (sl_tokenizer_encode(t, text, len, &ids, &n) != SL_OK) abort(); /* byte-level: every input encodes */
    char *out = NULL;
    size_t olen = 0;
    if (sl_tokenizer_decode(t, ids, n, &out, &olen) != SL_OK || olen != len || memcmp(out, text, len) != 0) {
        fprintf(stderr, "fuzz_prompt: suanli %s tokenizer does not round-trip\n", k ? "byte" : "BPE");
        abort();
    }
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_own[1]) init();
    if (size < 1) return 0;
    int k = data[0] % (N_HF + 2);
    char *text = malloc(size); /* NUL-terminated copy of data[1..] */
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    if (k < N_HF)
        hf_case(k, text); /* a C string: the text up to its first NUL */
    else
        own_case(k - N_HF, text, size - 1);
    free(text);
    return 0;
}
