/* Predicates shared by the accelerator backends (accel_support.h). */
#include "device/accel_support.h"

#include <math.h>
#include <string.h>

int sl_accel_last_unit(const sl_tensor *t) { return t && t->ndim >= 1 && t->nb[t->ndim - 1] == 1; }

int sl_accel_all_f32(const sl_tensor *n) {
    if (n->dtype != SL_F32) return 0;
    for (int i = 0; i < SL_MAX_SRC; i++)
        if (n->src[i] && n->src[i]->dtype != SL_F32) return 0;
    return 1;
}

/* f32 tensors except for the listed source, which must be i32 */
static int f32_but_i32(const sl_tensor *n, int isrc) {
    if (n->dtype != SL_F32) return 0;
    for (int i = 0; i < SL_MAX_SRC; i++) {
        const sl_tensor *s = n->src[i];
        if (s && s->dtype != (i == isrc ? SL_I32 : SL_F32)) return 0;
    }
    return 1;
}

static int movable(sl_dtype t) { return t == SL_F32 || t == SL_I32 || t == SL_BF16; }

#define last_unit sl_accel_last_unit
#define all_f32 sl_accel_all_f32

/* Note [Accelerator supported ops]
 * Every op of GPT-2 and Llama-family training (sliding-window attention included) and of KV-cache
 * generation in f32; data movement (CONT, CONCAT, ZEROS) in f32 / i32 / bf16 and CAST between f32 and bf16
 * (elementwise conversions, used by the autocast rounding sl_round_bf16). Refused, so the executor names
 * the op and dtype: bf16 / f16 compute (a backend adds its own GEMMs: Note [CUDA supported ops], Note
 * [OpenCL bf16 GEMM]), the half-numerics variants of ATTENTION_KV / MOE_EXPERT, MoE routing, and, unless the
 * backend asks for them with sl_accel_supports_ex, dropout (SL_ACCEL_DROPOUT: the backend draws the masks,
 * Note [OpenCL dropout], Note [CUDA dropout]), the vocab-sharded ops of tensor parallelism
 * (SL_ACCEL_VOCAB_SHARD), f16 storage (SL_ACCEL_F16_STORAGE) and the half numerics of ATTENTION and ROPE
 * (SL_ACCEL_HALF_NUMERICS). The OpenCL and the CUDA backend ask for all four, so the rules live here once.
 * Layout limits are those of the CPU kernels (rows with a unit last stride). */
int sl_accel_supports(const sl_tensor *n) { return sl_accel_supports_ex(n, 0); }

int sl_accel_supports_ex(const sl_tensor *n, int extra) {
    const sl_tensor *a = n->src[0], *b = n->src[1];
    const int dropout = extra & SL_ACCEL_DROPOUT, vocab = (extra & SL_ACCEL_VOCAB_SHARD) != 0,
              f16 = (extra & SL_ACCEL_F16_STORAGE) != 0, half = (extra & SL_ACCEL_HALF_NUMERICS) != 0;
    switch (n->op) {
    case SL_OP_VIEW:
        return 1;
    case SL_OP_CONT:
    case SL_OP_ZEROS:
        return (movable(n->dtype) || (f16 && n->dtype == SL_F16)) &&
               (!a || a->dtype == n->dtype || n->op == SL_OP_ZEROS);
    case SL_OP_CONCAT:
        return (movable(n->dtype) || (f16 && n->dtype == SL_F16)) && a->dtype == n->dtype &&
               b->dtype == n->dtype;
    case SL_OP_CAST: /* f32 <-> bf16, and f32 <-> f16 with f16 storage */
        if (f16 && ((n->dtype == SL_F16 && a->dtype == SL_F32) || (n->dtype == SL_F32 && a->dtype == SL_F16)))
            return 1;
        return (n->dtype == SL_F32 || n->dtype == SL_BF16) && (a->dtype == SL_F32 || a->dtype == SL_BF16);
    case SL_OP_ADD:
    case SL_OP_MUL:
    case SL_OP_SCALE:
    case SL_OP_SUM_TO:
    case SL_OP_ACC:
    case SL_OP_SCATTER_ADD:
    case SL_OP_GELU:
    case SL_OP_GELU_BACK:
    case SL_OP_SILU:
    case SL_OP_SILU_BACK:
    case SL_OP_FILL:
    case SL_OP_KV_STORE:
        return all_f32(n);
    case SL_OP_MATMUL:
        return all_f32(n) && !n->iparams[SL_MATMUL_IP_ROUND] && a->ndim >= 2 && b->ndim >= 2 &&
               n->ndim >= 2 && last_unit(a) && last_unit(b) && last_unit(n) &&
               (!n->src[2] || sl_is_contiguous(n->src[2]));
    case SL_OP_LAYERNORM:
    case SL_OP_RMSNORM:
    case SL_OP_SOFTMAX:
    case SL_OP_TOPK_GATE:
        return all_f32(n) && last_unit(a);
    case SL_OP_LAYERNORM_BACK_X:
    case SL_OP_RMSNORM_BACK_X:
        return all_f32(n) && last_unit(n->src[1]) && last_unit(n->src[3]);
    case SL_OP_LAYERNORM_BACK_WB:
    case SL_OP_RMSNORM_BACK_W:
        return all_f32(n) && last_unit(n->src[1]) && last_unit(n->src[2]);
    case SL_OP_SOFTMAX_BACK:
    case SL_OP_TOPK_GATE_BACK:
        return all_f32(n) && sl_is_contiguous(a) && last_unit(b);
    case SL_OP_ATTENTION: /* sliding window (iparams[1]) too; the eager half numerics (iparams[2] 1-4) and
                             dropout (fparams[0]) where the backend asks for them */
        if (half && n->iparams[2] >= 1 && n->iparams[2] <= 4)
            return all_f32(n) && last_unit(a) && last_unit(b) && last_unit(n->src[2]);
        return all_f32(n) && !n->iparams[2] && (dropout || !(n->fparams[0] > 0)) && last_unit(a) &&
               last_unit(b) && last_unit(n->src[2]);
    case SL_OP_ATTENTION_BACK:
        if (half && a->iparams[2] >= 1 && a->iparams[2] <= 4)
            return all_f32(n) && last_unit(b) && last_unit(n->src[2]) && last_unit(n->src[3]) &&
                   last_unit(n->src[4]) && n->src[4]->ndim >= 3;
        return all_f32(n) && !a->iparams[2] && (dropout || !(a->fparams[0] > 0)) && last_unit(b) &&
               last_unit(n->src[2]) && last_unit(n->src[3]) && last_unit(n->src[4]) && n->src[4]->ndim >= 3;
    case SL_OP_DROPOUT: /* f32 (no half output), contiguous, a residual of the same size */
        return dropout && all_f32(n) && sl_is_contiguous(n) && sl_is_contiguous(a) &&
               sl_nelements(a) == sl_nelements(n) &&
               (!b || (sl_is_contiguous(b) && sl_nelements(b) == sl_nelements(n)));
    case SL_OP_ATTENTION_KV:
        return all_f32(n) && !n->iparams[2] && last_unit(a) && sl_is_contiguous(b) &&
               sl_is_contiguous(n->src[2]);
    case SL_OP_EMBEDDING: /* a vocab shard (iparams[3]) where the backend asks for it */
        return f32_but_i32(n, 1) && (vocab || !n->iparams[3]) && sl_is_contiguous(a) && sl_is_contiguous(b);
    case SL_OP_EMBEDDING_BACK:
        return f32_but_i32(n, 1) && (vocab || !n->iparams[3]) && sl_is_contiguous(a) && sl_is_contiguous(b) &&
               sl_is_contiguous(n->src[2]);
    case SL_OP_CE_VP_STATS:
        return vocab && f32_but_i32(n, 1) && sl_is_contiguous(a) && sl_is_contiguous(b);
    case SL_OP_CE_VP:
        return vocab && f32_but_i32(n, 1) && sl_is_contiguous(b) && sl_is_contiguous(n->src[2]);
    case SL_OP_CE_VP_BACK:
        return vocab && f32_but_i32(n, 2) && sl_is_contiguous(b) && sl_is_contiguous(n->src[2]);
    case SL_OP_CROSS_ENTROPY:
        return f32_but_i32(n, 1) && sl_is_contiguous(a) && sl_is_contiguous(b);
    case SL_OP_CROSS_ENTROPY_BACK:
        return f32_but_i32(n, 2) && sl_is_contiguous(b) && sl_is_contiguous(n->src[2]);
    case SL_OP_ROPE: /* the half numerics (iparams[2] 1-6) where the backend asks for them */
        return all_f32(n) && (half ? n->iparams[2] >= 0 && n->iparams[2] <= 6 : !n->iparams[2]) &&
               last_unit(a) && a->ndim == 4;
    case SL_OP_MOE_EXPERT:
        if (!all_f32(n) || n->iparams[1] || !sl_is_contiguous(a) || !last_unit(b)) return 0;
        for (int i = 2; i < 5; i++)
            if (!sl_is_contiguous(n->src[i])) return 0;
        return 1;
    default:
        return 0;
    }
}

sl_accel_dropout sl_accel_dropout_of(const sl_tensor *n) {
    sl_accel_dropout d;
    memset(&d, 0, sizeof d);
    const int32_t *ip = n->iparams;
    d.keep = 1.0f;
    if (!ip[SL_DROPOUT_IP_ON] || !(n->fparams[0] > 0)) return d;
    float p = n->fparams[0];
    uint64_t stream = (uint64_t)(uint32_t)ip[SL_DROPOUT_IP_STREAM_LO] |
                      (uint64_t)(uint32_t)ip[SL_DROPOUT_IP_STREAM_HI] << 32;
    d.on = 1;
    d.seed = (uint64_t)(uint32_t)ip[SL_DROPOUT_IP_SEED_LO] | (uint64_t)(uint32_t)ip[SL_DROPOUT_IP_SEED_HI]
                                                                 << 32;
    d.hi = sl_dropout_ctr_hi(stream, ip[SL_DROPOUT_IP_SITE]);
    d.thr = sl_dropout_threshold(p);
    d.keep = (float)(1.0 / (1.0 - (double)p));
    if (n->op == SL_OP_ATTENTION) {
        d.heads = ip[SL_DROPOUT_IP_HEADS] > 0 ? ip[SL_DROPOUT_IP_HEADS] : n->src[0]->ne[2];
        d.head0 = ip[SL_DROPOUT_IP_HEAD0];
    } else {
        d.seq = ip[SL_DROPOUT_IP_SEQ];
        d.t0 = ip[SL_DROPOUT_IP_T0];
    }
    return d;
}

int sl_accel_span_ok(const sl_buffer *b, int64_t off, int64_t n) {
    return b && off >= 0 && n >= 0 && (size_t)(off + n) * sizeof(float) <= b->size;
}

sl_status sl_accel_adamw_check(const sl_adamw_call *c, const char *backend) {
    for (int i = 0; i < c->n_spans; i++) {
        const sl_adamw_span *s = &c->spans[i];
        if (!sl_accel_span_ok(c->p, s->p_offs, s->n) || !sl_accel_span_ok(c->g, s->g_offs, s->n) ||
            !sl_accel_span_ok(c->m, s->s_offs, s->n) || !sl_accel_span_ok(c->v, s->s_offs, s->n))
            return sl_fail(SL_ERR_INVALID, "%s backend: adamw span %d out of range", backend, i);
    }
    return SL_OK;
}

sl_accel_adamw_consts sl_accel_adamw_consts_of(const sl_adamw_call *c) {
    double bc1 = 1.0 - pow((double)c->hp.beta1, (double)c->t),
           bc2 = 1.0 - pow((double)c->hp.beta2, (double)c->t);
    sl_accel_adamw_consts k = {(float)(c->lr / bc1), (float)sqrt(bc2), 1.0f - c->lr * c->hp.weight_decay};
    return k;
}
