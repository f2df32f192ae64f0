/* One rank of a parallel layout (layout_harness.h). */
#include "layout_harness.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static int one(int n) { return n > 1 ? n : 1; }

/* the mesh, the whole model and this rank's split of it, loaded from the whole one */
static sl_status build_model(tu_layout_rank *R) {
    const tu_layout_spec *s = R->spec;
    int tp = one(s->tp), pp = one(s->pp), ep = one(s->ep), vpp = one(s->vpp);
    SL_TRY(s->gpt2 ? sl_gpt2_new(s->gpt2, &R->whole) : sl_llama_new(s->llama, &R->whole));
    sl_model_init_weights(R->whole, s->seed);
    if (tp == 1 && pp == 1 && ep == 1 && vpp == 1 && !s->first_layers && !s->last_layers) {
        R->m = R->whole; /* nothing to split */
        R->whole = NULL;
        return SL_OK;
    }
    sl_model_split split = {tp, R->mesh.tp_rank, pp, R->mesh.pp_rank, vpp, s->first_layers, s->last_layers,
                            ep, R->mesh.ep_rank, 0};
    SL_TRY(sl_model_new_split(R->whole, sl_backend_cpu(), &split, &R->m));
    SL_TRY(sl_tp_load_full(R->m, R->whole));
    if (tp > 1 || ep > 1) SL_TRY(sl_tp_new(&R->tp, &R->mesh));
    return SL_OK;
}

/* the trainer on this rank's mesh, with TP and DP */
static sl_status build_trainer(tu_layout_rank *R, int *have_tr) {
    const tu_layout_spec *s = R->spec;
    sl_trainer_config tc = s->tc;
    tc.mesh = &R->mesh;
    tc.dp_size = R->mesh.dp;
    SL_TRY(sl_trainer_init(&R->tr, R->m, &tc));
    *have_tr = 1;
    if (s->planned) *s->planned = R->tr.plan.planned_bytes;
    if (s->scratch) *s->scratch = R->tr.plan.scratch_bytes;
    if (R->tp) SL_TRY(sl_trainer_set_tp(&R->tr, R->tp));
    if (R->mesh.dp > 1) {
        sl_dp_opts o = s->dp;
        if (o.ready == sl_trainer_dp_ready) o.ready_user = &R->tr;
        SL_TRY(sl_dp_new(&R->dp, &R->mesh, R->m, R->tr.graph, &o));
        R->tr.dp = R->dp;
    }
    return SL_OK;
}

/* the routing statistics after a step (as metrics.jsonl's) */
static sl_status record_moe(tu_layout_rank *R, int step) {
    const tu_layout_spec *s = R->spec;
    sl_moe_stats ms;
    SL_TRY(sl_moe_graph_stats(R->tr.graph, &ms));
    int E = s->llama->n_experts;
    for (int e = 0; s->moe_load && e < E; e++) s->moe_load[step * E + e] = ms.load[e];
    if (s->moe_dropped) s->moe_dropped[step] = ms.dropped_frac;
    return SL_OK;
}

static sl_status run(tu_layout_rank *R, int *have_tr) {
    const tu_layout_spec *s = R->spec;
    void *u = s->user;
    SL_TRY(build_model(R));
    if (s->prepare) SL_TRY(s->prepare(R, u));
    SL_TRY(build_trainer(R, have_tr));
    if (s->ready) SL_TRY(s->ready(R, u));
    for (int step = 0; step < s->steps; step++) {
        sl_step_stats ss;
        if (s->before_step) SL_TRY(s->before_step(R, step, u));
        SL_TRY(sl_trainer_step(&R->tr, step, s->data, s->data_user, &ss));
        if (s->losses) s->losses[step] = ss.loss;
        if (s->grad_norms) s->grad_norms[step] = ss.grad_norm;
        if ((s->moe_load || s->moe_dropped) && !R->tr.pipe) SL_TRY(record_moe(R, step));
        if (s->after_step) SL_TRY(s->after_step(R, step, &ss, u));
    }
    if (R->dp) SL_TRY(sl_dp_gather_params(R->dp));
    if (s->params) {
        size_t bytes = sizeof(float) * (size_t)R->m->numel;
        if (!(*s->params = malloc(bytes))) return sl_fail(SL_ERR_NOMEM, "layout harness: out of memory");
        memcpy(*s->params, R->m->params_mem, bytes);
    }
    if (s->numel) *s->numel = R->m->numel;
    return s->finish ? s->finish(R, u) : SL_OK;
}

sl_status tu_layout_run_rank(const tu_layout_spec *spec) {
    tu_layout_rank R = {.spec = spec};
    int have_tr = 0;
    sl_status st =
        sl_mesh_init(&R.mesh, spec->world, (sl_mesh_dims){one(spec->tp), one(spec->pp), one(spec->ep)});
    if (st != SL_OK) return st;
    st = run(&R, &have_tr);
    sl_dp_free(R.dp);
    if (have_tr) sl_trainer_free(&R.tr);
    sl_tp_free(R.tp);
    sl_model_free(R.m);
    sl_model_free(R.whole);
    sl_mesh_free(&R.mesh);
    return st;
}

sl_trainer_config tu_layout_tc(int B, int T, int accum, int dp, int warmup, int steps) {
    return (sl_trainer_config){.B = B,
                               .T = T,
                               .accum = accum,
                               .dp_size = dp,
                               .lr = 3e-3f,
                               .min_lr = 3e-4f,
                               .clip = 1.0f,
                               .warmup = warmup,
                               .decay_iters = steps,
                               .hp = {0.9f, 0.95f, 1e-8f, 0.1f}};
}

sl_status tu_layout_synth(void *tokens, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    const tu_layout_tokens *k = tokens;
    tu_synth_tokens(k->B, k->T, k->V, step, micro, ids, tg);
    return SL_OK;
}

void tu_layout_threads(int n, void *(*fn)(void *), void *jobs, size_t stride, size_t world_off) {
    enum { MAXR = 16 };
    sl_comm *comms[MAXR] = {0};
    pthread_t th[MAXR];
    if (n < 1 || n > MAXR) {
        TU_CHECK(n >= 1 && n <= MAXR, "tu_layout_threads: %d ranks", n);
        return;
    }
    if (n > 1) {
        sl_status st = sl_comm_init_loopback(n, comms, NULL);
        TU_CHECK(st == SL_OK, "loopback: %s", sl_errmsg());
        if (st != SL_OK) memset(comms, 0, sizeof comms); /* the ranks run with no world */
    }
    for (int r = 0; r < n; r++) {
        char *job = (char *)jobs + (size_t)r * stride;
        *(sl_comm **)(job + world_off) = comms[r];
        pthread_create(&th[r], NULL, fn, job);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) sl_comm_free(comms[r]);
}
