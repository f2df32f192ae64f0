/* Models from Hugging Face directories (src/formats/hf_model.c parses config.json and maps the
 * safetensors files): sl_hf_config -> sl_llama_config / sl_gpt2_config, tensors by name -> the flat
 * parameter buffer (or, in bf16 mode, leaves bound into the mapped files), and the reverse (sl_hf_save)
 * for `suanli convert`. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "suanli/hf.h"
#include "suanli/hf_gpt2.h"
#include "suanli/model_io.h"

/* sl_hf_arch and sl_arch list the same classes; the table keeps them apart so either may grow. */
static const sl_arch k_from_hf[] = {SL_ARCH_GPT2,      SL_ARCH_LLAMA,      SL_ARCH_QWEN2,
                                    SL_ARCH_MISTRAL,   SL_ARCH_MIXTRAL,    SL_ARCH_BAICHUAN,
                                    SL_ARCH_QWEN2_MOE, SL_ARCH_DEEPSEEK_V3};
_Static_assert(sizeof k_from_hf / sizeof k_from_hf[0] == SL_HF_ARCH_COUNT, "sl_hf_arch table out of sync");

static sl_hf_arch arch_to_hf(sl_arch a) {
    for (int i = 0; i < SL_HF_ARCH_COUNT; i++)
        if (k_from_hf[i] == a) return (sl_hf_arch)i;
    return SL_HF_ARCH_COUNT;
}

/* sl_hf_config and sl_llama_config hold the same fields (the first parsed, the second validated) */
/* clang-format off */
#define SL_HF_SAME_FIELDS(X)                                                                         \
    X(n_layer) X(n_head) X(n_kv_head) X(head_dim) X(hidden) X(intermediate) X(vocab_size)            \
    X(max_seq_len) X(rms_eps) X(rope_theta) X(rope_factor) X(rope_low_freq) X(rope_high_freq)        \
    X(rope_orig_ctx) X(tie_embeddings) X(qkv_bias) X(sliding_window) X(n_experts) X(n_experts_per_tok)  \
    X(moe_intermediate) X(shared_intermediate) X(norm_topk_prob) X(n_group) X(topk_group)           \
    X(routed_scaling) X(first_dense)
/* clang-format on */

/* a field added to one struct and not the other (nor to the list above) changes one size */
_Static_assert(sizeof(sl_hf_config) == sizeof(sl_llama_config), "sl_hf_config and sl_llama_config differ");

static void config_from_hf(const sl_hf_config *h, sl_llama_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = k_from_hf[h->arch];
#define COPY(f) c->f = h->f;
    SL_HF_SAME_FIELDS(COPY)
#undef COPY
}

static void config_to_hf(const sl_llama_config *c, sl_hf_config *h) {
    memset(h, 0, sizeof *h);
    h->arch = arch_to_hf(c->arch);
#define COPY(f) h->f = c->f;
    SL_HF_SAME_FIELDS(COPY)
#undef COPY
}

sl_status sl_hf_load_config(const char *dir, sl_llama_config *cfg, sl_hf_info *info) {
    sl_hf_config h;
    SL_TRY(sl_hf_config_read(dir, &h, info));
    config_from_hf(&h, cfg);
    return SL_OK;
}

static void weights_free(void *p) { sl_hf_weights_close(p); }

/* Note [Unused checkpoint tensors]
 * transformers warns "Some weights of the model checkpoint were not used" when a file holds tensors the
 * model has no parameter for (a checkpoint of another variant, a renamed layer, a head we do not build).
 * We warn too, in one line with the count and the first names, and load on: the model is complete (every
 * parameter was found). Buffers that real checkpoints carry and that carry no weights are skipped
 * silently: Llama-family rotary_emb.inv_freq (recomputed from rope_theta), GPT-2's causal-mask buffers
 * attn.bias / attn.masked_bias, and lm_head.weight of a model whose head is tied to the embedding. */
static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static int known_buffer(const sl_model *m, const char *name) {
    int gpt2 = m->arch == SL_ARCH_GPT2;
    if (ends_with(name, ".rotary_emb.inv_freq")) return 1;
    if (gpt2 && (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"))) return 1;
    return !strcmp(name, "lm_head.weight") && (gpt2 || m->lcfg.tie_embeddings);
}

static int ptr_cmp(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
    return x < y ? -1 : x > y;
}

/* used[0..n_used) are the tensors the model read (sorted here); the others are counted into
 * info->n_unused and named in one warning line */
static void report_unused(const char *dir, const sl_hf_weights *s, const sl_model *m,
                          const sl_st_tensor **used, int n_used, sl_hf_info *info) {
    qsort(used, (size_t)n_used, sizeof *used, ptr_cmp);
    char names[512] = "";
    int n = 0, total = sl_hf_weights_count(s);
    for (int i = 0; i < total; i++) {
        const sl_st_tensor *x = sl_hf_weights_get(s, i, NULL);
        if (bsearch(&x, used, (size_t)n_used, sizeof *used, ptr_cmp) || known_buffer(m, x->name)) continue;
        if (++n <= 3)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s'%.100s'", n > 1 ? ", " : "",
                     x->name);
    }
    if (info) info->n_unused = n;
    if (n > 0)
        SL_LOGW("%s: %d tensor%s in the checkpoint not used by the %s model: %s%s", dir, n, n > 1 ? "s" : "",
                sl_arch_name(m->arch), names, n > 3 ? ", ..." : "");
}

/* Note [Memory-mapped bf16 weights]
 * In bf16 mode a BF16 tensor on disk whose data is 2-byte aligned is not copied: its leaf points into
 * the read-only mapping of the safetensors shard, which the model then owns (wsrc). A 7B model in bf16
 * thus needs its 13.5 GB of mapped weights (paged in on demand, shared with the page cache) plus the f32
 * embedding and norms and the activations: well inside 24 GiB. F32/F16 tensors are converted into wmem. */
/* a bf16 leaf of a model whose bf16 weights live in a device buffer (m->wbuf): BF16 data on disk is copied
 * in as it is, other dtypes are converted to bf16 values on the host first */
static sl_status copy_in_bf16(sl_model *m, const sl_param_info *p, const sl_st_tensor *x, const char *file) {
    size_t off = sizeof(uint16_t) * (size_t)p->offset, bytes = sizeof(uint16_t) * (size_t)p->numel;
    if (!strcmp(x->dtype, "BF16")) return sl_backend_copy_in(m->wbuf, off, x->data, bytes);
    float *tmp = malloc(sizeof(float) * (size_t)p->numel);
    uint16_t *h = malloc(bytes ? bytes : 1);
    sl_status st =
        tmp && h ? sl_hf_tensor_to_f32(x, tmp, p->numel, file) : sl_fail(SL_ERR_NOMEM, "out of memory");
    for (int64_t k = 0; st == SL_OK && k < p->numel; k++) h[k] = sl_f32_to_bf16(tmp[k]);
    if (st == SL_OK) st = sl_backend_copy_in(m->wbuf, off, h, bytes);
    free(tmp);
    free(h);
    return st;
}

sl_status sl_hf_load_weights(sl_model *m, const char *dir, sl_hf_info *info) {
    sl_hf_weights *s;
    SL_TRY(sl_hf_weights_open(dir, &s));
    sl_status st = SL_OK;
    int mapped = 0;
    int64_t need = 0, woff = 0; /* bf16 elements that cannot be used in place (converted into wmem) */
    const sl_st_tensor **used = calloc((size_t)m->n_params + 1, sizeof *used);
    if (!used) {
        sl_hf_weights_close(s);
        return sl_fail(SL_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; m->wdtype == SL_BF16 && !m->wbuf && i < m->n_params; i++) {
        const char *file;
        const sl_st_tensor *x = sl_hf_weights_find(s, m->params[i].t->name, &file);
        if (m->params[i].t->dtype == SL_BF16 &&
            !(x && !strcmp(x->dtype, "BF16") && !((uintptr_t)x->data & 1)))
            need += m->params[i].numel;
    }
    if (need > 0) {
        m->wmem = sl_malloc_aligned(sizeof(uint16_t) * (size_t)need);
        if (!m->wmem) {
            sl_hf_weights_close(s);
            free(used);
            return sl_fail(SL_ERR_NOMEM, "cannot allocate %lld bf16 weights", (long long)need);
        }
    }
    for (int i = 0; i < m->n_params && st == SL_OK; i++) {
        const sl_param_info *p = &m->params[i];
        const char *file = NULL;
        const sl_st_tensor *x = sl_hf_weights_find(s, p->t->name, &file);
        if (!x) {
            st = sl_fail(SL_ERR_FORMAT, "%s/%s: missing tensor '%s'", dir, file, p->t->name);
            break;
        }
        used[i] = x;
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
        if (p->t->dtype == SL_BF16 && m->wbuf) { /* Note [bf16 weights on device memory] in model_state.c */
            st = copy_in_bf16(m, p, x, file);
        } else if (p->t->dtype == SL_BF16) {
            if (!strcmp(x->dtype, "BF16") && !((uintptr_t)x->data & 1)) {
                sl_tensor_bind(p->t, (void *)x->data); /* zero copy: the mapping outlives the model's use */
                mapped++;
            } else {
                float *tmp = malloc(sizeof(float) * (size_t)p->numel);
                st = tmp ? sl_hf_tensor_to_f32(x, tmp, p->numel, file)
                         : sl_fail(SL_ERR_NOMEM, "out of memory");
                for (int64_t k = 0; st == SL_OK && k < p->numel; k++)
                    m->wmem[woff + k] = sl_f32_to_bf16(tmp[k]);
                free(tmp);
                sl_tensor_bind(p->t, m->wmem + woff);
                woff += p->numel;
            }
        } else {
            /* straight into the host mapping where there is one, else through a host copy */
            float *tmp = m->params_mem ? NULL : malloc(sizeof(float) * (size_t)p->numel),
                  *dst = m->params_mem ? m->params_mem + p->offset : tmp;
            st = dst ? sl_hf_tensor_to_f32(x, dst, p->numel, file) : sl_fail(SL_ERR_NOMEM, "out of memory");
            if (st == SL_OK && m->wdtype == SL_BF16 &&
                !p->keep_f32) /* a bf16 model's embedding, norms, biases: bf16 values */
                for (int64_t k = 0; k < p->numel; k++) {
                    uint32_t u = (uint32_t)sl_f32_to_bf16(dst[k]) << 16;
                    memcpy(dst + k, &u, 4);
                }
            if (st == SL_OK && tmp) st = sl_model_params_write(m, p->offset, p->numel, tmp);
            free(tmp);
        }
        if (st == SL_OK && info && i == 0)
            snprintf(info->disk_dtype, sizeof info->disk_dtype, "%s", x->dtype);
    }
    if (info) {
        info->n_files = sl_hf_weights_n_files(s);
        info->n_mapped = mapped;
    }
    if (st == SL_OK) report_unused(dir, s, m, used, m->n_params, info);
    free(used);
    if (st == SL_OK && mapped) { /* the model keeps the mappings its leaves point into */
        m->wsrc = s;
        m->wsrc_free = weights_free;
        return SL_OK;
    }
    if (mapped && st != SL_OK) /* leaves point into mappings about to close */
        for (int i = 0; i < m->n_params; i++)
            if (m->params[i].t->dtype == SL_BF16) sl_tensor_bind(m->params[i].t, NULL);
    sl_hf_weights_close(s);
    return st;
}

sl_status sl_hf_load(const char *dir, sl_model **out, sl_hf_info *info) {
    return sl_hf_load_ex(dir, SL_F32, out, info);
}

/* GPT2LMHeadModel: transformer.* names, Conv1D weights stored (in, out): transposed into nn.Linear layout */
static sl_status load_gpt2(const char *dir, const sl_llama_config *c, sl_backend *be, sl_model **out,
                           sl_hf_info *info) {
    sl_gpt2_config g = {c->n_layer, c->n_head, c->hidden, c->vocab_size, c->max_seq_len};
    sl_model *m;
    sl_status st = sl_gpt2_new_on(&g, be, &m);
    if (st != SL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", sl_errmsg());
        return sl_fail(st, "%s/config.json: %s", dir, msg);
    }
    sl_hf_weights *s;
    if ((st = sl_hf_weights_open(dir, &s)) != SL_OK) {
        sl_model_free(m);
        return st;
    }
    const sl_st_tensor **used = calloc((size_t)m->n_params + 1, sizeof *used);
    if (!used) st = sl_fail(SL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < m->n_params && st == SL_OK; i++) {
        const sl_param_info *p = &m->params[i];
        const char *ours = p->t->name, *file = NULL;
        char name[160];
        snprintf(name, sizeof name, "transformer.%s%s", ours, strchr(ours, '.') ? "" : ".weight");
        const sl_st_tensor *x = sl_hf_weights_find(s, name, &file);
        if (!x)
            x = sl_hf_weights_find(s, name + strlen("transformer."),
                                   &file); /* original checkpoints: no prefix */
        if (!x) {
            st = sl_fail(SL_ERR_FORMAT, "%s/%s: missing tensor '%s'", dir, file, name);
            break;
        }
        used[i] = x;
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
        float *host = m->params_mem ? NULL : malloc(sizeof(float) * (size_t)p->numel);
        float *dst = m->params_mem ? m->params_mem + p->offset : host;
        if (!dst) {
            st = sl_fail(SL_ERR_NOMEM, "out of memory");
        } else if (!conv) {
            st = sl_hf_tensor_to_f32(x, dst, p->numel, file);
        } else {
            float *tmp = malloc(sizeof(float) * (size_t)p->numel);
            st = tmp ? sl_hf_tensor_to_f32(x, tmp, p->numel, file) : sl_fail(SL_ERR_NOMEM, "out of memory");
            for (int64_t a = 0; st == SL_OK && a < r0; a++) /* ours (out, in) <- HF (in, out) */
                for (int64_t b = 0; b < r1; b++) dst[a * r1 + b] = tmp[b * r0 + a];
            free(tmp);
        }
        if (st == SL_OK && host) st = sl_model_params_write(m, p->offset, p->numel, host);
        free(host);
        if (st == SL_OK && i == 0) snprintf(info->disk_dtype, sizeof info->disk_dtype, "%s", x->dtype);
    }
    info->n_files = sl_hf_weights_n_files(s);
    if (st == SL_OK) report_unused(dir, s, m, used, m->n_params, info);
    free(used);
    sl_hf_weights_close(s);
    if (st != SL_OK) {
        sl_model_free(m);
        return st;
    }
    *out = m;
    return SL_OK;
}

sl_status sl_hf_load_ex(const char *dir, sl_dtype wdtype, sl_model **out, sl_hf_info *info) {
    return sl_hf_load_on(dir, wdtype, sl_backend_cpu(), out, info);
}

sl_status sl_hf_load_on(const char *dir, sl_dtype wdtype, sl_backend *be, sl_model **out, sl_hf_info *info) {
    *out = NULL;
    sl_llama_config cfg;
    sl_hf_info local;
    if (!info) info = &local;
    SL_TRY(sl_hf_load_config(dir, &cfg, info));
    if (cfg.arch == SL_ARCH_GPT2) {
        if (wdtype != SL_F32)
            return sl_fail(SL_ERR_UNSUPPORTED, "%s: bf16 mode supports the Llama family, not GPT-2", dir);
        return load_gpt2(dir, &cfg, be, out, info);
    }
    sl_model *m;
    sl_status st = sl_llama_new_on(&cfg, wdtype, be, &m);
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

sl_status sl_hf_save(const sl_model *m, const char *dir, sl_dtype dtype, const sl_hf_info *info) {
    if (m->arch == SL_ARCH_GPT2) {
        if (dtype != SL_F32) return sl_fail(SL_ERR_UNSUPPORTED, "convert: GPT-2 is exported in f32 only");
        return sl_hf_gpt2_export_ex(m, dir, info);
    }
    if (m->wdtype != SL_F32)
        return sl_fail(SL_ERR_UNSUPPORTED, "convert: load the model with f32 weights to save it");
    if (dtype != SL_F32 && dtype != SL_BF16 && dtype != SL_F16)
        return sl_fail(SL_ERR_INVALID, "convert: dtype must be f32, bf16 or f16");
    sl_status st = SL_OK;
    char path[4096];
    size_t es = dtype == SL_F32 ? 4 : 2;
    sl_st_tensor *ts = calloc((size_t)m->n_params, sizeof *ts);
    uint16_t *half = dtype != SL_F32 ? malloc(2 * (size_t)m->numel) : NULL;
    const float *pm;
    float *owned = NULL;
    if (!ts || (dtype != SL_F32 && !half)) {
        st = sl_fail(SL_ERR_NOMEM, "convert: out of memory");
        goto done;
    }
    SL_CHECK(sl_model_params_host(m, &pm, &owned));
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i];
        /* DeepSeek-V3's router stays F32 in a bf16 / f16 file, as transformers saves it (keep_f32) */
        sl_dtype td = p->keep_f32 ? SL_F32 : dtype;
        ts[i].name = p->t->name;
        ts[i].dtype = sl_safetensors_dtype_name(td); /* F32, BF16, F16 */
        ts[i].ndim = p->t->ndim;
        for (int d = 0; d < p->t->ndim; d++) ts[i].shape[d] = p->t->ne[d];
        ts[i].nbytes = (td == SL_F32 ? 4 : es) * (size_t)p->numel;
        if (td == SL_F32)
            ts[i].data = pm + p->offset;
        else {
            for (int64_t k = 0; k < p->numel;
                 k++) /* round to nearest even (f16: |w| >= 65520 -> inf, as .half()) */
                half[p->offset + k] =
                    dtype == SL_F16 ? sl_f32_to_f16(pm[p->offset + k]) : sl_f32_to_bf16(pm[p->offset + k]);
            ts[i].data = half + p->offset;
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[] = {"format", "pt", NULL};
    SL_CHECK(sl_safetensors_write(path, ts, m->n_params, meta));
    sl_hf_config hc;
    config_to_hf(&m->lcfg, &hc);
    SL_CHECK(sl_hf_config_write(dir, &hc, info,
                                dtype == SL_F32   ? "float32"
                                : dtype == SL_F16 ? "float16"
                                                  : "bfloat16"));
    /* an index of a sharded model saved here before would be read instead of this file (and its shards) */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (unlink(path) != 0 && errno != ENOENT)
        st = sl_fail(SL_ERR_IO, "%s: cannot remove the stale index: %s", path, strerror(errno));
done:
    free(ts);
    free(half);
    sl_free_aligned(owned);
    return st;
}
