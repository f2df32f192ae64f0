/* Mixture-of-experts options of a training job (Megatron-LM's flag names): checks that name the flag
 * (bad input, exit status 2 in the CLI), their application to the model, the per-step statistics and
 * DeepSeek-V3's bias update, and the metrics.jsonl fields:
 *   "moe_load": [tokens routed to each expert, summed over the MoE layers] (the load histogram),
 *   "moe_dropped_frac": dropped / routed assignments, "moe_aux_loss" / "moe_z_loss": the raw losses (before
 *   their coefficients), mean over layers. From the last micro-batch of the step: loads and dropped
 *   assignments summed over the data-parallel ranks, the losses averaged over them;
 *   with --expert-model-parallel-size, "moe_a2a_ms" / "moe_a2a_mib": this rank's time in the dispatch and
 *   combine all-to-alls (and the count exchanges) of the step, and the bytes it sent to other ranks.
 * The step's "loss" is what is optimised: cross-entropy + the coefficients times each layer's router losses
 * (equal to the cross-entropy with both coefficients 0, the default). */
#include <math.h>
#include <string.h>

#include "train/train_internal.h"

static const char *const k_router_names[SL_MOE_ROUTER_COUNT] = {"config", "topk-softmax", "softmax-topk",
                                                                "sigmoid"};

static int router_of(const char *s) {
    if (!s) return SL_MOE_ROUTER_CONFIG;
    for (int i = 0; i < SL_MOE_ROUTER_COUNT; i++)
        if (!strcmp(s, k_router_names[i])) return i;
    return -1;
}

static int moe_flags_given(const sl_train_moe_opts *mo) {
    return mo->router || !isnan(mo->capacity_factor) || mo->aux_loss_coeff != 0 || mo->z_loss_coeff != 0 ||
           mo->bias_update_rate != 0 || mo->num_experts || mo->topk;
}

sl_status sl_train_moe_check(sl_train_job *j) {
    const sl_train_opts *o = &j->o;
    const sl_train_moe_opts *mo = &o->moe;
    if (router_of(mo->router) < 0)
        return sl_train_bad("--moe-router '%s': expected config, topk-softmax, softmax-topk or sigmoid",
                            mo->router);
    if (!isnan(mo->capacity_factor) && !(mo->capacity_factor > 0))
        return sl_train_bad("--moe-capacity-factor must be > 0, got %g (leave it out for dropless routing)",
                            mo->capacity_factor);
    if (mo->aux_loss_coeff < 0 || mo->z_loss_coeff < 0 || mo->bias_update_rate < 0)
        return sl_train_bad("--%s must be >= 0", mo->aux_loss_coeff < 0 ? "moe-aux-loss-coeff"
                                                 : mo->z_loss_coeff < 0 ? "moe-z-loss-coeff"
                                                                        : "moe-router-bias-update-rate");
    if (mo->num_experts < 0 || mo->topk < 0)
        return sl_train_bad("--%s must be >= 1", mo->num_experts < 0 ? "num-experts" : "moe-router-topk");
    /* the model's experts: --init-from's config.json (read-only); fresh models are dense */
    int E = 0, is_moe = 0, group_limit = 0; /* group_limit: experts in DeepSeek-V3's topk_group groups */
    if (o->model.init_from) {
        sl_llama_config c;
        if (sl_hf_load_config(o->model.init_from, &c, NULL) == SL_OK &&
            (c.arch == SL_ARCH_MIXTRAL || c.arch == SL_ARCH_QWEN2_MOE || c.arch == SL_ARCH_DEEPSEEK_V3)) {
            is_moe = 1, E = c.n_experts;
            if (c.arch == SL_ARCH_DEEPSEEK_V3 && c.n_group > 1) group_limit = c.topk_group * (E / c.n_group);
        }
    }
    if (mo->num_experts && is_moe && mo->num_experts != E)
        return sl_train_bad("--num-experts %lld does not match the model's %d experts (%s/config.json)",
                            (long long)mo->num_experts, E, o->model.init_from);
    if (!is_moe && mo->num_experts) E = (int)mo->num_experts; /* checked below, refused after */
    if (mo->topk && E && mo->topk > E)
        return sl_train_bad("--moe-router-topk %lld exceeds the %d experts%s", (long long)mo->topk, E,
                            is_moe ? " of the model" : " (--num-experts)");
    if (mo->topk && group_limit && mo->topk > group_limit)
        return sl_train_bad("--moe-router-topk %lld exceeds the %d experts of the model's topk_group groups",
                            (long long)mo->topk, group_limit);
    if (o->parallel.ep > 1 && E && E % o->parallel.ep)
        return sl_train_bad("--expert-model-parallel-size %lld does not divide the %d experts%s",
                            (long long)o->parallel.ep, E, is_moe ? " of the model" : " (--num-experts)");
    if (o->parallel.ep > 1) { /* Note [Expert-parallel dispatch] */
        long long ep = (long long)o->parallel.ep;
        if (!is_moe)
            return sl_train_bad(
                "--expert-model-parallel-size %lld needs a mixture-of-experts model: --init-from "
                "a Mixtral, Qwen2-MoE or DeepSeek-V3-style directory",
                ep);
    }
    if (o->parallel.etp > 1) { /* Note [Expert tensor parallelism] */
        long long etp = (long long)o->parallel.etp, tp = (long long)o->parallel.tp;
        int routed = 0;
        if (o->model.init_from) {
            sl_llama_config c;
            routed = sl_hf_load_config(o->model.init_from, &c, NULL) == SL_OK &&
                     (c.arch == SL_ARCH_QWEN2_MOE || c.arch == SL_ARCH_DEEPSEEK_V3);
        }
        if (etp != tp)
            return sl_train_bad(
                "--expert-tensor-parallel-size %lld: must be 1 or the tensor-parallel size (%lld)", etp, tp);
        if (!routed)
            return sl_train_bad(
                "--expert-tensor-parallel-size %lld needs a model with routed experts: --init-from a "
                "Qwen2-MoE or DeepSeek-V3-style directory",
                etp);
    }
    if (!is_moe && moe_flags_given(mo))
        return sl_train_bad(
            "--moe-* and --num-experts need a mixture-of-experts model: --init-from a Mixtral, "
            "Qwen2-MoE or DeepSeek-V3 directory (fresh models are dense GPT-2)");
    if (mo->bias_update_rate > 0 && o->model.init_from) {
        sl_llama_config c;
        if (sl_hf_load_config(o->model.init_from, &c, NULL) == SL_OK && c.arch != SL_ARCH_DEEPSEEK_V3)
            return sl_train_bad("--moe-router-bias-update-rate needs a model with a selection bias "
                                "(DeepSeek-V3's e_score_correction_bias), not %s",
                                sl_arch_name(c.arch));
    }
    return SL_OK;
}

sl_status sl_train_moe_apply(sl_train_job *j) {
    sl_model *m = j->m;
    const sl_train_moe_opts *mo = &j->o.moe;
    if (!sl_model_is_moe(m)) return SL_OK;
    m->moe =
        (sl_moe_train_opts){.capacity_factor = isnan(mo->capacity_factor) ? 0.0f : (float)mo->capacity_factor,
                            .aux_coeff = (float)mo->aux_loss_coeff,
                            .z_coeff = (float)mo->z_loss_coeff,
                            .router = (sl_moe_router)router_of(mo->router),
                            .bias_update_rate = (float)mo->bias_update_rate};
    if (mo->topk) m->lcfg.n_experts_per_tok = (int)mo->topk;
    return SL_OK;
}

/* Under SP with the experts whole, each TP rank routes its own sequence shard: its loads, and with a
 * capacity its dropped assignments (those of the whole batch's capacity: Note [Capacity under sequence
 * parallelism], src/nn/moe.c), are a part of the step's (with expert tensor parallelism every TP rank
 * routes all the tokens) */
static int tp_shards_route(const sl_train_job *j) {
    return j->m->sp && j->m->tp > 1 && !j->m->etp && j->mesh.tp_comm;
}

/* the statistics of every data-parallel rank's last micro-batch (and under SP every TP rank's shard):
 * loads and dropped assignments summed, the router losses averaged */
static sl_status reduce_stats(sl_train_job *j, sl_moe_stats *s) {
    sl_comm *c = j->mesh.dp_comm;
    if (s->n_experts <= 0) return SL_OK;
    int E = s->n_experts;
    double v[SL_MOE_MAX_EXPERTS + 3], all[SL_MOE_MAX_EXPERTS + 3], routed = 0;
    for (int e = 0; e < E; e++) routed += (v[e] = s->load[e]);
    v[E] = s->dropped_frac * routed, v[E + 1] = s->aux, v[E + 2] = s->z;
    if (tp_shards_route(j)) { /* only the counts: the router losses that count are whole on every TP rank */
        SL_TRY(sl_comm_all_reduce(j->mesh.tp_comm, v, all, (size_t)E + 1, SL_COMM_F64, SL_COMM_SUM));
        memcpy(v, all, sizeof(double) * (size_t)(E + 1));
        routed = 0;
        for (int e = 0; e < E; e++) routed += (s->load[e] = v[e]);
        s->dropped_frac = routed > 0 ? v[E] / routed : 0;
    }
    if (!c) return SL_OK;
    SL_TRY(sl_comm_all_reduce(c, v, all, (size_t)E + 3, SL_COMM_F64, SL_COMM_SUM));
    routed = 0;
    for (int e = 0; e < E; e++) routed += (s->load[e] = all[e]);
    s->dropped_frac = routed > 0 ? all[E] / routed : 0;
    s->aux = all[E + 1] / j->mesh.dp, s->z = all[E + 2] / j->mesh.dp;
    return SL_OK;
}

/* Note [Bias balancing over micro-batches and ranks]
 * DeepSeek-V3's bias moves by the loads of the whole step (as Megatron's tokens_per_expert, accumulated over
 * the step's micro-batches and summed over the data-parallel ranks), so a run moves its bias alike whatever
 * its micro-batch, accumulation and DP split. The loads are added up after each micro-batch
 * (sl_trainer.after_micro) and all-reduced after the step; the update waits for ZeRO's in-flight parameter
 * gathers first (they rewrite the parameter buffer the bias lives in). */
static sl_status add_loads(void *u, int micro) {
    sl_train_job *j = u;
    size_t n = (size_t)j->moe_nl * (size_t)j->moe_E;
    float tmp[SL_MOE_MAX_EXPERTS * 8],
        *buf = n <= sizeof tmp / sizeof tmp[0] ? tmp : malloc(sizeof(float) * n);
    if (!buf) return sl_fail(SL_ERR_NOMEM, "moe: out of memory");
    sl_status st = sl_moe_bias_loads(j->tr.graph, buf);
    for (size_t i = 0; i < n && st == SL_OK; i++) j->moe_loads[i] = micro ? j->moe_loads[i] + buf[i] : buf[i];
    if (buf != tmp) free(buf);
    return st;
}

static sl_status dp_add(void *u, int64_t off, int64_t n, const float *d) {
    return sl_dp_add_params(u, off, n, d);
}

static sl_status update_bias(sl_train_job *j) {
    if (!j->moe_loads) return SL_OK;
    size_t n = (size_t)j->moe_nl * (size_t)j->moe_E;
    if (j->mesh.dp_comm)
        SL_TRY(sl_comm_all_reduce(j->mesh.dp_comm, j->moe_loads, j->moe_loads, n, SL_COMM_F32, SL_COMM_SUM));
    if (tp_shards_route(j)) /* each TP rank routed its own sequence shard (Note [MoE under TP]) */
        SL_TRY(sl_comm_all_reduce(j->mesh.tp_comm, j->moe_loads, j->moe_loads, n, SL_COMM_F32, SL_COMM_SUM));
    if (j->dp) SL_TRY(sl_dp_sync_params(j->dp));
    /* ZeRO-3 (or any DP): each rank adds the same update to the parameters it keeps */
    if (!j->tr.pipe) return sl_moe_update_bias(j->m, j->tr.graph, j->moe_loads, j->dp ? dp_add : NULL, j->dp);
    /* a pipeline stage: its chunks' layers, each from its chunk's loads; the next step adds from zero */
    const float *l = j->moe_loads;
    for (int c = 0; c < sl_pipeline_chunks(j->tr.pipe); c++) {
        SL_TRY(sl_moe_update_bias(j->m, sl_pipeline_chunk_graph(j->tr.pipe, c), l, j->dp ? dp_add : NULL,
                                  j->dp));
        l += (size_t)j->moe_chunk_nl[c] * (size_t)j->moe_E;
    }
    memset(j->moe_loads, 0, sizeof(float) * n);
    return SL_OK;
}

/* under PP: after each forward unit of the step, the unit's chunk's loads (micro-batches in order, as the
 * single process adds them) */
static sl_status pipe_add_loads(void *u, int chunk, sl_graph *g) {
    sl_train_job *j = u;
    size_t off = 0, n = (size_t)j->moe_chunk_nl[chunk] * (size_t)j->moe_E;
    for (int c = 0; c < chunk; c++) off += (size_t)j->moe_chunk_nl[c] * (size_t)j->moe_E;
    float *buf = malloc(sizeof(float) * (n ? n : 1));
    if (!buf) return sl_fail(SL_ERR_NOMEM, "moe: out of memory");
    sl_status st = sl_moe_bias_loads(g, buf);
    for (size_t i = 0; i < n && st == SL_OK; i++) j->moe_loads[off + i] += buf[i];
    free(buf);
    return st;
}

sl_status sl_train_moe_bias_setup(sl_train_job *j) {
    if (!j->m || !sl_model_is_moe(j->m) || j->m->moe.bias_update_rate == 0) return SL_OK;
    if (j->tr.pipe) { /* Note [Bias balancing over micro-batches and ranks], per model chunk */
        j->moe_nl = 0;
        for (int c = 0; c < sl_pipeline_chunks(j->tr.pipe); c++) {
            int64_t E = 0;
            j->moe_chunk_nl[c] = sl_moe_bias_layers(sl_pipeline_chunk_graph(j->tr.pipe, c), &E);
            if (j->moe_chunk_nl[c] > 0) j->moe_E = E;
            j->moe_nl += j->moe_chunk_nl[c];
        }
        if (j->moe_nl == 0) return SL_OK; /* this stage has no biased layer */
        j->moe_loads = calloc((size_t)j->moe_nl * (size_t)j->moe_E, sizeof(float));
        if (!j->moe_loads) return sl_train_fail(SL_ERR_NOMEM, "moe: out of memory");
        sl_pipeline_set_after_forward(j->tr.pipe, pipe_add_loads, j);
        return SL_OK;
    }
    j->moe_nl = sl_moe_bias_layers(j->tr.graph, &j->moe_E);
    if (j->moe_nl == 0) return SL_OK;
    j->moe_loads = calloc((size_t)j->moe_nl * (size_t)j->moe_E, sizeof(float));
    if (!j->moe_loads) return sl_train_fail(SL_ERR_NOMEM, "moe: out of memory");
    j->tr.after_micro = add_loads;
    j->tr.after_micro_user = j;
    return SL_OK;
}

/* Under pipeline parallelism the step's last micro-batch's statistics of every layer: each chunk's slot that
 * ran it, then every stage's (an all-reduce over the pipeline group, which every stage joins, also one
 * without MoE layers), as one process reports them: loads and dropped assignments summed over the layers,
 * the router losses averaged over them */
static sl_status pipe_stats(sl_train_job *j, sl_moe_stats *s) {
    int E = j->m->lcfg.n_experts, nv = E + 5;
    double v[SL_MOE_MAX_EXPERTS + 5] = {0}, all[SL_MOE_MAX_EXPERTS + 5];
    if (E <= 0 || E > SL_MOE_MAX_EXPERTS) return sl_fail(SL_ERR_INVALID, "moe: %d experts", E);
    for (int c = 0; c < sl_pipeline_chunks(j->tr.pipe); c++) {
        sl_moe_stats cs;
        SL_TRY(sl_moe_graph_stats(sl_pipeline_last_graph(j->tr.pipe, c), &cs));
        double routed = 0;
        for (int e = 0; e < cs.n_experts && e < E; e++) routed += cs.load[e], v[e] += cs.load[e];
        v[E] += cs.dropped_frac * routed, v[E + 1] += cs.aux * cs.n_loss, v[E + 2] += cs.z * cs.n_loss;
        v[E + 3] += cs.n_loss, v[E + 4] += cs.n_layers;
    }
    SL_TRY(sl_comm_all_reduce(j->mesh.pp_comm, v, all, (size_t)nv, SL_COMM_F64, SL_COMM_SUM));
    memset(s, 0, sizeof *s);
    double routed = 0;
    for (int e = 0; e < E; e++) routed += (s->load[e] = all[e]);
    s->n_experts = E;
    s->n_layers = (int)all[E + 4];
    s->n_loss = (int)all[E + 3];
    s->dropped_frac = routed > 0 ? all[E] / routed : 0;
    if (s->n_loss) s->aux = all[E + 1] / s->n_loss, s->z = all[E + 2] / s->n_loss;
    return SL_OK;
}

sl_status sl_train_moe_after_step(sl_train_job *j) {
    if (!j->m || !sl_model_is_moe(j->m)) return SL_OK;
    sl_status st = j->tr.pipe ? pipe_stats(j, &j->moe_stats) : sl_moe_graph_stats(j->tr.graph, &j->moe_stats);
    if (st == SL_OK) st = reduce_stats(j, &j->moe_stats);
    if (st == SL_OK) st = update_bias(j);
    if (st != SL_OK) return sl_train_fail(st, "moe statistics: %s", sl_errmsg());
    return SL_OK;
}

void sl_train_moe_metrics(const sl_train_job *j, FILE *f) {
    const sl_moe_stats *s = &j->moe_stats;
    if (s->n_layers == 0) return;
    fprintf(f, ", \"moe_load\": [");
    for (int e = 0; e < s->n_experts; e++) fprintf(f, "%s%.0f", e ? ", " : "", s->load[e]);
    fprintf(f, "], \"moe_dropped_frac\": %.6f, \"moe_aux_loss\": %.6f, \"moe_z_loss\": %.6f", s->dropped_frac,
            s->aux, s->z);
    if (j->m && j->m->ep > 1)
        fprintf(f, ", \"moe_a2a_ms\": %.3f, \"moe_a2a_mib\": %.4f", j->ep_sec * 1e3, j->ep_bytes / 1048576.0);
}
