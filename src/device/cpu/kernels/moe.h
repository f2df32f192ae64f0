/* Mixture-of-experts CPU kernels (src/device/cpu/kernels/moe.c). */
#ifndef SL_CPU_MOE_H
#define SL_CPU_MOE_H
#include "suanli/tensor.h"

sl_status sl_k_moe_route(sl_tensor *n);
sl_status sl_k_moe_route_back(sl_tensor *n);
sl_status sl_k_moe_router_loss(sl_tensor *n);
sl_status sl_k_moe_router_loss_back(sl_tensor *n);
sl_status sl_k_moe_gather(sl_tensor *n);
sl_status sl_k_moe_combine(sl_tensor *n);
sl_status sl_k_moe_combine_back_gate(sl_tensor *n);
sl_status sl_k_moe_expert_ffn(sl_tensor *n);
sl_status sl_k_moe_expert_ffn_back(sl_tensor *n);
sl_status sl_k_moe_expert_ffn_back_x(sl_tensor *n);
/* expert parallelism (moe_ep.c) */
sl_status sl_k_moe_ep_counts(sl_tensor *n);
sl_status sl_k_moe_ep_pack(sl_tensor *n);
sl_status sl_k_moe_ep_unpack(sl_tensor *n);
sl_status sl_k_moe_ep_unpack_back_gate(sl_tensor *n);
sl_status sl_k_moe_ep_gather(sl_tensor *n);
sl_status sl_k_moe_ep_scatter(sl_tensor *n);
/* packed experts (moe_packed.c, Note [Packed experts]) */
sl_status sl_k_moe_packed_ffn(sl_tensor *n);
sl_status sl_k_moe_packed_ffn_back(sl_tensor *n);
sl_status sl_k_moe_packed_ffn_back_w(sl_tensor *n);
sl_status sl_k_moe_packed_ffn_dx(sl_tensor *n);
sl_status sl_k_moe_ep_regroup(sl_tensor *n);
/* rows received for local expert l of El (the sum of its rcnt blocks); -1 when a count is not a whole number
 * in [0, rows] */
int64_t sl_k_moe_ep_expert_count(const sl_tensor *rcnt, int El, int l, int64_t rows);
#endif
