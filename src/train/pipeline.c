/* Pipeline parallelism: one stage's graphs and the 1F1B schedule (PipeDream-Flush, as in Megatron-LM).
 *
 * Note [Pipeline stages and 1F1B]
 * Stage s of p holds a contiguous block of layers (sl_gpt2_new_par). A micro-batch's forward on stage s
 * starts from the activations received from stage s-1 (the ids on the first stage) and ends in the
 * activations sent to stage s+1 (the loss on the last stage); its backward starts from the gradient of
 * those activations received from s+1 (the loss seed on the last stage) and ends in the gradient of the
 * received activations, sent back to s-1. The stage's graph is built K = min(m, p - s) times over the
 * same parameters and gradient leaves ("slots"), each with its own planned activations and I/O leaves,
 * because 1F1B keeps up to p - s micro-batches in flight on stage s: micro-batch i runs on slot i mod K,
 * whose previous user (i - K) has finished its backward by then. Schedule per stage (m micro-batches):
 * w = min(p - s - 1, m) warm-up forwards, then m - w rounds of one forward and one backward, then w
 * backwards. The bubble is (p - 1) / (m + p - 1) of the step on every stage; what the stage spends
 * blocked in receives is measured (sl_pipeline_wait) and reported beside that.
 * Communication: activations and gradients flow over two communicators split from the pipeline group
 * (one per direction, each with its own progress thread), sends asynchronous, receives blocking: every
 * channel carries messages one way in micro-batch order, so no wait cycle can form. A send's buffer is
 * the slot's output activations or input gradient; the slot waits for it before it reuses them.
 * Gradients of parameters accumulate over the micro-batches as in single-process accumulation (the first
 * backward of the step overwrites, Note [Overwriting first gradient writes]).
 *
 * Interleaved 1F1B (Megatron's virtual pipeline, --num-layers-per-virtual-pipeline-stage): each stage holds
 * v model chunks; chunk c of stage s is virtual stage c * p + s, so activations go s -> s + 1 and from the
 * last stage back to the first for the next chunk. Forward unit k (of m * v) runs chunk (k / p) mod v on
 * micro-batch (k / (p v)) p + k mod p; backward units visit the chunks in reverse; stage s starts with
 * (p - s - 1) * 2 + (v - 1) * p warm-up forwards (m must be a multiple of p). The bubble shrinks to
 * (p - 1) / (v m + p - 1). The schedule is generated as a list of units, and each chunk's slot count is
 * the most micro-batches it ever has in flight in that list. Channels: four communicators, so that each
 * carries messages one way along a chain: s -> s + 1 and s -> s - 1 inside the pipeline, and the wrap-around
 * edges last -> first (activations) and first -> last (gradients) of the interleaved schedule. */
#include <string.h>

#include "train/train_internal.h"

typedef struct {
    sl_graph *g;
    sl_tensor *ids, *targets; /* first / last virtual stage */
    sl_tensor *x_in, *dx_in;  /* not on the first virtual stage: received activations and their gradient */
    sl_tensor *out;           /* the loss (last virtual stage) or the chunk's output activations */
    sl_tensor *seed;          /* not on the last virtual stage: the received gradient of out */
    sl_tensor *loss_seed;     /* the last virtual stage: d(loss) = 1/(accum x dp), times the loss scale; the
                               * others with router losses: the same for those (Note [Router losses ...]) */
    sl_tensor *aux;           /* not the last virtual stage: the sum of its MoE router losses, or NULL */
    sl_buffer *io;            /* ids, targets, x_in, dx_in, seed */
    /* Note [Staged pipeline transfers]: host copies of what crosses the boundary (NULL: host-visible) */
    float *h_in, *h_out, *h_dx; /* received x_in / seed; out and dx_in while their sends are in flight */
    sl_comm_req *send_fwd, *send_bwd;
    int n_forward;
    int n_b; /* the backward's B nodes are [n_forward, n_b), W [n_b, n); unsplit: n_b = n */
} pipe_slot;

enum { U_B, U_F, U_W }; /* backward (B, or B and W unsplit), forward, weight gradients (zero bubble) */
typedef struct {
    int fwd, chunk, micro; /* fwd: U_* */
} pipe_unit;

enum { CH_UP, CH_DOWN, CH_WRAP_UP, CH_WRAP_DOWN, N_CH };

struct sl_pipeline {
    sl_model *m;
    int p, s, v, m_micro, B, T;
    sl_pipe_schedule sched;
    int drop_on;                       /* training dropout (sl_pipeline_set_dropout) */
    uint64_t drop_seed, drop_per_step; /* stream = step x drop_per_step + global micro-batch index */
    int in_step;                       /* inside sl_pipeline_step (not evaluation) */
    sl_pipeline_fwd_fn after_fwd;      /* after each training forward unit: fn(user, chunk, slot graph) */
    void *after_fwd_user;
    sl_pipeline_last_fn
        last_fn; /* runs each chunk's last gradient-writing unit (sl_pipeline_set_last_grads) */
    void *last_user;
    int64_t act; /* elements of the activations crossing a stage boundary */
    sl_comm *ch[N_CH];
    int K[SL_PIPE_MAX_CHUNKS];
    pipe_slot *slot[SL_PIPE_MAX_CHUNKS];
    pipe_unit *units;
    int n_units;
    int32_t *ids_buf, *tg_buf;
    double wait_sec;
    double sent_bytes;  /* activations, their gradients and the tied embedding's gradient sent (this rank) */
    sl_plan_stats plan; /* every slot's arenas summed, plus the shared scratch region once */
    sl_buffer *scratch; /* Note [Shared scratch] (src/graph/graph.c): bound to every slot's graph */
};

static int first_virtual(const sl_pipeline *P, int c) { return P->s == 0 && c == 0; }
static int last_virtual(const sl_pipeline *P, int c) { return P->s == P->p - 1 && c == P->v - 1; }

static sl_status wait_req(sl_comm_req **r) {
    if (!*r) return SL_OK;
    sl_status st = sl_comm_wait(*r);
    *r = NULL;
    return st;
}

/* Note [Zero-bubble schedule]
 * ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): each backward is split into B, the gradient
 * of the stage's input, sent upstream as soon as it is computed, and W, the parameters' gradients (Note
 * [Splitting the backward], src/graph/graph.c); W units fill the slots where 1F1B waits. The unit order is
 * the greedy list schedule of the paper's heuristic run on a model of the whole pipeline with unit costs
 * (F = B = W = 1; the first stage has no input gradient, so its B is empty and its W the whole backward,
 * cost 2): whenever a stage is idle it runs, by priority, the next B whose gradient has arrived, else the
 * next F whose activations have arrived if fewer than K = min(m, p) micro-batches hold activations (a
 * micro-batch holds them until its W), else its oldest pending W. Every rank computes the same model, so
 * the TP / EP peers of a stage run the same order. The model also has the channels' FIFO coupling (a
 * stage's next receive on a channel completes after its previous send there, which completes when the
 * peer receives it), so the order it yields runs without deadlock whatever the real costs are. With equal
 * costs the idle time is (p - 1)(F + B - W) against 1F1B's (p - 1)(F + B + W), a bubble of
 * (p - 1) / (3 m + p - 1) of the step against (p - 1) / (m + p - 1). The price is activation memory: every
 * stage holds up to min(m, p) micro-batches (1F1B: p - s on stage s), the first stage's peak, which 1F1B
 * has too, and what W reads lives until W. W units run in micro-batch order on each stage, so the gradients
 * accumulate as in 1F1B: the losses and weights are bitwise 1F1B's. */
static sl_status zb_schedule(sl_pipeline *P) {
    int p = P->p, m = P->m_micro, K = m < p ? m : p, me = P->s, n = 0;
    size_t pm = (size_t)p * (size_t)m;
    /* per stage: next F / B / W micro-batch, busy-until; per (stage, micro): F and B start / end times */
    int *nf = calloc((size_t)p * 4, sizeof(int)), *nb = nf + p, *nw = nb + p, *busy = nw + p;
    int *fs = malloc(sizeof(int) * pm * 4), *fe = fs + pm, *bs = fe + pm, *be = bs + pm;
    if (!nf || !fs) {
        free(nf);
        free(fs);
        return sl_fail(SL_ERR_NOMEM, "pipeline: out of memory");
    }
    for (size_t i = 0; i < pm * 4; i++) fs[i] = -1;
#define AT(a, q, i) (a)[(size_t)(q) * (size_t)m + (size_t)(i)]
#define DONE(a, q, i) (AT(a, q, i) >= 0 && AT(a, q, i) <= t)
    int left = 3 * m * p;
    for (int t = 0; left > 0; t++) {
        if (t > 64 * (m + p) * 3) { /* cannot happen: the last stage can always run F then B */
            free(nf);
            free(fs);
            return sl_fail(SL_ERR_INTERNAL, "pipeline: the zero-bubble schedule made no progress");
        }
        for (int changed = 1; changed;) {
            changed = 0;
            for (int q = 0; q < p; q++) {
                if (busy[q] > t) continue;
                int i = nb[q], f = nf[q], kind = -1, micro = -1, cost = 1;
                if (i < m && DONE(fe, q, i) && (q == p - 1 || DONE(be, q + 1, i)) &&
                    (q == 0 || i == 0 || DONE(bs, q - 1, i - 1))) {
                    kind = U_B, micro = i, cost = q == 0 ? 0 : 1;
                    AT(bs, q, i) = t, AT(be, q, i) = t + cost, nb[q]++;
                } else if (f < m && f - nw[q] < K && (q == 0 || DONE(fe, q - 1, f)) &&
                           (q == p - 1 || f == 0 || DONE(fs, q + 1, f - 1))) {
                    kind = U_F, micro = f;
                    AT(fs, q, f) = t, AT(fe, q, f) = t + 1, nf[q]++;
                } else if (nw[q] < nb[q]) {
                    kind = U_W, micro = nw[q]++, cost = q == 0 ? 2 : 1;
                }
                if (kind < 0) continue;
                busy[q] = t + cost;
                left--;
                changed = 1;
                if (q == me) P->units[n++] = (pipe_unit){kind, 0, micro};
            }
        }
    }
#undef DONE
#undef AT
    free(nf);
    free(fs);
    P->n_units = n;
    P->K[0] = K;
    return SL_OK;
}

/* The unit list of one step (Note [Pipeline stages and 1F1B]) */
static sl_status make_schedule(sl_pipeline *P) {
    if (P->sched == SL_PIPE_ZB_H1) return zb_schedule(P);
    int p = P->p, s = P->s, v = P->v, m = P->m_micro, total = m * v, n = 0;
    int w = v == 1 ? p - s - 1 : (p - s - 1) * 2 + (v - 1) * p;
    if (w > total) w = total;
#define UNIT(k, f)                                                                                           \
    do {                                                                                                     \
        int c_ = ((k) / p) % v, mi_ = ((k) / (p * v)) * p + (k) % p;                                         \
        if (v == 1) mi_ = (k);                                                                               \
        P->units[n++] = (pipe_unit){(f) ? U_F : U_B, (f) ? c_ : v - 1 - c_, mi_};                            \
    } while (0)
    for (int k = 0; k < w; k++) UNIT(k, 1);
    for (int k = 0; k < total - w; k++) {
        UNIT(w + k, 1);
        UNIT(k, 0);
    }
    for (int k = total - w; k < total; k++) UNIT(k, 0);
#undef UNIT
    P->n_units = n;
    /* slots: the most micro-batches in flight per chunk (backward visits each chunk's in forward order) */
    int live[SL_PIPE_MAX_CHUNKS] = {0};
    for (int c = 0; c < v; c++) P->K[c] = 1;
    for (int i = 0; i < n; i++) {
        int c = P->units[i].chunk;
        live[c] += P->units[i].fwd == U_F ? 1 : -1;
        if (live[c] > P->K[c]) P->K[c] = live[c];
    }
    return SL_OK;
}

/* Note [Staged pipeline transfers]
 * On a backend whose memory the host cannot address (OpenCL) the activations and gradients crossing a stage
 * boundary go through host copies, as DP's gradients do (Note [Staged gradients], src/parallel/dp.c): a
 * received tensor lands in the slot's h_in and is copied in; an output is copied out (a blocking copy: the
 * device has finished the unit) into h_out / h_dx, which stay untouched until the send's request is waited
 * for, before the slot's next unit writes them again. dx_in is zeroed on the device. The tied embedding's two
 * gradients are summed the same way (pipe_after_backward, trainer.c). */
static sl_status build_slot(sl_pipeline *P, int c, pipe_slot *sl, float loss_scale) {
    sl_model *m = P->m;
    sl_ctx *ctx = m->ctx;
    size_t n = (size_t)P->B * (size_t)P->T, a = (size_t)P->act;
    size_t bytes = 2 * n * sizeof(int32_t) + 3 * a * sizeof(float);
    SL_TRY(sl_backend_alloc(m->backend, bytes, &sl->io));
    if (!m->backend->caps.host_visible) { /* Note [Staged pipeline transfers] */
        sl->h_in = malloc(3 * (a ? a : 1) * sizeof(float));
        if (!sl->h_in) return sl_fail(SL_ERR_NOMEM, "pipeline: out of memory");
        sl->h_out = sl->h_in + a;
        sl->h_dx = sl->h_out + a;
    }
    size_t at = 0;
    sl->ids = sl_set_name(sl_new_tensor_2d(ctx, SL_I32, P->B, P->T), "ids");
    sl->targets = sl_set_name(sl_new_tensor_2d(ctx, SL_I32, P->B, P->T), "targets");
    sl_set_input(sl->ids);
    sl_set_input(sl->targets);
    sl_tensor_bind_buffer(sl->ids, sl->io, at);
    at += n * sizeof(int32_t);
    sl_tensor_bind_buffer(sl->targets, sl->io, at);
    at += n * sizeof(int32_t);
    int64_t Tl = m->sp ? P->T / m->tp : P->T, ne[3] = {P->B, Tl, m->cfg.n_embd};
    if (!first_virtual(P, c)) {
        /* the received activations take a gradient like a parameter: dx_in is its gradient leaf */
        sl->x_in = sl_set_name(sl_new_tensor(ctx, SL_F32, 3, ne), "stage_in");
        sl->dx_in = sl_set_name(sl_new_tensor(ctx, SL_F32, 3, ne), "grad.stage_in");
        sl_set_param(sl->x_in);
        sl->dx_in->flags |= SL_FLAG_GRAD;
        sl->x_in->grad = sl->dx_in;
        sl_tensor_bind_buffer(sl->x_in, sl->io, at);
        sl_tensor_bind_buffer(sl->dx_in, sl->io, at + a * sizeof(float));
    }
    at += 2 * a * sizeof(float);
    sl->out =
        sl_model_build_stage(m, c, sl->ids, sl->x_in, last_virtual(P, c) ? sl->targets : NULL, &sl->aux);
    sl->g = sl_graph_new(ctx);
    if (!sl->g) return sl_fail(SL_ERR_NOMEM, "pipeline: out of memory");
    sl_graph_build_forward(sl->g, sl->out);
    if (sl->aux) sl_graph_build_forward(sl->g, sl->aux); /* Note [Router losses on every stage] */
    sl->n_forward = sl_graph_n_nodes(sl->g);
    sl_graph_set_recompute(sl->g, m->recompute, m->recompute_layers); /* Note [Full recomputation] */
    if (last_virtual(P, c)) {
        sl_graph_build_backward(sl->g, sl->out, loss_scale);
        sl->loss_seed = sl_graph_grad_of(sl->g, sl->out);
        if (!sl->loss_seed) return sl_fail(SL_ERR_INTERNAL, "pipeline: the loss has no gradient seed");
    } else {
        sl->seed = sl_set_name(sl_new_tensor(ctx, SL_F32, 3, ne), "grad.stage_out");
        sl_set_input(sl->seed);
        sl_tensor_bind_buffer(sl->seed, sl->io, at);
        sl_graph_build_backward_seeded(sl->g, sl->out, sl->seed, sl->aux, loss_scale);
        if (sl->aux) sl->loss_seed = sl_graph_grad_of(sl->g, sl->aux); /* scaled as the loss's seed */
    }
    sl->n_b = sl_graph_n_nodes(sl->g);
    if (P->sched == SL_PIPE_ZB_H1) { /* Note [Splitting the backward] */
        sl->n_b = sl_graph_split_backward(sl->g, sl->n_forward, first_virtual(P, c) ? NULL : sl->dx_in);
        if (sl->n_b < 0)
            return sl_fail(SL_ERR_INTERNAL, "pipeline: the zero-bubble schedule cannot split this backward "
                                            "into input and weight gradients");
    }
    return SL_OK;
}

/* Plans every slot's graph, with phases (Note [Shared scratch]: F, B and W run as separate units with
 * other slots' units between them, so what lives within one unit can go to one region shared by all slots)
 * or without (one arena per slot), and sums the plans: each slot's own bytes, the shared region once. */
static sl_status plan_slots(sl_pipeline *P, int phases, sl_plan_stats *sum) {
    memset(sum, 0, sizeof *sum);
    for (int c = 0; c < P->v; c++)
        for (int k = 0; k < P->K[c]; k++) {
            pipe_slot *sl = &P->slot[c][k];
            int n_all = sl_graph_n_nodes(sl->g), ends[3] = {sl->n_forward, sl->n_b, n_all};
            sl_graph_set_phases(sl->g, ends, !phases ? 0 : sl->n_b < n_all ? 3 : 2);
            sl_plan_stats ps;
            SL_TRY(sl_graph_plan(sl->g, P->m->backend, &ps));
            sum->planned_bytes += ps.planned_bytes - ps.scratch_bytes;
            if (ps.scratch_bytes > sum->scratch_bytes) sum->scratch_bytes = ps.scratch_bytes;
            sum->cap_bytes += ps.cap_bytes;
            sum->naive_bytes += ps.naive_bytes;
            sum->n_allocs += ps.n_allocs;
        }
    sum->planned_bytes += sum->scratch_bytes;
    return SL_OK;
}

/* The smaller of the two plans (a stage with one slot gains nothing from the split, and where little of a
 * slot's working set is transient the split's price can exceed the sharing), then the shared region. */
static sl_status plan_stage(sl_pipeline *P) {
    sl_plan_stats one, shared;
    const char *e = getenv("SUANLI_PLAN_SCRATCH");
    SL_TRY(plan_slots(P, 0, &one));
    P->plan = one;
    if (sl_pipeline_slots(P) < 2 || (e && !strcmp(e, "0"))) return SL_OK;
    SL_TRY(plan_slots(P, 1, &shared));
    if (shared.planned_bytes >= one.planned_bytes) return plan_slots(P, 0, &P->plan);
    P->plan = shared;
    SL_TRY(sl_backend_alloc(P->m->backend, shared.scratch_bytes, &P->scratch));
    for (int c = 0; c < P->v; c++)
        for (int k = 0; k < P->K[c]; k++) SL_TRY(sl_graph_bind_scratch(P->slot[c][k].g, P->scratch));
    return SL_OK;
}

void sl_pipeline_free(sl_pipeline *P) {
    if (!P) return;
    for (int c = 0; c < P->v; c++)
        for (int k = 0; P->slot[c] && k < P->K[c]; k++) {
            pipe_slot *sl = &P->slot[c][k];
            wait_req(&sl->send_fwd);
            wait_req(&sl->send_bwd);
            sl_graph_free(sl->g);
            if (sl->io) sl_backend_free(P->m->backend, sl->io);
            free(sl->h_in);
        }
    if (P->scratch) sl_backend_free(P->m->backend, P->scratch);
    for (int c = 0; c < P->v; c++) free(P->slot[c]);
    free(P->units);
    free(P->ids_buf);
    free(P->tg_buf);
    for (int i = 0; i < N_CH; i++) sl_comm_free(P->ch[i]);
    free(P);
}

sl_status sl_pipeline_new(sl_pipeline **out, sl_model *m, const sl_mesh *mesh, int B, int T, int n_micro,
                          float loss_scale, sl_pipe_schedule sched) {
    *out = NULL;
    int v = m->vpp > 1 ? m->vpp : 1;
    if (m->pp != mesh->pp || m->pp_rank != mesh->pp_rank || !mesh->pp_comm)
        return sl_fail(SL_ERR_INVALID, "pipeline: the model is stage %d of %d, the mesh says %d of %d",
                       m->pp_rank, m->pp, mesh->pp_rank, mesh->pp);
    if (v > SL_PIPE_MAX_CHUNKS)
        return sl_fail(SL_ERR_INVALID,
                       "--num-layers-per-virtual-pipeline-stage: %d model chunks per stage, at most %d", v,
                       SL_PIPE_MAX_CHUNKS);
    if (v > 1 && n_micro % mesh->pp)
        return sl_fail(
            SL_ERR_INVALID,
            "--num-layers-per-virtual-pipeline-stage: the interleaved schedule needs micro-batches per "
            "step (%d) to be a multiple of --pipeline-model-parallel-size %d",
            n_micro, mesh->pp);
    if (sched == SL_PIPE_ZB_H1 && v > 1)
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "--enable-zero-bubble: not implemented with "
                       "--num-layers-per-virtual-pipeline-stage (ZB-H1 is a 1F1B schedule)");
    sl_pipeline *P = calloc(1, sizeof *P);
    if (!P) return sl_fail(SL_ERR_NOMEM, "pipeline: out of memory");
    P->m = m;
    P->sched = sched;
    P->p = mesh->pp;
    P->s = mesh->pp_rank;
    P->v = v;
    P->m_micro = n_micro;
    P->B = B;
    P->T = T;
    P->act = (int64_t)B * (m->sp ? T / m->tp : T) * m->cfg.n_embd;
    sl_status st = SL_OK;
    P->units = calloc((size_t)(3 * n_micro * v), sizeof *P->units);
    P->ids_buf = calloc((size_t)B * (size_t)T, sizeof(int32_t));
    P->tg_buf = calloc((size_t)B * (size_t)T, sizeof(int32_t));
    if (!P->units || !P->ids_buf || !P->tg_buf) {
        st = sl_fail(SL_ERR_NOMEM, "pipeline: out of memory");
        goto done;
    }
    st = make_schedule(P);
    /* the channels (collective over the pipeline group: every stage splits all of them) */
    int r = sl_comm_rank(mesh->pp_comm);
    for (int i = 0; i < N_CH && st == SL_OK; i++)
        if (i < CH_WRAP_UP || v > 1) st = sl_comm_split(mesh->pp_comm, 0, r, &P->ch[i]);
    for (int c = 0; c < v && st == SL_OK; c++) {
        P->slot[c] = calloc((size_t)P->K[c], sizeof(pipe_slot));
        if (!P->slot[c]) st = sl_fail(SL_ERR_NOMEM, "pipeline: out of memory");
        for (int k = 0; k < P->K[c] && st == SL_OK; k++) st = build_slot(P, c, &P->slot[c][k], loss_scale);
    }
    if (st == SL_OK) st = plan_stage(P);
done:
    if (st != SL_OK) {
        sl_pipeline_free(P);
        return st;
    }
    *out = P;
    return SL_OK;
}

void sl_pipeline_set_after_forward(sl_pipeline *P, sl_pipeline_fwd_fn fn, void *user) {
    P->after_fwd = fn;
    P->after_fwd_user = user;
}

void sl_pipeline_set_last_grads(sl_pipeline *P, sl_pipeline_last_fn fn, void *user) {
    P->last_fn = fn;
    P->last_user = user;
}

/* each chunk's last unit that writes parameter gradients (a W after its B, when split); -1: none */
static void last_units(const sl_pipeline *P, int *last) {
    for (int c = 0; c < P->v; c++) last[c] = -1;
    for (int i = 0; i < P->n_units; i++)
        if (P->units[i].fwd != U_F) last[P->units[i].chunk] = i;
}

int sl_pipeline_last_order(const sl_pipeline *P, int c) {
    int last[SL_PIPE_MAX_CHUNKS], n = 0;
    if (c < 0 || c >= P->v) return -1;
    last_units(P, last);
    if (last[c] < 0) return -1;
    for (int d = 0; d < P->v; d++) n += last[d] >= 0 && last[d] < last[c];
    return n;
}

/* nodes [lo, hi) of chunk c's slot graph g; through last_fn when they are the chunk's last gradient writes */
static sl_status run_range(sl_pipeline *P, int c, sl_graph *g, int lo, int hi, int last) {
    if (last && P->last_fn) return P->last_fn(P->last_user, c, g, lo, hi);
    return sl_graph_compute_range(g, lo, hi, NULL, NULL);
}

int sl_pipeline_chunks(const sl_pipeline *P) { return P->v; }
sl_graph *sl_pipeline_chunk_graph(sl_pipeline *P, int c) {
    return c >= 0 && c < P->v ? P->slot[c][0].g : NULL;
}

void sl_pipeline_set_dropout(sl_pipeline *P, int on, uint64_t seed, uint64_t micro_per_step) {
    P->drop_on = on;
    P->drop_seed = seed;
    P->drop_per_step = micro_per_step;
    if (!on) /* evaluation and later callers run the slots without masks */
        for (int c = 0; c < P->v; c++)
            for (int k = 0; k < P->K[c]; k++) sl_graph_set_dropout(P->slot[c][k].g, 0, 0, 0);
}

void sl_pipeline_set_loss_seed(sl_pipeline *P, float v) {
    for (int c = 0; c < P->v; c++)
        for (int k = 0; k < P->K[c]; k++)
            if (P->slot[c][k].loss_seed) P->slot[c][k].loss_seed->fparams[0] = v;
}

int sl_pipeline_slots(const sl_pipeline *P) {
    int n = 0;
    for (int c = 0; c < P->v; c++) n += P->K[c];
    return n;
}
sl_graph *sl_pipeline_graph(sl_pipeline *P, int k) {
    for (int c = 0; c < P->v; c++) {
        if (k < P->K[c]) return P->slot[c][k].g;
        k -= P->K[c];
    }
    return NULL;
}
sl_graph *sl_pipeline_last_graph(sl_pipeline *P, int c) {
    return c >= 0 && c < P->v ? P->slot[c][(P->m_micro - 1) % P->K[c]].g : NULL;
}

sl_plan_stats sl_pipeline_plan(const sl_pipeline *P) { return P->plan; }

sl_status sl_pipeline_move_scratch(sl_pipeline *P, void *host, size_t bytes) {
    sl_buffer *b = NULL;
    if (bytes < P->plan.scratch_bytes)
        return sl_fail(SL_ERR_INVALID, "pipeline: scratch of %zu bytes for a plan of %zu", bytes,
                       P->plan.scratch_bytes);
    SL_TRY(sl_backend_wrap_host(P->m->backend, host, bytes, &b));
    sl_status st = SL_OK;
    for (int c = 0; c < P->v; c++)
        for (int k = 0; k < P->K[c] && st == SL_OK; k++) st = sl_graph_bind_scratch(P->slot[c][k].g, b);
    if (st != SL_OK) { /* every slot back on the old buffer */
        for (int c = 0; c < P->v; c++)
            for (int k = 0; k < P->K[c]; k++) (void)sl_graph_bind_scratch(P->slot[c][k].g, P->scratch);
        sl_backend_free(P->m->backend, b);
        return st;
    }
    if (P->scratch) sl_backend_free(P->m->backend, P->scratch);
    P->scratch = b;
    return SL_OK;
}

void sl_pipeline_backward_split(const sl_pipeline *P, int *n_b, int *n_w) {
    const pipe_slot *sl = &P->slot[0][0];
    *n_b = sl->n_b - sl->n_forward;
    *n_w = sl_graph_n_nodes(sl->g) - sl->n_b;
}

double sl_pipeline_take_wait(sl_pipeline *P) {
    double w = P->wait_sec;
    P->wait_sec = 0;
    return w;
}

double sl_pipeline_take_bytes(sl_pipeline *P) {
    double b = P->sent_bytes;
    P->sent_bytes = 0;
    return b;
}

void sl_pipeline_add_bytes(sl_pipeline *P, double bytes) { P->sent_bytes += bytes; }

/* Note [Pipeline communication volume]: per step, each of the m micro-batches crosses every boundary
 * between virtual stages once forward (its activations, B x T (T/tp under SP) x C f32) and once backward
 * (their gradient); this rank sends the forward copy out of each of its chunks but the last virtual stage
 * and the backward copy out of each but the first. With a tied embedding the first and last stages also
 * send each other the embedding's gradient (their shard of it) once per step. The loss broadcast and the
 * norm's partial sums (a few bytes) are not counted. */
double sl_pipeline_comm_theory(const sl_pipeline *P) {
    double a = (double)P->act * sizeof(float), per = 0;
    for (int c = 0; c < P->v; c++) {
        int q = c * P->p + P->s, last = P->v * P->p - 1;
        per += (q < last ? a : 0) + (q > 0 ? a : 0);
    }
    double bytes = per * P->m_micro;
    const sl_model *m = P->m;
    int tied = m->arch == SL_ARCH_GPT2 || m->lcfg.tie_embeddings;
    const sl_param_info *w = sl_model_find(m, m->arch == SL_ARCH_GPT2 ? "wte" : "model.embed_tokens.weight");
    if (tied && w && P->p > 1 && (P->s == 0 || P->s == P->p - 1)) bytes += (double)w->numel * sizeof(float);
    return bytes;
}

static sl_status recv_timed(sl_pipeline *P, sl_comm *c, void *buf, int peer) {
    double t0 = sl_time_sec();
    sl_status st = sl_comm_recv(c, buf, (size_t)P->act, SL_COMM_F32, peer);
    P->wait_sec += sl_time_sec() - t0;
    return st;
}

/* the channel and peer an activation of chunk c comes from / goes to, and a gradient likewise */
static sl_comm *act_in(const sl_pipeline *P, int *peer) {
    *peer = P->s > 0 ? P->s - 1 : P->p - 1;
    return P->s > 0 ? P->ch[CH_UP] : P->ch[CH_WRAP_UP];
}
static sl_comm *act_out(const sl_pipeline *P, int *peer) {
    *peer = P->s < P->p - 1 ? P->s + 1 : 0;
    return P->s < P->p - 1 ? P->ch[CH_UP] : P->ch[CH_WRAP_UP];
}
static sl_comm *grad_in(const sl_pipeline *P, int *peer) {
    *peer = P->s < P->p - 1 ? P->s + 1 : 0;
    return P->s < P->p - 1 ? P->ch[CH_DOWN] : P->ch[CH_WRAP_DOWN];
}
static sl_comm *grad_out(const sl_pipeline *P, int *peer) {
    *peer = P->s > 0 ? P->s - 1 : P->p - 1;
    return P->s > 0 ? P->ch[CH_DOWN] : P->ch[CH_WRAP_DOWN];
}

/* forward of micro-batch `micro` of `step` on chunk c's slot k (n_nodes: the forward range, or the whole
 * forward for evaluation); the last virtual stage adds its loss to *loss_sum */
static sl_status forward(sl_pipeline *P, int c, int k, int64_t step, int micro, sl_batch_fn fn, void *user,
                         double *loss_sum) {
    pipe_slot *sl = &P->slot[c][k];
    size_t n = (size_t)P->B * (size_t)P->T;
    int peer;
    SL_TRY(wait_req(&sl->send_fwd)); /* its output activations are about to be recomputed */
    if (first_virtual(P, c) || last_virtual(P, c)) {
        SL_TRY(fn(user, step, micro, P->ids_buf, P->tg_buf));
        SL_TRY(sl_backend_copy_in(sl->io, 0, P->ids_buf, n * sizeof(int32_t)));
        SL_TRY(sl_backend_copy_in(sl->io, n * sizeof(int32_t), P->tg_buf, n * sizeof(int32_t)));
    }
    if (!first_virtual(P, c)) {
        sl_comm *ch = act_in(P, &peer);
        SL_TRY(recv_timed(P, ch, sl->h_in ? (void *)sl->h_in : sl->x_in->data, peer));
        if (sl->h_in) SL_TRY(sl_tensor_copy_in(sl->x_in, sl->h_in)); /* Note [Staged pipeline transfers] */
    }
    /* the micro-batch's masks (Note [Dropout from counters]): set on the slot's graph, they stay there for
     * its backward, which runs before the slot takes another micro-batch */
    if (P->drop_on)
        sl_graph_set_dropout(sl->g, 1, P->drop_seed, (uint64_t)step * P->drop_per_step + (uint64_t)micro);
    SL_TRY(sl_graph_compute_range(sl->g, 0, sl->n_forward, NULL, NULL));
    if (P->in_step && P->after_fwd) SL_TRY(P->after_fwd(P->after_fwd_user, c, sl->g));
    if (last_virtual(P, c) || sl->aux) {
        float l;
        SL_TRY(sl_tensor_copy_out(last_virtual(P, c) ? sl->out : sl->aux, &l));
        *loss_sum += l;
    }
    if (!last_virtual(P, c)) {
        sl_comm *ch = act_out(P, &peer);
        if (sl->h_out) SL_TRY(sl_tensor_copy_out(sl->out, sl->h_out)); /* the send_fwd before it is done */
        SL_TRY(sl_comm_send_async(ch, sl->h_out ? (void *)sl->h_out : sl->out->data, (size_t)P->act,
                                  SL_COMM_F32, peer, &sl->send_fwd));
        P->sent_bytes += (double)P->act * sizeof(float);
    }
    return SL_OK;
}

/* B (or the whole backward, unsplit) of slot k: from the received gradient to the input's, sent upstream;
 * overwrite applies when the parameters' gradients are written here (unsplit) */
static sl_status backward(sl_pipeline *P, int c, int k, int overwrite, int last) {
    pipe_slot *sl = &P->slot[c][k];
    int peer, n = sl_graph_n_nodes(sl->g);
    if (!last_virtual(P, c)) {
        sl_comm *ch = grad_in(P, &peer);
        SL_TRY(recv_timed(P, ch, sl->h_in ? (void *)sl->h_in : sl->seed->data, peer));
        if (sl->h_in) SL_TRY(sl_tensor_copy_in(sl->seed, sl->h_in));
    }
    if (!first_virtual(P, c)) {
        SL_TRY(wait_req(&sl->send_bwd));
        if (sl->h_dx)
            SL_TRY(sl_backend_memset_zero(sl->dx_in->buffer, sl->dx_in->buffer_offs,
                                          sizeof(float) * (size_t)P->act));
        else
            memset(sl->dx_in->data, 0, sizeof(float) * (size_t)P->act);
    }
    sl_graph_set_grad_overwrite(sl->g, overwrite && sl->n_b == n);
    sl_status st = run_range(P, c, sl->g, sl->n_forward, sl->n_b, last && sl->n_b == n);
    sl_graph_set_grad_overwrite(sl->g, 0);
    SL_TRY(st);
    if (!first_virtual(P, c)) {
        sl_comm *ch = grad_out(P, &peer);
        if (sl->h_dx) SL_TRY(sl_tensor_copy_out(sl->dx_in, sl->h_dx));
        SL_TRY(sl_comm_send_async(ch, sl->h_dx ? (void *)sl->h_dx : sl->dx_in->data, (size_t)P->act,
                                  SL_COMM_F32, peer, &sl->send_bwd));
        P->sent_bytes += (double)P->act * sizeof(float);
    }
    return SL_OK;
}

/* W of slot k (zero bubble): the parameters' gradients of the micro-batch whose B ran last on it */
static sl_status weights(sl_pipeline *P, int c, int k, int overwrite, int last) {
    pipe_slot *sl = &P->slot[c][k];
    sl_graph_set_grad_overwrite(sl->g, overwrite);
    sl_status st = run_range(P, c, sl->g, sl->n_b, sl_graph_n_nodes(sl->g), last);
    sl_graph_set_grad_overwrite(sl->g, 0);
    return st;
}

static sl_status drain(sl_pipeline *P) {
    sl_status st = SL_OK;
    for (int c = 0; c < P->v; c++)
        for (int k = 0; k < P->K[c]; k++) {
            sl_status a = wait_req(&P->slot[c][k].send_fwd), b = wait_req(&P->slot[c][k].send_bwd);
            if (st == SL_OK) st = a != SL_OK ? a : b;
        }
    return st;
}

sl_status sl_pipeline_step(sl_pipeline *P, int64_t step, int n_micro, int micro0, sl_batch_fn fn, void *user,
                           int overwrite, float *loss) {
    if (n_micro != P->m_micro)
        return sl_fail(SL_ERR_INVALID, "pipeline: built for %d micro-batches, asked for %d", P->m_micro,
                       n_micro);
    double sum = 0;
    int seen_bwd[SL_PIPE_MAX_CHUNKS] = {0}, seen_w[SL_PIPE_MAX_CHUNKS] = {0}, last[SL_PIPE_MAX_CHUNKS];
    last_units(P, last);
    sl_status st = SL_OK;
    P->in_step = 1;
    for (int i = 0; i < P->n_units && st == SL_OK; i++) {
        const pipe_unit *u = &P->units[i];
        int k = u->micro % P->K[u->chunk];
        if (u->fwd == U_F)
            st = forward(P, u->chunk, k, step, micro0 + u->micro, fn, user, &sum);
        else if (u->fwd == U_B) /* each chunk's first backward of the step overwrites its gradients */
            st = backward(P, u->chunk, k, overwrite && !seen_bwd[u->chunk]++, i == last[u->chunk]);
        else /* ... the first W, when the backward is split */
            st = weights(P, u->chunk, k, overwrite && !seen_w[u->chunk]++, i == last[u->chunk]);
    }
    P->in_step = 0;
    SL_TRY(st);
    SL_TRY(drain(P));
    *loss = (float)(sum / n_micro); /* the last stage's mean; the caller broadcasts it */
    return SL_OK;
}

sl_status sl_pipeline_eval(sl_pipeline *P, int iters, int n_micro, int micro0, sl_batch_fn fn, void *user,
                           float *loss) {
    double sum = 0;
    for (int i = 0; i < iters; i++)
        for (int m = 0; m < n_micro; m++)
            for (int c = 0; c < P->v; c++) SL_TRY(forward(P, c, 0, i, micro0 + m, fn, user, &sum));
    SL_TRY(drain(P));
    *loss = iters && n_micro ? (float)(sum / ((double)iters * n_micro)) : 0.0f;
    return SL_OK;
}
