/* Internal helpers shared by op builders and backward rules. */
#ifndef SL_OPS_INTERNAL_H
#define SL_OPS_INTERNAL_H
#include "suanli/graph.h"

/* b's shape broadcasts (right-aligned, dims equal or 1) to a's shape */
int sl_can_broadcast(const sl_tensor *b, const sl_tensor *a);

/* Append gradient contributions of node `n` (whose output gradient is `g`) to its sources.
 * `emit(src_index, contribution)` is called for each source that receives a gradient. */
typedef void (*sl_grad_emit)(void *state, sl_tensor *src, sl_tensor *contribution);
void sl_op_backward(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *needs_grad, sl_grad_emit emit,
                    void *state);
#endif
