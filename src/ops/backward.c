/* Backward rules: for each op, the gradient of each source expressed with other ops.
 * VIEW is handled by the autodiff driver (src/graph/autodiff.c) because its gradient is a scatter
 * into an accumulator owned by the driver. */
#include <string.h>

#include "ops/ops_internal.h"

static sl_tensor *as_2d_rows(sl_ctx *ctx, sl_tensor *a) {
    /* fold leading dims of a (rows uniformly strided) into one: (M, K) view */
    int64_t M = 1;
    for (int d = 0; d < a->ndim - 1; d++) M *= a->ne[d];
    int64_t ne[2] = {M, a->ne[a->ndim - 1]}, nb[2] = {a->ndim >= 2 ? a->nb[a->ndim - 2] : a->ne[0], 1};
    return sl_view(ctx, a, 2, ne, nb, 0);
}

static sl_tensor *reshape_like(sl_ctx *ctx, sl_tensor *g, const sl_tensor *like) {
    if (sl_same_shape(g, like)) return g;
    if (!sl_is_contiguous(g)) g = sl_cont(ctx, g);
    return sl_reshape(ctx, g, like->ndim, like->ne);
}

static sl_tensor *new_backward_op(sl_ctx *ctx, sl_op op, const sl_tensor *like) {
    return sl_new_op(ctx, op, SL_F32, like->ndim, like->ne);
}

/* Note [Recomputed GELU]
 * The weight gradient of the MLP's down projection needs its input h = gelu(x) (or h rounded to a half
 * type, cast(gelu(x))), and GELU's own backward needs x. Keeping both costs a 4C-wide activation twice
 * per layer; as llm.c does, backward recomputes h from x right before the dW GEMM instead, so forward's h
 * dies after forward's GEMM. The recomputed node runs the same kernel on the same input: the same bits.
 * It costs one GELU per layer and step (under 1 % of GPT-2 124M's step) and saves L * B * T * 4C floats
 * (36 MiB at B4 T64; bench/act_memory.sh). Under autocast the dW GEMM's operand is forward's bf16 copy
 * cast(gelu(x)), which fc2's forward GEMM made anyway: keeping it costs half as much (L * B * T * 4C bf16
 * values, 18 MiB at B4 T64), and recomputing it two passes (the GELU and the cast, 1.5 % of the bf16
 * step on Zen 4), so a half-type h is kept. */
static sl_tensor *recompute_gelu(sl_ctx *ctx, sl_tensor *a) {
    if (a->op != SL_OP_GELU || a->src[0]->op == SL_OP_NONE) return a; /* a cast(gelu) is kept */
    if (a->flags & SL_FLAG_RECOMPUTED) return a; /* computed for the backward already (full recomputation) */
    sl_tensor *r = sl_gelu(ctx, a->src[0]);
    memcpy(r->iparams, a->iparams, sizeof r->iparams);
    memcpy(r->fparams, a->fparams, sizeof r->fparams);
    sl_set_name(r, "gelu_recomputed");
    return r;
}

/* Note [Recomputed weight casts]
 * Under autocast each weight enters its GEMM as a bf16 copy cast(w). Kept from forward to backward the
 * copies of every layer are alive at once (GPT-2 124M: 225 MiB, more than all other activations at B4
 * T64). Backward casts the weight again right before the GEMM that needs it, so each forward copy dies
 * after its forward GEMM. The recast reads the same f32 weight with the same kernel: the same bits. It
 * costs one more pass over the weights per step. */
static sl_tensor *recompute_cast(sl_ctx *ctx, sl_tensor *x) {
    if (x->op != SL_OP_CAST || x->dtype != SL_BF16 || x->src[0]->op != SL_OP_NONE ||
        !(x->src[0]->flags & SL_FLAG_PARAM) || !sl_is_contiguous(x) || !sl_is_contiguous(x->src[0]) ||
        (x->flags & SL_FLAG_RECOMPUTED))
        return x;
    return sl_set_name(sl_cast(ctx, x->src[0], x->dtype), "%s_recast", x->src[0]->name);
}

/* Note [Fused weight casts]
 * Under bf16 autocast each Linear reads cast(w): forward casts the f32 weight into a bf16 copy and backward
 * casts it again (Note [Recomputed weight casts]), two passes that read 4 and write 2 bytes per parameter
 * for GEMMs that then read the copy. On GPT-2 124M at B4 T64 with AMX GEMMs those casts were 16 % of the
 * step. Where the backend says it can (caps.matmul_half_b: the CPU; OpenCL's register GEMM, Note [OpenCL
 * fused weight casts] in src/device/opencl/kernels/gemm_reg.cl), the model builds the Linear as one
 * MATMUL of the bf16 input and the f32 weight marked iparams[SL_MATMUL_IP_HALF_B] = SL_BF16
 * (sl_linear_half_w): the GEMM rounds the weight as it packs it (sl_gemm_bf16_f32b; the AMX and AVX512_BF16
 * packers read fp32 (Note [Fused weight casts on AVX512_BF16], gemm_avx512_bf16.inc), the other kernels
 * round a chunk into a buffer), so neither copy exists. The backward rule gives
 * dA = G @ w through the same fused product and dW the cast's gradient: the f32 product rounded to bf16 as
 * it accumulates (Note [Rounded weight gradients]). Each cast(w) fed one GEMM, so the values are bitwise
 * those of the cast nodes (test_fused_cast). SUANLI_FUSED_WEIGHT_CAST=0 builds the casts (A/B). */

/* the matmul rule: dA, dB (A folded to rows for a 2-D B), the fused bias */
static void matmul_backward(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *ng, sl_grad_emit emit,
                            void *st) {
    sl_tensor *a = n->src[0], *b = n->src[1];
    int tA = n->iparams[0], tB = n->iparams[1];
    int half_b = n->iparams[SL_MATMUL_IP_HALF_B] == SL_BF16; /* Note [Fused weight casts] */
    sl_tensor *G;
    int folded = (b->ndim == 2 && a->ndim > 2);
    /* Note [Rounded Linear outputs] (gemm.c): a product rounded to bf16 stands for autocast's bf16 output,
     * whose gradient is bf16: g rounded once (the two casts the round trip's own backward made, without the
     * third the GEMMs then made of the same values); the bias sums that bf16 gradient, widening each value
     * as it adds (sl_sum_to of a bf16 tensor: the widened copy it once read cost a pass, 1-2 % of the small
     * model's bf16 step) */
    if (half_b && n->iparams[SL_MATMUL_IP_ROUND] == SL_BF16 && !n->iparams[2] && g->dtype == SL_F32) {
        sl_tensor *gb = sl_cast(ctx, g, SL_BF16); /* a is bf16 (half_b): what the GEMMs take */
        if (n->src[2] && ng[2])
            g = sl_is_contiguous(gb) && n->src[2]->ndim == 1 ? gb : sl_cast(ctx, gb, SL_F32);
        G = folded ? as_2d_rows(ctx, gb) : gb;
    } else {
        G = folded ? as_2d_rows(ctx, g) : g;
    }
    sl_tensor *A = folded ? as_2d_rows(ctx, a) : a;
    /* half (bf16/f16) operands: the gradient enters the GEMMs rounded to that dtype (products stay f32)
     */
    if ((a->dtype == SL_BF16 || a->dtype == SL_F16) && G->dtype != a->dtype) G = sl_cast(ctx, G, a->dtype);
    if (ng[0] && half_b) {
        emit(st, a, reshape_like(ctx, sl_matmul_half_b(ctx, G, b, 0, tB ? 0 : 1), a));
    } else if (ng[0]) {
        sl_tensor *dA;
        sl_tensor *bw = recompute_cast(ctx, b); /* Note [Recomputed weight casts] */
        if (!tA)
            dA = tB ? sl_matmul(ctx, G, bw, 0, 0) : sl_matmul(ctx, G, bw, 0, 1);
        else
            dA = tB ? sl_matmul(ctx, bw, G, 1, 1) : sl_matmul(ctx, bw, G, 0, 1);
        emit(st, a, reshape_like(ctx, dA, a));
    }
    if (ng[1]) {
        sl_tensor *dB;
        sl_tensor *h = recompute_gelu(ctx, a); /* Note [Recomputed GELU] */
        if (h != a) A = folded ? as_2d_rows(ctx, h) : h;
        if (!tA)
            dB = tB ? sl_matmul(ctx, G, A, 1, 0) : sl_matmul(ctx, A, G, 1, 0);
        else
            dB = tB ? sl_matmul(ctx, G, A, 1, 1) : sl_matmul(ctx, A, G, 0, 0);
        if (half_b) { /* the gradient of the fused cast(w): bf16, rounded as it accumulates */
            if (dB->ndim == 2 && dB->src[0]->ndim == 2 && dB->src[1]->ndim == 2)
                dB->iparams[SL_MATMUL_IP_ROUND] = SL_BF16;
            else
                dB = sl_cast(ctx, sl_cast(ctx, dB, SL_BF16), SL_F32);
        }
        emit(st, b, dB);
    }
    if (n->src[2] && ng[2]) emit(st, n->src[2], sl_sum_to(ctx, g, n->src[2])); /* fused bias */
}

/* Note [Packed QKV gradient]
 * ATTENTION_BACK writes dq | dk | dv packed as (B, T, NH + 2 NKV, hs). When q, k and v are the three
 * head slices of one contiguous tensor laid out the same way (GPT-2's fused c_attn output, reshaped to
 * (B, T, 3, NH, hs)), that packed gradient IS the tensor's gradient: it is emitted to the tensor whole,
 * instead of three slices that the views' backward scattered into a zeroed accumulator (a ZEROS and three
 * SCATTER_ADD nodes per layer: serial copies of the whole QKV gradient, 2.4 % of the baby GPT's step).
 * Other consumers of q, k or v still reach the tensor through their views (emit_view adds them). */
static int qkv_slices_of(const sl_tensor *q, const sl_tensor *k, const sl_tensor *v) {
    const sl_tensor *a = q->view_src;
    if (q->op != SL_OP_VIEW || k->op != SL_OP_VIEW || v->op != SL_OP_VIEW || !a || k->view_src != a ||
        v->view_src != a || !sl_is_contiguous(a) || q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return 0;
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2], W = NH + 2 * NKV;
    if (sl_nelements(a) != B * T * W * hs) return 0;
    const sl_tensor *s[3] = {q, k, v};
    const int64_t offs[3] = {0, NH * hs, (NH + NKV) * hs}, heads[3] = {NH, NKV, NKV};
    for (int i = 0; i < 3; i++) {
        const sl_tensor *t = s[i];
        if (t->ne[0] != B || t->ne[1] != T || t->ne[2] != heads[i] || t->ne[3] != hs ||
            t->view_offs != offs[i] || t->nb[0] != T * W * hs || t->nb[1] != W * hs || t->nb[2] != hs ||
            t->nb[3] != 1)
            return 0;
    }
    return 1;
}

/* the cast rule: a half tensor's gradient is half; two fused cases (Note [Rounded weight gradients], Note
 * [Rounded Linear outputs]) mark a fresh product rounded instead of casting it */
static void cast_backward(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *ng, sl_grad_emit emit,
                          void *st) {
    sl_tensor *a = n->src[0];
    /* a bf16 copy of a parameter whose gradient is one fresh product: rounded as it accumulates (Note
     * [Rounded weight gradients]) */
    if (ng[0] && n->dtype == SL_BF16 && a->dtype == SL_F32 && (a->flags & SL_FLAG_PARAM) &&
        g->op == SL_OP_MATMUL && g->dtype == SL_F32 && g->order < 0 && !g->iparams[2] && !g->view_src &&
        !g->src[2] && g->ndim == 2 && g->src[0]->ndim == 2 && g->src[1]->ndim == 2) {
        g->iparams[SL_MATMUL_IP_ROUND] = SL_BF16;
        emit(st, a, g);
        return;
    }
    /* a bf16 copy of an f32 activation whose gradient is one fresh fused-weight product (dA of a Linear):
     * that product rounds its output in the GEMM instead of the two casts below (Note [Rounded Linear
     * outputs], gemm.c); a second gradient would have made g an ADD, so none is lost */
    if (ng[0] && n->dtype == SL_BF16 && a->dtype == SL_F32) {
        sl_tensor *p = g;
        if (p->op == SL_OP_VIEW && p->view_offs == 0 && sl_is_contiguous(p) && p->view_src &&
            sl_nelements(p->view_src) == sl_nelements(p))
            p = p->view_src;
        if (p->op == SL_OP_MATMUL && p->dtype == SL_F32 && p->iparams[SL_MATMUL_IP_HALF_B] == SL_BF16 &&
            !p->iparams[SL_MATMUL_IP_ROUND] && !p->iparams[2] && !p->view_src && sl_is_contiguous(p)) {
            p->iparams[SL_MATMUL_IP_ROUND] = SL_BF16;
            emit(st, a, g);
            return;
        }
    }
    /* a half tensor's gradient is half (as in autocast): an f32 gradient arriving at an f16/bf16 node (a
     * GEMM's operand or product) is rounded to that type first (f16: overflowing to inf, which dynamic
     * loss scaling detects) */
    if ((n->dtype == SL_F16 || n->dtype == SL_BF16) && g->dtype == SL_F32) g = sl_cast(ctx, g, n->dtype);
    if (ng[0]) emit(st, a, g->dtype == a->dtype ? g : sl_cast(ctx, g, a->dtype));
}

void sl_op_backward(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *ng, sl_grad_emit emit, void *st) {
    sl_tensor *a = n->src[0], *b = n->src[1];
    switch (n->op) {
    case SL_OP_CONT:
        if (ng[0]) emit(st, a, g);
        break;
    case SL_OP_CAST:
        cast_backward(ctx, n, g, ng, emit, st);
        break;
    case SL_OP_ADD:
        if (ng[0]) emit(st, a, g);
        if (ng[1]) emit(st, b, sl_same_shape(a, b) ? g : sl_sum_to(ctx, g, b));
        break;
    case SL_OP_MUL:
        if (ng[0]) emit(st, a, sl_mul(ctx, g, b));
        if (ng[1]) {
            sl_tensor *gb = sl_mul(ctx, g, a);
            /* a half mul with a broadcast b (iparams[0], SL_MUL_IP_HALF): torch's gradient of b is the half
             * tensor g * a (each product rounded), then summed to b's shape in fp32 */
            if (n->iparams[SL_MUL_IP_HALF] && !sl_same_shape(a, b))
                gb = sl_round_half(ctx, gb, (sl_dtype)n->iparams[SL_MUL_IP_HALF]);
            emit(st, b, sl_same_shape(a, b) ? gb : sl_sum_to(ctx, gb, b));
        }
        break;
    case SL_OP_SCALE:
        if (ng[0]) emit(st, a, sl_scale(ctx, g, n->fparams[0]));
        break;
    case SL_OP_SUM_TO:
        if (ng[0]) emit(st, a, sl_add(ctx, sl_zeros(ctx, SL_F32, a->ndim, a->ne), g));
        break;
    case SL_OP_CONCAT: {
        int dim = n->iparams[0];
        if (ng[0]) emit(st, a, sl_slice(ctx, g, dim, 0, a->ne[dim]));
        if (ng[1]) emit(st, b, sl_slice(ctx, g, dim, a->ne[dim], b->ne[dim]));
        break;
    }
    case SL_OP_MATMUL:
        matmul_backward(ctx, n, g, ng, emit, st);
        break;
    case SL_OP_GELU:
        if (ng[0]) {
            sl_tensor *t = new_backward_op(ctx, SL_OP_GELU_BACK, a);
            t->src[0] = a;
            t->src[1] = g;
            emit(st, a, t);
        }
        break;
    case SL_OP_LAYERNORM: {
        sl_tensor *w = n->src[1], *bias = n->src[2];
        if (ng[0]) {
            sl_tensor *dx = new_backward_op(ctx, SL_OP_LAYERNORM_BACK_X, a);
            dx->src[0] = n;
            dx->src[1] = a;
            dx->src[2] = w;
            dx->src[3] = g;
            emit(st, a, dx);
        }
        if (ng[1] || ng[2]) {
            int64_t C = a->ne[a->ndim - 1];
            sl_tensor *dwb = sl_new_op(ctx, SL_OP_LAYERNORM_BACK_WB, SL_F32, 2, (int64_t[]){2, C});
            dwb->src[0] = n;
            dwb->src[1] = a;
            dwb->src[2] = g;
            if (ng[1]) emit(st, w, sl_view(ctx, dwb, 1, (int64_t[]){C}, (int64_t[]){1}, 0));
            if (ng[2]) emit(st, bias, sl_view(ctx, dwb, 1, (int64_t[]){C}, (int64_t[]){1}, C));
        }
        break;
    }
    case SL_OP_SOFTMAX:
        if (ng[0]) {
            sl_tensor *t = new_backward_op(ctx, SL_OP_SOFTMAX_BACK, a);
            t->src[0] = n;
            t->src[1] = g;
            emit(st, a, t);
        }
        break;
    case SL_OP_ATTENTION: {
        sl_tensor *q = n->src[0], *k = n->src[1], *v = n->src[2];
        int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
        sl_tensor *p = sl_new_op(ctx, SL_OP_ATTENTION_BACK, SL_F32, 4, (int64_t[]){B, T, NH + 2 * NKV, hs});
        p->src[0] = n;
        p->src[1] = q;
        p->src[2] = k;
        p->src[3] = v;
        p->src[4] = g;
        p->iparams[1] = n->iparams[1];                           /* sliding window */
        if (ng[0] && ng[1] && ng[2] && qkv_slices_of(q, k, v)) { /* Note [Packed QKV gradient] */
            emit(st, q->view_src, p);
            break;
        }
        if (ng[0]) emit(st, q, sl_slice(ctx, p, 2, 0, NH));
        if (ng[1]) emit(st, k, sl_slice(ctx, p, 2, NH, NKV));
        if (ng[2]) emit(st, v, sl_slice(ctx, p, 2, NH + NKV, NKV));
        break;
    }
    case SL_OP_DROPOUT:
        /* the same mask from the same counters (Note [Dropout from counters], build.c), read from the forward
         * node's bits where it keeps them (Note [Hidden dropout bits]); a residual's gradient passes */
        if (ng[0]) {
            sl_tensor *t = sl_dropout(ctx, g, n->fparams[0], n->iparams[SL_DROPOUT_IP_SITE]);
            memcpy(t->iparams, n->iparams, sizeof t->iparams); /* on/off, seed and stream too */
            if (n->aux_bytes) t->src[2] = n;
            emit(st, a, t);
        }
        if (b && ng[1]) emit(st, b, g);
        break;
    case SL_OP_EMBEDDING:
        /* the table gradient is produced by an accumulating EMBEDDING_BACK; the driver supplies
         * the destination (the parameter's gradient leaf, or a zeros node) through emit_embedding */
        break;
    case SL_OP_CROSS_ENTROPY:
        if (ng[0]) {
            sl_tensor *t = new_backward_op(ctx, SL_OP_CROSS_ENTROPY_BACK, a);
            t->src[0] = n;
            t->src[1] = a;
            t->src[2] = b;
            t->src[3] = g;
            emit(st, a, t);
        }
        break;
    case SL_OP_RMSNORM: {
        sl_tensor *w = n->src[1];
        if (ng[0]) {
            sl_tensor *dx = new_backward_op(ctx, SL_OP_RMSNORM_BACK_X, a);
            dx->src[0] = n;
            dx->src[1] = a;
            dx->src[2] = w;
            dx->src[3] = g;
            emit(st, a, dx);
        }
        if (w && ng[1]) {
            sl_tensor *dw = new_backward_op(ctx, SL_OP_RMSNORM_BACK_W, w);
            dw->src[0] = n;
            dw->src[1] = a;
            dw->src[2] = g;
            emit(st, w, dw);
        }
        break;
    }
    case SL_OP_ROPE:
        /* a rotation: its adjoint is the rotation by the opposite angle */
        if (ng[0]) {
            sl_tensor *t = sl_rope(ctx, g, n->iparams[0], n->fparams[0]);
            t->iparams[1] = !n->iparams[1];
            /* autocast: the half gradient's roundings (Note [RoPE numerics]) */
            t->iparams[2] = n->iparams[2] == 3 || n->iparams[2] == 4 ? n->iparams[2] + 2 : 0;
            for (int i = 1; i < 4; i++) t->fparams[i] = n->fparams[i]; /* same frequencies */
            t->iparams[3] = n->iparams[3];
            emit(st, a, t);
        }
        break;
    case SL_OP_SILU:
        if (ng[0]) {
            sl_tensor *t = new_backward_op(ctx, SL_OP_SILU_BACK, a);
            t->src[0] = a;
            t->src[1] = g;
            emit(st, a, t);
        }
        break;
    case SL_OP_TOPK_GATE:
        if (ng[0]) {
            sl_tensor *t = new_backward_op(ctx, SL_OP_TOPK_GATE_BACK, a);
            t->src[0] = n;
            t->src[1] = g;
            emit(st, a, t);
        }
        break;
    case SL_OP_LINEAR_BF16:
        /* dx = bf16(dy) @ w (w frozen: bf16 weights are inference constants) */
        SL_ASSERT(!ng[1] && "bf16 weights take no gradient");
        if (ng[0] && n->iparams[0]) {
            sl_tensor *t = sl_new_op(ctx, SL_OP_LINEAR_BF16, SL_F32, a->ndim, a->ne);
            t->src[0] = g;
            t->src[1] = b;
            t->iparams[0] = 0;
            t->iparams[1] = 0;
            emit(st, a, t);
        }
        break;
    case SL_OP_COLLECTIVE:
    case SL_OP_CE_VP:
    case SL_OP_CE_VP_STATS:
        sl_op_backward_tp(ctx, n, g, ng, emit, st);
        break;
    default:
        if (sl_moe_op_backward(ctx, n, g, ng, emit, st)) break;
        /* backward-only ops have no gradient rule (no higher-order autodiff) */
        SL_ASSERT(!"op has no backward rule");
    }
}
