/* CPU kernels, one per op. Each reads node->src[*]->data and writes node->data (already resolved by the
 * executor). Kernels that can fail on data (out-of-range ids) return a status. */
#ifndef SL_CPU_KERNELS_H
#define SL_CPU_KERNELS_H
#include "suanli/tensor.h"

/* A tensor's shape/strides padded to 5 dims (leading 1s), the common iteration form. */
typedef struct {
    int64_t ne[5], nb[5];
} sl_it5;
sl_it5 sl_it5_of(const sl_tensor *t);
/* b's strides as seen when broadcast to shape `out` (0 on broadcast dims). */
sl_it5 sl_it5_broadcast(const sl_tensor *b, const sl_tensor *out);

sl_status sl_k_cont(sl_tensor *n);
sl_status sl_k_cast(sl_tensor *n);
/* n contiguous floats to bf16 with the CAST kernel's rounding and threads (the same bits) */
void sl_k_cast_f32_bf16(const float *src, uint16_t *dst, int64_t n);
sl_status sl_k_add(sl_tensor *n);
sl_status sl_k_mul(sl_tensor *n);
sl_status sl_k_scale(sl_tensor *n);
sl_status sl_k_dropout(sl_tensor *n);
/* A dropout-carrying node's (DROPOUT, or the forward ATTENTION) p when it is on, else 0; with its Philox
 * key and high counter word (Note [Dropout from counters], src/ops/build.c). */
float sl_dropout_params(const sl_tensor *n, uint64_t *seed, uint64_t *ctr_hi);
/* Note [Dropout bits]
 * A forward node that draws a dropout mask may keep it as bits in its aux area for its backward: a 32-byte
 * header naming the mask (seed, stream and site, p, extent), written after the bits, then the bits (16
 * multipliers per uint16, bit k of word j for element 16 j + k). The backward reads them when the header
 * names its own mask and draws the mask again otherwise (another micro-batch's forward ran in between, or
 * the node ran with dropout off, which clears the header). The ATTENTION node (Note [Attention dropout
 * bits], suanli/tensor.h) and the DROPOUT node (Note [Hidden dropout bits], src/ops/build.c) use them. */
void sl_k_drop_header_set(void *hdr, uint64_t seed, uint64_t hi, float p, int64_t n, int valid);
int sl_k_drop_header_valid(const void *hdr, uint64_t seed, uint64_t hi, float p, int64_t n);
/* the multipliers mk[0 .. n) (keep or 0) as bits, and back (keep: the drawing's 1 / (1 - p)); per kernel ISA
 */
typedef void (*sl_bits_pack_fn)(const float *mk, int64_t n, uint16_t *bits);
typedef void (*sl_bits_unpack_fn)(const uint16_t *bits, int64_t n, float keep, float *mk);
sl_bits_pack_fn sl_k_bits_pack(int isa);
sl_bits_unpack_fn sl_k_bits_unpack(int isa);
sl_status sl_k_sum_to(sl_tensor *n);
sl_status sl_k_acc(sl_tensor *n);
sl_status sl_k_zeros(sl_tensor *n);
sl_status sl_k_scatter_add(sl_tensor *n);
sl_status sl_k_concat(sl_tensor *n);
sl_status sl_k_gelu(sl_tensor *n);
sl_status sl_k_gelu_back(sl_tensor *n);
sl_status sl_k_matmul(sl_tensor *n);
sl_status sl_k_layernorm(sl_tensor *n);
sl_status sl_k_layernorm_back_x(sl_tensor *n);
sl_status sl_k_layernorm_back_wb(sl_tensor *n);
sl_status sl_k_softmax(sl_tensor *n);
sl_status sl_k_softmax_back(sl_tensor *n);
sl_status sl_k_attention(sl_tensor *n);
sl_status sl_k_attention_back(sl_tensor *n);
sl_status sl_k_embedding(sl_tensor *n);
sl_status sl_k_embedding_back(sl_tensor *n);
sl_status sl_k_cross_entropy(sl_tensor *n);
sl_status sl_k_cross_entropy_back(sl_tensor *n);
/* tensor parallelism (tp_kernels.c) */
sl_status sl_k_embedding_shard(sl_tensor *n);
sl_status sl_k_embedding_back_shard(sl_tensor *n);
sl_status sl_k_ce_vp_stats(sl_tensor *n);
sl_status sl_k_ce_vp(sl_tensor *n);
sl_status sl_k_ce_vp_back(sl_tensor *n);
sl_status sl_k_fill(sl_tensor *n);

/* State kernels (optim.c): the CPU backend's adamw / sumsq / scale / fill members over host memory. */
#include "suanli/device.h"
void sl_k_adamw(float *p, const float *g, float *m, float *v, const sl_adamw_span *spans, int n_spans,
                float lr, float gscale, sl_adamw_hparams hp, int64_t t);
double sl_k_sumsq(const float *g, int64_t n);
void sl_k_scale_span(float *x, int64_t n, float s);
void sl_k_fill_span(float *x, int64_t n, float v);

/* Scalar reference kernels (the oracle of tests/ops/test_kernels_simd.c). sl_k_* above run SIMD bodies
 * (vec_kernels.h) for sl_kern_isa() and fall back to these for the scalar ISA or unusual layouts.
 * Attention's aux area holds the per-row logsumexp (B, NH, T) for both variants. */
sl_status sl_k_add_ref(sl_tensor *n);
sl_status sl_k_mul_ref(sl_tensor *n);
sl_status sl_k_sum_to_ref(sl_tensor *n);
sl_status sl_k_acc_ref(sl_tensor *n);
sl_status sl_k_gelu_ref(sl_tensor *n);
sl_status sl_k_gelu_back_ref(sl_tensor *n);
sl_status sl_k_layernorm_ref(sl_tensor *n);
sl_status sl_k_layernorm_back_x_ref(sl_tensor *n);
sl_status sl_k_layernorm_back_wb_ref(sl_tensor *n);
sl_status sl_k_softmax_ref(sl_tensor *n);
sl_status sl_k_softmax_back_ref(sl_tensor *n);
sl_status sl_k_attention_ref(sl_tensor *n);
sl_status sl_k_attention_back_ref(sl_tensor *n);
/* the eager half numerics (iparams[2] != 0): the reference's arithmetic, vectorized (attention.c) */
sl_status sl_k_attention_half(sl_tensor *n);
sl_status sl_k_attention_half_back(sl_tensor *n);
sl_status sl_k_embedding_back_ref(sl_tensor *n);
sl_status sl_k_cross_entropy_ref(sl_tensor *n);
/* logsumexp of each of N rows of V logits (scalar reference) */
void sl_k_lse_rows_ref(const float *logits, int64_t N, int64_t V, float *lse);
sl_status sl_k_cross_entropy_back_ref(sl_tensor *n);
#endif
