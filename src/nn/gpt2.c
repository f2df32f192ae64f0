/* GPT-2 (pre-LN, tied embedding, GELU-tanh MLP) built from graph ops over one flat parameter buffer.
 * Parameter names and layouts follow PyTorch nn.Linear (weight is (out, in)); see scripts/gen_gpt2_parity.py.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/nn.h"

static sl_status check_cfg(const sl_gpt2_config *c) {
    if (c->n_layer < 1 || c->n_layer > 1024)
        return sl_fail(SL_ERR_INVALID, "num-layers must be in [1, 1024], got %d", c->n_layer);
    if (c->n_head < 1) return sl_fail(SL_ERR_INVALID, "num-attention-heads must be >= 1, got %d", c->n_head);
    if (c->n_embd < 1 || c->n_embd > 65536)
        return sl_fail(SL_ERR_INVALID, "hidden-size must be in [1, 65536], got %d", c->n_embd);
    if (c->n_embd % c->n_head != 0)
        return sl_fail(SL_ERR_INVALID, "hidden-size %d is not divisible by num-attention-heads %d", c->n_embd,
                       c->n_head);
    if (c->vocab_size < 2 || c->vocab_size > (1 << 24))
        return sl_fail(SL_ERR_INVALID, "vocab-size must be in [2, 2^24], got %d", c->vocab_size);
    if (c->max_seq_len < 1 || c->max_seq_len > (1 << 20))
        return sl_fail(SL_ERR_INVALID, "seq-length must be in [1, 2^20], got %d", c->max_seq_len);
    return SL_OK;
}

typedef struct {
    sl_model *m;
    int cap;
} builder;

void sl_param_tp_part(const sl_param_info *p, int tp, int r, int *parts, int *part) {
    if (p->tp_parts > 0 && p->tp_parts < tp) {
        *parts = p->tp_parts;
        *part = r / (tp / p->tp_parts);
    } else {
        *parts = tp;
        *part = r;
    }
}

void sl_tp_part(int64_t block_full, int tp, int r, int64_t *lo, int64_t *len) {
    int64_t a = block_full * r / tp, b = block_full * (r + 1) / tp;
    *lo = a;
    *len = b - a;
}

/* A parameter of full shape ne; under TP (b->tp > 1) dimension tp_dim is split (tp_pack blocks). */
static sl_tensor *add_param_tp(builder *b, const char *name, int ndim, const int64_t *full_ne, int decay,
                               int init, int tp_dim, int tp_pack) {
    sl_model *m = b->m;
    SL_ASSERT(m->n_params < b->cap);
    int64_t ne[SL_MAX_DIMS];
    for (int d = 0; d < ndim; d++) ne[d] = full_ne[d];
    int tp = m->tp > 1 ? m->tp : 1;
    if (tp == 1) tp_dim = -1;
    if (tp_dim >= 0) {
        int64_t lo, len;
        sl_tp_part(full_ne[tp_dim] / tp_pack, tp, m->tp_rank, &lo, &len);
        ne[tp_dim] = len * tp_pack;
    }
    sl_tensor *t = sl_new_tensor(m->ctx, SL_F32, ndim, ne);
    sl_set_param(t);
    sl_set_name(t, "%s", name);
    sl_param_info *p = &m->params[m->n_params++];
    p->t = t;
    p->offset = m->numel;
    p->numel = sl_nelements(t);
    p->decay = decay;
    p->init = init;
    p->tp_split = tp_dim + 1;
    p->tp_pack = tp_dim >= 0 ? tp_pack : 1;
    p->tp_full = tp_dim >= 0 ? full_ne[tp_dim] : 0;
    m->numel += p->numel;
    return t;
}

static sl_tensor *add_param(builder *b, const char *name, int ndim, const int64_t *ne, int decay, int init) {
    return add_param_tp(b, name, ndim, ne, decay, init, -1, 1);
}

sl_status sl_gpt2_new(const sl_gpt2_config *cfg, sl_model **out) {
    return sl_gpt2_new_on(cfg, sl_backend_cpu(), out);
}

sl_status sl_gpt2_new_on(const sl_gpt2_config *cfg, sl_backend *be, sl_model **out) {
    return sl_gpt2_new_tp(cfg, be, 1, 0, out);
}

sl_status sl_gpt2_new_tp(const sl_gpt2_config *cfg, sl_backend *be, int tp, int tp_rank, sl_model **out) {
    return sl_gpt2_new_par(cfg, be, &(sl_model_split){tp, tp_rank, 1, 0, 1, 0, 0, 1, 0, 0}, out);
}

sl_status sl_gpt2_new_par(const sl_gpt2_config *cfg, sl_backend *be, const sl_model_split *sp,
                          sl_model **out) {
    *out = NULL;
    SL_TRY(check_cfg(cfg));
    int tp = sp->tp, tp_rank = sp->tp_rank, pp = sp->pp, pp_rank = sp->pp_rank, v = sp->vpp > 1 ? sp->vpp : 1;
    if (pp < 1 || pp_rank < 0 || pp_rank >= pp)
        return sl_fail(SL_ERR_INVALID, "--pipeline-model-parallel-size %d: stage %d out of range", pp,
                       pp_rank);
    int layer0, nl;
    SL_TRY(sl_pp_stage_layers(cfg->n_layer, sp, pp_rank, &layer0, &nl));
    if (v > 1 && (pp < 2 || cfg->n_layer % (pp * v) != 0))
        return sl_fail(
            SL_ERR_INVALID,
            "--num-layers-per-virtual-pipeline-stage: num-layers %d is not pipeline stages %d x %d "
            "virtual stages x a whole number of layers",
            cfg->n_layer, pp, v);
    if (tp < 1 || tp_rank < 0 || tp_rank >= tp)
        return sl_fail(SL_ERR_INVALID, "--tensor-model-parallel-size %d: rank %d out of range", tp, tp_rank);
    if (cfg->n_head % tp != 0)
        return sl_fail(SL_ERR_INVALID,
                       "--tensor-model-parallel-size %d does not divide num-attention-heads %d", tp,
                       cfg->n_head);
    if (cfg->vocab_size < tp)
        return sl_fail(SL_ERR_INVALID, "--tensor-model-parallel-size %d exceeds vocab-size %d", tp,
                       cfg->vocab_size);
    sl_model *m = calloc(1, sizeof *m);
    if (!m) return sl_fail(SL_ERR_NOMEM, "model: out of memory");
    m->cfg = *cfg;
    m->tp = tp;
    m->tp_rank = tp_rank;
    m->pp = pp;
    m->pp_rank = pp_rank;
    m->n_layers = nl;
    m->vpp = v;
    m->layer0 = v > 1 ? nl / v * pp_rank : layer0; /* chunk 0's first layer */
    m->pp_first_layers = sp->first_layers;
    m->pp_last_layers = sp->last_layers;
    int first = pp_rank == 0, last = pp_rank == pp - 1;
    int L = cfg->n_layer;
    int64_t C = cfg->n_embd, V = cfg->vocab_size, T = cfg->max_seq_len;
    builder b = {m, 4 + 12 * L};
    m->params = calloc((size_t)b.cap, sizeof(sl_param_info));
    m->ctx = sl_ctx_new(64 * 1024 + 600 * L);
    if (!m->params || !m->ctx) {
        sl_model_free(m);
        return sl_fail(SL_ERR_NOMEM, "model: out of memory");
    }
    char nm[64];
    if (first) {
        add_param_tp(&b, "wte", 2, (int64_t[]){V, C}, 1, SL_INIT_NORMAL, 0, 1); /* vocab-parallel */
        add_param(&b, "wpe", 2, (int64_t[]){T, C}, 1, SL_INIT_NORMAL);
    }
    for (int k = 0; k < m->n_layers; k++) { /* chunk by chunk (one chunk without interleaving) */
        int Lc = m->n_layers / v, l = m->layer0 + (k / Lc) * pp * Lc + k % Lc; /* chunk k / Lc */
/* tp dimension and packed blocks: column-parallel weights split rows, row-parallel ones columns */
#define P(suffix, nd, shape, decay, init, tdim, pack)                                                        \
    snprintf(nm, sizeof nm, "h.%d." suffix, l);                                                              \
    add_param_tp(&b, nm, nd, shape, decay, init, tdim, pack)
        P("ln_1.weight", 1, ((int64_t[]){C}), 0, SL_INIT_ONE, -1, 1);
        P("ln_1.bias", 1, ((int64_t[]){C}), 0, SL_INIT_ZERO, -1, 1);
        P("attn.c_attn.weight", 2, ((int64_t[]){3 * C, C}), 1, SL_INIT_NORMAL, 0, 3);
        P("attn.c_attn.bias", 1, ((int64_t[]){3 * C}), 0, SL_INIT_ZERO, 0, 3);
        P("attn.c_proj.weight", 2, ((int64_t[]){C, C}), 1, SL_INIT_NORMAL_RESID, 1, 1);
        P("attn.c_proj.bias", 1, ((int64_t[]){C}), 0, SL_INIT_ZERO, -1, 1);
        P("ln_2.weight", 1, ((int64_t[]){C}), 0, SL_INIT_ONE, -1, 1);
        P("ln_2.bias", 1, ((int64_t[]){C}), 0, SL_INIT_ZERO, -1, 1);
        P("mlp.c_fc.weight", 2, ((int64_t[]){4 * C, C}), 1, SL_INIT_NORMAL, 0, 1);
        P("mlp.c_fc.bias", 1, ((int64_t[]){4 * C}), 0, SL_INIT_ZERO, 0, 1);
        P("mlp.c_proj.weight", 2, ((int64_t[]){C, 4 * C}), 1, SL_INIT_NORMAL_RESID, 1, 1);
        P("mlp.c_proj.bias", 1, ((int64_t[]){C}), 0, SL_INIT_ZERO, -1, 1);
#undef P
    }
    if (last) {
        add_param(&b, "ln_f.weight", 1, (int64_t[]){C}, 0, SL_INIT_ONE);
        add_param(&b, "ln_f.bias", 1, (int64_t[]){C}, 0, SL_INIT_ZERO);
    }
    if (last && !first) { /* the LM head's copy of the tied embedding, kept equal to the first stage's */
        add_param_tp(&b, "wte", 2, (int64_t[]){V, C}, 1, SL_INIT_NORMAL, 0, 1);
        m->params[m->n_params - 1].tied_copy = 1;
    }
    sl_status st = sl_model_alloc_state(m, be, 1);
    if (st != SL_OK) {
        sl_model_free(m);
        return st;
    }
    *out = m;
    return SL_OK;
}

/* Under TP the residual stream is replicated (the full tensor: the single process's mask as it is) or, with
 * SP, this rank's sequence shard (B, T / tp, C): the node draws at the shard's full-tensor indices. */
sl_tensor *sl_model_hidden_dropout(sl_model *m, sl_tensor *x, int site) {
    return sl_model_hidden_dropout_add(m, NULL, x, site);
}
/* res + dropout(x) as one node that keeps its mask as bits (Note [Hidden dropout bits], src/ops/build.c);
 * res NULL: dropout(x); without dropout the plain add */
sl_tensor *sl_model_hidden_dropout_add(sl_model *m, sl_tensor *res, sl_tensor *x, int site) {
    if (!(m->hidden_dropout > 0)) return res ? sl_add(m->ctx, res, x) : x;
    sl_tensor *d = sl_dropout_add(m->ctx, x, res, m->hidden_dropout, site);
    if (m->tp > 1 && m->sp) {
        SL_ASSERT(d->ndim == 3);
        d->iparams[SL_DROPOUT_IP_T0] = (int32_t)(d->ne[1] * m->tp_rank);
        d->iparams[SL_DROPOUT_IP_SEQ] = (int32_t)(d->ne[1] * m->tp);
    }
    return d;
}

/* Under TP the node holds query heads [tp_rank NH/tp, + NH/tp): their probabilities are the full tensor's */
sl_tensor *sl_model_attention_dropout(sl_model *m, sl_tensor *a, int layer) {
    if (!(m->attention_dropout > 0)) return a;
    sl_attention_dropout(a, m->attention_dropout, sl_model_dropout_site(layer, SL_DROP_ATTN_PROBS));
    if (m->tp > 1) {
        int64_t nhl = a->src[0]->ne[2];
        a->iparams[SL_DROPOUT_IP_HEAD0] = (int32_t)(nhl * m->tp_rank);
        a->iparams[SL_DROPOUT_IP_HEADS] = (int32_t)(nhl * m->tp);
    }
    return a;
}

const sl_param_info *sl_model_find(const sl_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].t->name, name)) return &m->params[i];
    return NULL;
}

static sl_tensor *P(sl_model *m, int idx) { return m->params[idx].t; }

/* Note [Half autocast]
 * m->compute_dtype = SL_F16 (`--fp16`) or SL_BF16 (`--bf16`) follows torch.autocast("cpu",
 * dtype=torch.float16 / torch.bfloat16) on this model (one path: only the dtype of the rounding differs;
 * below, "f16" is either): the ops on autocast's lower-precision list (linear, matmul,
 * scaled_dot_product_attention) take f16 operands (weights and biases included: f32 master weights are cast
 * each step) and return an f16 tensor; everything else runs in the dtype of its inputs (layer norm on the
 * fp32 residual stream is fp32; GELU of an f16 tensor is an f16 tensor) and cross-entropy is on autocast's
 * fp32 list. So the rounding points are: each GEMM's operands (the casts below) and its output
 * (sl_round_half: that f16 tensor feeds GELU, attention, the residual add, which promotes to fp32 exactly,
 * and cross-entropy). GELU's output and attention's output are rounded by the next GEMM's operand cast, which
 * is the same rounding. The backward rounds wherever an f16 tensor's gradient is f16 in autocast: the casts'
 * rule (src/ops/backward.c) turns the f32 gradient reaching an f16 node into f16, which is where fp16
 * gradients overflow to inf (Note [Dynamic loss scaling]). Attention is one fused op that rounds where the
 * eager softmax(q k^T / sqrt(hs)) v rounds under autocast (Note [Eager half attention numerics],
 * attention.c). (torch's fused CPU SDPA in f16 rounds elsewhere, undocumented: measured 19% of its outputs an
 * ulp away from any rounding model we tried.) (bf16 once rounded operands only, with f32 products and bias:
 * 0.9x autocast's own distance from fp32 at step 0; with these rounding points, 0.000x:
 * tests/e2e/test_bf16_train.c.) The Llama family follows the same rules in llama.c (autocast()), with
 * transformers' eager attention (softmax in fp32, Note [Eager half attention numerics] modes 3/4) and RoPE in
 * fp32 with half gradients (Note [RoPE numerics]). */
/* Note [Fused weight casts] (src/ops/backward.c): a bf16 Linear reads its f32 weight leaf directly where the
 * backend rounds it in the GEMM (SUANLI_FUSED_WEIGHT_CAST=0: the cast nodes, for A/B) */
static int fused_weight_cast(const sl_model *m, const sl_tensor *w) {
    const char *e = getenv("SUANLI_FUSED_WEIGHT_CAST");
    return m->compute_dtype == SL_BF16 && m->backend && m->backend->caps.matmul_half_b &&
           !(e && !strcmp(e, "0")) && w->op == SL_OP_NONE && (w->flags & SL_FLAG_PARAM) &&
           w->dtype == SL_F32 && w->ndim == 2 && sl_is_contiguous(w);
}

static sl_tensor *mm(sl_model *m, sl_tensor *x, sl_tensor *w, sl_tensor *b) {
    sl_ctx *ctx = m->ctx;
    sl_dtype cd = m->compute_dtype;
    if (cd == SL_F32) return sl_linear(ctx, x, w, b); /* the bias is added by the GEMM */
    x = sl_cast(ctx, x->nb[x->ndim - 1] == 1 ? x : sl_cont(ctx, x), cd);
    sl_tensor *bh = b ? sl_round_half(ctx, b, cd) : NULL;
    if (fused_weight_cast(m, w)) return sl_linear_half_w_rounded(ctx, x, w, bh);
    w = sl_cast(ctx, w, cd);
    return sl_round_half(ctx, sl_linear(ctx, x, w, bh), cd);
}

/* The GPT-2 forward pass to logits (B, T, V). Training/evaluation: positions 0..T-1 from a view of wpe and
 * full causal attention. With a KV cache (generation): positions pos0.. through an embedding lookup of a
 * position-id leaf (the position is a run-time value, see sl_kv_graph_set_pos), each layer's K/V appended
 * to the cache and attention over the cached prefix. */
static sl_tensor *gpt2_body(sl_model *m, sl_tensor *ids, sl_kv_cache *kv, int pos0, sl_tensor *positions) {
    sl_ctx *ctx = m->ctx;
    const sl_gpt2_config *c = &m->cfg;
    int64_t B = ids->ne[0], T = ids->ne[1], C = c->n_embd, NH = c->n_head, hs = C / NH;
    SL_ASSERT(ids->ndim == 2 && T <= c->max_seq_len);
    sl_tensor *wte = P(m, 0), *wpe = P(m, 1);
    /* x = wte[ids] + wpe[positions]                             (B, T, C) */
    sl_tensor *pos = kv ? sl_embedding(ctx, wpe, positions)
                        : sl_view(ctx, wpe, 2, (int64_t[]){T, C}, (int64_t[]){C, 1}, 0);
    sl_tensor *x = sl_add(ctx, sl_embedding(ctx, wte, ids), pos);
    if (!kv) x = sl_model_hidden_dropout(m, x, sl_model_dropout_site(-1, 0)); /* nanoGPT's transformer.drop */
    if (!kv) x->flags |= SL_FLAG_LAYER_IO; /* Note [Full recomputation] (src/graph/autodiff.c) */
    for (int l = 0; l < c->n_layer; l++) {
        int o = 2 + 12 * l;
        /* attention block */
        sl_tensor *h = sl_layernorm(ctx, x, P(m, o + 0), P(m, o + 1), 1e-5f);
        sl_tensor *qkv = mm(m, h, P(m, o + 2), P(m, o + 3)); /* (B, T, 3C) */
        sl_tensor *r = sl_reshape(ctx, qkv, 5, (int64_t[]){B, T, 3, NH, hs});
        int64_t nb4[4] = {r->nb[0], r->nb[1], r->nb[3], 1};
        sl_tensor *q = sl_view(ctx, r, 4, (int64_t[]){B, T, NH, hs}, nb4, 0); /* (B, T, NH, hs) */
        sl_tensor *k = sl_view(ctx, r, 4, (int64_t[]){B, T, NH, hs}, nb4, r->nb[2]);
        sl_tensor *v = sl_view(ctx, r, 4, (int64_t[]){B, T, NH, hs}, nb4, 2 * r->nb[2]);
        sl_tensor *a;
        if (kv) {
            sl_tensor *ks = sl_kv_store(ctx, kv->k[l], k, pos0), *vs = sl_kv_store(ctx, kv->v[l], v, pos0);
            a = sl_attention_kv(ctx, q, ks, vs, pos0, 0); /* (B, T, C) */
        } else {
            a = sl_attention(ctx, q, k, v); /* (B, T, C) */
            if (m->compute_dtype != SL_F32) /* Note [Eager half attention numerics] */
                a->iparams[2] = m->compute_dtype == SL_F16 ? 2 : 1;
            sl_model_attention_dropout(m, a, l); /* attn.attn_dropout */
        }
        sl_tensor *ao = mm(m, a, P(m, o + 4), P(m, o + 5));
        x = kv ? sl_add(ctx, x, ao)
               : sl_model_hidden_dropout_add(m, x, ao,
                                             sl_model_dropout_site(l, SL_DROP_ATTN_OUT)); /* resid_dropout */
        /* MLP block */
        h = sl_layernorm(ctx, x, P(m, o + 6), P(m, o + 7), 1e-5f);
        sl_tensor *f = sl_gelu(ctx, mm(m, h, P(m, o + 8), P(m, o + 9))); /* (B, T, 4C) */
        f = mm(m, f, P(m, o + 10), P(m, o + 11));
        x = kv ? sl_add(ctx, x, f)
               : sl_model_hidden_dropout_add(m, x, f,
                                             sl_model_dropout_site(l, SL_DROP_MLP_OUT)); /* mlp.dropout */
        if (!kv) x->flags |= SL_FLAG_LAYER_IO;
    }
    int of = 2 + 12 * c->n_layer;
    if (kv && kv->last_only && T > 1) x = sl_cont(ctx, sl_slice(ctx, x, 1, T - 1, 1)); /* (B, 1, C) */
    x = sl_layernorm(ctx, x, P(m, of), P(m, of + 1), 1e-5f);
    sl_tensor *logits = mm(m, x, wte, NULL); /* (B, T, V), or (B, 1, V) */
    return sl_set_name(logits, "logits");
}

/* Megatron's f and g (Note [Tensor-parallel graphs], src/ops/build_tp.c): entering a TP region (before
 * a column-parallel linear) and leaving it (after a row-parallel one); with sequence parallelism an
 * all-gather and a reduce-scatter along the sequence. Identities without TP. */
static sl_tensor *tp_g(sl_model *m, sl_tensor *x) { return sl_tp_exit(m->ctx, x, m->tp, m->sp); }
static sl_tensor *tp_rep(sl_model *m, sl_tensor *p) { return sl_tp_rep(m->ctx, p, m->tp, m->sp); }
/* a row-parallel linear: partial products summed by g, then the replicated bias; the dense linear without TP
 */
static sl_tensor *row_linear(sl_model *m, sl_tensor *x, sl_tensor *w, sl_tensor *b) {
    if (m->tp <= 1) return mm(m, x, w, b);
    sl_dtype cd = m->compute_dtype;
    if (cd != SL_F16) return sl_bias(m->ctx, tp_g(m, mm(m, x, w, NULL)), tp_rep(m, b));
    /* Note [Half sums across TP ranks] */
    sl_tensor *s = sl_round_half(m->ctx, tp_g(m, mm(m, x, w, NULL)), cd);
    return sl_round_half(m->ctx, sl_bias(m->ctx, s, tp_rep(m, sl_round_half(m->ctx, b, cd))), cd);
}
/* Note [Half sums across TP ranks]
 * Under fp16 a TP collective sums fp16 tensors, as Megatron's all-reduce of fp16 activations and gradients
 * does: the sum of the ranks' rounded partial products is rounded again, so a sum past 65504 is inf, as the
 * single process's full product is, and dynamic loss scaling skips the steps the single process skips
 * (without it tp 2 missed the overflow of the first steps; test_fp16_cli). Forward: the row-parallel output
 * after g; backward: the column-parallel input's gradient after f's all-reduce (the rounding node sits
 * before f, so its backward rounds the summed gradient; its forward rounding is the one the GEMM's operand
 * cast makes anyway); and the replicated bias is rounded before its (COPY, ALLREDUCE) wrapper, so under SP
 * its gradient summed over the sequence shards is rounded as the single process's full sum is. Not under
 * bf16: its range is f32's (nothing to detect), and rounding the sum again only moves TP further from the
 * single process (test_tp's bf16 deviation 0.84 -> 1.20 of the bf16 gap). */
static sl_tensor *col_input(sl_model *m, sl_tensor *h) {
    if (m->tp > 1 && m->compute_dtype == SL_F16) h = sl_round_half(m->ctx, h, SL_F16);
    return sl_tp_enter(m->ctx, h, m->tp, m->sp);
}

/* Where a stage model's parameters sit in m->params (sl_gpt2_new_par registers them in this order):
 * [wte, wpe] on the first stage, 12 per layer of the stage, [ln_f.weight, ln_f.bias] on the last, then the
 * last stage's copy of the tied wte when it is not also the first. */
static int chunk_layers(const sl_model *m) { return m->n_layers / (m->vpp > 1 ? m->vpp : 1); }
static int chunk_first(const sl_model *m, int c) {
    return m->layer0 + c * (m->pp > 1 ? m->pp : 1) * chunk_layers(m);
}
static int idx_layer(const sl_model *m, int l) { /* chunk c's layers follow c * pp * Lc after layer0 */
    int Lc = chunk_layers(m), span = (m->pp > 1 ? m->pp : 1) * Lc, c = (l - m->layer0) / span;
    return (m->pp_rank == 0 ? 2 : 0) + 12 * (c * Lc + (l - m->layer0) % span);
}
static int idx_lnf(const sl_model *m) { return (m->pp_rank == 0 ? 2 : 0) + 12 * m->n_layers; }
static int idx_head(const sl_model *m) { return m->pp_rank == 0 ? 0 : idx_lnf(m) + 2; }

/* The forward pass of one rank of a split model (tensor and/or pipeline parallel; training and evaluation).
 * TP: each rank holds NH/tp heads, 4C/tp MLP units and a contiguous range of the vocabulary (with m->sp,
 * also T/tp tokens of the residual stream). Column-parallel c_attn and c_fc take f(h); row-parallel c_proj
 * outputs are summed by g before their (replicated) bias; the embedding is a vocab-shard lookup summed by
 * g; the tied LM head gives this rank's vocabulary columns, and the loss is the vocab-parallel
 * cross-entropy. PP: the stage runs its layers only; the first stage starts from the ids, the others from
 * x_in (B, T or T/tp under SP, C); the last stage ends in the loss, the others return their activations.
 * *logits_out: this rank's logits shard (B, T, V/tp) on the last stage. */
static sl_tensor *gpt2_par_body(sl_model *m, int chunk, sl_tensor *ids, sl_tensor *x_in, sl_tensor *targets,
                                sl_tensor **logits_out) {
    sl_ctx *ctx = m->ctx;
    const sl_gpt2_config *c = &m->cfg;
    int v = m->vpp > 1 ? m->vpp : 1;
    int tp = m->tp > 1 ? m->tp : 1, first = m->pp_rank == 0 && chunk == 0,
        last = m->pp_rank == (m->pp > 1 ? m->pp : 1) - 1 && chunk == v - 1;
    SL_ASSERT(chunk >= 0 && chunk < v);
    int64_t B = ids->ne[0], T = ids->ne[1], C = c->n_embd, NHl = c->n_head / tp, hs = C / c->n_head;
    SL_ASSERT(ids->ndim == 2 && T <= c->max_seq_len && (!m->sp || T % tp == 0));
    int64_t vlo, vlen, Tl = m->sp ? T / tp : T; /* under SP: this rank's tokens of the residual stream */
    sl_tp_part(c->vocab_size, tp, m->tp_rank, &vlo, &vlen);
    sl_tensor *x = x_in;
    if (first) {
        SL_ASSERT(!x_in);
        sl_tensor *wte = P(m, 0), *wpe = tp_rep(m, P(m, 1));
        int64_t t0 = m->sp ? Tl * m->tp_rank : 0;
        sl_tensor *pos = sl_view(ctx, wpe, 2, (int64_t[]){Tl, C}, (int64_t[]){C, 1}, t0 * C);
        sl_tensor *e = tp > 1 ? tp_g(m, sl_embedding_shard(ctx, wte, ids, vlo)) : sl_embedding(ctx, wte, ids);
        x = sl_add(ctx, e, pos);
        x = sl_model_hidden_dropout(m, x, sl_model_dropout_site(-1, 0)); /* transformer.drop */
    }
    SL_ASSERT(x && x->ne[1] == Tl);
    x->flags |= SL_FLAG_LAYER_IO; /* Note [Full recomputation] (src/graph/autodiff.c); a stage's input too */
#define R(i) tp_rep(m, P(m, i))
    for (int l = chunk_first(m, chunk); l < chunk_first(m, chunk) + chunk_layers(m); l++) {
        int o = idx_layer(m, l);
        sl_tensor *h = col_input(m, sl_layernorm(ctx, x, R(o + 0), R(o + 1), 1e-5f));
        sl_tensor *qkv = mm(m, h, P(m, o + 2), P(m, o + 3)); /* (B, T, 3 C/tp) */
        sl_tensor *r = sl_reshape(ctx, qkv, 5, (int64_t[]){B, T, 3, NHl, hs});
        int64_t nb4[4] = {r->nb[0], r->nb[1], r->nb[3], 1};
        sl_tensor *q = sl_view(ctx, r, 4, (int64_t[]){B, T, NHl, hs}, nb4, 0);
        sl_tensor *k = sl_view(ctx, r, 4, (int64_t[]){B, T, NHl, hs}, nb4, r->nb[2]);
        sl_tensor *v = sl_view(ctx, r, 4, (int64_t[]){B, T, NHl, hs}, nb4, 2 * r->nb[2]);
        sl_tensor *a = sl_attention(ctx, q, k, v); /* (B, T, C/tp) */
        if (m->compute_dtype != SL_F32) /* as the single process: Note [Eager half attention numerics] */
            a->iparams[2] = m->compute_dtype == SL_F16 ? 2 : 1;
        /* dropout as the single process, same sites and counters (Note [Dropout from counters]): under PP
         * a stage's tensors are the full micro-batch's; under TP the heads and the sequence shards draw at
         * their places in the full tensors */
        sl_model_attention_dropout(m, a, l);
        sl_tensor *ao = row_linear(m, a, P(m, o + 4), P(m, o + 5));
        x = sl_model_hidden_dropout_add(m, x, ao, sl_model_dropout_site(l, SL_DROP_ATTN_OUT));
        h = col_input(m, sl_layernorm(ctx, x, R(o + 6), R(o + 7), 1e-5f));
        sl_tensor *f = sl_gelu(ctx, mm(m, h, P(m, o + 8), P(m, o + 9))); /* (B, T, 4C/tp) */
        f = row_linear(m, f, P(m, o + 10), P(m, o + 11));
        x = sl_model_hidden_dropout_add(m, x, f, sl_model_dropout_site(l, SL_DROP_MLP_OUT));
        x->flags |= SL_FLAG_LAYER_IO;
    }
    if (!last) return sl_set_name(x, "stage_out");
    int of = idx_lnf(m);
    x = col_input(m, sl_layernorm(ctx, x, R(of), R(of + 1), 1e-5f));
#undef R
    sl_tensor *logits = sl_set_name(mm(m, x, P(m, idx_head(m)), NULL), "logits"); /* (B, T, V/tp) */
    if (logits_out) *logits_out = logits;
    if (!targets) return NULL;
    sl_tensor *loss =
        tp > 1 ? sl_cross_entropy_vp(ctx, logits, targets, vlo, tp) : sl_cross_entropy(ctx, logits, targets);
    return sl_set_name(loss, "loss");
}

sl_tensor *sl_gpt2_build_stage(sl_model *m, int chunk, sl_tensor *ids, sl_tensor *x_in, sl_tensor *targets,
                               sl_tensor **logits_out) {
    return gpt2_par_body(m, chunk, ids, x_in, targets, logits_out);
}

sl_tensor *sl_gpt2_build(sl_model *m, sl_tensor *ids, sl_tensor *targets, sl_tensor **logits_out) {
    SL_ASSERT(m->pp <= 1 && "a pipeline stage is built with sl_model_build_stage");
    if (m->tp > 1) return gpt2_par_body(m, 0, ids, NULL, targets, logits_out);
    sl_tensor *logits = gpt2_body(m, ids, NULL, 0, NULL);
    if (logits_out) *logits_out = logits;
    if (!targets) return NULL;
    sl_tensor *loss = sl_cross_entropy(m->ctx, logits, targets);
    sl_set_name(loss, "loss");
    return loss;
}

sl_tensor *sl_gpt2_build_kv(sl_model *m, sl_tensor *ids, sl_kv_cache *kv, int pos0) {
    SL_ASSERT(m->tp <= 1 && "generation runs on a whole model (gather the TP shards first)");
    int64_t T = ids->ne[1];
    SL_ASSERT(kv->pos_used + T <= kv->pos_cap);
    sl_tensor *positions = sl_set_name(sl_new_tensor(m->ctx, SL_I32, 1, (int64_t[]){T}), "kv_positions");
    sl_set_input(positions);
    sl_tensor_bind_buffer(positions, kv->pos, sizeof(int32_t) * (size_t)kv->pos_used);
    kv->pos_used += (int)T;
    for (int64_t t0 = 0; t0 < T; t0 += 64) { /* position ids into device memory */
        int32_t pos[64];
        int64_t c = T - t0 < 64 ? T - t0 : 64;
        for (int64_t t = 0; t < c; t++) pos[t] = (int32_t)(pos0 + t0 + t);
        sl_status st = sl_backend_copy_in(kv->pos, positions->buffer_offs + sizeof(int32_t) * (size_t)t0, pos,
                                          sizeof(int32_t) * (size_t)c);
        SL_ASSERT(st == SL_OK); /* in range by construction */
    }
    return gpt2_body(m, ids, kv, pos0, positions);
}

double sl_gpt2_head_layers(const sl_gpt2_config *c, int T) {
    return (double)c->vocab_size / (12.0 * c->n_embd + T);
}

double sl_gpt2_flops_per_token(const sl_gpt2_config *c, int T) {
    double C = c->n_embd, L = c->n_layer, V = c->vocab_size;
    double n_matmul = L * 12.0 * C * C + V * C;              /* weights that take part in matmuls */
    double attn = L * 2.0 * 2.0 * (double)T * C / 2.0 * 3.0; /* causal QK^T and PV, fwd+bwd ~3x */
    return 6.0 * n_matmul + attn;
}
