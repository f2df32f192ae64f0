/* Shared between the Llama-family builder (llama.c) and its mixture-of-experts layers (moe.c). */
#ifndef SL_NN_LLAMA_INTERNAL_H
#define SL_NN_LLAMA_INTERNAL_H
#include "suanli/nn.h"

typedef struct {
    sl_model *m;
    int cap;
    int tdim, tpack; /* TP split of the next add_param (Note [TP shard layout]); tdim -1: replicated */
    int tparts;      /* of the next add_param: > 0 splits into that many parts (replicated kv heads) */
    int f32;         /* the next add_param keeps its fp32 values in a bf16 model (sl_param_info.keep_f32) */
} sl_llama_builder;

/* a parameter leaf in the flat buffer (bf16 when the model's weights are and it is a 2-D matrix) */
void sl_llama_add_param(sl_llama_builder *b, int decay, int init, int ndim, const int64_t *ne,
                        const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* the parameter named by fmt (asserts it exists) */
sl_tensor *sl_llama_W(sl_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* the autocast dtype of a training model: SL_BF16 (compute_dtype SL_BF16 or autocast_bf16), SL_F16, or
 * SL_F32 (off) */
sl_dtype sl_llama_autocast(const sl_model *m);
sl_tensor *sl_llama_rnd(sl_model *m, sl_tensor *x); /* bf16 rounding where the model's numerics round */
sl_tensor *sl_llama_lin(sl_model *m, sl_tensor *x, sl_tensor *w, sl_tensor *b);
/* 1 when sl_llama_lin runs x w^T on the bf16 GEMM with the fused weight cast (Note [bf16 GEMMs under
 * autocast]): bf16 autocast, a backend with caps.matmul_half_b, a contiguous 2-D f32 weight */
int sl_llama_bf16_gemm(const sl_model *m, const sl_tensor *w);
/* Megatron's f (identity forward, all-reduce of the gradient) and g (all-reduce forward) over the TP group,
 * with the fp16 roundings of Note [Half sums across TP ranks] (src/nn/gpt2.c) */
sl_tensor *sl_llama_tp_f(sl_model *m, sl_tensor *x);
sl_tensor *sl_llama_tp_g(sl_model *m, sl_tensor *x);
sl_tensor *sl_llama_swiglu(sl_model *m, sl_tensor *h, sl_tensor *wg, sl_tensor *wu, sl_tensor *wd);

/* ---- moe.c ---- */
int sl_arch_is_moe(sl_arch a);
int sl_moe_layer_is_sparse(const sl_llama_config *c, int l);
int sl_moe_backend_ok(const sl_model *m);
/* the half dtype of the routed experts under autocast: SL_F32 unless SUANLI_MOE_HALF_EXPERTS=1 (Note
 * [Experts under autocast] in moe.c) */
sl_dtype sl_moe_experts_half(const sl_model *m);
sl_status sl_moe_check_cfg(const sl_llama_config *c);
void sl_moe_add_params(sl_llama_builder *b, int l); /* Qwen2-MoE / DeepSeek-V3 sparse layer l */
/* h (B, T, C) -> (B, T, C): routed experts (+ shared experts) of layer l */
sl_tensor *sl_moe_ffn(sl_model *m, sl_tensor *h, int l);
/* loss + every router-loss node created on m->ctx since mark (loss NULL: their sum; NULL if none) */
sl_tensor *sl_moe_add_router_losses(sl_model *m, int mark, sl_tensor *loss);
#endif
