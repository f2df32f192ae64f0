/* The Llama family (Llama, Qwen2, Mistral, Mixtral, Baichuan2) built from graph ops over one flat
 * parameter buffer. Parameter names and layouts are transformers' (nn.Linear weight is (out, in)), so
 * HF checkpoints load and save by name (src/nn/hf_load.c); see scripts/gen_hf_fixtures.py.
 *
 * Per layer (B, T, C = hidden, NH heads and NKV kv heads of size hd, I = intermediate):
 *   h = rmsnorm(x) ; q,k,v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)   (Baichuan: one W_pack)
 *   q,k = rope(q), rope(k) ; a = causal GQA attention ; x += a Wo^T
 *   h = rmsnorm(x) ; x += (silu(h Wg^T) * (h Wu^T)) Wd^T               (Mixtral: top-k mixture of such MLPs)
 * then rmsnorm and the LM head (untied, tied to the embedding, or Baichuan's row-normalised NormHead). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/llama_internal.h"

#define W sl_llama_W
#define rnd sl_llama_rnd
#define lin sl_llama_lin
#define swiglu_mlp sl_llama_swiglu
#define add_param sl_llama_add_param

static const char *const k_arch_names[] = {"gpt2",    "llama",    "qwen2",     "mistral",
                                           "mixtral", "baichuan", "qwen2_moe", "deepseek_v3"};
_Static_assert(sizeof(k_arch_names) / sizeof(k_arch_names[0]) == SL_ARCH_COUNT,
               "arch name table out of sync");
const char *sl_arch_name(sl_arch a) { return ((int)a >= 0 && a < SL_ARCH_COUNT) ? k_arch_names[a] : "?"; }

static sl_status check_cfg(const sl_llama_config *c) {
#define RANGE(f, lo, hi, name)                                                                               \
    if (c->f < (lo) || c->f > (hi))                                                                          \
    return sl_fail(SL_ERR_INVALID, "config: %s must be in [%d, %d], got %d", name, (int)(lo), (int)(hi), c->f)
    if (c->arch <= SL_ARCH_GPT2 || c->arch >= SL_ARCH_COUNT)
        return sl_fail(SL_ERR_INVALID, "config: unsupported architecture %d", (int)c->arch);
    RANGE(n_layer, 1, 1024, "num_hidden_layers");
    RANGE(n_head, 1, 4096, "num_attention_heads");
    RANGE(n_kv_head, 1, 4096, "num_key_value_heads");
    RANGE(hidden, 1, 1 << 17, "hidden_size");
    RANGE(head_dim, 2, 1 << 14, "head_dim");
    RANGE(intermediate, 1, 1 << 20, "intermediate_size");
    RANGE(vocab_size, 2, 1 << 24, "vocab_size");
    RANGE(max_seq_len, 1, 1 << 24, "max_position_embeddings");
    RANGE(sliding_window, 0, 1 << 30, "sliding_window");
#undef RANGE
    if (c->n_head % c->n_kv_head)
        return sl_fail(SL_ERR_INVALID,
                       "config: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                       c->n_head, c->n_kv_head);
    if (c->head_dim % 2)
        return sl_fail(SL_ERR_INVALID, "config: head_dim %d must be even (RoPE)", c->head_dim);
    if (!(c->rms_eps > 0 && c->rms_eps < 1))
        return sl_fail(SL_ERR_INVALID, "config: rms_norm_eps must be in (0, 1), got %g", (double)c->rms_eps);
    if (!(c->rope_theta > 1))
        return sl_fail(SL_ERR_INVALID, "config: rope_theta must be > 1, got %g", (double)c->rope_theta);
    if (c->rope_factor != 0 && !(c->rope_factor >= 1 && c->rope_low_freq > 0 &&
                                 c->rope_high_freq > c->rope_low_freq && c->rope_orig_ctx > 0))
        return sl_fail(SL_ERR_INVALID, "config: rope_scaling (llama3) needs factor >= 1, 0 < low_freq_factor "
                                       "< high_freq_factor and original_max_position_embeddings > 0");
    if (sl_arch_is_moe(c->arch)) SL_TRY(sl_moe_check_cfg(c));
    if (c->arch == SL_ARCH_BAICHUAN && c->n_kv_head != c->n_head)
        return sl_fail(SL_ERR_INVALID,
                       "config: Baichuan's W_pack needs num_key_value_heads == num_attention_heads");
    return SL_OK;
}

void sl_llama_add_param(sl_llama_builder *b, int decay, int init, int ndim, const int64_t *ne,
                        const char *fmt, ...) {
    sl_model *m = b->m;
    SL_ASSERT(m->n_params < b->cap);
    /* bf16 mode: projection matrices are bf16; the embedding (gathered by id) stays f32, and what the
     * builder marks (b->f32) */
    int bf = m->wdtype == SL_BF16 && ndim == 2 && m->n_params > 0 && !b->f32, keep_f32 = b->f32;
    int tdim = m->tp > 1 ? b->tdim : -1, tpack = b->tpack > 0 ? b->tpack : 1;
    int64_t lne[SL_MAX_DIMS];
    for (int d = 0; d < ndim; d++) lne[d] = ne[d];
    int tparts = tdim >= 0 ? b->tparts : 0;
    if (tdim >= 0) {
        int64_t lo, len;
        sl_param_info tmp = {.tp_parts = tparts};
        int parts, part;
        sl_param_tp_part(&tmp, m->tp, m->tp_rank, &parts, &part);
        sl_tp_part(ne[tdim] / tpack, parts, part, &lo, &len);
        lne[tdim] = len * tpack;
    }
    b->tdim = -1;
    b->tpack = 1;
    b->tparts = 0;
    b->f32 = 0;
    sl_tensor *t = sl_new_tensor(m->ctx, bf ? SL_BF16 : SL_F32, ndim, lne);
    sl_set_param(t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    sl_param_info *p = &m->params[m->n_params++];
    p->t = t;
    p->offset = bf ? m->wnumel : m->numel; /* index into wmem for bf16 leaves, params_mem otherwise */
    p->numel = sl_nelements(t);
    p->decay = decay;
    p->init = init;
    p->tp_split = tdim + 1;
    p->tp_pack = tdim >= 0 ? tpack : 1;
    p->tp_full = tdim >= 0 ? ne[tdim] : 0;
    p->tp_parts = tparts;
    p->keep_f32 = keep_f32;
    if (bf)
        m->wnumel += p->numel;
    else
        m->numel += p->numel;
}

static sl_status llama_new(const sl_llama_config *cfg, sl_dtype wdtype, sl_backend *be,
                           const sl_model_split *sp, sl_model **out);

sl_status sl_llama_new(const sl_llama_config *cfg, sl_model **out) {
    return sl_llama_new_ex(cfg, SL_F32, out);
}

sl_status sl_llama_new_ex(const sl_llama_config *cfg, sl_dtype wdtype, sl_model **out) {
    return sl_llama_new_on(cfg, wdtype, sl_backend_cpu(), out);
}

sl_status sl_llama_new_on(const sl_llama_config *cfg, sl_dtype wdtype, sl_backend *be, sl_model **out) {
    return llama_new(cfg, wdtype, be, &(sl_model_split){1, 0, 1, 0, 1, 0, 0, 1, 0, 0}, out);
}

sl_status sl_llama_new_tp(const sl_llama_config *cfg, sl_backend *be, int tp, int tp_rank, sl_model **out) {
    return sl_llama_new_par(cfg, be, &(sl_model_split){tp, tp_rank, 1, 0, 1, 0, 0, 1, 0, 0}, out);
}

sl_status sl_llama_new_par(const sl_llama_config *cfg, sl_backend *be, const sl_model_split *sp,
                           sl_model **out) {
    *out = NULL;
    SL_TRY(check_cfg(cfg));
    const char *flag = "--tensor-model-parallel-size";
    int tp = sp->tp, tp_rank = sp->tp_rank, pp = sp->pp, v = sp->vpp > 1 ? sp->vpp : 1;
    if (pp < 1 || sp->pp_rank < 0 || sp->pp_rank >= pp)
        return sl_fail(SL_ERR_INVALID, "--pipeline-model-parallel-size %d: stage %d out of range", pp,
                       sp->pp_rank);
    int l0, nl;
    SL_TRY(sl_pp_stage_layers(cfg->n_layer, sp, sp->pp_rank, &l0, &nl));
    (void)l0;
    (void)nl;
    if (v > 1 && (pp < 2 || cfg->n_layer % (pp * v)))
        return sl_fail(
            SL_ERR_INVALID,
            "--num-layers-per-virtual-pipeline-stage: num-layers %d is not pipeline stages %d x %d "
            "virtual stages x a whole number of layers",
            cfg->n_layer, pp, v);
    if (tp < 1 || tp_rank < 0 || tp_rank >= tp)
        return sl_fail(SL_ERR_INVALID, "%s %d: rank %d out of range", flag, tp, tp_rank);
    int ep = sp->ep > 1 ? sp->ep : 1;
    if (ep > 1) {
        if (!sl_arch_is_moe(cfg->arch))
            return sl_fail(
                SL_ERR_UNSUPPORTED,
                "--expert-model-parallel-size %d: expert parallelism needs a Mixtral, Qwen2-MoE or "
                "DeepSeek-V3-style model, not %s",
                ep, sl_arch_name(cfg->arch));
        if (cfg->n_experts % ep)
            return sl_fail(SL_ERR_INVALID, "--expert-model-parallel-size %d does not divide the %d experts",
                           ep, cfg->n_experts);
        if (sp->ep_rank < 0 || sp->ep_rank >= ep)
            return sl_fail(SL_ERR_INVALID, "--expert-model-parallel-size %d: rank %d out of range", ep,
                           sp->ep_rank);
    }
    if (cfg->arch == SL_ARCH_BAICHUAN)
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "%s %d / --pipeline-model-parallel-size %d: not implemented for %s (W_pack)", flag, tp,
                       pp, sl_arch_name(cfg->arch));
    if (cfg->n_head % tp)
        return sl_fail(SL_ERR_INVALID, "%s %d does not divide num-attention-heads %d", flag, tp, cfg->n_head);
    if (cfg->n_kv_head % tp && tp % cfg->n_kv_head) /* tp > kv heads: each kv head on tp / kv ranks */
        return sl_fail(SL_ERR_INVALID, "%s %d and num-query-groups (kv heads) %d: neither divides the other",
                       flag, tp, cfg->n_kv_head);
    if (cfg->vocab_size < tp)
        return sl_fail(SL_ERR_INVALID, "%s %d exceeds vocab-size %d", flag, tp, cfg->vocab_size);
    return llama_new(cfg, SL_F32, be, sp, out);
}

static sl_status llama_new(const sl_llama_config *cfg, sl_dtype wdtype, sl_backend *be,
                           const sl_model_split *sp, sl_model **out) {
    int tp = sp->tp, tp_rank = sp->tp_rank, pp = sp->pp > 1 ? sp->pp : 1, s = sp->pp_rank,
        v = sp->vpp > 1 ? sp->vpp : 1;
    *out = NULL;
    SL_TRY(check_cfg(cfg));
    if (wdtype != SL_F32 && wdtype != SL_BF16)
        return sl_fail(SL_ERR_INVALID, "model: weight dtype must be f32 or bf16");
    int l0 = 0, nl = cfg->n_layer;
    if (pp > 1) SL_TRY(sl_pp_stage_layers(cfg->n_layer, sp, s, &l0, &nl)); /* checked by the caller */
    sl_model *m = calloc(1, sizeof *m);
    if (!m) return sl_fail(SL_ERR_NOMEM, "model: out of memory");
    m->wdtype = wdtype;
    m->tp = tp;
    m->tp_rank = tp_rank;
    m->pp = pp;
    m->pp_rank = s;
    m->vpp = v;
    m->ep = sp->ep > 1 ? sp->ep : 1;
    m->ep_rank = m->ep > 1 ? sp->ep_rank : 0;
    m->etp = sp->etp && tp > 1 && sl_arch_is_moe(cfg->arch) && cfg->arch != SL_ARCH_MIXTRAL;
    m->n_layers = nl;
    m->layer0 = v > 1 ? nl / v * s : l0;
    m->pp_first_layers = sp->first_layers;
    m->pp_last_layers = sp->last_layers;
    int first = s == 0, last = s == pp - 1;
    const sl_llama_config *c = cfg;
    m->arch = c->arch;
    m->lcfg = *c;
    m->cfg = (sl_gpt2_config){c->n_layer, c->n_head, c->hidden, c->vocab_size, c->max_seq_len};
    int L = c->n_layer, E = sl_arch_is_moe(c->arch) ? c->n_experts : 1;
    int64_t C = c->hidden, V = c->vocab_size, I = c->intermediate, hd = c->head_dim;
    int64_t QD = c->n_head * hd, KD = c->n_kv_head * hd;
    sl_llama_builder b = {.m = m, .cap = 4 + L * (16 + 3 * E), .tdim = -1, .tpack = 1};
    m->params = calloc((size_t)b.cap, sizeof(sl_param_info));
    m->ctx = sl_ctx_new(64 * 1024 + (600 + 128 * E) * L);
    if (!m->params || !m->ctx) {
        sl_model_free(m);
        return sl_fail(SL_ERR_NOMEM, "model: out of memory");
    }
    b.tdim = 0; /* vocab-parallel */
    if (first) add_param(&b, 1, SL_INIT_NORMAL, 2, (int64_t[]){V, C}, "model.embed_tokens.weight");
    b.tdim = -1;
    for (int k = 0; k < m->n_layers; k++) { /* this stage's layers, chunk by chunk */
        int Lc = m->n_layers / v, l = m->layer0 + (k / Lc) * pp * Lc + k % Lc; /* chunk k / Lc */
        const char *pre = "model.layers";
        add_param(&b, 0, SL_INIT_ONE, 1, (int64_t[]){C}, "%s.%d.input_layernorm.weight", pre, l);
        if (c->arch == SL_ARCH_BAICHUAN) {
            add_param(&b, 1, SL_INIT_NORMAL, 2, (int64_t[]){3 * QD, C}, "%s.%d.self_attn.W_pack.weight", pre,
                      l);
        } else {
            const char *nm[3] = {"q_proj", "k_proj", "v_proj"};
            int64_t od[3] = {QD, KD, KD};
            /* column-parallel: heads split; kv heads over groups of ranks when tp > kv heads */
            int kvp = tp > c->n_kv_head ? c->n_kv_head : 0;
            for (int j = 0; j < 3; j++) {
                b.tdim = 0;
                b.tparts = j ? kvp : 0;
                add_param(&b, 1, SL_INIT_NORMAL, 2, (int64_t[]){od[j], C}, "%s.%d.self_attn.%s.weight", pre,
                          l, nm[j]);
                if (c->qkv_bias) { /* (set only here: a pending tparts would split o_proj as a kv head) */
                    b.tdim = 0;
                    b.tparts = j ? kvp : 0;
                    add_param(&b, 0, SL_INIT_ZERO, 1, (int64_t[]){od[j]}, "%s.%d.self_attn.%s.bias", pre, l,
                              nm[j]);
                }
            }
        }
        b.tdim = 1; /* row-parallel */
        add_param(&b, 1, SL_INIT_NORMAL, 2, (int64_t[]){C, QD}, "%s.%d.self_attn.o_proj.weight", pre, l);
        add_param(&b, 0, SL_INIT_ONE, 1, (int64_t[]){C}, "%s.%d.post_attention_layernorm.weight", pre, l);
        if (sl_moe_layer_is_sparse(c, l)) { /* Mixtral, Qwen2-MoE, DeepSeek-V3 past its dense layers */
            sl_moe_add_params(&b, l);
        } else {
            b.tdim = 0;
            add_param(&b, 1, SL_INIT_NORMAL, 2, (int64_t[]){I, C}, "%s.%d.mlp.gate_proj.weight", pre, l);
            b.tdim = 0;
            add_param(&b, 1, SL_INIT_NORMAL, 2, (int64_t[]){I, C}, "%s.%d.mlp.up_proj.weight", pre, l);
            b.tdim = 1;
            add_param(&b, 1, SL_INIT_NORMAL, 2, (int64_t[]){C, I}, "%s.%d.mlp.down_proj.weight", pre, l);
        }
    }
    if (last) {
        add_param(&b, 0, SL_INIT_ONE, 1, (int64_t[]){C}, "model.norm.weight");
        b.tdim = 0; /* the untied head: vocab-parallel like the embedding */
        if (!c->tie_embeddings) add_param(&b, 1, SL_INIT_NORMAL, 2, (int64_t[]){V, C}, "lm_head.weight");
        b.tdim = 0; /* a tied head on a later stage: its copy of the embedding */
        if (c->tie_embeddings && !first) {
            add_param(&b, 1, SL_INIT_NORMAL, 2, (int64_t[]){V, C}, "model.embed_tokens.weight");
            m->params[m->n_params - 1].tied_copy = 1;
        }
        b.tdim = -1;
    }
    int train = wdtype == SL_F32; /* bf16: on a backend without host-visible memory the bf16 leaves get a
                                     device buffer (Note [bf16 weights on device memory], model_state.c) */
    sl_status st = sl_model_alloc_state(m, be, train);
    if (st != SL_OK) {
        sl_model_free(m);
        return st;
    }
    if (!train) /* inference: constants, not trainable (bf16 leaves are bound by the loader) */
        for (int i = 0; i < m->n_params; i++) {
            sl_set_input(m->params[i].t);
            m->params[i].t->flags &= ~(uint32_t)SL_FLAG_PARAM;
        }
    *out = m;
    return SL_OK;
}

/* ---------------- graph ---------------- */

sl_tensor *sl_llama_W(sl_model *m, const char *fmt, ...) {
    char nm[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nm, sizeof nm, fmt, ap);
    va_end(ap);
    const sl_param_info *p = sl_model_find(m, nm);
    SL_ASSERT(p != NULL);
    return p->t;
}

/* Note [bf16 compute]
 * With bf16 weights (sl_llama_new_ex(.., SL_BF16)) the graph follows a transformers bf16 model: matmuls
 * take bf16 activations and weights with fp32 accumulation (SL_OP_LINEAR_BF16), and the tensors that
 * transformers keeps in bf16 (linear outputs, norm outputs, RoPE outputs, attention output, SiLU and
 * gating products, the residual stream) are rounded to bf16 values. Norm statistics, RoPE angles,
 * softmax and the MoE routing softmax stay fp32, as in transformers. In f32 mode rnd() is the identity.
 * The model followed is from_pretrained(dir, dtype=torch.bfloat16), whose RoPE inv_freq buffer stays fp32;
 * from_pretrained(fp32).to(torch.bfloat16) also rounds inv_freq to bf16, which moves every angle (0.54-0.78
 * of the bf16-vs-fp32 logit gap on the fixtures). Against the former, the fixtures' bf16 logits and greedy
 * continuations are bitwise on Zen 4 (tests/hf/test_hf_models.c). */
/* the autocast dtype: SL_BF16 (m->compute_dtype or m->autocast_bf16), SL_F16 (m->compute_dtype), or SL_F32
 * (off); Note [Half autocast] in gpt2.c. One path for both half types: only the dtype of the rounding
 * differs. */
sl_dtype sl_llama_autocast(const sl_model *m) {
    if (m->wdtype == SL_BF16) return SL_F32; /* a bf16 inference model: Note [bf16 compute] */
    return m->autocast_bf16                                            ? SL_BF16
           : m->compute_dtype == SL_F16 || m->compute_dtype == SL_BF16 ? m->compute_dtype
                                                                       : SL_F32;
}
static sl_dtype autocast(const sl_model *m) { return sl_llama_autocast(m); }
sl_tensor *sl_llama_rnd(sl_model *m, sl_tensor *x) {
    if (m->wdtype == SL_BF16) return sl_round_bf16(m->ctx, x);
    return autocast(m) != SL_F32 ? sl_round_half(m->ctx, x, autocast(m)) : x;
}
/* rounding only where a bf16 model (not autocast) keeps bf16 tensors: norm outputs, the residual stream */
static sl_tensor *rnd_model(sl_model *m, sl_tensor *x) {
    return m->wdtype == SL_BF16 ? sl_round_bf16(m->ctx, x) : x;
}

/* transformers' RMSNorm: weight * (x * rstd).to(input_dtype): in a bf16 model two roundings. Under
 * autocast (bf16 or f16) the residual stream is fp32 (a half linear output added to the fp32 embedding
 * promotes), so .to(input_dtype) is a no-op: an fp32 norm. */
static sl_tensor *norm(sl_model *m, sl_tensor *x, sl_tensor *w, float eps) {
    if (m->wdtype != SL_BF16) return sl_rmsnorm(m->ctx, x, w, eps);
    return rnd_model(m, sl_mul(m->ctx, rnd(m, sl_rmsnorm(m->ctx, x, NULL, eps)), w));
}

/* Note [bf16 GEMMs under autocast]
 * Under bf16 autocast a Linear's operands are bf16 values. On a backend that runs the fused weight product
 * (caps.matmul_half_b: Note [Fused weight casts] in src/ops/backward.c) the input is cast to a bf16 tensor
 * and the product runs on the bf16 GEMM (AMX tiles, vdpbf16ps, or widened) with the f32 weight rounded as
 * it is packed; elsewhere the operands are rounded in f32 (cast(cast(.))) and the fp32 GEMM multiplies
 * them. Both sum exact bf16 products in fp32 and round the gradients at the same points; the bf16 kernels
 * sum as oneDNN's do, so against torch.autocast fixtures made with the same kind of kernel the tiny Llama's
 * step-0 logits land at 0.001 (vdpbf16ps) of the fp32-autocast distance, against 0.059 with the fp32 GEMM
 * (tests/e2e/test_bf16_train.c). SUANLI_FUSED_WEIGHT_CAST=0 keeps the fp32 GEMM on rounded operands. */
int sl_llama_bf16_gemm(const sl_model *m, const sl_tensor *w) {
    const char *e = getenv("SUANLI_FUSED_WEIGHT_CAST");
    return autocast(m) == SL_BF16 && m->backend && m->backend->caps.matmul_half_b &&
           !(e && !strcmp(e, "0")) && w->dtype == SL_F32 && w->ndim == 2 && sl_is_contiguous(w);
}

sl_tensor *sl_llama_lin(sl_model *m, sl_tensor *x, sl_tensor *w, sl_tensor *b) {
    if (sl_llama_bf16_gemm(m, w)) { /* Note [bf16 GEMMs under autocast] */
        sl_tensor *xh = sl_cast(m->ctx, x->nb[x->ndim - 1] == 1 ? x : sl_cont(m->ctx, x), SL_BF16);
        return sl_linear_half_w_rounded(m->ctx, xh, w, b ? rnd(m, b) : NULL); /* rnd(m, .) is bf16 here */
    }
    if (autocast(m) != SL_F32) { /* autocast: half inputs, weight and bias; fp32 accumulation; half output.
                               The casts' backward rounds the gradients as autocast's half tensors do. */
        sl_tensor *y = sl_linear(m->ctx, rnd(m, x), rnd(m, w), b ? rnd(m, b) : NULL);
        return rnd(m, y);
    }
    if (w->dtype != SL_BF16) return sl_linear(m->ctx, x, w, b);
    sl_tensor *y = sl_linear_bf16(m->ctx, x, w, b == NULL);
    return b ? rnd(m, sl_bias(m->ctx, y, b)) : y;
}

/* (B, T, n*hd) -> (B, T, n, hd) view */
static sl_tensor *heads(sl_ctx *ctx, sl_tensor *x, int64_t n, int64_t hd) {
    int64_t B = x->ne[0], T = x->ne[1];
    int64_t nb[4] = {x->nb[0], x->nb[1], hd, 1};
    return sl_view(ctx, x, 4, (int64_t[]){B, T, n, hd}, nb, 0);
}

sl_tensor *sl_llama_swiglu(sl_model *m, sl_tensor *h, sl_tensor *wg, sl_tensor *wu, sl_tensor *wd) {
    sl_ctx *ctx = m->ctx;
    sl_tensor *g = rnd(m, sl_silu(ctx, lin(m, h, wg, NULL))); /* (.., I) */
    sl_tensor *u = lin(m, h, wu, NULL);
    return lin(m, rnd(m, sl_mul(ctx, g, u)), wd, NULL); /* (.., C) */
}

/* Note [Mixture of experts in a static graph]
 * The gate is a dense (N, E) matrix that is zero outside each token's top-k experts (SL_OP_TOPK_GATE),
 * so the layer is sum_e gate[:, e] * expert_e(h). Inference (KV graphs) computes each expert only on its
 * routed rows (SL_OP_MOE_EXPERT, Note [Sparse experts]). f32 training of every MoE architecture dispatches
 * tokens instead (src/nn/moe.c, Note [MoE dispatch in a static graph]); this dense form, where every expert
 * runs on every token (E/k times the FLOPs, exact because unselected experts are multiplied by 0), remains
 * for bf16 weights and for half experts under autocast (SUANLI_MOE_HALF_EXPERTS=1); autocast's default fp32
 * experts route (Note [Experts under autocast] in moe.c). */
static sl_tensor *moe(sl_model *m, sl_tensor *h, int l, int sparse) {
    sl_ctx *ctx = m->ctx;
    const sl_llama_config *c = &m->lcfg;
    int64_t B = h->ne[0], T = h->ne[1], C = h->ne[2], E = c->n_experts;
    sl_tensor *h2 = sl_reshape_2d(ctx, h, B * T, C);
    sl_tensor *gate =
        sl_topk_gate(ctx, lin(m, h2, W(m, "model.layers.%d.block_sparse_moe.gate.weight", l), NULL),
                     c->n_experts_per_tok); /* (N, E) */
    /* Note [bf16 Mixtral experts]
     * transformers 5's Mixtral (MixtralTopKRouter, the default grouped_mm experts) keeps the routing weights
     * fp32 and sums each token's weighted expert outputs in fp32: sum_k y_k * w_k, with y_k the expert's
     * down projection, cast to the dtype of the hidden states at the end: bf16 in a bf16 model, fp32 (no
     * rounding) under autocast. So the gate, the products and the sums stay fp32 here and a bf16 model
     * rounds once (k = 2: the same bits as torch's sum over k, since 0 + a and a + b do not depend on the
     * order). transformers 4 rounded the weights, each product and each sum (index_add_ on bf16).
     * Under autocast the experts themselves are fp32 (Note [Experts under autocast] in moe.c; half with
     * SUANLI_MOE_HALF_EXPERTS=1); only the router's linear rounds (to bf16 logits). Measured on the
     * fixture's step-0 forward (tests/hf/test_hf_models.c). */
    int bfm = m->wdtype == SL_BF16;
    sl_tensor *y = NULL;
    for (int e = 0; e < E; e++) {
        const char *pre = "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight";
        sl_tensor *ye;
        if (sparse) { /* inference: only the rows routed to e (Note [Sparse experts]) */
            ye = sl_moe_expert(ctx, h2, gate, e, W(m, pre, l, e, 1), W(m, pre, l, e, 3), W(m, pre, l, e, 2),
                               bfm);
        } else {
            sl_tensor *w1 = W(m, pre, l, e, 1), *w3 = W(m, pre, l, e, 3), *w2 = W(m, pre, l, e, 2);
            if (!bfm && autocast(m) != SL_F32 &&
                sl_moe_experts_half(m) == SL_F32) /* Note [bf16 Mixtral experts] */
                ye = sl_linear(
                    ctx,
                    sl_mul(ctx, sl_silu(ctx, sl_linear(ctx, h2, w1, NULL)), sl_linear(ctx, h2, w3, NULL)), w2,
                    NULL);
            else
                ye = swiglu_mlp(m, h2, w1, w3, w2); /* (N, C) */
            ye = sl_mul(ctx, ye, sl_slice(ctx, gate, 1, e, 1));
        }
        y = y ? sl_add(ctx, y, ye) : ye;
    }
    y = rnd_model(m, y);
    return sl_reshape(ctx, y, 3, (int64_t[]){B, T, C});
}

static sl_tensor *lm_head(sl_model *m, sl_tensor *x) {
    sl_ctx *ctx = m->ctx;
    const sl_llama_config *c = &m->lcfg;
    sl_tensor *w = c->tie_embeddings ? W(m, "model.embed_tokens.weight") : W(m, "lm_head.weight");
    int bf = m->wdtype == SL_BF16;
    if (c->arch == SL_ARCH_BAICHUAN) {
        /* NormHead: rows of W divided by their L2 norm. rmsnorm(w)/sqrt(C) = w / sqrt(|w|^2 + C*eps);
         * eps = 1e-24 / C keeps the 1e-12 floor of F.normalize out of the way for non-zero rows. */
        int64_t C = w->ne[1];
        if (w->dtype == SL_BF16) w = sl_cast(ctx, w, SL_F32);
        w = sl_scale(ctx, sl_rmsnorm(ctx, w, NULL, 1e-24f / (float)C), 1.0f / sqrtf((float)C));
    }
    if (autocast(m) != SL_F32) return lin(m, x, w, NULL);
    if (bf && w->dtype != SL_BF16) w = sl_cast(ctx, w, SL_BF16); /* tied / normalised head in bf16 */
    return bf ? sl_linear_bf16(ctx, x, w, 1) : sl_matmul(ctx, x, w, 0, 1); /* (B, T, V) */
}

/* Megatron's f and g under TP (Note [Tensor-parallel graphs]); identities on a whole model */
/* f and g; under fp16 autocast the TP sums are fp16 sums (Note [Half sums across TP ranks], src/nn/gpt2.c):
 * the rounding before f rounds the all-reduced input gradient in backward, the one after g the forward sum */
static sl_tensor *tp_f(sl_model *m, sl_tensor *x) {
    if (m->tp > 1 && m->wdtype != SL_BF16 && autocast(m) == SL_F16) x = sl_round_half(m->ctx, x, SL_F16);
    return sl_tp_enter(m->ctx, x, m->tp, m->sp);
}
static sl_tensor *tp_g(sl_model *m, sl_tensor *x) {
    x = sl_tp_exit(m->ctx, x, m->tp, m->sp);
    return m->tp > 1 && m->wdtype != SL_BF16 && autocast(m) == SL_F16 ? sl_round_half(m->ctx, x, SL_F16) : x;
}
static sl_tensor *tp_rep(sl_model *m, sl_tensor *p) { return sl_tp_rep(m->ctx, p, m->tp, m->sp); }
sl_tensor *sl_llama_tp_f(sl_model *m, sl_tensor *x) { return tp_f(m, x); }
sl_tensor *sl_llama_tp_g(sl_model *m, sl_tensor *x) { return tp_g(m, x); }

/* The shared body. kv == NULL: training / full-sequence attention; else attention over the cache.
 * Under TP (m->tp > 1, training only) each rank holds NH/tp query heads and NKV/tp kv heads, I/tp MLP
 * units and a vocabulary range: f before the column-parallel q/k/v and gate/up projections, g after the
 * row-parallel o_proj and down_proj, a vocab-shard embedding summed by g, and logits for the rank's
 * vocabulary only. With m->sp the norm/residual regions hold T/tp tokens (sequence parallelism; RoPE runs
 * after the all-gather, on whole sequences). */
static sl_tensor *body_stage(sl_model *m, int chunk, sl_tensor *ids, sl_tensor *x_in, sl_kv_cache *kv,
                             int pos0) {
    sl_ctx *ctx = m->ctx;
    const sl_llama_config *c = &m->lcfg;
    int tp = m->tp > 1 ? m->tp : 1, pp = m->pp > 1 ? m->pp : 1, v = m->vpp > 1 ? m->vpp : 1;
    int first = m->pp_rank == 0 && chunk == 0, last = m->pp_rank == pp - 1 && chunk == v - 1;
    int Lc = m->n_layers / v, l0 = m->layer0 + chunk * pp * Lc;
    SL_ASSERT((tp == 1 && pp == 1) || !kv);
    int kv_rep = tp > c->n_kv_head ? tp / c->n_kv_head : 1; /* ranks sharing each kv head */
    int64_t B = ids->ne[0], T = ids->ne[1], hd = c->head_dim, NH = c->n_head / tp,
            NKV = kv_rep > 1 ? 1 : c->n_kv_head / tp;
    int64_t QD = NH * hd, KD = NKV * hd;
    const char *pre = "model.layers";
    sl_tensor *x = x_in;
    if (!first) {
        SL_ASSERT(x_in);
    } else if (tp > 1) {
        int64_t vlo, vlen;
        sl_tp_part(c->vocab_size, tp, m->tp_rank, &vlo, &vlen);
        /* one rank's shard holds each row: an exact sum, f32 as the embedding's output under autocast */
        x = sl_tp_exit(ctx, sl_embedding_shard(ctx, W(m, "model.embed_tokens.weight"), ids, vlo), m->tp,
                       m->sp);
    } else {
        x = sl_embedding(ctx, W(m, "model.embed_tokens.weight"), ids); /* (B, T, C) */
    }
    if (first && !kv) x = sl_model_hidden_dropout(m, x, sl_model_dropout_site(-1, 0)); /* Megatron's */
    if (!kv) x->flags |= SL_FLAG_LAYER_IO; /* Note [Full recomputation] (src/graph/autodiff.c) */
    for (int l = l0; l < l0 + Lc; l++) {
        sl_tensor *h =
            tp_f(m, norm(m, x, tp_rep(m, W(m, "%s.%d.input_layernorm.weight", pre, l)), c->rms_eps));
        sl_tensor *q, *k, *v;
        if (c->arch == SL_ARCH_BAICHUAN) {
            sl_tensor *qkv = lin(m, h, W(m, "%s.%d.self_attn.W_pack.weight", pre, l), NULL); /* (B, T, 3QD) */
            q = heads(ctx, sl_slice(ctx, qkv, 2, 0, QD), NH, hd);
            k = heads(ctx, sl_slice(ctx, qkv, 2, QD, KD), NKV, hd);
            v = heads(ctx, sl_slice(ctx, qkv, 2, QD + KD, KD), NKV, hd);
        } else {
            sl_tensor *bq = NULL, *bk = NULL, *bv = NULL;
            sl_tensor *wk = W(m, "%s.%d.self_attn.k_proj.weight", pre, l),
                      *wv = W(m, "%s.%d.self_attn.v_proj.weight", pre, l);
            if (c->qkv_bias) {
                bq = W(m, "%s.%d.self_attn.q_proj.bias", pre, l);
                bk = W(m, "%s.%d.self_attn.k_proj.bias", pre, l);
                bv = W(m, "%s.%d.self_attn.v_proj.bias", pre, l);
            }
            if (kv_rep > 1) { /* a kv head shared by kv_rep ranks: their partial gradients summed */
#define KVREP(t) ((t) = sl_collective_group(ctx, (t), SL_COLL_COPY, SL_COLL_ALLREDUCE, tp, kv_rep))
                KVREP(wk);
                KVREP(wv);
                if (bk) KVREP(bk);
                if (bv) KVREP(bv);
#undef KVREP
            }
            q = heads(ctx, lin(m, h, W(m, "%s.%d.self_attn.q_proj.weight", pre, l), bq), NH,
                      hd);                              /* (B,T,NH,hd) */
            k = heads(ctx, lin(m, h, wk, bk), NKV, hd); /* (B,T,NKV,hd) */
            v = heads(ctx, lin(m, h, wv, bv), NKV, hd);
        }
        q = sl_rope(ctx, q, pos0, c->rope_theta);
        k = sl_rope(ctx, k, pos0, c->rope_theta);
        if (c->rope_factor > 0) {
            sl_tensor *qk[2] = {q, k};
            for (int j = 0; j < 2; j++) {
                qk[j]->fparams[1] = c->rope_factor;
                qk[j]->fparams[2] = c->rope_low_freq;
                qk[j]->fparams[3] = c->rope_high_freq;
                qk[j]->iparams[3] = c->rope_orig_ctx;
            }
        }
        /* Note [bf16 compute]; autocast: Note [RoPE numerics] */
        q->iparams[2] = k->iparams[2] = m->wdtype == SL_BF16     ? 1
                                        : autocast(m) == SL_BF16 ? 3
                                        : autocast(m) == SL_F16  ? 4
                                                                 : 0;
        if (autocast(m) != SL_F32) { /* autocast: transformers' cos/sin are fp32 (the dtype of the fp32
                                        hidden states), so RoPE promotes to fp32 and the attention matmul's
                                        autocast cast rounds q and k to the half type. Training: the
                                        cast of k follows transformers' repeat_kv, so the attention kernel
                                        rounds k itself (Note [Eager half attention numerics]) */
            q = rnd(m, q);
            if (kv) k = rnd(m, k);
        }
        sl_tensor *a;
        if (kv) {
            sl_tensor *ks = sl_kv_store(ctx, kv->k[l], k, pos0), *vs = sl_kv_store(ctx, kv->v[l], v, pos0);
            a = sl_attention_kv(ctx, q, ks, vs, pos0, c->sliding_window); /* (B, T, QD) */
            a->iparams[2] = m->wdtype == SL_BF16;
        } else {
            a = sl_attention_window(ctx, q, k, v, c->sliding_window); /* (B, T, QD); Mistral: windowed */
            if (autocast(m) != SL_F32) /* Note [Eager half attention numerics]: fp32 P */
                a->iparams[2] = autocast(m) == SL_F16 ? 3 : 4;
            sl_model_attention_dropout(m, a, l); /* HF's attention_dropout */
        }
        sl_tensor *ao = tp_g(m, lin(m, rnd(m, a), W(m, "%s.%d.self_attn.o_proj.weight", pre, l), NULL));
        x = rnd_model(m,
                      kv ? sl_add(ctx, x, ao)
                         : sl_model_hidden_dropout_add(m, x, ao, sl_model_dropout_site(l, SL_DROP_ATTN_OUT)));
        h = norm(m, x, tp_rep(m, W(m, "%s.%d.post_attention_layernorm.weight", pre, l)), c->rms_eps);
        sl_tensor *f;
        /* Mixtral's dense gate form (every expert on every token): inference, bf16 weights, half experts
         * under autocast (SUANLI_MOE_HALF_EXPERTS=1), backends without the routing ops; a model split over
         * TP or EP routes (the form needs every expert, and TP's g would sum tp copies of it). Autocast's
         * default fp32 experts route as fp32 training does (Note [Experts under autocast] in moe.c) */
        if (c->arch == SL_ARCH_MIXTRAL && m->tp <= 1 && m->ep <= 1 &&
            (kv || m->wdtype == SL_BF16 || sl_moe_experts_half(m) != SL_F32 || !sl_moe_backend_ok(m)))
            f = tp_g(
                m,
                moe(m, tp_f(m, h), l,
                    kv != NULL)); /* sparse inference, bf16 numerics, other backends: the dense gate form */
        else if (sl_moe_layer_is_sparse(c, l))
            f = sl_moe_ffn(m, h, l); /* dispatched experts (src/nn/moe.c); Note [MoE under TP] there */
        else
            f = tp_g(m, swiglu_mlp(m, tp_f(m, h), W(m, "%s.%d.mlp.gate_proj.weight", pre, l),
                                   W(m, "%s.%d.mlp.up_proj.weight", pre, l),
                                   W(m, "%s.%d.mlp.down_proj.weight", pre, l)));
        x = rnd_model(m,
                      kv ? sl_add(ctx, x, f)
                         : sl_model_hidden_dropout_add(m, x, f, sl_model_dropout_site(l, SL_DROP_MLP_OUT)));
        if (!kv) x->flags |= SL_FLAG_LAYER_IO;
    }
    if (!last) return sl_set_name(x, "stage_out");
    if (kv && kv->last_only && T > 1) x = sl_cont(ctx, sl_slice(ctx, x, 1, T - 1, 1)); /* (B, 1, C) */
    x = tp_f(m, norm(m, x, tp_rep(m, W(m, "model.norm.weight")), c->rms_eps));
    (void)B;
    (void)T;
    return lm_head(m, x);
}

static sl_tensor *body(sl_model *m, sl_tensor *ids, sl_kv_cache *kv, int pos0) {
    return body_stage(m, 0, ids, NULL, kv, pos0);
}

static sl_tensor *llama_loss(sl_model *m, int mark, sl_tensor *logits, sl_tensor *targets);

sl_tensor *sl_model_build_stage(sl_model *m, int chunk, sl_tensor *ids, sl_tensor *x_in, sl_tensor *targets,
                                sl_tensor **router_loss) {
    if (router_loss) *router_loss = NULL;
    if (m->arch == SL_ARCH_GPT2) return sl_gpt2_build_stage(m, chunk, ids, x_in, targets, NULL);
    int mark = sl_ctx_mark(m->ctx);
    sl_tensor *out = body_stage(m, chunk, ids, x_in, NULL, 0);
    int last = m->pp_rank == (m->pp > 1 ? m->pp : 1) - 1 && chunk == (m->vpp > 1 ? m->vpp : 1) - 1;
    if (last && targets) return llama_loss(m, mark, sl_set_name(out, "logits"), targets);
    if (router_loss && (m->moe.aux_coeff > 0 || m->moe.z_coeff > 0))
        *router_loss = sl_moe_add_router_losses(m, mark, NULL);
    return out;
}

sl_tensor *sl_model_build(sl_model *m, sl_tensor *ids, sl_tensor *targets, sl_tensor **logits_out) {
    if (m->arch == SL_ARCH_GPT2) return sl_gpt2_build(m, ids, targets, logits_out);
    SL_ASSERT(m->pp <= 1 && "a pipeline stage is built with sl_model_build_stage");
    SL_ASSERT(ids->ndim == 2 && ids->ne[1] <= m->lcfg.max_seq_len);
    int mark = sl_ctx_mark(m->ctx);
    sl_tensor *logits = body(m, ids, NULL, 0);
    sl_set_name(logits, "logits");
    if (logits_out) *logits_out = logits;
    if (!targets) return NULL;
    return llama_loss(m, mark, logits, targets);
}

/* the cross-entropy (vocab-parallel under TP: the logits are this rank's vocabulary columns) plus every
 * router-loss node created on m->ctx since mark */
static sl_tensor *llama_loss(sl_model *m, int mark, sl_tensor *logits, sl_tensor *targets) {
    sl_tensor *loss;
    if (m->tp > 1) {
        int64_t vlo, vlen;
        sl_tp_part(m->lcfg.vocab_size, m->tp, m->tp_rank, &vlo, &vlen);
        loss = sl_cross_entropy_vp(m->ctx, logits, targets, vlo, m->tp);
    } else {
        loss = sl_cross_entropy(m->ctx, logits, targets);
    }
    loss = sl_moe_add_router_losses(m, mark, loss);
    sl_set_name(loss, "loss");
    return loss;
}

/* ---------------- KV cache ---------------- */

sl_status sl_kv_cache_new(sl_model *m, int B, int S, sl_kv_cache *kv) {
    memset(kv, 0, sizeof *kv);
    if (B < 1 || S < 1) return sl_fail(SL_ERR_INVALID, "kv cache: batch and length must be >= 1");
    int gpt2 = m->arch == SL_ARCH_GPT2;
    int n_layer = gpt2 ? m->cfg.n_layer : m->lcfg.n_layer, nkv = gpt2 ? m->cfg.n_head : m->lcfg.n_kv_head,
        hd = gpt2 ? m->cfg.n_embd / m->cfg.n_head : m->lcfg.head_dim;
    int64_t per = (int64_t)B * S * nkv * hd;
    kv->B = B;
    kv->S = S;
    kv->n_layer = n_layer;
    kv->k = calloc((size_t)n_layer, sizeof(sl_tensor *));
    kv->v = calloc((size_t)n_layer, sizeof(sl_tensor *));
    kv->backend = m->backend;
    kv->pos_cap = gpt2 ? 2 * S + 2 : 0; /* a prefill and a decode graph */
    sl_status st = sl_backend_alloc(m->backend, sizeof(float) * (size_t)(2 * per * n_layer), &kv->mem);
    if (st == SL_OK && gpt2)
        st = sl_backend_alloc(m->backend, sizeof(int32_t) * (size_t)kv->pos_cap, &kv->pos);
    if (!kv->k || !kv->v || st != SL_OK) {
        sl_kv_cache_free(kv);
        return sl_fail(SL_ERR_NOMEM, "kv cache: cannot allocate %lld floats on %s",
                       (long long)(2 * per * n_layer), m->backend->name);
    }
    for (int l = 0; l < n_layer; l++) {
        int64_t ne[4] = {B, S, nkv, hd};
        kv->k[l] = sl_set_name(sl_new_tensor(m->ctx, SL_F32, 4, ne), "kcache.%d", l);
        kv->v[l] = sl_set_name(sl_new_tensor(m->ctx, SL_F32, 4, ne), "vcache.%d", l);
        sl_tensor_bind_buffer(kv->k[l], kv->mem, sizeof(float) * (size_t)((2 * l) * per));
        sl_tensor_bind_buffer(kv->v[l], kv->mem, sizeof(float) * (size_t)((2 * l + 1) * per));
    }
    return SL_OK;
}

void sl_kv_cache_free(sl_kv_cache *kv) {
    free(kv->k);
    free(kv->v);
    if (kv->backend) {
        sl_backend_free(kv->backend, kv->pos);
        sl_backend_free(kv->backend, kv->mem);
    }
    memset(kv, 0, sizeof *kv);
}

sl_tensor *sl_model_build_kv(sl_model *m, sl_tensor *ids, sl_kv_cache *kv, int pos0) {
    SL_ASSERT(ids->ndim == 2 && ids->ne[0] == kv->B);
    if (m->arch == SL_ARCH_GPT2) return sl_gpt2_build_kv(m, ids, kv, pos0);
    sl_tensor *logits = body(m, ids, kv, pos0);
    sl_set_name(logits, "logits");
    return logits;
}

sl_status sl_kv_graph_set_pos(sl_graph *g, int pos0) {
    for (int i = 0; i < sl_graph_n_nodes(g); i++) {
        sl_tensor *t = sl_graph_node(g, i);
        if (t->op == SL_OP_ROPE || t->op == SL_OP_KV_STORE || t->op == SL_OP_ATTENTION_KV)
            t->iparams[0] = pos0;
        /* GPT-2's learned positions: the position-id leaf of its wpe lookup, in device memory */
        if (t->op == SL_OP_EMBEDDING && t->src[1]->op == SL_OP_NONE && t->src[1]->buffer &&
            !strcmp(t->src[1]->name, "kv_positions")) {
            int32_t pos[64];
            int64_t n = t->src[1]->ne[0];
            for (int64_t j0 = 0; j0 < n; j0 += 64) {
                int64_t c = n - j0 < 64 ? n - j0 : 64;
                for (int64_t j = 0; j < c; j++) pos[j] = (int32_t)(pos0 + j0 + j);
                SL_TRY(sl_backend_copy_in(t->src[1]->buffer,
                                          t->src[1]->buffer_offs + sizeof(int32_t) * (size_t)j0, pos,
                                          sizeof(int32_t) * (size_t)c));
            }
        }
    }
    return SL_OK;
}

sl_status sl_model_new_split(const sl_model *like, sl_backend *be, const sl_model_split *split,
                             sl_model **out) {
    if (like->arch == SL_ARCH_GPT2) return sl_gpt2_new_par(&like->cfg, be, split, out);
    return sl_llama_new_par(&like->lcfg, be, split, out);
}
