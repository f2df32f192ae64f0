/* Graph machinery: planner reuse and safety, completion hooks, leaf binding errors, the null backend,
 * overwriting first gradient writes, splitting a backward into input- and weight-gradient passes, the
 * reserved rows' region, the shared scratch region of phased graphs, the half-output pass (Note [Half
 * outputs], src/graph/fuse.c). */
#include <stdlib.h>
#include <string.h>

#include "suanli/device.h"
#include "suanli/graph.h"
#include "testutil.h"

static int g_hook_calls, g_hook_last;
static sl_status hook(sl_graph *g, int i, sl_tensor *n, void *user) {
    (void)g;
    (void)n;
    (void)user;
    TU_CHECK(i == g_hook_last + 1, "hooks in order: %d after %d", i, g_hook_last);
    g_hook_last = i;
    g_hook_calls++;
    return SL_OK;
}

static sl_status stop_hook(sl_graph *g, int i, sl_tensor *n, void *user) {
    (void)g;
    (void)n;
    (void)user;
    return i == 2 ? sl_fail(SL_ERR_ABORTED, "stop at node 2") : SL_OK;
}

/* Note [Overwriting first gradient writes]: a tied embedding / LM head (table gradient written by a dW
 * MATMUL, then EMBEDDING_BACK), a bias (ACC), a norm-like scale (ACC through MUL) and
 * an untied table (EMBEDDING_BACK first). With overwrite on,
 * one pass over garbage gradients equals one pass over zeroed ones, bitwise; overwrite for the first of two
 * passes equals two accumulating passes from zero (gradient accumulation). */
static void test_grad_overwrite(void) {
    enum { V = 37, C = 24, NT = 29 };
    sl_ctx *ctx = sl_ctx_new(1024);
    float *pm = malloc(sizeof(float) * (2 * V * C + V + C)),
          *gm = malloc(sizeof(float) * (2 * V * C + V + C));
    float *ref = malloc(sizeof(float) * (2 * V * C + V + C));
    int32_t ids[NT], tg[NT];
    for (int i = 0; i < 2 * V * C + V + C; i++) pm[i] = 0.02f * (float)((i * 37 % 23) - 11);
    for (int i = 0; i < NT; i++) ids[i] = (i * 7) % V, tg[i] = (i * 5 + 3) % V;
    sl_tensor *E = sl_new_tensor_2d(ctx, SL_F32, V, C), *b = sl_new_tensor_1d(ctx, SL_F32, V),
              *s = sl_new_tensor_1d(ctx, SL_F32, C), *P = sl_new_tensor_2d(ctx, SL_F32, V, C);
    sl_tensor *params[4] = {E, b, s, P};
    int64_t off = 0;
    for (int i = 0; i < 4; i++) {
        sl_tensor_bind(params[i], pm + off);
        sl_set_param(params[i]);
        params[i]->grad = sl_new_tensor(ctx, SL_F32, params[i]->ndim, params[i]->ne);
        sl_tensor_bind(params[i]->grad, gm + off);
        off += sl_nelements(params[i]);
    }
    sl_tensor *tids = sl_new_tensor_1d(ctx, SL_I32, NT), *ttg = sl_new_tensor_1d(ctx, SL_I32, NT);
    sl_set_input(tids);
    sl_set_input(ttg);
    sl_tensor_bind(tids, ids);
    sl_tensor_bind(ttg, tg);
    sl_tensor *h =
        sl_gelu(ctx, sl_add(ctx, sl_mul(ctx, sl_embedding(ctx, E, tids), s), sl_embedding(ctx, P, ttg)));
    sl_tensor *loss = sl_cross_entropy(ctx, sl_linear(ctx, h, E, b), ttg);
    sl_graph *g = sl_graph_new(ctx);
    sl_graph_build_forward(g, loss);
    sl_graph_build_backward(g, loss, 1.0f);
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK, "plan");
    int nfirst = 0;
    for (int i = 0; i < sl_graph_n_nodes(g); i++)
        nfirst += (sl_graph_node(g, i)->flags & SL_FLAG_GRAD_FIRST) != 0;
    TU_CHECK(nfirst == 4, "one first gradient writer per parameter: %d", nfirst);
    size_t bytes = sizeof(float) * (size_t)off;
    memset(gm, 0, bytes); /* reference: zeroed, accumulating */
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute");
    memcpy(ref, gm, bytes);
    for (int i = 0; i < (int)off; i++) gm[i] = 1e3f + (float)i; /* stale gradients */
    sl_graph_set_grad_overwrite(g, 1);
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute (overwrite)");
    TU_CHECK(memcmp(gm, ref, bytes) == 0, "overwrite == zero + accumulate (bitwise)");
    sl_graph_set_grad_overwrite(g, 0);
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute (second pass)");
    memcpy(ref, gm, bytes); /* overwrite, then accumulate */
    memset(gm, 0, bytes);
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK && sl_graph_compute(g, NULL, NULL) == SL_OK,
             "2 passes");
    TU_CHECK(memcmp(gm, ref, bytes) == 0, "accumulation after an overwriting pass (bitwise)");
    sl_graph_free(g);
    sl_ctx_free(ctx);
    free(pm);
    free(gm);
    free(ref);
}

/* Note [Splitting the backward]: a two-layer MLP stage whose input takes a gradient (a pipeline stage's
 * x_in / dx_in), backward seeded from outside. Split, the B range alone gives the input's gradient bitwise
 * the unsplit backward's and writes no parameter gradient; the W range then gives every parameter
 * gradient bitwise. A graph where an in-place write would move across a read of its storage is refused. */
enum { SN = 6, SC = 8, SNP = 2 * SC * SC + 2 * SC };
typedef struct {
    sl_ctx *ctx;
    sl_graph *g;
    sl_tensor *x, *dx;
    int n_fwd;
    float pm[SNP], gm[SNP], xd[SN * SC], dxd[SN * SC], sd[SN * SC];
} split_net;

static void split_net_build(split_net *n) {
    n->ctx = sl_ctx_new(1024);
    sl_ctx *ctx = n->ctx;
    for (int i = 0; i < SNP; i++) n->pm[i] = 0.05f * (float)((i * 29 % 19) - 9), n->gm[i] = 0;
    for (int i = 0; i < SN * SC; i++)
        n->xd[i] = 0.1f * (float)((i * 13 % 11) - 5), n->sd[i] = 0.01f * (float)((i * 7 % 17) - 8),
        n->dxd[i] = 0;
    sl_tensor *w1 = sl_new_tensor_2d(ctx, SL_F32, SC, SC), *b1 = sl_new_tensor_1d(ctx, SL_F32, SC),
              *w2 = sl_new_tensor_2d(ctx, SL_F32, SC, SC), *b2 = sl_new_tensor_1d(ctx, SL_F32, SC);
    sl_tensor *ps[4] = {w1, b1, w2, b2};
    int64_t off = 0;
    for (int i = 0; i < 4; i++) {
        sl_tensor_bind(ps[i], n->pm + off);
        sl_set_param(ps[i]);
        ps[i]->grad = sl_new_tensor(ctx, SL_F32, ps[i]->ndim, ps[i]->ne);
        sl_tensor_bind(ps[i]->grad, n->gm + off);
        off += sl_nelements(ps[i]);
    }
    n->x = sl_new_tensor_2d(ctx, SL_F32, SN, SC);
    n->dx = sl_new_tensor_2d(ctx, SL_F32, SN, SC);
    sl_tensor_bind(n->x, n->xd);
    sl_tensor_bind(n->dx, n->dxd);
    sl_set_param(n->x);
    n->x->grad = n->dx;
    sl_tensor *out = sl_add(ctx, sl_linear(ctx, sl_gelu(ctx, sl_linear(ctx, n->x, w1, b1)), w2, b2), n->x);
    sl_tensor *seed = sl_new_tensor_2d(ctx, SL_F32, SN, SC);
    sl_set_input(seed);
    sl_tensor_bind(seed, n->sd);
    n->g = sl_graph_new(ctx);
    sl_graph_build_forward(n->g, out);
    n->n_fwd = sl_graph_n_nodes(n->g);
    sl_graph_build_backward_seeded(n->g, out, seed, NULL, 0);
}

static void test_split_backward(void) {
    split_net a, b;
    split_net_build(&a);
    split_net_build(&b);
    TU_CHECK(sl_graph_plan(a.g, sl_backend_cpu(), NULL) == SL_OK &&
                 sl_graph_compute(a.g, NULL, NULL) == SL_OK,
             "unsplit backward");
    int n = sl_graph_n_nodes(b.g), w = sl_graph_split_backward(b.g, b.n_fwd, b.dx);
    TU_CHECK(w > b.n_fwd && w < n && sl_graph_n_nodes(b.g) == n, "split: B [%d, %d), W [%d, %d)", b.n_fwd, w,
             w, n);
    for (int i = 0; i < n; i++)
        TU_CHECK(sl_graph_node(b.g, i)->order == i, "node %d keeps its order field", i);
    TU_CHECK(sl_graph_plan(b.g, sl_backend_cpu(), NULL) == SL_OK, "plan the split graph");
    TU_CHECK(sl_graph_compute_range(b.g, 0, w, NULL, NULL) == SL_OK, "forward + B");
    TU_CHECK(memcmp(a.dxd, b.dxd, sizeof a.dxd) == 0, "B: the input's gradient, bitwise the unsplit one");
    float zeros[SNP] = {0};
    TU_CHECK(memcmp(b.gm, zeros, sizeof zeros) == 0, "B writes no parameter gradient");
    TU_CHECK(sl_graph_compute_range(b.g, w, n, NULL, NULL) == SL_OK, "W");
    TU_CHECK(memcmp(a.gm, b.gm, sizeof a.gm) == 0, "W: the parameters' gradients, bitwise the unsplit ones");
    TU_CHECK(sl_graph_split_backward(a.g, a.n_fwd, NULL) == a.n_fwd, "no input gradient: everything is W");
    for (split_net *q = &a; q; q = q == &a ? &b : NULL) {
        sl_graph_free(q->g);
        sl_ctx_free(q->ctx);
    }
    /* the refusal: W reads t before B's in-place ACC into t (t, r = 3 t, t += x, dx += t) */
    sl_ctx *ctx = sl_ctx_new(64);
    sl_tensor *x = sl_new_tensor_1d(ctx, SL_F32, 4), *dx = sl_new_tensor_1d(ctx, SL_F32, 4);
    sl_tensor *t = sl_scale(ctx, x, 2.0f), *r = sl_scale(ctx, t, 3.0f);
    sl_tensor *wr = sl_acc(ctx, dx, sl_acc(ctx, t, x));
    sl_graph *g = sl_graph_new(ctx);
    sl_graph_build_forward(g, r);
    sl_graph_build_forward(g, wr);
    int before[8], m = sl_graph_n_nodes(g);
    for (int i = 0; i < m; i++) before[i] = sl_graph_node(g, i)->id;
    TU_CHECK(m == 4 && sl_graph_split_backward(g, 0, dx) == -1, "an in-place write across a read is refused");
    for (int i = 0; i < m; i++)
        TU_CHECK(sl_graph_node(g, i)->id == before[i], "refused: node %d unchanged", i);
    sl_graph_free(g);
    sl_ctx_free(ctx);
}

/* Note [Reserved rows]: SL_FLAG_ROWS_CAP storages planned in their own region of reserved address space
 * (a chain of elementwise ops, every third flagged; one live at a time): right values, the flagged storages
 * outside the arena, pages resident once written; again after a re-plan (the region released and reserved
 * anew), after the arena moves into caller memory (as into an EP window: the region stays), and in one arena
 * under SUANLI_PLAN_RESERVE=0 and on the null backend (not host-visible). */
static void test_reserved_region(void) {
    enum { N = 8192, K = 12 };
    sl_ctx *ctx = sl_ctx_new(256);
    float *xd = malloc(sizeof(float) * N), *ref = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) xd[i] = (float)(i % 97) / 97.0f;
    sl_tensor *x = sl_new_tensor_1d(ctx, SL_F32, N), *y = x, *flagged[K];
    sl_tensor_bind(x, xd);
    int nf = 0;
    for (int k = 0; k < K; k++) {
        y = (k % 2) ? sl_scale(ctx, y, 0.75f) : sl_add(ctx, y, x);
        if (k % 3 == 1) (flagged[nf++] = y)->flags |= SL_FLAG_ROWS_CAP;
    }
    for (int i = 0; i < N; i++) {
        float v = xd[i];
        for (int k = 0; k < K; k++) v = (k % 2) ? v * 0.75f : v + xd[i];
        ref[i] = v;
    }
    sl_graph *g = sl_graph_new(ctx);
    sl_graph_build_forward(g, y);
    void *moved = NULL;
    for (int round = 0; round < 4; round++) { /* plan, re-plan, move the arena, one arena */
        if (round == 3) setenv("SUANLI_PLAN_RESERVE", "0", 1);
        if (round != 2) {
            sl_plan_stats ps;
            TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), &ps) == SL_OK, "reserved: plan %d", round);
            TU_CHECK(ps.cap_bytes == sl_graph_cap_bytes(g) &&
                         ps.planned_bytes == sl_graph_arena_bytes(g) + ps.cap_bytes,
                     "reserved: plan stats %zu = %zu + %zu", ps.planned_bytes, sl_graph_arena_bytes(g),
                     ps.cap_bytes);
        } else {
            moved = malloc(sl_graph_arena_bytes(g));
            TU_CHECK(sl_graph_move_arena(g, moved, sl_graph_arena_bytes(g)) == SL_OK, "reserved: move arena");
        }
        size_t cap = sl_graph_cap_bytes(g);
        TU_CHECK(round == 3 ? cap == 0 : cap >= N * sizeof(float), "reserved: round %d region %zu bytes",
                 round, cap);
        TU_CHECK(round > 1 || sl_graph_cap_resident(g) == 0, "reserved: resident before any write");
        TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "reserved: compute %d", round);
        TU_CHECK(!memcmp(y->data, ref, sizeof(float) * N), "reserved: round %d values", round);
        sl_buffer *main_buf = y->buffer;
        for (int f = 0; f < nf; f++)
            TU_CHECK(round == 3 ? flagged[f]->buffer == main_buf : flagged[f]->buffer != main_buf,
                     "reserved: round %d node %d in the %s", round, f, round == 3 ? "arena" : "region");
        size_t res = sl_graph_cap_resident(g);
        TU_CHECK(round == 3 ? res == 0 : res >= N * sizeof(float) && res <= cap + 4096,
                 "reserved: round %d resident %zu of %zu", round, res, cap);
    }
    unsetenv("SUANLI_PLAN_RESERVE");
    TU_CHECK(sl_graph_plan(g, sl_backend_null(), NULL) == SL_OK && sl_graph_cap_bytes(g) == 0,
             "reserved: the null backend plans one arena (%zu reserved)", sl_graph_cap_bytes(g));
    sl_graph_free(g);
    free(moved);
    free(xd);
    free(ref);
    sl_ctx_free(ctx);
}

/* Note [Half outputs]: a bf16 MLP block as the GPT-2 builder makes it (LayerNorm, cast, rounded Linear,
 * GELU, cast, rounded Linear; backward: GELU_BACK then the cast to the first Linear's bf16 gradient). The
 * pass turns those three casts into views (and no others: a LayerNorm output read twice keeps its cast),
 * and the loss and every gradient are bitwise those of the unfused graph (SUANLI_FUSE=0). */
enum { HR = 37, HC = 32, HF = 4 * HC, HV = 11 };
typedef struct {
    sl_ctx *ctx;
    sl_graph *g;
    sl_tensor *loss, *p[6];
    float *mem, *grad;
} half_net;
static int half_net_build(half_net *n, int reread, int fuse) {
    static const int64_t shapes[6][2] = {{HC, 0}, {HC, 0}, {HF, HC}, {HF, 0}, {HV, HF}, {HV, 0}};
    n->ctx = sl_ctx_new(1024);
    size_t tot = 0;
    for (int i = 0; i < 6; i++) tot += (size_t)(shapes[i][0] * (shapes[i][1] ? shapes[i][1] : 1));
    n->mem = malloc(sizeof(float) * (tot + HR * HC));
    n->grad = calloc(tot, sizeof(float));
    sl_rng_fill_normal(n->mem, (int64_t)(tot + HR * HC), 5, 6, 0.0f, 0.5f);
    size_t off = 0;
    for (int i = 0; i < 6; i++) {
        n->p[i] = shapes[i][1] ? sl_new_tensor_2d(n->ctx, SL_F32, shapes[i][0], shapes[i][1])
                               : sl_new_tensor_1d(n->ctx, SL_F32, shapes[i][0]);
        sl_tensor_bind(n->p[i], n->mem + off);
        sl_set_param(n->p[i]);
        n->p[i]->grad = sl_new_tensor(n->ctx, SL_F32, n->p[i]->ndim, n->p[i]->ne);
        sl_tensor_bind(n->p[i]->grad, n->grad + off);
        off += (size_t)sl_nelements(n->p[i]);
    }
    sl_tensor *x = sl_new_tensor_2d(n->ctx, SL_F32, HR, HC), *tg = sl_new_tensor_1d(n->ctx, SL_I32, HR);
    sl_tensor_bind(x, n->mem + off);
    static int32_t tgd[HR];
    for (int i = 0; i < HR; i++) tgd[i] = (i * 7) % HV;
    sl_set_input(tg);
    sl_tensor_bind(tg, tgd);
    sl_tensor *ln = sl_layernorm(n->ctx, x, n->p[0], n->p[1], 1e-5f);
    sl_tensor *h = sl_linear_half_w_rounded(n->ctx, sl_cast(n->ctx, ln, SL_BF16), n->p[2],
                                            sl_round_half(n->ctx, n->p[3], SL_BF16));
    sl_tensor *f = sl_cast(n->ctx, sl_gelu(n->ctx, h), SL_BF16);
    sl_tensor *logits = sl_linear_half_w_rounded(n->ctx, f, n->p[4], sl_round_half(n->ctx, n->p[5], SL_BF16));
    if (reread) logits = sl_add(n->ctx, logits, sl_sum_to(n->ctx, ln, sl_new_tensor_1d(n->ctx, SL_F32, 1)));
    n->loss = sl_cross_entropy(n->ctx, logits, tg);
    n->g = sl_graph_new(n->ctx);
    sl_graph_build_forward(n->g, n->loss);
    sl_graph_build_backward(n->g, n->loss, 1.0f);
    if (!fuse) setenv("SUANLI_FUSE", "0", 1);
    int fused = sl_graph_fuse_half_outputs(n->g, sl_backend_cpu());
    TU_CHECK(sl_graph_plan(n->g, sl_backend_cpu(), NULL) == SL_OK &&
                 sl_graph_compute(n->g, NULL, NULL) == SL_OK,
             "half outputs: run (fuse %d): %s", fuse, sl_errmsg());
    unsetenv("SUANLI_FUSE");
    return fused;
}
static void half_net_free(half_net *n) {
    sl_graph_free(n->g);
    free(n->mem);
    free(n->grad);
    sl_ctx_free(n->ctx);
}
static void test_half_outputs(void) {
    /* a bf16 LayerNorm only with an even element count (its f32 statistics follow the output, aligned) */
    sl_ctx *c = sl_ctx_new(16);
    for (int64_t cols = 5; cols <= 6; cols++) {
        sl_tensor *x = sl_new_tensor_2d(c, SL_F32, 3, cols), *w = sl_new_tensor_1d(c, SL_F32, cols),
                  *b = sl_new_tensor_1d(c, SL_F32, cols);
        sl_tensor *ln = sl_layernorm(c, x, w, b, 1e-5f);
        ln->dtype = SL_BF16;
        TU_CHECK(sl_backend_cpu()->supports_op(sl_backend_cpu(), ln) == (cols % 2 == 0),
                 "a bf16 LayerNorm of 3 x %lld is %s", (long long)cols, cols % 2 ? "refused" : "run");
    }
    sl_ctx_free(c);
    for (int reread = 0; reread < 2; reread++) {
        half_net a, b;
        int fa = half_net_build(&a, reread, 0), fb = half_net_build(&b, reread, 1);
        TU_CHECK(fa == 0 && fb == (reread ? 2 : 3), "half outputs (reread %d): %d and %d casts fused", reread,
                 fa, fb);
        size_t tot = (size_t)(HC + HC + HF * HC + HF + HV * HF + HV);
        TU_CHECK(!memcmp(a.loss->data, b.loss->data, sizeof(float)),
                 "half outputs (reread %d): loss %.9g vs %.9g", reread, *(float *)a.loss->data,
                 *(float *)b.loss->data);
        TU_CHECK(!memcmp(a.grad, b.grad, sizeof(float) * tot),
                 "half outputs (reread %d): the gradients differ from the unfused graph's", reread);
        half_net_free(&a);
        half_net_free(&b);
    }
}

/* Note [Shared scratch]: two graphs run in two phases each, interleaved (A's first, B's first, A's second,
 * B's second), as two pipeline slots are. Each: a0 = x + x, a1 = 0.75 a0, s = a1 + x | b0 = 0.5 s, b1 = b0 +
 * x, out = b1 + s. The storages that live within a phase (a0, a1, b0, b1) go to the one scratch buffer both
 * graphs share; s, read across the boundary, and the output stay in each graph's arena. Were s put in the
 * scratch, B's first phase would overwrite A's and A's output would be wrong. */
typedef struct {
    sl_tensor *x, *a0, *a1, *s, *b0, *b1, *out;
    sl_graph *g;
} phased_net;

static void phased_build(sl_ctx *ctx, phased_net *n, float *xd, int N) {
    n->x = sl_new_tensor_1d(ctx, SL_F32, N);
    sl_tensor_bind(n->x, xd);
    n->a0 = sl_add(ctx, n->x, n->x);
    n->a1 = sl_scale(ctx, n->a0, 0.75f);
    n->s = sl_add(ctx, n->a1, n->x);
    n->b0 = sl_scale(ctx, n->s, 0.5f);
    n->b1 = sl_add(ctx, n->b0, n->x);
    n->out = sl_add(ctx, n->b1, n->s);
    n->g = sl_graph_new(ctx);
    sl_graph_build_forward(n->g, n->out);
    int ends[2] = {3, sl_graph_n_nodes(n->g)};
    sl_graph_set_phases(n->g, ends, 2);
}

static void test_shared_scratch(void) {
    enum { N = 4096 };
    sl_ctx *ctx = sl_ctx_new(64);
    float *xa = malloc(sizeof(float) * N), *xb = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) xa[i] = (float)(i % 89) / 89.0f, xb[i] = (float)(i % 13) - 6.0f;
    phased_net A, B;
    phased_build(ctx, &A, xa, N);
    phased_build(ctx, &B, xb, N);
    TU_CHECK(sl_graph_n_nodes(A.g) == 6, "scratch: %d nodes", sl_graph_n_nodes(A.g));
    sl_plan_stats pa, pb;
    TU_CHECK(sl_graph_plan(A.g, sl_backend_cpu(), &pa) == SL_OK &&
                 sl_graph_plan(B.g, sl_backend_cpu(), &pb) == SL_OK,
             "scratch: plan: %s", sl_errmsg());
    size_t sb = sl_graph_scratch_bytes(A.g);
    TU_CHECK(sb >= 2 * N * sizeof(float) && pa.scratch_bytes == sb &&
                 pa.planned_bytes == sl_graph_arena_bytes(A.g) + sb,
             "scratch: %zu scratch bytes, stats %zu = %zu + %zu", sb, pa.planned_bytes,
             sl_graph_arena_bytes(A.g), pa.scratch_bytes);
    /* unbound: refused, with the reason */
    TU_CHECK(sl_graph_compute(A.g, NULL, NULL) == SL_ERR_INVALID && strstr(sl_errmsg(), "scratch"),
             "scratch: compute without a scratch buffer: %s", sl_errmsg());
    sl_buffer *small = NULL, *buf = NULL;
    TU_CHECK(sl_backend_alloc(sl_backend_cpu(), sb - 64, &small) == SL_OK, "scratch: alloc");
    TU_CHECK(sl_graph_bind_scratch(A.g, small) == SL_ERR_INVALID, "scratch: a buffer too small is refused");
    TU_CHECK(sl_backend_alloc(sl_backend_cpu(), sb, &buf) == SL_OK, "scratch: alloc");
    TU_CHECK(sl_graph_bind_scratch(A.g, buf) == SL_OK && sl_graph_bind_scratch(B.g, buf) == SL_OK,
             "scratch: bind: %s", sl_errmsg());
    TU_CHECK(sl_graph_compute_range(A.g, 0, 3, NULL, NULL) == SL_OK &&
                 sl_graph_compute_range(B.g, 0, 3, NULL, NULL) == SL_OK &&
                 sl_graph_compute_range(A.g, 3, 6, NULL, NULL) == SL_OK &&
                 sl_graph_compute_range(B.g, 3, 6, NULL, NULL) == SL_OK,
             "scratch: compute: %s", sl_errmsg());
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        const float *x = k ? xb : xa, *got = (k ? B.out : A.out)->data;
        for (int i = 0; i < N; i++) {
            float s = (x[i] + x[i]) * 0.75f + x[i], want = (s * 0.5f + x[i]) + s;
            bad += got[i] != want;
        }
    }
    TU_CHECK(bad == 0, "scratch: %d wrong outputs", bad);
    phased_net *nets[2] = {&A, &B};
    for (int k = 0; k < 2; k++) {
        phased_net *n = nets[k];
        TU_CHECK(n->a0->buffer == buf && n->a1->buffer == buf && n->b0->buffer == buf && n->b1->buffer == buf,
                 "scratch: graph %d: the storages within a phase are in the shared buffer", k);
        TU_CHECK(n->s->buffer != buf && n->out->buffer != buf && n->s->buffer == n->out->buffer,
                 "scratch: graph %d: the saved value and the output stay in the arena", k);
    }
    setenv("SUANLI_PLAN_SCRATCH", "0", 1); /* the A/B switch: one arena */
    TU_CHECK(sl_graph_plan(A.g, sl_backend_cpu(), &pa) == SL_OK && sl_graph_scratch_bytes(A.g) == 0 &&
                 pa.scratch_bytes == 0 && sl_graph_compute(A.g, NULL, NULL) == SL_OK && A.a0->buffer != buf,
             "scratch: SUANLI_PLAN_SCRATCH=0 plans one arena");
    unsetenv("SUANLI_PLAN_SCRATCH");
    sl_graph_free(A.g);
    sl_graph_free(B.g);
    sl_backend_free(sl_backend_cpu(), small);
    sl_backend_free(sl_backend_cpu(), buf);
    free(xa);
    free(xb);
    sl_ctx_free(ctx);
}

int main(void) {
    test_half_outputs();
    test_grad_overwrite();
    test_split_backward();
    test_reserved_region();
    test_shared_scratch();
    sl_ctx *ctx = sl_ctx_new(1024);
    /* a chain of 20 elementwise ops: a planner must reuse memory (only ~2 live at a time) */
    enum { N = 4096 };
    float *xd = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) xd[i] = (float)i / N;
    sl_tensor *x = sl_new_tensor_1d(ctx, SL_F32, N);
    sl_set_name(x, "x");
    sl_tensor *y = x;
    for (int k = 0; k < 20; k++) y = (k % 2) ? sl_scale(ctx, y, 1.5f) : sl_add(ctx, y, x);
    sl_graph *g = sl_graph_new(ctx);
    sl_graph_build_forward(g, y);
    sl_plan_stats ps;
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), &ps) == SL_OK, "plan");
    printf("chain: planned %zu bytes, naive %zu bytes\n", ps.planned_bytes, ps.naive_bytes);
    TU_CHECK(ps.naive_bytes == 20 * N * sizeof(float), "naive sum %zu", ps.naive_bytes);
    TU_CHECK(ps.planned_bytes <= 2 * N * sizeof(float), "chain reuses memory: %zu", ps.planned_bytes);
    /* unbound leaf: clear error, not a crash */
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_ERR_INVALID, "unbound leaf rejected");
    TU_CHECK(strstr(sl_errmsg(), "'x'") != NULL, "message names the leaf: %s", sl_errmsg());
    sl_tensor_bind(x, xd);
    g_hook_last = -1;
    TU_CHECK(sl_graph_compute(g, hook, NULL) == SL_OK, "compute");
    TU_CHECK(g_hook_calls == sl_graph_n_nodes(g), "one hook per node (%d)", g_hook_calls);
    /* reference: the same chain in double */
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double v = xd[i];
        for (int k = 0; k < 20; k++) v = (k % 2) ? v * 1.5 : v + xd[i];
        if (fabs(v - ((float *)y->data)[i]) > 1e-4 * fabs(v) + 1e-6) bad++;
    }
    TU_CHECK(bad == 0, "chain values with memory reuse: %d wrong", bad);
    TU_CHECK(sl_graph_compute(g, stop_hook, NULL) == SL_ERR_ABORTED, "hook can stop execution");
    sl_graph_free(g);

    /* the null backend: plans, then reports the first unsupported op by name */
    g = sl_graph_new(ctx);
    sl_graph_build_forward(g, y);
    TU_CHECK(sl_graph_plan(g, sl_backend_null(), NULL) == SL_OK, "null plan");
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_ERR_UNSUPPORTED, "null backend unsupported");
    TU_CHECK(strstr(sl_errmsg(), "add") != NULL, "names the op: %s", sl_errmsg());
    sl_graph_free(g);
    TU_CHECK(sl_backend_get("cpu") == sl_backend_cpu(), "registry cpu");
    TU_CHECK(sl_backend_get("tpu") == NULL && strstr(sl_errmsg(), "tpu"), "unknown backend named");

    /* backward of a diamond keeps forward activations alive until used (planner safety) */
    sl_tensor *w = sl_new_tensor_1d(ctx, SL_F32, N);
    float *wd = malloc(sizeof(float) * N), *gw = calloc(N, sizeof(float));
    for (int i = 0; i < N; i++) wd[i] = 0.5f + (float)i / N;
    sl_tensor_bind(w, wd);
    sl_set_param(w);
    w->grad = sl_new_tensor_1d(ctx, SL_F32, N);
    sl_tensor_bind(w->grad, gw);
    sl_tensor *h = sl_gelu(ctx, sl_mul(ctx, w, x));
    sl_tensor *z = sl_mul(ctx, sl_gelu(ctx, h), h);
    sl_tensor *loss = sl_sum_to(ctx, z, sl_new_tensor_1d(ctx, SL_F32, 1));
    g = sl_graph_new(ctx);
    sl_graph_build_forward(g, loss);
    sl_graph_build_backward(g, loss, 1.0f);
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), &ps) == SL_OK, "plan");
    TU_CHECK(sl_graph_last_grad_write(g, w) == sl_graph_n_nodes(g) - 1, "last grad write is the final node");
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute");
    /* analytic: d/dw sum(gelu(h)*h), h = gelu(w x) */
    double maxerr = 0;
    for (int i = 0; i < N; i += 97) {
        double u = (double)wd[i] * xd[i];
#define GELU(v) (0.5 * (v) * (1 + tanh(0.7978845608028654 * ((v) + 0.044715 * (v) * (v) * (v)))))
        double eps = 1e-5;
        double f1 = GELU(GELU(u + eps)) * GELU(u + eps), f0 = GELU(GELU(u - eps)) * GELU(u - eps);
        double ref = (f1 - f0) / (2 * eps) * xd[i];
        double e = fabs(ref - gw[i]) / (fabs(ref) + 1e-3);
        if (e > maxerr) maxerr = e;
    }
    TU_CHECK(maxerr < 1e-3, "diamond gradient rel err %.3g", maxerr);
    sl_graph_free(g);
    free(xd);
    free(wd);
    free(gw);
    sl_ctx_free(ctx);
    return tu_finish("test_graph");
}
