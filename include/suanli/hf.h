/* suanli/hf.h — Hugging Face model directories: config.json, (sharded) safetensors, tokenizer.json.
 *
 * Usage:
 *   sl_model *m; sl_hf_info info;
 *   SL_TRY(sl_hf_load("path/to/Llama-dir", &m, &info));     // config + weights (F32/BF16/F16 on disk)
 *   sl_hf_tokenizer *tok;
 *   SL_TRY(sl_hf_tokenizer_load("path/to/Llama-dir/tokenizer.json", &tok));
 *   int32_t *ids; int n;
 *   SL_TRY(sl_hf_tokenizer_encode(tok, "Hello 世界", 1, &ids, &n));   // ids owned: free()
 *   ... sl_model_generate(m, ids, n, ...) ...
 *   sl_hf_tokenizer_free(tok); sl_model_free(m);
 *
 * Supported: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, MixtralForCausalLM,
 * BaichuanForCausalLM (Baichuan2-7B layout) and GPT2LMHeadModel (loaded into src/nn/gpt2.c's model). Errors
 * are one line naming the file and the field or tensor.
 */
#ifndef SUANLI_HF_H
#define SUANLI_HF_H

#include "suanli/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SL_HF_MAX_EOS 8
typedef struct sl_hf_info {
    int bos_id;                 /* -1 if none */
    int eos_ids[SL_HF_MAX_EOS]; /* from config.json and generation_config.json */
    int n_eos;
    char disk_dtype[8]; /* dtype of the first weight on disk: "F32", "BF16", "F16" */
    int n_files;        /* safetensors files read */
    int n_mapped;       /* bf16 mode: weights used in place from the memory-mapped files */
} sl_hf_info;

/* Parse DIR/config.json into cfg (no allocation of weights). info may be NULL. */
sl_status sl_hf_load_config(const char *dir, sl_llama_config *cfg, sl_hf_info *info);
/* Config + weights: model.safetensors or model.safetensors.index.json with its shards. Every tensor's
 * shape is checked; F32/BF16/F16 are converted to the model's f32 buffer. *out owned (sl_model_free). */
sl_status sl_hf_load(const char *dir, sl_model **out, sl_hf_info *info);
/* wdtype SL_BF16: inference model with bf16 projection weights (memory-mapped when stored as aligned BF16)
 * and bf16 compute; SL_F32: sl_hf_load. */
sl_status sl_hf_load_ex(const char *dir, sl_dtype wdtype, sl_model **out, sl_hf_info *info);
/* Fill an existing model's parameters from DIR's safetensors (names and shapes must match). */
sl_status sl_hf_load_weights(sl_model *m, const char *dir, sl_hf_info *info);
/* Write DIR/config.json and DIR/model.safetensors in transformers' layout; dtype SL_F32 or SL_BF16. */
sl_status sl_hf_save(const sl_model *m, const char *dir, sl_dtype dtype, const sl_hf_info *info);

/* ---- generation over any architecture (KV cache for the Llama family) ---- */
typedef struct sl_gen_stats {
    int n_prompt, n_generated;
    double prompt_seconds, gen_seconds; /* prefill time; time of the decode steps */
    int stopped_by_eos;
} sl_gen_stats;
/* Generates up to max_new tokens after the prompt; stops early on any of stop[0..n_stop) (the stop
 * token is passed to cb and counted). cb may be NULL; out_tokens (may be NULL) receives the generated
 * ids (capacity max_new). */
sl_status sl_model_generate(sl_model *m, const int32_t *prompt, int n_prompt, int max_new,
                            const sl_sample_opts *o, const int32_t *stop, int n_stop, sl_token_cb cb,
                            void *user, int32_t *out_tokens, sl_gen_stats *stats);

/* ---- tokenizer.json (byte-level BPE: GPT-2, Llama-3, Qwen2 style) ---- */
typedef struct sl_hf_tokenizer sl_hf_tokenizer;
sl_status sl_hf_tokenizer_load(const char *path, sl_hf_tokenizer **out);
void sl_hf_tokenizer_free(sl_hf_tokenizer *t);
/* Text (UTF-8) -> ids; added/special tokens in the text are matched verbatim; add_special: apply the
 * post-processor template (e.g. Llama-3's BOS). *ids owned: free(). */
sl_status sl_hf_tokenizer_encode(const sl_hf_tokenizer *t, const char *text, int add_special, int32_t **ids,
                                 int *n);
/* One id -> its bytes (byte-level decoding); returns the byte count written (<= cap), -1 if unknown id. */
int sl_hf_tokenizer_decode_one(const sl_hf_tokenizer *t, int32_t id, char *buf, int cap);
int sl_hf_tokenizer_vocab_size(const sl_hf_tokenizer *t);
/* id of a token string (added or vocabulary), -1 if absent */
int sl_hf_tokenizer_token_id(const sl_hf_tokenizer *t, const char *tok);

#ifdef __cplusplus
}
#endif
#endif
