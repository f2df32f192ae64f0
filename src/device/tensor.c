/* Tensor metadata shared by every layer that reads nodes: dtype sizes and names, op names, shape helpers. */
#include "suanli/tensor.h"

static const size_t k_dtype_size[] = {4, 2, 4, 2};
static const char *const k_dtype_name[] = {"f32", "bf16", "i32", "f16"};
_Static_assert(sizeof(k_dtype_size) / sizeof(k_dtype_size[0]) == SL_DTYPE_COUNT, "dtype size table");
_Static_assert(sizeof(k_dtype_name) / sizeof(k_dtype_name[0]) == SL_DTYPE_COUNT, "dtype name table");

size_t sl_dtype_size(sl_dtype t) {
    SL_ASSERT((int)t >= 0 && t < SL_DTYPE_COUNT);
    return k_dtype_size[t];
}
const char *sl_dtype_name(sl_dtype t) { return ((int)t >= 0 && t < SL_DTYPE_COUNT) ? k_dtype_name[t] : "?"; }

static const char *const k_op_names[] = {
    "none",
    "view",
    "cont",
    "cast",
    "add",
    "mul",
    "scale",
    "sum_to",
    "acc",
    "zeros",
    "scatter_add",
    "matmul",
    "gelu",
    "gelu_back",
    "layernorm",
    "layernorm_back_x",
    "layernorm_back_wb",
    "softmax",
    "softmax_back",
    "attention",
    "attention_back",
    "embedding",
    "embedding_back",
    "cross_entropy",
    "cross_entropy_back",
    "concat",
    "rmsnorm",
    "rmsnorm_back_x",
    "rmsnorm_back_w",
    "rope",
    "silu",
    "silu_back",
    "topk_gate",
    "topk_gate_back",
    "attention_kv",
    "kv_store",
    "linear_bf16",
    "moe_expert",
    "fill",
    "collective",
    "ce_vp_stats",
    "ce_vp",
    "ce_vp_back",
    "moe_route",
    "moe_route_back",
    "moe_router_loss",
    "moe_router_loss_back",
    "moe_gather",
    "moe_combine",
    "moe_combine_back_gate",
    "moe_expert_ffn",
    "moe_expert_ffn_back",
    "moe_expert_ffn_back_x",
    "moe_ep_counts",
    "moe_ep_pack",
    "moe_ep_unpack",
    "moe_ep_unpack_back_gate",
    "moe_ep_gather",
    "moe_ep_scatter",
    "dropout",
    "moe_packed_ffn",
    "moe_packed_ffn_back",
    "moe_packed_ffn_back_w",
    "moe_packed_ffn_dx",
    "moe_ep_regroup",
};
_Static_assert(sizeof(k_op_names) / sizeof(k_op_names[0]) == SL_OP_COUNT, "op name table out of sync");

const char *sl_op_name(sl_op op) { return ((int)op >= 0 && op < SL_OP_COUNT) ? k_op_names[op] : "?"; }

int64_t sl_nelements(const sl_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->ne[d];
    return n;
}

size_t sl_nbytes(const sl_tensor *t) { return (size_t)sl_nelements(t) * sl_dtype_size(t->dtype); }

int sl_is_contiguous(const sl_tensor *t) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->ne[d] != 1 && t->nb[d] != s) return 0;
        s *= t->ne[d];
    }
    return 1;
}

int sl_same_shape(const sl_tensor *a, const sl_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->ne[d] != b->ne[d]) return 0;
    return 1;
}
