/* Llama-family CPU kernels (src/device/cpu/kernels/llama_ops.c). */
#ifndef SL_CPU_LLAMA_OPS_H
#define SL_CPU_LLAMA_OPS_H
#include "suanli/tensor.h"

sl_status sl_k_rmsnorm(sl_tensor *n);
sl_status sl_k_rmsnorm_back_x(sl_tensor *n);
sl_status sl_k_rmsnorm_back_w(sl_tensor *n);
sl_status sl_k_rope(sl_tensor *n);
sl_status sl_k_silu(sl_tensor *n);
sl_status sl_k_silu_back(sl_tensor *n);
sl_status sl_k_topk_gate(sl_tensor *n);
sl_status sl_k_topk_gate_back(sl_tensor *n);
sl_status sl_k_attention_kv(sl_tensor *n);
sl_status sl_k_kv_store(sl_tensor *n);
sl_status sl_k_linear_bf16(sl_tensor *n);
sl_status sl_k_moe_expert(sl_tensor *n);
#endif
