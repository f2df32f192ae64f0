/* GPT-2 <-> Hugging Face layout. HF's Conv1D stores weights as (in, out); suanli uses nn.Linear's
 * (out, in), so the four projection matrices per layer are transposed on the way out (and, in
 * src/nn/hf_load.c, on the way in). */
#include <string.h>

#include "suanli/hf.h"
#include "suanli/hf_gpt2.h"
#include "suanli/model_io.h"

static int is_conv1d(const char *name) {
    return strstr(name, "c_attn.weight") || strstr(name, "c_proj.weight") || strstr(name, "c_fc.weight");
}

/* Import goes through the general HF loader (src/nn/hf_load.c over src/formats/hf_model.c: config checks,
 * sharded files, F32/BF16/F16 conversion and the Conv1D transposes); this wrapper only insists that the
 * directory holds a GPT-2. */
sl_status sl_hf_gpt2_import(const char *dir, sl_model **out) { return sl_hf_gpt2_import_ex(dir, out, NULL); }

sl_status sl_hf_gpt2_import_ex(const char *dir, sl_model **out, sl_hf_info *info) {
    *out = NULL;
    sl_model *m;
    SL_TRY(sl_hf_load(dir, &m, info));
    if (m->arch != SL_ARCH_GPT2) {
        sl_status st =
            sl_fail(SL_ERR_UNSUPPORTED, "%s/config.json: a %s model, not GPT-2 (model_type must be gpt2)",
                    dir, sl_arch_name(m->arch));
        sl_model_free(m);
        return st;
    }
    *out = m;
    return SL_OK;
}

sl_status sl_hf_gpt2_export(const sl_model *m, const char *dir) { return sl_hf_gpt2_export_ex(m, dir, NULL); }

sl_status sl_hf_gpt2_export_ex(const sl_model *m, const char *dir, const sl_hf_info *info) {
    sl_status st = SL_OK;
    int n = m->n_params;
    sl_st_tensor *ts = calloc((size_t)n, sizeof *ts);
    char(*names)[160] = calloc((size_t)n, 160);
    float *buf = sl_malloc_aligned(sizeof(float) * (size_t)m->numel), *owned = NULL;
    const float *pm;
    if (!ts || !names || !buf) {
        st = sl_fail(SL_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    SL_CHECK(sl_model_params_host(m, &pm, &owned));
    for (int i = 0; i < n; i++) {
        const sl_param_info *p = &m->params[i];
        snprintf(names[i], 160, "transformer.%s%s", p->t->name,
                 (!strcmp(p->t->name, "wte") || !strcmp(p->t->name, "wpe")) ? ".weight" : "");
        int conv = is_conv1d(names[i]);
        int64_t r = p->t->ne[0], c = p->t->ndim > 1 ? p->t->ne[1] : 1;
        const float *src = pm + p->offset;
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
    sl_hf_config hc = {.arch = SL_HF_GPT2,
                       .n_layer = m->cfg.n_layer,
                       .n_head = m->cfg.n_head,
                       .hidden = m->cfg.n_embd,
                       .vocab_size = m->cfg.vocab_size,
                       .max_seq_len = m->cfg.max_seq_len};
    SL_CHECK(sl_hf_config_write(dir, &hc, info, "float32"));
done:
    free(ts);
    free(names);
    sl_free_aligned(buf);
    sl_free_aligned(owned);
    return st;
}
