/* The training step: builds the forward+backward graph once, plans it, and re-executes it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/parallel.h"
#include "suanli/comm.h"
#include "suanli/train.h"
#include "lanes.h"

sl_status sl_trainer_init(sl_trainer *tr, sl_model *m, const sl_trainer_config *cfg) {
    memset(tr, 0, sizeof *tr);
    tr->cfg = *cfg;
    sl_thread_gov_init(&tr->gov, sl_threads_get()); /* Note [Threads on a shared machine] */
    tr->model = m;
    if (cfg->B < 1 || cfg->T < 1 || cfg->accum < 1)
        return sl_fail(SL_ERR_INVALID, "trainer: B, T, accum must be >= 1");
    if (cfg->T > m->cfg.max_seq_len)
        return sl_fail(SL_ERR_INVALID, "seq-length %d exceeds the model's max positions %d", cfg->T,
                       m->cfg.max_seq_len);
    if (cfg->recompute < SL_RECOMPUTE_NONE || cfg->recompute > SL_RECOMPUTE_BLOCK ||
        cfg->recompute_layers < 0)
        return sl_fail(SL_ERR_INVALID, "trainer: recompute method %d / layers %d", cfg->recompute,
                       cfg->recompute_layers);
    m->recompute = cfg->recompute; /* read by the graphs built below and by a pipeline's slots */
    m->recompute_layers = cfg->recompute_layers;
    sl_status st = sl_lanes_check(m, cfg); /* Note [Micro-batch lanes] */
    if (st != SL_OK) return st;
    tr->lanes = cfg->lanes > 1 ? cfg->lanes : 1;
    size_t n = (size_t)cfg->B * (size_t)cfg->T, nl = n / (size_t)tr->lanes; /* a lane's rows: B / lanes */
    tr->ids_buf = calloc(n, sizeof(int32_t));
    tr->tg_buf = calloc(n, sizeof(int32_t));
    if (!tr->ids_buf || !tr->tg_buf) {
        st = sl_fail(SL_ERR_NOMEM, "trainer: out of memory");
        goto done;
    }
    int dpn = cfg->dp_size > 1 ? cfg->dp_size : 1;
    if (cfg->loss_scale.initial > 0) {
        st = sl_loss_scaler_init(&tr->scaler, &cfg->loss_scale);
        if (st != SL_OK) goto done;
        tr->scaling = 1;
    }
    tr->seed_base = 1.0f / (float)(cfg->accum * dpn * tr->lanes);
    if (m->pp > 1) { /* a pipeline stage: the graphs are the schedule's slots */
        if (!cfg->mesh) {
            st = sl_fail(SL_ERR_INVALID, "trainer: a pipeline stage needs the mesh (sl_trainer_config.mesh)");
            goto done;
        }
        st = sl_pipeline_new(&tr->pipe, m, cfg->mesh, cfg->B, cfg->T, cfg->accum, tr->seed_base,
                             (sl_pipe_schedule)cfg->pipe_schedule);
        if (st != SL_OK) goto done;
        tr->graph = sl_pipeline_graph(tr->pipe, 0);
        tr->plan = sl_pipeline_plan(tr->pipe);
        goto done;
    }
    /* the inputs live on the model's backend: ids at byte 0, targets after them */
    st = sl_backend_alloc(m->backend, 2 * nl * sizeof(int32_t), &tr->input_buf);
    if (st != SL_OK) goto done;
    tr->ids = sl_set_name(sl_new_tensor_2d(m->ctx, SL_I32, cfg->B / tr->lanes, cfg->T), "ids");
    tr->targets = sl_set_name(sl_new_tensor_2d(m->ctx, SL_I32, cfg->B / tr->lanes, cfg->T), "targets");
    sl_set_input(tr->ids);
    sl_set_input(tr->targets);
    sl_tensor_bind_buffer(tr->ids, tr->input_buf, 0);
    sl_tensor_bind_buffer(tr->targets, tr->input_buf, nl * sizeof(int32_t));
    tr->loss = sl_model_build(m, tr->ids, tr->targets, &tr->logits); /* any architecture */
    tr->graph = sl_graph_new(m->ctx);
    if (!tr->graph) {
        st = sl_fail(SL_ERR_NOMEM, "trainer: out of memory");
        goto done;
    }
    sl_graph_build_forward(tr->graph, tr->loss);
    tr->n_forward = sl_graph_n_nodes(tr->graph);
    sl_graph_set_recompute(tr->graph, m->recompute, m->recompute_layers); /* Note [Full recomputation] */
    sl_graph_build_backward(tr->graph, tr->loss, tr->seed_base);
    tr->seed = sl_graph_grad_of(tr->graph, tr->loss);
    SL_CHECK(sl_graph_plan(tr->graph, m->backend, &tr->plan));
    if (tr->lanes > 1) st = sl_lanes_build(tr); /* Note [Micro-batch lanes] */
done:
    if (st != SL_OK) sl_trainer_free(tr);
    return st;
}

/* The tied embedding of a pipeline's first or last stage (the lookup's and the LM head's copies) */
static int pipe_tied(const sl_trainer *tr, const char **name) {
    const sl_mesh *mesh = tr->cfg.mesh;
    const sl_model *m = tr->model;
    *name = m->arch == SL_ARCH_GPT2 ? "wte" : "model.embed_tokens.weight";
    if (!tr->pipe || !mesh) return 0;
    int tied = m->arch == SL_ARCH_GPT2 || m->lcfg.tie_embeddings;
    return tied && (mesh->pp_rank == 0 || mesh->pp_rank == mesh->pp - 1);
}

/* Note [DP overlap under PP]
 * Without a pipeline, data parallelism launches each gradient bucket's reduction from the executor hook as
 * soon as the last micro-batch's backward has written it. Under a pipeline the last micro-batch's backward
 * of a chunk is one unit of the schedule (or its W under zero bubble), run on one of the chunk's slot
 * graphs, which all have the nodes of the chunk's first. That unit runs with the hook
 * (sl_pipeline_set_last_grads), so the reductions overlap its remaining nodes and what the schedule still
 * does after it (the other chunks' units, the sends and receives, the tied-embedding exchange);
 * sl_dp_finish_grads then launches what is left and waits. The buckets' ready points come from
 * sl_trainer_dp_ready: node w of the chunk whose last gradient unit is the k-th of the stage's chunks (in
 * schedule order) is k * READY_SPAN + w, and the hook of that unit counts the same way, so with interleaved
 * chunks a bucket goes once the last of its chunks is done. The tied embedding of the first and last
 * stages waits for the first + last sum (pipe_after_backward): SL_DP_READY_LATE. A dp built without this
 * function (a caller's own sl_dp_opts) gets the overlap only where its default is right: one chunk and no
 * tied copy on the stage. The reductions are the same collectives over the same buffers in the same order,
 * so the weights are bitwise those of the end-of-step reduction (test_pp). SUANLI_PP_DP_OVERLAP=0 turns it
 * off. */
enum { READY_SPAN = 1 << 22 }; /* nodes per chunk in that numbering (16 chunks fit an int) */

int sl_trainer_dp_ready(void *user, const sl_tensor *param) {
    sl_trainer *tr = user;
    const char *name;
    if (!tr->pipe) return sl_graph_last_grad_write(tr->graph, param);
    if (pipe_tied(tr, &name)) {
        const sl_param_info *w = sl_model_find(tr->model, name);
        if (w && w->t == param) return SL_DP_READY_LATE;
    }
    for (int c = 0; c < sl_pipeline_chunks(tr->pipe); c++) {
        int w = sl_graph_last_grad_write(sl_pipeline_chunk_graph(tr->pipe, c), param);
        int k = sl_pipeline_last_order(tr->pipe, c);
        if (w >= 0 && k >= 0) return w < READY_SPAN ? k * READY_SPAN + w : SL_DP_READY_LATE;
    }
    return -1;
}

typedef struct {
    sl_dp *dp;
    int base; /* the chunk's first number in the dp's ready numbering */
} ready_map;

static sl_status mapped_hook(sl_graph *g, int i, sl_tensor *n, void *user) {
    ready_map *r = user;
    return sl_dp_hook(g, r->base + i, n, r->dp);
}

static sl_status pipe_last_grads(void *user, int chunk, sl_graph *g, int lo, int hi) {
    sl_trainer *tr = user;
    int own = sl_dp_ready_from(tr->dp, sl_trainer_dp_ready, tr);
    ready_map r = {tr->dp, own ? sl_pipeline_last_order(tr->pipe, chunk) * READY_SPAN : 0};
    if (!tr->dp_pass) { /* the step's first last-unit: arm and start the pass */
        sl_dp_arm(tr->dp, 1);
        SL_TRY(sl_dp_begin_pass(tr->dp, sl_graph_n_nodes(g)));
        tr->dp_pass = 1;
    }
    sl_status st = sl_graph_compute_range(g, lo, hi, mapped_hook, &r);
    sl_status es = sl_dp_end_pass(tr->dp); /* stays armed: finish_grads launches the rest, then disarms */
    return st != SL_OK ? st : es;
}

static int pipe_overlap(const sl_trainer *tr) {
    const char *e = getenv("SUANLI_PP_DP_OVERLAP"), *name;
    if (!tr->pipe || !tr->dp || (e && !strcmp(e, "0"))) return 0;
    if (sl_dp_ready_from(tr->dp, sl_trainer_dp_ready, (void *)tr)) return 1;
    return sl_pipeline_chunks(tr->pipe) == 1 && !pipe_tied(tr, &name);
}

/* Note [Router losses on every stage]
 * The whole model's loss is the cross-entropy plus every MoE layer's router losses (Switch's auxiliary loss
 * and the z-loss, sl_moe_add_router_losses). On one process they are added into the loss node. Under a
 * pipeline a stage before the last has no loss node: its router losses are summed into a scalar that its
 * slot graphs hold as a second root (sl_model_build_stage's router_loss), seeded in the backward with the
 * loss's own seed (1 / (accum x dp), times the fp16 loss scale), as Megatron's MoEAuxLossAutoScaler does.
 * So each router-loss node gets the gradient it gets in one process, bitwise. The loss a step reports is
 * then each stage's part (the last: cross-entropy and its layers' router losses; the others: theirs),
 * averaged over the micro-batches and summed over the stages (an all-reduce where the broadcast from the
 * last stage was), which differs from one process only in the order of the float additions. */
static int pipe_router_losses(const sl_model *m) {
    return sl_model_is_moe(m) && (m->moe.aux_coeff > 0 || m->moe.z_coeff > 0);
}

/* the step's (or evaluation's) loss on every stage: the last stage's, or the stages' parts summed */
static sl_status pipe_loss(const sl_trainer *tr, float *loss) {
    const sl_mesh *mesh = tr->cfg.mesh;
    if (!pipe_router_losses(tr->model))
        return sl_comm_broadcast(mesh->pp_comm, loss, loss, 1, SL_COMM_F32, mesh->pp - 1);
    float part = *loss;
    return sl_comm_all_reduce(mesh->pp_comm, &part, loss, 1, SL_COMM_F32, SL_COMM_SUM);
}

/* After a pipeline step's backward: the tied embedding's two gradients (first stage's lookup, last
 * stage's LM head) summed on both, in the same order (first + last) so the copies stay bitwise equal,
 * before data parallelism reduces their bucket; the loss from the last stage to every stage. */
static sl_status pipe_after_backward(sl_trainer *tr, float *loss) {
    const sl_mesh *mesh = tr->cfg.mesh;
    sl_model *m = tr->model;
    int p = mesh->pp, s = mesh->pp_rank;
    const char *name;
    if (pipe_tied(tr, &name)) {
        const sl_param_info *w = sl_model_find(m, name);
        if (!w || !m->grads_buf)
            return sl_fail(SL_ERR_INVALID, "pipeline: no %s gradient on stage %d", name, s);
        /* not host-visible: a host copy (Note [Staged pipeline transfers]) */
        float *staged = m->grads_mem ? NULL : malloc(sizeof(float) * (size_t)w->numel);
        float *g = m->grads_mem ? m->grads_mem + w->offset : staged,
              *other = malloc(sizeof(float) * (size_t)w->numel);
        sl_status st = other && g ? SL_OK : sl_fail(SL_ERR_NOMEM, "pipeline: out of memory");
        if (st == SL_OK && staged) st = sl_model_grads_read(m, w->offset, w->numel, staged);
        if (st != SL_OK) {
            free(staged);
            free(other);
            return st;
        }
        if (s == 0) {
            st = sl_comm_send(mesh->pp_comm, g, (size_t)w->numel, SL_COMM_F32, p - 1);
            if (st == SL_OK) st = sl_comm_recv(mesh->pp_comm, other, (size_t)w->numel, SL_COMM_F32, p - 1);
            if (st == SL_OK)
                for (int64_t i = 0; i < w->numel; i++) g[i] = g[i] + other[i];
        } else {
            st = sl_comm_recv(mesh->pp_comm, other, (size_t)w->numel, SL_COMM_F32, 0);
            if (st == SL_OK) st = sl_comm_send(mesh->pp_comm, g, (size_t)w->numel, SL_COMM_F32, 0);
            if (st == SL_OK)
                for (int64_t i = 0; i < w->numel; i++) g[i] = other[i] + g[i];
        }
        if (st == SL_OK && staged)
            st = sl_backend_copy_in(m->grads_buf, sizeof(float) * (size_t)w->offset, staged,
                                    sizeof(float) * (size_t)w->numel);
        free(staged);
        free(other);
        SL_TRY(st);
        sl_pipeline_add_bytes(tr->pipe, (double)w->numel * sizeof(float));
    }
    return pipe_loss(tr, loss);
}

sl_status sl_trainer_set_tp(sl_trainer *tr, sl_tp *tp) {
    int n = tr->model->tp > 1 ? tr->model->tp : 1;
    if (sl_tp_size(tp) != n)
        return sl_fail(SL_ERR_INVALID, "trainer: the model is split %d ways, the TP group has %d ranks", n,
                       sl_tp_size(tp));
    tr->tp = tp;
    sl_graph *gs[64];
    int ng = 0;
    if (tr->pipe)
        for (int k = 0; k < sl_pipeline_slots(tr->pipe) && ng < 64; k++)
            gs[ng++] = sl_pipeline_graph(tr->pipe, k);
    else
        gs[ng++] = tr->graph;
    for (int k = 0; k < ng; k++) sl_graph_set_collective(gs[k], sl_tp_collective, tp);
    if (!tr->model->backend->caps.host_visible) return SL_OK; /* Note [Staged TP collectives] */
    SL_TRY(sl_ep_window_arenas(tp, gs, ng));                  /* the dispatch reads peers' rows in place */
    size_t sb = tr->pipe ? sl_pipeline_plan(tr->pipe).scratch_bytes : 0; /* and the slots' shared scratch */
    void *w = NULL;
    if (sb) SL_TRY(sl_ep_window_alloc(tp, sb, &w));
    return w ? sl_pipeline_move_scratch(tr->pipe, w, sb) : SL_OK;
}

void sl_trainer_free(sl_trainer *tr) {
    sl_lanes_free(tr);
    if (tr->pipe)
        sl_pipeline_free(tr->pipe); /* owns the graphs */
    else
        sl_graph_free(tr->graph);
    tr->pipe = NULL;
    tr->graph = NULL;
    free(tr->ids_buf);
    free(tr->tg_buf);
    tr->ids_buf = tr->tg_buf = NULL;
    if (tr->input_buf) sl_backend_free(tr->model->backend, tr->input_buf);
    tr->input_buf = NULL;
    if (tr->opt_ready) sl_adamw_free(&tr->opt);
    tr->opt_ready = 0;
}

sl_status sl_trainer_forward_backward(sl_trainer *tr, const int32_t *ids, const int32_t *targets,
                                      float *loss) {
    if (tr->lane) return sl_lanes_run(tr, ids, targets, 0, loss); /* Note [Micro-batch lanes] */
    size_t n = (size_t)tr->cfg.B * (size_t)tr->cfg.T;
    SL_TRY(sl_backend_copy_in(tr->input_buf, 0, ids, n * sizeof(int32_t)));
    SL_TRY(sl_backend_copy_in(tr->input_buf, n * sizeof(int32_t), targets, n * sizeof(int32_t)));
    if (tr->dp) SL_TRY(sl_dp_begin_pass(tr->dp, sl_graph_n_nodes(tr->graph)));
    sl_status st = sl_graph_compute(tr->graph, tr->dp ? sl_dp_hook : NULL, tr->dp);
    if (tr->dp) {
        sl_status es = sl_dp_end_pass(tr->dp);
        if (st == SL_OK) st = es;
    }
    SL_TRY(st);
    if (loss) SL_TRY(sl_tensor_copy_out(tr->loss, loss));
    return SL_OK;
}

static sl_status trainer_step(sl_trainer *tr, int64_t step, sl_batch_fn fn, void *user, sl_step_stats *stats,
                              double t0);

sl_status sl_trainer_step(sl_trainer *tr, int64_t step, sl_batch_fn fn, void *user, sl_step_stats *stats) {
    double t0 = sl_time_sec();
    int threads = sl_thread_gov_begin(&tr->gov);
    sl_status st = trainer_step(tr, step, fn, user, stats, t0);
    double sec = sl_time_sec() - t0;
    sl_thread_gov_end(&tr->gov, sec);
    if (stats) stats->threads = threads;
    return st;
}

static sl_status trainer_step(sl_trainer *tr, int64_t step, sl_batch_fn fn, void *user, sl_step_stats *stats,
                              double t0) {
    sl_model *m = tr->model;
    if (tr->dp && sl_dp_grad_slots(tr->dp) && tr->cfg.accum > 1)
        return sl_fail(SL_ERR_INVALID, "trainer: gradient slots (sl_dp_opts.accum = 1) with accum %d",
                       tr->cfg.accum);
    /* Gradients start at zero: the first micro-batch's first write into each gradient overwrites it
     * (Note [Overwriting first gradient writes], suanli/graph.h) instead of a zeroing pass over the whole
     * buffer; only gradients that no node writes are zeroed here. */
    int overwrite = m->grads_buf != NULL; /* else: dp zeroes its gradient slots */
    if (overwrite)
        for (int i = 0; i < m->n_params; i++)
            if (sl_graph_last_grad_write(tr->graph, m->params[i].t) < 0)
                SL_TRY(sl_backend_memset_zero(m->grads_buf, sizeof(float) * (size_t)m->params[i].offset,
                                              sizeof(float) * (size_t)m->params[i].numel));
    if (overwrite && tr->lane) SL_TRY(sl_lanes_zero_unwritten(tr));
    double tot = 0, wait = 0;
    int dp_rank = tr->dp ? sl_dp_rank(tr->dp) : 0;
    float S = tr->scaling ? tr->scaler.scale : 1.0f; /* Note [Dynamic loss scaling] */
    if (tr->scaling && tr->pipe) /* every stage's gradients carry S: the skip test below sees them all */
        sl_pipeline_set_loss_seed(tr->pipe, tr->seed_base * S);
    else if (tr->scaling) {
        tr->seed->fparams[0] = tr->seed_base * S;
        if (tr->lane) sl_lanes_set_seed(tr, tr->seed_base * S);
    }
    sl_status st = SL_OK;
    if (tr->pipe) { /* the schedule runs every micro-batch; the last stage has the loss */
        float l = 0;
        if (tr->dp) { /* the forward runs unhooked; the last backward unit launches the buckets */
            sl_dp_arm(tr->dp, 0);
            st = sl_dp_sync_params(tr->dp);
            sl_pipeline_set_last_grads(tr->pipe, pipe_overlap(tr) ? pipe_last_grads : NULL, tr);
            tr->dp_pass = 0;
        }
        sl_pipeline_set_dropout(tr->pipe, 1, tr->cfg.dropout_seed,
                                (uint64_t)(tr->cfg.accum * (tr->cfg.dp_size > 1 ? tr->cfg.dp_size : 1)));
        if (st == SL_OK)
            st = sl_pipeline_step(tr->pipe, step, tr->cfg.accum, dp_rank * tr->cfg.accum, fn, user, overwrite,
                                  &l);
        sl_pipeline_set_dropout(tr->pipe, 0, 0, 0); /* evaluation runs the slots without masks */
        if (st == SL_OK) st = pipe_after_backward(tr, &l);
        tot = (double)l * tr->cfg.accum;
    }
    if (tr->lane && tr->dp) { /* Note [Micro-batch lanes]: lanes read the gathered parameters, and their
                                 gradients are reduced after the lanes' sum (sl_dp_finish_grads) */
        if (sl_dp_zero_stage(tr->dp) >= 2)
            return sl_fail(SL_ERR_INVALID, "--micro-batch-lanes %d: not supported with ZeRO-%d", tr->lanes,
                           sl_dp_zero_stage(tr->dp));
        st = sl_dp_sync_params(tr->dp);
    }
    for (int micro = 0; micro < tr->cfg.accum && st == SL_OK && !tr->pipe; micro++) {
        st = fn(user, step, dp_rank * tr->cfg.accum + micro, tr->ids_buf, tr->tg_buf);
        if (st != SL_OK) break;
        float l;
        if (tr->dp) sl_dp_arm(tr->dp, !tr->lane && micro == tr->cfg.accum - 1);
        sl_graph_set_grad_overwrite(tr->graph, overwrite && micro == 0);
        /* Note [Dropout from counters]: the global micro-batch counter keys this micro-batch's masks */
        uint64_t stream =
            (uint64_t)step * (uint64_t)(tr->cfg.accum * (tr->cfg.dp_size > 1 ? tr->cfg.dp_size : 1)) +
            (uint64_t)(dp_rank * tr->cfg.accum + micro);
        sl_graph_set_dropout(tr->graph, 1, tr->cfg.dropout_seed, stream);
        if (tr->lane) sl_lanes_set(tr, overwrite && micro == 0, 1, tr->cfg.dropout_seed, stream);
        st = sl_trainer_forward_backward(tr, tr->ids_buf, tr->tg_buf, &l);
        sl_graph_set_dropout(tr->graph, 0, 0, 0); /* other runs of the graph (eval) without dropout */
        if (tr->lane) sl_lanes_set(tr, 0, 0, 0, 0);
        if (st == SL_OK && tr->after_micro) st = tr->after_micro(tr->after_micro_user, micro);
        tot += l;
    }
    sl_graph_set_grad_overwrite(tr->graph, 0);                /* other callers of the graph accumulate */
    if (st == SL_OK && tr->lane) st = sl_lanes_sum_grads(tr); /* lane order: Note [Micro-batch lanes] */
    SL_TRY(st);
    float lr = sl_lr_schedule(step, tr->cfg.lr, tr->cfg.min_lr, tr->cfg.warmup, tr->cfg.decay_iters);
    float norm, loss = (float)(tot / tr->cfg.accum), inv = 1.0f / S;
    int skip = 0;
    if (tr->dp) {
        SL_TRY(sl_dp_finish_grads(tr->dp, &wait));
        SL_TRY(sl_dp_mean(tr->dp, &loss)); /* before the update: the parameter gathers it launches run on */
        SL_TRY(sl_dp_clip_unscale(tr->dp, tr->cfg.clip, inv, &norm)); /* the all-reduced (same) norm */
        skip = tr->scaling && sl_grad_found_inf(norm);
        if (!skip && tr->pre_update) tr->pre_update(tr->pre_update_user);
        if (!skip) SL_TRY(sl_dp_optimizer_step(tr->dp, lr, tr->opt_t + 1, tr->cfg.hp));
    } else {
        if (!tr->opt_ready) {
            SL_TRY(sl_adamw_init(&tr->opt, m, tr->cfg.hp));
            tr->opt_ready = 1;
            tr->opt.t = tr->opt_t;
        }
        if (tr->tp || tr->pipe) { /* clipping is applied inside the update (sl_adamw_step_scaled) */
            double ss;
            SL_TRY(sl_tp_grad_sumsq(tr->tp, m, &ss));
            if (tr->pipe) {
                double all;
                SL_TRY(sl_comm_all_reduce(tr->cfg.mesh->pp_comm, &ss, &all, 1, SL_COMM_F64, SL_COMM_SUM));
                ss = all;
            }
            norm = (float)sqrt(ss);
        } else {
            SL_TRY(sl_grad_norm(m, &norm));
        }
        norm *= inv; /* exact: S is a power of two */
        skip = tr->scaling && sl_grad_found_inf(norm);
        if (!skip && tr->pre_update) tr->pre_update(tr->pre_update_user);
        if (!skip) SL_TRY(sl_adamw_step_scaled(&tr->opt, m, lr, sl_clip_coef(norm, tr->cfg.clip) * inv));
    }
    if (!skip) tr->opt_t++; /* a skipped step takes no AdamW step (bias correction counts updates) */
    if (tr->scaling) sl_loss_scaler_update(&tr->scaler, skip);
    if (stats) {
        stats->pipe_wait_sec = tr->pipe ? sl_pipeline_take_wait(tr->pipe) : 0;
        stats->pp_comm_bytes = tr->pipe ? sl_pipeline_take_bytes(tr->pipe) : 0;
        stats->dp_comm_bytes = sl_dp_take_comm_bytes(tr->dp);
        stats->loss = loss;
        stats->grad_norm = norm;
        stats->lr = lr;
        stats->seconds = sl_time_sec() - t0;
        stats->comm_wait_sec = wait;
        stats->loss_scale = S;
        stats->skipped = skip;
        stats->skipped_total = tr->scaling ? tr->scaler.skipped : 0;
    }
    return SL_OK;
}

/* Note [Evaluation over the global batch]
 * Eval step i is a step's global batch of the val split: DP rank r runs its accum micro-batches r accum + m,
 * exactly as training assigns them (Note [Deterministic batches]), and the loss is the mean over all of them
 * (the micro-batches' means, averaged over the DP group), as Megatron evaluates eval_iters global batches.
 * Every layout of one global batch therefore scores the same samples: the single process's val loss. (Each
 * rank had scored micro-batch 0 alone: the DP ranks all the same samples, a val loss that moved with the
 * micro-batch size, accum - 1 of every accum micro-batches never scored.) */
sl_status sl_trainer_eval(sl_trainer *tr, sl_batch_fn fn, void *user, int iters, float *loss) {
    int accum = tr->cfg.accum > 0 ? tr->cfg.accum : 1, micro0 = (tr->dp ? sl_dp_rank(tr->dp) : 0) * accum;
    if (tr->pipe) {
        if (tr->dp) SL_TRY(sl_dp_sync_params(tr->dp));
        SL_TRY(sl_pipeline_eval(tr->pipe, iters, accum, micro0, fn, user, loss));
        SL_TRY(pipe_loss(tr, loss));
        sl_pipeline_take_wait(tr->pipe); /* not the next step's */
        return tr->dp ? sl_dp_mean(tr->dp, loss) : SL_OK;
    }
    double tot = 0;
    size_t n = (size_t)tr->cfg.B * (size_t)tr->cfg.T;
    if (tr->lane && tr->dp) SL_TRY(sl_dp_sync_params(tr->dp)); /* lanes read the gathered parameters */
    for (int it = 0; it < iters * accum; it++) {
        int i = it / accum, micro = micro0 + it % accum;
        SL_TRY(fn(user, i, micro, tr->ids_buf, tr->tg_buf));
        float l;
        if (tr->lane) { /* Note [Micro-batch lanes] */
            SL_TRY(sl_lanes_run(tr, tr->ids_buf, tr->tg_buf, 1, &l));
            tot += l;
            continue;
        }
        SL_TRY(sl_backend_copy_in(tr->input_buf, 0, tr->ids_buf, n * sizeof(int32_t)));
        SL_TRY(sl_backend_copy_in(tr->input_buf, n * sizeof(int32_t), tr->tg_buf, n * sizeof(int32_t)));
        if (tr->dp) SL_TRY(sl_dp_begin_pass(tr->dp, tr->n_forward));
        sl_status st =
            sl_graph_compute_range(tr->graph, 0, tr->n_forward, tr->dp ? sl_dp_hook : NULL, tr->dp);
        if (tr->dp) {
            sl_status es = sl_dp_end_pass(tr->dp);
            if (st == SL_OK) st = es;
        }
        SL_TRY(st);
        SL_TRY(sl_tensor_copy_out(tr->loss, &l));
        tot += l;
    }
    *loss = iters ? (float)(tot / ((double)iters * accum)) : 0.0f;
    return tr->dp ? sl_dp_mean(tr->dp, loss) : SL_OK;
}
