/* Model weights <-> safetensors + config.json. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_util.h"
#include "suanli/model_io.h"
#include "suanli/safetensors.h"

/* Note [Run settings in suanli's config.json]
 * A GPT-2 converted from Hugging Face's layout and back lost its bos/eos ids and dropouts: suanli's
 * config.json had no fields for them. They are written under transformers' names (bos_token_id,
 * eos_token_id: an integer or a list, attn_pdrop, resid_pdrop, embd_pdrop) when known, and read back as
 * optional fields (a config.json without them, as written before, still loads). */

static void write_run_settings(cJSON *root, const sl_hf_info *info) {
    if (!info) return;
    if (info->bos_id >= 0) cJSON_AddNumberToObject(root, "bos_token_id", info->bos_id);
    if (info->n_eos == 1)
        cJSON_AddNumberToObject(root, "eos_token_id", info->eos_ids[0]);
    else if (info->n_eos > 1)
        cJSON_AddItemToObject(root, "eos_token_id", cJSON_CreateIntArray(info->eos_ids, info->n_eos));
    const char *pk[] = {"attn_pdrop", "resid_pdrop", "embd_pdrop"};
    const float pv[] = {info->attn_pdrop, info->resid_pdrop, info->embd_pdrop};
    for (int i = 0; i < 3; i++)
        if (pv[i] >= 0) cJSON_AddNumberToObject(root, pk[i], sl_json_float_dec(pv[i]));
}

sl_status sl_model_save(const sl_model *m, const char *dir, const char *extra_json) {
    return sl_model_save_ex(m, dir, extra_json, NULL);
}

sl_status sl_model_save_ex(const sl_model *m, const char *dir, const char *extra_json,
                           const sl_hf_info *info) {
    sl_status st = SL_OK;
    char path[4096];
    sl_st_tensor *ts = calloc((size_t)m->n_params, sizeof *ts);
    cJSON *root = cJSON_CreateObject();
    char *text = NULL;
    const float *pm;
    float *owned = NULL;
    if (!ts || !root) {
        st = sl_fail(SL_ERR_NOMEM, "save: out of memory");
        goto done;
    }
    SL_CHECK(sl_model_params_host(m, &pm, &owned));
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i];
        ts[i].name = p->t->name;
        ts[i].dtype = "F32";
        ts[i].ndim = p->t->ndim;
        for (int d = 0; d < p->t->ndim; d++) ts[i].shape[d] = p->t->ne[d];
        ts[i].data = pm + p->offset;
        ts[i].nbytes = sizeof(float) * (size_t)p->numel;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[] = {"format", "pt", "producer", "suanli", NULL};
    SL_CHECK(sl_safetensors_write(path, ts, m->n_params, meta));
    cJSON_AddStringToObject(root, "architecture", "gpt2");
    cJSON_AddNumberToObject(root, "n_layer", m->cfg.n_layer);
    cJSON_AddNumberToObject(root, "n_head", m->cfg.n_head);
    cJSON_AddNumberToObject(root, "n_embd", m->cfg.n_embd);
    cJSON_AddNumberToObject(root, "vocab_size", m->cfg.vocab_size);
    cJSON_AddNumberToObject(root, "max_seq_len", m->cfg.max_seq_len);
    write_run_settings(root, info);
    if (extra_json) {
        cJSON *e = cJSON_Parse(extra_json);
        if (e) cJSON_AddItemToObject(root, "train", e);
    }
    text = cJSON_Print(root);
    if (!text) {
        st = sl_fail(SL_ERR_NOMEM, "save: out of memory");
        goto done;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    SL_CHECK(sl_file_write_atomic(path, text, strlen(text)));
done:
    free(ts);
    free(text);
    sl_free_aligned(owned);
    cJSON_Delete(root);
    return st;
}

sl_status sl_model_load_config(const char *dir, sl_gpt2_config *cfg) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *root;
    SL_TRY(sl_json_read_object(path, &root));
    sl_status st = SL_OK;
    cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architecture");
    if (cJSON_IsString(arch) && strcmp(arch->valuestring, "gpt2") != 0) {
        st = sl_fail(
            SL_ERR_FORMAT,
            "%s: a %s model: pass --init-from with its Hugging Face directory (the architecture comes "
            "from its config.json)",
            path, arch->valuestring);
        goto done;
    }
    if (!cJSON_IsString(arch)) {
        st = sl_fail(SL_ERR_FORMAT, "%s: field 'architecture' must be \"gpt2\"", path);
        goto done;
    }
    SL_CHECK(sl_json_int(root, path, "n_layer", 1, &cfg->n_layer));
    SL_CHECK(sl_json_int(root, path, "n_head", 1, &cfg->n_head));
    SL_CHECK(sl_json_int(root, path, "n_embd", 1, &cfg->n_embd));
    SL_CHECK(sl_json_int(root, path, "vocab_size", 1, &cfg->vocab_size));
    SL_CHECK(sl_json_int(root, path, "max_seq_len", 1, &cfg->max_seq_len));
done:
    cJSON_Delete(root);
    return st;
}

/* a token id: an integer in [0, INT_MAX] */
static int token_id(const cJSON *v, int *out) {
    if (!sl_json_is_count(v) || v->valuedouble > INT_MAX) return 0;
    *out = (int)v->valuedouble;
    return 1;
}

sl_status sl_model_load_info(const char *dir, sl_hf_info *info) {
    memset(info, 0, sizeof *info);
    info->bos_id = -1;
    info->attn_pdrop = info->resid_pdrop = info->embd_pdrop = -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *root;
    SL_TRY(sl_json_read_object(path, &root));
    sl_status st = SL_OK;
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id"), *e;
    if (bos && !cJSON_IsNull(bos) && !token_id(bos, &info->bos_id))
        st = sl_fail(SL_ERR_FORMAT, "%s: field 'bos_token_id' must be a token id (an integer >= 0)", path);
    if (st == SL_OK && cJSON_IsArray(eos)) {
        cJSON_ArrayForEach(e, eos) {
            if (info->n_eos == SL_HF_MAX_EOS || !token_id(e, &info->eos_ids[info->n_eos++])) {
                st = sl_fail(SL_ERR_FORMAT, "%s: field 'eos_token_id' must hold at most %d token ids", path,
                             SL_HF_MAX_EOS);
                break;
            }
        }
    } else if (st == SL_OK && eos && !cJSON_IsNull(eos)) {
        if (token_id(eos, &info->eos_ids[0]))
            info->n_eos = 1;
        else
            st =
                sl_fail(SL_ERR_FORMAT, "%s: field 'eos_token_id' must be a token id or a list of them", path);
    }
    const char *pk[] = {"attn_pdrop", "resid_pdrop", "embd_pdrop"};
    float *pv[] = {&info->attn_pdrop, &info->resid_pdrop, &info->embd_pdrop};
    for (int i = 0; i < 3 && st == SL_OK; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, pk[i]);
        if (!v || cJSON_IsNull(v)) continue;
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 1))
            st = sl_fail(SL_ERR_FORMAT, "%s: field '%s' must be a number in [0, 1)", path, pk[i]);
        else
            *pv[i] = (float)v->valuedouble;
    }
    cJSON_Delete(root);
    return st;
}

sl_status sl_model_check_config(const char *dir, const sl_model *m) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *root;
    SL_TRY(sl_json_read_object(path, &root));
    sl_status st = SL_OK;
    cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architecture");
    const char *want = sl_arch_name(m->arch);
    if (!cJSON_IsString(arch) || strcmp(arch->valuestring, want) != 0) {
        st = sl_fail(SL_ERR_FORMAT, "%s: field 'architecture' is %s%s%s, the model is %s", path,
                     cJSON_IsString(arch) ? "\"" : "", cJSON_IsString(arch) ? arch->valuestring : "missing",
                     cJSON_IsString(arch) ? "\"" : "", want);
        goto done;
    }
    const char *names[] = {"n_layer", "n_head", "n_embd", "vocab_size", "max_seq_len"};
    const int have[] = {m->cfg.n_layer, m->cfg.n_head, m->cfg.n_embd, m->cfg.vocab_size, m->cfg.max_seq_len};
    for (int i = 0; i < 5 && st == SL_OK; i++) {
        int v;
        st = sl_json_int(root, path, names[i], 1, &v);
        if (st == SL_OK && v != have[i])
            st = sl_fail(SL_ERR_FORMAT, "%s: field '%s' is %d, the model has %d", path, names[i], v, have[i]);
    }
done:
    cJSON_Delete(root);
    return st;
}

sl_status sl_model_load_weights(sl_model *m, const char *path) {
    sl_safetensors *st;
    SL_TRY(sl_safetensors_open(path, &st));
    sl_status s = SL_OK;
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i];
        const sl_st_tensor *t = sl_safetensors_find(st, p->t->name);
        if (!t) {
            s = sl_fail(SL_ERR_FORMAT, "%s: missing tensor '%s'", path, p->t->name);
            break;
        }
        int ok = !strcmp(t->dtype, "F32") && t->ndim == p->t->ndim;
        for (int d = 0; ok && d < t->ndim; d++) ok = t->shape[d] == p->t->ne[d];
        if (!ok) {
            s = sl_fail(SL_ERR_FORMAT, "%s: tensor '%s' has dtype %s / shape that does not match the model",
                        path, p->t->name, t->dtype);
            break;
        }
        s = sl_model_params_write(m, p->offset, p->numel, t->data); /* the file's mapping is host memory */
        if (s != SL_OK) break;
    }
    /* every parameter was found; a tensor more is one the model lacks (config.json with fewer layers than
     * the weights loaded the first ones and dropped the rest without a word) */
    for (int i = 0; s == SL_OK && sl_safetensors_count(st) > m->n_params && i < sl_safetensors_count(st);
         i++) {
        const char *name = sl_safetensors_get(st, i)->name;
        int k = 0;
        while (k < m->n_params && strcmp(m->params[k].t->name, name) != 0) k++;
        if (k == m->n_params)
            s = sl_fail(SL_ERR_FORMAT,
                        "%s: tensor '%s' is not a parameter of the model (%d tensors, the model has %d)",
                        path, name, sl_safetensors_count(st), m->n_params);
    }
    sl_safetensors_close(st);
    return s;
}

sl_status sl_model_load(const char *dir, sl_model **out) {
    return sl_model_load_on(dir, sl_backend_cpu(), out);
}

sl_status sl_model_load_on(const char *dir, sl_backend *be, sl_model **out) {
    *out = NULL;
    sl_gpt2_config cfg;
    SL_TRY(sl_model_load_config(dir, &cfg));
    sl_model *m;
    sl_status st = sl_gpt2_new_on(&cfg, be, &m);
    if (st == SL_ERR_INVALID) /* "hidden-size 128 is not divisible by ...": say which file */
        return sl_fail(st, "%s/config.json: %s", dir, sl_errmsg());
    if (st != SL_OK) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st = sl_model_load_weights(m, path);
    if (st != SL_OK) {
        sl_model_free(m);
        return st;
    }
    *out = m;
    return SL_OK;
}
