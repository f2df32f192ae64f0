/* suanli/graph.h — tensors as graph nodes, op builders, autodiff, planner, executor.
 *
 * Usage (build once, run many times):
 *   sl_ctx *ctx = sl_ctx_new(1 << 16);                      // node arena (metadata only)
 *   sl_tensor *x = sl_new_tensor(ctx, SL_F32, 2, (int64_t[]){B, C}); sl_set_input(x);
 *   sl_tensor *w = sl_new_tensor(ctx, SL_F32, 2, (int64_t[]){OC, C}); sl_set_param(w);
 *   sl_tensor *y = sl_matmul(ctx, x, w, 0, 1);               // x @ w^T   (B, OC)
 *   sl_tensor *loss = sl_cross_entropy(ctx, y, targets);      // scalar
 *   sl_graph *g = sl_graph_new(ctx);
 *   sl_graph_build_forward(g, loss);
 *   sl_graph_build_backward(g, loss);                         // appends grad nodes, accumulates into p->grad
 *   sl_graph_plan(g, backend);                                // liveness-based activation memory
 *   ... bind leaves (sl_tensor_bind) ...
 *   sl_graph_compute(g, NULL, NULL);                          // run every node on the backend
 *
 * Layout: shapes are row-major like PyTorch: ne[0] is the outermost dimension, ne[ndim-1] the
 * innermost. Strides (nb) are in ELEMENTS. A view shares its source's storage.
 *
 * Ownership: every sl_tensor is owned by its sl_ctx; sl_ctx_free releases them all. Leaves'
 * data pointers are borrowed (the caller binds memory it owns); intermediate nodes get memory
 * from the graph's planned arena (owned by the graph).
 */
#ifndef SUANLI_GRAPH_H
#define SUANLI_GRAPH_H

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
sl_tensor *sl_gelu(sl_ctx *ctx, sl_tensor *a);
sl_tensor *sl_layernorm(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, sl_tensor *b, float eps);
sl_tensor *sl_softmax(sl_ctx *ctx, sl_tensor *a);
sl_tensor *sl_attention(sl_ctx *ctx, sl_tensor *q, sl_tensor *k, sl_tensor *v);
sl_tensor *sl_embedding(sl_ctx *ctx, sl_tensor *table, sl_tensor *ids);
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
/* Sparse SwiGLU expert (inference, no backward): see SL_OP_MOE_EXPERT. */
sl_tensor *sl_moe_expert(sl_ctx *ctx, sl_tensor *h, sl_tensor *gate, int e, sl_tensor *w1, sl_tensor *w3,
                         sl_tensor *w2, int bf16);

/* Internal-but-public: generic node creation used by builders and backward rules. */
sl_tensor *sl_new_op(sl_ctx *ctx, sl_op op, sl_dtype t, int ndim, const int64_t *ne);

/* ---- graph ---- */

sl_graph *sl_graph_new(sl_ctx *ctx);
void sl_graph_free(sl_graph *g);
/* Append `out` and everything it depends on (topological order, each node once). */
void sl_graph_build_forward(sl_graph *g, sl_tensor *out);
/* Append gradient nodes: seeds d(loss) = `loss_scale` and accumulates each parameter's gradient
 * into p->grad (which must be set: a leaf bound to the flat gradient buffer). */
void sl_graph_build_backward(sl_graph *g, sl_tensor *loss, float loss_scale);
int sl_graph_n_nodes(const sl_graph *g);
sl_tensor *sl_graph_node(sl_graph *g, int i);
/* The gradient node of t computed by backward (NULL if none). */
sl_tensor *sl_graph_grad_of(sl_graph *g, const sl_tensor *t);
/* Index of the last node that writes into param p's gradient (-1 if none): DP bucket readiness. */
int sl_graph_last_grad_write(sl_graph *g, const sl_tensor *p);
/* Note [Overwriting first gradient writes]
 * Gradient nodes accumulate into the parameters' gradient leaves (ACC, an accumulating dW MATMUL,
 * EMBEDDING_BACK), so a training step normally zeroes the gradients first: a full pass over the gradient
 * buffer, and then every dW GEMM reads that zero C back. With overwrite on, the first writer of each
 * gradient leaf (flagged SL_FLAG_GRAD_FIRST when backward is built; every writer covers its whole leaf)
 * overwrites instead: ACC copies, the dW GEMM runs with beta = 0, EMBEDDING_BACK zeroes its table first.
 * The values are those of zeroing + accumulating (0 + x == x), so a trainer sets overwrite for its first
 * micro-batch and skips zeroing every gradient that has a writer (sl_graph_last_grad_write >= 0); leaves
 * without a writer must still be zeroed by the caller. Off by default (a fresh graph accumulates). */
void sl_graph_set_grad_overwrite(sl_graph *g, int on);

typedef struct sl_plan_stats {
    size_t planned_bytes; /* arena size after liveness reuse */
    size_t naive_bytes;   /* sum of all intermediate allocations */
    int n_allocs;
} sl_plan_stats;
/* Assign activation memory by liveness and allocate one arena on `be`. */
sl_status sl_graph_plan(sl_graph *g, sl_backend *be, sl_plan_stats *stats);
/* Run all nodes (after sl_graph_plan and binding of every leaf). */
sl_status sl_graph_compute(sl_graph *g, sl_node_hook hook, void *user);
/* Run nodes [start, end). */
sl_status sl_graph_compute_range(sl_graph *g, int start, int end, sl_node_hook hook, void *user);
/* The tensor whose memory t uses: follows views and in-place ops (ACC, SCATTER_ADD, ...) to a leaf or to
 * the node that owns storage. */
sl_tensor *sl_storage_root(sl_tensor *t);
/* Re-derive the data pointers of views and in-place nodes from their sources after a leaf was bound to
 * new memory between or during executions (from a hook; ZeRO-3 binds parameters to gather buffers). */
void sl_graph_refresh_views(sl_graph *g);
/* Debug: print nodes. */
void sl_graph_print(sl_graph *g, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
