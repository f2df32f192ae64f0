/* suanli/tensor.h — the tensor: dtype, shape, strides, the op that produces it, and where its data lives.
 * Part of the device layer: backends read nodes (op, sources, parameters, data addresses); the graph
 * layer (suanli/graph.h) builds and runs them.
 *
 * Usage:
 *   sl_tensor *t = ...;                       // made by sl_new_tensor / an op builder (suanli/graph.h)
 *   int64_t n = sl_nelements(t);
 *   if (sl_is_contiguous(t)) ... t->data ...  // a device address: only a backend's kernels dereference it
 *
 * Data location: t->data is the device address of the first element (buffer base + offset), t->buffer the
 * backend buffer it lies in (NULL for memory bound with sl_tensor_bind, e.g. a host-visible mapping), and
 * t->buffer_offs the byte offset in that buffer. Above src/device nothing dereferences t->data; host code
 * moves bytes with sl_tensor_copy_in/out (suanli/device.h).
 */
#ifndef SUANLI_TENSOR_H
#define SUANLI_TENSOR_H

#include "suanli/base.h"

#ifdef __cplusplus
extern "C" {
#endif
#define SL_MAX_DIMS 5
#define SL_MAX_SRC 5
#define SL_MAX_IPARAMS 10
/* MOE_ROUTE iparams[6]: a routing computed for the router losses or the capacity offsets only (Note [Router
 * losses under sequence parallelism], Note [Capacity under sequence parallelism], src/nn/moe.c): no expert
 * reads it; statistics and the bias update skip it */
#define SL_MOE_ROUTE_IP_LOSS_ONLY 6
/* MOE_ROUTE with src2 (sl_moe_route_shard): iparams[7] this rank's sequence shard, iparams[8] the blocks
 * (batch rows) of its N rows */
#define SL_MOE_ROUTE_IP_SHARD 7
#define SL_MOE_ROUTE_IP_BLOCKS 8
/* MOE_ROUTE iparams[9]: the weights rounded to 1 bf16 / 2 f16 values, and their gradient rounded the same
 * way in backward (Qwen2-MoE's router_top_value.to(router_logits.dtype): Note [Half routing weights],
 * src/nn/moe.c); 0 fp32. Or'ed with SL_MOE_ROUTE_HALF_OPS: every step of the route is a half op, as
 * DeepSeek-V3's router under autocast (the sigmoid scores, the normalisation's sum and division and the
 * scaling each rounded, and its backward torch's half autograd of them: Note [DeepSeek-V3's router under
 * autocast], src/nn/moe.c); the shared gate's half sigmoid of Qwen2-MoE is the same op with k = 1. */
#define SL_MOE_ROUTE_IP_HALF 9
#define SL_MOE_ROUTE_HALF_OPS 4
/* MUL iparams[0]: SL_BF16 / SL_F16 for a half op whose broadcast operand's gradient rounds each product
 * before the reduction to its shape (Note [Half routing weights], src/nn/moe.c); 0 none */
#define SL_MUL_IP_HALF 0
#define SL_MAX_FPARAMS 4

/* SL_F16: IEEE binary16 (issue 19), appended so the stored values of the others do not change */
typedef enum sl_dtype { SL_F32 = 0, SL_BF16, SL_I32, SL_F16, SL_DTYPE_COUNT } sl_dtype;
/* MATMUL iparams[3]: SL_BF16 = round the f32 product (with its bias) to bf16 before it is stored or
 * accumulated (Note [Rounded weight gradients], src/ops/ops_internal.h; in forward, a rounded Linear output:
 * Note [Rounded Linear outputs], src/device/cpu/kernels/gemm.c); 0 = none */
#define SL_MATMUL_IP_ROUND 3
/* MATMUL iparams[4]: SL_BF16 = src[1] is an f32 tensor that enters the product rounded to bf16 (a weight's
 * autocast copy cast(w) fused into the GEMM: Note [Fused weight casts], src/ops/backward.c); 0 = none */
#define SL_MATMUL_IP_HALF_B 4
size_t sl_dtype_size(sl_dtype t);
const char *sl_dtype_name(sl_dtype t);

/* The op set. Forward ops first, then ops that exist to express backward rules.
 * Adding an op: enum entry here, name + shape rule + backward rule in src/ops/, kernel in
 * src/device/cpu/kernels/, tests in tests/ops/. */
typedef enum sl_op {
    SL_OP_NONE = 0,          /* leaf: parameter, input, or constant */
    SL_OP_VIEW,              /* reshape / permute / slice: new ne/nb/offset over src0's storage */
    SL_OP_CONT,              /* contiguous copy of src0 */
    SL_OP_CAST,              /* dtype conversion src0 -> node dtype (f32 <-> bf16, f32 <-> f16) */
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
    SL_OP_ATTENTION,         /* causal MHA: q (B,T,NH,hs), k/v (B,T,NKV,hs) -> (B,T,NH*hs); aux: lse (B,NH,T);
                                iparams[1] > 0: sliding window (query t sees keys > t - window) */
    SL_OP_ATTENTION_BACK,    /* src0 = fwd, src1..3 = q,k,v, src4 = dy -> (B,T,NH+2*NKV,hs) packed dq|dk|dv */
    SL_OP_EMBEDDING,      /* src0 = table (V, C), src1 = ids (i32, any shape) -> (ids.., C); iparams[3]=1: a
                             vocab shard holding rows [iparams[2], +V) of the full table: other ids give zero
                             rows (and EMBEDDING_BACK skips them) */
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
                             iparams[3] = original context; iparams[2]=1: bf16 numerics, 2: f16 numerics */
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
    SL_OP_FILL,       /* a tensor of node's shape with every element fparams[0] (the loss-gradient seed) */
    /* Tensor parallelism (Note [Tensor-parallel graphs], src/ops/build_tp.c) */
    SL_OP_COLLECTIVE,  /* a collective over a process group, run by the graph's collective provider (not the
                          backend): iparams[0] = forward kind, [1] = backward kind (sl_coll_kind), [2] = group
                          (sl_coll_group), [3] = group size; src0 = input */
    SL_OP_CE_VP_STATS, /* vocab-parallel cross-entropy, per rank: src0 = logits shard (N.., Vl), src1 =
                          targets (global ids) -> (N, 2): [logsumexp of the shard, target logit if the target
                          lies in [iparams[0], +Vl) else 0] */
    SL_OP_CE_VP,       /* src0 = logits shard, src1 = targets, src2 = all ranks' stats (P, N, 2) -> scalar
                          mean loss over targets >= 0; aux: the global logsumexp per row (N) */
    SL_OP_CE_VP_BACK,  /* src0 = fwd (CE_VP), src1 = logits shard, src2 = targets, src3 = dloss ->
                          d logits shard: softmax - onehot (shard columns), times dloss / count */
    /* Trainable mixture of experts (issue 17; src/ops/moe_ops.c, Note [MoE dispatch in a static graph]) */
    SL_OP_MOE_ROUTE,       /* src0 = router logits (N, E), src1 = optional selection bias (E) -> dense routing
                              weights (N, E): scores softmax|sigmoid (iparams[1] = 0|1), top iparams[0] per row
                              of score + bias, within the top iparams[4] of iparams[3] groups (DeepSeek-V3),
                              iparams[2]=1: renormalised over the selection, times fparams[0]; iparams[5] > 0:
                              capacity per expert, later tokens dropped (weight 0); src2 (optional): every
                              shard's pre-capacity counts per block, which place this shard's tokens in the
                              whole batch's order (sl_moe_route_shard); aux: scores, mask, counts */
    SL_OP_MOE_ROUTE_BACK,  /* src0 = fwd, src1 = dy -> d logits (N, E) */
    SL_OP_MOE_ROUTER_LOSS, /* src0 = logits (N, E), src1 = route -> (1): fparams[0] * Switch
                              load-balancing loss + fparams[1] * router z-loss; aux: the two raw */
    SL_OP_MOE_ROUTER_LOSS_BACK,  /* src0 = fwd, src1 = logits, src2 = route, src3 = dloss -> (N, E) */
    SL_OP_MOE_GATHER,            /* src0 = x (N, C), src1 = route -> (R, C): row r = x of the r-th token kept
                                    by expert iparams[0] (token order), zero past the count (iparams[2]=1:
                                    unwritten); iparams[1]=1: times that token's routing weight */
    SL_OP_MOE_COMBINE,           /* src0 = y (R, C), src1 = route, src2 = acc (N, C) or NULL -> (N, C):
                                    acc + (weight *) y scattered back to the tokens of expert iparams[0] */
    SL_OP_MOE_COMBINE_BACK_GATE, /* src0 = y (R, C), src1 = route, src2 = dy (N, C) -> (N, E): column
                                    iparams[0] = dy . y of the token's row, zero elsewhere */
    SL_OP_MOE_EXPERT_FFN,        /* src0 = x (R, C) gathered for expert iparams[0], src1..3 = w1 (I, C), w3
                                    (I, C), w2 (C, I), src4 = route -> (R, C): w2(silu(w1 x) * w3 x) on the
                                    expert's kept rows only (count from the route; iparams[1] = El > 0: src4
                                    is rcnt, the count of local expert iparams[0] summed over its El-strided
                                    blocks), zero below; aux: count,
                                    w1 x and w3 x for backward */
    SL_OP_MOE_EXPERT_FFN_BACK, /* src0 = fwd, src1 = dy, src2 = w2 -> packed 1-D [d(w1 x) (R, I) | d(w3 x) (R,
                                  I) | dw2 (C, I)], kept rows only */
    SL_OP_MOE_EXPERT_FFN_BACK_X, /* src0 = fwd, src1 = FFN_BACK, src2 = x, src3 = w1, src4 = w3 -> packed 1-D
                                    [dx (R, C) | dw1 (I, C) | dw3 (I, C)] */
    /* Expert parallelism (src/ops/moe_ops.c, Note [Expert-parallel dispatch]): E experts over P ranks, El =
     * E / P local ones; "cnt" (E) = this rank's kept tokens per global expert, "rcnt" (E) = block p holds
     * rank p's counts for this rank's El experts (an all-to-all of cnt) */
    SL_OP_MOE_EP_COUNTS, /* src0 = route -> cnt (E): kept tokens per expert (floats); iparams[0] = B > 1:
                            (B E), per block of N / B rows */
    SL_OP_MOE_EP_PACK,   /* src0 = x (N, C), src1 = route -> (S, C): the kept (token, expert) pairs ordered by
                            expert then token, unwritten past their count; iparams[1]=1: times the weight */
    SL_OP_MOE_EP_UNPACK, /* src0 = packed (S, C), src1 = route -> (N, C): per token the sum of its rows
                            (iparams[1]=1: times its routing weights) */
    SL_OP_MOE_EP_UNPACK_BACK_GATE, /* src0 = packed (S, C), src1 = route, src2 = dy (N, C) -> (N, E): dy .
                                      row of each kept pair, zero elsewhere */
    SL_OP_MOE_EP_GATHER,  /* src0 = received (Rx, C), src1 = rcnt -> (Rl, C): local expert iparams[0]'s (of
                             iparams[1] = El) rows from every source rank in rank order; past the count zero
                             (iparams[2]=1: unwritten); iparams[3] = p + 1: source rank p's rows only (0: all;
                             Note [EP weight gradients per source rank]) */
    SL_OP_MOE_EP_SCATTER, /* src0 = y (Rl, C), src1 = rcnt, src2 = acc (Rx, C) or NULL -> (Rx, C): acc (or
                             zeros) with local expert iparams[0]'s rows put back where EP_GATHER read them
                             (iparams[3] as EP_GATHER's: one source's rows) */
    /* Dropout (issue 20; Note [Dropout from counters], src/ops/build.c) */
    SL_OP_DROPOUT, /* src0 * keep / (1 - p) (+ src1, a residual, when set): p = fparams[0], the keep mask a
                      pure function of the counters in iparams (SL_DROPOUT_IP_*); its backward is the same
                      node applied to the gradient, src2 = the forward node whose aux may hold the mask as
                      bits (Note [Hidden dropout bits], src/ops/build.c) */
    /* Packed routed experts (src/ops/moe_ops.c, Note [Packed experts]): the experts of a layer as one chain
     * over the packed (S, C) rows of MOE_EP_PACK (or MOE_EP_REGROUP under EP), each expert its own rows */
    SL_OP_MOE_PACKED_FFN, /* src0 = packed x (S, C), src1..3 = w1 (I, C), w3 (I, C), w2 (C, I), src4 = the
                             previous expert's node or NULL -> (S, C): expert iparams[0]'s rows (of
                             iparams[1] = El local experts; 0: a single process) = SwiGLU of its rows; in
                             place on src4; the chain's first node holds aux [w1 x (S, I) | w3 x (S, I)];
                             iparams[3]: the autocast half type (0: none) */
    SL_OP_MOE_PACKED_FFN_BACK,   /* src0 = fwd, src1 = dy (S, C), src2 = w2 -> dw2 (C, I); aux [d(w1 x) |
                                    d(w3 x)], iparams[2] rows each */
    SL_OP_MOE_PACKED_FFN_BACK_W, /* src0 = FFN_BACK, src1 = packed x -> packed 1-D [dw1 (I, C) | dw3 (I, C)]
                                  */
    SL_OP_MOE_PACKED_FFN_DX,     /* src0 = FFN_BACK, src1 = w1, src2 = w3, src3 = the later expert's DX or
                                    NULL -> (S, C): the expert's rows of dx; in place on src3 */
    SL_OP_MOE_EP_REGROUP, /* src0 = rows (Rx, C), src1 = rcnt -> (Rx, C): the received rows (source rank
                             major) regrouped local-expert major (iparams[0] = 0) or back (1); iparams[1] = El
                           */
    SL_OP_COUNT
} sl_op;

const char *sl_op_name(sl_op op);

/* Dropout parameters, shared by SL_OP_DROPOUT and SL_OP_ATTENTION (attention-probability dropout; its
 * ATTENTION_BACK reads them from the forward node): p = fparams[0]; iparams[SL_DROPOUT_IP_ON] = 1 while
 * training (set per execution by sl_graph_set_dropout; 0 = identity, the state a graph is built in),
 * [SITE] = where in the model (layer, kind), [SEED_LO/HI] = the run's seed, [STREAM_LO/HI] = the global
 * micro-batch counter. Note [Dropout from counters] in src/ops/build.c. */
/* Tensor and sequence parallelism (Note [Dropout from counters]): an ATTENTION node of TP rank r holds
 * query heads [iparams[SL_DROPOUT_IP_HEAD0], + NH) of iparams[SL_DROPOUT_IP_HEADS] (0: all NH heads are its
 * own); a DROPOUT node on a sequence shard holds positions [iparams[SL_DROPOUT_IP_T0], + Tl) of a sequence of
 * iparams[SL_DROPOUT_IP_SEQ] (0: not a shard), its tensor viewed as (B, Tl, rest). Masks are drawn at the
 * elements' indices in the full tensor, so every layout draws the single process's mask. */
/* Note [Attention dropout bits]
 * An ATTENTION node with dropout (fparams[0] > 0, set by sl_attention_dropout) has, after its lse in the aux
 * area, room for its dropout mask as bits: a 32-byte header, then row (b, h, t) of the mask at uint16 index
 * ((b NH + h) T + t) * 4 ceil(T / 64), bit j (j <= t) set where element (b, h, t, j) is kept. A kernel that
 * draws the mask in forward may store it there and write the header last (the mask's seed, stream and p:
 * the mask is a function of those); ATTENTION_BACK then reads the bits when the header names its own mask,
 * instead of drawing it again (the CPU half kernels: the Philox draws of the backward were ~2 % of the baby
 * bf16 step), and draws it otherwise. */
static inline size_t sl_attn_dropout_bits_bytes(int64_t B, int64_t NH, int64_t T) {
    return 32 + (size_t)(B * NH * T) * (size_t)((T + 63) / 64) * 8;
}

enum {
    SL_DROPOUT_IP_ON = 0,
    SL_DROPOUT_IP_T0 = 1,
    SL_DROPOUT_IP_SEQ = 2,
    SL_DROPOUT_IP_SITE = 3,
    SL_DROPOUT_IP_HEAD0 = 8,
    SL_DROPOUT_IP_HEADS = 9,
    SL_DROPOUT_IP_SEED_LO = 4,
    SL_DROPOUT_IP_SEED_HI = 5,
    SL_DROPOUT_IP_STREAM_LO = 6,
    SL_DROPOUT_IP_STREAM_HI = 7,
};

enum {
    SL_FLAG_PARAM = 1 << 0,  /* trainable parameter (gets a grad) */
    SL_FLAG_INPUT = 1 << 1,  /* fed by the caller each step */
    SL_FLAG_OUTPUT = 1 << 2, /* kept alive until the end of the graph */
    SL_FLAG_LOSS = 1 << 3,
    SL_FLAG_GRAD = 1 << 4,       /* a gradient leaf (external buffer) */
    SL_FLAG_GRAD_FIRST = 1 << 5, /* the graph's first node writing into a parameter's gradient leaf */
    /* storage sized for a worst case of which each step uses a data-dependent prefix of rows (expert-
     * parallel receive buffers): planned in the graph's reserved region (Note [Reserved rows]) */
    SL_FLAG_ROWS_CAP = 1 << 6,
    /* ... and so is its gradient, which the backward rules flag SL_FLAG_ROWS_CAP (not on a tensor whose
     * gradient a collective sends: that one stays in the arena, which may be a communicator window) */
    SL_FLAG_ROWS_CAP_GRAD = 1 << 7,
    /* the residual stream at a transformer layer's boundary (the embedding's output, each layer's output):
     * under full recomputation (Note [Full recomputation], src/graph/autodiff.c) the tensors kept */
    SL_FLAG_LAYER_IO = 1 << 8,
    /* a forward node's copy made by full recomputation for the backward */
    SL_FLAG_RECOMPUTED = 1 << 9,
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
    void *data; /* device address (buffer base + offset); host pointer only for host-visible memory */
    struct sl_buffer *buffer; /* the backend buffer data lies in (NULL: bound to external memory) */
    size_t buffer_offs;       /* byte offset of data in buffer */
    size_t aux_bytes;         /* extra bytes after the data, saved for backward (e.g. LN stats) */
    struct sl_tensor *grad;   /* for params: the gradient leaf to accumulate into */
    uint32_t flags;
    int id;        /* index in its ctx */
    int order;     /* position in the graph's node list (-1: leaf / not in graph) */
    char name[64]; /* fits HF names such as model.layers.31.block_sparse_moe.experts.7.w1.weight */
} sl_tensor;

/* ---- metadata ---- */
int64_t sl_nelements(const sl_tensor *t);
/* A DROPOUT node's room for its mask as bits (Note [Hidden dropout bits], src/ops/build.c): the header, then
 * 128 bytes per 1,024-element chunk of its kernel's walk (a sequence shard walks ne[0] rows of chunks) */
static inline size_t sl_dropout_bits_bytes(const sl_tensor *t) {
    int64_t n = sl_nelements(t), rows = t->ndim >= 2 ? t->ne[0] : 1;
    return 32 + (size_t)((n + 1023) / 1024 + rows) * 128;
}
size_t sl_nbytes(const sl_tensor *t); /* of the logical elements if contiguous */
int sl_is_contiguous(const sl_tensor *t);
int sl_same_shape(const sl_tensor *a, const sl_tensor *b);

#ifdef __cplusplus
}
#endif
#endif
