/* Internal helpers shared by op builders and backward rules. */
#ifndef SL_OPS_INTERNAL_H
#define SL_OPS_INTERNAL_H
#include "suanli/ops.h"

/* b's shape broadcasts (right-aligned, dims equal or 1) to a's shape */
int sl_can_broadcast(const sl_tensor *b, const sl_tensor *a);

/* Append gradient contributions of node `n` (whose output gradient is `g`) to its sources.
 * `emit(src_index, contribution)` is called for each source that receives a gradient. */
typedef void (*sl_grad_emit)(void *state, sl_tensor *src, sl_tensor *contribution);
/* Note [Accumulating gradient writes]
 * A parameter's gradient is normally written as ACC(grad_leaf, contribution): the contribution is computed
 * into a planned temporary, then added in a second pass. When the contribution is a fresh f32 MATMUL of the
 * gradient's shape (a Linear layer's dW), sl_try_accumulate_into turns that node into
 * grad_leaf += op(A) @ op(B) (iparams[2] = 1: the GEMM runs with beta = 1; view_src = grad_leaf: the node is
 * in place on the leaf, like ACC), which saves the temporary and the extra pass over the gradient. Returns 1
 * if it did (the caller then uses `c` as the gradient write), 0 if `c` must be accumulated with ACC. `c`
 * must not be referenced by any other node (backward rules create dW only for the emit call). */
int sl_try_accumulate_into(sl_tensor *c, sl_tensor *dst);
/* Note [Rounded weight gradients]
 * Under autocast a half weight copy w16 = cast(w) takes a half gradient: the f32 product dW is rounded to
 * bf16, widened back and accumulated into w.grad (PyTorch: the bf16 GEMM's output, then ToCopyBackward and
 * AccumulateGrad). Built literally that is an f32 dW, its bf16 copy and an f32 copy before the ACC: for a
 * tied GPT-2 embedding 147 + 74 + 147 MiB at B4 T64, the peak of the whole step. Instead the CAST rule
 * marks the product iparams[SL_MATMUL_IP_ROUND] = SL_BF16 (tensor.h) and lets it accumulate into the gradient
 * (Note [Accumulating gradient writes]); the kernel rounds each block of the product to bf16 before it adds
 * it (matmul.c). The same bits as the three nodes. Autodiff defers pushing the gradient of a half cast of a
 * parameter until the CAST rule has run (a pushed node can no longer become an accumulating write). */

void sl_op_backward(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *needs_grad, sl_grad_emit emit,
                    void *state);
/* The tensor-parallel ops' backward rules (src/ops/build_tp.c): COLLECTIVE, CE_VP, CE_VP_STATS. */
void sl_op_backward_tp(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *needs_grad, sl_grad_emit emit,
                       void *state);
/* The MoE ops' backward rules (src/ops/moe_ops.c): 1 if n is one of them, else 0. */
int sl_moe_op_backward(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *needs_grad, sl_grad_emit emit,
                       void *state);
/* the MOE_EXPERT_FFN node: its row count from the route (El 0) or from the EP counts (El local experts) */
sl_tensor *sl_moe_expert_ffn_node(sl_ctx *ctx, sl_tensor *x, sl_tensor *w1, sl_tensor *w3, sl_tensor *w2,
                                  sl_tensor *count_src, int e, int El);
/* the expert-parallel ops (moe_ep_ops.c); the gradient of an EP all-to-all(v) node n */
int sl_moe_ep_op_backward(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *ng, sl_grad_emit emit,
                          void *st);
sl_tensor *sl_moe_ep_alltoallv_back(sl_ctx *ctx, sl_tensor *n, sl_tensor *g);
#endif
