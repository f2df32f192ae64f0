/* Mixture-of-experts kernels: routing (MOE_ROUTE and its backward), the router losses, and token
 * gather / combine (Note [MoE dispatch in a static graph], src/ops/moe_ops.c). Every reduction runs in a
 * fixed order, so results do not depend on the thread count.
 *
 * The route node's memory: the (N, E) weights, then aux: scores s (N, E), mask (N, E: 0 unrouted,
 * 1 kept, 2 dropped by capacity), E routed counts, E kept counts (floats). */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/gemm.h"
#include "device/cpu/kernels/moe.h"

#define PAR(work) ((int64_t)(work) >= 16384)

static float *route_scores(const sl_tensor *r) { return (float *)r->data + r->ne[0] * r->ne[1]; }
static float *route_mask(const sl_tensor *r) { return (float *)r->data + 2 * r->ne[0] * r->ne[1]; }
static float *route_counts(const sl_tensor *r) { return (float *)r->data + 3 * r->ne[0] * r->ne[1]; }

/* index of the largest v[i] with !taken[i]; ties resolve to the lower index (torch.topk on CPU) */
static int64_t argmax_free(const float *v, const unsigned char *taken, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

/* hm 1: the bf16 value of v, 2: the f16 value */
static float half_round(float v, int hm) {
    return hm == 1 ? sl_bf16_to_f32(sl_f32_to_bf16(v)) : sl_f16_to_f32(sl_f32_to_f16(v));
}

/* One row: scores, choice values, (group-limited) top-k selection into mask (1 = selected), weights. */
static void route_row(const sl_tensor *n, const float *x, float *y, float *s, float *mask, float *choice,
                      unsigned char *taken) {
    const sl_tensor *bias = n->src[1];
    int64_t E = n->ne[1];
    int k = n->iparams[0], sigmoid = n->iparams[1], norm = n->iparams[2], ng = n->iparams[3],
        tg = n->iparams[4], hm = n->iparams[SL_MOE_ROUTE_IP_HALF] & 3,
        ops = n->iparams[SL_MOE_ROUTE_IP_HALF] & SL_MOE_ROUTE_HALF_OPS;
    float scale = n->fparams[0];
    if (sigmoid) {
        for (int64_t e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-x[e]));
    } else {
        float mx = -INFINITY, sum = 0;
        for (int64_t e = 0; e < E; e++) mx = x[e] > mx ? x[e] : mx;
        for (int64_t e = 0; e < E; e++) sum += (s[e] = expf(x[e] - mx));
        for (int64_t e = 0; e < E; e++) s[e] /= sum;
    }
    if (ops) /* half scores: the choice adds the f32 bias to them (a half + f32 tensor sum is f32) */
        for (int64_t e = 0; e < E; e++) s[e] = half_round(s[e], hm);
    for (int64_t e = 0; e < E; e++) choice[e] = s[e] + (bias ? ((const float *)bias->data)[e] : 0.0f);
    if (ng > 1) { /* DeepSeek-V3: keep the topk_group groups with the largest sum of their top two */
        int64_t gs = E / ng;
        float gscore[1024];
        unsigned char gtaken[1024] = {0};
        for (int g = 0; g < ng; g++) {
            memset(taken, 0, (size_t)gs);
            int64_t i1 = argmax_free(choice + g * gs, taken, gs);
            taken[i1] = 1;
            int64_t i2 = argmax_free(choice + g * gs, taken, gs);
            gscore[g] = choice[g * gs + i1] + choice[g * gs + i2];
        }
        for (int j = 0; j < tg; j++) {
            int best = -1;
            for (int g = 0; g < ng; g++)
                if (!(gtaken[g] & 1) && (best < 0 || gscore[g] > gscore[best])) best = g;
            gtaken[best] = 1;
        }
        for (int g = 0; g < ng; g++) /* transformers: masked_fill(~group_mask, -inf) */
            if (!gtaken[g])
                for (int64_t i = 0; i < gs; i++) choice[g * gs + i] = -INFINITY;
    }
    memset(taken, 0, (size_t)E);
    for (int j = 0; j < k; j++) taken[argmax_free(choice, taken, E)] = 1;
    float sum = 0;
    for (int64_t e = 0; e < E; e++) {
        mask[e] = taken[e];
        if (taken[e]) sum += s[e];
    }
    if (ops) { /* torch's half ops: d = sum + 1e-20, w = s / d, w * scale, each rounded */
        float d = half_round(half_round(sum, hm) + 1e-20f, hm);
        for (int64_t e = 0; e < E; e++)
            y[e] = taken[e] ? half_round((norm ? half_round(s[e] / d, hm) : s[e]) * scale, hm) : 0.0f;
        return;
    }
    float inv = norm && sum > 0 ? 1.0f / sum : 1.0f;
    for (int64_t e = 0; e < E; e++) y[e] = taken[e] ? s[e] * inv * scale : 0.0f;
}

sl_status sl_k_moe_route(sl_tensor *n) {
    sl_tensor *a = n->src[0];
    int64_t N = a->ne[0], E = a->ne[1], as = a->nb[0], cap = n->iparams[5];
    if (E > 1024 || n->iparams[3] > 1024) return sl_fail(SL_ERR_INVALID, "moe_route: more than 1024 experts");
    float *py = n->data, *ps = route_scores(n), *pm = route_mask(n), *cnt = route_counts(n);
    unsigned char *taken_all = malloc((size_t)(N ? N : 1) * (size_t)E);
    float *choice_all = malloc(sizeof(float) * (size_t)(N ? N : 1) * (size_t)E);
    if (!taken_all || !choice_all) {
        free(taken_all);
        free(choice_all);
        return sl_fail(SL_ERR_NOMEM, "moe_route: out of memory");
    }
#pragma omp parallel for schedule(static) if (PAR(N * E))
    for (int64_t r = 0; r < N; r++)
        route_row(n, (const float *)a->data + r * as, py + r * E, ps + r * E, pm + r * E, choice_all + r * E,
                  taken_all + r * E);
    free(taken_all);
    free(choice_all);
    int hm = n->iparams[SL_MOE_ROUTE_IP_HALF]; /* Note [Half routing weights] (src/nn/moe.c) */
    if (hm && !(hm & SL_MOE_ROUTE_HALF_OPS))   /* half ops: rounded by route_row */
        for (int64_t i = 0; i < N * E; i++) py[i] = half_round(py[i], hm);
    /* counts, and the capacity: an expert keeps its first `cap` tokens in token order, i.e. a token whose
     * position among the tokens routed to e (kept or not) is below cap. For a sequence shard (src2: Note
     * [Capacity under sequence parallelism], src/nn/moe.c) the position counts the whole batch's tokens
     * routed to e before it: those of the earlier batch rows (every shard's) and of the earlier shards in its
     * own batch row, then its own shard's */
    const sl_tensor *prior = n->src[2];
    int64_t P = 1, B = 1, me = 0;
    const float *pc = NULL;
    if (prior) {
        B = n->iparams[SL_MOE_ROUTE_IP_BLOCKS], me = n->iparams[SL_MOE_ROUTE_IP_SHARD];
        P = sl_nelements(prior) / (B * E), pc = prior->data;
        if (B < 1 || N % B || P * B * E != sl_nelements(prior) || me >= P)
            return sl_fail(SL_ERR_INVALID, "moe_route: shard counts of %lld floats for %lld blocks of %lld",
                           (long long)sl_nelements(prior), (long long)B, (long long)E);
    }
    float *routed = cnt, *kept = cnt + E;
    double before[1024] = {0},
           pos[1024] = {0}; /* tokens routed to e in the earlier blocks; before this one */
    for (int64_t e = 0; e < E; e++) routed[e] = kept[e] = 0;
    for (int64_t r = 0; r < N; r++) {
        if (prior && r % (N / B) == 0) { /* block b starts: every earlier block, then the earlier shards' */
            int64_t b = r / (N / B);
            for (int64_t e = 0; e < E; e++) {
                pos[e] = before[e];
                for (int64_t p = 0; p < P; p++) {
                    float c = pc[(p * B + b) * E + e];
                    before[e] += c;
                    if (p < me) pos[e] += c;
                }
            }
        }
        for (int64_t e = 0; e < E; e++) {
            if (pm[r * E + e] == 0) continue;
            routed[e] += 1;
            if (cap > 0 && (prior ? pos[e] : kept[e]) >= (double)cap) {
                pm[r * E + e] = 2;
                py[r * E + e] = 0;
            } else {
                kept[e] += 1;
            }
            pos[e] += 1;
        }
    }
    return SL_OK;
}

/* The backward of a route of half ops (SL_MOE_ROUTE_HALF_OPS), as torch's autograd runs the forward's half
 * tensors, each result rounded (R): with d = R(R(sum of the selected s) + 1e-20) and g the gradient of the
 * weights w = R(R(s / d) * scale): g2 = R(R(g) * scale); the division's gradients R(g2 / d) to s and
 * R(sum of -R(g2 * R(R(s / d) / d))) to d, which the sum hands to every selected s, R(R(g2 / d) + that);
 * then sigmoid_backward of the half scores, grad * (1 - s) * s. Checked bitwise against torch's autograd on
 * the DeepSeek-V3 fixture's step-0 gradients (tests/hf/test_hf_models.c). */
static void route_back_half_ops(const float *s, const float *m, const float *dy, float *du, int64_t E,
                                int sigmoid, int norm, float scale, int hm) {
    float S = 0;
    for (int64_t e = 0; e < E; e++) {
        du[e] = m[e] == 1 ? half_round(half_round(dy[e], hm) * scale, hm) : 0.0f; /* g2 */
        if (m[e] != 0) S += s[e];
    }
    if (norm) {
        float d = half_round(half_round(S, hm) + 1e-20f, hm), gd = 0;
        for (int64_t e = 0; e < E; e++)
            if (m[e] != 0) gd -= half_round(du[e] * half_round(half_round(s[e] / d, hm) / d, hm), hm);
        gd = half_round(gd, hm);
        for (int64_t e = 0; e < E; e++)
            du[e] = m[e] != 0 ? half_round(half_round(du[e] / d, hm) + gd, hm) : 0.0f;
    }
    if (sigmoid) {
        for (int64_t e = 0; e < E; e++) du[e] = du[e] * (1.0f - s[e]) * s[e]; /* sigmoid_backward's order */
    } else { /* not built by the models (a half softmax would round in its own backward) */
        float d2 = 0;
        for (int64_t e = 0; e < E; e++) d2 += du[e] * s[e];
        for (int64_t e = 0; e < E; e++) du[e] = s[e] * (du[e] - d2);
    }
}

/* d logits from d weights: through the kept weights, the top-k normalisation and the score function */
sl_status sl_k_moe_route_back(sl_tensor *n) {
    sl_tensor *f = n->src[0], *g = n->src[1];
    int64_t N = f->ne[0], E = f->ne[1], gs = g->nb[0];
    int sigmoid = f->iparams[1], norm = f->iparams[2], hm = f->iparams[SL_MOE_ROUTE_IP_HALF] & 3,
        ops = f->iparams[SL_MOE_ROUTE_IP_HALF] & SL_MOE_ROUTE_HALF_OPS;
    float scale = f->fparams[0];
    const float *ps = route_scores(f), *pm = route_mask(f), *pg = g->data;
    float *pd = n->data;
#pragma omp parallel for schedule(static) if (PAR(N * E))
    for (int64_t r = 0; r < N; r++) {
        const float *s = ps + r * E, *m = pm + r * E, *dy = pg + r * gs;
        float *du = pd + r * E, S = 0, dot = 0;
        if (ops) { /* Note [DeepSeek-V3's router under autocast] (src/nn/moe.c): torch's half autograd */
            route_back_half_ops(s, m, dy, du, E, sigmoid, norm, scale, hm);
            continue;
        }
        for (int64_t e = 0; e < E; e++) {
            /* d(unnormalised weight u = s * scale); half weights: their gradient rounded as a half tensor's
             */
            du[e] = m[e] == 1 ? (hm ? half_round(dy[e], hm) : dy[e]) * scale : 0.0f;
            if (m[e] != 0) S += s[e];
        }
        if (norm && S > 0) { /* w = u / S over the selection (dropped entries stay in S) */
            for (int64_t e = 0; e < E; e++) dot += du[e] * s[e];
            for (int64_t e = 0; e < E; e++) du[e] = m[e] != 0 ? (du[e] - dot / S) / S : 0.0f;
        }
        if (sigmoid) {
            for (int64_t e = 0; e < E; e++) du[e] = du[e] * (s[e] * (1.0f - s[e]));
        } else {
            float d2 = 0;
            for (int64_t e = 0; e < E; e++) d2 += du[e] * s[e];
            for (int64_t e = 0; e < E; e++) du[e] = s[e] * (du[e] - d2);
        }
    }
    return SL_OK;
}

/* the aux loss's per-row probabilities: the softmax scores, or the sigmoid scores normalised to sum 1 */
static void aux_probs(const float *s, int64_t E, int sigmoid, float *p) {
    float S = 0;
    for (int64_t e = 0; e < E; e++) S += s[e];
    for (int64_t e = 0; e < E; e++) p[e] = sigmoid ? s[e] / S : s[e];
}

static float row_lse(const float *x, int64_t E) {
    float mx = -INFINITY;
    double sum = 0;
    for (int64_t e = 0; e < E; e++) mx = x[e] > mx ? x[e] : mx;
    for (int64_t e = 0; e < E; e++) sum += exp((double)x[e] - mx);
    return mx + (float)log(sum);
}

/* Note [Router losses]
 * Switch / Megatron load balancing: aux = E / (N^2 k) * sum_e count_e * sum_n p_ne, with count_e the
 * tokens routed to e before capacity (a constant) and p the router probabilities; it is 1 when routing
 * is uniform. Router z-loss (ST-MoE): z = mean_n logsumexp(logits_n)^2. One layer's node; the model adds
 * the layers' nodes to the language-model loss. */
sl_status sl_k_moe_router_loss(sl_tensor *n) {
    sl_tensor *x = n->src[0], *route = n->src[1];
    int64_t N = x->ne[0], E = x->ne[1], xs = x->nb[0];
    int k = route->iparams[0], sigmoid = route->iparams[1];
    const float *ps = route_scores(route), *cnt = route_counts(route);
    float *p = malloc(sizeof(float) * (size_t)E);
    if (!p) return sl_fail(SL_ERR_NOMEM, "moe_router_loss: out of memory");
    double aux = 0, z = 0;
    for (int64_t r = 0; r < N; r++) {
        aux_probs(ps + r * E, E, sigmoid, p);
        for (int64_t e = 0; e < E; e++) aux += (double)cnt[e] * p[e];
        double l = row_lse((const float *)x->data + r * xs, E);
        z += l * l;
    }
    free(p);
    aux = N ? aux * (double)E / ((double)N * (double)N * k) : 0;
    z = N ? z / (double)N : 0;
    float *out = n->data;
    out[0] = (float)(n->fparams[0] * aux + n->fparams[1] * z);
    out[1] = (float)aux;
    out[2] = (float)z;
    return SL_OK;
}

sl_status sl_k_moe_router_loss_back(sl_tensor *n) {
    sl_tensor *f = n->src[0], *x = n->src[1], *route = n->src[2], *dl = n->src[3];
    int64_t N = x->ne[0], E = x->ne[1], xs = x->nb[0];
    int k = route->iparams[0], sigmoid = route->iparams[1];
    float g = ((const float *)dl->data)[0];
    float ca = f->fparams[0] * g * (float)E / ((float)N * (float)N * (float)k),
          cz = f->fparams[1] * g * 2.0f / N;
    const float *ps = route_scores(route), *cnt = route_counts(route);
    float *pd = n->data;
#pragma omp parallel for schedule(static) if (PAR(N * E))
    for (int64_t r = 0; r < N; r++) {
        const float *s = ps + r * E, *xr = (const float *)x->data + r * xs;
        float *d = pd + r * E, S = 0, dot = 0;
        for (int64_t e = 0; e < E; e++) S += s[e];
        for (int64_t e = 0; e < E; e++) dot += ca * cnt[e] * (sigmoid ? s[e] / S : s[e]);
        for (int64_t e = 0; e < E; e++) {
            float dp = ca * cnt[e];
            d[e] = sigmoid ? (dp - dot) / S * s[e] * (1.0f - s[e]) : s[e] * (dp - dot);
        }
        if (cz != 0) {
            float l = row_lse(xr, E);
            for (int64_t e = 0; e < E; e++) d[e] += cz * l * expf(xr[e] - l);
        }
    }
    return SL_OK;
}

/* the tokens expert e keeps, in token order: idx[0..count) */
static int64_t kept_rows(const sl_tensor *route, int64_t e, int64_t *idx) {
    int64_t N = route->ne[0], E = route->ne[1], c = 0;
    const float *pm = route_mask(route);
    for (int64_t r = 0; r < N; r++)
        if (pm[r * E + e] == 1) idx[c++] = r;
    return c;
}

static sl_status rows_for(const sl_tensor *route, int64_t e, int64_t R, const char *op, int64_t **idx,
                          int64_t *cnt) {
    *idx = malloc(sizeof(int64_t) * (size_t)(route->ne[0] ? route->ne[0] : 1));
    if (!*idx) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", op);
    *cnt = kept_rows(route, e, *idx);
    if (*cnt > R) {
        free(*idx);
        return sl_fail(SL_ERR_INVALID, "%s: expert %lld keeps %lld tokens, more than its %lld rows", op,
                       (long long)e, (long long)*cnt, (long long)R);
    }
    return SL_OK;
}

sl_status sl_k_moe_gather(sl_tensor *n) {
    sl_tensor *x = n->src[0], *route = n->src[1];
    int64_t R = n->ne[0], C = n->ne[1], E = route->ne[1], e = n->iparams[0], xs = x->nb[0], cnt, *idx;
    SL_TRY(rows_for(route, e, R, "moe_gather", &idx, &cnt));
    const float *pw = route->data, *px = x->data;
    float *py = n->data;
    int w = n->iparams[1];
    if (!n->iparams[2]) memset(py + cnt * C, 0, sizeof(float) * (size_t)((R - cnt) * C));
#pragma omp parallel for schedule(static) if (PAR(cnt * C))
    for (int64_t r = 0; r < cnt; r++) {
        float *y = py + r * C;
        const float *xr = px + idx[r] * xs;
        float s = w ? pw[idx[r] * E + e] : 1.0f;
        for (int64_t c = 0; c < C; c++) y[c] = s * xr[c];
    }
    free(idx);
    return SL_OK;
}

sl_status sl_k_moe_combine(sl_tensor *n) {
    sl_tensor *y = n->src[0], *route = n->src[1], *acc = n->src[2];
    int64_t N = n->ne[0], C = n->ne[1], E = route->ne[1], e = n->iparams[0], R = y->ne[0], ys = y->nb[0], cnt,
            *idx;
    SL_TRY(rows_for(route, e, R, "moe_combine", &idx, &cnt));
    const float *pw = route->data, *py = y->data;
    float *out = n->data;
    for (int64_t r = 0; r < N; r++) {
        if (acc)
            memcpy(out + r * C, (const float *)acc->data + r * acc->nb[0], sizeof(float) * (size_t)C);
        else
            memset(out + r * C, 0, sizeof(float) * (size_t)C);
    }
    int w = n->iparams[1];
#pragma omp parallel for schedule(static) if (PAR(cnt * C))
    for (int64_t r = 0; r < cnt; r++) { /* distinct tokens: no two rows write the same output row */
        float *o = out + idx[r] * C, s = w ? pw[idx[r] * E + e] : 1.0f;
        const float *yr = py + r * ys;
        if (w == 2) { /* bf16 products of the route's bf16 weights (Note [bf16 MoE combine], src/nn/moe.c) */
            for (int64_t c = 0; c < C; c++) o[c] += sl_bf16_to_f32(sl_f32_to_bf16(s * yr[c]));
            continue;
        }
        for (int64_t c = 0; c < C; c++) o[c] += s * yr[c];
    }
    free(idx);
    return SL_OK;
}

sl_status sl_k_moe_combine_back_gate(sl_tensor *n) {
    sl_tensor *y = n->src[0], *route = n->src[1], *dy = n->src[2];
    int64_t N = n->ne[0], E = n->ne[1], C = y->ne[1], e = n->iparams[0], R = y->ne[0], ys = y->nb[0],
            ds = dy->nb[0], cnt, *idx;
    SL_TRY(rows_for(route, e, R, "moe_combine_back_gate", &idx, &cnt));
    float *out = n->data;
    memset(out, 0, sizeof(float) * (size_t)(N * E));
    const float *py = y->data, *pd = dy->data;
    for (int64_t r = 0; r < cnt; r++) {
        const float *yr = py + r * ys, *d = pd + idx[r] * ds;
        float dot = 0;
        for (int64_t c = 0; c < C; c++) dot += yr[c] * d[c];
        out[idx[r] * E + e] = dot;
    }
    free(idx);
    return SL_OK;
}

/* ---------------- the routed SwiGLU expert on its kept rows ---------------- */

static float silu_f(float x) { return x / (1.0f + expf(-x)); }

/* Note [Routed expert rows]
 * x holds expert e's kept tokens in rows [0, n) (MOE_GATHER, n from the route's kept count) and zeros
 * below; the GEMMs run on those n rows only, so a dropless layer costs FLOPs in proportion to k * N instead
 * of E * N. The forward keeps w1 x and w3 x of the n rows for backward (aux), which recomputes nothing
 * else. What still costs O(R) per expert: the output's rows below n are written as zeros (the op's
 * contract), and MOE_COMBINE copies its (N, C) accumulator; the gathers that feed this op skip their zero
 * fill (MOE_GATHER iparams[2]), and its backward leaves the rows past n of dx unwritten, since their only
 * reader is the gather's backward, which reads the kept rows. */
sl_status sl_k_moe_expert_ffn(sl_tensor *n) {
    sl_tensor *x = n->src[0], *w1 = n->src[1], *w3 = n->src[2], *w2 = n->src[3], *route = n->src[4];
    int64_t R = n->ne[0], C = n->ne[1], I = w1->ne[0], E = route->ne[1], e = n->iparams[0];
    int64_t cnt = n->iparams[1] > 0 ? sl_k_moe_ep_expert_count(route, n->iparams[1], (int)e, R) /* rcnt */
                                    : (int64_t)route_counts(route)[E + e];
    if (cnt < 0 || cnt > R)
        return sl_fail(SL_ERR_INVALID,
                       "moe_expert_ffn: expert %lld keeps %lld tokens, more than its %lld rows", (long long)e,
                       (long long)cnt, (long long)R);
    float *y = n->data, *aux = (float *)n->data + R * C, *a1 = aux + 1, *a3 = a1 + R * I;
    aux[0] = (float)cnt;
    memset(y + cnt * C, 0, sizeof(float) * (size_t)((R - cnt) * C));
    if (!cnt) return SL_OK;
    float *h = malloc(sizeof(float) * (size_t)(cnt * I));
    if (!h) return sl_fail(SL_ERR_NOMEM, "moe_expert_ffn: out of memory");
    sl_sgemm(0, 1, cnt, I, C, 1.0f, x->data, C, w1->data, C, 0.0f, a1, I);
    sl_sgemm(0, 1, cnt, I, C, 1.0f, x->data, C, w3->data, C, 0.0f, a3, I);
    for (int64_t i = 0; i < cnt * I; i++) h[i] = silu_f(a1[i]) * a3[i];
    sl_sgemm(0, 1, cnt, C, I, 1.0f, h, I, w2->data, I, 0.0f, y, C);
    free(h);
    return SL_OK;
}

/* d(w1 x), d(w3 x) and dw2 from dy, over the kept rows (rows below are zero) */
sl_status sl_k_moe_expert_ffn_back(sl_tensor *n) {
    sl_tensor *f = n->src[0], *dy = n->src[1], *w2 = n->src[2];
    int64_t R = f->ne[0], C = f->ne[1], I = w2->ne[1], ds = dy->nb[0];
    const float *aux = (const float *)f->data + R * C, *a1 = aux + 1, *a3 = a1 + R * I;
    int64_t cnt = (int64_t)aux[0];
    float *d1 = n->data, *d3 = d1 + R * I, *dw2 = d3 + R * I; /* rows past cnt: never read */
    if (!cnt) {
        memset(dw2, 0, sizeof(float) * (size_t)(C * I));
        return SL_OK;
    }
    float *h = d1; /* silu(w1 x) * w3 x, then dh, in the d1 rows before they are written */
    for (int64_t i = 0; i < cnt * I; i++) h[i] = silu_f(a1[i]) * a3[i];
    sl_sgemm(1, 0, C, I, cnt, 1.0f, dy->data, ds, h, I, 0.0f, dw2, I);      /* dw2 = dy^T h */
    sl_sgemm(0, 0, cnt, I, C, 1.0f, dy->data, ds, w2->data, I, 0.0f, h, I); /* dh = dy w2 */
    for (int64_t i = 0; i < cnt * I; i++) {
        float sg = 1.0f / (1.0f + expf(-a1[i])), dh = h[i];
        d3[i] = dh * a1[i] * sg;                                /* dh * silu(w1 x) */
        d1[i] = dh * a3[i] * sg * (1.0f + a1[i] * (1.0f - sg)); /* dh * w3 x * silu'(w1 x) */
    }
    return SL_OK;
}

/* dx, dw1, dw3 from the pre-activation gradients, over the kept rows */
sl_status sl_k_moe_expert_ffn_back_x(sl_tensor *n) {
    sl_tensor *f = n->src[0], *b = n->src[1], *x = n->src[2], *w1 = n->src[3], *w3 = n->src[4];
    int64_t R = f->ne[0], C = f->ne[1], I = w1->ne[0];
    int64_t cnt = (int64_t)((const float *)f->data)[R * C];
    const float *d1 = b->data, *d3 = d1 + R * I;
    float *dx = n->data, *dw1 = dx + R * C, *dw3 = dw1 + I * C;
    /* dx rows past cnt are left unwritten: x's gradient flows only into MOE_GATHER's backward, which reads
     * the kept rows (Note [Routed expert rows]) */
    if (!cnt) {
        memset(dw1, 0, sizeof(float) * (size_t)(2 * I * C));
        return SL_OK;
    }
    sl_sgemm(1, 0, I, C, cnt, 1.0f, d1, I, x->data, C, 0.0f, dw1, C);
    sl_sgemm(1, 0, I, C, cnt, 1.0f, d3, I, x->data, C, 0.0f, dw3, C);
    sl_sgemm(0, 0, cnt, C, I, 1.0f, d1, I, w1->data, C, 0.0f, dx, C);
    sl_sgemm(0, 0, cnt, C, I, 1.0f, d3, I, w3->data, C, 1.0f, dx, C);
    return SL_OK;
}
