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
 * backward of the step overwrites, Note [Overwriting first gradient writes]). */
#include <string.h>

#include "train/train_internal.h"

typedef struct {
    sl_graph *g;
    sl_tensor *ids, *targets; /* first / last stage */
    sl_tensor *x_in, *dx_in;  /* not on the first stage: received activations and their gradient */
    sl_tensor *out;           /* the loss (last stage) or the stage's output activations */
    sl_tensor *seed;          /* not on the last stage: the received gradient of out */
    sl_buffer *io;            /* ids, targets, x_in, dx_in, seed */
    sl_comm_req *send_fwd, *send_bwd;
    int n_forward;
} pipe_slot;

struct sl_pipeline {
    sl_model *m;
    int p, s, K, B, T;
    int64_t act; /* elements of the activations crossing a stage boundary */
    sl_comm *fwd, *bwd;
    pipe_slot *slot;
    int32_t *ids_buf, *tg_buf;
    double wait_sec;
    sl_plan_stats plan; /* every slot's, summed */
};

static int first_stage(const sl_pipeline *P) { return P->s == 0; }
static int last_stage(const sl_pipeline *P) { return P->s == P->p - 1; }

static sl_status wait_req(sl_comm_req **r) {
    if (!*r) return SL_OK;
    sl_status st = sl_comm_wait(*r);
    *r = NULL;
    return st;
}

static sl_status build_slot(sl_pipeline *P, pipe_slot *sl, float loss_scale) {
    sl_model *m = P->m;
    sl_ctx *ctx = m->ctx;
    size_t n = (size_t)P->B * (size_t)P->T, a = (size_t)P->act;
    size_t bytes = 2 * n * sizeof(int32_t) + 3 * a * sizeof(float);
    SL_TRY(sl_backend_alloc(m->backend, bytes, &sl->io));
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
    if (!first_stage(P)) {
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
    sl->out = sl_gpt2_build_stage(m, sl->ids, sl->x_in, last_stage(P) ? sl->targets : NULL, NULL);
    sl->g = sl_graph_new(ctx);
    if (!sl->g) return sl_fail(SL_ERR_NOMEM, "pipeline: out of memory");
    sl_graph_build_forward(sl->g, sl->out);
    sl->n_forward = sl_graph_n_nodes(sl->g);
    if (last_stage(P)) {
        sl_graph_build_backward(sl->g, sl->out, loss_scale);
    } else {
        sl->seed = sl_set_name(sl_new_tensor(ctx, SL_F32, 3, ne), "grad.stage_out");
        sl_set_input(sl->seed);
        sl_tensor_bind_buffer(sl->seed, sl->io, at);
        sl_graph_build_backward_seeded(sl->g, sl->out, sl->seed);
    }
    sl_plan_stats ps;
    SL_TRY(sl_graph_plan(sl->g, m->backend, &ps));
    P->plan.planned_bytes += ps.planned_bytes;
    P->plan.naive_bytes += ps.naive_bytes;
    P->plan.n_allocs += ps.n_allocs;
    return SL_OK;
}

void sl_pipeline_free(sl_pipeline *P) {
    if (!P) return;
    for (int k = 0; P->slot && k < P->K; k++) {
        pipe_slot *sl = &P->slot[k];
        wait_req(&sl->send_fwd);
        wait_req(&sl->send_bwd);
        sl_graph_free(sl->g);
        if (sl->io) sl_backend_free(P->m->backend, sl->io);
    }
    free(P->slot);
    free(P->ids_buf);
    free(P->tg_buf);
    sl_comm_free(P->fwd);
    sl_comm_free(P->bwd);
    free(P);
}

sl_status sl_pipeline_new(sl_pipeline **out, sl_model *m, const sl_mesh *mesh, int B, int T, int n_micro,
                          float loss_scale) {
    *out = NULL;
    if (m->pp != mesh->pp || m->pp_rank != mesh->pp_rank || !mesh->pp_comm)
        return sl_fail(SL_ERR_INVALID, "pipeline: the model is stage %d of %d, the mesh says %d of %d",
                       m->pp_rank, m->pp, mesh->pp_rank, mesh->pp);
    if (!m->backend->caps.host_visible)
        return sl_fail(SL_ERR_UNSUPPORTED, "--pipeline-model-parallel-size needs host-visible memory (cpu)");
    if (m->arch != SL_ARCH_GPT2)
        return sl_fail(SL_ERR_UNSUPPORTED, "--pipeline-model-parallel-size: GPT-2 models only");
    sl_pipeline *P = calloc(1, sizeof *P);
    if (!P) return sl_fail(SL_ERR_NOMEM, "pipeline: out of memory");
    P->m = m;
    P->p = mesh->pp;
    P->s = mesh->pp_rank;
    P->B = B;
    P->T = T;
    P->K = n_micro < P->p - P->s ? n_micro : P->p - P->s;
    P->act = (int64_t)B * (m->sp ? T / m->tp : T) * m->cfg.n_embd;
    sl_status st = SL_OK;
    /* one communicator per direction (collective over the pipeline group: every stage splits both) */
    int r = sl_comm_rank(mesh->pp_comm);
    if ((st = sl_comm_split(mesh->pp_comm, 0, r, &P->fwd)) != SL_OK) goto done;
    if ((st = sl_comm_split(mesh->pp_comm, 0, r, &P->bwd)) != SL_OK) goto done;
    P->slot = calloc((size_t)P->K, sizeof *P->slot);
    P->ids_buf = calloc((size_t)B * (size_t)T, sizeof(int32_t));
    P->tg_buf = calloc((size_t)B * (size_t)T, sizeof(int32_t));
    if (!P->slot || !P->ids_buf || !P->tg_buf) {
        st = sl_fail(SL_ERR_NOMEM, "pipeline: out of memory");
        goto done;
    }
    for (int k = 0; k < P->K && st == SL_OK; k++) st = build_slot(P, &P->slot[k], loss_scale);
done:
    if (st != SL_OK) {
        sl_pipeline_free(P);
        return st;
    }
    *out = P;
    return SL_OK;
}

sl_graph *sl_pipeline_graph(sl_pipeline *P, int k) { return k < P->K ? P->slot[k].g : NULL; }
int sl_pipeline_slots(const sl_pipeline *P) { return P->K; }
sl_plan_stats sl_pipeline_plan(const sl_pipeline *P) { return P->plan; }

double sl_pipeline_take_wait(sl_pipeline *P) {
    double w = P->wait_sec;
    P->wait_sec = 0;
    return w;
}

static sl_status recv_timed(sl_pipeline *P, sl_comm *c, void *buf, int peer) {
    double t0 = sl_time_sec();
    sl_status st = sl_comm_recv(c, buf, (size_t)P->act, SL_COMM_F32, peer);
    P->wait_sec += sl_time_sec() - t0;
    return st;
}

/* forward of micro-batch `micro` of `step` on slot k; the last stage adds its loss to *loss_sum */
static sl_status forward(sl_pipeline *P, int k, int64_t step, int micro, sl_batch_fn fn, void *user,
                         int n_nodes, double *loss_sum) {
    pipe_slot *sl = &P->slot[k];
    size_t n = (size_t)P->B * (size_t)P->T;
    SL_TRY(wait_req(&sl->send_fwd)); /* its output activations are about to be recomputed */
    if (first_stage(P) || last_stage(P)) {
        SL_TRY(fn(user, step, micro, P->ids_buf, P->tg_buf));
        SL_TRY(sl_backend_copy_in(sl->io, 0, P->ids_buf, n * sizeof(int32_t)));
        SL_TRY(sl_backend_copy_in(sl->io, n * sizeof(int32_t), P->tg_buf, n * sizeof(int32_t)));
    }
    if (!first_stage(P)) SL_TRY(recv_timed(P, P->fwd, sl->x_in->data, P->s - 1));
    SL_TRY(sl_graph_compute_range(sl->g, 0, n_nodes, NULL, NULL));
    if (last_stage(P)) {
        float l;
        SL_TRY(sl_tensor_copy_out(sl->out, &l));
        *loss_sum += l;
    } else {
        SL_TRY(sl_comm_send_async(P->fwd, sl->out->data, (size_t)P->act, SL_COMM_F32, P->s + 1, &sl->send_fwd));
    }
    return SL_OK;
}

static sl_status backward(sl_pipeline *P, int k, int overwrite) {
    pipe_slot *sl = &P->slot[k];
    if (!last_stage(P)) SL_TRY(recv_timed(P, P->bwd, sl->seed->data, P->s + 1));
    if (!first_stage(P)) {
        SL_TRY(wait_req(&sl->send_bwd));
        memset(sl->dx_in->data, 0, sizeof(float) * (size_t)P->act);
    }
    sl_graph_set_grad_overwrite(sl->g, overwrite);
    sl_status st = sl_graph_compute_range(sl->g, sl->n_forward, sl_graph_n_nodes(sl->g), NULL, NULL);
    sl_graph_set_grad_overwrite(sl->g, 0);
    SL_TRY(st);
    if (!first_stage(P))
        SL_TRY(sl_comm_send_async(P->bwd, sl->dx_in->data, (size_t)P->act, SL_COMM_F32, P->s - 1, &sl->send_bwd));
    return SL_OK;
}

static sl_status drain(sl_pipeline *P) {
    sl_status st = SL_OK;
    for (int k = 0; k < P->K; k++) {
        sl_status a = wait_req(&P->slot[k].send_fwd), b = wait_req(&P->slot[k].send_bwd);
        if (st == SL_OK) st = a != SL_OK ? a : b;
    }
    return st;
}

sl_status sl_pipeline_step(sl_pipeline *P, int64_t step, int n_micro, int micro0, sl_batch_fn fn, void *user,
                           int overwrite, float *loss) {
    int w = P->p - P->s - 1 < n_micro ? P->p - P->s - 1 : n_micro;
    double sum = 0;
    int f = 0, b = 0;
    for (; f < w; f++) SL_TRY(forward(P, f % P->K, step, micro0 + f, fn, user, P->slot[f % P->K].n_forward, &sum));
    for (; f < n_micro; f++, b++) {
        SL_TRY(forward(P, f % P->K, step, micro0 + f, fn, user, P->slot[f % P->K].n_forward, &sum));
        SL_TRY(backward(P, b % P->K, overwrite && b == 0));
    }
    for (; b < n_micro; b++) SL_TRY(backward(P, b % P->K, overwrite && b == 0));
    SL_TRY(drain(P));
    *loss = (float)(sum / n_micro); /* the last stage's mean; the caller broadcasts it */
    return SL_OK;
}

sl_status sl_pipeline_eval(sl_pipeline *P, int iters, sl_batch_fn fn, void *user, float *loss) {
    double sum = 0;
    for (int i = 0; i < iters; i++) SL_TRY(forward(P, 0, i, 0, fn, user, P->slot[0].n_forward, &sum));
    SL_TRY(drain(P));
    *loss = iters ? (float)(sum / iters) : 0.0f;
    return SL_OK;
}
