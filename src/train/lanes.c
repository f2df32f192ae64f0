/* Micro-batch lanes: a micro-batch split by rows over graphs that run side by side, one thread each
 * (Note [Micro-batch lanes]). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "lanes.h"

/* Note [Micro-batch lanes]
 * A small model's step is hundreds of short kernels. Split over threads, each kernel pays a fork and a
 * join, and every thread reads rows the other wrote: the GEMMs deal rows in units to whoever is free, the
 * weight gradients sum over every token, and the activation planner reuses memory across ops whose rows
 * fall to different threads. On the 2-core test VM that costs nothing while both vCPUs sit under one L3
 * (a core-to-core round trip of ~60 ns), and ~35 % of the step when the host places them apart (~350 ns,
 * measured with a ping-pong probe between runs; the placement changes by the minute): the baby GPT's
 * 2-thread step went from 25 to 34 ms while its 1-thread step stayed at 49 ms, and 2 ranks x 1 thread of
 * data parallelism stayed at 25-26 ms in both placements (docs/BENCHMARKS.md). Lanes bring that layout
 * into one process: with --micro-batch-lanes L the micro-batch's B rows are split into L lanes of B / L
 * rows, each with its own graph, activation arena and gradient buffer (a lane model that reads the
 * trainer's parameters: sl_model_new_lane), run concurrently by L threads with one kernel thread each (or
 * threads / L each, nested, with more threads than lanes). A lane's gradients are those of its rows with
 * the loss seed 1 / (accum x L); after the step's micro-batches the lanes' gradient buffers are added to
 * the trainer's in lane order, and the micro-batch's loss is the mean of the lanes' losses in lane order.
 * Dropout draws the single graph's masks: a lane's DROPOUT nodes count their rows from row b0 = l B / L
 * (the sequence-shard fields of Note [Dropout from counters]: SEQ = T, T0 = b0 T) and its ATTENTION nodes
 * their planes from b0 NH (HEAD0 = b0 NH of HEADS = NH).
 * What it changes: the sums over the micro-batch's rows are taken per lane and then added (the weight
 * and bias gradients, the loss mean), so a run with lanes differs from one without by float rounding
 * (test_lanes: ~1e-7 relative in the loss over 20 steps). What it does not change: the thread count. At
 * one thread the lanes run one after the other, with the same bits (the governor of Note [Threads on a
 * shared machine] may switch at any step), and the run is reproducible. Cost: one more gradient buffer
 * per extra lane (the parameters' size; the lane models share the parameters) and arenas planned for B / L
 * rows each. Under data parallelism (ZeRO-0 and ZeRO-1) each rank's lanes split its own micro-batch; the
 * gradient buckets are reduced after the lanes' sum, all at the end of the backward (the executor hook that
 * launches them during the one graph's backward would send gradients that lanes 1.. have not added yet),
 * and ZeRO-1's parameter all-gathers are waited for before the lanes read the parameters. ZeRO-2 (gradient
 * shards and slots) and ZeRO-3 (parameters gathered into the one graph bucket by bucket) follow the one
 * graph's backward and are refused, as are tensor, pipeline and expert parallelism, MoE models and backends
 * whose memory the host cannot touch (exit 2 naming the flag, before anything is written). */

struct sl_trainer_lane {
    sl_model *m; /* lane 0: the trainer's model (borrowed); others: owned lane models */
    sl_graph *g; /* lane 0: the trainer's graph (borrowed) */
    sl_tensor *ids, *targets, *loss, *seed;
    sl_buffer *input; /* lane 0: the trainer's input_buf (borrowed) */
    int n_forward;
    sl_status st;  /* the lane's last run */
    char msg[512]; /* its error message (sl_errmsg is per thread) */
};

sl_status sl_lanes_check(const sl_model *m, const sl_trainer_config *cfg) {
    int L = cfg->lanes;
    if (L < 0 || L > SL_MAX_LANES)
        return sl_fail(SL_ERR_INVALID, "--micro-batch-lanes %d: must be 1..%d", L, SL_MAX_LANES);
    if (L <= 1) return SL_OK;
    if (cfg->B % L)
        return sl_fail(SL_ERR_INVALID, "--micro-batch-lanes %d does not divide --micro-batch-size %d", L,
                       cfg->B);
    const char *why = m->tp > 1                        ? "tensor parallelism"
                      : m->pp > 1                      ? "pipeline parallelism"
                      : m->ep > 1                      ? "expert parallelism"
                      : sl_model_is_moe(m)             ? "MoE models"
                      : m->wdtype != SL_F32            ? "bf16 weights"
                      : !m->grads_buf                  ? "a model without gradients"
                      : !m->backend->caps.host_visible ? "a device whose memory the host cannot map"
                                                       : NULL;
    if (why) return sl_fail(SL_ERR_INVALID, "--micro-batch-lanes %d: not supported with %s", L, why);
    return SL_OK;
}

/* A lane's dropout nodes draw the whole micro-batch's masks at their rows (Note [Micro-batch lanes]). */
static sl_status lane_dropout_rows(sl_graph *g, int64_t b0) {
    for (int i = 0; i < sl_graph_n_nodes(g); i++) {
        sl_tensor *t = sl_graph_node(g, i);
        if (t->op == SL_OP_DROPOUT) {
            if (t->ndim < 2 || t->iparams[SL_DROPOUT_IP_SEQ] > 0)
                return sl_fail(SL_ERR_UNSUPPORTED, "micro-batch lanes: dropout node '%s' is not (B, T, ...)",
                               t->name);
            t->iparams[SL_DROPOUT_IP_SEQ] = (int32_t)t->ne[1];
            t->iparams[SL_DROPOUT_IP_T0] = (int32_t)(b0 * t->ne[1]);
        } else if (t->op == SL_OP_ATTENTION && t->fparams[0] > 0) {
            int64_t nh = t->src[0]->ne[2];
            if (t->iparams[SL_DROPOUT_IP_HEADS] > 0 || t->iparams[SL_DROPOUT_IP_HEAD0] != 0)
                return sl_fail(SL_ERR_UNSUPPORTED,
                               "micro-batch lanes: attention node '%s' holds a head shard", t->name);
            t->iparams[SL_DROPOUT_IP_HEADS] = (int32_t)nh;
            t->iparams[SL_DROPOUT_IP_HEAD0] = (int32_t)(b0 * nh);
        }
    }
    return SL_OK;
}

/* lane l >= 1: its model, inputs, graph and arena; the arena's size is added to *plan */
static sl_status lane_build(sl_trainer *tr, sl_trainer_lane *ln, int Bl, sl_plan_stats *plan) {
    SL_TRY(sl_model_new_lane(tr->model, &ln->m));
    sl_model *m = ln->m;
    size_t n = (size_t)Bl * (size_t)tr->cfg.T;
    SL_TRY(sl_backend_alloc(m->backend, 2 * n * sizeof(int32_t), &ln->input));
    ln->ids = sl_set_name(sl_new_tensor_2d(m->ctx, SL_I32, Bl, tr->cfg.T), "ids");
    ln->targets = sl_set_name(sl_new_tensor_2d(m->ctx, SL_I32, Bl, tr->cfg.T), "targets");
    sl_set_input(ln->ids);
    sl_set_input(ln->targets);
    sl_tensor_bind_buffer(ln->ids, ln->input, 0);
    sl_tensor_bind_buffer(ln->targets, ln->input, n * sizeof(int32_t));
    sl_tensor *logits;
    ln->loss = sl_model_build(m, ln->ids, ln->targets, &logits);
    ln->g = sl_graph_new(m->ctx);
    if (!ln->loss || !ln->g) return sl_fail(SL_ERR_NOMEM, "micro-batch lanes: out of memory");
    sl_graph_build_forward(ln->g, ln->loss);
    ln->n_forward = sl_graph_n_nodes(ln->g);
    sl_graph_set_recompute(ln->g, m->recompute, m->recompute_layers);
    sl_graph_build_backward(ln->g, ln->loss, tr->seed_base);
    ln->seed = sl_graph_grad_of(ln->g, ln->loss);
    sl_plan_stats ps;
    SL_TRY(sl_graph_plan(ln->g, m->backend, &ps));
    plan->planned_bytes += ps.planned_bytes;
    plan->naive_bytes += ps.naive_bytes;
    plan->n_allocs += ps.n_allocs;
    return SL_OK;
}

sl_status sl_lanes_build(sl_trainer *tr) {
    int L = tr->lanes, Bl = tr->cfg.B / L;
    tr->lane = calloc((size_t)L, sizeof *tr->lane);
    if (!tr->lane) return sl_fail(SL_ERR_NOMEM, "micro-batch lanes: out of memory");
    tr->lane[0] = (sl_trainer_lane){.m = tr->model,
                                    .g = tr->graph,
                                    .ids = tr->ids,
                                    .targets = tr->targets,
                                    .loss = tr->loss,
                                    .seed = tr->seed,
                                    .input = tr->input_buf,
                                    .n_forward = tr->n_forward};
    for (int l = 1; l < L; l++) SL_TRY(lane_build(tr, &tr->lane[l], Bl, &tr->plan));
    for (int l = 0; l < L; l++) SL_TRY(lane_dropout_rows(tr->lane[l].g, (int64_t)l * Bl));
    return SL_OK;
}

void sl_lanes_free(sl_trainer *tr) {
    if (!tr->lane) return;
    for (int l = 1; l < tr->lanes; l++) {
        sl_trainer_lane *ln = &tr->lane[l];
        sl_graph_free(ln->g);
        if (ln->m) sl_backend_free(ln->m->backend, ln->input);
        sl_model_free(ln->m);
    }
    free(tr->lane);
    tr->lane = NULL;
}

void sl_lanes_set(sl_trainer *tr, int overwrite, int drop_on, uint64_t seed, uint64_t stream) {
    for (int l = 1; l < tr->lanes; l++) {
        sl_graph_set_grad_overwrite(tr->lane[l].g, overwrite);
        sl_graph_set_dropout(tr->lane[l].g, drop_on, seed, stream);
    }
}

void sl_lanes_set_seed(sl_trainer *tr, float seed) {
    for (int l = 1; l < tr->lanes; l++) tr->lane[l].seed->fparams[0] = seed;
}

sl_status sl_lanes_zero_unwritten(sl_trainer *tr) {
    for (int l = 1; l < tr->lanes; l++) {
        sl_trainer_lane *ln = &tr->lane[l];
        for (int i = 0; i < ln->m->n_params; i++)
            if (sl_graph_last_grad_write(ln->g, ln->m->params[i].t) < 0)
                SL_TRY(sl_backend_memset_zero(ln->m->grads_buf,
                                              sizeof(float) * (size_t)ln->m->params[i].offset,
                                              sizeof(float) * (size_t)ln->m->params[i].numel));
    }
    return SL_OK;
}

static void lane_compute(sl_trainer_lane *ln, int fwd_only) {
    ln->st = fwd_only ? sl_graph_compute_range(ln->g, 0, ln->n_forward, NULL, NULL)
                      : sl_graph_compute(ln->g, NULL, NULL);
    if (ln->st != SL_OK) snprintf(ln->msg, sizeof ln->msg, "%s", sl_errmsg());
}

sl_status sl_lanes_run(sl_trainer *tr, const int32_t *ids, const int32_t *targets, int fwd_only,
                       float *loss) {
    int L = tr->lanes;
    size_t n = (size_t)(tr->cfg.B / L) * (size_t)tr->cfg.T;
    for (int l = 0; l < L; l++) {
        sl_trainer_lane *ln = &tr->lane[l];
        SL_TRY(sl_backend_copy_in(ln->input, 0, ids + (size_t)l * n, n * sizeof(int32_t)));
        SL_TRY(
            sl_backend_copy_in(ln->input, n * sizeof(int32_t), targets + (size_t)l * n, n * sizeof(int32_t)));
        ln->st = SL_OK;
    }
    int nth = sl_threads_get(), team = nth < L ? nth : L;
#ifdef _OPENMP
    if (team > 1) {
        int inner = nth / team, levels = omp_get_max_active_levels();
        if (inner > 1 && levels < 2) omp_set_max_active_levels(2);
#pragma omp parallel for num_threads(team) schedule(static, 1)
        for (int l = 0; l < L; l++) {
            omp_set_num_threads(inner); /* this lane's kernels: Note [Micro-batch lanes] */
            lane_compute(&tr->lane[l], fwd_only);
        }
        if (inner > 1 && levels < 2) omp_set_max_active_levels(levels);
    } else
#endif
        for (int l = 0; l < L; l++) lane_compute(&tr->lane[l], fwd_only);
    float sum = 0;
    for (int l = 0; l < L; l++) {
        sl_trainer_lane *ln = &tr->lane[l];
        if (ln->st != SL_OK) return sl_fail(ln->st, "micro-batch lane %d: %s", l, ln->msg);
        float x;
        SL_TRY(sl_tensor_copy_out(ln->loss, &x));
        sum += x;
    }
    if (loss) *loss = sum / (float)L;
    return SL_OK;
}

sl_status sl_lanes_sum_grads(sl_trainer *tr) {
    sl_model *m = tr->model;
    float *g = m->grads_mem;
    if (!g) return sl_fail(SL_ERR_INVALID, "micro-batch lanes: the gradients are not host-visible");
    int64_t N = m->numel;
    for (int l = 1; l < tr->lanes; l++) {
        const float *h = tr->lane[l].m->grads_mem;
#pragma omp parallel for schedule(static) if (N > 65536)
        for (int64_t i = 0; i < N; i++) g[i] += h[i];
    }
    return SL_OK;
}
