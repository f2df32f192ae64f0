/* Hugging Face model directories: config.json -> sl_llama_config, (sharded) safetensors -> the flat
 * parameter buffer, and the reverse (sl_hf_save) for `suanli convert`. */
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>

#include "suanli/hf.h"
#include "suanli/hf_gpt2.h"
#include "suanli/safetensors.h"

typedef struct {
    const char *cls, *type;
    sl_arch arch;
} arch_map;
static const arch_map k_archs[] = {
    {"LlamaForCausalLM", "llama", SL_ARCH_LLAMA},          {"Qwen2ForCausalLM", "qwen2", SL_ARCH_QWEN2},
    {"MistralForCausalLM", "mistral", SL_ARCH_MISTRAL},    {"MixtralForCausalLM", "mixtral", SL_ARCH_MIXTRAL},
    {"BaichuanForCausalLM", "baichuan", SL_ARCH_BAICHUAN}, {"GPT2LMHeadModel", "gpt2", SL_ARCH_GPT2},
};
#define N_ARCHS ((int)(sizeof k_archs / sizeof k_archs[0]))

static int file_exists(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISREG(s.st_mode);
}

static sl_status read_json(const char *path, cJSON **out) {
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    SL_TRY(sl_file_read_all(path, &text, &len));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sl_fail(SL_ERR_FORMAT, "%s: not a JSON object", path);
    }
    *out = root;
    return SL_OK;
}

/* key absent or null -> def (if def_ok) else error; present -> must be an integer */
static sl_status jint(const cJSON *o, const char *path, const char *key, int def_ok, int def, int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        if (!def_ok) return sl_fail(SL_ERR_FORMAT, "%s: missing field '%s'", path, key);
        *out = def;
        return SL_OK;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int)it->valuedouble)
        return sl_fail(SL_ERR_FORMAT, "%s: field '%s' must be an integer", path, key);
    *out = (int)it->valuedouble;
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

/* eos_token_id: int or list of ints */
static sl_status add_eos(const cJSON *o, const char *path, sl_hf_info *info) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id");
    if (!it || cJSON_IsNull(it)) return SL_OK;
    const cJSON *e;
    if (cJSON_IsNumber(it)) {
        if (info->n_eos < SL_HF_MAX_EOS) info->eos_ids[info->n_eos++] = it->valueint;
        return SL_OK;
    }
    if (!cJSON_IsArray(it))
        return sl_fail(SL_ERR_FORMAT, "%s: field 'eos_token_id' must be an integer or a list", path);
    cJSON_ArrayForEach(e, it) {
        if (!cJSON_IsNumber(e))
            return sl_fail(SL_ERR_FORMAT, "%s: field 'eos_token_id' must hold integers", path);
        int dup = 0;
        for (int i = 0; i < info->n_eos; i++) dup |= info->eos_ids[i] == e->valueint;
        if (!dup && info->n_eos < SL_HF_MAX_EOS) info->eos_ids[info->n_eos++] = e->valueint;
    }
    return SL_OK;
}

static sl_status parse_config(const cJSON *r, const char *path, sl_llama_config *c, sl_hf_info *info) {
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
                       "MistralForCausalLM, MixtralForCausalLM, BaichuanForCausalLM, GPT2LMHeadModel)",
                       path, cls ? cls : type);
    c->arch = k_archs[found].arch;
    if (c->arch == SL_ARCH_GPT2) { /* GPT2LMHeadModel -> our GPT-2 (src/nn/gpt2.c); names and Conv1D layout
                                      mapped on load */
        SL_TRY(jint(r, path, "n_embd", 0, 0, &c->hidden));
        SL_TRY(jint(r, path, "n_layer", 0, 0, &c->n_layer));
        SL_TRY(jint(r, path, "n_head", 0, 0, &c->n_head));
        SL_TRY(jint(r, path, "vocab_size", 0, 0, &c->vocab_size));
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
        if (info) {
            SL_TRY(jint(r, path, "bos_token_id", 1, -1, &info->bos_id));
            SL_TRY(add_eos(r, path, info));
        }
        return SL_OK;
    }
    SL_TRY(jint(r, path, "hidden_size", 0, 0, &c->hidden));
    SL_TRY(jint(r, path, "intermediate_size", 0, 0, &c->intermediate));
    SL_TRY(jint(r, path, "num_hidden_layers", 0, 0, &c->n_layer));
    SL_TRY(jint(r, path, "num_attention_heads", 0, 0, &c->n_head));
    SL_TRY(jint(r, path, "vocab_size", 0, 0, &c->vocab_size));
    if (c->n_head < 1)
        return sl_fail(SL_ERR_FORMAT, "%s: field 'num_attention_heads' must be >= 1, got %d", path,
                       c->n_head);
    SL_TRY(jint(r, path, "num_key_value_heads", 1, c->n_head, &c->n_kv_head));
    SL_TRY(jint(r, path, "head_dim", 1, c->hidden / c->n_head, &c->head_dim));
    if (c->head_dim * c->n_head != c->hidden && !cJSON_GetObjectItemCaseSensitive(r, "head_dim"))
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
    c->qkv_bias = c->arch == SL_ARCH_QWEN2;
    if (c->arch == SL_ARCH_MISTRAL || c->arch == SL_ARCH_MIXTRAL) {
        SL_TRY(jint(r, path, "sliding_window", 1, 0, &c->sliding_window));
    } else if (c->arch == SL_ARCH_QWEN2) {
        int use = 0;
        SL_TRY(jbool(r, path, "use_sliding_window", 0, &use));
        if (use)
            return sl_fail(
                SL_ERR_UNSUPPORTED,
                "%s: field 'use_sliding_window': Qwen2 per-layer sliding windows are not supported", path);
    }
    if (c->arch == SL_ARCH_BAICHUAN && c->n_layer == 40 && c->hidden == 5120)
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "%s: Baichuan2-13B (ALiBi attention) is not supported; BaichuanForCausalLM means the "
                       "7B (RoPE) layout",
                       path);
    if (c->arch == SL_ARCH_MIXTRAL) {
        SL_TRY(jint(r, path, "num_local_experts", 0, 0, &c->n_experts));
        SL_TRY(jint(r, path, "num_experts_per_tok", 0, 0, &c->n_experts_per_tok));
    }
    if (info) {
        SL_TRY(jint(r, path, "bos_token_id", 1, -1, &info->bos_id));
        SL_TRY(add_eos(r, path, info));
    }
    return SL_OK;
}

sl_status sl_hf_load_config(const char *dir, sl_llama_config *cfg, sl_hf_info *info) {
    char path[4096];
    if (info) {
        memset(info, 0, sizeof *info);
        info->bos_id = -1;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *r;
    SL_TRY(read_json(path, &r));
    sl_status st = parse_config(r, path, cfg, info);
    cJSON_Delete(r);
    if (st != SL_OK) return st;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (info && file_exists(path)) {
        SL_TRY(read_json(path, &r));
        st = add_eos(r, path, info);
        cJSON_Delete(r);
    }
    return st;
}

/* ---------------- weights ---------------- */

static float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, f = h & 0x3ff, u;
    if (e == 0) {
        if (f == 0)
            u = s;
        else { /* subnormal */
            e = 127 - 15 + 1;
            while (!(f & 0x400)) {
                f <<= 1;
                e--;
            }
            u = s | (e << 23) | ((f & 0x3ff) << 13);
        }
    } else if (e == 31)
        u = s | 0x7f800000u | (f << 13);
    else
        u = s | ((e + 127 - 15) << 23) | (f << 13);
    float r;
    memcpy(&r, &u, 4);
    return r;
}

static sl_status convert(const sl_st_tensor *x, float *dst, int64_t n, const char *file) {
    const unsigned char *p = x->data;
    if (!strcmp(x->dtype, "F32"))
        memcpy(dst, p, sizeof(float) * (size_t)n);
    else if (!strcmp(x->dtype, "BF16"))
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
            memcpy(dst + i, &u, 4);
        }
    else if (!strcmp(x->dtype, "F16"))
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
    else
        return sl_fail(SL_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (supported: F32, BF16, F16)", file,
                       x->name, x->dtype);
    return SL_OK;
}

typedef struct {
    int n;
    char **names;        /* file names (owned) */
    sl_safetensors **st; /* opened lazily */
    cJSON *index;        /* weight_map owner */
    const cJSON *map;
} shard_set;

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

static int shard_index(shard_set *s, const char *fname) {
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
        SL_TRY(read_json(path, &s->index));
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

/* the tensor named `name`, or NULL with *file set to the file where it was expected */
static const sl_st_tensor *shards_find(shard_set *s, const char *name, const char **file) {
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

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static void shards_free_heap(void *p) {
    shards_close(p);
    free(p);
}

/* Note [Memory-mapped bf16 weights]
 * In bf16 mode a BF16 tensor on disk whose data is 2-byte aligned is not copied: its leaf points into
 * the read-only mapping of the safetensors shard, which the model then owns (wsrc). A 7B model in bf16
 * thus needs its 13.5 GB of mapped weights (paged in on demand, shared with the page cache) plus the f32
 * embedding and norms and the activations: well inside 24 GiB. F32/F16 tensors are converted into wmem. */
sl_status sl_hf_load_weights(sl_model *m, const char *dir, sl_hf_info *info) {
    shard_set s;
    SL_TRY(shards_open(dir, &s));
    sl_status st = SL_OK;
    int mapped = 0;
    int64_t need = 0, woff = 0; /* bf16 elements that cannot be used in place (converted into wmem) */
    for (int i = 0; m->wdtype == SL_BF16 && i < m->n_params; i++) {
        const char *file;
        const sl_st_tensor *x = shards_find(&s, m->params[i].t->name, &file);
        if (m->params[i].t->dtype == SL_BF16 &&
            !(x && !strcmp(x->dtype, "BF16") && !((uintptr_t)x->data & 1)))
            need += m->params[i].numel;
    }
    if (need > 0) {
        m->wmem = sl_malloc_aligned(sizeof(uint16_t) * (size_t)need);
        if (!m->wmem) {
            shards_close(&s);
            return sl_fail(SL_ERR_NOMEM, "cannot allocate %lld bf16 weights", (long long)need);
        }
    }
    for (int i = 0; i < m->n_params && st == SL_OK; i++) {
        const sl_param_info *p = &m->params[i];
        const char *file = NULL;
        const sl_st_tensor *x = shards_find(&s, p->t->name, &file);
        if (!x) {
            st = sl_fail(SL_ERR_FORMAT, "%s/%s: missing tensor '%s'", dir, file, p->t->name);
            break;
        }
        int ok = x->ndim == p->t->ndim;
        for (int d = 0; ok && d < x->ndim; d++) ok = x->shape[d] == p->t->ne[d];
        if (!ok) {
            char got[128] = "", want[128] = "";
            for (int d = 0; d < x->ndim; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? "," : "",
                         (long long)x->shape[d]);
            for (int d = 0; d < p->t->ndim; d++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "",
                         (long long)p->t->ne[d]);
            st = sl_fail(SL_ERR_FORMAT, "%s/%s: tensor '%s' has shape [%s], config.json implies [%s]", dir,
                         file, p->t->name, got, want);
            break;
        }
        if (p->t->dtype == SL_BF16) {
            if (!strcmp(x->dtype, "BF16") && !((uintptr_t)x->data & 1)) {
                sl_tensor_bind(p->t, (void *)x->data); /* zero copy: the mapping outlives the model's use */
                mapped++;
            } else {
                float *tmp = malloc(sizeof(float) * (size_t)p->numel);
                st = tmp ? convert(x, tmp, p->numel, file) : sl_fail(SL_ERR_NOMEM, "out of memory");
                for (int64_t k = 0; st == SL_OK && k < p->numel; k++) m->wmem[woff + k] = f32_to_bf16(tmp[k]);
                free(tmp);
                sl_tensor_bind(p->t, m->wmem + woff);
                woff += p->numel;
            }
        } else {
            st = convert(x, m->params_mem + p->offset, p->numel, file);
            if (m->wdtype == SL_BF16) /* a bf16 model's embedding, norms and biases hold bf16 values too */
                for (int64_t k = 0; k < p->numel; k++) {
                    uint32_t u = (uint32_t)f32_to_bf16(m->params_mem[p->offset + k]) << 16;
                    memcpy(m->params_mem + p->offset + k, &u, 4);
                }
        }
        if (st == SL_OK && info && i == 0)
            snprintf(info->disk_dtype, sizeof info->disk_dtype, "%s", x->dtype);
    }
    if (info) {
        info->n_files = s.n;
        info->n_mapped = mapped;
    }
    if (st == SL_OK && mapped) { /* the model keeps the mappings its leaves point into */
        shard_set *keep = malloc(sizeof *keep);
        if (!keep)
            st = sl_fail(SL_ERR_NOMEM, "out of memory");
        else {
            *keep = s;
            m->wsrc = keep;
            m->wsrc_free = shards_free_heap;
            return SL_OK;
        }
    }
    if (mapped && st != SL_OK) /* leaves point into mappings about to close */
        for (int i = 0; i < m->n_params; i++)
            if (m->params[i].t->dtype == SL_BF16) sl_tensor_bind(m->params[i].t, NULL);
    shards_close(&s);
    return st;
}

sl_status sl_hf_load(const char *dir, sl_model **out, sl_hf_info *info) {
    return sl_hf_load_ex(dir, SL_F32, out, info);
}

/* GPT2LMHeadModel: transformer.* names, Conv1D weights stored (in, out): transposed into nn.Linear layout */
static sl_status load_gpt2(const char *dir, const sl_llama_config *c, sl_model **out, sl_hf_info *info) {
    sl_gpt2_config g = {c->n_layer, c->n_head, c->hidden, c->vocab_size, c->max_seq_len};
    sl_model *m;
    sl_status st = sl_gpt2_new(&g, &m);
    if (st != SL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", sl_errmsg());
        return sl_fail(st, "%s/config.json: %s", dir, msg);
    }
    shard_set s;
    if ((st = shards_open(dir, &s)) != SL_OK) {
        sl_model_free(m);
        return st;
    }
    for (int i = 0; i < m->n_params && st == SL_OK; i++) {
        const sl_param_info *p = &m->params[i];
        const char *ours = p->t->name, *file = NULL;
        char name[160];
        snprintf(name, sizeof name, "transformer.%s%s", ours, strchr(ours, '.') ? "" : ".weight");
        const sl_st_tensor *x = shards_find(&s, name, &file);
        if (!x)
            x = shards_find(&s, name + strlen("transformer."), &file); /* original checkpoints: no prefix */
        if (!x) {
            st = sl_fail(SL_ERR_FORMAT, "%s/%s: missing tensor '%s'", dir, file, name);
            break;
        }
        int conv = p->t->ndim == 2 && strchr(ours, '.'); /* c_attn, c_proj, c_fc weights */
        int64_t r0 = p->t->ne[0], r1 = p->t->ndim == 2 ? p->t->ne[1] : 0;
        int ok = x->ndim == p->t->ndim && (p->t->ndim == 1 ? x->shape[0] == r0
                                                           : (conv ? x->shape[0] == r1 && x->shape[1] == r0
                                                                   : x->shape[0] == r0 && x->shape[1] == r1));
        if (!ok) {
            st = sl_fail(SL_ERR_FORMAT, "%s/%s: tensor '%s' has the wrong shape for config.json", dir, file,
                         name);
            break;
        }
        float *dst = m->params_mem + p->offset;
        if (!conv) {
            st = convert(x, dst, p->numel, file);
        } else {
            float *tmp = malloc(sizeof(float) * (size_t)p->numel);
            st = tmp ? convert(x, tmp, p->numel, file) : sl_fail(SL_ERR_NOMEM, "out of memory");
            for (int64_t a = 0; st == SL_OK && a < r0; a++) /* ours (out, in) <- HF (in, out) */
                for (int64_t b = 0; b < r1; b++) dst[a * r1 + b] = tmp[b * r0 + a];
            free(tmp);
        }
        if (st == SL_OK && i == 0) snprintf(info->disk_dtype, sizeof info->disk_dtype, "%s", x->dtype);
    }
    info->n_files = s.n;
    shards_close(&s);
    if (st != SL_OK) {
        sl_model_free(m);
        return st;
    }
    *out = m;
    return SL_OK;
}

sl_status sl_hf_load_ex(const char *dir, sl_dtype wdtype, sl_model **out, sl_hf_info *info) {
    *out = NULL;
    sl_llama_config cfg;
    sl_hf_info local;
    if (!info) info = &local;
    SL_TRY(sl_hf_load_config(dir, &cfg, info));
    if (cfg.arch == SL_ARCH_GPT2) {
        if (wdtype != SL_F32)
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: bf16 mode supports the Llama family, not GPT-2", dir);
        return load_gpt2(dir, &cfg, out, info);
    }
    sl_model *m;
    sl_status st = sl_llama_new_ex(&cfg, wdtype, &m);
    if (st != SL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", sl_errmsg()); /* sl_fail formats into the same buffer */
        return sl_fail(st, "%s/config.json: %s", dir, msg);
    }
    st = sl_hf_load_weights(m, dir, info);
    if (st != SL_OK) {
        sl_model_free(m);
        return st;
    }
    *out = m;
    return SL_OK;
}

/* ---------------- save (convert back to HF) ---------------- */

static const char *arch_class(sl_arch a) {
    for (int i = 0; i < N_ARCHS; i++)
        if (k_archs[i].arch == a) return k_archs[i].cls;
    return NULL;
}

sl_status sl_hf_save(const sl_model *m, const char *dir, sl_dtype dtype, const sl_hf_info *info) {
    if (m->arch == SL_ARCH_GPT2) {
        if (dtype != SL_F32) return sl_fail(SL_ERR_UNSUPPORTED, "convert: GPT-2 is exported in f32 only");
        return sl_hf_gpt2_export(m, dir);
    }
    if (m->wdtype != SL_F32)
        return sl_fail(SL_ERR_UNSUPPORTED, "convert: load the model with f32 weights to save it");
    if (dtype != SL_F32 && dtype != SL_BF16)
        return sl_fail(SL_ERR_INVALID, "convert: dtype must be f32 or bf16");
    const sl_llama_config *c = &m->lcfg;
    sl_status st = SL_OK;
    char path[4096];
    size_t es = dtype == SL_F32 ? 4 : 2;
    sl_st_tensor *ts = calloc((size_t)m->n_params, sizeof *ts);
    uint16_t *half = dtype == SL_BF16 ? malloc(2 * (size_t)m->numel) : NULL;
    cJSON *r = cJSON_CreateObject(), *a = cJSON_CreateArray();
    char *text = NULL;
    if (!ts || !r || !a || (dtype == SL_BF16 && !half)) {
        cJSON_Delete(a);
        st = sl_fail(SL_ERR_NOMEM, "convert: out of memory");
        goto done;
    }
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i];
        ts[i].name = p->t->name;
        ts[i].dtype = dtype == SL_F32 ? "F32" : "BF16";
        ts[i].ndim = p->t->ndim;
        for (int d = 0; d < p->t->ndim; d++) ts[i].shape[d] = p->t->ne[d];
        ts[i].nbytes = es * (size_t)p->numel;
        if (dtype == SL_F32)
            ts[i].data = m->params_mem + p->offset;
        else {
            for (int64_t k = 0; k < p->numel; k++) { /* round to nearest even */
                uint32_t u;
                memcpy(&u, m->params_mem + p->offset + k, 4);
                half[p->offset + k] = (u & 0x7fffffffu) > 0x7f800000u
                                          ? (uint16_t)((u >> 16) | 0x40)
                                          : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
            }
            ts[i].data = half + p->offset;
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[] = {"format", "pt", NULL};
    SL_CHECK(sl_safetensors_write(path, ts, m->n_params, meta));
    cJSON_AddItemToArray(a, cJSON_CreateString(arch_class(m->arch)));
    cJSON_AddItemToObject(r, "architectures", a);
    cJSON_AddStringToObject(r, "model_type", sl_arch_name(m->arch));
    cJSON_AddNumberToObject(r, "hidden_size", c->hidden);
    cJSON_AddNumberToObject(r, "intermediate_size", c->intermediate);
    cJSON_AddNumberToObject(r, "num_hidden_layers", c->n_layer);
    cJSON_AddNumberToObject(r, "num_attention_heads", c->n_head);
    cJSON_AddNumberToObject(r, "num_key_value_heads", c->n_kv_head);
    cJSON_AddNumberToObject(r, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(r, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(r, "max_position_embeddings", c->max_seq_len);
    cJSON_AddNumberToObject(r, "rms_norm_eps", c->rms_eps);
    cJSON_AddNumberToObject(r, "rope_theta", c->rope_theta);
    if (c->rope_factor > 0) {
        cJSON *sc = cJSON_CreateObject();
        cJSON_AddStringToObject(sc, "rope_type", "llama3");
        cJSON_AddNumberToObject(sc, "factor", c->rope_factor);
        cJSON_AddNumberToObject(sc, "low_freq_factor", c->rope_low_freq);
        cJSON_AddNumberToObject(sc, "high_freq_factor", c->rope_high_freq);
        cJSON_AddNumberToObject(sc, "original_max_position_embeddings", c->rope_orig_ctx);
        cJSON_AddItemToObject(r, "rope_scaling", sc);
    }
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tie_embeddings);
    if (c->arch == SL_ARCH_MISTRAL || c->arch == SL_ARCH_MIXTRAL) {
        if (c->sliding_window)
            cJSON_AddNumberToObject(r, "sliding_window", c->sliding_window);
        else
            cJSON_AddNullToObject(r, "sliding_window");
    }
    if (c->arch == SL_ARCH_MIXTRAL) {
        cJSON_AddNumberToObject(r, "num_local_experts", c->n_experts);
        cJSON_AddNumberToObject(r, "num_experts_per_tok", c->n_experts_per_tok);
    }
    if (info && info->bos_id >= 0) cJSON_AddNumberToObject(r, "bos_token_id", info->bos_id);
    if (info && info->n_eos == 1)
        cJSON_AddNumberToObject(r, "eos_token_id", info->eos_ids[0]);
    else if (info && info->n_eos > 1)
        cJSON_AddItemToObject(r, "eos_token_id", cJSON_CreateIntArray(info->eos_ids, info->n_eos));
    cJSON_AddStringToObject(r, "torch_dtype", dtype == SL_F32 ? "float32" : "bfloat16");
    text = cJSON_Print(r);
    if (!text) {
        st = sl_fail(SL_ERR_NOMEM, "convert: out of memory");
        goto done;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    SL_CHECK(sl_file_write_atomic(path, text, strlen(text)));
done:
    free(ts);
    free(half);
    free(text);
    cJSON_Delete(r);
    return st;
}
