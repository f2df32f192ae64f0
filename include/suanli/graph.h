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

#include "suanli/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SL_MAX_DIMS 5
#define SL_MAX_SRC 5
#define SL_MAX_IPARAMS 8
#define SL_MAX_FPARAMS 4

typedef enum sl_dtype { SL_F32 = 0, SL_BF16, SL_I32, SL_DTYPE_COUNT } sl_dtype;
size_t sl_dtype_size(sl_dtype t);
const char *sl_dtype_name(sl_dtype t);

/* The op set. Forward ops first, then ops that exist to express backward rules.
 * Adding an op: enum entry here, name + shape rule + backward rule in src/ops/, kernel in
 * src/device/cpu/kernels/, tests in tests/ops/. */
typedef enum sl_op {
    SL_OP_NONE = 0,          /* leaf: parameter, input, or constant */
    SL_OP_VIEW,              /* reshape / permute / slice: new ne/nb/offset over src0's storage */
    SL_OP_CONT,              /* contiguous copy of src0 */
    SL_OP_CAST,              /* dtype conversion src0 -> node dtype (f32 <-> bf16) */
    SL_OP_ADD,               /* src0 + src1, src1 broadcast to src0's shape */
    SL_OP_MUL,               /* src0 * src1, src1 broadcast */
    SL_OP_SCALE,             /* src0 * fparams[0] */
    SL_OP_SUM_TO,            /* sum src0 down to node's (broadcast-compatible) shape */
    SL_OP_ACC,               /* in-place: src0 += src1 (src0 is any tensor; node aliases src0); iparams[0]=1:
                                src0 = src1 (Note [Overwriting first gradient writes]) */
    SL_OP_ZEROS,             /* a zero-filled tensor of node's shape */
    SL_OP_SCATTER_ADD,       /* in-place: view(src0; iparams: offset + ne/nb of src1's image) += src1 */
    SL_OP_MATMUL,            /* op(src0) @ op(src1) (+ src2: optional f32 bias (N), added to every row; src1
                                2-D); iparams[0]=transA, [1]=transB; iparams[2]=1: in place, view_src +=
                                op(src0) @ op(src1) (2-D; gradient accumulation); iparams[2]=2: in place,
                                view_src = op(src0) @ op(src1) (Note [Overwriting first gradient writes]) */
    SL_OP_GELU,              /* tanh approximation (GPT-2) */
    SL_OP_GELU_BACK,         /* src0 = x, src1 = dy */
    SL_OP_LAYERNORM,         /* src0 = x (.., C), src1 = weight (C), src2 = bias (C); fparams[0]=eps */
    SL_OP_LAYERNORM_BACK_X,  /* src0 = fwd node (aux: mean,rstd), src1 = x, src2 = w, src3 = dy */
    SL_OP_LAYERNORM_BACK_WB, /* -> (2, C): [dweight; dbias]; src0 = fwd, src1 = x, src2 = dy */
    SL_OP_SOFTMAX,           /* over last dim */
    SL_OP_SOFTMAX_BACK,      /* src0 = y (softmax output), src1 = dy */
    SL_OP_ATTENTION,      /* causal MHA: q (B,T,NH,hs), k/v (B,T,NKV,hs) -> (B,T,NH*hs); aux: lse (B,NH,T) */
    SL_OP_ATTENTION_BACK, /* src0 = fwd, src1..3 = q,k,v, src4 = dy -> (B,T,NH+2*NKV,hs) packed dq|dk|dv */
    SL_OP_EMBEDDING,      /* src0 = table (V, C), src1 = ids (i32, any shape) -> (ids.., C) */
    SL_OP_EMBEDDING_BACK, /* in place on src0 (V, C): src0[ids[i]] += dy[i] (src1 = ids, src2 = dy);
                             iparams[1]=1: src0 is zeroed first (a first gradient write) */
    SL_OP_CROSS_ENTROPY,  /* src0 = logits (N.., V), src1 = targets (i32 N..) -> scalar mean loss; aux: lse */
    SL_OP_CROSS_ENTROPY_BACK, /* src0 = fwd, src1 = logits, src2 = targets, src3 = dloss (scalar) */
    SL_OP_CONCAT,             /* concat src0, src1 along iparams[0] */
    /* Llama family (issue 7) */
    SL_OP_RMSNORM,        /* src0 = x (.., C), src1 = weight (C); fparams[0]=eps; aux: rstd per row */
    SL_OP_RMSNORM_BACK_X, /* src0 = fwd (aux: rstd), src1 = x, src2 = w, src3 = dy */
    SL_OP_RMSNORM_BACK_W, /* src0 = fwd, src1 = x, src2 = dy -> (C) */
    SL_OP_ROPE,           /* src0 = x (B,T,NH,hs) -> contiguous; rotate-half RoPE at positions iparams[0]+t;
                             iparams[1]=1: inverse rotation (the backward); fparams[0]=theta; fparams[1..3] =
                             llama3 scaling (factor, low_freq_factor, high_freq_factor; factor 0 = off) with
                             iparams[3] = original context; iparams[2]=1: bf16 numerics */
    SL_OP_SILU,           /* x * sigmoid(x) */
    SL_OP_SILU_BACK,      /* src0 = x, src1 = dy */
    SL_OP_TOPK_GATE,      /* src0 = router logits (N, E) -> (N, E): softmax over the top-k logits per row
                             (iparams[0]=k), zero elsewhere: Mixtral's renormalised top-k routing weights */
    SL_OP_TOPK_GATE_BACK, /* src0 = fwd (gate), src1 = dy */
    SL_OP_ATTENTION_KV,   /* inference with a KV cache: q (B,Tq,NH,hs), k/v caches (B,S,NKV,hs);
                             query t sits at position iparams[0]+t and attends cache rows 0..iparams[0]+t;
                             iparams[1] > 0: sliding window -> (B,Tq,NH*hs) */
    SL_OP_KV_STORE,       /* in-place: cache src0 (B,S,NKV,hs) rows [iparams[0], +Tq) = src1 (B,Tq,NKV,hs) */
    SL_OP_LINEAR_BF16,    /* bf16(src0 f32 (.., K)) @ op(src1 bf16), fp32 accumulate -> f32 (.., N);
                             iparams[0]=transB    (1: src1 is (N, K), a Linear weight), iparams[1]=1: round the
                             output to bf16 */
    SL_OP_MOE_EXPERT, /* inference: src0 = h (N, C), src1 = gate (N, E), src2..4 = w1 (I, C), w3 (I, C), w2
                         (C, I) (f32 or bf16) of expert iparams[0] -> (N, C): gate[n,e] * w2(silu(w1 h) * w3
                         h) for the rows routed to e (gate != 0), zero elsewhere; only routed rows are
                         computed; iparams[1]=1: bf16 numerics */
    SL_OP_COUNT
} sl_op;

const char *sl_op_name(sl_op op);

enum {
    SL_FLAG_PARAM = 1 << 0,  /* trainable parameter (gets a grad) */
    SL_FLAG_INPUT = 1 << 1,  /* fed by the caller each step */
    SL_FLAG_OUTPUT = 1 << 2, /* kept alive until the end of the graph */
    SL_FLAG_LOSS = 1 << 3,
    SL_FLAG_GRAD = 1 << 4,       /* a gradient leaf (external buffer) */
    SL_FLAG_GRAD_FIRST = 1 << 5, /* the graph's first node writing into a parameter's gradient leaf */
};

typedef struct sl_tensor {
    sl_dtype dtype;
    int ndim;
    int64_t ne[SL_MAX_DIMS]; /* shape, outermost first */
    int64_t nb[SL_MAX_DIMS]; /* strides in elements */
    sl_op op;
    struct sl_tensor *src[SL_MAX_SRC];
    int32_t iparams[SL_MAX_IPARAMS];
    float fparams[SL_MAX_FPARAMS];
    struct sl_tensor *view_src; /* VIEW / in-place ops: the tensor whose storage this one uses */
    int64_t view_offs;          /* element offset into view_src's storage */
    void *data;                 /* resolved pointer into backend memory (host for CPU) */
    size_t aux_bytes;           /* extra bytes after the data, saved for backward (e.g. LN stats) */
    struct sl_tensor *grad;     /* for params: the gradient leaf to accumulate into */
    uint32_t flags;
    int id;        /* index in its ctx */
    int order;     /* position in the graph's node list (-1: leaf / not in graph) */
    char name[64]; /* fits HF names such as model.layers.31.block_sparse_moe.experts.7.w1.weight */
} sl_tensor;

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
int64_t sl_nelements(const sl_tensor *t);
size_t sl_nbytes(const sl_tensor *t); /* of the logical elements if contiguous */
int sl_is_contiguous(const sl_tensor *t);
int sl_same_shape(const sl_tensor *a, const sl_tensor *b);
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
typedef struct sl_backend sl_backend;
typedef struct sl_graph sl_graph;

/* Completion hook: called after node `n` (position `i`) has been computed. Returning non-OK stops. */
typedef sl_status (*sl_node_hook)(sl_graph *g, int i, sl_tensor *n, void *user);

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
