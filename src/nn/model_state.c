/* A model's flat state in backend buffers (Note [Device-resident state] in suanli/device.h): allocation and
 * binding of the parameter and gradient leaves, host <-> device copies of parameters, initialisation. */
#include <math.h>
#include <string.h>

#include "suanli/nn.h"

/* Note [bf16 weights on device memory]
 * A bf16 inference model on the CPU points its bf16 leaves into the mapped safetensors shards or wmem (Note
 * [Memory-mapped bf16 weights] in hf_load.c). A backend whose memory the host cannot touch (OpenCL) cannot
 * read host pointers, so there the leaves are bound into one owned device buffer (wbuf, 2 bytes per bf16
 * element, at the offsets that would index wmem) and sl_hf_load_weights copies each tensor in through the
 * backend contract (sl_backend_copy_in), as the f32 parameters reach params_buf. Nothing stays mapped. */
sl_status sl_model_alloc_state(sl_model *m, sl_backend *be, int with_grads) {
    m->backend = be;
    size_t bytes = sizeof(float) * (size_t)m->numel;
    sl_status st = sl_backend_alloc(be, bytes, &m->params_buf);
    if (st == SL_OK && with_grads) st = sl_backend_alloc(be, bytes, &m->grads_buf);
    if (st != SL_OK)
        return sl_fail(SL_ERR_NOMEM, "model: cannot allocate %lld parameters on %s: %s", (long long)m->numel,
                       be->name, sl_errmsg());
    /* host-visible backends (cpu) expose a mapping; elsewhere these stay NULL and code uses copies */
    m->params_mem = be->caps.host_visible ? sl_buffer_map(m->params_buf) : NULL;
    m->grads_mem = be->caps.host_visible && m->grads_buf ? sl_buffer_map(m->grads_buf) : NULL;
    /* Note [bf16 weights on device memory] */
    if (m->wdtype == SL_BF16 && !be->caps.host_visible) {
        st = sl_backend_alloc(be, sizeof(uint16_t) * (size_t)(m->wnumel ? m->wnumel : 1), &m->wbuf);
        if (st != SL_OK)
            return sl_fail(SL_ERR_NOMEM, "model: cannot allocate %lld bf16 weights on %s: %s",
                           (long long)m->wnumel, be->name, sl_errmsg());
        for (int i = 0; i < m->n_params; i++)
            if (m->params[i].t->dtype == SL_BF16)
                sl_tensor_bind_buffer(m->params[i].t, m->wbuf,
                                      sizeof(uint16_t) * (size_t)m->params[i].offset);
    }
    for (int i = 0; i < m->n_params; i++) {
        sl_param_info *p = &m->params[i];
        if (p->t->dtype != SL_F32) continue; /* bf16 inference leaves: bound by the loader */
        sl_tensor_bind_buffer(p->t, m->params_buf, sizeof(float) * (size_t)p->offset);
        if (!with_grads) continue;
        p->t->grad = sl_new_tensor(m->ctx, SL_F32, p->t->ndim, p->t->ne);
        p->t->grad->flags |= SL_FLAG_GRAD;
        sl_set_name(p->t->grad, "grad.%s", p->t->name);
        sl_tensor_bind_buffer(p->t->grad, m->grads_buf, sizeof(float) * (size_t)p->offset);
    }
    return SL_OK;
}

void sl_model_free(sl_model *m) {
    if (!m) return;
    sl_ctx_free(m->ctx);
    free(m->params);
    if (m->backend) {
        sl_backend_free(m->backend, m->params_buf);
        sl_backend_free(m->backend, m->grads_buf);
        sl_backend_free(m->backend, m->wbuf);
    }
    sl_free_aligned(m->wmem);
    if (m->wsrc_free) m->wsrc_free(m->wsrc);
    free(m);
}

static sl_status check_span(const sl_model *m, int64_t off, int64_t n) {
    if (off < 0 || n < 0 || off + n > m->numel)
        return sl_fail(SL_ERR_INVALID, "model: parameter range [%lld, %lld) outside %lld parameters",
                       (long long)off, (long long)(off + n), (long long)m->numel);
    return SL_OK;
}
sl_status sl_model_params_write(sl_model *m, int64_t off, int64_t n, const float *src) {
    SL_TRY(check_span(m, off, n));
    return sl_backend_copy_in(m->params_buf, sizeof(float) * (size_t)off, src, sizeof(float) * (size_t)n);
}
sl_status sl_model_params_read(const sl_model *m, int64_t off, int64_t n, float *dst) {
    SL_TRY(check_span(m, off, n));
    return sl_backend_copy_out(m->params_buf, sizeof(float) * (size_t)off, dst, sizeof(float) * (size_t)n);
}
sl_status sl_model_grads_read(const sl_model *m, int64_t off, int64_t n, float *dst) {
    SL_TRY(check_span(m, off, n));
    if (!m->grads_buf) return sl_fail(SL_ERR_INVALID, "model: no gradients (inference model)");
    return sl_backend_copy_out(m->grads_buf, sizeof(float) * (size_t)off, dst, sizeof(float) * (size_t)n);
}

sl_status sl_model_init_weights_ex(sl_model *m, uint64_t seed) {
    float resid_std = 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer);
    int64_t most = 0;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].t->dtype == SL_F32 && m->params[i].numel > most) most = m->params[i].numel;
    float *d = sl_malloc_aligned(sizeof(float) * (size_t)(most ? most : 1));
    if (!d) return sl_fail(SL_ERR_NOMEM, "model: out of memory initialising weights");
    sl_status st = SL_OK;
    for (int i = 0; i < m->n_params && st == SL_OK; i++) {
        sl_param_info *p = &m->params[i];
        if (p->t->dtype != SL_F32) continue;
        switch (p->init) {
        case SL_INIT_NORMAL:
            sl_rng_fill_normal(d, p->numel, seed, (uint64_t)i, 0.0f, 0.02f);
            break;
        case SL_INIT_NORMAL_RESID:
            sl_rng_fill_normal(d, p->numel, seed, (uint64_t)i, 0.0f, resid_std);
            break;
        case SL_INIT_ZERO:
            memset(d, 0, sizeof(float) * (size_t)p->numel);
            break;
        default:
            for (int64_t k = 0; k < p->numel; k++) d[k] = 1.0f;
        }
        st = sl_model_params_write(m, p->offset, p->numel, d);
    }
    sl_free_aligned(d);
    return st;
}

/* Note [Random bf16 models]
 * Benchmarks and tests of bf16 inference need a model without a checkpoint on disk (a 7B one would be
 * 13.5 GB of files). The bf16 projection leaves get one owned block (wmem) filled with uniform values of
 * the same standard deviation as the f32 init (0.02: U(-a, a), a = 0.02 sqrt 3) from a counter hash,
 * which is a few ns per element where the Box-Muller normal would take tens; the f32 leaves (embedding,
 * norms, biases) take sl_model_init_weights_ex and are then rounded to bf16 values, as the loader rounds
 * them for a bf16 model (sl_hf_load_weights). */
sl_status sl_model_init_bf16_random(sl_model *m, uint64_t seed) {
    if (m->wdtype != SL_BF16 || !m->params_mem || m->wmem || m->wsrc)
        return sl_fail(SL_ERR_INVALID,
                       "init_bf16_random: needs an unbound bf16 model on a host-visible backend");
    SL_TRY(sl_model_init_weights_ex(m, seed));
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i];
        if (p->t->dtype != SL_F32 || p->keep_f32) continue; /* DeepSeek-V3's fp32 router */
        for (int64_t k = p->offset; k < p->offset + p->numel; k++) {
            uint32_t u = (uint32_t)sl_f32_to_bf16(m->params_mem[k]) << 16;
            memcpy(&m->params_mem[k], &u, 4);
        }
    }
    m->wmem = sl_malloc_aligned(sizeof(uint16_t) * (size_t)(m->wnumel ? m->wnumel : 1));
    if (!m->wmem)
        return sl_fail(SL_ERR_NOMEM, "init_bf16_random: cannot allocate %lld bf16 weights",
                       (long long)m->wnumel);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    const float a = 0.02f * 1.7320508f / 2147483648.0f; /* scales a signed 32-bit value into [-a, a) */
    for (int64_t k = 0; k < m->wnumel; k++) {
        x += 0x9e3779b97f4a7c15ull; /* splitmix64 */
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        m->wmem[k] = sl_f32_to_bf16((float)(int32_t)(uint32_t)z * a);
    }
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].t->dtype == SL_BF16) sl_tensor_bind(m->params[i].t, m->wmem + m->params[i].offset);
    return SL_OK;
}

void sl_model_init_weights(sl_model *m, uint64_t seed) {
    sl_status st = sl_model_init_weights_ex(m, seed);
    SL_ASSERT(st == SL_OK && "sl_model_init_weights: use sl_model_init_weights_ex to handle failures");
}

/* ---- swapping the state buffers (data parallelism: ZeRO-3 drops the full parameters, gradients move into
 * a communicator window) ---- */
static void bind_params(sl_model *m) {
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].t->dtype == SL_F32)
            sl_tensor_bind_buffer(m->params[i].t, m->params_buf, sizeof(float) * (size_t)m->params[i].offset);
}
static void bind_grads(sl_model *m) {
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].t->grad)
            sl_tensor_bind_buffer(m->params[i].t->grad, m->grads_buf,
                                  sizeof(float) * (size_t)m->params[i].offset);
}

void sl_model_drop_params(sl_model *m) {
    sl_backend_free(m->backend, m->params_buf);
    m->params_buf = NULL;
    m->params_mem = NULL;
}
void sl_model_drop_grads(sl_model *m) {
    sl_backend_free(m->backend, m->grads_buf);
    m->grads_buf = NULL;
    m->grads_mem = NULL;
}
sl_status sl_model_new_params(sl_model *m) {
    sl_model_drop_params(m);
    SL_TRY(sl_backend_alloc(m->backend, sizeof(float) * (size_t)m->numel, &m->params_buf));
    m->params_mem = m->backend->caps.host_visible ? sl_buffer_map(m->params_buf) : NULL;
    bind_params(m);
    return SL_OK;
}
sl_status sl_model_adopt_grads(sl_model *m, sl_buffer *buf) {
    if (buf && (buf->backend != m->backend || buf->size < sizeof(float) * (size_t)m->numel))
        return sl_fail(SL_ERR_INVALID, "model: gradient buffer of the wrong backend or size");
    sl_model_drop_grads(m);
    m->grads_buf = buf;
    m->grads_mem = buf && m->backend->caps.host_visible ? sl_buffer_map(buf) : NULL;
    if (buf) bind_grads(m);
    return SL_OK;
}

sl_status sl_model_new_lane(const sl_model *m, sl_model **out) {
    *out = NULL;
    if (!m->params_buf || !m->grads_buf || !m->backend->caps.host_visible || m->tp > 1 || m->pp > 1 ||
        m->ep > 1 || m->wdtype != SL_F32)
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "model lane: needs a whole f32 training model on a host-visible backend");
    sl_model_split whole = {.tp = 1, .pp = 1, .ep = 1};
    sl_model *t;
    SL_TRY(sl_model_new_split(m, m->backend, &whole, &t));
    int same = t->numel == m->numel && t->n_params == m->n_params;
    for (int i = 0; same && i < m->n_params; i++)
        same = t->params[i].offset == m->params[i].offset && t->params[i].numel == m->params[i].numel &&
               t->params[i].t->dtype == m->params[i].t->dtype;
    if (!same) {
        sl_model_free(t);
        return sl_fail(SL_ERR_INVALID, "model lane: the rebuilt model's layout differs from the original's");
    }
    sl_model_drop_params(t); /* its leaves read m's parameters: one copy, updated by m's optimizer */
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].t->dtype == SL_F32)
            sl_tensor_bind_buffer(t->params[i].t, m->params_buf, sizeof(float) * (size_t)t->params[i].offset);
    t->compute_dtype = m->compute_dtype;
    t->autocast_bf16 = m->autocast_bf16;
    t->attention_dropout = m->attention_dropout;
    t->hidden_dropout = m->hidden_dropout;
    t->recompute = m->recompute;
    t->recompute_layers = m->recompute_layers;
    t->moe = m->moe;
    *out = t;
    return SL_OK;
}

sl_status sl_model_params_host(const sl_model *m, const float **out, float **owned) {
    *owned = NULL;
    if (m->params_mem) {
        *out = m->params_mem;
        return SL_OK;
    }
    float *h = sl_malloc_aligned(sizeof(float) * (size_t)(m->numel ? m->numel : 1));
    if (!h)
        return sl_fail(SL_ERR_NOMEM, "model: cannot allocate a host copy of %lld parameters",
                       (long long)m->numel);
    sl_status st = sl_model_params_read(m, 0, m->numel, h);
    if (st != SL_OK) {
        sl_free_aligned(h);
        return st;
    }
    *out = *owned = h;
    return SL_OK;
}

/* Note [Full-tensor coordinates]
 * A TP shard's elements are runs of the full parameter's flattened elements (sl_param_info's tp_split,
 * tp_pack, tp_full; the split rule is sl_tp_part): checkpoints name every element by (full tensor, offset
 * in it), so a checkpoint saved on one (tp, pp, dp) layout loads on any other. */
int64_t sl_param_full_numel(const sl_model *m, const sl_param_info *p) {
    (void)m;
    if (p->tp_split == 0) return p->numel;
    return p->numel / p->t->ne[p->tp_split - 1] * p->tp_full;
}

void sl_param_runs(const sl_model *m, const sl_param_info *p, int64_t a, int64_t b, sl_run_fn fn, void *u) {
    if (p->tp_split == 0 || m->tp <= 1) {
        if (b > a) fn(u, a, a, b - a);
        return;
    }
    int d = p->tp_split - 1;
    int64_t inner = 1;
    for (int k = d + 1; k < p->t->ndim; k++) inner *= p->t->ne[k];
    int64_t ld = p->t->ne[d], blk = p->tp_full / p->tp_pack, lo, len;
    int parts, part;
    sl_param_tp_part(p, m->tp, m->tp_rank, &parts, &part);
    sl_tp_part(blk, parts, part, &lo, &len);
    for (int64_t x = a; x < b;) {
        int64_t o = x / (ld * inner), rem = x % (ld * inner), i = rem / inner, k = rem % inner;
        int64_t bb = i / len, j = i % len;
        int64_t run = ((len - j) * inner) - k; /* to the end of this block part */
        if (run > b - x) run = b - x;
        int64_t full = ((o * p->tp_full) + bb * blk + lo + j) * inner + k;
        fn(u, full, x, run);
        x += run;
    }
}

/* Note [Uneven pipeline stages]
 * Megatron's --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers fix the layer counts
 * of the first and last stages; the stages without a fixed count share the remaining layers evenly. The
 * first stage also runs the embedding and the last the final norm, the LM head and the loss (for GPT-2 124M
 * the head's GEMMs alone weigh V / (12 C) ~ 5.5 layers), so an even split leaves the last stage the slowest
 * and every other stage waits for it. Stage s holds the consecutive layers [l0, l0 + n); nothing else about
 * a stage changes (parameter names are global, checkpoints name full tensors), so any split loads any
 * other's checkpoint. Not combined with interleaving (a chunk size per virtual stage would be needed). */
sl_status sl_pp_stage_layers(int L, const sl_model_split *sp, int s, int *l0, int *n) {
    int pp = sp->pp > 1 ? sp->pp : 1, f = sp->first_layers, l = sp->last_layers;
    const char *ff = "--decoder-first-pipeline-num-layers", *lf = "--decoder-last-pipeline-num-layers";
    if (f < 0 || l < 0 || f > L || l > L)
        return sl_fail(SL_ERR_INVALID, "%s %d: must be in [1, num-layers %d]", f < 0 || f > L ? ff : lf,
                       f < 0 || f > L ? f : l, L);
    if (!f && !l) {
        if (L % pp)
            return sl_fail(SL_ERR_INVALID, "--pipeline-model-parallel-size %d does not divide num-layers %d",
                           pp, L);
        *n = L / pp;
        *l0 = *n * s;
        return SL_OK;
    }
    if (pp < 2) return sl_fail(SL_ERR_INVALID, "%s: needs --pipeline-model-parallel-size > 1", f ? ff : lf);
    if (sp->vpp > 1)
        return sl_fail(SL_ERR_INVALID,
                       "%s: not supported with --num-layers-per-virtual-pipeline-stage (interleaving)",
                       f ? ff : lf);
    int rest = L - f - l, middle = pp - (f > 0) - (l > 0);
    if (rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && (rest <= 0 || rest % middle)))
        return sl_fail(SL_ERR_INVALID,
                       "%s %d / %s %d: num-layers %d leaves %d layers for %d other pipeline stages (needs a "
                       "positive multiple, or none for none)",
                       ff, f, lf, l, L, rest, middle);
    int per = middle ? rest / middle : 0, at = 0;
    for (int k = 0; k <= s; k++) {
        int c = k == 0 && f ? f : k == pp - 1 && l ? l : per;
        if (k == s) {
            *l0 = at;
            *n = c;
        }
        at += c;
    }
    return SL_OK;
}

void sl_pp_balanced_split(int L, int pp, double head_layers, int *first, int *last) {
    *first = *last = 0;
    if (pp < 2) return;
    /* the slowest stage first, then the spread (sum of squared stage costs; their sum is fixed) */
    double best = INFINITY, best_ss = INFINITY;
    if (L % pp == 0) {
        best = (double)(L / pp) + head_layers;
        best_ss = (pp - 1) * (double)(L / pp) * (L / pp) + best * best;
    }
    for (int f = 1; f < L; f++)
        for (int l = 1; f + l <= L; l++) { /* both fixed, the middle stages even (sl_pp_stage_layers' rule) */
            int rest = L - f - l, middle = pp - 2;
            if (middle ? rest <= 0 || rest % middle : rest != 0) continue;
            double mid = middle ? (double)(rest / middle) : 0, tail = (double)l + head_layers;
            double worst = fmax(fmax((double)f, mid), tail),
                   ss = (double)f * f + middle * mid * mid + tail * tail;
            if (worst < best - 1e-9 || (worst < best + 1e-9 && ss < best_ss - 1e-9)) {
                best = worst;
                best_ss = ss;
                *first = f;
                *last = l;
            }
        }
}
