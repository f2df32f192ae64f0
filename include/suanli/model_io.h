/* suanli/model_io.h — models from and to directories (nn layer): suanli's own layout (safetensors +
 * config.json) and Hugging Face model directories of any supported architecture. The files themselves
 * are read and written by the formats layer (suanli/safetensors.h, suanli/hf.h).
 *
 * Usage:
 *   sl_model_save(m, "out/", NULL);        // out/model.safetensors, out/config.json (atomic each)
 *   sl_model *m2; sl_model_load("out/", &m2);
 *
 *   sl_model *m; sl_hf_info info;
 *   SL_TRY(sl_hf_load("path/to/Llama-dir", &m, &info));     // config + weights (F32/BF16/F16 on disk)
 *   ... sl_model_generate(m, ids, n, ...) ...               // suanli/nn.h
 *   sl_model_free(m);
 */
#ifndef SUANLI_MODEL_IO_H
#define SUANLI_MODEL_IO_H
#include "suanli/hf.h"
#include "suanli/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- suanli's layout (src/nn/model_io.c) ---- */
/* Writes DIR/model.safetensors and DIR/config.json. extra_json: optional JSON object text whose keys
 * are added to config.json under "train" (e.g. the training arguments). */
sl_status sl_model_save(const sl_model *m, const char *dir, const char *extra_json);
/* The same, with GPT-2's bos/eos ids and dropouts of info (as sl_hf_load read them; info may be NULL)
 * recorded in config.json under transformers' names (bos_token_id, eos_token_id, attn/resid/embd_pdrop). */
sl_status sl_model_save_ex(const sl_model *m, const char *dir, const char *extra_json,
                           const sl_hf_info *info);
/* Reads those optional fields of DIR/config.json back into info (absent: bos_id -1, n_eos 0, dropouts -1);
 * a present field of the wrong type or range fails naming it. */
sl_status sl_model_load_info(const char *dir, sl_hf_info *info);
/* Reads DIR/config.json, checks it, creates the model and loads every tensor (shape and dtype checked). */
sl_status sl_model_load(const char *dir, sl_model **out);
sl_status sl_model_load_on(const char *dir, sl_backend *be, sl_model **out); /* state on be */
/* Reads only the config (for checks before allocating). */
sl_status sl_model_load_config(const char *dir, sl_gpt2_config *cfg);
/* Checks that DIR/config.json (a checkpoint's model record: architecture, n_layer, n_head, n_embd,
 * vocab_size, max_seq_len) describes model m; one-line error naming the field otherwise. */
sl_status sl_model_check_config(const char *dir, const sl_model *m);
/* Load weights from a safetensors file into an existing model (names/shapes must match). */
sl_status sl_model_load_weights(sl_model *m, const char *path);

/* ---- Hugging Face model directories (src/nn/hf_load.c) ----
 * LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, MixtralForCausalLM, BaichuanForCausalLM
 * (Baichuan2-7B layout) and GPT2LMHeadModel (loaded into src/nn/gpt2.c's model). Errors are one line
 * naming the file and the field or tensor. */
/* Parse DIR/config.json into cfg (no allocation of weights). info may be NULL. */
sl_status sl_hf_load_config(const char *dir, sl_llama_config *cfg, sl_hf_info *info);
/* Config + weights: model.safetensors or model.safetensors.index.json with its shards. Every tensor's
 * shape is checked; F32/BF16/F16 are converted to the model's f32 buffer. *out owned (sl_model_free). */
sl_status sl_hf_load(const char *dir, sl_model **out, sl_hf_info *info);
/* wdtype SL_BF16: inference model with bf16 projection weights (memory-mapped when stored as aligned BF16)
 * and bf16 compute; SL_F32: sl_hf_load. */
sl_status sl_hf_load_ex(const char *dir, sl_dtype wdtype, sl_model **out, sl_hf_info *info);
/* The same with the model's state on backend be (sl_hf_load_ex: cpu). */
sl_status sl_hf_load_on(const char *dir, sl_dtype wdtype, sl_backend *be, sl_model **out, sl_hf_info *info);
/* Fill an existing model's parameters from DIR's safetensors (names and shapes must match). */
sl_status sl_hf_load_weights(sl_model *m, const char *dir, sl_hf_info *info);
/* Write DIR/config.json and DIR/model.safetensors in transformers' layout; dtype SL_F32 or SL_BF16. */
sl_status sl_hf_save(const sl_model *m, const char *dir, sl_dtype dtype, const sl_hf_info *info);

#ifdef __cplusplus
}
#endif
#endif
