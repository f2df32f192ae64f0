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
#endif
