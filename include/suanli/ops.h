/* suanli/ops.h — the node arena (sl_ctx) and the op builders: creating tensors as graph nodes with their
 * shape rules (src/ops). Nothing is computed here; suanli/graph.h orders, differentiates, plans and runs.
 *
 * Usage:
 *   sl_ctx *ctx = sl_ctx_new(1 << 16);
 *   sl_tensor *x = sl_new_tensor_2d(ctx, SL_F32, B, C);
 *   sl_tensor *y = sl_gelu(ctx, sl_linear(ctx, x, w, b));   // nodes only
 */
#ifndef SUANLI_OPS_H
#define SUANLI_OPS_H

#include "suanli/device.h"
#include "suanli/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sl_ctx sl_ctx;

sl_ctx *sl_ctx_new(int max_tensors);
void sl_ctx_free(sl_ctx *ctx);
int sl_ctx_count(const sl_ctx *ctx);
sl_tensor *sl_ctx_tensor(sl_ctx *ctx, int i);
/* Marks: sl_ctx_reset(ctx, mark) drops every tensor created after mark = sl_ctx_mark(ctx), so a caller can
 * build temporary graphs (generation) on a long-lived ctx without filling it. Pointers to the dropped
 * tensors become invalid: free the graphs that use them first. */
int sl_ctx_mark(const sl_ctx *ctx);
void sl_ctx_reset(sl_ctx *ctx, int mark);

/* ---- tensor metadata ---- */
sl_tensor *sl_new_tensor(sl_ctx *ctx, sl_dtype t, int ndim, const int64_t *ne);
sl_tensor *sl_new_tensor_1d(sl_ctx *ctx, sl_dtype t, int64_t n0);
sl_tensor *sl_new_tensor_2d(sl_ctx *ctx, sl_dtype t, int64_t n0, int64_t n1);
sl_tensor *sl_new_tensor_3d(sl_ctx *ctx, sl_dtype t, int64_t n0, int64_t n1, int64_t n2);
sl_tensor *sl_set_name(sl_tensor *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sl_set_param(sl_tensor *t);
void sl_set_input(sl_tensor *t);
void sl_set_output(sl_tensor *t);
/* Bind external memory to a leaf (borrowed: caller keeps it alive while the graph runs). */
void sl_tensor_bind(sl_tensor *t, void *data);

/* ---- op builders (shape-checked; programmer errors assert) ---- */
sl_tensor *sl_view(sl_ctx *ctx, sl_tensor *a, int ndim, const int64_t *ne, const int64_t *nb, int64_t offs);
sl_tensor *sl_reshape(sl_ctx *ctx, sl_tensor *a, int ndim, const int64_t *ne); /* a contiguous */
sl_tensor *sl_reshape_2d(sl_ctx *ctx, sl_tensor *a, int64_t n0, int64_t n1);
sl_tensor *sl_permute(sl_ctx *ctx, sl_tensor *a, const int *perm); /* out dim i = a dim perm[i] */
sl_tensor *sl_transpose(sl_ctx *ctx, sl_tensor *a, int d0, int d1);
/* Narrow dim `dim` to [start, start+len). */
sl_tensor *sl_slice(sl_ctx *ctx, sl_tensor *a, int dim, int64_t start, int64_t len);
/* Split dim into n equal parts; out[i] are views. */
void sl_split(sl_ctx *ctx, sl_tensor *a, int dim, int n, sl_tensor **out);
sl_tensor *sl_concat(sl_ctx *ctx, sl_tensor *a, sl_tensor *b, int dim);
sl_tensor *sl_cont(sl_ctx *ctx, sl_tensor *a);
sl_tensor *sl_cast(sl_ctx *ctx, sl_tensor *a, sl_dtype t);
sl_tensor *sl_add(sl_ctx *ctx, sl_tensor *a, sl_tensor *b); /* b broadcasts to a */
sl_tensor *sl_mul(sl_ctx *ctx, sl_tensor *a, sl_tensor *b);
sl_tensor *sl_scale(sl_ctx *ctx, sl_tensor *a, float s);
sl_tensor *sl_bias(sl_ctx *ctx, sl_tensor *a, sl_tensor *b); /* a (.., C) + b (C) */
sl_tensor *sl_sum_to(sl_ctx *ctx, sl_tensor *a, const sl_tensor *like);
sl_tensor *sl_acc(sl_ctx *ctx, sl_tensor *dst, sl_tensor *src);
sl_tensor *sl_zeros(sl_ctx *ctx, sl_dtype t, int ndim, const int64_t *ne);
sl_tensor *sl_fill(sl_ctx *ctx, sl_dtype t, int ndim, const int64_t *ne, float value); /* f32, constant */
sl_tensor *sl_scatter_add(sl_ctx *ctx, sl_tensor *dst, sl_tensor *src, const sl_tensor *view_of_dst);
/* a: (.., M, K) or (.., K, M) if transA; b: (.., K, N) or (.., N, K) if transB. If b is 2-D and
 * a has batch dims (and !transA), a's leading dims fold into M: a linear layer. */
sl_tensor *sl_matmul(sl_ctx *ctx, sl_tensor *a, sl_tensor *b, int transA, int transB);
/* y = x @ w^T + b, PyTorch nn.Linear layout: w (OC, IC), b (OC) or NULL. */
sl_tensor *sl_linear(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, sl_tensor *b);
/* Note [Fused weight casts] (src/ops/backward.c): a bf16 a times an f32 2-D b that enters the product rounded
 * to bf16, the same values as sl_matmul(a, sl_cast(b, SL_BF16)) without the cast node (!transA); its
 * backward gives b the bf16-rounded gradient of that cast. sl_linear_half_w: the Linear layer of it (x
 * bf16, w f32, b f32 or NULL). Backends that run it say so in caps.matmul_half_b. */
sl_tensor *sl_matmul_half_b(sl_ctx *ctx, sl_tensor *a, sl_tensor *b, int transA, int transB);
sl_tensor *sl_linear_half_w(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, sl_tensor *b);
/* sl_round_half(sl_linear_half_w(x, w, b), SL_BF16) as one node: the MATMUL rounds its output to bf16
 * (iparams[SL_MATMUL_IP_ROUND], Note [Rounded Linear outputs] in src/device/cpu/kernels/gemm.c), bitwise
 * the two casts, and its backward rounds the gradient as their backward did (caps.matmul_half_b). */
sl_tensor *sl_linear_half_w_rounded(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, sl_tensor *b);
sl_tensor *sl_gelu(sl_ctx *ctx, sl_tensor *a);
sl_tensor *sl_layernorm(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, sl_tensor *b, float eps);
sl_tensor *sl_softmax(sl_ctx *ctx, sl_tensor *a);
/* iparams[2] of the result: 0 fp32; 1 bf16, 2 f16: an eager attention's half rounding points; 3: f16 with an
 * fp32 softmax (transformers' eager); CPU reference kernel only (Note [Eager half attention numerics]) */
sl_tensor *sl_attention(sl_ctx *ctx, sl_tensor *q, sl_tensor *k, sl_tensor *v);
/* sl_attention with a sliding window (Mistral): query t attends keys max(0, t - window + 1)..t; window <= 0
 * or >= T is plain causal attention. CPU only (scalar and SIMD kernels); the CUDA and OpenCL kernels have
 * no window and report such nodes unsupported. */
sl_tensor *sl_attention_window(sl_ctx *ctx, sl_tensor *q, sl_tensor *k, sl_tensor *v, int window);
sl_tensor *sl_embedding(sl_ctx *ctx, sl_tensor *table, sl_tensor *ids);
/* Dropout with probability p in [0, 1) at model place `site` (Note [Dropout from counters], build.c): the
 * identity until sl_graph_set_dropout turns it on; x * keep / (1 - p) then. */
sl_tensor *sl_dropout(sl_ctx *ctx, sl_tensor *x, float p, int site);
/* res + dropout(x) as one node (res NULL: dropout(x)), the mask kept as bits for the backward (Note [Hidden
 * dropout bits], src/ops/build.c) */
sl_tensor *sl_dropout_add(sl_ctx *ctx, sl_tensor *x, sl_tensor *res, float p, int site);
/* Dropout of an ATTENTION node's probabilities (same counters; returns attn). */
sl_tensor *sl_attention_dropout(sl_tensor *attn, float p, int site);
sl_tensor *sl_cross_entropy(sl_ctx *ctx, sl_tensor *logits, sl_tensor *targets);
/* Llama family. rmsnorm: x * rsqrt(mean(x^2) + eps) * w over the last dim (HF LlamaRMSNorm). */
sl_tensor *sl_rmsnorm(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, float eps);
/* x (B, T, NH, hs), hs even, last dim contiguous: HF rotate-half RoPE at positions pos0 + t. */
sl_tensor *sl_rope(sl_ctx *ctx, sl_tensor *x, int pos0, float theta);
sl_tensor *sl_silu(sl_ctx *ctx, sl_tensor *a);
/* logits (N, E) -> dense routing weights (N, E): softmax over each row's top k, zero elsewhere. */
sl_tensor *sl_topk_gate(sl_ctx *ctx, sl_tensor *logits, int k);
/* Inference only (no backward). Caches are (B, S, NKV, hs) contiguous leaves; see SL_OP_ATTENTION_KV.
 * pos0 lives in iparams[0] and may be changed between executions of the same graph (decode steps). */
sl_tensor *sl_attention_kv(sl_ctx *ctx, sl_tensor *q, sl_tensor *kc, sl_tensor *vc, int pos0, int window);
sl_tensor *sl_kv_store(sl_ctx *ctx, sl_tensor *cache, sl_tensor *x, int pos0);
/* bf16 compute: y = bf16(x) @ w^T with w (N, K) bf16, fp32 accumulation; round_out: y rounded to bf16 values.
 */
sl_tensor *sl_linear_bf16(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, int round_out);
/* Round f32 values to the nearest bf16 (kept in f32): cast to bf16 and back. */
sl_tensor *sl_round_bf16(sl_ctx *ctx, sl_tensor *x);
/* The same for a half dtype (SL_BF16 or SL_F16): an autocast rounding point (Note [Half autocast]). */
sl_tensor *sl_round_half(sl_ctx *ctx, sl_tensor *x, sl_dtype half);
/* Sparse SwiGLU expert (inference, no backward): see SL_OP_MOE_EXPERT. */
sl_tensor *sl_moe_expert(sl_ctx *ctx, sl_tensor *h, sl_tensor *gate, int e, sl_tensor *w1, sl_tensor *w3,
                         sl_tensor *w2, int bf16);

/* ---- tensor parallelism (Note [Tensor-parallel graphs], src/ops/build_tp.c) ----
 * A COLLECTIVE node names what happens forward and what its gradient does backward, so Megatron's
 * conjugate pair is two nodes: f = sl_collective(x, COPY, ALLREDUCE) before a column-parallel linear,
 * g = sl_collective(x, ALLREDUCE, COPY) after a row-parallel one. The graph's collective provider
 * (sl_graph_set_collective, suanli/graph.h) runs them. */
typedef enum sl_coll_kind {
    SL_COLL_NONE = 0,  /* backward only: no gradient flows to the input */
    SL_COLL_COPY,      /* identity */
    SL_COLL_ALLREDUCE, /* sum over the group */
    SL_COLL_ALLGATHER, /* concatenate the group's inputs along dim 0 in rank order (out ne[0] = size x) */
    /* sequence parallelism: along dim 1 of (B, T, ..) activations, rank r holding tokens [r T/n, (r+1) T/n)
     */
    SL_COLL_ALLGATHER_SEQ, /* (B, T/n, ..) -> (B, T, ..) */
    SL_COLL_REDSCAT_SEQ,   /* (B, T, ..) partial sums -> (B, T/n, ..) this rank's tokens of the sum */
    /* expert parallelism (Note [Expert-parallel dispatch], src/ops/moe_ops.c) */
    SL_COLL_ALLTOALL,     /* block p of x (ne[0] / n elements) to rank p, arriving at block (sender) */
    SL_COLL_ALLTOALLV,    /* rows of x (S, C) to their experts' ranks: counts src1 = cnt, src2 = rcnt */
    SL_COLL_ALLTOALLV_REV /* the way back: rows received by ALLTOALLV returned to their senders */
} sl_coll_kind;
/* SL_GROUP_TP_KV: groups of iparams[4] consecutive TP ranks (sl_collective_group) */
/* SL_GROUP_EP: the expert-parallel group (sl_mesh.ep_comm) */
typedef enum sl_coll_group { SL_GROUP_TP = 0, SL_GROUP_TP_KV, SL_GROUP_EP, SL_GROUP_COUNT } sl_coll_group;
sl_tensor *sl_collective(sl_ctx *ctx, sl_tensor *x, sl_coll_kind fwd, sl_coll_kind bwd, sl_coll_group group,
                         int group_size);
/* Megatron's f and g for a model split tp ways (identities for tp <= 1): entering a TP region before a
 * column-parallel linear, leaving it after a row-parallel one; with sequence parallelism (sp) an all-gather
 * and a reduce-scatter along the sequence instead. sl_tp_rep wraps a replicated parameter that SP applies
 * to sequence shards, so its partial gradients are summed over the group. */
sl_tensor *sl_tp_enter(sl_ctx *ctx, sl_tensor *x, int tp, int sp);
sl_tensor *sl_tp_exit(sl_ctx *ctx, sl_tensor *x, int tp, int sp);
sl_tensor *sl_tp_rep(sl_ctx *ctx, sl_tensor *p, int tp, int sp);
/* The same over groups of `sub` consecutive ranks of the TP group (COPY / ALLREDUCE kinds only). */
sl_tensor *sl_collective_group(sl_ctx *ctx, sl_tensor *x, sl_coll_kind fwd, sl_coll_kind bwd, int tp,
                               int sub);
/* Embedding lookup in a vocab shard: table holds rows [lo, lo + table->ne[0]) of the full table; other
 * ids give zero rows (sum the group's outputs to get the full lookup). */
sl_tensor *sl_embedding_shard(sl_ctx *ctx, sl_tensor *table, sl_tensor *ids, int64_t lo);
/* Vocab-parallel cross-entropy: logits (N.., Vl) are columns [lo, lo + Vl) of the full logits, split
 * over the `group_size` ranks of the TP group; the mean loss over targets >= 0 equals sl_cross_entropy of
 * the full logits, without ever gathering them (one all-gather of 2 floats per row). */
sl_tensor *sl_cross_entropy_vp(sl_ctx *ctx, sl_tensor *logits, sl_tensor *targets, int64_t lo,
                               int group_size);
/* ---- trainable mixture of experts (src/ops/moe_ops.c; Note [MoE dispatch in a static graph]) ---- */
typedef enum sl_moe_score { SL_MOE_SCORE_SOFTMAX = 0, SL_MOE_SCORE_SIGMOID = 1 } sl_moe_score;
typedef struct sl_moe_route_opts {
    int k;                   /* experts per token */
    sl_moe_score score;      /* softmax (Mixtral, Switch, Qwen2-MoE) or sigmoid (DeepSeek-V3) */
    int norm_topk;           /* renormalise the selected weights to sum 1 (Mixtral: topk-then-softmax) */
    int n_group, topk_group; /* group-limited selection (DeepSeek-V3); n_group <= 1: off */
    float scale;             /* routed_scaling_factor (1: off) */
    int capacity;            /* tokens per expert, later ones dropped; 0: dropless */
} sl_moe_route_opts;
/* logits (N, E), bias (E) or NULL (added to the scores for the selection only) -> routing weights (N, E).
 * The node's aux holds, after the (N, E) scores and (N, E) mask (0 unrouted, 1 kept, 2 dropped), the
 * per-expert counts: E routed (before capacity) then E kept; sl_moe_route_counts_offset gives its byte
 * offset from t->data. */
sl_tensor *sl_moe_route(sl_ctx *ctx, sl_tensor *logits, sl_tensor *bias, const sl_moe_route_opts *o);
size_t sl_moe_route_counts_offset(const sl_tensor *route);
/* (B E): the tokens route (N = B x Tl rows, b-major; no capacity) selects per expert in each block of Tl */
sl_tensor *sl_moe_route_block_counts(sl_ctx *ctx, sl_tensor *route, int64_t B);
/* Makes route (a capacity > 0, N = B x Tl rows) apply its capacity as if its rows were sequence shard `shard`
 * of a batch whose shards each hold (b, Tl) rows of every batch row b: counts (P B E) are every shard's
 * sl_moe_route_block_counts, all-gathered shard-major (Note [Capacity under sequence parallelism]). */
void sl_moe_route_shard(sl_tensor *route, sl_tensor *counts, int shard, int64_t B);
/* Scalar aux_coeff * Switch load-balancing loss + z_coeff * router z-loss of one layer (shape (1)); the
 * node's aux holds the raw [aux, z] (2 floats after the value). */
sl_tensor *sl_moe_router_loss(sl_ctx *ctx, sl_tensor *logits, sl_tensor *route, float aux_coeff,
                              float z_coeff);
/* x (N, C) -> (R, C): the rows of the tokens expert e keeps, in token order; zero rows past the count. */
sl_tensor *sl_moe_gather(sl_ctx *ctx, sl_tensor *x, sl_tensor *route, int e, int64_t R, int weighted);
/* acc (N, C) or NULL + routing weight * y (R, C) scattered back to expert e's tokens -> (N, C). weighted: 0
 * y, 1 w * y, 2 bf16(w * y) (a bf16 inference model's Qwen2-MoE, whose route already rounds w to bf16;
 * forward only). */
sl_tensor *sl_moe_combine(sl_ctx *ctx, sl_tensor *y, sl_tensor *route, sl_tensor *acc, int e, int weighted);
/* The SwiGLU expert e on x (R, C) from sl_moe_gather, computed on the kept rows only (f32 weights): what
 * makes dropless dispatch cost FLOPs in proportion to the routed tokens (see SL_OP_MOE_EXPERT_FFN). */
sl_tensor *sl_moe_expert_ffn(sl_ctx *ctx, sl_tensor *x, sl_tensor *w1, sl_tensor *w3, sl_tensor *w2,
                             sl_tensor *route, int e);
/* Note [Packed experts]: expert e's SwiGLU (f32 weights) on its rows of the packed pairs xp (S, C) from
 * sl_moe_ep_pack (El = 0), or of the regrouped received rows from sl_moe_ep_regroup (local expert e of El),
 * chained in place on the previous expert's node (NULL for the first); the last node of the chain holds
 * every expert's rows. rmax: the most rows one expert can receive (N; under EP ep x N). half: SL_BF16 or
 * SL_F16 to round as autocast does (Note [Packed experts under autocast]), SL_F32 for none. */
sl_tensor *sl_moe_packed_ffn(sl_ctx *ctx, sl_tensor *xp, sl_tensor *w1, sl_tensor *w3, sl_tensor *w2,
                             sl_tensor *prev, int e, int El, int64_t rmax, sl_dtype half);
/* Under bf16 autocast: chain node t (from sl_moe_packed_ffn with half SL_BF16) multiplies on the bf16 GEMM
 * with fused weight casts, as sl_llama_lin does where the backend has caps.matmul_half_b (Note [Packed
 * experts under autocast]); without it, on rounded f32 operands (the other path of sl_llama_lin). Set it on
 * every node of a chain or on none. */
void sl_moe_packed_ffn_half_gemm(sl_tensor *t);
/* ---- expert parallelism (Note [Expert-parallel dispatch]): E experts over P ranks of SL_GROUP_EP ---- */
/* cnt (E): this rank's kept tokens per global expert */
sl_tensor *sl_moe_ep_counts(sl_ctx *ctx, sl_tensor *route);
/* rcnt (E): the all-to-all of cnt (block p = rank p's counts for this rank's E / P experts) */
sl_tensor *sl_moe_ep_exchange_counts(sl_ctx *ctx, sl_tensor *cnt, int P);
/* x (N, C) -> (S, C): the kept (token, expert) pairs, expert-major then token order (S >= pairs) */
sl_tensor *sl_moe_ep_pack(sl_ctx *ctx, sl_tensor *x, sl_tensor *route, int64_t S, int weighted);
/* packed (S, C) -> (N, C): each token's rows summed (weighted: times its routing weights) */
sl_tensor *sl_moe_ep_unpack(sl_ctx *ctx, sl_tensor *packed, sl_tensor *route, int weighted);
/* rows to the ranks of their experts (reverse 0) or back (reverse 1), into an (rows_out, C) tensor */
sl_tensor *sl_moe_ep_alltoallv(sl_ctx *ctx, sl_tensor *x, sl_tensor *cnt, sl_tensor *rcnt, int64_t rows_out,
                               int reverse, int P);
/* local expert l's received rows (Rl, C); and back into the (Rx, C) layout of the received rows */
sl_tensor *sl_moe_ep_gather(sl_ctx *ctx, sl_tensor *recv, sl_tensor *rcnt, int l, int El, int64_t Rl);
sl_tensor *sl_moe_ep_scatter(sl_ctx *ctx, sl_tensor *y, sl_tensor *rcnt, sl_tensor *acc, int l, int El,
                             int64_t Rx);
/* the received rows (Rx, C), source-rank major, regrouped local-expert major (back = 0) or back (1) */
sl_tensor *sl_moe_ep_regroup(sl_ctx *ctx, sl_tensor *x, sl_tensor *rcnt, int El, int back);
/* the SwiGLU expert of local expert l (of El) on its received rows (sl_moe_ep_gather) */
sl_tensor *sl_moe_expert_ffn_ep(sl_ctx *ctx, sl_tensor *x, sl_tensor *w1, sl_tensor *w3, sl_tensor *w2,
                                sl_tensor *rcnt, int l, int El);

/* Internal-but-public: generic node creation used by builders and backward rules. */
sl_tensor *sl_new_op(sl_ctx *ctx, sl_op op, sl_dtype t, int ndim, const int64_t *ne);

#ifdef __cplusplus
}
#endif
#endif
