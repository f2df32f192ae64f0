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
#include "suanli/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- graph ---- */

sl_graph *sl_graph_new(sl_ctx *ctx);
void sl_graph_free(sl_graph *g);
/* Append `out` and everything it depends on (topological order, each node once). */
void sl_graph_build_forward(sl_graph *g, sl_tensor *out);
/* Append gradient nodes: seeds d(loss) = `loss_scale` and accumulates each parameter's gradient
 * into p->grad (which must be set: a leaf bound to the flat gradient buffer). */
void sl_graph_build_backward(sl_graph *g, sl_tensor *loss, float loss_scale);
/* Full activation recomputation for the backward built next (Megatron's --recompute-granularity full):
 * the forward nodes between two SL_FLAG_LAYER_IO tensors are computed again, from the kept layer input,
 * right before the backward needs them, and the forward's copies die in the forward (Note [Full
 * recomputation], src/graph/autodiff.c). Megatron's --recompute-method: UNIFORM checkpoints every
 * num_layers layers (the group recomputed as one), BLOCK recomputes the first num_layers layers (of a
 * pipeline stage) and keeps the rest. SL_RECOMPUTE_NONE (the default): nothing. num_layers < 1: 1. */
enum { SL_RECOMPUTE_NONE, SL_RECOMPUTE_UNIFORM, SL_RECOMPUTE_BLOCK };
void sl_graph_set_recompute(sl_graph *g, int method, int num_layers);
/* The same from an arbitrary output seeded by the caller's leaf `seed` (shape of out): a pipeline
 * stage's backward from the gradient of its output activations. `extra` (NULL: none), a scalar of the
 * forward graph that enters the model's loss on another stage (its MoE router losses), is a second root
 * seeded with d = extra_scale by a FILL node (sl_graph_grad_of(g, extra); its fparams[0] can change). */
void sl_graph_build_backward_seeded(sl_graph *g, sl_tensor *out, sl_tensor *seed, sl_tensor *extra,
                                    float extra_scale);
int sl_graph_n_nodes(const sl_graph *g);
sl_tensor *sl_graph_node(sl_graph *g, int i);
/* The gradient node of t computed by backward (NULL if none). */
sl_tensor *sl_graph_grad_of(sl_graph *g, const sl_tensor *t);
/* Index of the last node that writes into param p's gradient (-1 if none): DP bucket readiness. */
int sl_graph_last_grad_write(sl_graph *g, const sl_tensor *p);
/* Note [Splitting the backward] (src/graph/graph.c): reorders the backward nodes [start, n) into B, the
 * nodes the gradient leaf `leaf` depends on (a pipeline stage's input gradient), then W, the rest (the
 * parameters' gradients), each in its old order, and returns the index of W's first node (start when leaf
 * is NULL: everything is W). Before sl_graph_plan. -1 (nothing changed) when an in-place write would move
 * across a read of the same storage. */
int sl_graph_split_backward(sl_graph *g, int start, const sl_tensor *leaf);
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
/* Dropout on (training micro-batch `stream` of the run seeded `seed`) or off (evaluation) for every
 * DROPOUT node and dropout-carrying ATTENTION node of g (Note [Dropout from counters], src/ops/build.c).
 * Returns the number of such nodes. */
int sl_graph_set_dropout(sl_graph *g, int on, uint64_t seed, uint64_t stream);

typedef struct sl_plan_stats {
    size_t
        planned_bytes; /* arena size after liveness reuse (the reserved rows' and scratch regions included) */
    size_t cap_bytes;  /* of which the reserved rows' region (Note [Reserved rows], src/graph/graph.c) */
    size_t scratch_bytes; /* of which the shared scratch region (Note [Shared scratch], src/graph/graph.c) */
    size_t naive_bytes;   /* sum of all intermediate allocations */
    int n_allocs;
} sl_plan_stats;
/* Assign activation memory by liveness and allocate one arena on `be`. */
sl_status sl_graph_plan(sl_graph *g, sl_backend *be, sl_plan_stats *stats);
/* The pass sl_graph_plan runs first: CAST(f32 -> bf16) nodes whose source (GELU, GELU_BACK, LAYERNORM) only
 * they read become views of that source, which writes bf16 itself where the backend supports it (Note [Half
 * outputs], src/graph/fuse.c). Returns the number of casts removed; SUANLI_FUSE=0: none. */
int sl_graph_fuse_half_outputs(sl_graph *g, sl_backend *be);
/* The planned arena's size, and moving it into caller memory (host-visible backends; e.g. a communicator
 * window, so collectives on activations read peers' memory in place): `host` (>= that size) must outlive
 * the graph's use; the graph frees only its own wrapper. Before the next sl_graph_compute from node 0. */
size_t sl_graph_arena_bytes(const sl_graph *g);
sl_status sl_graph_move_arena(sl_graph *g, void *host, size_t bytes);
/* Note [Shared scratch] (src/graph/graph.c): a graph run in phases (node ranges [0, ends[0]), [ends[0],
 * ends[1]), ...; ends[n - 1] = the node count at plan time) between which other graphs run, as a pipeline
 * slot's forward, backward and weight-gradient units. Set before sl_graph_plan: storages that live within
 * one phase are planned in a scratch region the caller allocates once (sl_graph_scratch_bytes, the largest
 * over its graphs) and binds to every graph that runs interleaved with this one; only storages that cross a
 * phase boundary (and outputs) stay in the graph's own arena. n <= SL_GRAPH_MAX_PHASES; n = 0: one arena.
 * SUANLI_PLAN_SCRATCH=0 ignores the phases (A/B). */
#define SL_GRAPH_MAX_PHASES 4
void sl_graph_set_phases(sl_graph *g, const int *ends, int n);
size_t sl_graph_scratch_bytes(const sl_graph *g);
/* Binds (borrows) a buffer of at least sl_graph_scratch_bytes on the graph's backend; before the next
 * compute from node 0. A graph with a scratch region refuses to compute until one is bound. */
sl_status sl_graph_bind_scratch(sl_graph *g, sl_buffer *buf);
/* The reserved rows' region (Note [Reserved rows]): its planned bytes, and how many of them are resident
 * (pages touched so far; the planned size where the region is not reserved address space) */
size_t sl_graph_cap_bytes(const sl_graph *g);
size_t sl_graph_cap_resident(const sl_graph *g);
/* The collective provider runs COLLECTIVE nodes (Note [Tensor-parallel graphs], src/ops/build_tp.c) in
 * place of the backend: it reads node->src[0] and writes node (both host-visible memory) by the kinds in
 * node->iparams. A graph with COLLECTIVE nodes and no provider fails to compute with a clear error. */
typedef sl_status (*sl_collective_fn)(void *user, sl_tensor *node);
void sl_graph_set_collective(sl_graph *g, sl_collective_fn fn, void *user);
/* Run all nodes (after sl_graph_plan and binding of every leaf). */
sl_status sl_graph_compute(sl_graph *g, sl_node_hook hook, void *user);
/* Run nodes [start, end). */
sl_status sl_graph_compute_range(sl_graph *g, int start, int end, sl_node_hook hook, void *user);
/* 1 when the executor can run node n on be: be supports it, or SUANLI_HOST_FALLBACK=1 lets the CPU run it
 * on copies of its operands (Note [Host fallback], src/graph/host_fallback.c) */
int sl_graph_can_run(sl_backend *be, const sl_tensor *n);
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
