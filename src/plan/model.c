/* The layout model: parameters and memory per device, step time, enumeration and ranking.
 *
 * Note [Planner memory model]
 * The memory of a device is what suanli allocates, not a textbook formula: fp32 master parameters (4 B),
 * fp32 gradients (4 B) and two fp32 AdamW moments (8 B) per parameter (bf16 autocast keeps f32 masters), cut
 * by ZeRO exactly as src/parallel/dp.c cuts them: the flat buffer is split into buckets of whole parameters
 * walked from its end (a bucket closes once it holds >= bucket_elems elements), each bucket into dp equal
 * parts plus a < dp-element tail every rank keeps, so a shard is sum(len / dp + len % dp). Under ZeRO-2/3
 * with one micro-batch per step the full gradient buffer is replaced by gradient slots (Note [Gradient
 * slots] in src/parallel/zero_slots.c): GSLOT_LAG + 1 = 3 of the largest buckets in flight plus the
 * embedding's bucket (the last to finish; a tied embedding's gradient is written at both ends of backward);
 * ZeRO-3 adds gathered parameter buckets, modelled as 3 of the largest (min(3, buckets - 3), at least 1,
 * when there are few buckets: fitted on suanli's schedule, see BENCHMARKS.md); a single bucket is one use
 * interval (Note [ZeRO-3 gather schedule]): the whole parameter set, gathered once and held all step. The
 * slot arena's packing is not modelled exactly (it is a greedy placement over the schedule): slots alone are
 * within ~20 %, totals within 5 % (tests/plan/test_plan.c prints every component). Activations are
 * sl_graph_plan's liveness-packed arena for one micro-batch, which for suanli's graphs is (fp32 floats per
 * token) 12 C + NH per GPT-2 layer, 6 C + 4 F + 2 KV + NH per Llama layer, and 3 C + V outside the
 * layers (embedding output, final norm, logits overwritten by their gradient); fitted on sl_graph_plan and
 * checked by tests/plan/test_plan.c within 5 %. Tensor and pipeline parallelism follow suanli's splits
 * (column/row-parallel weights, vocab-parallel embedding, two more replicated buffers per layer for the f/g
 * collectives; a pipeline device is the fuller of the first stage (embedding, its layers, min(m, p) 1F1B
 * slots) and the last (its layers, final norm, LM head, one slot)), checked against real TP/PP allocations
 * by tests/plan/test_plan.c within 5 % too. MoE layers hold the router, E / ep routed experts of width
 * moe_ffn (moe_ffn / tp with expert tensor parallelism, l->etp), the shared experts and the flavour's gate
 * or bias, which TP does not split; under EP the routed
 * experts' gradients and moments are reduced and sharded over the dp / ep expert-data-parallel ranks in
 * buckets of their own (src/parallel/dp.c), checked byte-exact by tests/plan/test_plan_moe.c, which also
 * checks the fitted MoE activations. Full recomputation and sequence parallelism: Note [Recomputation
 * memory] and Note [Sequence-parallel memory], fitted on every layout kind of dense models; a recomputing
 * MoE layer's kept bytes are checked, its recomputed working set is not fitted.
 *
 * Note [Planner time model]
 * step = pipeline(compute per micro-batch x (m + (p-1)/v)) + exposed DP communication + optimizer; under pp
 * the compute per micro-batch is the slowest stage's, the last: L/p layers plus the LM head (even split).
 * Compute per micro-batch = matmul FLOPs / (peak x gemm_efficiency) + elementwise traffic / memory
 * bandwidth + TP all-reduces (4 per layer, with or without recomputation, which keeps the collectives'
 * outputs; a MoE layer 2 unless its experts are split, l->etp) + EP all-to-alls (4 per MoE layer). TP divides
 * the matmul FLOPs except a MoE layer's router and shared experts, and its routed experts unless they are
 * split (they run whole on every rank). Communication is alpha-beta per link class: a collective of n bytes
 * over g ranks costs k(g) alpha + c(g) n / beta with ring factors (all-reduce 2(g-1)/g,
 * all-gather/reduce-scatter (g-1)/g); an axis uses the intra-host link when its ranks lie in one host (tp
 * innermost, then dp, then pp: rank = (pp_rank dp + dp_rank) tp + tp_rank) and the inter-host link otherwise.
 * DP volume per step: ZeRO-0 all-reduce; ZeRO-1 all-reduce + parameter all-gather; ZeRO-2 reduce-scatter +
 * all-gather; ZeRO-3 reduce-scatter + two all-gathers (one when a stage's parameters are one bucket: gathered
 * once, held); (1 - overlap) of it is exposed. Optimizer: AdamW reads p, g, m, v and writes p, m, v (28 B)
 * plus the norm's read (4 B) per owned parameter, at memory bandwidth. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/nn.h"
#include "suanli/plan.h"

/* elementwise bytes moved per micro-batch = 8.0 x the planned activation bytes: fitted on two runs on this
 * host (GPT-2 L4 C256 T64, B = 8 and 32, 1 process, 2026-12-01 20:28 UTC, BENCHMARKS.md "Layout planner") */
enum { ELEM_TRAFFIC_X10 = 80 };

/* ---- parameters ---- */

/* layer l is a routed-expert layer (MoE models: all but DeepSeek's first_k_dense_replace) */
static int moe_layer(const sl_plan_model *m, int64_t l) { return m->n_experts > 0 && l >= m->first_dense; }

/* the experts a device holds: E / ep */
static int64_t local_experts(const sl_plan_model *m, int64_t ep) { return m->n_experts / (ep > 0 ? ep : 1); }

/* one MoE layer's MLP parameters on a device: the router (and DeepSeek's bias), the local experts, the
 * shared experts (and Qwen2-MoE's gate); none is split by TP (Note [MoE under TP], src/nn/moe.c) */
static int64_t moe_mlp_params(const sl_plan_model *m, int64_t ep) {
    int64_t C = m->hidden, E = m->n_experts, S = m->shared_ffn;
    int64_t n = E * C + local_experts(m, ep) * 3 * C * m->moe_ffn + 3 * C * S;
    if (m->moe_kind == SL_PLAN_MOE_DEEPSEEK) n += E;
    if (m->moe_kind == SL_PLAN_MOE_QWEN2 && S > 0) n += C;
    return n;
}

/* a TP rank's k (or v) width: its kv heads, or one kv head shared by tp / kv ranks when tp > kv heads (as
 * src/nn/llama.c splits them) */
static int64_t kv_rank(const sl_plan_model *m, int64_t tp) {
    return tp > m->n_kv_head ? m->head_dim : m->n_kv_head * m->head_dim / tp;
}

static int64_t layer_params(const sl_plan_model *m, int64_t tp, int64_t ep, int64_t l) {
    int64_t C = m->hidden;
    if (m->arch == SL_PLAN_GPT2) return (12 * C * C + 9 * C) / tp + 4 * C; /* LNs + row biases replicated */
    int64_t qd = m->n_head * m->head_dim;
    int64_t attn = C * qd * 2 / tp + C * kv_rank(m, tp) * 2;
    int64_t mlp = moe_layer(m, l) ? moe_mlp_params(m, ep) : 3 * C * m->ffn / tp;
    return attn + mlp + 2 * C;
}

static int64_t embed_params(const sl_plan_model *m, int64_t tp) {
    int64_t e = m->vocab * m->hidden / tp;
    if (m->arch == SL_PLAN_GPT2) e += m->max_seq * m->hidden;
    return e;
}

int64_t sl_plan_model_params(const sl_plan_model *m) {
    int64_t n = embed_params(m, 1);
    for (int64_t l = 0; l < m->n_layer; l++) n += layer_params(m, 1, 1, l);
    n += m->arch == SL_PLAN_GPT2 ? 2 * m->hidden : m->hidden + (m->tied ? 0 : m->vocab * m->hidden);
    return n;
}

/* matmul FLOPs per token of the MLPs of all layers (active experts only: top_k routed + the shared ones,
 * and the router) */
static double mlp_weights_per_token(const sl_plan_model *m) {
    double C = (double)m->hidden, w = 0;
    for (int64_t l = 0; l < m->n_layer; l++)
        w += moe_layer(m, l) ? 3.0 * C * ((double)m->top_k * (double)m->moe_ffn + (double)m->shared_ffn) +
                                   C * (double)m->n_experts
                             : 3.0 * C * (double)m->ffn;
    return w;
}

double sl_plan_flops_per_token(const sl_plan_model *m, int64_t T) {
    double C = (double)m->hidden, L = (double)m->n_layer, V = (double)m->vocab;
    double mm; /* weights that take part in matmuls, per token (active experts only) */
    if (m->arch == SL_PLAN_GPT2) {
        mm = L * 12.0 * C * C + V * C;
    } else {
        double qd = (double)(m->n_head * m->head_dim), kvd = (double)(m->n_kv_head * m->head_dim);
        mm = L * (2.0 * C * qd + 2.0 * C * kvd) + mlp_weights_per_token(m) + V * C;
    }
    double attn = L * 2.0 * 2.0 * (double)T * (double)(m->n_head * m->head_dim) / 2.0 * 3.0;
    return 6.0 * mm + attn;
}

/* Parameter sizes of a pipeline stage in flat-buffer order (the order of src/nn's builders), for the
 * bucket walk: stage STAGE_ALL (pp 1: the whole model), STAGE_FIRST (the embedding(s) and its layers) or
 * STAGE_LAST (its layers, the final norm and the LM head: untied, or the tied embedding's copy). Returns
 * the count. */
enum { STAGE_ALL, STAGE_FIRST, STAGE_MID, STAGE_LAST };
/* the layers of stage `which` under l's split */
static int64_t stage_layers(const sl_plan_model *m, const sl_plan_layout *l, int which) {
    int64_t L = m->n_layer, p = l->pp > 1 ? l->pp : 1, f = l->first_layers, z = l->last_layers;
    if (p == 1) return L;
    if (!f && !z) return L / p;
    if (which == STAGE_FIRST && f) return f;
    if (which == STAGE_LAST && z) return z;
    int64_t others = p - (f > 0) - (z > 0);
    return others > 0 ? (L - f - z) / others : 0;
}
/* a parameter of the flat buffer: its size, and whether it is an expert's (reduced over the
 * expert-data-parallel group, dp / ep ranks; src/parallel/dp.c keeps the two kinds in separate buckets) */
typedef struct {
    int64_t n;
    int expert;
} plan_param;

/* the first layer of stage `which` (the middle stages: the second stage's) */
static int64_t stage_first_layer(const sl_plan_model *m, const sl_plan_layout *l, int which) {
    if (which == STAGE_ALL || which == STAGE_FIRST) return 0;
    if (which == STAGE_LAST) return m->n_layer - stage_layers(m, l, STAGE_LAST);
    return stage_layers(m, l, STAGE_FIRST);
}

/* etp: the routed experts' intermediate dimension split over tp (Note [Expert tensor parallelism] in
 * src/nn/moe.c) */
static int stage_param_list(const sl_plan_model *m, int64_t tp, int64_t l0, int64_t Ls, int64_t ep, int etp,
                            int which, plan_param *out, int cap) {
    const int64_t ediv = etp && tp > 1 ? tp : 1;
    int n = 0;
    int64_t C = m->hidden;
    int ex = 0; /* the expert flag of what PUSH adds; set only under EP, as src/nn/moe.c does */
#define PUSH(x)                                                                                              \
    do {                                                                                                     \
        if (n < cap) out[n++] = (plan_param){(x), ex};                                                       \
    } while (0)
    if (which == STAGE_ALL || which == STAGE_FIRST) {
        PUSH(m->vocab * C / tp);
        if (m->arch == SL_PLAN_GPT2) PUSH(m->max_seq * C);
    }
    for (int64_t l = l0; l < l0 + Ls; l++) {
        if (m->arch == SL_PLAN_GPT2) {
            int64_t v[12] = {C, C, 3 * C * C / tp, 3 * C / tp, C * C / tp,     C,
                             C, C, 4 * C * C / tp, 4 * C / tp, 4 * C * C / tp, C};
            for (int i = 0; i < 12; i++) PUSH(v[i]);
            continue;
        }
        int64_t qd = m->n_head * m->head_dim;
        PUSH(C);
        PUSH(qd * C / tp);
        PUSH(kv_rank(m, tp) * C);
        PUSH(kv_rank(m, tp) * C);
        PUSH(C * qd / tp);
        PUSH(C);
        if (!moe_layer(m, l)) {
            for (int k = 0; k < 3; k++) PUSH(m->ffn * C / tp);
            continue;
        }
        PUSH(m->n_experts * C); /* the router (src/nn/moe.c sl_moe_add_params order) */
        if (m->moe_kind == SL_PLAN_MOE_DEEPSEEK) PUSH(m->n_experts);
        ex = ep > 1;
        for (int64_t e = 0; e < local_experts(m, ep); e++)
            for (int k = 0; k < 3; k++) PUSH(m->moe_ffn / ediv * C);
        ex = 0;
        if (m->shared_ffn > 0) {
            for (int k = 0; k < 3; k++) PUSH(m->shared_ffn * C);
            if (m->moe_kind == SL_PLAN_MOE_QWEN2) PUSH(C);
        }
    }
    if (which == STAGE_ALL || which == STAGE_LAST) {
        if (m->arch == SL_PLAN_GPT2) {
            PUSH(C);
            PUSH(C);
        } else {
            PUSH(C);
        }
        /* the LM head: untied, or (a pipeline's last stage) the tied embedding's copy */
        if ((m->arch != SL_PLAN_GPT2 && !m->tied) || which == STAGE_LAST) PUSH(m->vocab * C / tp);
    }
#undef PUSH
    return n;
}

typedef struct {
    double total, shard, max_bucket, first_bucket; /* elements; first: the bucket holding the embedding */
    int n_buckets;
} bucket_stats;

/* the bucket walk of src/parallel/dp.c build_buckets: from the end, a bucket closes once it holds
 * >= bucket_elems elements or where the expert flag changes; an expert bucket is sharded over dp / ep */
static void buckets(const plan_param *p, int n, int64_t bucket_elems, int64_t dp, int64_t ep,
                    bucket_stats *b) {
    memset(b, 0, sizeof *b);
    int64_t hi = 0;
    for (int i = 0; i < n; i++) hi += p[i].n;
    b->total = (double)hi;
    int64_t off = hi;
    for (int i = n - 1; i >= 0; i--) {
        off -= p[i].n;
        if (hi - off >= bucket_elems || i == 0 || p[i - 1].expert != p[i].expert) {
            int64_t len = hi - off, g = p[i].expert ? dp / ep : dp;
            b->shard += (double)(len / g + len % g);
            if (i == 0)
                b->first_bucket = (double)len;
            else if ((double)len > b->max_bucket)
                b->max_bucket = (double)len;
            b->n_buckets++;
            hi = off;
        }
    }
}

/* ---- activations ---- */

/* Note [Recomputation memory]: with full recomputation (Note [Full recomputation], src/graph/autodiff.c)
 * a graph of Ls dense layers keeps, per token,
 *   k = C per layer (its input); under TP 2 C (the input and the kept output of g's forward all-reduce,
 *       which is never run again; f, the identity forward, is recomputed);
 * and peaks in the backward of the LM head, Ls k + 3 C + V / tp (a last pipeline stage: Ls k + 2 C + V / tp),
 * or in the backward of one recomputed layer, (Ls - 1) k + W + ends:
 *   W = 2 C + S + 2 kv_dim without TP;
 *   W = max(S / tp (+ 2 x a rank's k width when tp > kv heads), 4.65 C) under TP: the layer's split
 *       buffers, or at high tp its replicated ones (f's recomputed outputs, the norms, the residual
 *       gradient), fitted as one constant;
 *   S = 10.5 C + NH (GPT-2), 5 F + NH (the Llama family: the SwiGLU backward's buffers);
 * ends: the whole model 3 C + (1.5 C for GPT-2, 2 C for the Llama family) / tp (+ C under TP), a first
 * pipeline stage 4.75 C, a later stage 3.75 C (the logits are gone by then). Fitted on sl_graph_plan's
 * arenas (tests/plan/test_plan.c: GPT-2 C64 and two Llamas of C64, F 160 / 2 kv heads and F 256 / 1 kv
 * head, vocabularies of 1.5 C to 32 C, 2 to 8 layers, tp 1 / 2 / 4, pp 1 / 2 / 3, 1F1B); within 3.5 %
 * there, and GPT-2 124M's real plans (bench train --plan-only) within 2 %. A pipeline stage with K > 1
 * micro-batches in flight holds one such slot plus, per further slot, only what crosses from its forward
 * to its backward, Ls k + C (C / tp under SP: the layer inputs and the stage output), since the slots share
 * one scratch region for the rest (Note [Shared scratch], src/graph/graph.c); the split costs one more k
 * where Ls > 1 (a storage of the one-arena plan that the scratch cannot reuse). A MoE layer keeps 4 E more
 * (the router's outputs, never recomputed; Qwen2-MoE's shared-expert gate 3.4 floats); the EP all-to-alls run
 * again, so under EP it keeps the same (before they did, it kept their outputs, ep min(k, E / ep) + k rows
 * of C, 6-10 C at ep 2-4): that per-layer term matches sl_graph_plan (tests/plan/test_plan_moe.c: 5
 * against 9 layers, Qwen2-MoE and DeepSeek-V3, ep 1 / 2 / 4, tp 2 with whole and split experts). The
 * recomputed MoE layer's own working set is the dispatched layer's term below, not fitted under
 * recomputation: a model's total is 1-27 % under its real plan at 5-9 layers, a fixed amount per model that
 * deep models dilute. */
/* Note [Sequence-parallel memory]: under SP (Korthikanti et al. 2022; --sequence-parallel) a layer keeps
 * its two all-gathered (N, C) inputs of the column-parallel linears whole and everything else of the
 * replicated regions as sequence shards: 2 C + (4 C + split) / tp floats per token, the whole model's ends
 * C + (4 C + V) / tp; a first pipeline stage's ends 3.5 C (GPT-2: the position embedding) or 2.25 C, a
 * last one's V / tp + 2 C. Recomputing (the all-gathers run again, Note [Full recomputation]): k = 2 C / tp
 * (the sequence shards of the layer input and of g's reduce-scatter output), W = S / tp (+ 2 x a rank's k
 * width when tp > kv heads), ends 2.75 C (a later stage 2.25 C), the LM head's branch Ls k + 1.2 C +
 * (1.8 C + V) / tp (a last stage Ls k + 1.6 C + V / tp). Fitted on sl_graph_plan like the above (GPT-2
 * and the Llama, V 2 C and 32 C, tp 2 / 4, pp 1 / 2, 2-8 layers); dense models only: the planner does not
 * enumerate SP for MoE models. */
typedef struct {
    double keep, work; /* floats per token: k and W */
} rc_terms;

/* floats per token outside the layers (the embedding's output, the final norm, the logits, which their
 * gradient overwrites: Note [Donated storage]); under TP the embedding's g keeps one more (N, C); under SP
 * (Note [Sequence-parallel memory]) all but C as sequence shards */
static double outside_floats(const sl_plan_model *m, int64_t tp, int sp) {
    double C = (double)m->hidden, V = (double)m->vocab, t = (double)tp;
    return sp ? C + (4.0 * C + V) / t : 3.0 * C + V / t + (tp > 1 ? C : 0.0);
}

static rc_terms recompute_terms(const sl_plan_model *m, int64_t tp, int sp) {
    double C = (double)m->hidden, NH = (double)m->n_head, t = (double)tp;
    double kv = m->arch == SL_PLAN_GPT2 ? 0.0 : (double)kv_rank(m, tp);
    double S = m->arch == SL_PLAN_GPT2 ? 10.5 * C + NH : 5.0 * (double)m->ffn + NH;
    rc_terms r;
    r.keep = tp > 1 ? 2.0 * C : C;
    if (sp) { /* Note [Sequence-parallel memory] */
        r.keep = 2.0 * C / t;
        r.work = S / t + (tp > m->n_kv_head ? 2.0 * kv : 0.0);
    } else if (tp > 1) {
        double split = S / t + (tp > m->n_kv_head ? 2.0 * kv : 0.0);
        r.work = split > 4.65 * C ? split : 4.65 * C;
    } else
        r.work = 2.0 * C + S + 2.0 * kv;
    return r;
}

double sl_plan_activation_bytes(const sl_plan_model *m, int64_t B, int64_t T, int64_t tp, int64_t ep, int etp,
                                int recompute, int sp) {
    double N = (double)(B * T), C = (double)m->hidden, NH = (double)m->n_head / (double)tp;
    double L = (double)m->n_layer;
    /* floats per token and layer: replicated across tp, split by tp */
    double rep = 4.0 * C, split, moe = 0, moe_bwd = 0, reserved = 0, moe_keep = 0;
    if (m->arch == SL_PLAN_GPT2) {
        split = 8.0 * C + NH * (double)tp; /* the GELU output is recomputed (Note [Recomputed GELU]) */
    } else {
        double kvd = (double)(kv_rank(m, tp) * tp); /* / tp below: a rank's k or v width */
        split = 2.0 * C + 4.0 * (double)m->ffn + 2.0 * kvd + NH * (double)tp;
        if (m->n_experts > 0) {
            /* a dispatched MoE layer instead of the dense MLP (src/nn/moe.c, Note [Packed experts]; fitted
             * on sl_graph_plan, Qwen2-MoE and DeepSeek-V3 L3 C64 E8 top-2, tests/plan/test_plan_moe.c):
             * dropless, the packed (token, expert) pairs (k per token) as the experts' input, and the
             * chain's output and two hidden buffers over the same rows (2 C + 2 moe_ffn per pair); under
             * EP the rows a device may receive instead: ep x min(k, E / ep) per token, and the pairs come
             * back (k C); the router's scores and route (3 E), the shared experts as a dense MLP
             * (4 shared_ffn, their output C, the gate), the combined output (C). TP does not split them,
             * except the hidden buffers under expert tensor parallelism (moe_ffn / tp), and under TP
             * without EP the layer keeps one replicated (N, C) buffer fewer than a dense one where it has
             * shared experts or split ones (Mixtral's and the shared-less shapes keep it: test_plan_moe,
             * tp 2, within 3 % with it, 4.6-5.1 % under without). */
            double E = (double)m->n_experts, e = (double)(ep > 1 ? ep : 1), k = (double)m->top_k;
            double S = (double)m->shared_ffn, ediv = etp && tp > 1 ? (double)tp : 1.0;
            double rows = ep > 1 ? e * (k < E / e ? k : E / e) : k; /* expert rows per token */
            double shared = S > 0 ? 4.0 * S + C + 1.0 : 0.0, El = ep > 1 ? E / e : E;
            moe = rows * (2.0 * C + 2.0 * (double)m->moe_ffn / ediv) + (ep > 1 ? k * C : 0.0) + 3.0 * E +
                  shared - 4.0 * (double)m->ffn / (double)tp -
                  (tp > 1 && ep <= 1 && (S > 0 || ediv > 1) ? C : 0.0);
            /* the last MoE layer's backward, once the shared experts' buffers are gone: the gradient of the
             * expert rows, the chain's dx (while another expert's runs: more than one local expert), one
             * expert's pre-activation gradients for the most rows it can hold (N; under EP ep N), and the
             * norm's (N, C) gradient; under TP the layer's two replicated f / g buffers are gone too (the
             * peak under EP: fitted as above, within 1.3 %) */
            moe_bwd = rows * C * (El > 1 ? 2.0 : 1.0) + 2.0 * e * (double)m->moe_ffn / ediv + C - shared -
                      (tp > 1 ? 2.0 * C : 0.0);
            /* under EP the received rows live in a region of their own, reserved for the worst case (Note
             * [Reserved rows], src/graph/graph.c), packed apart from the others: what one arena had
             * overlapped (the transient row gradients with the main region's freed (N, C) buffers) now
             * needs both, fitted as 8 C per token (on sl_graph_plan, 14 EP layouts of test_plan_moe
             * needing 6.9-10.6 C; C 64, 3 layers; their activations are then within 2.3 %). This is the
             * reservation: the resident memory follows the rows that arrive (k per token when the router is
             * balanced); under SUANLI_PLAN_RESERVE=0 (one arena) the term is not needed. */
            if (ep > 1) reserved = 8.0 * C;
            /* recomputing, a MoE layer keeps more than its input: the router's outputs (4 E: MOE_ROUTE is
             * never recomputed; the EP all-to-alls are) and Qwen2-MoE's shared-expert gate (Note
             * [Recomputation memory]) */
            moe_keep = 4.0 * E + (m->moe_kind == SL_PLAN_MOE_QWEN2 && S > 0 ? 3.375 : 0.0);
        }
    }
    /* under TP the f / g collectives keep two more replicated (B, T, C) buffers per layer and the
     * embedding's g one outside the layers (fitted on sl_graph_plan for GPT-2 L4/L8 C256 B8/B32 tp 2:
     * 12 C + 6 floats per token and layer, 3 C + 2 V / tp + C outside; BENCHMARKS.md "Layout planner") */
    if (tp > 1) rep += 2.0 * C;
    double per_layer = rep + split / (double)tp;
    double moe_layers = m->n_experts > 0 ? L - (double)m->first_dense : 0.0;
    double outside = outside_floats(m, tp, sp);
    if (sp) per_layer = 2.0 * C + (4.0 * C + split) / (double)tp; /* Note [Sequence-parallel memory] */
    if (moe_layers > 0 && moe_bwd > outside) outside = moe_bwd;   /* which peak is higher */
    double floats = L * per_layer + moe_layers * moe + outside;
    if (recompute) { /* Note [Recomputation memory] */
        rc_terms r = recompute_terms(m, tp, sp);
        double ends = 3.0 * C + (m->arch == SL_PLAN_GPT2 ? 1.5 : 2.0) * C / (double)tp + (tp > 1 ? C : 0.0);
        double head = L * r.keep + 3.0 * C + (double)m->vocab / (double)tp;
        if (sp) {
            ends = 2.75 * C;
            head = L * r.keep + 1.2 * C + (1.8 * C + (double)m->vocab) / (double)tp;
        }
        double layer = (L - 1.0) * r.keep + r.work + ends;
        if (moe_layers > 0) { /* every MoE layer's extra kept buffers; the recomputed one's are in `moe` */
            layer += (moe_layers - 1.0) * moe_keep;
            head += moe_layers * moe_keep;
        }
        floats = (layer > head ? layer : head) + (moe_layers > 0 ? moe : 0.0);
    }
    if (moe_layers > 0) floats += reserved;
    return 4.0 * N * floats;
}

/* ---- communication ---- */

static const sl_plan_link *axis_link(const sl_plan_cluster *cl, int64_t stride, int64_t size) {
    return stride * size <= cl->devices_per_host ? &cl->intra : &cl->inter;
}

/* ring collectives over g ranks: factor of bytes on the wire and latency steps */
static double t_all_reduce(const sl_plan_link *l, int64_t g, double bytes) {
    if (g <= 1) return 0;
    return 2.0 * (double)(g - 1) * l->alpha_s + 2.0 * (double)(g - 1) / (double)g * bytes / l->beta_Bps;
}
static double t_gather(const sl_plan_link *l, int64_t g, double bytes) { /* all-gather / reduce-scatter */
    if (g <= 1) return 0;
    return (double)(g - 1) * l->alpha_s + (double)(g - 1) / (double)g * bytes / l->beta_Bps;
}

/* Note [Planner DP across hosts]
 * suanli's all-reduce over a communicator that spans hosts with r > 1 of its ranks on every host is
 * hierarchical (Note [Hierarchical sub-communicators], src/comm/init.c): reduce-scatter among the r ranks
 * of a host, all-reduce of each 1/r shard among the h hosts, all-gather inside the host. The DP group of a
 * layout (stride tp, rank order tp fastest) has r = devices_per_host / tp ranks on a host when tp divides
 * devices_per_host and the group spans hosts; with h = dp / r hosts (dp a multiple of r):
 *   AR_hier(n) = 2 (r-1)/r n / beta_intra + 2 (h-1)/h (n / r) / beta_flow + per bucket 2 (r-1) alpha_intra
 *                + 2 (h-1) alpha_inter
 * Uneven hosts (dp not a multiple of r), reduce-scatter and all-gather stay flat rings over the inter link.
 * Every DP collective pays its latency once per bucket (buckets x 2 (dp-1) alpha for the flat rings); until
 * 2026-12-05 the whole-gradient terms added one call's latency on top of that.
 * beta_flow: the flows that leave a host at once share its NICs (links.inter_host.nics_per_host, default one
 * per device, so beta is then per device as before). The tp DP groups of a host all reduce at once, each with
 * r flows leaving the host (hierarchical) or one (a flat ring crosses each host boundary once), so
 * beta_flow = beta_nic x min(1, nics / (tp r)) or beta_nic x min(1, nics / min(tp, devices_per_host)) (with
 * tp above devices_per_host, each of the host's devices is in a different DP group). Checked on 2 namespace
 * hosts x 2 ranks, one 1 Gbit/s link each (0.1194 GB/s of TCP payload): a 4 MiB all-reduce measured 35.1 ms
 * hierarchical and 52.7 ms as a flat ring (BENCHMARKS-comm.md, "Latency between hosts"), the formulas give
 * 35.7 and 52.9 ms; DP = 4 training steps waited 105.0-109.5 ms against 110.8-111.6 predicted
 * (bench/plan_hosts.sh, BENCHMARKS.md). */
static double flow_beta(const sl_plan_cluster *cl, int64_t flows) {
    int64_t nics = cl->nics_per_host > 0 ? cl->nics_per_host : cl->devices_per_host; /* 0: one per device */
    double share = flows > nics ? (double)nics / (double)flows : 1.0;
    return cl->inter.beta_Bps * share;
}

/* flat DP rings leaving a host at once: one per DP group with ranks on it, min(tp, devices_per_host) */
static int64_t ring_flows(const sl_plan_cluster *cl, const sl_plan_layout *l) {
    return l->tp < cl->devices_per_host ? l->tp : cl->devices_per_host;
}

/* the DP group's all-reduce of `bytes` in `buckets` buckets, as suanli runs it (Note [Planner DP across
 * hosts]); sets l->dp_hier and l->dp_per_host */
static double t_dp_all_reduce(const sl_plan_cluster *cl, sl_plan_layout *l, double bytes, double buckets) {
    int64_t D = cl->devices_per_host, r = l->tp <= D && D % l->tp == 0 ? D / l->tp : 1;
    l->dp_hier = 0;
    l->dp_per_host = l->tp * l->dp <= D ? l->dp : r;
    if (l->dp <= 1) return 0;
    if (l->tp * l->dp <= D) { /* inside a host */
        const sl_plan_link *in = &cl->intra;
        sl_plan_link bw = {0, in->beta_Bps}; /* latency once per bucket, below */
        return t_all_reduce(&bw, l->dp, bytes) + buckets * in->alpha_s * 2.0 * (double)(l->dp - 1);
    }
    if (r >= 2 && l->dp % r == 0) {
        int64_t h = l->dp / r;
        l->dp_hier = 1;
        double bf = flow_beta(cl, l->tp * r);
        return 2.0 * (double)(r - 1) / (double)r * bytes / cl->intra.beta_Bps +
               2.0 * (double)(h - 1) / (double)h * (bytes / (double)r) / bf +
               buckets *
                   (2.0 * (double)(r - 1) * cl->intra.alpha_s + 2.0 * (double)(h - 1) * cl->inter.alpha_s);
    }
    sl_plan_link ring = {0, flow_beta(cl, ring_flows(cl, l))};
    return t_all_reduce(&ring, l->dp, bytes) + buckets * cl->inter.alpha_s * 2.0 * (double)(l->dp - 1);
}

static int64_t world_of(const sl_plan_cluster *cl, const sl_plan_job *job) {
    return job->devices > 0 ? job->devices : cl->hosts * cl->devices_per_host;
}

static sl_status check_layout(const sl_plan_model *m, const sl_plan_cluster *cl, const sl_plan_job *job,
                              const sl_plan_layout *l) {
    int64_t W = world_of(cl, job);
    if (l->dp * l->tp * l->pp != W)
        return sl_fail(SL_ERR_INVALID, "layout: dp %lld x tp %lld x pp %lld is not the %lld devices",
                       (long long)l->dp, (long long)l->tp, (long long)l->pp, (long long)W);
    if (m->n_head % l->tp || (m->n_kv_head % l->tp && l->tp % m->n_kv_head) || m->ffn % l->tp)
        return sl_fail(
            SL_ERR_INVALID,
            "--tp: %lld does not divide the heads (%lld) and ffn, or the kv heads (%lld) and it do not "
            "divide each other",
            (long long)l->tp, (long long)m->n_head, (long long)m->n_kv_head);
    if (l->sp && l->tp < 2)
        return sl_fail(SL_ERR_INVALID, "--sequence-parallel on: needs tp > 1 (tp %lld)", (long long)l->tp);
    if (l->sp && job->seq_len % l->tp)
        return sl_fail(SL_ERR_INVALID, "--sequence-parallel on: --seq-len %lld is not divisible by tp %lld",
                       (long long)job->seq_len, (long long)l->tp);
    if (l->sp && m->n_experts > 0)
        return sl_fail(
            SL_ERR_INVALID,
            "--sequence-parallel on: the planner models sequence parallelism for dense models only");
    if (m->n_layer % (l->pp * l->vpp))
        return sl_fail(SL_ERR_INVALID, "--pp: %lld x %lld virtual stages does not divide the %lld layers",
                       (long long)l->pp, (long long)l->vpp, (long long)m->n_layer);
    if (l->dp % l->ep || (l->ep > 1 && (m->n_experts == 0 || m->n_experts % l->ep)))
        return sl_fail(SL_ERR_INVALID, "--ep: %lld must divide dp (%lld) and the experts (%lld)",
                       (long long)l->ep, (long long)l->dp, (long long)m->n_experts);
    if (l->etp &&
        (l->tp <= 1 || m->n_experts == 0 || m->moe_kind == SL_PLAN_MOE_MIXTRAL || m->moe_ffn % l->tp))
        return sl_fail(
            SL_ERR_INVALID,
            "--expert-tensor-parallel-size: splits the routed experts of a Qwen2-MoE or DeepSeek-V3 "
            "model over tp > 1 dividing their width (tp %lld, expert width %lld, %lld experts%s)",
            (long long)l->tp, (long long)m->moe_ffn, (long long)m->n_experts,
            m->moe_kind == SL_PLAN_MOE_MIXTRAL && m->n_experts ? ", Mixtral" : "");
    if (l->micro_batch < 1 || job->global_batch % (l->micro_batch * l->dp))
        return sl_fail(SL_ERR_INVALID, "--micro-batch: %lld x dp %lld does not divide --global-batch %lld",
                       (long long)l->micro_batch, (long long)l->dp, (long long)job->global_batch);
    if (l->zero < 0 || l->zero > 3 || (l->zero > 0 && l->dp == 1))
        return sl_fail(SL_ERR_INVALID, "--zero: stage %d needs dp > 1 (dp is %lld)", l->zero,
                       (long long)l->dp);
    if (job->seq_len > m->max_seq)
        return sl_fail(SL_ERR_INVALID, "--seq-len: %lld is above the model's %lld positions",
                       (long long)job->seq_len, (long long)m->max_seq);
    return SL_OK;
}

/* the bucket walk over stage `which`'s flat buffer */
static sl_status stage_buckets(const sl_plan_model *m, const sl_plan_job *job, const sl_plan_layout *l,
                               int which, bucket_stats *b) {
    int64_t Ls = stage_layers(m, l, which);
    int64_t cap = Ls * (16 + 3 * (m->n_experts > 0 ? local_experts(m, l->ep) : 0)) + 16;
    if (cap > (1 << 26)) return sl_fail(SL_ERR_INVALID, "plan: %lld parameters per stage", (long long)cap);
    plan_param *plist = malloc(sizeof *plist * (size_t)cap);
    if (!plist) return sl_fail(SL_ERR_NOMEM, "plan: out of memory");
    int n =
        stage_param_list(m, l->tp, stage_first_layer(m, l, which), Ls, l->ep, l->etp, which, plist, (int)cap);
    buckets(plist, n, job->bucket_elems > 0 ? job->bucket_elems : (1 << 20), l->dp, l->ep, b);
    free(plist);
    return SL_OK;
}

/* Note [Interleaved slots]: under interleaved 1F1B a stage holds K_c slots of each of its v model chunks
 * (Lc = Ls / v layers each), K_c the most micro-batches in flight on chunk c in the unit order of
 * src/train/pipeline.c (make_schedule: (p - s - 1) 2 + (v - 1) p warm-up forwards, then one forward and one
 * backward, the forwards visiting the chunks p micro-batches at a time, the backwards in reverse). This
 * replays that order and returns sum_c K_c (p 2, v 2, m 4: stage 0 holds 4 + 2 slots of half its layers,
 * 3 stages' worth where 1F1B holds 2). */
static double vpp_slots(int64_t p, int64_t s, int64_t v, int64_t m) {
    int64_t total = m * v, w = (p - s - 1) * 2 + (v - 1) * p, live[64] = {0}, K[64] = {0};
    if (v > 64) v = 64;
    if (w > total) w = total;
    for (int64_t i = 0; i < 2 * total; i++) {
        /* unit i: the warm-up forwards, then forward w + j and backward j alternately, then the backwards */
        int64_t k, fwd;
        if (i < w)
            k = i, fwd = 1;
        else if (i < w + 2 * (total - w))
            k = (i - w) / 2 + ((i - w) % 2 ? 0 : w), fwd = (i - w) % 2 == 0;
        else
            k = i - w - (total - w), fwd = 0;
        int64_t c = (k / p) % v;
        if (!fwd) c = v - 1 - c;
        live[c] += fwd ? 1 : -1;
        if (live[c] > K[c]) K[c] = live[c];
    }
    double n = 0;
    for (int64_t c = 0; c < v; c++) n += (double)(K[c] > 0 ? K[c] : 1);
    return n;
}

/* one stage's memory (Note [Planner memory model]) */
static sl_status stage_memory(const sl_plan_model *m, const sl_plan_job *job, const sl_plan_layout *l,
                              int which, sl_plan_mem *mm) {
    int64_t Ls = stage_layers(m, l, which);
    bucket_stats b;
    SL_TRY(stage_buckets(m, job, l, which, &b));
    int slots = l->zero >= 2 && l->accum == 1;
    double shard = l->zero ? b.shard : b.total;
    *mm = (sl_plan_mem){0};
    mm->params = 4.0 * (l->zero == 3 ? shard : b.total);
    mm->grads = slots ? 0 : 4.0 * b.total;
    mm->grad_shard = l->zero >= 2 ? 4.0 * shard : 0;
    mm->optim = 8.0 * shard;
    mm->slots = 0;
    if (slots) mm->slots = 4.0 * (b.first_bucket + 3.0 * b.max_bucket);
    if (l->zero == 3 && b.n_buckets == 1) /* one use interval: gathered once and held all step */
        mm->slots += 4.0 * b.total;
    else if (l->zero ==
             3) { /* gathered parameters: 3 of the largest, fewer when there are few buckets (fitted) */
        int k = b.n_buckets - 3 < 3 ? b.n_buckets - 3 : 3;
        mm->slots += 4.0 * (double)(k < 1 ? 1 : k) * b.max_bucket;
    }
    double act =
        sl_plan_activation_bytes(m, l->micro_batch, job->seq_len, l->tp, l->ep, l->etp, l->recompute, l->sp);
    if (which != STAGE_ALL) {
        /* a stage's graph slot: its share of the layers plus its ends, fitted on sl_graph_plan (Llama L2
         * C64, pp 2 and tp 2 x pp 2, tests/plan/test_plan.c): the first stage ~4 C floats per token (the
         * embedding output, the stage output and its received gradient), the last 2 V / tp + 2 C (final
         * norm, logits and their gradient); 1F1B keeps min(m, p) slots on the first stage, 1 on the last */
        double N = (double)(l->micro_batch * job->seq_len), C = (double)m->hidden;
        double V = (double)m->vocab, t = (double)l->tp;
        double outside = 4.0 * N * outside_floats(m, l->tp, l->sp);
        double layers = (act - outside) / (double)m->n_layer * (double)Ls;
        int64_t k = which == STAGE_FIRST ? l->pp : which == STAGE_MID ? l->pp - 1 : 1; /* 1F1B: p - s */
        double inflight = (double)(l->accum < k ? l->accum : k);
        /* under SP (Note [Sequence-parallel memory]) the first stage's ends are 3.5 C (GPT-2) or 2.25 C,
         * the last stage's V / tp + 2 C */
        double first = l->sp ? (m->arch == SL_PLAN_GPT2 ? 3.5 : 2.25) * C : 4.0 * C;
        double last = l->sp ? V / t + 2.0 * C : 2.0 * V / t + 2.0 * C;
        act = which == STAGE_LAST ? layers + 4.0 * N * last : inflight * (layers + 4.0 * N * first);
        /* interleaved (Note [Interleaved slots]): sum_c K_c chunk slots of Ls / v layers; the ends as 1F1B's
         * first stage, or on the last stage the head once (its logits' gradient overwrites them) and one
         * stage output per further slot (fitted on sl_graph_plan: GPT-2 and the Llama L8, pp 2, v 2 / 4,
         * tp 1 / 2, V 1.5 C and 32 C, test_plan) */
        int64_t s_idx = which == STAGE_FIRST ? 0 : which == STAGE_MID ? 1 : l->pp - 1;
        double nslots = l->vpp > 1 ? vpp_slots(l->pp, s_idx, l->vpp, l->accum) : 0;
        if (l->vpp > 1)
            act = nslots / (double)l->vpp * layers +
                  4.0 * N * (which == STAGE_LAST ? V / t + 2.0 * C + (nslots - 1.0) * C : inflight * first);
        if (l->recompute) { /* Note [Recomputation memory]: each slot recomputes its own layers */
            rc_terms r = recompute_terms(m, l->tp, l->sp);
            double ends = l->sp ? (which == STAGE_FIRST ? 2.75 : 2.25) : (which == STAGE_FIRST ? 4.75 : 3.75);
            double slot = ((double)Ls - 1.0) * r.keep + r.work + ends * C;
            double head = (double)Ls * r.keep + (l->sp ? 1.6 : 2.0) * C + V / t;
            if (which == STAGE_LAST && head > slot) slot = head;
            /* the slots in flight share one scratch region (Note [Shared scratch], src/graph/graph.c):
             * each further slot keeps only the layer inputs and the stage output; the split costs one
             * layer's k more where the stage has two or more layers */
            double own = (double)Ls * r.keep + (l->sp ? C / t : C);
            double more = which == STAGE_LAST || inflight < 2 ? 0.0 : (inflight - 1.0) * own;
            if (more > 0 && Ls > 1) more += r.keep;
            if (l->vpp > 1) { /* one chunk's slot, then each further slot keeps its chunk's layer inputs */
                double Lc = (double)Ls / (double)l->vpp;
                slot = (Lc - 1.0) * r.keep + r.work + ends * C;
                more = (nslots - 1.0) * Lc * r.keep + (Lc > 1 ? r.keep : 0.0) + 3.0 * C;
                /* the last chunk's slot keeps its logits for the loss's backward in its own arena, beside
                 * the scratch the recomputed layers need (fitted: W + 0.5 C) */
                if (which == STAGE_LAST)
                    slot = Lc * r.keep + (l->sp ? 1.6 : 2.0) * C + V / t + r.work + 0.5 * C,
                    more = (nslots - 1.0) * Lc * r.keep;
            }
            act = 4.0 * N * (slot + more);
        }
    }
    mm->activations = act;
    mm->total = mm->params + mm->grads + mm->grad_shard + mm->optim + mm->slots + mm->activations;
    return SL_OK;
}

/* the fullest device: the whole model's, or the larger of the first and last pipeline stages' */
static sl_status memory(const sl_plan_model *m, const sl_plan_job *job, sl_plan_layout *l) {
    if (l->pp <= 1) return stage_memory(m, job, l, STAGE_ALL, &l->mem);
    sl_plan_mem first, last, mid;
    SL_TRY(stage_memory(m, job, l, STAGE_FIRST, &first));
    SL_TRY(stage_memory(m, job, l, STAGE_LAST, &last));
    l->mem = first.total >= last.total ? first : last;
    if (l->pp > 2) {
        SL_TRY(stage_memory(m, job, l, STAGE_MID, &mid));
        if (mid.total > l->mem.total) l->mem = mid;
    }
    return SL_OK;
}

static sl_status timing(const sl_plan_model *m, const sl_plan_cluster *cl, const sl_plan_job *job,
                        sl_plan_layout *l) {
    double T = (double)job->seq_len, b = (double)l->micro_batch, mb = (double)l->accum;
    double tokens_mb = b * T;
    double fpt = sl_plan_flops_per_token(m, job->seq_len);
    /* under pp the slowest stage sets the pace: the last one, with its share of the layers plus the LM head
     * (6 V C FLOPs per token; 5.4 layers' worth for GPT-2 124M at T 64): Note [Uneven pipeline stages] */
    double head = 6.0 * (double)m->vocab * (double)m->hidden;
    /* full recomputation runs every layer's forward again, not the LM head (it lies past the last layer
     * boundary: Note [Full recomputation], src/graph/autodiff.c) */
    if (l->recompute) fpt += (fpt - head) / 3.0;
    double rate = cl->peak_flops * cl->gemm_efficiency;
    double per_layer = (fpt - head) / (double)m->n_layer;
    double fstage = fpt, Ls = (double)m->n_layer;
    if (l->pp > 1) {
        int64_t nf = stage_layers(m, l, STAGE_FIRST), nm = stage_layers(m, l, STAGE_MID),
                nl = stage_layers(m, l, STAGE_LAST);
        fstage =
            fmax(fmax((double)nf, l->pp > 2 ? (double)nm : 0) * per_layer, (double)nl * per_layer + head);
        Ls = (double)(nf > nl ? nf : nl); /* TP all-reduces: the longest stage's layers */
        if (l->pp > 2 && nm > Ls) Ls = (double)nm;
    }
    /* MoE layers under TP (Note [MoE under TP], src/nn/moe.c): the router and the shared experts run whole
     * on every TP rank, and so do the routed experts unless expert tensor parallelism splits their
     * intermediate dimension (l->etp); that share of the FLOPs is not divided by tp */
    double rep_share = 0, moe_frac = 0;
    if (m->n_experts > 0 && m->arch != SL_PLAN_GPT2) {
        double C = (double)m->hidden, routed = 0, rest = 0, nl = 0;
        for (int64_t k = 0; k < m->n_layer; k++)
            if (moe_layer(m, k)) {
                routed += 6.0 * 3.0 * C * (double)m->top_k * (double)m->moe_ffn;
                rest += 6.0 * (3.0 * C * (double)m->shared_ffn + C * (double)m->n_experts);
                nl += 1.0;
            }
        double f = sl_plan_flops_per_token(m, job->seq_len);
        rep_share = (rest + (l->etp ? 0.0 : routed)) / f;
        moe_frac = nl / (double)m->n_layer;
    }
    double t_mm = fstage * tokens_mb * ((1.0 - rep_share) / (double)l->tp + rep_share) / rate;
    double act = sl_plan_activation_bytes(m, l->micro_batch, job->seq_len, l->tp, l->ep, l->etp, 0, l->sp) /
                 (double)l->pp;
    double t_elem = act * (ELEM_TRAFFIC_X10 / 10.0) / cl->mem_bw_Bps;
    double x_bytes = 4.0 * tokens_mb * (double)m->hidden; /* fp32 activations, one micro-batch */
    const sl_plan_link *tpl = axis_link(cl, 1, l->tp), *dpl = axis_link(cl, l->tp, l->dp),
                       *ppl = axis_link(cl, l->tp * l->dp, l->pp);
    /* TP all-reduces per layer: f's backward and g's forward around attention and around the MLP; a MoE
     * layer's MLP has them only when its experts are split (l->etp). Recomputation adds none: suanli keeps
     * the collectives' outputs instead of running them again (Megatron's full recomputation runs g's two
     * all-reduces again: 6 per layer) */
    double ar_layer = (1.0 - moe_frac) * 4.0 + moe_frac * (l->etp ? 4.0 : 2.0);
    double t_tp = Ls * ar_layer * t_all_reduce(tpl, l->tp, x_bytes);
    /* SP: each all-reduce is an all-gather and a reduce-scatter, the same bytes and steps; recomputation
     * gathers again before each layer's attention and MLP (Note [Full recomputation]) */
    if (l->sp && l->recompute) t_tp += Ls * 2.0 * t_gather(tpl, l->tp, x_bytes);
    double t_ep = 0;
    if (l->ep > 1) {
        const sl_plan_link *epl = axis_link(cl, l->tp, l->ep);
        double a2a = (double)(l->ep - 1) * epl->alpha_s +
                     (double)(l->ep - 1) / (double)l->ep * x_bytes * (double)m->top_k / epl->beta_Bps;
        t_ep = Ls * 4.0 * a2a;
    }
    double t_mb = t_mm + t_elem + t_tp + t_ep;
    double v = (double)l->vpp, p = (double)l->pp;
    l->bubble = l->pp > 1 ? (p - 1.0) / (v * mb + p - 1.0) : 0.0;
    double t_pipe = t_mb * (mb + (p - 1.0) / v);
    double t_pp = l->pp > 1 ? 2.0 * mb * v * (ppl->alpha_s + x_bytes / ppl->beta_Bps) : 0.0;
    /* DP: volumes of the stage's gradients */
    bucket_stats bs;
    SL_TRY(stage_buckets(m, job, l, l->pp > 1 ? STAGE_FIRST : STAGE_ALL, &bs));
    double gbytes = 4.0 * bs.total, t_dp = 0;
    double lat = (double)bs.n_buckets * dpl->alpha_s * 2.0 * (double)(l->dp - 1);
    /* reduce-scatter and all-gather: flat rings; across hosts each host's tp groups send one flow each */
    sl_plan_link gl = {0, dpl == &cl->inter ? flow_beta(cl, ring_flows(cl, l)) : dpl->beta_Bps}; /* `lat` */
    double t_ar = t_dp_all_reduce(cl, l, gbytes, (double)bs.n_buckets);
    if (l->dp > 1) {
        if (l->zero == 0) t_dp = t_ar;
        if (l->zero == 1) t_dp = t_ar + t_gather(&gl, l->dp, gbytes);
        if (l->zero == 2) t_dp = 2.0 * t_gather(&gl, l->dp, gbytes) + lat;
        if (l->zero == 3) t_dp = (bs.n_buckets == 1 ? 2.0 : 3.0) * t_gather(&gl, l->dp, gbytes) + lat;
    }
    double owned = l->zero ? bs.shard : bs.total;
    double t_opt = 32.0 * owned / cl->mem_bw_Bps;
    l->t_compute = (t_mm + t_elem) * mb;
    l->t_tp_comm = t_tp * mb;
    l->t_ep_comm = t_ep * mb;
    l->t_pp_comm = t_pp;
    l->t_dp_comm = t_dp * (1.0 - cl->overlap);
    l->t_optim = t_opt;
    l->step_sec = t_pipe + t_pp + l->t_dp_comm + t_opt;
    double tokens = (double)job->global_batch * T;
    l->tokens_per_s = tokens / l->step_sec;
    double W = (double)(l->dp * l->tp * l->pp);
    l->mfu = sl_plan_flops_per_token(m, job->seq_len) * tokens / l->step_sec / (W * cl->peak_flops);
    return SL_OK;
}

sl_status sl_plan_evaluate(const sl_plan_model *m, const sl_plan_cluster *cl, const sl_plan_job *job,
                           sl_plan_layout *l) {
    if (job->global_batch < 1) return sl_fail(SL_ERR_INVALID, "--global-batch: must be >= 1");
    if (job->seq_len < 1) return sl_fail(SL_ERR_INVALID, "--seq-len: must be >= 1");
    if (l->vpp < 1) l->vpp = 1;
    if (l->ep < 1) l->ep = 1;
    SL_TRY(check_layout(m, cl, job, l));
    l->accum = job->global_batch / (l->micro_batch * l->dp);
    if (l->vpp > 1 && (l->pp == 1 || l->accum % l->pp))
        return sl_fail(SL_ERR_INVALID,
                       "--vpp: interleaving needs pp > 1 and micro-batches (%lld) a multiple of pp",
                       (long long)l->accum);
    l->first_layers = l->last_layers = 0;
    if (l->pp > 1 && l->vpp == 1) { /* the split that balances the last stage's LM head */
        double fpt = sl_plan_flops_per_token(m, job->seq_len),
               head = 6.0 * (double)m->vocab * (double)m->hidden;
        int f, z;
        sl_pp_balanced_split((int)m->n_layer, (int)l->pp, head / ((fpt - head) / (double)m->n_layer), &f, &z);
        l->first_layers = f;
        l->last_layers = z;
    }
    SL_TRY(memory(m, job, l));
    l->fits = l->mem.total <= cl->mem_bytes * (1.0 - cl->mem_reserve);
    SL_TRY(timing(m, cl, job, l));
    /* what `suanli train` runs: dp x tp x pp (1F1B or interleaved), ZeRO 0-3 but not ZeRO-3 with pp; expert
     * parallelism for the MoE models */
    l->runnable = !(l->pp > 1 && l->zero == 3) && (l->ep == 1 || m->n_experts > 0);
    return SL_OK;
}

static int cmp_layout(const void *a, const void *b) {
    const sl_plan_layout *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    if (x->step_sec != y->step_sec) return x->step_sec < y->step_sec ? -1 : 1;
    if (x->mem.total != y->mem.total) return x->mem.total < y->mem.total ? -1 : 1;
    return 0;
}

typedef struct {
    sl_plan_layout *v;
    int n, cap;
} lvec;

static sl_status push(lvec *v, const sl_plan_layout *l) {
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 256;
        sl_plan_layout *nv = realloc(v->v, sizeof *nv * (size_t)cap);
        if (!nv) return sl_fail(SL_ERR_NOMEM, "plan: out of memory");
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = *l;
    return SL_OK;
}

static int want(int64_t fixed, int64_t x) { return fixed <= 0 || fixed == x; }

sl_status sl_plan_enumerate(const sl_plan_model *m, const sl_plan_cluster *cl, const sl_plan_job *job,
                            sl_plan_layout **out, int *n) {
    *out = NULL;
    *n = 0;
    int64_t W = world_of(cl, job);
    if (job->devices > cl->hosts * cl->devices_per_host)
        return sl_fail(SL_ERR_INVALID, "--devices: %lld is more than the cluster's %lld",
                       (long long)job->devices, (long long)(cl->hosts * cl->devices_per_host));
    if (job->tp > 0 && W % job->tp)
        return sl_fail(SL_ERR_INVALID, "--tp: %lld does not divide the %lld devices", (long long)job->tp,
                       (long long)W);
    if (job->pp > 0 && W % job->pp)
        return sl_fail(SL_ERR_INVALID, "--pp: %lld does not divide the %lld devices", (long long)job->pp,
                       (long long)W);
    if (job->dp > 0 && W % job->dp)
        return sl_fail(SL_ERR_INVALID, "--dp: %lld does not divide the %lld devices", (long long)job->dp,
                       (long long)W);
    lvec v = {0};
    for (int64_t tp = 1; tp <= W && tp <= 64; tp = job->tp > 0 ? W + 1 : tp * 2) {
        if (job->tp > 0) tp = job->tp;
        if (W % tp || !want(job->tp, tp)) continue;
        for (int64_t pp = 1; pp * tp <= W && pp <= m->n_layer; pp++) {
            if ((W / tp) % pp || m->n_layer % pp || !want(job->pp, pp)) continue;
            int64_t dp = W / tp / pp;
            if (!want(job->dp, dp)) continue;
            for (int64_t ep = 1; ep <= dp; ep *= 2)
                for (int etp = 0; etp <= (tp > 1 && m->n_experts > 0 && m->moe_kind != SL_PLAN_MOE_MIXTRAL);
                     etp++) {
                    if (!want(job->ep, ep) || (ep > 1 && m->n_experts == 0)) continue;
                    if ((job->etp == 1 && etp) || (job->etp == 2 && !etp)) continue;
                    for (int64_t b = 1; b <= job->global_batch; b *= 2) {
                        if (!want(job->micro_batch, b)) continue;
                        for (int z = 0; z <= 3; z++) {
                            if (job->zero > 0 && job->zero - 1 != z) continue;
                            for (int rs = 0; rs < 4; rs++) {
                                int rc = rs & 1, sp = rs >> 1;
                                if ((job->recompute == 1 && rc) || (job->recompute == 2 && !rc)) continue;
                                if ((job->sp == 1 && sp) || (job->sp == 2 && !sp)) continue;
                                if (sp && (tp < 2 || m->n_experts > 0 || job->seq_len % tp)) continue;
                                for (int64_t vpp = 1; vpp <= (pp > 1 ? 2 : 1); vpp++) {
                                    sl_plan_layout l = {.dp = dp,
                                                        .tp = tp,
                                                        .pp = pp,
                                                        .ep = ep,
                                                        .etp = etp,
                                                        .vpp = vpp,
                                                        .micro_batch = b,
                                                        .zero = z,
                                                        .recompute = rc,
                                                        .sp = sp};
                                    if (sl_plan_evaluate(m, cl, job, &l) != SL_OK) continue;
                                    sl_status st = push(&v, &l);
                                    if (st != SL_OK) {
                                        free(v.v);
                                        return st;
                                    }
                                }
                            }
                        }
                    }
                }
        }
    }
    if (v.n == 0) {
        /* say why with the first explicit layout's own error, if one was requested */
        sl_plan_layout l = {
            .dp = job->dp > 0 ? job->dp : W / ((job->tp > 0 ? job->tp : 1) * (job->pp > 0 ? job->pp : 1)),
            .tp = job->tp > 0 ? job->tp : 1,
            .pp = job->pp > 0 ? job->pp : 1,
            .ep = job->ep > 0 ? job->ep : 1,
            .etp = job->etp == 2,
            .micro_batch = job->micro_batch > 0 ? job->micro_batch : 1,
            .zero = job->zero > 0 ? job->zero - 1 : 0,
            .sp = job->sp == 2};
        sl_status st = sl_plan_evaluate(m, cl, job, &l);
        if (st == SL_OK)
            st = sl_fail(SL_ERR_INVALID,
                         "plan: no layout of %lld devices is consistent with the "
                         "model and --global-batch %lld",
                         (long long)W, (long long)job->global_batch);
        return st;
    }
    qsort(v.v, (size_t)v.n, sizeof *v.v, cmp_layout);
    *out = v.v;
    *n = v.n;
    return SL_OK;
}
