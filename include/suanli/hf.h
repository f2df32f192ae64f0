/* suanli/hf.h — Hugging Face model directories as files (formats layer, src/formats/hf_model.c):
 * config.json <-> a plain sl_hf_config, the (sharded) safetensors weights by name, and their
 * F32/BF16/F16 data as f32. Nothing here knows a model: building an sl_model from a directory (and
 * saving one) is the model zoo's job, `sl_hf_load` & co. in suanli/model_io.h (src/nn/hf_load.c).
 *
 * Usage:
 *   sl_hf_config c; sl_hf_info info;
 *   SL_TRY(sl_hf_config_read("path/to/Llama-dir", &c, &info));   // every field checked
 *   sl_hf_weights *w;
 *   SL_TRY(sl_hf_weights_open("path/to/Llama-dir", &w));         // model.safetensors or index + shards
 *   const char *file;
 *   const sl_st_tensor *x = sl_hf_weights_find(w, "model.norm.weight", &file);   // borrowed; NULL if absent
 *   if (x) SL_TRY(sl_hf_tensor_to_f32(x, dst, n, file));
 *   sl_hf_weights_close(w);
 *
 * Supported config.json classes: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM,
 * MixtralForCausalLM, BaichuanForCausalLM (Baichuan2-7B layout) and GPT2LMHeadModel. Errors are one line
 * naming the file and the field or tensor.
 */
#ifndef SUANLI_HF_H
#define SUANLI_HF_H

#include "suanli/base.h"
#include "suanli/safetensors.h"

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
    int n_unused;       /* tensors in the files that the model does not use (known buffers not counted) */
    /* GPT-2's attn_pdrop, resid_pdrop, embd_pdrop as read (< 0: absent), written back by the config writer */
    float attn_pdrop, resid_pdrop, embd_pdrop;
} sl_hf_info;

/* The config.json classes we read and write. */
typedef enum sl_hf_arch {
    SL_HF_GPT2 = 0,    /* GPT2LMHeadModel */
    SL_HF_LLAMA,       /* LlamaForCausalLM */
    SL_HF_QWEN2,       /* Qwen2ForCausalLM */
    SL_HF_MISTRAL,     /* MistralForCausalLM */
    SL_HF_MIXTRAL,     /* MixtralForCausalLM */
    SL_HF_BAICHUAN,    /* BaichuanForCausalLM */
    SL_HF_QWEN2_MOE,   /* Qwen2MoeForCausalLM */
    SL_HF_DEEPSEEK_V3, /* DeepseekV3ForCausalLM with Llama attention (no MLA: kv_lora_rank null) */
    SL_HF_ARCH_COUNT
} sl_hf_arch;
/* "LlamaForCausalLM", ...; NULL if out of range */
const char *sl_hf_arch_class(sl_hf_arch a);

/* config.json's hyper-parameters (GPT-2's n_embd/n_layer/n_head/vocab_size/n_positions land in
 * hidden/n_layer/n_head/vocab_size/max_seq_len). */
typedef struct sl_hf_config {
    sl_hf_arch arch;
    int n_layer;      /* num_hidden_layers */
    int n_head;       /* num_attention_heads */
    int n_kv_head;    /* num_key_value_heads */
    int head_dim;     /* head_dim, default hidden / n_head */
    int hidden;       /* hidden_size */
    int intermediate; /* intermediate_size */
    int vocab_size;
    int max_seq_len; /* max_position_embeddings */
    float rms_eps;   /* rms_norm_eps */
    float rope_theta;
    float rope_factor, rope_low_freq, rope_high_freq; /* rope_scaling "llama3": factor > 0 */
    int rope_orig_ctx;
    int tie_embeddings;               /* tie_word_embeddings */
    int qkv_bias;                     /* Qwen2 */
    int sliding_window;               /* 0: off */
    int n_experts, n_experts_per_tok; /* Mixtral, Qwen2-MoE, DeepSeek-V3 */
    int moe_intermediate;             /* moe_intermediate_size (Qwen2-MoE, DeepSeek-V3); 0: intermediate */
    int shared_intermediate;          /* shared expert width (Qwen2-MoE shared_expert_intermediate_size,
                                         DeepSeek-V3 n_shared_experts * moe_intermediate_size); 0: none */
    int norm_topk_prob;               /* renormalise the top-k weights (Qwen2-MoE, DeepSeek-V3) */
    int n_group, topk_group;          /* DeepSeek-V3 group-limited routing; 0: off */
    float routed_scaling;             /* DeepSeek-V3 routed_scaling_factor; 0: 1 */
    int first_dense;                  /* DeepSeek-V3 first_k_dense_replace: layers < this are dense */
} sl_hf_config;

/* Parse DIR/config.json (and DIR/generation_config.json's eos ids into info) into cfg. info may be NULL. */
sl_status sl_hf_config_read(const char *dir, sl_hf_config *cfg, sl_hf_info *info);
/* Write DIR/config.json in transformers' layout. torch_dtype: "float32" | "bfloat16". info's bos/eos ids
 * (and GPT-2's dropouts) are recorded (info may be NULL: GPT-2's dropouts are written as 0). */
sl_status sl_hf_config_write(const char *dir, const sl_hf_config *cfg, const sl_hf_info *info,
                             const char *torch_dtype);

/* The weights of a directory: model.safetensors, or model.safetensors.index.json and its shards, all
 * memory-mapped. *out owned: sl_hf_weights_close (tensors found in it are valid until then). */
typedef struct sl_hf_weights sl_hf_weights;
sl_status sl_hf_weights_open(const char *dir, sl_hf_weights **out);
/* The tensor named `name` (borrowed), or NULL; *file is set to the file that holds it or where it was
 * expected (for error messages). */
const sl_st_tensor *sl_hf_weights_find(const sl_hf_weights *w, const char *name, const char **file);
int sl_hf_weights_n_files(const sl_hf_weights *w);
/* Every tensor of every file (an index's shards in weight_map order, each file in data order): the count,
 * and the i-th (borrowed; NULL if i is out of range; *file, if file is not NULL, names its file). */
int sl_hf_weights_count(const sl_hf_weights *w);
const sl_st_tensor *sl_hf_weights_get(const sl_hf_weights *w, int i, const char **file);
void sl_hf_weights_close(sl_hf_weights *w);

/* Convert n elements of an F32/BF16/F16 tensor to f32; other dtypes fail naming `file` and the tensor. */
sl_status sl_hf_tensor_to_f32(const sl_st_tensor *x, float *dst, int64_t n, const char *file);

#ifdef __cplusplus
}
#endif
#endif
