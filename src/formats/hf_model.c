/* Hugging Face model directories as files: config.json <-> sl_hf_config, the (sharded) safetensors
 * weights by name, F32/BF16/F16 -> f32. Models are built from these in src/nn/hf_load.c. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json_util.h"
#include "suanli/hf.h"

typedef struct {
    const char *cls, *type;
    sl_hf_arch arch;
} arch_map;
static const arch_map k_archs[] = {
    {"LlamaForCausalLM", "llama", SL_HF_LLAMA},
    {"Qwen2ForCausalLM", "qwen2", SL_HF_QWEN2},
    {"MistralForCausalLM", "mistral", SL_HF_MISTRAL},
    {"MixtralForCausalLM", "mixtral", SL_HF_MIXTRAL},
    {"BaichuanForCausalLM", "baichuan", SL_HF_BAICHUAN},
    {"GPT2LMHeadModel", "gpt2", SL_HF_GPT2},
    {"Qwen2MoeForCausalLM", "qwen2_moe", SL_HF_QWEN2_MOE},
    {"DeepseekV3ForCausalLM", "deepseek_v3", SL_HF_DEEPSEEK_V3},
};
#define N_ARCHS ((int)(sizeof k_archs / sizeof k_archs[0]))
_Static_assert(N_ARCHS == SL_HF_ARCH_COUNT, "config.json class table out of sync");

static const arch_map *arch_find(sl_hf_arch a) {
    for (int i = 0; i < N_ARCHS; i++)
        if (k_archs[i].arch == a) return &k_archs[i];
    return NULL;
}

const char *sl_hf_arch_class(sl_hf_arch a) {
    const arch_map *m = arch_find(a);
    return m ? m->cls : NULL;
}

static int file_exists(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISREG(s.st_mode);
}

/* key absent or null -> def (if def_ok) else error; present -> must be an integer */
static sl_status jint(const cJSON *o, const char *path, const char *key, int def_ok, int def, int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        if (!def_ok) return sl_fail(SL_ERR_FORMAT, "%s: missing field '%s'", path, key);
        *out = def;
        return SL_OK;
    }
    /* the range test comes first: converting a double outside int's range (1e300, inf) is undefined */
    double v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!(v >= INT_MIN && v <= INT_MAX) || v != floor(v))
        return sl_fail(SL_ERR_FORMAT, "%s: field '%s' must be an integer", path, key);
    *out = (int)it->valuedouble;
    return SL_OK;
}

/* a model dimension: a required integer in [1, SL_HF_MAX_DIM] (products of two dimensions fit an int64, and
 * 4 * hidden or head_dim * heads fit an int) */
#define SL_HF_MAX_DIM (1 << 24)
static sl_status jdim(const cJSON *o, const char *path, const char *key, int def_ok, int def, int *out) {
    SL_TRY(jint(o, path, key, def_ok, def, out));
    if (*out < 1 || *out > SL_HF_MAX_DIM)
        return sl_fail(SL_ERR_FORMAT, "%s: field '%s' must be in [1, %d], got %d", path, key, SL_HF_MAX_DIM,
                       *out);
    return SL_OK;
}

static sl_status jfloat(const cJSON *o, const char *path, const char *key, int def_ok, double def,
                        float *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        if (!def_ok) return sl_fail(SL_ERR_FORMAT, "%s: missing field '%s'", path, key);
        *out = (float)def;
        return SL_OK;
    }
    if (!cJSON_IsNumber(it)) return sl_fail(SL_ERR_FORMAT, "%s: field '%s' must be a number", path, key);
    *out = (float)it->valuedouble;
    return SL_OK;
}

static sl_status jbool(const cJSON *o, const char *path, const char *key, int def, int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        *out = def;
        return SL_OK;
    }
    if (!cJSON_IsBool(it)) return sl_fail(SL_ERR_FORMAT, "%s: field '%s' must be true or false", path, key);
    *out = cJSON_IsTrue(it);
    return SL_OK;
}

/* Qwen2-MoE and DeepSeek-V3 (with Llama attention) MoE fields */
static sl_status parse_moe(const cJSON *r, const char *path, sl_hf_config *c) {
    SL_TRY(jdim(r, path, "num_experts_per_tok", 0, 0, &c->n_experts_per_tok));
    SL_TRY(jdim(r, path, "moe_intermediate_size", 0, 0, &c->moe_intermediate));
    if (c->arch == SL_HF_QWEN2_MOE) {
        int step = 1;
        SL_TRY(jdim(r, path, "num_experts", 0, 0, &c->n_experts));
        SL_TRY(jint(r, path, "shared_expert_intermediate_size", 1, 0, &c->shared_intermediate));
        if (c->shared_intermediate < 0 || c->shared_intermediate > SL_HF_MAX_DIM)
            return sl_fail(SL_ERR_FORMAT, "%s: field 'shared_expert_intermediate_size' must be in [0, %d]",
                           path, SL_HF_MAX_DIM);
        SL_TRY(jbool(r, path, "norm_topk_prob", 0, &c->norm_topk_prob));
        SL_TRY(jint(r, path, "decoder_sparse_step", 1, 1, &step));
        const cJSON *mo = cJSON_GetObjectItemCaseSensitive(r, "mlp_only_layers");
        if (step != 1 || (cJSON_IsArray(mo) && cJSON_GetArraySize(mo) > 0))
            return sl_fail(SL_ERR_UNSUPPORTED,
                           "%s: field '%s': only models whose every layer is sparse are supported", path,
                           step != 1 ? "decoder_sparse_step" : "mlp_only_layers");
        return SL_OK;
    }
    const char *mla[] = {"kv_lora_rank", "q_lora_rank"};
    for (int i = 0; i < 2; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(r, mla[i]);
        if (it && !cJSON_IsNull(it))
            return sl_fail(SL_ERR_UNSUPPORTED,
                           "%s: field '%s': multi-head latent attention (MLA) is not supported; suanli's "
                           "deepseek_v3 is the DeepSeek-V3 MoE block with Llama attention (%s: null)",
                           path, mla[i], mla[i]);
    }
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(r, "scoring_func");
    if (sf && (!cJSON_IsString(sf) || strcmp(sf->valuestring, "sigmoid")))
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'scoring_func' must be \"sigmoid\"", path);
    int n_shared = 1, interleave = 0;
    SL_TRY(jbool(r, path, "rope_interleave", 0, &interleave));
    if (interleave)
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'rope_interleave': only rotate-half RoPE is supported",
                       path);
    SL_TRY(jdim(r, path, "n_routed_experts", 0, 0, &c->n_experts));
    SL_TRY(jint(r, path, "n_shared_experts", 1, 1, &n_shared));
    /* the shared experts form one MLP of n_shared * moe_intermediate_size; keep it a model dimension */
    if (n_shared < 0 || (int64_t)n_shared * c->moe_intermediate > SL_HF_MAX_DIM)
        return sl_fail(SL_ERR_FORMAT,
                       "%s: field 'n_shared_experts' must be in [0, %d] for moe_intermediate_size %d", path,
                       SL_HF_MAX_DIM / c->moe_intermediate, c->moe_intermediate);
    c->shared_intermediate = n_shared * c->moe_intermediate;
    SL_TRY(jint(r, path, "n_group", 1, 1, &c->n_group));
    SL_TRY(jint(r, path, "topk_group", 1, 1, &c->topk_group));
    SL_TRY(jfloat(r, path, "routed_scaling_factor", 1, 1.0, &c->routed_scaling));
    SL_TRY(jbool(r, path, "norm_topk_prob", 1, &c->norm_topk_prob));
    SL_TRY(jint(r, path, "first_k_dense_replace", 1, 0, &c->first_dense));
    return SL_OK;
}

/* one eos id; config.json's and generation_config.json's are merged without duplicates (the same integer
 * in both was kept twice, and convert wrote "eos_token_id": [2, 2]) */
static void add_eos_id(sl_hf_info *info, int id) {
    for (int i = 0; i < info->n_eos; i++)
        if (info->eos_ids[i] == id) return;
    if (info->n_eos < SL_HF_MAX_EOS) info->eos_ids[info->n_eos++] = id;
}

/* Note [Token ids in config.json]
 * bos_token_id and eos_token_id (an integer or a list) name tokens: integers in [0, INT_MAX]. transformers
 * writes null for "none" (kept: -1 / no eos); a negative or fractional value (cJSON's valueint had
 * truncated 2.5 to 2 and kept -5) is refused, naming the file and the field, with the words of
 * sl_model_load_info for suanli's config.json. */
static int is_token_id(const cJSON *it) { /* as sl_model_load_info reads suanli's config.json */
    return sl_json_is_count(it) && it->valuedouble <= INT_MAX;
}

/* Note [Token ids below vocab_size]
 * A token id names a row of the embedding: bos_token_id, eos_token_id (an integer or a list) and
 * pad_token_id of config.json and generation_config.json are only used below vocab_size. Tiny models made
 * by transformers carry its defaults past their vocabulary (GPT2Config's bos/eos 50256 with vocab_size 96),
 * and transformers loads them; such an id (refused for a while) is ignored, with one warning naming the
 * file, the field, the id and vocab_size, and treated as absent: no bos prefix, no stop token, no pad, so
 * nothing downstream embeds or compares against a row that does not exist. The warning comes where the
 * caller asks for the ids (info != NULL), once per load. Negative and non-integer values are still refused
 * by read_bos / add_eos (Note [Token ids in config.json]); pad_token_id, which suanli does not use, only
 * gets the warning (some configs write -1 for "none"). */
static int below_vocab(double id, const char *path, const char *key, int vocab, const sl_hf_info *info) {
    if (id < vocab) return 1;
    if (info)
        SL_LOGW("%s: field '%s': token id %.0f is not below vocab_size %d; ignored", path, key, id, vocab);
    return 0;
}

/* bos_token_id: absent, null or past the vocabulary -> -1 */
static sl_status read_bos(const cJSON *o, const char *path, int vocab, sl_hf_info *info) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "bos_token_id");
    info->bos_id = -1;
    if (!it || cJSON_IsNull(it)) return SL_OK;
    if (!is_token_id(it))
        return sl_fail(SL_ERR_FORMAT, "%s: field 'bos_token_id' must be a token id (an integer >= 0) or null",
                       path);
    if (below_vocab(it->valuedouble, path, "bos_token_id", vocab, info)) info->bos_id = (int)it->valuedouble;
    return SL_OK;
}

/* eos_token_id: int or list of ints (Note [Token ids in config.json]); ids past the vocabulary are left out
 * (Note [Token ids below vocab_size]) */
static sl_status add_eos(const cJSON *o, const char *path, int vocab, sl_hf_info *info) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id");
    if (!it || cJSON_IsNull(it)) return SL_OK;
    const cJSON *e;
    if (cJSON_IsNumber(it)) {
        if (!is_token_id(it))
            return sl_fail(
                SL_ERR_FORMAT,
                "%s: field 'eos_token_id' must be a token id (an integer >= 0), a list of them or null",
                path);
        if (below_vocab(it->valuedouble, path, "eos_token_id", vocab, info))
            add_eos_id(info, (int)it->valuedouble);
        return SL_OK;
    }
    if (!cJSON_IsArray(it))
        return sl_fail(SL_ERR_FORMAT, "%s: field 'eos_token_id' must be an integer or a list", path);
    cJSON_ArrayForEach(e, it) {
        if (!is_token_id(e))
            return sl_fail(SL_ERR_FORMAT, "%s: field 'eos_token_id' must hold token ids (integers >= 0)",
                           path);
    }
    cJSON_ArrayForEach(e, it) {
        if (below_vocab(e->valuedouble, path, "eos_token_id", vocab, info))
            add_eos_id(info, (int)e->valuedouble);
    }
    return SL_OK;
}

/* a field that is not read (pad_token_id; bos_token_id of generation_config.json): bounded above only, the
 * warning alone (Note [Token ids below vocab_size]) */
static void warn_past_vocab(const cJSON *o, const char *path, const char *key, int vocab,
                            const sl_hf_info *info) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(it)) (void)below_vocab(it->valuedouble, path, key, vocab, info);
}

/* the token-id fields of config.json / generation_config.json into info (NULL: config only, nothing read) */
static sl_status read_token_ids(const cJSON *o, const char *path, int vocab, int with_bos, sl_hf_info *info) {
    if (!info) return SL_OK;
    if (with_bos)
        SL_TRY(read_bos(o, path, vocab, info));
    else
        warn_past_vocab(o, path, "bos_token_id", vocab, info);
    SL_TRY(add_eos(o, path, vocab, info));
    warn_past_vocab(o, path, "pad_token_id", vocab, info);
    return SL_OK;
}

static sl_status parse_config(const cJSON *r, const char *path, sl_hf_config *c, sl_hf_info *info) {
    memset(c, 0, sizeof *c);
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(r, "architectures");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(r, "model_type");
    const char *cls = NULL, *type = cJSON_IsString(mt) ? mt->valuestring : NULL;
    if (cJSON_IsArray(archs) && cJSON_GetArraySize(archs) > 0 && cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
        cls = cJSON_GetArrayItem(archs, 0)->valuestring;
    if (!cls && !type)
        return sl_fail(SL_ERR_FORMAT, "%s: missing field 'architectures' (and 'model_type')", path);
    int found = -1;
    for (int i = 0; i < N_ARCHS; i++)
        if ((cls && !strcmp(cls, k_archs[i].cls)) || (!cls && !strcmp(type, k_archs[i].type))) found = i;
    if (found < 0)
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "%s: unsupported architecture '%s' (supported: LlamaForCausalLM, Qwen2ForCausalLM, "
                       "MistralForCausalLM, MixtralForCausalLM, BaichuanForCausalLM, GPT2LMHeadModel, "
                       "Qwen2MoeForCausalLM, DeepseekV3ForCausalLM)",
                       path, cls ? cls : type);
    c->arch = k_archs[found].arch;
    if (c->arch == SL_HF_GPT2) { /* GPT2LMHeadModel (src/nn/hf_load.c maps names and the Conv1D layout) */
        SL_TRY(jdim(r, path, "n_embd", 0, 0, &c->hidden));
        SL_TRY(jdim(r, path, "n_layer", 0, 0, &c->n_layer));
        SL_TRY(jdim(r, path, "n_head", 0, 0, &c->n_head));
        SL_TRY(jdim(r, path, "vocab_size", 0, 0, &c->vocab_size));
        SL_TRY(jint(r, path, "n_positions", 0, 0, &c->max_seq_len));
        int inner = 0, tie = 1;
        float eps;
        SL_TRY(jint(r, path, "n_inner", 1, 4 * c->hidden, &inner));
        SL_TRY(jfloat(r, path, "layer_norm_epsilon", 1, 1e-5, &eps));
        SL_TRY(jbool(r, path, "tie_word_embeddings", 1, &tie));
        const cJSON *act = cJSON_GetObjectItemCaseSensitive(r, "activation_function");
        if (act && (!cJSON_IsString(act) ||
                    (strcmp(act->valuestring, "gelu_new") && strcmp(act->valuestring, "gelu_pytorch_tanh"))))
            return sl_fail(SL_ERR_UNSUPPORTED,
                           "%s: field 'activation_function' must be \"gelu_new\" (tanh GELU)", path);
        if (inner != 4 * c->hidden)
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'n_inner' must be 4 * n_embd", path);
        if (eps != 1e-5f)
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'layer_norm_epsilon' must be 1e-5", path);
        if (!tie)
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'tie_word_embeddings': GPT-2 ties its head", path);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "scale_attn_by_inverse_layer_idx")))
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'scale_attn_by_inverse_layer_idx' is not supported",
                           path);
        SL_TRY(read_token_ids(r, path, c->vocab_size, 1, info)); /* Note [Token ids below vocab_size] */
        if (info) {
            SL_TRY(jfloat(r, path, "attn_pdrop", 1, -1, &info->attn_pdrop));
            SL_TRY(jfloat(r, path, "resid_pdrop", 1, -1, &info->resid_pdrop));
            SL_TRY(jfloat(r, path, "embd_pdrop", 1, -1, &info->embd_pdrop));
        }
        return SL_OK;
    }
    SL_TRY(jdim(r, path, "hidden_size", 0, 0, &c->hidden));
    SL_TRY(jdim(r, path, "intermediate_size", 0, 0, &c->intermediate));
    SL_TRY(jdim(r, path, "num_hidden_layers", 0, 0, &c->n_layer));
    SL_TRY(jdim(r, path, "num_attention_heads", 0, 0, &c->n_head));
    SL_TRY(jdim(r, path, "vocab_size", 0, 0, &c->vocab_size));
    SL_TRY(jdim(r, path, "num_key_value_heads", 1, c->n_head, &c->n_kv_head));
    SL_TRY(jdim(r, path, "head_dim", 1, c->hidden / c->n_head > 0 ? c->hidden / c->n_head : 1, &c->head_dim));
    if ((int64_t)c->head_dim * c->n_head != c->hidden && !cJSON_GetObjectItemCaseSensitive(r, "head_dim"))
        return sl_fail(SL_ERR_FORMAT, "%s: hidden_size %d is not divisible by num_attention_heads %d", path,
                       c->hidden, c->n_head);
    int mp = 0;
    SL_TRY(jint(r, path, "max_position_embeddings", 1, 0, &mp));
    if (!mp) SL_TRY(jint(r, path, "model_max_length", 0, 0, &mp)); /* Baichuan */
    c->max_seq_len = mp;
    SL_TRY(jfloat(r, path, "rms_norm_eps", 1, 1e-6, &c->rms_eps));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(r, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(r, "rope_scaling");
    if (cJSON_IsObject(rp)) {
        SL_TRY(jfloat(rp, path, "rope_theta", 1, 10000.0, &c->rope_theta));
        rs = rp;
    } else {
        SL_TRY(jfloat(r, path, "rope_theta", 1, 10000.0, &c->rope_theta));
    }
    if (rs && !cJSON_IsNull(rs)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "llama3")) {
            SL_TRY(jfloat(rs, path, "factor", 0, 0, &c->rope_factor));
            SL_TRY(jfloat(rs, path, "low_freq_factor", 0, 0, &c->rope_low_freq));
            SL_TRY(jfloat(rs, path, "high_freq_factor", 0, 0, &c->rope_high_freq));
            SL_TRY(jint(rs, path, "original_max_position_embeddings", 0, 0, &c->rope_orig_ctx));
        } else if (!cJSON_IsString(t) || strcmp(t->valuestring, "default") != 0) {
            return sl_fail(
                SL_ERR_UNSUPPORTED,
                "%s: field 'rope_scaling': only the default and llama3 RoPE are supported, got '%s'", path,
                cJSON_IsString(t) ? t->valuestring : "?");
        }
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(r, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'hidden_act' must be \"silu\"", path);
    SL_TRY(jbool(r, path, "tie_word_embeddings", 0, &c->tie_embeddings));
    int ab = 0, mb = 0;
    SL_TRY(jbool(r, path, "attention_bias", 0, &ab));
    SL_TRY(jbool(r, path, "mlp_bias", 0, &mb));
    if (ab || mb)
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: field '%s': biases in Llama projections are not supported",
                       path, ab ? "attention_bias" : "mlp_bias");
    c->qkv_bias = c->arch == SL_HF_QWEN2 || c->arch == SL_HF_QWEN2_MOE;
    if (c->arch == SL_HF_QWEN2_MOE) /* Qwen2MoeConfig.qkv_bias, default true */
        SL_TRY(jbool(r, path, "qkv_bias", 1, &c->qkv_bias));
    if (c->arch == SL_HF_MISTRAL || c->arch == SL_HF_MIXTRAL) {
        SL_TRY(jint(r, path, "sliding_window", 1, 0, &c->sliding_window));
    } else if (c->arch == SL_HF_QWEN2 || c->arch == SL_HF_QWEN2_MOE) {
        int use = 0;
        SL_TRY(jbool(r, path, "use_sliding_window", 0, &use));
        if (use)
            return sl_fail(
                SL_ERR_UNSUPPORTED,
                "%s: field 'use_sliding_window': Qwen2 per-layer sliding windows are not supported", path);
    }
    if (c->arch == SL_HF_BAICHUAN && c->n_layer == 40 && c->hidden == 5120)
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "%s: Baichuan2-13B (ALiBi attention) is not supported; BaichuanForCausalLM means the "
                       "7B (RoPE) layout",
                       path);
    if (c->arch == SL_HF_MIXTRAL) {
        SL_TRY(jdim(r, path, "num_local_experts", 0, 0, &c->n_experts));
        SL_TRY(jdim(r, path, "num_experts_per_tok", 0, 0, &c->n_experts_per_tok));
    }
    if (c->arch == SL_HF_QWEN2_MOE || c->arch == SL_HF_DEEPSEEK_V3) SL_TRY(parse_moe(r, path, c));
    return read_token_ids(r, path, c->vocab_size, 1, info); /* Note [Token ids below vocab_size] */
}

sl_status sl_hf_config_read(const char *dir, sl_hf_config *cfg, sl_hf_info *info) {
    char path[4096];
    if (info) {
        memset(info, 0, sizeof *info);
        info->bos_id = -1;
        info->attn_pdrop = info->resid_pdrop = info->embd_pdrop = -1;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *r;
    SL_TRY(sl_json_read_object(path, &r));
    sl_status st = parse_config(r, path, cfg, info);
    cJSON_Delete(r);
    if (st != SL_OK) return st;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (info && file_exists(path)) {
        SL_TRY(sl_json_read_object(path, &r));
        st = read_token_ids(r, path, cfg->vocab_size, 0, info);
        cJSON_Delete(r);
    }
    return st;
}

/* ---------------- weights ---------------- */

sl_status sl_hf_tensor_to_f32(const sl_st_tensor *x, float *dst, int64_t n, const char *file) {
    const unsigned char *p = x->data;
    if (!strcmp(x->dtype, "F32"))
        memcpy(dst, p, sizeof(float) * (size_t)n);
    else if (!strcmp(x->dtype, "BF16"))
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
            memcpy(dst + i, &u, 4);
        }
    else if (!strcmp(x->dtype, "F16"))
        for (int64_t i = 0; i < n; i++) dst[i] = sl_f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
    else
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (supported: F32, BF16, F16)", file,
                       x->name, x->dtype);
    return SL_OK;
}

struct sl_hf_weights {
    int n;
    char **names;        /* file names (owned) */
    sl_safetensors **st; /* one per file */
    cJSON *index;        /* weight_map owner */
    const cJSON *map;
};
typedef struct sl_hf_weights shard_set;

static void shards_close(shard_set *s) {
    for (int i = 0; i < s->n; i++) {
        if (s->st) sl_safetensors_close(s->st[i]);
        free(s->names[i]);
    }
    free(s->names);
    free(s->st);
    cJSON_Delete(s->index);
    memset(s, 0, sizeof *s);
}

void sl_hf_weights_close(sl_hf_weights *w) {
    if (!w) return;
    shards_close(w);
    free(w);
}

int sl_hf_weights_n_files(const sl_hf_weights *w) { return w->n; }

static int shard_index(const shard_set *s, const char *fname) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], fname)) return i;
    return -1;
}

static sl_status shards_open(const char *dir, shard_set *s) {
    memset(s, 0, sizeof *s);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    sl_status st = SL_OK;
    if (file_exists(path)) {
        SL_TRY(sl_json_read_object(path, &s->index));
        s->map = cJSON_GetObjectItemCaseSensitive(s->index, "weight_map");
        if (!cJSON_IsObject(s->map)) {
            cJSON_Delete(s->index);
            s->index = NULL;
            return sl_fail(SL_ERR_FORMAT, "%s: missing field 'weight_map'", path);
        }
        int cap = cJSON_GetArraySize(s->map);
        s->names = calloc((size_t)(cap ? cap : 1), sizeof(char *));
        s->st = calloc((size_t)(cap ? cap : 1), sizeof(sl_safetensors *));
        if (!s->names || !s->st) {
            shards_close(s);
            return sl_fail(SL_ERR_NOMEM, "out of memory");
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, s->map) {
            if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !e->valuestring[0]) {
                st = sl_fail(SL_ERR_FORMAT, "%s: weight_map entry '%s' must be a file name in the directory",
                             path, e->string);
                break;
            }
            if (shard_index(s, e->valuestring) < 0) s->names[s->n++] = strdup(e->valuestring);
        }
    } else {
        s->names = calloc(1, sizeof(char *));
        s->st = calloc(1, sizeof(sl_safetensors *));
        if (!s->names || !s->st) {
            shards_close(s);
            return sl_fail(SL_ERR_NOMEM, "out of memory");
        }
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (!file_exists(path))
            st = sl_fail(SL_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", dir);
        else
            s->names[s->n++] = strdup("model.safetensors");
    }
    for (int i = 0; st == SL_OK && i < s->n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, s->names[i]);
        st = sl_safetensors_open(path, &s->st[i]);
    }
    if (st != SL_OK) shards_close(s);
    return st;
}

sl_status sl_hf_weights_open(const char *dir, sl_hf_weights **out) {
    *out = NULL;
    shard_set *s = malloc(sizeof *s);
    if (!s) return sl_fail(SL_ERR_NOMEM, "out of memory");
    sl_status st = shards_open(dir, s);
    if (st != SL_OK) {
        free(s);
        return st;
    }
    *out = s;
    return SL_OK;
}

int sl_hf_weights_count(const sl_hf_weights *s) {
    int n = 0;
    for (int i = 0; i < s->n; i++) n += sl_safetensors_count(s->st[i]);
    return n;
}

const sl_st_tensor *sl_hf_weights_get(const sl_hf_weights *s, int i, const char **file) {
    for (int f = 0; i >= 0 && f < s->n; f++) {
        int n = sl_safetensors_count(s->st[f]);
        if (i < n) {
            if (file) *file = s->names[f];
            return sl_safetensors_get(s->st[f], i);
        }
        i -= n;
    }
    return NULL;
}

const sl_st_tensor *sl_hf_weights_find(const sl_hf_weights *s, const char *name, const char **file) {
    int i = 0;
    if (s->map) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(s->map, name);
        *file = "model.safetensors.index.json";
        if (!cJSON_IsString(e)) return NULL;
        i = shard_index(s, e->valuestring);
        if (i < 0) return NULL;
    }
    *file = s->names[i];
    return sl_safetensors_find(s->st[i], name);
}

/* ---------------- config.json out ---------------- */

static sl_status write_json(const char *dir, cJSON *r) {
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    if (!text) return sl_fail(SL_ERR_NOMEM, "convert: out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    sl_status st = sl_file_write_atomic(path, text, strlen(text));
    free(text);
    return st;
}

static void write_ids(cJSON *r, const sl_hf_info *info);

/* GPT2LMHeadModel's config.json (the fields transformers' GPT2Config reads; tied head, tanh GELU); the
 * dropouts and bos/eos ids as read into info (without info: no dropout) */
static sl_status write_gpt2(const char *dir, const sl_hf_config *c, const sl_hf_info *info) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return sl_fail(SL_ERR_NOMEM, "export: out of memory");
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(root, "model_type", "gpt2");
    cJSON_AddStringToObject(root, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(root, "n_layer", c->n_layer);
    cJSON_AddNumberToObject(root, "n_head", c->n_head);
    cJSON_AddNumberToObject(root, "n_embd", c->hidden);
    cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(root, "n_positions", c->max_seq_len);
    cJSON_AddNullToObject(root, "n_inner");
    cJSON_AddNumberToObject(root, "layer_norm_epsilon", 1e-5);
    const char *pk[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};
    const float pv[] = {info ? info->resid_pdrop : 0, info ? info->embd_pdrop : 0,
                        info ? info->attn_pdrop : 0};
    for (int i = 0; i < 3; i++) /* absent from the source: GPT2Config's default, as there */
        if (pv[i] >= 0) cJSON_AddNumberToObject(root, pk[i], sl_json_float_dec(pv[i]));
    cJSON_AddBoolToObject(root, "tie_word_embeddings", 1);
    cJSON_AddBoolToObject(root, "scale_attn_weights", 1);
    write_ids(root, info);
    cJSON_AddStringToObject(root, "dtype", "float32");
    return write_json(dir, root);
}

/* bos/eos ids as read (config.json and generation_config.json) */
static void write_ids(cJSON *r, const sl_hf_info *info) {
    if (info && info->bos_id >= 0) cJSON_AddNumberToObject(r, "bos_token_id", info->bos_id);
    if (info && info->n_eos == 1)
        cJSON_AddNumberToObject(r, "eos_token_id", info->eos_ids[0]);
    else if (info && info->n_eos > 1)
        cJSON_AddItemToObject(r, "eos_token_id", cJSON_CreateIntArray(info->eos_ids, info->n_eos));
}

static void write_moe(cJSON *r, const sl_hf_config *c) {
    cJSON_AddNumberToObject(r, "num_experts_per_tok", c->n_experts_per_tok);
    cJSON_AddNumberToObject(r, "moe_intermediate_size", c->moe_intermediate);
    cJSON_AddBoolToObject(r, "norm_topk_prob", c->norm_topk_prob);
    if (c->arch == SL_HF_QWEN2_MOE) {
        cJSON_AddNumberToObject(r, "num_experts", c->n_experts);
        cJSON_AddNumberToObject(r, "shared_expert_intermediate_size", c->shared_intermediate);
        cJSON_AddNumberToObject(r, "decoder_sparse_step", 1);
        cJSON_AddBoolToObject(r, "qkv_bias", c->qkv_bias);
        cJSON_AddBoolToObject(r, "use_sliding_window", 0);
        return;
    }
    cJSON_AddNumberToObject(r, "n_routed_experts", c->n_experts);
    cJSON_AddNumberToObject(r, "n_shared_experts",
                            c->moe_intermediate ? c->shared_intermediate / c->moe_intermediate : 0);
    cJSON_AddNumberToObject(r, "n_group", c->n_group);
    cJSON_AddNumberToObject(r, "topk_group", c->topk_group);
    cJSON_AddNumberToObject(r, "routed_scaling_factor", sl_json_float_dec(c->routed_scaling));
    cJSON_AddNumberToObject(r, "first_k_dense_replace", c->first_dense);
    cJSON_AddStringToObject(r, "scoring_func", "sigmoid");
    cJSON_AddStringToObject(r, "topk_method", "noaux_tc");
    cJSON_AddBoolToObject(r, "rope_interleave", 0);
    cJSON_AddNullToObject(r, "kv_lora_rank");
    cJSON_AddNullToObject(r, "q_lora_rank");
}

sl_status sl_hf_config_write(const char *dir, const sl_hf_config *c, const sl_hf_info *info,
                             const char *torch_dtype) {
    const arch_map *am = arch_find(c->arch);
    if (!am) return sl_fail(SL_ERR_INVALID, "%s/config.json: unknown architecture %d", dir, (int)c->arch);
    if (c->arch == SL_HF_GPT2) return write_gpt2(dir, c, info);
    cJSON *r = cJSON_CreateObject(), *a = cJSON_CreateArray();
    if (!r || !a) {
        cJSON_Delete(r);
        cJSON_Delete(a);
        return sl_fail(SL_ERR_NOMEM, "convert: out of memory");
    }
    cJSON_AddItemToArray(a, cJSON_CreateString(am->cls));
    cJSON_AddItemToObject(r, "architectures", a);
    cJSON_AddStringToObject(r, "model_type", am->type);
    cJSON_AddNumberToObject(r, "hidden_size", c->hidden);
    cJSON_AddNumberToObject(r, "intermediate_size", c->intermediate);
    cJSON_AddNumberToObject(r, "num_hidden_layers", c->n_layer);
    cJSON_AddNumberToObject(r, "num_attention_heads", c->n_head);
    cJSON_AddNumberToObject(r, "num_key_value_heads", c->n_kv_head);
    cJSON_AddNumberToObject(r, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(r, "vocab_size", c->vocab_size);
    /* BaichuanConfig (remote code) names it model_max_length */
    cJSON_AddNumberToObject(r, c->arch == SL_HF_BAICHUAN ? "model_max_length" : "max_position_embeddings",
                            c->max_seq_len);
    cJSON_AddNumberToObject(r, "rms_norm_eps", sl_json_float_dec(c->rms_eps));
    cJSON_AddNumberToObject(r, "rope_theta", sl_json_float_dec(c->rope_theta));
    if (c->rope_factor > 0) {
        cJSON *sc = cJSON_CreateObject();
        cJSON_AddStringToObject(sc, "rope_type", "llama3");
        cJSON_AddNumberToObject(sc, "factor", sl_json_float_dec(c->rope_factor));
        cJSON_AddNumberToObject(sc, "low_freq_factor", sl_json_float_dec(c->rope_low_freq));
        cJSON_AddNumberToObject(sc, "high_freq_factor", sl_json_float_dec(c->rope_high_freq));
        cJSON_AddNumberToObject(sc, "original_max_position_embeddings", c->rope_orig_ctx);
        cJSON_AddItemToObject(r, "rope_scaling", sc);
    }
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tie_embeddings);
    if (c->arch == SL_HF_MISTRAL || c->arch == SL_HF_MIXTRAL) {
        if (c->sliding_window)
            cJSON_AddNumberToObject(r, "sliding_window", c->sliding_window);
        else
            cJSON_AddNullToObject(r, "sliding_window");
    }
    if (c->arch == SL_HF_MIXTRAL) {
        cJSON_AddNumberToObject(r, "num_local_experts", c->n_experts);
        cJSON_AddNumberToObject(r, "num_experts_per_tok", c->n_experts_per_tok);
    }
    if (c->arch == SL_HF_QWEN2_MOE || c->arch == SL_HF_DEEPSEEK_V3) write_moe(r, c);
    write_ids(r, info);
    cJSON_AddStringToObject(r, "torch_dtype", torch_dtype);
    return write_json(dir, r);
}
