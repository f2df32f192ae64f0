/* Trainable mixture-of-experts layers of the Llama family: Mixtral (f32 training), Qwen2-MoE and a
 * DeepSeek-V3-style block, built from the MoE ops (src/ops/moe_ops.c, Note [MoE dispatch in a static
 * graph]); their parameters (transformers' per-expert names, the layout of checkpoints on the Hub); the
 * router losses added to the language-model loss; and the statistics read back after a step.
 *
 * Per sparse layer (h (B, T, C) -> N = B*T rows; E experts of width I; k per token):
 *   logits = h Wr^T (N, E) ; w = route(logits [+ DeepSeek's e_score_correction_bias for the choice])
 *   y = sum_e combine(SwiGLU_e(gather(h, w, e)), w, e)                   (R rows per expert)
 *   + shared expert(s): Qwen2-MoE sigmoid(h Wsg^T) * SwiGLU_s(h); DeepSeek-V3 SwiGLU_s(h)
 * Routers: Mixtral softmax over the top-k logits; Qwen2-MoE top-k of the softmax (renormalised when
 * norm_topk_prob); DeepSeek-V3 sigmoid scores, top-k among the topk_group best of n_group groups of
 * score + bias, renormalised, times routed_scaling_factor. DeepSeek-V3's attention here is Llama's (GQA
 * with rotate-half RoPE), not multi-head latent attention: configs with kv_lora_rank are refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/llama_internal.h"

/* Note [MoE under TP]
 * Under tensor parallelism the experts, the router and the shared experts are not split: every TP rank holds
 * them whole. Without sequence parallelism the layer input is replicated, so each TP rank routes and runs
 * the same tokens (redundant compute, full gradients on every rank: no collective, and the TP norm counts
 * them once as replicated parameters). With sequence parallelism each TP rank runs its own T / tp tokens
 * through the experts, which halves nothing in memory but splits the expert FLOPs; the weights then take
 * partial gradients on each rank and enter the graph through sl_tp_rep (COPY forward, ALL-REDUCE of the
 * gradient), as the other replicated parameters SP applies to sequence shards. A capacity under SP is the
 * whole batch's, applied in its token order (Note [Capacity under sequence parallelism]), and the step's
 * statistics and DeepSeek-V3's bias update sum the loads over the TP group too (train_moe.c).
 * With expert tensor parallelism (below) the experts are split instead.
 *
 * Note [Capacity under sequence parallelism]
 * One process keeps, per expert, the first capacity = ceil(f N k / E) tokens routed to it in the order of
 * the N = B T rows (b-major; a token is routed to an expert at most once, so the order of its k choices does
 * not matter): a token is kept iff its position among the tokens routed to that expert is below capacity.
 * Under SP with whole experts, TP rank r holds tokens (b, t) for t in [r T / tp, (r + 1) T / tp) of every
 * batch row b, so the tokens routed to e before its token (b, t) are those of rows b' < b on every rank,
 * those of row b on ranks r' < r, then its own earlier ones. Each rank routes its shard once without a
 * capacity (MOE_ROUTE marked loss-only: no expert reads it, statistics skip it), counts the selections per
 * (batch row, expert) (MOE_EP_COUNTS by rows, B x E floats), and the TP group all-gathers the counts
 * (COLLECTIVE ALLGATHER: no gradient, run by the TP provider, staged on backends without host memory); the
 * layer's route then applies the capacity of all B T tokens with those offsets (sl_moe_route_shard), so it
 * drops exactly the assignments the single process drops. Routing twice costs N E per rank; the
 * all-gather moves tp B E floats. The kept rows per rank stay <= the capacity and <= its N, so an expert's
 * buffers hold min(capacity, N) rows. The statistics (routed and dropped counts) are summed over the TP
 * group after the step (train_moe.c), which gives the single process's moe_dropped_frac.
 *
 * Note [Expert tensor parallelism]
 * Megatron's --expert-tensor-parallel-size = tp: each routed expert's intermediate dimension I is split over
 * the TP group as a dense MLP's is (gate/up column-parallel, down row-parallel; full-tensor coordinates in
 * checkpoints, so they reshard to any layout), the router and the shared experts stay whole on every rank.
 * Without SP the input is replicated, so every TP rank routes the same tokens to the same experts, runs its
 * I / tp slice of each on them, and the combined output is a partial sum:
 *   logits = h Wr^T              (replicated)
 *   w      = route(f(logits))     f: identity forward, all-reduce of the gradient
 *   y      = g(sum_e combine(FFN_e^(r)(gather(f(h), w, e)), w, e))      g: all-reduce forward
 * The combine's gradient to the routing weights, <dy, y_e^(r)>, is partial on each rank (its y_e is), and so
 * is everything the route's backward makes of it, so the route reads the logits through f: their gradient
 * is summed over TP and the router, the router losses (which read the logits directly, whole on each rank)
 * and h's router path see the single process's values. The experts' gradient to h is partial too and
 * arrives through f(h). Cost per layer: one all-reduce of (N, C) forward, and of (N, C) + (N, E) backward;
 * the expert FLOPs and expert memory per rank fall by tp. With SP (Megatron's layout for MoE under TP) the
 * layer input is this rank's sequence shard: the router runs on the shard (its weight through sl_tp_rep),
 * the logits and the tokens are all-gathered along the sequence (backward: reduce-scatter, which sums the
 * partial gradients and keeps this rank's tokens), every rank routes all B T tokens as the single process
 * does (capacity included), and the experts' partial sums are reduce-scattered back to the shards; the
 * shared experts run on the shard. The router losses are computed on the gathered logits, the whole value
 * on every rank; the reduce-scatter of their gradient would count it tp times, so each rank's router-loss
 * node passes on 1 / tp of it (fparams[2]). With EP the EP group is the ranks of one TP index (the mesh's
 * ep_color): the TP ranks of a group route the same tokens, so the peers of each TP index dispatch the same
 * rows and counts and each runs its I / tp slice of its own experts on them; the combined rows come back
 * partial and g (or the reduce-scatter) sums them as above. */
static sl_tensor *moe_W(sl_model *m, sl_tensor *w) { return sl_tp_rep(m->ctx, w, m->tp, m->sp); }

int sl_arch_is_moe(sl_arch a) {
    return a == SL_ARCH_MIXTRAL || a == SL_ARCH_QWEN2_MOE || a == SL_ARCH_DEEPSEEK_V3;
}
int sl_model_is_moe(const sl_model *m) { return sl_arch_is_moe(m->arch); }

/* whether the model's backend runs the MoE ops (cpu, strict and opencl do; a backend that does not gets
 * Mixtral's dense-gate form, and Qwen2-MoE / DeepSeek-V3 graphs are refused by the executor naming the op) */
int sl_moe_backend_ok(const sl_model *m) {
    sl_tensor x = {.dtype = SL_F32, .ndim = 2, .ne = {1, 2}, .nb = {2, 1}};
    sl_tensor probe = x;
    probe.op = SL_OP_MOE_ROUTE;
    probe.src[0] = &x;
    return m->backend && m->backend->supports_op && m->backend->supports_op(m->backend, &probe);
}

int sl_moe_layer_is_sparse(const sl_llama_config *c, int l) {
    return sl_arch_is_moe(c->arch) && !(c->arch == SL_ARCH_DEEPSEEK_V3 && l < c->first_dense);
}

static const char *experts_field(sl_arch a) {
    return a == SL_ARCH_MIXTRAL     ? "num_local_experts"
           : a == SL_ARCH_QWEN2_MOE ? "num_experts"
                                    : "n_routed_experts";
}

sl_status sl_moe_check_cfg(const sl_llama_config *c) {
    const char *ef = experts_field(c->arch);
    if (c->n_experts < 1 || c->n_experts > SL_MOE_MAX_EXPERTS)
        return sl_fail(SL_ERR_INVALID, "config: %s must be in [1, %d], got %d", ef, SL_MOE_MAX_EXPERTS,
                       c->n_experts);
    if (c->n_experts_per_tok < 1 || c->n_experts_per_tok > c->n_experts)
        return sl_fail(SL_ERR_INVALID, "config: num_experts_per_tok must be in [1, %s=%d], got %d", ef,
                       c->n_experts, c->n_experts_per_tok);
    if (c->arch == SL_ARCH_MIXTRAL) return SL_OK;
    if (c->moe_intermediate < 1 || c->moe_intermediate > (1 << 20))
        return sl_fail(SL_ERR_INVALID, "config: moe_intermediate_size must be in [1, %d], got %d", 1 << 20,
                       c->moe_intermediate);
    if (c->shared_intermediate < 0 || c->shared_intermediate > (1 << 22))
        return sl_fail(SL_ERR_INVALID, "config: shared expert width must be in [0, %d], got %d", 1 << 22,
                       c->shared_intermediate);
    if (c->arch == SL_ARCH_QWEN2_MOE) return SL_OK;
    int ng = c->n_group > 1 ? c->n_group : 1;
    if (c->n_group < 0 || c->n_experts % ng)
        return sl_fail(SL_ERR_INVALID, "config: n_group %d must divide n_routed_experts %d", c->n_group,
                       c->n_experts);
    if (ng > 1 && (c->topk_group < 1 || c->topk_group > ng || c->n_experts / ng < 2))
        return sl_fail(SL_ERR_INVALID,
                       "config: topk_group must be in [1, n_group=%d] with >= 2 experts per "
                       "group, got %d",
                       ng, c->topk_group);
    if (ng > 1 && c->n_experts_per_tok > c->topk_group * (c->n_experts / ng))
        return sl_fail(SL_ERR_INVALID,
                       "config: num_experts_per_tok %d exceeds the %d experts of topk_group "
                       "groups",
                       c->n_experts_per_tok, c->topk_group * (c->n_experts / ng));
    if (!(c->routed_scaling >= 0 && c->routed_scaling < 1e6))
        return sl_fail(SL_ERR_INVALID, "config: routed_scaling_factor must be >= 0, got %g",
                       (double)c->routed_scaling);
    if (c->first_dense < 0 || c->first_dense > c->n_layer)
        return sl_fail(SL_ERR_INVALID,
                       "config: first_k_dense_replace must be in [0, num_hidden_layers=%d], "
                       "got %d",
                       c->n_layer, c->first_dense);
    return SL_OK;
}

/* transformers' names of one layer's MoE tensors */
typedef struct {
    const char *router, *expert; /* printf: (layer), (layer, expert, projection) */
    const char *proj[3];         /* gate, up, down */
    const char *shared;          /* (layer, projection) or NULL */
} moe_names;

static moe_names names_of(sl_arch a) {
    if (a == SL_ARCH_MIXTRAL)
        return (moe_names){"model.layers.%d.block_sparse_moe.gate.weight",
                           "model.layers.%d.block_sparse_moe.experts.%d.%s.weight",
                           {"w1", "w3", "w2"},
                           NULL};
    return (moe_names){"model.layers.%d.mlp.gate.weight",
                       "model.layers.%d.mlp.experts.%d.%s.weight",
                       {"gate_proj", "up_proj", "down_proj"},
                       a == SL_ARCH_QWEN2_MOE ? "model.layers.%d.mlp.shared_expert.%s.weight"
                                              : "model.layers.%d.mlp.shared_experts.%s.weight"};
}

void sl_moe_add_params(sl_llama_builder *b, int l) {
    const sl_llama_config *c = &b->m->lcfg;
    int64_t C = c->hidden, E = c->n_experts, S = c->shared_intermediate;
    int64_t I =
        c->arch == SL_ARCH_MIXTRAL ? c->intermediate : c->moe_intermediate; /* Mixtral: no moe_ field */
    moe_names nm = names_of(c->arch);
    /* Note [DeepSeek-V3's fp32 router]
     * transformers keeps DeepSeek-V3's router weight and e_score_correction_bias fp32 in a bf16 model
     * (DeepseekV3PreTrainedModel._keep_in_fp32_modules_strict) and computes the logits from the bf16 hidden
     * states cast to fp32 (DeepseekV3TopkRouter.forward): an fp32 linear, fp32 sigmoid scores and routing
     * weights. A bf16 model here keeps both f32 (sl_param_info.keep_f32: not rounded at load, nor by a bf16
     * conversion); sl_llama_lin multiplies an f32 weight in f32. */
    b->f32 = c->arch == SL_ARCH_DEEPSEEK_V3;
    sl_llama_add_param(b, 1, SL_INIT_NORMAL, 2, (int64_t[]){E, C}, nm.router, l);
    b->f32 = c->arch == SL_ARCH_DEEPSEEK_V3;
    if (c->arch == SL_ARCH_DEEPSEEK_V3) /* a buffer in transformers: no gradient, moved by the bias update */
        sl_llama_add_param(b, 0, SL_INIT_ZERO, 1, (int64_t[]){E},
                           "model.layers.%d.mlp.gate.e_score_correction_bias", l);
    int64_t El = E / b->m->ep, e0 = El * b->m->ep_rank; /* this EP rank's experts */
    for (int64_t e = e0; e < e0 + El; e++) {
        for (int j = 0; j < 3; j++) {
            int64_t ne[2] = {j < 2 ? I : C, j < 2 ? C : I};
            if (b->m->etp) b->tdim = j < 2 ? 0 : 1; /* Note [Expert tensor parallelism]: I split over TP */
            sl_llama_add_param(b, 1, SL_INIT_NORMAL, 2, ne, nm.expert, l, (int)e, nm.proj[j]);
            b->m->params[b->m->n_params - 1].expert = b->m->ep > 1;
        }
    }
    if (S > 0) {
        sl_llama_add_param(b, 1, SL_INIT_NORMAL, 2, (int64_t[]){S, C}, nm.shared, l, "gate_proj");
        sl_llama_add_param(b, 1, SL_INIT_NORMAL, 2, (int64_t[]){S, C}, nm.shared, l, "up_proj");
        sl_llama_add_param(b, 1, SL_INIT_NORMAL, 2, (int64_t[]){C, S}, nm.shared, l, "down_proj");
        if (c->arch == SL_ARCH_QWEN2_MOE)
            sl_llama_add_param(b, 1, SL_INIT_NORMAL, 2, (int64_t[]){1, C},
                               "model.layers.%d.mlp.shared_expert_gate.weight", l);
    }
}

/* SUANLI_MOE_PACKED=0: the per-expert buffers of Note [MoE dispatch in a static graph] instead of the
 * packed chain (A/B of Note [Packed experts]) */
static int packed_experts(void) {
    const char *s = getenv("SUANLI_MOE_PACKED");
    return !(s && !strcmp(s, "0"));
}

/* Note [Experts under autocast]
 * transformers 5 runs the routed experts of Mixtral, Qwen2-MoE and DeepSeek-V3 through grouped_mm
 * (integrations/moe.py), which is not on autocast's cast list: the fp32 norm output is cast to the weights'
 * dtype (fp32) and the experts compute in fp32 under torch.autocast; only the router's and the shared
 * expert's linears round. So autocast's routed experts here are the fp32 ones (the routed kernels, packed
 * or not); the step-0 forward of the fixtures is bitwise torch.autocast's (tests/hf/test_hf_models.c).
 * SUANLI_MOE_HALF_EXPERTS=1 keeps half experts instead (rounded as matmul nodes under autocast, as
 * transformers' eager experts and Megatron's bf16 experts; not the fixtures' default numerics, and at the
 * widths measured not faster: docs/BENCHMARKS.md). */
sl_dtype sl_moe_experts_half(const sl_model *m) {
    const char *s = getenv("SUANLI_MOE_HALF_EXPERTS");
    return m->wdtype == SL_F32 && s && !strcmp(s, "1") ? sl_llama_autocast(m) : SL_F32;
}

static sl_moe_route_opts route_opts(const sl_model *m, int64_t N) {
    const sl_llama_config *c = &m->lcfg;
    sl_moe_route_opts o = {.k = c->n_experts_per_tok, .scale = 1.0f};
    if (c->arch == SL_ARCH_MIXTRAL) {
        o.score = SL_MOE_SCORE_SOFTMAX, o.norm_topk = 1;
    } else if (c->arch == SL_ARCH_QWEN2_MOE) {
        o.score = SL_MOE_SCORE_SOFTMAX, o.norm_topk = c->norm_topk_prob;
    } else {
        o.score = SL_MOE_SCORE_SIGMOID, o.norm_topk = c->norm_topk_prob;
        o.n_group = c->n_group, o.topk_group = c->topk_group;
        o.scale = c->routed_scaling > 0 ? c->routed_scaling : 1.0f;
    }
    switch (m->moe.router) {
    case SL_MOE_ROUTER_TOPK_SOFTMAX:
        o.score = SL_MOE_SCORE_SOFTMAX, o.norm_topk = 1;
        break;
    case SL_MOE_ROUTER_SOFTMAX_TOPK:
        o.score = SL_MOE_SCORE_SOFTMAX, o.norm_topk = 0;
        break;
    case SL_MOE_ROUTER_SIGMOID:
        o.score = SL_MOE_SCORE_SIGMOID, o.norm_topk = 1;
        break;
    default:
        break;
    }
    o.capacity = (int)sl_moe_capacity(m, N);
    return o;
}

/* Note [DeepSeek-V3's router under autocast]
 * DeepseekV3TopkRouter.forward casts to fp32 and calls F.linear, which torch.autocast runs in the half
 * dtype: the logits are half, and so is everything computed from them. The sigmoid scores are rounded. The
 * choice adds the fp32 e_score_correction_bias, which makes it fp32. The selected scores' sum (+ 1e-20),
 * the division by it and the product with routed_scaling_factor are half ops, each rounded. The backward is
 * torch's autograd through those half tensors. A route marked SL_MOE_ROUTE_HALF_OPS computes exactly that
 * (src/device/cpu/kernels/moe.c). The routed experts are fp32 under autocast (Note [Experts under
 * autocast]); the products of their outputs with the half weights, and the sum over k, are fp32. A bf16
 * model keeps this router fp32 instead (Note [DeepSeek-V3's fp32 router]). Measured on the fixture's step 0
 * (tests/hf/test_hf_models.c). Every route of a layer carries the flag, since the rounded scores make the
 * choice. */
static int route_half_ops(const sl_model *m, const sl_moe_route_opts *o) {
    sl_dtype ac = sl_llama_autocast(m); /* f32 for a bf16 model */
    if (m->lcfg.arch != SL_ARCH_DEEPSEEK_V3 || o->score != SL_MOE_SCORE_SIGMOID || ac == SL_F32) return 0;
    return (ac == SL_BF16 ? 1 : 2) | SL_MOE_ROUTE_HALF_OPS;
}

int64_t sl_moe_capacity(const sl_model *m, int64_t N) {
    const sl_llama_config *c = &m->lcfg;
    if (!(m->moe.capacity_factor > 0) || c->n_experts < 1)
        return 0; /* Note [MoE dispatch in a static graph] */
    double cap = ceil((double)m->moe.capacity_factor * (double)N * c->n_experts_per_tok / c->n_experts);
    return cap >= (double)N ? 0 : (int64_t)cap; /* >= N: nothing can be dropped */
}

/* The rows a step receives are a data-dependent prefix of the worst case (Note [Reserved rows]): the
 * received rows, their regrouping and the experts' chain are reserved, and so are their gradients, except
 * the received rows' (sent back by the backward all-to-all: it stays in the arena, which is the EP window,
 * for the peers to read in place). The combine's input is sent for the same reason: in the arena, but
 * its gradient, received, is reserved. */
static sl_tensor *reserved(sl_tensor *t, int self, int grad) {
    t->flags |= (self ? SL_FLAG_ROWS_CAP : 0) | (grad ? SL_FLAG_ROWS_CAP_GRAD : 0);
    return t;
}

/* Note [Expert-parallel dispatch] (src/ops/moe_ep_ops.c): h2 (N, C) -> the routed experts' sum (N, C), the
 * experts living on the ranks of the EP group */
static sl_tensor *ep_experts(sl_model *m, sl_tensor *h2, sl_tensor *w, int l, const sl_moe_route_opts *o,
                             int routed, int etp, sl_dtype half) {
    sl_ctx *ctx = m->ctx;
    const sl_llama_config *c = &m->lcfg;
    int P = m->ep, E = c->n_experts, El = E / P;
    int64_t N = h2->ne[0], k = o->k, S = N * k, Rx = P * (k < El ? S : N * El), Rl = P * N;
    moe_names nm = names_of(c->arch);
    sl_tensor *cnt = sl_moe_ep_counts(ctx, w);
    sl_tensor *rcnt = sl_moe_ep_exchange_counts(ctx, cnt, P);
    sl_set_name(rcnt, "moe_ep_counts.%d", l);
    sl_tensor *xs = sl_moe_ep_pack(ctx, h2, w, S, 0);
    sl_tensor *xr = sl_moe_ep_alltoallv(ctx, xs, cnt, rcnt, Rx, 0, P);
    sl_set_name(xr, "moe_ep_dispatch.%d", l);
    sl_tensor *yr = NULL;
    int packed = m->wdtype == SL_F32 && packed_experts();
    if (packed) { /* Note [Packed experts]: one chain over the regrouped rows */
        reserved(xr, 1, 0);
        sl_tensor *xg = reserved(sl_moe_ep_regroup(ctx, xr, rcnt, El, 0), 1, 1), *yg = NULL;
        for (int j = 0; j < El; j++) {
            int e = m->ep_rank * El + j;
            sl_tensor *w1 = sl_llama_W(m, nm.expert, l, e, nm.proj[0]),
                      *w3 = sl_llama_W(m, nm.expert, l, e, nm.proj[1]),
                      *w2 = sl_llama_W(m, nm.expert, l, e, nm.proj[2]);
            if (!etp) w1 = moe_W(m, w1), w3 = moe_W(m, w3), w2 = moe_W(m, w2);
            yg = reserved(sl_moe_packed_ffn(ctx, xg, w1, w3, w2, yg, j, El, Rl, half), 1, 1);
            if (half == SL_BF16 && sl_llama_bf16_gemm(m, w1)) /* as sl_llama_lin multiplies */
                sl_moe_packed_ffn_half_gemm(yg);
        }
        yr = reserved(sl_moe_ep_regroup(ctx, yg, rcnt, El, 1), 0, 1);
    }
    /* autocast: one source rank's rows at a time, R rows as the single process's expert (Note [EP weight
     * gradients per source rank], src/device/cpu/kernels/moe_packed.c) */
    int per_src = half != SL_F32;
    int64_t R = o->capacity > 0 && o->capacity < N ? o->capacity : N;
    for (int j = 0; j < El && !packed; j++) {
        int e = m->ep_rank * El + j;
        sl_tensor *w1 = sl_llama_W(m, nm.expert, l, e, nm.proj[0]),
                  *w3 = sl_llama_W(m, nm.expert, l, e, nm.proj[1]),
                  *w2 = sl_llama_W(m, nm.expert, l, e, nm.proj[2]);
        if (!etp) w1 = moe_W(m, w1), w3 = moe_W(m, w3), w2 = moe_W(m, w2); /* ETP: this rank's I slices */
        for (int p = 0; p < (per_src ? P : 1); p++) {
            sl_tensor *xl = sl_moe_ep_gather(ctx, xr, rcnt, j, El, per_src ? R : Rl);
            xl->iparams[2] = routed; /* the routed expert reads its received rows only; else zero-filled */
            xl->iparams[3] = per_src ? p + 1 : 0;
            /* autocast numerics: matmul nodes (their own weight casts) over source p's rows */
            sl_tensor *yl = routed ? sl_moe_expert_ffn_ep(ctx, xl, w1, w3, w2, rcnt, j, El)
                                   : sl_llama_swiglu(m, xl, w1, w3, w2);
            yr = sl_moe_ep_scatter(ctx, yl, rcnt, yr, j, El, Rx);
            yr->iparams[3] = xl->iparams[3];
        }
    }
    sl_tensor *ys = sl_moe_ep_alltoallv(ctx, yr, cnt, rcnt, S, 1, P);
    sl_set_name(ys, "moe_ep_combine.%d", l);
    return sl_moe_ep_unpack(ctx, ys, w, 1);
}

sl_tensor *sl_moe_ffn(sl_model *m, sl_tensor *h, int l) {
    sl_ctx *ctx = m->ctx;
    const sl_llama_config *c = &m->lcfg;
    int64_t B = h->ne[0], T = h->ne[1], C = h->ne[2], N = B * T, E = c->n_experts;
    moe_names nm = names_of(c->arch);
    sl_tensor *h2 =
        sl_reshape_2d(ctx, h->op == SL_OP_VIEW && !sl_is_contiguous(h) ? sl_cont(ctx, h) : h, N, C);
    sl_tensor *logits = sl_llama_lin(m, h2, moe_W(m, sl_llama_W(m, nm.router, l)), NULL); /* (N, E) */
    sl_tensor *bias = c->arch == SL_ARCH_DEEPSEEK_V3
                          ? sl_llama_W(m, "model.layers.%d.mlp.gate.e_score_correction_bias", l)
                          : NULL;
    int etp = m->etp && m->tp > 1;    /* Note [Expert tensor parallelism] */
    int esp = etp && m->sp;           /* ... with the tokens gathered over TP */
    int64_t Nr = esp ? N * m->tp : N; /* the tokens routed */
    /* whole experts under SP: each rank routes its shard, with the whole batch's capacity (Note [Capacity
     * under sequence parallelism]) */
    int csp = !etp && m->sp && m->tp > 1;
    sl_moe_route_opts o = route_opts(m, esp || csp ? N * m->tp : N);
    int64_t R = o.capacity > 0 && o.capacity < Nr ? o.capacity : Nr;
    /* f without a half rounding: the route reads f32 logits; under SP the shards' logits gathered */
    sl_tensor *lr = logits;
    if (esp)
        lr = sl_reshape_2d(ctx, sl_tp_enter(ctx, sl_reshape(ctx, logits, 3, (int64_t[]){B, T, E}), m->tp, 1),
                           Nr, E);
    else if (etp)
        lr = sl_tp_enter(ctx, logits, m->tp, 0);
    sl_tensor *prior = NULL; /* every shard's pre-capacity counts per batch row */
    if (csp && o.capacity > 0) {
        sl_moe_route_opts po = o;
        po.capacity = 0;
        sl_tensor *pre = sl_moe_route(ctx, lr, bias, &po);
        pre->iparams[SL_MOE_ROUTE_IP_HALF] = route_half_ops(m, &po); /* the same choice as w's */
        pre->iparams[SL_MOE_ROUTE_IP_LOSS_ONLY] = 1; /* not a layer's routing: no expert, no statistics */
        sl_set_name(pre, "moe_route_pre.%d", l);
        prior = sl_collective(ctx, sl_moe_route_block_counts(ctx, pre, B), SL_COLL_ALLGATHER, SL_COLL_NONE,
                              SL_GROUP_TP, m->tp); /* (tp B E) */
        sl_set_name(prior, "moe_capacity_counts.%d", l);
    }
    sl_tensor *w = sl_moe_route(ctx, lr, bias, &o); /* (Nr, E) */
    /* Note [Half routing weights]
     * Qwen2-MoE's router casts its weights to the logits' dtype (router_top_value.to(router_logits.dtype)):
     * bf16 in a bf16 model, the autocast dtype under autocast (its linear's output). The route rounds them,
     * and its backward rounds their gradient as that half tensor's gradient is. The shared expert's sigmoid
     * gate is a half op the same way, and its backward differentiates the rounded output (sigmoid_backward
     * reads the op's half output); the product with it is a half mul whose gradient to the (N, 1) gate
     * rounds each product before summing over C (SL_MUL_IP_HALF). Mixtral keeps fp32 weights;
     * DeepSeek-V3's are not checked against transformers here (its fixture config does not load there). */
    sl_dtype wh = m->wdtype == SL_BF16 ? SL_BF16 : sl_llama_autocast(m);
    if (c->arch == SL_ARCH_QWEN2_MOE && wh != SL_F32)
        w->iparams[SL_MOE_ROUTE_IP_HALF] = wh == SL_BF16 ? 1 : 2;
    w->iparams[SL_MOE_ROUTE_IP_HALF] |= route_half_ops(m, &o);
    if (prior) sl_moe_route_shard(w, prior, m->tp_rank, B);
    sl_set_name(w, "moe_route.%d", l);
    sl_set_output(w); /* read back after the step (sl_moe_graph_stats) */
    /* Note [Router losses under sequence parallelism]
     * With whole experts (etp = 1) under SP each TP rank routes only its sequence shard, but Switch's aux
     * loss couples the tokens (per-expert counts times summed probabilities over the whole batch) and the
     * z-loss is a mean over all of them. So the router losses read the shards' logits gathered over TP (the
     * SP all-gather, whose backward reduce-scatters) and a second routing of all of them (MOE_ROUTE marked
     * loss-only in iparams[6]: no experts read it, statistics and the bias update skip it; each token's
     * choice is the one its own rank made, as the choice is per token, and the losses read the counts
     * before any capacity drop). Every rank then holds the whole loss, as under expert tensor parallelism,
     * and passes 1 / tp of its gradient into the reduce-scatter, which sums the ranks' shares: the single
     * process's gradient. Megatron all-reduces the counts over the TP group and lets each rank's partial loss
     * carry its shard; the sum is the same loss. */
    int lsp = !etp && m->sp && m->tp > 1 && (m->moe.aux_coeff > 0 || m->moe.z_coeff > 0);
    sl_tensor *ll = esp ? lr : logits, *lw = w;
    if (lsp) {
        ll = sl_reshape_2d(ctx, sl_tp_enter(ctx, sl_reshape(ctx, logits, 3, (int64_t[]){B, T, E}), m->tp, 1),
                           N * m->tp, E);
        sl_moe_route_opts lo = route_opts(m, N * m->tp);
        lw = sl_moe_route(ctx, ll, bias, &lo);
        lw->iparams[SL_MOE_ROUTE_IP_HALF] = route_half_ops(m, &lo);
        lw->iparams[SL_MOE_ROUTE_IP_LOSS_ONLY] = 1;
        sl_set_name(lw, "moe_route_loss.%d", l);
    }
    sl_tensor *rl = sl_moe_router_loss(ctx, ll, lw, m->moe.aux_coeff, m->moe.z_coeff);
    /* under SP every TP rank holds the whole loss over all tokens, and the gathered logits' backward sums
     * the ranks' gradients: each rank contributes 1 / tp of it */
    if (esp || lsp) rl->fparams[2] = 1.0f / (float)m->tp;
    sl_set_name(rl, "moe_router_loss.%d", l);
    sl_set_output(rl);
    sl_tensor *y = NULL;
    /* f32: the expert's GEMMs run on its kept rows only (Note [Routed expert rows]); bf16 weights or
     * autocast numerics: matmul nodes on all R rows, rounded as transformers rounds. The packed experts
     * (f32 weights) run on the kept rows in both, rounding as those nodes do under autocast (Note [Packed
     * experts under autocast]) */
    sl_dtype half = sl_moe_experts_half(m); /* Note [Experts under autocast] */
    int routed = m->wdtype == SL_F32 && half == SL_F32;
    /* Note [bf16 MoE combine]
     * A transformers 5 bf16 model sums each token's weighted expert outputs as grouped_mm_experts_forward
     * does: the bf16 products y_k * w_k summed over k in fp32 and rounded once; Qwen2-MoE's router casts its
     * weights to the logits' dtype first (router_top_value.to(router_logits.dtype)), so there the weights
     * and each product are bf16 (the route rounds the weights, Note [Half routing weights]; MOE_COMBINE
     * weighted = 2 rounds the products); Mixtral keeps fp32 weights (Note [bf16 Mixtral
     * experts] in llama.c). The shared expert's sigmoid gate is a bf16 op, rounded too. */
    int bf16_weights = m->wdtype == SL_BF16 && c->arch == SL_ARCH_QWEN2_MOE;
    sl_tensor *hx = h2; /* the experts' input: f(h), under SP the gathered tokens */
    if (esp)
        hx = sl_reshape_2d(ctx, sl_llama_tp_f(m, sl_reshape(ctx, h2, 3, (int64_t[]){B, T, C})), Nr, C);
    else if (etp)
        hx = sl_llama_tp_f(m, h2);
    /* packed where it holds fewer rows: dropless (N k pairs against E x N rows), or a capacity factor
     * above 1 (E x capacity > N k); at or below 1 both hold E x capacity rows and the packed chain adds
     * its whole-layer gradient buffers */
    int packed = m->ep <= 1 && m->wdtype == SL_F32 && packed_experts() && Nr * o.k < E * R;
    if (m->ep > 1) {
        y = ep_experts(m, hx, w, l, &o, routed, etp, half);
    } else if (packed) {                                                     /* Note [Packed experts] */
        sl_tensor *xp = sl_moe_ep_pack(ctx, hx, w, Nr * o.k, 0), *yp = NULL; /* the kept pairs */
        for (int e = 0; e < E; e++) {
            sl_tensor *w1 = sl_llama_W(m, nm.expert, l, e, nm.proj[0]),
                      *w3 = sl_llama_W(m, nm.expert, l, e, nm.proj[1]),
                      *w2 = sl_llama_W(m, nm.expert, l, e, nm.proj[2]);
            if (!etp) w1 = moe_W(m, w1), w3 = moe_W(m, w3), w2 = moe_W(m, w2);
            yp = sl_moe_packed_ffn(ctx, xp, w1, w3, w2, yp, e, 0, R, half);
            if (half == SL_BF16 && sl_llama_bf16_gemm(m, w1)) /* as sl_llama_lin multiplies */
                sl_moe_packed_ffn_half_gemm(yp);
        }
        y = sl_moe_ep_unpack(ctx, yp, w, 1);
    }
    for (int e = 0; e < E && m->ep <= 1 && !packed; e++) {
        sl_tensor *xe = sl_moe_gather(ctx, hx, w, e, R, 0); /* (R, C) */
        xe->iparams[2] = routed; /* MOE_EXPERT_FFN reads the kept rows only: no zero fill */
        sl_tensor *w1 = sl_llama_W(m, nm.expert, l, e, nm.proj[0]),
                  *w3 = sl_llama_W(m, nm.expert, l, e, nm.proj[1]),
                  *w2 = sl_llama_W(m, nm.expert, l, e, nm.proj[2]);
        if (!etp) w1 = moe_W(m, w1), w3 = moe_W(m, w3), w2 = moe_W(m, w2);
        sl_tensor *ye =
            routed ? sl_moe_expert_ffn(ctx, xe, w1, w3, w2, w, e) : sl_llama_swiglu(m, xe, w1, w3, w2);
        y = sl_moe_combine(ctx, ye, w, y, e, bf16_weights ? 2 : 1); /* (Nr, C) */
    }
    if (m->wdtype == SL_BF16) y = sl_llama_rnd(m, y); /* Note [bf16 MoE combine] */
    /* the partial sums of the TP ranks' expert slices (under SP reduce-scattered to this rank's tokens) */
    if (esp)
        y = sl_reshape_2d(ctx, sl_llama_tp_g(m, sl_reshape(ctx, y, 3, (int64_t[]){B, T * m->tp, C})), N, C);
    else if (etp)
        y = sl_llama_tp_g(m, y);
    if (c->shared_intermediate > 0) {
        sl_tensor *s = sl_llama_swiglu(m, h2, moe_W(m, sl_llama_W(m, nm.shared, l, "gate_proj")),
                                       moe_W(m, sl_llama_W(m, nm.shared, l, "up_proj")),
                                       moe_W(m, sl_llama_W(m, nm.shared, l, "down_proj"))); /* (N, C) */
        if (c->arch == SL_ARCH_QWEN2_MOE) {
            /* sigmoid(h Wsg^T): a one-expert sigmoid route is the sigmoid, with its gradient */
            sl_tensor *g = sl_llama_lin(
                m, h2, moe_W(m, sl_llama_W(m, "model.layers.%d.mlp.shared_expert_gate.weight", l)),
                NULL); /* (N, 1) */
            sl_moe_route_opts so = {.k = 1, .score = SL_MOE_SCORE_SIGMOID, .scale = 1.0f};
            sl_tensor *sg = sl_moe_route(ctx, g, NULL, &so);
            /* a half op: its output rounded, its backward torch's sigmoid_backward of that half output
             * (Note [Half routing weights]) */
            sl_tensor *sm = sl_mul(ctx, s, sg);
            if (wh != SL_F32)
                sg->iparams[SL_MOE_ROUTE_IP_HALF] = (wh == SL_BF16 ? 1 : 2) | SL_MOE_ROUTE_HALF_OPS,
                sm->iparams[SL_MUL_IP_HALF] = wh;
            s = sl_llama_rnd(m, sm);
        }
        y = sl_add(ctx, y, s); /* a bf16 model's sum is bf16; under autocast fp32 (routed) + half (shared) */
        if (m->wdtype == SL_BF16) y = sl_llama_rnd(m, y);
    }
    return sl_reshape(ctx, y, 3, (int64_t[]){B, T, C});
}

sl_tensor *sl_moe_add_router_losses(sl_model *m, int mark, sl_tensor *loss) {
    if (!sl_model_is_moe(m)) return loss;
    int n = sl_ctx_count(m->ctx);
    for (int i = mark; i < n; i++) {
        sl_tensor *t = sl_ctx_tensor(m->ctx, i);
        if (t->op == SL_OP_MOE_ROUTER_LOSS) loss = loss ? sl_add(m->ctx, loss, t) : t;
    }
    return loss;
}

/* ---------------- statistics and the bias update ---------------- */

static int is_layer_route(const sl_tensor *t) {
    return t->op == SL_OP_MOE_ROUTE && t->ne[1] > 1 && t->buffer && !t->iparams[SL_MOE_ROUTE_IP_LOSS_ONLY];
}

static sl_status read_counts(const sl_tensor *t, float *cnt) {
    return sl_backend_copy_out(t->buffer, t->buffer_offs + sl_moe_route_counts_offset(t), cnt,
                               sizeof(float) * 2 * (size_t)t->ne[1]);
}

sl_status sl_moe_graph_stats(sl_graph *g, sl_moe_stats *out) {
    memset(out, 0, sizeof *out);
    float cnt[2 * SL_MOE_MAX_EXPERTS], raw[3];
    double routed = 0, kept = 0;
    int n_loss = 0;
    for (int i = 0; i < sl_graph_n_nodes(g); i++) {
        sl_tensor *t = sl_graph_node(g, i);
        if (is_layer_route(t)) {
            int64_t E = t->ne[1];
            SL_TRY(read_counts(t, cnt));
            out->n_layers++;
            out->n_experts = (int)E;
            for (int64_t e = 0; e < E && e < SL_MOE_MAX_EXPERTS; e++) {
                out->load[e] += cnt[e];
                routed += cnt[e];
                kept += cnt[E + e];
            }
        } else if (t->op == SL_OP_MOE_ROUTER_LOSS && t->buffer) {
            SL_TRY(sl_backend_copy_out(t->buffer, t->buffer_offs, raw, sizeof raw));
            out->aux += raw[1];
            out->z += raw[2];
            n_loss++;
        }
    }
    if (n_loss) out->aux /= n_loss, out->z /= n_loss;
    out->n_loss = n_loss;
    out->dropped_frac = routed > 0 ? (routed - kept) / routed : 0;
    return SL_OK;
}

/* Note [Aux-loss-free load balancing]
 * DeepSeek-V3 adds a per-expert bias to the scores used for the top-k choice only (the weights stay the
 * unbiased scores) and, after each step, moves it by a fixed rate towards balance:
 * b_e += rate * sign(mean_e' load_e' - load_e). The loads are the step's routed counts of that layer
 * (last micro-batch; under data parallelism summed over the DP ranks first, sl_moe_bias_loads, so every
 * replica moves its bias alike). The bias lives in the flat parameter buffer (a frozen leaf: it gets no
 * gradient and no weight decay, so AdamW leaves it alone) and is written back through the backend. */
int sl_moe_bias_layers(sl_graph *g, int64_t *n_experts) {
    int n = 0;
    for (int i = 0; i < sl_graph_n_nodes(g); i++) { /* before the first run too: no buffer needed */
        sl_tensor *t = sl_graph_node(g, i);
        if (t->op != SL_OP_MOE_ROUTE || t->ne[1] <= 1 || !t->src[1] || t->iparams[SL_MOE_ROUTE_IP_LOSS_ONLY])
            continue;
        *n_experts = t->ne[1];
        n++;
    }
    return n;
}

sl_status sl_moe_bias_loads(sl_graph *g, float *loads) {
    int64_t off = 0;
    for (int i = 0; i < sl_graph_n_nodes(g); i++) {
        sl_tensor *t = sl_graph_node(g, i);
        if (!is_layer_route(t) || !t->src[1]) continue;
        float cnt[2 * SL_MOE_MAX_EXPERTS];
        SL_TRY(read_counts(t, cnt));
        memcpy(loads + off, cnt, sizeof(float) * (size_t)t->ne[1]);
        off += t->ne[1];
    }
    return SL_OK;
}

sl_status sl_moe_update_bias(sl_model *m, sl_graph *g, const float *loads, sl_param_add_fn add, void *user) {
    if (m->arch != SL_ARCH_DEEPSEEK_V3 || m->moe.bias_update_rate == 0) return SL_OK;
    float cnt[2 * SL_MOE_MAX_EXPERTS], b[SL_MOE_MAX_EXPERTS];
    int64_t loff = 0;
    for (int i = 0; i < sl_graph_n_nodes(g); i++) {
        sl_tensor *t = sl_graph_node(g, i);
        if (!is_layer_route(t) || !t->src[1]) continue;
        const sl_param_info *p = NULL;
        for (int j = 0; j < m->n_params && !p; j++)
            if (m->params[j].t == t->src[1]) p = &m->params[j];
        if (!p) continue;
        int64_t E = t->ne[1];
        double mean = 0;
        if (loads)
            memcpy(cnt, loads + loff, sizeof(float) * (size_t)E);
        else
            SL_TRY(read_counts(t, cnt));
        loff += E;
        for (int64_t e = 0; e < E; e++) mean += cnt[e] / (double)E;
        float d[SL_MOE_MAX_EXPERTS];
        for (int64_t e = 0; e < E; e++)
            d[e] = m->moe.bias_update_rate * (float)((cnt[e] < mean) - (cnt[e] > mean));
        if (add) {
            SL_TRY(add(user, p->offset, E, d));
            continue;
        }
        SL_TRY(sl_model_params_read(m, p->offset, E, b));
        for (int64_t e = 0; e < E; e++) b[e] += d[e];
        SL_TRY(sl_model_params_write(m, p->offset, E, b));
    }
    return SL_OK;
}
