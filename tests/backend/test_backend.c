/* The backend conformance suite (issue 13): every op at the shapes the models use, forward and backward;
 * 3 training steps of GPT-2 and of a Llama-family model with GQA and a MoE FFN; KV-cache generation; all
 * run on the backend named by argv[1] and compared with the CPU backend.
 *
 * Tolerances: the `strict` backend runs the CPU kernels behind its own memory protection, so its results
 * must be bitwise the CPU's (tolerance 0); `cpu` against itself checks the harness and determinism. Any
 * other backend is held to 1e-4 relative (fp32 kernels with a different summation order; PyTorch's own CPU
 * vs CUDA fp32 differences on these shapes are ~1e-6 to 1e-5) unless SUANLI_CONFORMANCE_RTOL says otherwise.
 *
 * The bf16 training cases (GPT-2 with bf16 matmul operands, Mixtral with autocast numerics) use the same
 * tolerance: they exercise CAST and bf16 x bf16 MATMUL, whose kernels are the CPU's on strict.
 *
 * The strict backend also gets tests of what makes it strict: its memory faults when the host touches it
 * (checked in a child process), a leaf bound to host memory is refused by name, mapping is refused, and an
 * asynchronous copy lands only at synchronize. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "suanli/graph.h"
#include "suanli/nn.h"
#include "suanli/optim.h"
#include "suanli/parallel.h"
#include "suanli/train.h"
#include "testutil.h"

static sl_backend *g_be;
static float g_rtol;

static void rnd_fill(float *x, int64_t n, uint64_t seed, float scale) {
    sl_rng_fill_normal(x, n, seed, 0, 0.0f, scale);
}

/* ---------------- ops: forward and backward of small graphs ---------------- */

/* Two shape tiers: tiny, and the demo model's (GPT-2 L4 C192 H6 at T=64; GQA 6/2 heads of 32): sizes that
 * are not multiples of the CPU GEMM's blocks and longer rows than one SIMD tile, where a backend's tiling
 * and reduction bugs show. */
typedef struct {
    const char *name;
    int B, T, C, NH, NKV, HS, V, E;
} shape_tier;
static const shape_tier k_tiers[] = {{"tiny", 2, 8, 32, 4, 2, 8, 48, 4},
                                     {"demo", 4, 64, 192, 6, 2, 32, 256, 8}};
static int B, T, C, NH, NKV, HS, V, E;
enum { MAXP = 6, N_CASES = 34 };

typedef struct {
    const char *name;
    int np;
    int ndim[MAXP];
    int64_t ne[MAXP][4];
    /* builds a tensor from the parameters; the harness turns it into a scalar with cross-entropy */
    sl_tensor *(*build)(sl_ctx *ctx, sl_tensor **p, sl_tensor *ids);
} op_case;
/* cases of ops only some backends implement (the MoE ops: cpu, strict and opencl, Note [OpenCL MoE kernels],
 * there with the bf16 GEMM of the packed experts only on the register-blocked GEMM; sliding-window attention:
 * not every accelerator; f16 / bf16 GEMMs: cpu, strict, opencl, cuda; the fused weight cast:
 * caps.matmul_half_b): refused there -> skipped */
static int case_optional(const op_case *k) {
    return (!strncmp(k->name, "moe-", 4) &&
            (strcmp(g_be->name, "opencl") || !strcmp(k->name, "moe-packed-bf16"))) ||
           !strcmp(k->name, "attention-window") || !strcmp(k->name, "attention-eager-bf16-window") ||
           !strcmp(k->name, "matmul-f16") || !strncmp(k->name, "matmul-bf16", 11);
}

static sl_tensor *b_linear(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return sl_linear(c, p[0], p[1], p[2]);
}
static sl_tensor *b_gelu(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return sl_gelu(c, sl_linear(c, p[0], p[1], NULL));
}
static sl_tensor *b_layernorm(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return sl_layernorm(c, p[0], p[1], p[2], 1e-5f);
}
static sl_tensor *b_rmsnorm(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return sl_rmsnorm(c, p[0], p[1], 1e-6f);
}
/* GQA attention with RoPE on q and k, from one projection as the Llama family does; window > 0: Mistral's
 * sliding window */
static sl_tensor *attention_case(sl_ctx *c, sl_tensor **p, int window) {
    sl_tensor *qkv = sl_linear(c, p[0], p[1], NULL); /* (B*T, (NH+2NKV)*HS) */
    sl_tensor *q = sl_slice(c, qkv, 1, 0, NH * HS), *k = sl_slice(c, qkv, 1, NH * HS, NKV * HS),
              *v = sl_slice(c, qkv, 1, (NH + NKV) * HS, NKV * HS);
    q = sl_reshape(c, sl_cont(c, q), 4, (int64_t[]){B, T, NH, HS});
    k = sl_reshape(c, sl_cont(c, k), 4, (int64_t[]){B, T, NKV, HS});
    v = sl_reshape(c, sl_cont(c, v), 4, (int64_t[]){B, T, NKV, HS});
    q = sl_rope(c, q, 0, 10000.0f);
    k = sl_rope(c, k, 0, 10000.0f);
    return sl_attention_window(c, q, k, v, window);
}
static sl_tensor *b_attention(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return attention_case(c, p, 0);
}
static sl_tensor *b_attention_window(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return attention_case(c, p, T / 3 + 1); /* tiny: 3 of 8, demo: 22 of 64 */
}
/* SwiGLU MLP: down(silu(gate x) * up x) */
/* Dropout cases (Note [Dropout from counters], src/ops/build.c): run_case turns dropout on, so the masks
 * are drawn from the counters; a backend must draw the CPU's masks bit for bit to pass */
static sl_tensor *b_attention_dropout(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    sl_tensor *a = sl_attention_dropout(attention_case(c, p, 0), 0.25f, 7);
    a->iparams[SL_DROPOUT_IP_HEADS] = NH + 3; /* a TP shard: heads [2, 2 + NH) of NH + 3 */
    a->iparams[SL_DROPOUT_IP_HEAD0] = 2;
    return a;
}
/* the eager half numerics of autocast attention (Note [Eager half attention numerics], attention.c): 1 bf16
 * and 2 f16 (GPT-2), 3 f16 and 4 bf16 (transformers' Llama family, P kept in fp32); with dropout */
static sl_tensor *half_attention(sl_ctx *c, sl_tensor **p, int mode) {
    sl_tensor *a = sl_attention_dropout(attention_case(c, p, 0), 0.1f, 9);
    a->iparams[2] = mode;
    return a;
}
static sl_tensor *b_att_h1(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return half_attention(c, p, 1);
}
static sl_tensor *b_att_h2(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return half_attention(c, p, 2);
}
static sl_tensor *b_att_h3(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return half_attention(c, p, 3);
}
static sl_tensor *b_att_h4(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return half_attention(c, p, 4);
}
/* with a sliding window (the Llama family's eager numerics: Mistral-style models under autocast) */
static sl_tensor *b_att_h4_window(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    sl_tensor *a = sl_attention_dropout(attention_case(c, p, T / 3 + 1), 0.1f, 9);
    a->iparams[2] = 4;
    return a;
}
/* RoPE with the numerics of a half model (Note [RoPE numerics]: 1 bf16, 2 f16: cos/sin, products and sums
 * rounded); a linear in front so the gradient reaches a parameter */
static sl_tensor *half_rope(sl_ctx *c, sl_tensor **p, int mode) {
    sl_tensor *x = sl_reshape(c, sl_linear(c, p[0], p[1], NULL), 4, (int64_t[]){B, T, NH, HS});
    sl_tensor *r = sl_rope(c, x, 3, 10000.0f);
    r->iparams[2] = mode;
    return r;
}
static sl_tensor *b_rope_h1(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return half_rope(c, p, 1);
}
static sl_tensor *b_rope_h2(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return half_rope(c, p, 2);
}
static sl_tensor *b_dropout(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return sl_dropout(c, sl_gelu(c, sl_linear(c, p[0], p[1], NULL)), 0.3f, 1);
}
/* a residual dropout on a sequence shard: (B, T, C) holding positions [3, 3 + T) of 2 T + 5 */
static sl_tensor *b_dropout_add_sp(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    sl_tensor *y = sl_reshape(c, sl_linear(c, p[0], p[1], NULL), 3, (int64_t[]){B, T, C});
    sl_tensor *d = sl_dropout_add(c, y, sl_reshape(c, p[0], 3, (int64_t[]){B, T, C}), 0.2f, 4);
    d->iparams[SL_DROPOUT_IP_SEQ] = 2 * T + 5;
    d->iparams[SL_DROPOUT_IP_T0] = 3;
    return d;
}
static sl_tensor *b_swiglu(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    sl_tensor *g = sl_silu(c, sl_linear(c, p[0], p[1], NULL)), *u = sl_linear(c, p[0], p[2], NULL);
    return sl_linear(c, sl_mul(c, g, u), p[3], NULL);
}
/* Mixtral routing weights times the tokens' expert outputs (dense training form) */
static sl_tensor *b_topk(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    sl_tensor *gate = sl_topk_gate(c, sl_linear(c, p[0], p[1], NULL), 2); /* (N, E) */
    return sl_matmul(c, gate, p[2], 0, 0);                                /* (N, E) @ (E, C) */
}
static sl_tensor *b_softmax(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return sl_softmax(c, sl_scale(c, p[0], 2.0f));
}
static sl_tensor *b_embedding(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    sl_tensor *e = sl_embedding(c, p[0], ids);                         /* (B, T, C) */
    return sl_add(c, e, sl_reshape(c, p[1], 3, (int64_t[]){1, T, C})); /* + positions, broadcast */
}
static sl_tensor *b_concat(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    sl_tensor *x = sl_concat(c, p[0], p[1], 1); /* (N, 2C) */
    return sl_bias(c, sl_transpose(c, sl_reshape(c, x, 3, (int64_t[]){B * T, 2, C}), 1, 2), p[2]);
}
static sl_tensor *b_bf16(sl_ctx *c, sl_tensor **p, sl_tensor *ids) { /* autocast rounding + a linear */
    (void)ids;
    return sl_linear(c, sl_round_bf16(c, p[0]), sl_round_bf16(c, p[1]), NULL);
}

/* fp16 autocast GEMM: f16 x f16 operands, f32 product (the backward: f16 casts of the gradient and f16
 * GEMMs, src/ops/backward.c) */
static sl_tensor *b_f16(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return sl_matmul(c, sl_cast(c, p[0], SL_F16), sl_cast(c, p[1], SL_F16), 0, 1);
}
/* bf16 x bf16 -> f32 forward; backward the weight's gradient is one fresh product, rounded to bf16 in the
 * GEMM (Note [Rounded weight gradients]; MATMUL iparams[SL_MATMUL_IP_ROUND]) */
static sl_tensor *b_bf16mm(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return sl_matmul(c, sl_cast(c, p[0], SL_BF16), sl_cast(c, p[1], SL_BF16), 0, 1);
}
/* the same Linear with the weight's cast fused into the GEMM (Note [Fused weight casts], src/ops/backward.c:
 * backends with caps.matmul_half_b) and its output rounded to bf16 (Note [Rounded Linear outputs]) */
static sl_tensor *b_bf16mm_fused(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return sl_linear_half_w_rounded(c, sl_cast(c, p[0], SL_BF16), p[1], NULL);
}

/* Trainable MoE: router (+ capacity), per-expert gather -> SwiGLU -> weighted combine, router losses
 * broadcast into the output. p: x (N, C), router (E, C), w1 / w3 (E*C, C), w2 (E*C, C) rows per expert. */
static sl_tensor *moe_case(sl_ctx *c, sl_tensor **p, const sl_moe_route_opts *o, sl_tensor *bias, int64_t R) {
    sl_tensor *lg = sl_linear(c, p[0], p[1], NULL), *rt = sl_moe_route(c, lg, bias, o), *y = NULL;
    for (int e = 0; e < E; e++) {
        sl_tensor *xe = sl_moe_gather(c, p[0], rt, e, R, 0);
        sl_tensor *g = sl_silu(c, sl_linear(c, xe, sl_slice(c, p[2], 0, e * C, C), NULL));
        sl_tensor *u = sl_linear(c, xe, sl_slice(c, p[3], 0, e * C, C), NULL);
        sl_tensor *ye = sl_linear(c, sl_mul(c, g, u), sl_slice(c, p[4], 0, e * C, C), NULL);
        y = sl_moe_combine(c, ye, rt, y, e, 1);
    }
    return sl_add(c, y, sl_moe_router_loss(c, lg, rt, 0.1f, 0.01f));
}
static sl_tensor *b_moe_capacity(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    int64_t cap = (B * T * 2 + E - 1) / E; /* capacity factor 1, top-2: some tokens dropped */
    sl_moe_route_opts o = {
        .k = 2, .score = SL_MOE_SCORE_SOFTMAX, .norm_topk = 1, .scale = 1, .capacity = (int)cap};
    return moe_case(c, p, &o, NULL, cap);
}
static sl_tensor *b_moe_sigmoid(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids; /* DeepSeek-V3 routing, dropless (R = N); p[5]: the selection bias (no gradient) */
    sl_moe_route_opts o = {
        .k = 2, .score = SL_MOE_SCORE_SIGMOID, .norm_topk = 1, .n_group = 2, .topk_group = 1, .scale = 2.5f};
    return moe_case(c, p, &o, p[5], B * T);
}

/* the same route with every step a half op (SL_MOE_ROUTE_HALF_OPS: DeepSeek-V3's router under autocast,
 * Note [DeepSeek-V3's router under autocast] in src/nn/moe.c): rounded scores, sum, division and scaling,
 * and torch's half autograd of them in the backward */
static sl_tensor *b_moe_sigmoid_half(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    sl_moe_route_opts o = {
        .k = 2, .score = SL_MOE_SCORE_SIGMOID, .norm_topk = 1, .n_group = 2, .topk_group = 1, .scale = 2.5f};
    sl_tensor *lg = sl_linear(c, p[0], p[1], NULL), *rt = sl_moe_route(c, lg, p[5], &o), *y = NULL;
    rt->iparams[SL_MOE_ROUTE_IP_HALF] = 1 | SL_MOE_ROUTE_HALF_OPS;
    for (int e = 0; e < E; e++) {
        sl_tensor *ye =
            sl_moe_expert_ffn(c, sl_moe_gather(c, p[0], rt, e, B * T, 0), p[2], p[3], p[4], rt, e);
        y = sl_moe_combine(c, ye, rt, y, e, 1);
    }
    return y;
}

/* dropless top-2 with the routed expert op (GEMMs on the kept rows only); the experts share p[2..4] */
static sl_tensor *b_moe_routed(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    sl_moe_route_opts o = {.k = 2, .score = SL_MOE_SCORE_SOFTMAX, .norm_topk = 0, .scale = 1};
    sl_tensor *lg = sl_linear(c, p[0], p[1], NULL), *rt = sl_moe_route(c, lg, NULL, &o), *y = NULL;
    for (int e = 0; e < E; e++) {
        sl_tensor *ye =
            sl_moe_expert_ffn(c, sl_moe_gather(c, p[0], rt, e, B * T, 0), p[2], p[3], p[4], rt, e);
        y = sl_moe_combine(c, ye, rt, y, e, 1);
    }
    return y;
}

/* the same layer with the packed experts (Note [Packed experts]): pack -> chain in place -> unpack */
static sl_tensor *b_moe_packed(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    sl_moe_route_opts o = {.k = 2, .score = SL_MOE_SCORE_SOFTMAX, .norm_topk = 0, .scale = 1};
    sl_tensor *lg = sl_linear(c, p[0], p[1], NULL), *rt = sl_moe_route(c, lg, NULL, &o), *y = NULL;
    sl_tensor *xp = sl_moe_ep_pack(c, p[0], rt, B * T * 2, 0);
    for (int e = 0; e < E; e++) y = sl_moe_packed_ffn(c, xp, p[2], p[3], p[4], y, e, 0, B * T, SL_F32);
    return sl_moe_ep_unpack(c, y, rt, 1);
}

/* Expert parallelism's local ops in one process (Note [Expert-parallel dispatch], src/ops/moe_ep_ops.c): with
 * the EP group's all-to-alls left out, this rank's own counts stand for the received ones, read as P = 2
 * blocks of El = E / 2 local experts, so the packed rows are the received layout (block p: global experts
 * [p El, (p + 1) El)); counts, pack, regroup there and back (packed experts over El) or the per-expert
 * gather / routed FFN / scatter, unpack */
static sl_tensor *moe_ep_case(sl_ctx *c, sl_tensor **p, int packed) {
    sl_moe_route_opts o = {.k = 2, .score = SL_MOE_SCORE_SOFTMAX, .norm_topk = 1, .scale = 1};
    sl_tensor *lg = sl_linear(c, p[0], p[1], NULL), *rt = sl_moe_route(c, lg, NULL, &o);
    int El = E / 2;
    int64_t S = (int64_t)B * T * 2;
    sl_tensor *cnt = sl_moe_ep_counts(c, rt), *xs = sl_moe_ep_pack(c, p[0], rt, S, 0), *yr = NULL;
    if (packed) {
        sl_tensor *xg = sl_moe_ep_regroup(c, xs, cnt, El, 0), *yg = NULL;
        for (int j = 0; j < El; j++)
            yg = sl_moe_packed_ffn(c, xg, p[2], p[3], p[4], yg, j, El, 2 * B * T, SL_F32);
        yr = sl_moe_ep_regroup(c, yg, cnt, El, 1);
    } else {
        for (int j = 0; j < El; j++) {
            sl_tensor *xl = sl_moe_ep_gather(c, xs, cnt, j, El, 2 * B * T);
            sl_tensor *yl = sl_moe_expert_ffn_ep(c, xl, p[2], p[3], p[4], cnt, j, El);
            yr = sl_moe_ep_scatter(c, yl, cnt, yr, j, El, S);
        }
    }
    return sl_moe_ep_unpack(c, yr, rt, 1);
}
static sl_tensor *b_moe_ep_packed(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return moe_ep_case(c, p, 1);
}
static sl_tensor *b_moe_ep_experts(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return moe_ep_case(c, p, 0);
}

/* the packed experts under autocast (Note [Packed experts under autocast]): bf16 with the bf16 GEMM, fp16 */
static sl_tensor *moe_packed_half(sl_ctx *c, sl_tensor **p, sl_dtype half) {
    sl_moe_route_opts o = {.k = 2, .score = SL_MOE_SCORE_SOFTMAX, .norm_topk = 1, .scale = 1};
    sl_tensor *lg = sl_linear(c, p[0], p[1], NULL), *rt = sl_moe_route(c, lg, NULL, &o), *y = NULL;
    sl_tensor *xp = sl_moe_ep_pack(c, p[0], rt, B * T * 2, 0);
    for (int e = 0; e < E; e++) {
        y = sl_moe_packed_ffn(c, xp, p[2], p[3], p[4], y, e, 0, B * T, half);
        if (half == SL_BF16) sl_moe_packed_ffn_half_gemm(y);
    }
    return sl_moe_ep_unpack(c, y, rt, 1);
}
static sl_tensor *b_moe_packed_bf16(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return moe_packed_half(c, p, SL_BF16);
}
static sl_tensor *b_moe_packed_f16(sl_ctx *c, sl_tensor **p, sl_tensor *ids) {
    (void)ids;
    return moe_packed_half(c, p, SL_F16);
}

static op_case k_cases[N_CASES];
/* the cases at the current tier's sizes */
static void make_cases(void) {
    const op_case v[N_CASES] = {
        {"linear+bias", 3, {2, 2, 1}, {{B * T, C}, {3 * C, C}, {3 * C}}, b_linear},
        {"gelu", 2, {2, 2}, {{B * T, C}, {4 * C, C}}, b_gelu},
        {"layernorm", 3, {2, 1, 1}, {{B * T, C}, {C}, {C}}, b_layernorm},
        {"rmsnorm", 2, {3, 1}, {{B, T, C}, {C}}, b_rmsnorm},
        {"attention-gqa-rope", 2, {2, 2}, {{B * T, C}, {(NH + 2 * NKV) * HS, C}}, b_attention},
        {"attention-window", 2, {2, 2}, {{B * T, C}, {(NH + 2 * NKV) * HS, C}}, b_attention_window},
        {"attention-dropout", 2, {2, 2}, {{B * T, C}, {(NH + 2 * NKV) * HS, C}}, b_attention_dropout},
        {"dropout", 2, {2, 2}, {{B * T, C}, {2 * C, C}}, b_dropout},
        {"rope-bf16", 2, {2, 2}, {{B * T, C}, {NH * HS, C}}, b_rope_h1},
        {"rope-f16", 2, {2, 2}, {{B * T, C}, {NH * HS, C}}, b_rope_h2},
        {"attention-half-bf16", 2, {2, 2}, {{B * T, C}, {(NH + 2 * NKV) * HS, C}}, b_att_h1},
        {"attention-half-f16", 2, {2, 2}, {{B * T, C}, {(NH + 2 * NKV) * HS, C}}, b_att_h2},
        {"attention-eager-f16", 2, {2, 2}, {{B * T, C}, {(NH + 2 * NKV) * HS, C}}, b_att_h3},
        {"attention-eager-bf16", 2, {2, 2}, {{B * T, C}, {(NH + 2 * NKV) * HS, C}}, b_att_h4},
        {"attention-eager-bf16-window", 2, {2, 2}, {{B * T, C}, {(NH + 2 * NKV) * HS, C}}, b_att_h4_window},
        {"dropout-add-sp", 2, {2, 2}, {{B * T, C}, {C, C}}, b_dropout_add_sp},
        {"swiglu", 4, {2, 2, 2, 2}, {{B * T, C}, {2 * C, C}, {2 * C, C}, {C, 2 * C}}, b_swiglu},
        {"topk-gate", 3, {2, 2, 2}, {{B * T, C}, {E, C}, {E, C}}, b_topk},
        {"softmax", 1, {2}, {{B * T, V}}, b_softmax},
        {"embedding", 2, {2, 2}, {{V, C}, {T, C}}, b_embedding},
        {"concat+transpose+bias", 3, {2, 2, 1}, {{B * T, C}, {B * T, C}, {2}}, b_concat},
        {"round-bf16", 2, {2, 2}, {{B * T, C}, {C, C}}, b_bf16},
        {"matmul-f16", 2, {2, 2}, {{B * T, C}, {C, C}}, b_f16},
        {"matmul-bf16", 2, {2, 2}, {{B * T, C}, {C + 3, C}}, b_bf16mm},
        {"matmul-bf16-fused", 2, {2, 2}, {{B * T, C}, {C + 3, C}}, b_bf16mm_fused},
        {"moe-capacity",
         5,
         {2, 2, 2, 2, 2},
         {{B * T, C}, {E, C}, {E * C, C}, {E * C, C}, {E * C, C}},
         b_moe_capacity},
        {"moe-sigmoid-groups",
         6,
         {2, 2, 2, 2, 2, 1},
         {{B * T, C}, {E, C}, {E * C, C}, {E * C, C}, {E * C, C}, {E}},
         b_moe_sigmoid},
        {"moe-sigmoid-half-ops",
         6,
         {2, 2, 2, 2, 2, 1},
         {{B * T, C}, {E, C}, {2 * C, C}, {2 * C, C}, {C, 2 * C}, {E}},
         b_moe_sigmoid_half},
        {"moe-routed-ffn",
         5,
         {2, 2, 2, 2, 2},
         {{B * T, C}, {E, C}, {2 * C, C}, {2 * C, C}, {C, 2 * C}},
         b_moe_routed},
        {"moe-packed-ffn",
         5,
         {2, 2, 2, 2, 2},
         {{B * T, C}, {E, C}, {2 * C, C}, {2 * C, C}, {C, 2 * C}},
         b_moe_packed},
        {"moe-ep-packed",
         5,
         {2, 2, 2, 2, 2},
         {{B * T, C}, {E, C}, {2 * C, C}, {2 * C, C}, {C, 2 * C}},
         b_moe_ep_packed},
        {"moe-ep-experts",
         5,
         {2, 2, 2, 2, 2},
         {{B * T, C}, {E, C}, {2 * C, C}, {2 * C, C}, {C, 2 * C}},
         b_moe_ep_experts},
        {"moe-packed-bf16",
         5,
         {2, 2, 2, 2, 2},
         {{B * T, C}, {E, C}, {2 * C, C}, {2 * C, C}, {C, 2 * C}},
         b_moe_packed_bf16},
        {"moe-packed-f16",
         5,
         {2, 2, 2, 2, 2},
         {{B * T, C}, {E, C}, {2 * C, C}, {2 * C, C}, {C, 2 * C}},
         b_moe_packed_f16},
    };
    memcpy(k_cases, v, sizeof v);
}
static void set_tier(const shape_tier *t) {
    B = t->B, T = t->T, C = t->C, NH = t->NH, NKV = t->NKV, HS = t->HS, V = t->V, E = t->E;
    make_cases();
}

typedef struct {
    float loss;
    float *grads; /* every parameter's gradient, concatenated */
    int64_t n;
} op_result;

/* forward + backward of case k on backend be: loss = mean cross-entropy of the case's output rows
 * against fixed targets (every element of the rows with a target takes part) */
static sl_status run_case(sl_backend *be, const op_case *k, op_result *out) {
    sl_ctx *ctx = sl_ctx_new(4096);
    sl_tensor *p[MAXP];
    int64_t off[MAXP + 1] = {0};
    for (int i = 0; i < k->np; i++) {
        p[i] = sl_new_tensor(ctx, SL_F32, k->ndim[i], k->ne[i]);
        sl_set_param(p[i]);
        sl_set_name(p[i], "p%d", i);
        off[i + 1] = off[i] + sl_nelements(p[i]);
    }
    int64_t np = off[k->np];
    sl_buffer *pb, *gb, *ib, *tb = NULL;
    SL_TRY(sl_backend_alloc(be, sizeof(float) * (size_t)np, &pb));
    SL_TRY(sl_backend_alloc(be, sizeof(float) * (size_t)np, &gb));
    SL_TRY(sl_backend_alloc(be, sizeof(int32_t) * B * T, &ib));
    for (int i = 0; i < k->np; i++) {
        sl_tensor_bind_buffer(p[i], pb, sizeof(float) * (size_t)off[i]);
        p[i]->grad = sl_new_tensor(ctx, SL_F32, p[i]->ndim, p[i]->ne);
        p[i]->grad->flags |= SL_FLAG_GRAD;
        sl_tensor_bind_buffer(p[i]->grad, gb, sizeof(float) * (size_t)off[i]);
    }
    sl_tensor *ids = sl_new_tensor_2d(ctx, SL_I32, B, T);
    sl_set_input(ids);
    sl_tensor_bind_buffer(ids, ib, 0);
    sl_tensor *y = k->build(ctx, p, ids);
    if (!sl_is_contiguous(y)) y = sl_cont(ctx, y);
    int64_t last = y->ne[y->ndim - 1], rows = sl_nelements(y) / last;
    sl_tensor *tg = sl_new_tensor_1d(ctx, SL_I32, rows);
    sl_set_input(tg);
    SL_TRY(sl_backend_alloc(be, sizeof(int32_t) * (size_t)rows, &tb));
    sl_tensor_bind_buffer(tg, tb, 0);
    sl_tensor *loss = sl_cross_entropy(ctx, sl_reshape_2d(ctx, y, rows, last), tg);
    sl_graph *g = sl_graph_new(ctx);
    sl_graph_build_forward(g, loss);
    sl_graph_build_backward(g, loss, 1.0f);
    sl_graph_set_dropout(g, 1, 0x5eed0000cafeull, 11); /* the dropout cases' masks (none elsewhere) */
    sl_status st = sl_graph_plan(g, be, NULL);
    float *host = malloc(sizeof(float) * (size_t)np);
    int32_t *idv = malloc(sizeof(int32_t) * (size_t)(B * T)), *tgv = malloc(sizeof(int32_t) * (size_t)rows);
    for (int i = 0; i < B * T; i++) idv[i] = (int32_t)((i * 7 + 3) % V);
    /* every 7th row ignored (target -1: a zero gradient row, outside the mean), as padding is */
    for (int64_t i = 0; i < rows; i++) tgv[i] = i % 7 == 3 ? -1 : (int32_t)((i * 5 + 1) % last);
    rnd_fill(host, np, 42, 0.5f);
    if (st == SL_OK) st = sl_backend_copy_in(pb, 0, host, sizeof(float) * (size_t)np);
    if (st == SL_OK) st = sl_backend_copy_in(ib, 0, idv, sizeof(int32_t) * (size_t)(B * T));
    if (st == SL_OK) st = sl_backend_copy_in(tb, 0, tgv, sizeof(int32_t) * (size_t)rows);
    free(tgv);
    free(idv);
    if (st == SL_OK) st = sl_graph_compute(g, NULL, NULL);
    if (st == SL_OK) st = sl_tensor_copy_out(loss, &out->loss);
    if (st == SL_OK) st = sl_backend_copy_out(gb, 0, host, sizeof(float) * (size_t)np);
    out->grads = host;
    out->n = np;
    sl_graph_free(g);
    sl_backend_free(be, pb);
    sl_backend_free(be, gb);
    sl_backend_free(be, ib);
    sl_backend_free(be, tb);
    sl_ctx_free(ctx);
    return st;
}

/* Note [Conformance tolerances measured]
 * Backends other than cpu/strict are held to g_rtol (1e-4) except where the CPU backend's own kernel
 * paths disagree by more (measured 2026-12-01 on Zen 4 under SUANLI_ISA=scalar, avx2 and avx512):
 * - attention backward: the AVX-512 flash kernel (FMA, tiled sums) and the scalar reference differ by up
 *   to 3.3e-4 relative on small gradient elements (sums with cancellation); the OpenCL kernels agree with
 *   the scalar reference to 1e-7 absolute and with AVX-512 to 3.3e-4. Tolerance: 1e-3 relative.
 * - final weights after 3 AdamW steps: AdamW divides each gradient element by its own RMS, so an element
 *   with a tiny or sign-changing gradient moves by ~lr whatever its size, and last-digit differences of
 *   the gradient become differences of a fraction of lr in the weight. CPU scalar vs AVX-512 differ by up
 *   to 9.7e-5 absolute (GPT-2; 1% of lr = 1e-2), OpenCL vs AVX-512 by 1.2e-4. Tolerance: atol
 *   0.01 * lr * 3 steps = 3e-4 (with the relative tolerance as well).
 * - gradients are compared normwise too: an element may be off by g_rtol * max|ref| of the case (the
 *   atol) besides rtol * |ref|. At the demo tier, sums over 256 rows with cancellation leave elements far
 *   below the maximum with large relative but tiny absolute differences: OpenCL against the CPU's scalar
 *   reference measured swiglu gradients 3.9e-4 relative on an element of 2.9e-2 (2223 of 270336 elements
 *   above 1e-4 relative) and attention 3.5e-2 relative on an element of 3.9e-6; normwise both are below
 *   1e-4 of the case's largest gradient.
 * - fp16 training (gpt2-fp16) on OpenCL (2026-12-07): the fp16 roundings after each op turn the backends'
 *   last-digit f32 differences (the norms' work-group sums, GELU's one-exp tanh, the GEMM's sum order) into
 *   whole fp16 ulps at rounding boundaries. Losses agreed within 1e-4, the step-3 gradient norm by 1.9e-4
 *   (tolerance 2^-11, one fp16 ulp), and 124 of 28544 weights (0.43 %) moved the other way by up to 0.0097:
 *   gradient elements whose sign is below that noise, which AdamW's first steps turn into +-lr. Tolerance:
 *   at most 1 % of the weights beyond the f32 bar, each within 2 lr per step (weights_half_ok). bf16 (the
 *   same run) stayed within the f32 bars in the Release build; in the sanitizer build (other CPU code, the
 *   same OpenCL kernels) 32 of 28544 weights (0.11 %) moved the other way, by up to 0.0037: the same
 *   noise, so bf16 training takes the same weight bar, and its gradient norm one bf16 ulp (2^-8).
 * - round-bf16: rounding to bf16 turns a last-digit f32 difference of an input into one bf16 ulp (2^-8
 *   relative) when the value sits at a rounding boundary; measured 5.6e-3 relative on 4 of 86016
 *   elements. Tolerance: 2^-7 relative for that case, and for matmul-bf16(-fused), whose weight gradient
 *   (and the fused case's output) is rounded to bf16 in the GEMM (a different summation order lands on the
 *   other side of a rounding boundary).
 * - moe-packed-bf16 / -f16 (the packed experts' autocast roundings): bitwise or within 1e-7 of the CPU in the
 *   Release build; in the sanitizer build (other CPU code) 6 of 271872 bf16 gradient elements sat one bf16
 *   ulp apart (2.6e-3 relative). Tolerance: 2^-7 (bf16), 2^-10 (f16: one ulp is 2^-11 relative).
 * - moe_expert bf16 (test_expert_bf16, forward only; Note [OpenCL bf16 experts]): every rounding point is
 *   the CPU's, only the GEMMs' fp32 sum order differs. Measured 2026-12-07 (AMD EPYC with AVX512_BF16,
 *   PoCL, Release): N 1 and 7 bitwise; N 256 (C 192, I 581, 8 experts) 63 of 393216 elements differ, all in
 *   one token of one expert: a hidden value one bf16 ulp apart, propagated through w2, 1.0e-3 of max |y|
 *   (0.031 of 31) at worst, 0.51 relative on an element of 1.2e-3 (cancellation). With the CPU's bf16 GEMM
 *   widened to fp32 FMAs in k order (SUANLI_ISA=avx2, the register GEMM's order) all shapes are bitwise;
 *   SUANLI_ISA=scalar: 18 elements, 5.0e-4 of max |y|. Tolerance: one bf16 ulp (2^-7 relative) or 2^-8 of
 *   max |y| (4x the worst measured), and at most 0.5 % of the elements different at all (measured 0.016 %;
 *   a missed rounding point changes most of them). */
static float case_rtol(const op_case *k) {
    if (g_rtol <= 0) return g_rtol;
    if (!strncmp(k->name, "attention-", 10)) return fmaxf(g_rtol, 1e-3f);
    if (!strcmp(k->name, "round-bf16") || !strncmp(k->name, "matmul-bf16", 11) ||
        !strcmp(k->name, "moe-packed-bf16"))
        return fmaxf(g_rtol, 1.0f / 128);
    if (!strcmp(k->name, "moe-packed-f16")) return fmaxf(g_rtol, 1.0f / 1024);
    return g_rtol;
}

static void test_ops(const shape_tier *tier) {
    set_tier(tier);
    for (int i = 0; i < N_CASES; i++) {
        const op_case *k = &k_cases[i];
        op_result ref = {0}, got = {0};
        sl_status s1 = run_case(sl_backend_cpu(), k, &ref), s2 = run_case(g_be, k, &got);
        if (case_optional(k) && s1 == SL_OK && s2 == SL_ERR_UNSUPPORTED) {
            fprintf(stderr, "op %s on %s: skipped, refused: %s\n", k->name, g_be->name, sl_errmsg());
            free(ref.grads);
            free(got.grads);
            continue;
        }
        TU_CHECK(s1 == SL_OK && s2 == SL_OK, "op %s (%s shapes) on %s: %s", k->name, tier->name, g_be->name,
                 sl_errmsg());
        if (s1 == SL_OK && s2 == SL_OK) {
            TU_CHECK(tu_allclose(k->name, &got.loss, &ref.loss, 1, 0, g_rtol), "op %s forward on %s", k->name,
                     g_be->name);
            double gmax = 0;
            for (int64_t j = 0; j < ref.n; j++) gmax = fmax(gmax, fabs(ref.grads[j]));
            TU_CHECK(gmax > 0, "op %s: the CPU reference has non-zero gradients", k->name);
            /* Note [Conformance tolerances measured]: normwise atol, per-element rtol */
            TU_CHECK(tu_allclose(k->name, got.grads, ref.grads, got.n, (float)(g_rtol * gmax), case_rtol(k)),
                     "op %s (%s shapes) backward on %s", k->name, tier->name, g_be->name);
            if (!strncmp(k->name, "matmul-bf16", 11)) { /* the weight's gradient rounded in the GEMM: bf16 */
                int64_t off = (int64_t)B * T * C, odd = 0;
                for (int64_t j = off; j < got.n; j++) {
                    uint32_t u;
                    memcpy(&u, &got.grads[j], 4);
                    odd += (u & 0xffffu) != 0;
                }
                TU_CHECK(odd == 0, "op %s on %s: %lld weight-gradient elements are not bf16 values", k->name,
                         g_be->name, (long long)odd);
            }
        }
        free(ref.grads);
        free(got.grads);
    }
}

/* ---------------- training: 3 steps through the trainer ---------------- */

/* the same two micro-batches every step, so three steps must lower the loss */
static sl_status batch(void *user, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    (void)step;
    int vocab = *(int *)user;
    for (int i = 0; i < 2 * 16; i++) {
        uint64_t r = sl_rng_u64(7, (uint64_t)micro, (uint64_t)i);
        ids[i] = (int32_t)(r % (uint64_t)vocab);
        tg[i] = (int32_t)((r >> 20) % (uint64_t)vocab);
    }
    return SL_OK;
}

typedef struct {
    float loss[3], norm[3];
    float *params;
    int64_t n;
} train_result;

/* the suite's two tiny models on be: GPT-2, or a Mixtral with GQA (4/2 heads) and 4 experts, top-2 */
static sl_status tiny_model(sl_backend *be, int llama, sl_model **out) {
    if (llama) {
        sl_llama_config c = {.arch = SL_ARCH_MIXTRAL,
                             .n_layer = 2,
                             .n_head = 4,
                             .n_kv_head = 2,
                             .head_dim = 8,
                             .hidden = 32,
                             .intermediate = 48,
                             .vocab_size = 64,
                             .max_seq_len = 32,
                             .rms_eps = 1e-5f,
                             .rope_theta = 10000.0f,
                             .n_experts = 4,
                             .n_experts_per_tok = 2};
        SL_TRY(sl_llama_new_on(&c, SL_F32, be, out));
    } else {
        sl_gpt2_config c = {.n_layer = 2, .n_head = 4, .n_embd = 32, .vocab_size = 64, .max_seq_len = 32};
        SL_TRY(sl_gpt2_new_on(&c, be, out));
    }
    return SL_OK;
}

/* llama: 0 GPT-2, 1 Mixtral (GQA + MoE); bf16 = 1: autocast-style bf16 matmul operands over f32 master
 * weights; 2: fp16 autocast numerics with dynamic loss scaling (issue 19; a start scale of 2^18 overflows the
 * first step, so the skip path runs too) */
static sl_status train3(sl_backend *be, int llama, int bf16, train_result *r) {
    sl_model *m = NULL;
    SL_TRY(tiny_model(be, llama, &m));
    if (bf16 == 1 && llama) m->autocast_bf16 = 1;
    if (bf16 == 1 && !llama) m->compute_dtype = SL_BF16;
    if (bf16 == 2) m->compute_dtype = SL_F16;
    sl_status st = sl_model_init_weights_ex(m, 1234);
    sl_trainer tr;
    sl_trainer_config tc = {.B = 2,
                            .T = 16,
                            .accum = 2,
                            .lr = 1e-2f,
                            .min_lr = 1e-3f,
                            .clip = 0.5f,
                            .warmup = 1,
                            .decay_iters = 3,
                            .hp = {0.9f, 0.95f, 1e-8f, 0.1f}};
    if (bf16 == 2) tc.loss_scale = (sl_loss_scale_config){262144.0f, 1.0f, 1, 1};
    if (st == SL_OK) st = sl_trainer_init(&tr, m, &tc);
    int vocab = 64;
    for (int s = 0; s < 3 && st == SL_OK; s++) {
        sl_step_stats ss;
        st = sl_trainer_step(&tr, s, batch, &vocab, &ss);
        r->loss[s] = ss.loss;
        r->norm[s] = ss.skipped ? -1.0f : ss.grad_norm; /* an overflow step (fp16): inf/nan, skipped */
        if (ss.skipped) printf("train: step %d skipped at loss scale %g\n", s, ss.loss_scale);
    }
    r->n = m->numel;
    r->params = malloc(sizeof(float) * (size_t)m->numel);
    if (st == SL_OK) st = sl_model_params_read(m, 0, m->numel, r->params);
    sl_trainer_free(&tr);
    sl_model_free(m);
    return st;
}

/* half-precision training's final weights on a backend that is not bitwise the CPU (Note [Conformance
 * tolerances measured]): every element within the f32 bar (atol 3e-4, g_rtol) but at most 1 % of them, and
 * those within 2 lr per step (an AdamW update whose direction is the sign of a gradient element below the
 * backends' fp16 rounding noise) */
static int weights_half_ok(const float *got, const float *ref, int64_t n, float lr, int steps) {
    int64_t off = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!(d <= 3e-4 + g_rtol * fabs((double)ref[i]))) off++, worst = fmax(worst, isnan(d) ? INFINITY : d);
    }
    printf(
        "train half-precision weights on %s: %lld of %lld elements beyond the f32 bar, at most %.3g apart\n",
        g_be->name, (long long)off, (long long)n, worst);
    return off <= n / 100 && worst <= 2.0 * lr * steps;
}

static void test_train(void) {
    float f32_loss[2] = {0, 0}; /* step-3 loss of the f32 runs: the bf16 runs must differ from it */
    for (int mode = 0; mode < 6; mode++) {
        int llama = mode & 1, bf16 = mode >> 1;
        const char *names[] = {"gpt2",      "mixtral-gqa-moe",
                               "gpt2-bf16", "mixtral-gqa-moe-autocast-bf16",
                               "gpt2-fp16", "mixtral-gqa-moe-autocast-fp16"};
        const char *what = names[mode];
        train_result ref = {0}, got = {0};
        sl_status s1 = train3(sl_backend_cpu(), llama, bf16, &ref), s2 = train3(g_be, llama, bf16, &got);
        if (bf16 && s1 == SL_OK && s2 == SL_ERR_UNSUPPORTED && g_rtol > 0) {
            /* a backend without bf16 kernels must refuse them by name (issue 14: "otherwise refused clearly")
             */
            TU_CHECK(strstr(sl_errmsg(), "not supported") != NULL, "train %s: refusal names the op: %s", what,
                     sl_errmsg());
            fprintf(stderr, "train %s on %s: skipped, refused: %s\n", what, g_be->name, sl_errmsg());
            free(ref.params);
            free(got.params);
            continue;
        }
        TU_CHECK(s1 == SL_OK && s2 == SL_OK, "train %s on %s: %s", what, g_be->name, sl_errmsg());
        if (s1 == SL_OK && s2 == SL_OK) {
            TU_CHECK(tu_allclose("loss", got.loss, ref.loss, 3, 0, g_rtol), "train %s losses on %s", what,
                     g_be->name);
            /* half precision on a backend with its own reduction orders: Note [Conformance tolerances
             * measured] */
            int half_noise = bf16 && g_rtol > 0;
            TU_CHECK(tu_allclose("grad norm", got.norm, ref.norm, 3, 0,
                                 half_noise ? fmaxf(g_rtol, bf16 == 2 ? 0x1p-11f : 0x1p-8f) : g_rtol),
                     "train %s norms", what);
            /* atol 0.01 * lr * 3 steps: Note [Conformance tolerances measured] */
            if (half_noise)
                TU_CHECK(weights_half_ok(got.params, ref.params, ref.n, 1e-2f, 3),
                         "train %s final weights on %s", what, g_be->name);
            else
                TU_CHECK(tu_allclose("weights", got.params, ref.params, ref.n, 3e-4f * (g_rtol > 0), g_rtol),
                         "train %s final weights on %s", what, g_be->name);
            TU_CHECK(ref.loss[2] < ref.loss[0], "train %s: loss falls (%g -> %g)", what, ref.loss[0],
                     ref.loss[2]);
            if (!bf16) f32_loss[llama] = ref.loss[2];
            if (bf16)
                TU_CHECK(ref.loss[2] != f32_loss[llama], "train %s: bf16 numerics differ from f32 (%.9g)",
                         what, ref.loss[2]);
        }
        free(ref.params);
        free(got.params);
    }
}

/* ---------------- KV-cache generation ---------------- */

static sl_status gen(sl_backend *be, int llama, int32_t *out, int *n_out) {
    sl_model *m = NULL;
    SL_TRY(tiny_model(be, llama, &m));
    sl_status st = sl_model_init_weights_ex(m, 99);
    int32_t prompt[5] = {1, 5, 9, 2, 7};
    sl_sample_opts o = {.temperature = 0.8f, .top_k = 20, .top_p = 0.95f, .seed = 5};
    sl_gen_stats gs;
    if (st == SL_OK) st = sl_model_generate(m, prompt, 5, 12, &o, NULL, 0, NULL, NULL, out, &gs);
    *n_out = gs.n_generated;
    /* a second call on the same model (the generation graphs are temporary) */
    int32_t again[12];
    if (st == SL_OK) st = sl_model_generate(m, prompt, 5, 12, &o, NULL, 0, NULL, NULL, again, &gs);
    if (st == SL_OK && memcmp(again, out, sizeof again) != 0)
        st = sl_fail(SL_ERR_INTERNAL, "generate: a second call gave other tokens");
    sl_model_free(m);
    return st;
}

static void test_generate(void) {
    for (int llama = 0; llama <= 1; llama++) {
        int32_t ref[12] = {0}, got[12] = {0};
        int nr = 0, ng = 0;
        sl_status s1 = gen(sl_backend_cpu(), llama, ref, &nr), s2 = gen(g_be, llama, got, &ng);
        TU_CHECK(s1 == SL_OK && s2 == SL_OK, "generate on %s: %s", g_be->name, sl_errmsg());
        TU_CHECK(nr == 12 && ng == 12, "generate: 12 tokens (%d, %d)", nr, ng);
        TU_CHECK(memcmp(ref, got, sizeof ref) == 0, "generate %s: same tokens on %s as on cpu",
                 llama ? "mixtral" : "gpt2", g_be->name);
    }
}

/* ---------------- the bf16 sparse expert of inference (forward only) ---------------- */

/* MOE_EXPERT with the bf16 numerics of a bf16 Mixtral (Note [Sparse experts]; on OpenCL Note [OpenCL bf16
 * experts]): each expert of E on its own graph, h (N, C) and a top-2 gate (N, E: some rows routed to none of
 * the experts of a row's pair), weights w1 / w3 (I, C), w2 (C, I) per expert in bf16 (wbf) or f32 rounded by
 * the kernel. y: E x N x C, the experts' outputs. No backward: the op is inference only. */
static sl_status expert_bf16_run(sl_backend *be, int64_t N, int64_t C, int64_t I, int wbf, float *y) {
    const int64_t nw = 3 * I * C; /* one expert's weights */
    const size_t esz = wbf ? sizeof(uint16_t) : sizeof(float);
    float *hv = malloc(sizeof(float) * (size_t)(N * C + N * E + E * nw));
    void *wv = malloc(esz * (size_t)(E * nw));
    sl_buffer *bh = NULL, *bw = NULL;
    sl_status st = hv && wv ? SL_OK : sl_fail(SL_ERR_NOMEM, "expert_bf16: out of memory");
    if (st != SL_OK) goto done;
    float *gv = hv + N * C, *wf = gv + N * E;
    rnd_fill(hv, N * C, 7, 1.0f);
    rnd_fill(wf, E * nw, 8, 0.15f);
    for (int64_t i = 0; i < E * nw; i++) {
        if (wbf)
            ((uint16_t *)wv)[i] = sl_f32_to_bf16(wf[i]);
        else
            ((float *)wv)[i] = wf[i];
    }
    memset(gv, 0, sizeof(float) * (size_t)(N * E));
    for (int64_t n = 0; n < N; n++) { /* top-2 weights that sum to 1, bf16 values as the model's gate is */
        int64_t a = (n * 5 + 1) % E, b = (n * 3 + 2) % E;
        float wa = sl_bf16_to_f32(sl_f32_to_bf16(0.3f + 0.4f * (float)((n * 37) % 11) / 11.0f));
        gv[n * E + a] += wa;
        gv[n * E + b] += sl_bf16_to_f32(sl_f32_to_bf16(1.0f - wa));
    }
    st = sl_backend_alloc(be, sizeof(float) * (size_t)(N * C + N * E), &bh);
    if (st == SL_OK) st = sl_backend_alloc(be, esz * (size_t)(E * nw), &bw);
    if (st == SL_OK) st = sl_backend_copy_in(bh, 0, hv, sizeof(float) * (size_t)(N * C + N * E));
    if (st == SL_OK) st = sl_backend_copy_in(bw, 0, wv, esz * (size_t)(E * nw));
    for (int e = 0; st == SL_OK && e < E; e++) {
        sl_ctx *ctx = sl_ctx_new(64);
        sl_dtype wt = wbf ? SL_BF16 : SL_F32;
        sl_tensor *h = sl_new_tensor_2d(ctx, SL_F32, N, C), *g = sl_new_tensor_2d(ctx, SL_F32, N, E);
        sl_tensor *w[3] = {sl_new_tensor_2d(ctx, wt, I, C), sl_new_tensor_2d(ctx, wt, I, C),
                           sl_new_tensor_2d(ctx, wt, C, I)};
        sl_set_input(h);
        sl_set_input(g);
        sl_tensor_bind_buffer(h, bh, 0);
        sl_tensor_bind_buffer(g, bh, sizeof(float) * (size_t)(N * C));
        for (int i = 0; i < 3; i++) {
            sl_set_input(w[i]);
            sl_tensor_bind_buffer(w[i], bw, esz * (size_t)(e * nw + i * I * C));
        }
        sl_tensor *ye = sl_moe_expert(ctx, h, g, e, w[0], w[1], w[2], 1);
        sl_graph *gr = sl_graph_new(ctx);
        sl_graph_build_forward(gr, ye);
        st = sl_graph_plan(gr, be, NULL);
        if (st == SL_OK) st = sl_graph_compute(gr, NULL, NULL);
        if (st == SL_OK) st = sl_tensor_copy_out(ye, y + e * N * C);
        sl_graph_free(gr);
        sl_ctx_free(ctx);
    }
done:
    if (bh) sl_backend_free(be, bh);
    if (bw) sl_backend_free(be, bw);
    free(hv);
    free(wv);
    return st;
}

static void test_expert_bf16(void) {
    /* a decode step (N = 1) and a prefill's rows at the demo tier's width; I not a multiple of the GEMM's
     * 32-wide panels or its row blocks */
    static const struct { int64_t N, C, I; } sh[] = {{1, 32, 85}, {7, 32, 85}, {256, 192, 581}};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        for (int wbf = 1; wbf >= 0; wbf--) {
            int64_t N = sh[s].N, C = sh[s].C, I = sh[s].I, n = (int64_t)E * N * C;
            float *ref = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
            TU_CHECK(ref && got, "expert_bf16: out of memory");
            if (!ref || !got) {
                free(ref), free(got);
                return;
            }
            sl_status s1 = expert_bf16_run(sl_backend_cpu(), N, C, I, wbf, ref);
            sl_status s2 = expert_bf16_run(g_be, N, C, I, wbf, got);
            if (s1 == SL_OK && s2 == SL_ERR_UNSUPPORTED) { /* a backend without the bf16 expert */
                fprintf(stderr, "moe_expert bf16 on %s: skipped, refused: %s\n", g_be->name, sl_errmsg());
                free(ref), free(got);
                return;
            }
            TU_CHECK(s1 == SL_OK && s2 == SL_OK, "moe_expert bf16 (N %lld, %s weights) on %s: %s",
                     (long long)N, wbf ? "bf16" : "f32", g_be->name, sl_errmsg());
            if (s1 == SL_OK && s2 == SL_OK) {
                double ymax = 0, dmax = 0;
                int64_t ndiff = 0;
                for (int64_t i = 0; i < n; i++) {
                    ymax = fmax(ymax, fabs(ref[i]));
                    dmax = fmax(dmax, fabs(got[i] - ref[i]));
                    ndiff += got[i] != ref[i];
                }
                fprintf(
                    stderr,
                    "moe_expert bf16 (N %lld C %lld I %lld, %s weights) on %s: %lld of %lld elements differ, "
                    "max |diff| %.3g = %.3g of max |y| %.3g\n",
                    (long long)N, (long long)C, (long long)I, wbf ? "bf16" : "f32", g_be->name,
                    (long long)ndiff, (long long)n, dmax, ymax > 0 ? dmax / ymax : 0.0, ymax);
                TU_CHECK(ymax > 0, "moe_expert bf16: the CPU's output is not all zero");
                /* Note [Conformance tolerances measured] (moe_expert bf16): cpu / strict bitwise; others one
                 * bf16 ulp per element (2^-7 relative) or 2^-8 of max |y|, on at most 0.5 % of the elements
                 */
                float rtol = g_rtol > 0 ? fmaxf(g_rtol, 1.0f / 128) : 0.0f;
                float atol = g_rtol > 0 ? (float)(fmax(g_rtol, 1.0 / 256) * ymax) : 0.0f;
                TU_CHECK(tu_allclose("moe_expert bf16", got, ref, n, atol, rtol),
                         "moe_expert bf16 (N %lld, %s weights) on %s vs cpu", (long long)N,
                         wbf ? "bf16" : "f32", g_be->name);
                TU_CHECK(ndiff <= (g_rtol > 0 ? n / 200 : 0),
                         "moe_expert bf16 (N %lld, %s weights) on %s: %lld of %lld elements differ from cpu",
                         (long long)N, wbf ? "bf16" : "f32", g_be->name, (long long)ndiff, (long long)n);
            }
            free(ref);
            free(got);
        }
}

/* ---------------- the contract's rules ---------------- */

static void test_contract(void) {
    /* an unsupported op is refused by name (the null backend supports none) */
    sl_backend *nb = sl_backend_null();
    op_result r = {0};
    sl_status st = run_case(nb, &k_cases[0], &r);
    free(r.grads);
    TU_CHECK(st == SL_ERR_UNSUPPORTED && strstr(sl_errmsg(), "null") && strstr(sl_errmsg(), "not supported"),
             "null backend names the op: %s", sl_errmsg());
    sl_model *m = NULL;
    sl_gpt2_config c = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 16, .max_seq_len = 8};
    TU_CHECK(sl_gpt2_new_on(&c, nb, &m) == SL_OK, "model on null");
    sl_adamw opt;
    TU_CHECK(sl_adamw_init(&opt, m, (sl_adamw_hparams){0.9f, 0.95f, 1e-8f, 0}) == SL_OK,
             "adamw init on null");
    st = sl_adamw_step(&opt, m, 1e-3f);
    TU_CHECK(st == SL_ERR_UNSUPPORTED && strstr(sl_errmsg(), "adamw"), "missing state op named: %s",
             sl_errmsg());
    sl_adamw_free(&opt);
    sl_model_free(m);
    TU_CHECK(sl_backend_get("no-such-device") == NULL && strstr(sl_errmsg(), "available: cpu, strict"),
             "unknown device: %s", sl_errmsg());
    /* range checks of the generic copies */
    sl_buffer *b;
    TU_CHECK(sl_backend_alloc(g_be, 64, &b) == SL_OK, "alloc");
    char host[128] = {0};
    TU_CHECK(sl_backend_copy_in(b, 32, host, 64) == SL_ERR_INVALID, "copy_in past the end refused");
    TU_CHECK(sl_backend_copy_out(b, 65, host, 0) == SL_ERR_INVALID, "copy_out offset past the end refused");
    sl_backend_free(g_be, b);
}

/* what makes the strict backend strict */
static void test_strict(void) {
    sl_backend *be = sl_backend_strict();
    sl_buffer *b;
    TU_CHECK(sl_backend_alloc(be, 4096, &b) == SL_OK, "strict alloc");
    TU_CHECK(sl_buffer_map(b) == NULL && strstr(sl_errmsg(), "not host-visible"), "strict: map refused");
    /* a host read of device memory faults (in a child, which must die of SIGSEGV) */
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* not a sanitizer's handler: the kernel's default action must end it */
        volatile float x = *(volatile float *)sl_buffer_base(b);
        (void)x;
        _exit(0);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    TU_CHECK(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGSEGV, "strict: a host read of device memory faults");
    /* asynchronous copies complete at synchronize, not before */
    float src[4] = {1, 2, 3, 4}, dst[4] = {0};
    TU_CHECK(sl_backend_copy_in(b, 0, src, sizeof src) == SL_OK, "copy_in");
    TU_CHECK(sl_backend_copy_out_async(b, 0, dst, sizeof dst) == SL_OK, "copy_out_async");
    TU_CHECK(dst[3] == 0, "strict: async copy_out has not landed before synchronize");
    TU_CHECK(sl_backend_synchronize(be) == SL_OK && dst[3] == 4, "strict: it has after synchronize");
    /* a leaf bound to host memory is refused by name */
    sl_ctx *ctx = sl_ctx_new(64);
    sl_tensor *x = sl_set_name(sl_new_tensor_1d(ctx, SL_F32, 4), "host_leaf");
    sl_tensor_bind(x, src);
    sl_tensor *y = sl_scale(ctx, x, 2.0f);
    sl_graph *g = sl_graph_new(ctx);
    sl_graph_build_forward(g, y);
    TU_CHECK(sl_graph_plan(g, be, NULL) == SL_OK, "plan");
    sl_status st = sl_graph_compute(g, NULL, NULL);
    TU_CHECK(st != SL_OK && strstr(sl_errmsg(), "host_leaf") && strstr(sl_errmsg(), "outside device memory"),
             "strict: host leaf refused: %s", sl_errmsg());
    sl_graph_free(g);
    sl_ctx_free(ctx);
    /* ZeRO-3 keeps its parameter shard and slots in device memory (Note [Staged gradients],
     * src/parallel/dp.c): built, and gathering the parameters back gives the model's own, bitwise, with the
     * host unable to touch device memory; ZeRO-1 stages through host copies and is built */
    sl_model *m = NULL;
    sl_gpt2_config c = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 16, .max_seq_len = 8};
    TU_CHECK(sl_gpt2_new_on(&c, be, &m) == SL_OK, "model on strict");
    sl_trainer tr;
    sl_trainer_config tc = {.B = 1, .T = 4, .accum = 1, .lr = 1e-3f, .decay_iters = 1};
    TU_CHECK(sl_trainer_init(&tr, m, &tc) == SL_OK, "trainer on strict");
    sl_mesh mesh;
    TU_CHECK(sl_mesh_init(&mesh, NULL, (sl_mesh_dims){1, 1, 1}) == SL_OK, "mesh");
    sl_dp *dp = NULL;
    float *p0 = malloc(sizeof(float) * (size_t)m->numel), *p1 = malloc(sizeof(float) * (size_t)m->numel);
    TU_CHECK(p0 && p1 && sl_model_params_read(m, 0, m->numel, p0) == SL_OK, "read the parameters");
    st = sl_dp_new(&dp, &mesh, m, tr.graph, &(sl_dp_opts){.zero_stage = 3});
    TU_CHECK(st == SL_OK && dp, "strict: zero 3 built: %s", sl_errmsg());
    TU_CHECK(dp && sl_dp_gather_params(dp) == SL_OK && sl_model_params_read(m, 0, m->numel, p1) == SL_OK &&
                 !memcmp(p0, p1, sizeof(float) * (size_t)m->numel),
             "strict: zero 3 gathers the parameters back bitwise: %s", sl_errmsg());
    sl_dp_free(dp);
    free(p0);
    free(p1);
    st = sl_dp_new(&dp, &mesh, m, tr.graph, &(sl_dp_opts){.zero_stage = 1});
    TU_CHECK(st == SL_OK && dp, "strict: zero 1 staged: %s", sl_errmsg());
    sl_dp_free(dp);
    sl_mesh_free(&mesh);
    sl_trainer_free(&tr);
    sl_model_free(m);
    sl_backend_free(be, b);
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "cpu";
    g_be = sl_backend_get(name);
    if (!g_be) { /* a backend whose device is absent (e.g. no OpenCL platform): skipped, exit 77 */
        fprintf(stderr, "%s\n", sl_errmsg());
        if (strstr(sl_errmsg(), "no device")) {
            fprintf(stderr, "test_backend_%s: skipped (no device)\n", name);
            return 77;
        }
        return 2;
    }
    int same_kernels = !strcmp(name, "cpu") || !strcmp(name, "strict");
    const char *e = getenv("SUANLI_CONFORMANCE_RTOL");
    g_rtol = e ? (float)atof(e) : same_kernels ? 0.0f : 1e-4f;
    sl_threads_set(2);
    for (size_t t = 0; t < sizeof k_tiers / sizeof k_tiers[0]; t++) test_ops(&k_tiers[t]);
    set_tier(&k_tiers[0]);
    test_train();
    test_generate();
    set_tier(&k_tiers[1]);
    test_expert_bf16();
    set_tier(&k_tiers[0]);
    test_contract();
    if (!strcmp(name, "strict")) test_strict();
    fprintf(stderr, "backend %s: %lld nodes, %lld state ops, %lld B in, %lld B out\n", g_be->name,
            (long long)g_be->stats.nodes, (long long)g_be->stats.state_ops, (long long)g_be->stats.bytes_in,
            (long long)g_be->stats.bytes_out);
    char tname[64];
    snprintf(tname, sizeof tname, "test_backend_%s", name);
    tu_leak_check_now(); /* while PoCL's threads are idle, not exiting (testutil.h) */
    return tu_finish(tname);
}
