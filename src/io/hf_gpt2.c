/* GPT-2 <-> Hugging Face layout. HF's Conv1D stores weights as (in, out); suanli uses nn.Linear's
 * (out, in), so the four projection matrices per layer are transposed on the way in and out. */
#include <cjson/cJSON.h>
#include <string.h>

#include "io/json_util.h"
#include "suanli/hf_gpt2.h"
#include "suanli/safetensors.h"

static int is_conv1d(const char *name) {
    return strstr(name, "c_attn.weight") || strstr(name, "c_proj.weight") || strstr(name, "c_fc.weight");
}

static sl_status read_config(const char *dir, sl_gpt2_config *c) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *root;
    SL_TRY(sl_json_read_object(path, &root));
    sl_status st = SL_OK;
    cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "gpt2") != 0) {
        st = sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'model_type' must be \"gpt2\"", path);
        goto done;
    }
    SL_CHECK(sl_json_int(root, path, "n_layer", 1, &c->n_layer));
    SL_CHECK(sl_json_int(root, path, "n_head", 1, &c->n_head));
    SL_CHECK(sl_json_int(root, path, "n_embd", 1, &c->n_embd));
    SL_CHECK(sl_json_int(root, path, "vocab_size", 1, &c->vocab_size));
    SL_CHECK(sl_json_int(root, path, "n_positions", 1, &c->max_seq_len));
    cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "activation_function");
    if (act && (!cJSON_IsString(act) ||
                (strcmp(act->valuestring, "gelu_new") && strcmp(act->valuestring, "gelu_pytorch_tanh")))) {
        st =
            sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'activation_function' must be gelu_new (tanh GELU)", path);
        goto done;
    }
    cJSON *inner = cJSON_GetObjectItemCaseSensitive(root, "n_inner");
    if (inner && !cJSON_IsNull(inner) && !(cJSON_IsNumber(inner) && inner->valuedouble == 4.0 * c->n_embd)) {
        st = sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'n_inner' must be null or 4*n_embd", path);
        goto done;
    }
    cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
    if (eps && !(cJSON_IsNumber(eps) && eps->valuedouble == 1e-5)) {
        st = sl_fail(SL_ERR_UNSUPPORTED, "%s: field 'layer_norm_epsilon' must be 1e-5", path);
        goto done;
    }
done:
    cJSON_Delete(root);
    return st;
}

static const sl_st_tensor *find_hf(const sl_safetensors *st, const char *name) {
    char buf[160];
    const sl_st_tensor *t = sl_safetensors_find(st, name);
    if (t) return t;
    snprintf(buf, sizeof buf, "transformer.%s", name);
    return sl_safetensors_find(st, buf);
}

sl_status sl_hf_gpt2_import(const char *dir, sl_model **out) {
    *out = NULL;
    sl_gpt2_config cfg;
    SL_TRY(read_config(dir, &cfg));
    sl_model *m;
    SL_TRY(sl_gpt2_new(&cfg, &m));
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    sl_safetensors *st;
    sl_status s = sl_safetensors_open(path, &st);
    if (s != SL_OK) {
        sl_model_free(m);
        return s;
    }
    for (int i = 0; i < m->n_params && s == SL_OK; i++) {
        const sl_param_info *p = &m->params[i];
        char hname[128];
        snprintf(hname, sizeof hname, "%s%s", p->t->name,
                 (!strcmp(p->t->name, "wte") || !strcmp(p->t->name, "wpe")) ? ".weight" : "");
        const sl_st_tensor *t = find_hf(st, hname);
        if (!t) {
            s = sl_fail(SL_ERR_FORMAT, "%s: missing tensor '%s'", path, hname);
            break;
        }
        int conv = is_conv1d(hname);
        int64_t r = p->t->ne[0], c = p->t->ndim > 1 ? p->t->ne[1] : 1;
        int ok = t->ndim == p->t->ndim && (!strcmp(t->dtype, "F32") || !strcmp(t->dtype, "BF16"));
        if (ok && p->t->ndim == 2)
            ok = conv ? (t->shape[0] == c && t->shape[1] == r) : (t->shape[0] == r && t->shape[1] == c);
        if (ok && p->t->ndim == 1) ok = t->shape[0] == r;
        if (!ok) {
            s = sl_fail(SL_ERR_FORMAT,
                        "%s: tensor '%s' (%s) has a shape or dtype that does not match config.json", path,
                        hname, t->dtype);
            break;
        }
        float *dst = m->params_mem + p->offset;
        int bf = !strcmp(t->dtype, "BF16");
        for (int64_t k = 0; k < p->numel; k++) {
            /* element k of the suanli tensor; for Conv1D read the transposed position */
            int64_t src = conv ? (k % c) * r + k / c : k;
            float v;
            if (bf) {
                uint16_t h;
                memcpy(&h, (const char *)t->data + 2 * src, 2);
                v = sl_bf16_to_f32(h);
            } else {
                memcpy(&v, (const char *)t->data + 4 * src, 4);
            }
            dst[k] = v;
        }
    }
    sl_safetensors_close(st);
    if (s != SL_OK) {
        sl_model_free(m);
        return s;
    }
    *out = m;
    return SL_OK;
}

sl_status sl_hf_gpt2_export(const sl_model *m, const char *dir) {
    sl_status st = SL_OK;
    int n = m->n_params;
    sl_st_tensor *ts = calloc((size_t)n, sizeof *ts);
    char(*names)[160] = calloc((size_t)n, 160);
    float *buf = sl_malloc_aligned(sizeof(float) * (size_t)m->numel);
    char *text = NULL;
    if (!ts || !names || !buf) {
        st = sl_fail(SL_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const sl_param_info *p = &m->params[i];
        snprintf(names[i], 160, "transformer.%s%s", p->t->name,
                 (!strcmp(p->t->name, "wte") || !strcmp(p->t->name, "wpe")) ? ".weight" : "");
        int conv = is_conv1d(names[i]);
        int64_t r = p->t->ne[0], c = p->t->ndim > 1 ? p->t->ne[1] : 1;
        const float *src = m->params_mem + p->offset;
        float *dst = buf + p->offset;
        for (int64_t k = 0; k < p->numel; k++) dst[conv ? (k % c) * r + k / c : k] = src[k];
        ts[i] = (sl_st_tensor){.name = names[i],
                               .dtype = "F32",
                               .ndim = p->t->ndim,
                               .data = dst,
                               .nbytes = sizeof(float) * (size_t)p->numel};
        ts[i].shape[0] = conv ? c : r;
        if (p->t->ndim == 2) ts[i].shape[1] = conv ? r : c;
    }
    SL_CHECK(sl_mkdirs(dir));
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[] = {"format", "pt", NULL};
    SL_CHECK(sl_safetensors_write(path, ts, n, meta));
    cJSON *root = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(root, "model_type", "gpt2");
    cJSON_AddStringToObject(root, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(root, "n_layer", m->cfg.n_layer);
    cJSON_AddNumberToObject(root, "n_head", m->cfg.n_head);
    cJSON_AddNumberToObject(root, "n_embd", m->cfg.n_embd);
    cJSON_AddNumberToObject(root, "vocab_size", m->cfg.vocab_size);
    cJSON_AddNumberToObject(root, "n_positions", m->cfg.max_seq_len);
    cJSON_AddNullToObject(root, "n_inner");
    cJSON_AddNumberToObject(root, "layer_norm_epsilon", 1e-5);
    cJSON_AddNumberToObject(root, "resid_pdrop", 0);
    cJSON_AddNumberToObject(root, "embd_pdrop", 0);
    cJSON_AddNumberToObject(root, "attn_pdrop", 0);
    cJSON_AddBoolToObject(root, "tie_word_embeddings", 1);
    cJSON_AddBoolToObject(root, "scale_attn_weights", 1);
    cJSON_AddStringToObject(root, "dtype", "float32");
    text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) {
        st = sl_fail(SL_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    SL_CHECK(sl_file_write_atomic(path, text, strlen(text)));
done:
    free(ts);
    free(names);
    sl_free_aligned(buf);
    free(text);
    return st;
}
