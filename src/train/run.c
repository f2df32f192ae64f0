/* A training job's run: the step loop (eval at interval, progress line, metrics.jsonl, checkpoints,
 * fault hooks, the time limit), the final save and the sample. Setup is in job.c. */
#include <math.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "suanli/metrics.h"
#include "suanli/model_io.h"
#include "train/train_internal.h"

typedef struct {
    const sl_dataset *ds;
    int B, T;
    uint64_t seed;
} batch_src;

/* Micro-batch `micro` (dp_rank*accum + local micro, suanli/train.h) of step `step` holds the step's global
 * samples micro*B .. micro*B+B-1 (Note [Deterministic batches], src/data/loader.c): every micro-batch,
 * accumulation and DP split of one global batch trains on the same samples. Eval step i draws from the val
 * split's step i the same way. */
static sl_status batch_fn(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    batch_src *s = u;
    return sl_dataset_samples(s->ds, s->T, s->seed, (uint64_t)step, (int64_t)micro * s->B, s->B, ids, tg);
}

static void fmt_eta(double sec, char *buf, size_t n) {
    if (sec < 0 || !isfinite(sec)) sec = 0;
    int s = (int)(sec + 0.5);
    if (s >= 3600)
        snprintf(buf, n, "%dh%02dm", s / 3600, (s / 60) % 60);
    else if (s >= 60)
        snprintf(buf, n, "%dm%02ds", s / 60, s % 60);
    else
        snprintf(buf, n, "%ds", s);
}

static sl_status copy_file(const char *src, const char *dst) {
    char *buf;
    size_t n;
    SL_TRY(sl_file_read_all(src, &buf, &n));
    sl_status st = sl_file_write_atomic(dst, buf, n);
    free(buf);
    return st;
}

/* Under PP, one line per stage (collective: every rank calls it; rank 0 prints): its layers, graph slots,
 * parameters and planned activations, from the stage's first rank (TP / DP peers hold the same counts) */
static sl_status print_stages(const sl_train_job *j) {
    if (!j->tr.pipe || !j->world) return SL_OK;
    const sl_model *m = j->m;
    int world = j->mesh.world;
    int64_t me[5] = {m->layer0, m->n_layers, sl_pipeline_slots(j->tr.pipe), m->numel,
                     (int64_t)j->tr.plan.planned_bytes},
            *all = malloc(sizeof(int64_t) * 5 * (size_t)world);
    if (!all) return sl_fail(SL_ERR_NOMEM, "train: out of memory");
    sl_status st = sl_comm_all_gather(j->world, me, all, 5, SL_COMM_I64);
    for (int s = 0; st == SL_OK && j->out && s < j->mesh.pp; s++) {
        const int64_t *r = all + 5 * (size_t)s * (size_t)(j->mesh.dp * j->mesh.tp); /* rank (s x dp) x tp */
        fprintf(j->out,
                "  stage %d: layers %lld-%lld, %lld graph slot%s, params %.2f MiB, planned activations %.1f "
                "MiB\n",
                s, (long long)r[0], (long long)(r[0] + r[1] - 1), (long long)r[2], r[2] == 1 ? "" : "s",
                (double)r[3] * 4.0 / 1048576.0, (double)r[4] / 1048576.0);
    }
    free(all);
    return st;
}

static void print_banner(const sl_train_job *j) {
    FILE *f = j->out;
    if (!f) return;
    const sl_model *m = j->m;
    const sl_gpt2_config *c = &j->cfg;
    fprintf(f,
            "suanli train: %s L=%d H=%d C=%d V=%d T=%d | %.2fM params | micro-batch %d x accum %d x dp %d | "
            "%s | %s%s%d threads, %s\n",
            m->arch == SL_ARCH_GPT2 ? "GPT-2" : sl_arch_name(m->arch), c->n_layer, c->n_head, c->n_embd,
            c->vocab_size, j->T, (double)m->numel / 1e6, j->B, j->accum, j->mesh.dp,
            j->o.model.bf16   ? "bf16 mixed precision"
            : j->o.model.fp16 ? "fp16 mixed precision"
                              : "fp32",
            strcmp(j->be->name, "cpu") ? j->be->name : "", strcmp(j->be->name, "cpu") ? " device, host " : "",
            sl_threads_get(), sl_cpu_isa_name());
    if (j->world && sl_comm_size(j->world) > 1)
        fprintf(f, "communication: %d ranks, %s transport\n", sl_comm_size(j->world),
                sl_comm_transport_name(sl_comm_transport(j->world)));
    if (j->dp) {
        sl_dp_memory mem;
        sl_dp_memory_report(j->dp, &mem);
        fprintf(f, "data parallel: %d ranks, ZeRO-%lld, %d gradient buckets | per rank: params %.1f MiB",
                j->mesh.dp, (long long)j->o.parallel.zero_stage, sl_dp_num_buckets(j->dp),
                mem.param_bytes / 1048576.0);
        fprintf(f, ", grads %.1f MiB (+ %.1f MiB reduced shard), optimizer state %.1f MiB",
                mem.grad_bytes / 1048576.0, mem.grad_shard_bytes / 1048576.0, mem.optim_bytes / 1048576.0);
        if (mem.slot_bytes) fprintf(f, ", slots %.1f MiB", mem.slot_bytes / 1048576.0);
        fprintf(f, "\n");
    }
    if (m->ep > 1) {
        int64_t ex = 0;
        for (int i = 0; i < m->n_params; i++) ex += m->params[i].expert ? m->params[i].numel : 0;
        double mib = sizeof(float) / 1048576.0;
        fprintf(
            f,
            "expert parallel: %d ranks, %d of %d experts per rank, expert-data-parallel groups of %d | per "
            "rank: params %.2f MiB, of which experts %.2f MiB%s (every expert: %.2f MiB)\n",
            m->ep, m->lcfg.n_experts / m->ep, m->lcfg.n_experts, j->mesh.dp / m->ep, m->numel * mib, ex * mib,
            m->etp && m->tp > 1 ? " as I / tp slices" : "", (double)ex * m->ep * (m->etp ? m->tp : 1) * mib);
    }
    if (j->tp && m->tp > 1) {
        /* per rank: this rank's shards; the formula beside it: split weights / tp + replicated ones */
        double mib = sizeof(float) / 1048576.0, full = (double)sl_tp_full_numel(m);
        fprintf(f,
                "tensor parallel: %d ranks%s | per rank: params %.2f MiB (whole model %.2f MiB), grads %.2f "
                "MiB, optimizer state %.2f MiB | TP communication per step (theory) %.3f MiB\n",
                j->mesh.tp, m->sp ? ", sequence parallel" : "", m->numel * mib, full * mib, m->numel * mib,
                2 * m->numel * mib, sl_tp_comm_theory(m, j->B, j->T, j->accum) / 1048576.0);
    }
    if (j->tr.pipe) {
        int p = j->mesh.pp, mb = j->accum, v = j->vpp;
        if (v > 1)
            fprintf(
                f,
                "pipeline parallel: %d stages, interleaved 1F1B with %d model chunks per stage of %d layers, "
                "%d "
                "micro-batches per step | stage 0: %d graph slots, params %.2f MiB | bubble (p-1)/(vm+p-1) = "
                "%.3f\n",
                p, v, m->n_layers / v, mb, sl_pipeline_slots(j->tr.pipe), m->numel * 4.0 / 1048576.0,
                (double)(p - 1) / (v * mb + p - 1));
        else if (j->o.parallel.zero_bubble) /* Note [Zero-bubble schedule] */
            fprintf(f,
                    "pipeline parallel: %d stages, ZB-H1 (zero bubble: backward split into input- and "
                    "weight-gradient passes), %d micro-batches per step | stage 0: layers %d-%d, %d graph "
                    "slots, params %.2f MiB | bubble (p-1)/(3m+p-1) = %.3f at F = B = W (1F1B %.3f)\n",
                    p, mb, m->layer0, m->layer0 + m->n_layers - 1, sl_pipeline_slots(j->tr.pipe),
                    m->numel * 4.0 / 1048576.0, (double)(p - 1) / (3 * mb + p - 1),
                    (double)(p - 1) / (mb + p - 1));
        else
            fprintf(
                f,
                "pipeline parallel: %d stages, 1F1B, %d micro-batches per step | stage 0: layers %d-%d, %d "
                "graph slots, params %.2f MiB | bubble (p-1)/(m+p-1) = %.3f\n",
                p, mb, m->layer0, m->layer0 + m->n_layers - 1, sl_pipeline_slots(j->tr.pipe),
                m->numel * 4.0 / 1048576.0, (double)(p - 1) / (mb + p - 1));
    }
    fprintf(f,
            "activation memory: planned %.1f MiB (naive sum %.1f MiB) | data: %lld train / %lld val tokens\n",
            j->tr.plan.planned_bytes / 1048576.0, j->tr.plan.naive_bytes / 1048576.0,
            (long long)sl_dataset_num_tokens(j->train), (long long)sl_dataset_num_tokens(j->val));
    if (j->eval_iters_asked) /* Note [Evaluation is at most one pass over the val split] */
        fprintf(f,
                "note: --eval-iters %lld is more than one pass over the %lld val tokens; evaluating %lld "
                "batches of %lld x %d (one pass)\n",
                (long long)j->eval_iters_asked, (long long)sl_dataset_num_tokens(j->val),
                (long long)j->o.eval.iters, (long long)j->o.data.global_batch_size, j->T);
    fflush(f);
    if (j->resume) {
        /* setup: comm, data, model build, the checkpoint's choice, verification and load (bench/ckpt.sh) */
        fprintf(f, "resumed from %s at step %lld (%.2f s; setup %.2f s, %.2f CPU s)\n", j->ckfrom,
                (long long)j->start_step, j->resume_seconds, sl_time_sec() - j->setup_t0,
                sl_train_cpu_seconds() - j->setup_cpu0);
        fflush(f); /* bench/ckpt.sh times the restart by this line */
    }
}

static void report_commit(sl_train_job *j, int64_t step, double commit_ms, const char *how) {
    sl_ckpt_writer *w = j->ckw;
    double wsec = sl_ckpt_writer_write_seconds(w), snap, disk, mb = sl_ckpt_writer_bytes(w) / 1e6;
    int direct;
    sl_ckpt_writer_times(w, &snap, &disk, &direct);
    if (!j->out) return;
    fprintf(j->out,
            "checkpoint step %lld committed: stall %.1f ms, background write %.2f s (%.0f MB/s from rank 0; "
            "snapshot %.2f s, local file %.2f s = %.0f MB/s%s), commit %.1f ms%s\n",
            (long long)step, sl_ckpt_writer_stall(w) * 1e3, wsec, mb / (wsec > 0 ? wsec : 1), snap, disk,
            disk > 0 ? mb / disk : 0, direct ? " O_DIRECT" : "", commit_ms, how);
    fflush(j->out);
}

/* Rank 0, pooled: a commit running on the writer thread finished (or wait for it with force). */
static sl_status commit_poll(sl_train_job *j, int force, const sl_train_callbacks *cb) {
    if (j->committing_step < 0 || (!force && !sl_ckpt_writer_done(j->ckw))) return SL_OK;
    int64_t step = j->committing_step;
    j->committing_step = -1;
    sl_status cs = sl_ckpt_writer_wait(j->ckw);
    if (cs != SL_OK) return sl_train_fail(cs, "checkpoint commit: %s", sl_errmsg());
    report_commit(j, step, sl_ckpt_writer_commit_seconds(j->ckw) * 1e3, " (on the writer thread)");
    if (cb && cb->on_checkpoint && j->mesh.rank == 0) cb->on_checkpoint(cb->user, step, j->pool.local_root);
    return SL_OK;
}

/* Commit a pending checkpoint once every rank's writer finished (or wait for it with force)
 * (Note [Checkpoint commit protocol] in src/ckpt/ckpt.c). */
static sl_status ckpt_poll(sl_train_job *j, int force, const sl_train_callbacks *cb) {
    if (j->pending_step < 0) return SL_OK;
    sl_ckpt_writer *w = j->ckw;
    const sl_mesh *mesh = &j->mesh;
    if (force) sl_ckpt_writer_wait(w);
    int32_t flags[2] = {sl_ckpt_writer_done(w), 0}, agg[2];
    if (j->world) {
        if (sl_comm_all_reduce(j->world, &flags[0], &agg[0], 1, SL_COMM_I32, SL_COMM_MIN) != SL_OK)
            return sl_train_fail(SL_ERR_PEER, "%s", sl_errmsg());
    } else {
        agg[0] = flags[0];
    }
    if (!agg[0]) return SL_OK;
    sl_status ws = sl_ckpt_writer_wait(w);
    flags[1] = ws != SL_OK;
    if (j->world) {
        if (sl_comm_all_reduce(j->world, &flags[1], &agg[1], 1, SL_COMM_I32, SL_COMM_MAX) != SL_OK)
            return sl_train_fail(SL_ERR_PEER, "%s", sl_errmsg());
    } else {
        agg[1] = flags[1];
    }
    if (agg[1])
        return sl_train_fail(SL_ERR_IO, "rank %d: checkpoint step %lld failed: %s", mesh->rank,
                             (long long)j->pending_step, ws != SL_OK ? sl_errmsg() : "on another rank");
    const char *root = j->o.ckpt.save_dir;
    if (j->pooled &&
        j->pool.comm) { /* every rank's writer thread takes part (Note [Pool transfers over comm]) */
        int keep = (int)(j->o.ckpt.local_keep > 0 ? j->o.ckpt.local_keep : j->o.ckpt.keep);
        sl_status cs =
            sl_ckpt_writer_commit_pool(w, j->pending_step, mesh->world, keep, j->model_json, j->layout_json);
        if (cs != SL_OK) return sl_train_fail(cs, "checkpoint commit: %s", sl_errmsg());
        j->committing_step = j->pending_step;
    }
    if (mesh->rank == 0) {
        double t0 = sl_time_sec();
        const char *mem = sl_ckpt_mem_root();
        if (j->pooled && j->pool.comm) {
            /* started above */
        } else if (j->pooled) { /* the per-host commits (fsyncs on every host) run on the writer thread */
            int keep = (int)(j->o.ckpt.local_keep > 0 ? j->o.ckpt.local_keep : j->o.ckpt.keep);
            sl_status cs = sl_ckpt_writer_commit_pool(w, j->pending_step, mesh->world, keep, j->model_json,
                                                      j->layout_json);
            if (cs != SL_OK) return sl_train_fail(cs, "checkpoint commit: %s", sl_errmsg());
            j->committing_step = j->pending_step;
        } else {
            sl_status cs = sl_ckpt_commit(root, j->pending_step, mesh->world, (int)j->o.ckpt.keep,
                                          j->model_json, j->layout_json);
            if (cs != SL_OK) return sl_train_fail(cs, "checkpoint commit: %s", sl_errmsg());
        }
        if (mem && !j->mem_partial && /* Note [A partial in-memory copy is not committed] in job.c */
            sl_ckpt_commit(mem, j->pending_step, mesh->world, 1, j->model_json, j->layout_json) != SL_OK)
            SL_LOGW("in-memory checkpoint copy not committed: %s", sl_errmsg());
        if (!j->pooled) {
            report_commit(j, j->pending_step, (sl_time_sec() - t0) * 1e3, "");
            if (cb && cb->on_checkpoint) cb->on_checkpoint(cb->user, j->pending_step, root);
        }
    }
    /* an in-memory root that no commit reaches (another node's, or rank 0's holding part of the shards):
     * every writer of the step finished (the all-reduces above), so its uncommitted copy goes (Note
     * [In-memory roots on every node] in job.c) */
    if (j->mem_drop && sl_ckpt_mem_root() &&
        sl_ckpt_remove_uncommitted(sl_ckpt_mem_root(), j->pending_step) != SL_OK)
        SL_LOGW("in-memory checkpoint copy of step %lld not removed: %s", (long long)j->pending_step,
                sl_errmsg());
    j->pending_step = -1;
    return SL_OK;
}

/* Start checkpoint `step` (the writer thread snapshots the state and writes in the background). */
static sl_status ckpt_begin(sl_train_job *j, int64_t step) {
    const sl_train_opts *o = &j->o;
    const sl_mesh *mesh = &j->mesh;
    const char *save = o->ckpt.save_dir;
    sl_ckpt_state cst;
    sl_ckpt_seg *segs = NULL;
    sl_status cs = sl_trainer_ckpt_state(&j->tr, mesh->rank, mesh->world, &cst, &segs);
    cst.step = step;
    cst.seed = (uint64_t)o->seed;
    snprintf(j->layout_json, sizeof j->layout_json,
             "{\"world\": %d, \"dp\": %d, \"tp\": %d, \"pp\": %d, \"ep\": %d, \"zero_stage\": %lld, "
             "\"adam_t\": %lld, \"seed\": %lld, \"data_position\": {\"step\": %lld, \"seed\": %lld}, "
             "\"rng\": \"philox4x32-10 stream = step, counter = global sample\", \"micro_batch_size\": %d, "
             "\"global_batch_size\": %lld, "
             "\"seq_length\": %d}",
             mesh->world, mesh->dp, mesh->tp, mesh->pp, mesh->ep,
             (long long)(j->dp ? o->parallel.zero_stage : 0), (long long)cst.adam_t, (long long)o->seed,
             (long long)step, (long long)o->seed, j->B, (long long)o->data.global_batch_size, j->T);
    if (j->tr.scaling) { /* the scaler after step `step`: a resumed fp16 run continues its trajectory */
        size_t n = strlen(j->layout_json);
        const sl_loss_scaler *ls = &j->tr.scaler;
        snprintf(j->layout_json + n - 1, sizeof j->layout_json - (n - 1),
                 ", \"loss_scaler\": {\"scale\": %.9g, \"growth_tracker\": %d, \"hysteresis_tracker\": %d, "
                 "\"skipped\": %lld}}",
                 (double)ls->scale, ls->growth_tracker, ls->hysteresis_tracker, (long long)ls->skipped);
    }
    if (cs == SL_OK) cs = sl_ckpt_save_begin(j->ckw, save, &cst);
    free(segs);
    if (cs != SL_OK) return sl_train_fail(cs, "rank %d: checkpoint: %s", mesh->rank, sl_errmsg());
    /* the model config travels with the checkpoint: the commit writes it (Note [config.json in the commit]
     * in src/ckpt/ckpt.c; pooled: on every host) */
    j->pending_step = step;
    return SL_OK;
}

/* After step `done` (1-based): poll the pending checkpoint, start a new one at the interval. */
static sl_status ckpt_after_step(sl_train_job *j, int64_t done, const sl_train_callbacks *cb) {
    if (!j->ckw) return SL_OK;
    int64_t every = j->o.ckpt.save_interval;
    SL_TRY(commit_poll(j, 0, cb));
    SL_TRY(ckpt_poll(j, 0, cb));
    if (done % every != 0) return SL_OK;
    if (j->pending_step >= 0) SL_TRY(ckpt_poll(j, 1, cb)); /* the previous save is still being written */
    SL_TRY(commit_poll(j, 1, cb)); /* the writer thread is still committing the previous one */
    return ckpt_begin(j, done);
}

/* Test hook (docs/ENV.md): SUANLI_FAULT_LOSE_HOSTS=h[,h...] with a pooled store: the rank that kills itself
 * (SUANLI_FAULT_KILL_AT_STEP) first deletes those hosts' node-local directories, as if their disks died. */
static void lose_hosts(const sl_train_job *j) {
    const char *e = getenv("SUANLI_FAULT_LOSE_HOSTS");
    if (!e || !j->pooled) return;
    for (const char *p = e; *p;) {
        char *end;
        long h = strtol(p, &end, 10);
        if (end == p) break;
        char cmd[4300];
        /* renamed away first: peers' writer threads may still be writing into it */
        snprintf(cmd, sizeof cmd,
                 "mv '%s/host-%ld' '%s/lost-host-%ld.%d' 2>/dev/null; rm -rf '%s/lost-host-%ld.%d'",
                 j->pool.local_root, h, j->pool.local_root, h, (int)getpid(), j->pool.local_root, h,
                 (int)getpid());
        fprintf(stderr, "suanli train: SUANLI_FAULT_LOSE_HOSTS: removing %s/host-%ld\n", j->pool.local_root,
                h);
        if (system(cmd) != 0) fprintf(stderr, "suanli train: could not remove host %ld\n", h);
        p = *end == ',' ? end + 1 : end;
    }
}

/* Test hooks (docs/ENV.md): on the first attempt, the chosen rank (default: every rank) kills or stops
 * itself after the given step. */
static void fault_hooks(const sl_train_job *j, int64_t done) {
    const char *kill_at = getenv("SUANLI_FAULT_KILL_AT_STEP"), *hang_at = getenv("SUANLI_FAULT_HANG_AT_STEP"),
               *fault_rank = getenv("SUANLI_FAULT_RANK"), *restart = getenv("SUANLI_RESTART_COUNT");
    int first = !restart || !strcmp(restart, "0"), me = !fault_rank || atoi(fault_rank) == j->mesh.rank;
    if (kill_at && atoll(kill_at) == done && first && me) {
        fprintf(stderr, "suanli train: rank %d: SUANLI_FAULT_KILL_AT_STEP=%s: killing myself\n", j->mesh.rank,
                kill_at);
        lose_hosts(j);
        fflush(stderr);
        raise(SIGKILL);
    }
    if (hang_at && atoll(hang_at) == done && first && me) {
        fprintf(stderr, "suanli train: rank %d: SUANLI_FAULT_HANG_AT_STEP=%s: stopping myself\n",
                j->mesh.rank, hang_at);
        fflush(stderr);
        raise(SIGSTOP); /* a hung rank: alive but silent */
    }
}

/* The TensorBoard sink of a step's metrics: the scalars of its metrics.jsonl line, Megatron-LM's tags. */
static void tb_sink_step(sl_train_job *j, const sl_train_progress *p) {
    if (!j->tb) return;
    const sl_step_stats *ss = &p->stats;
    sl_status st = sl_tb_writer_scalar(j->tb, p->step, 0, "lm loss", ss->loss);
    if (st == SL_OK && p->evaluated)
        st = sl_tb_writer_scalar(j->tb, p->step, 0, "lm loss validation", p->val_loss);
    if (st == SL_OK) st = sl_tb_writer_scalar(j->tb, p->step, 0, "learning-rate", ss->lr);
    if (st == SL_OK) st = sl_tb_writer_scalar(j->tb, p->step, 0, "grad-norm", ss->grad_norm);
    if (st == SL_OK && j->o.model.fp16)
        st = sl_tb_writer_scalar(j->tb, p->step, 0, "loss-scale", ss->loss_scale);
    if (st == SL_OK) st = sl_tb_writer_scalar(j->tb, p->step, 0, "tokens-per-sec", (float)p->tokens_per_s);
    if (st == SL_OK) st = sl_tb_writer_flush(j->tb);
    if (st != SL_OK) { /* metrics on the side never stop training */
        if (j->err) fprintf(j->err, "suanli train: tensorboard: %s; no more events\n", sl_errmsg());
        sl_tb_writer_close(j->tb);
        j->tb = NULL;
    }
}

static void report_step(sl_train_job *j, const sl_train_progress *p, double t_steps) {
    const sl_step_stats *ss = &p->stats;
    int64_t step = p->step - 1, iters = j->o.train_iters;
    if (j->out && (p->step % j->o.log.interval == 0 || p->evaluated || step == 0)) {
        char eta[32];
        fmt_eta(t_steps / (double)p->step * (double)(iters - p->step), eta, sizeof eta);
        fprintf(
            j->out,
            "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.1f ms/step | %.0f tokens/s | ETA %s",
            (long long)p->step, (long long)iters, ss->loss, ss->lr, ss->grad_norm, ss->seconds * 1e3,
            p->tokens_per_s, eta);
        if (j->dp) fprintf(j->out, " | comm wait %.1f ms", ss->comm_wait_sec * 1e3);
        if (j->tp && j->m->tp > 1) fprintf(j->out, " | tp comm %.1f ms", j->tp_sec * 1e3);
        if (j->tp && j->m->ep > 1) fprintf(j->out, " | a2a %.1f ms", j->ep_sec * 1e3);
        if (j->tr.pipe) fprintf(j->out, " | pipeline wait %.1f ms", ss->pipe_wait_sec * 1e3);
        if (j->o.model.fp16)
            fprintf(j->out, " | loss scale %g%s | skipped %lld", ss->loss_scale,
                    ss->skipped ? " (overflow: skipped)" : "", (long long)ss->skipped_total);
        if (p->evaluated) fprintf(j->out, " | val loss %.4f", p->val_loss);
        fprintf(j->out, "\n");
        fflush(j->out);
    }
    if (j->metrics) {
        char gn[32] = "null"; /* an overflow step's norm is inf/nan: not JSON */
        if (isfinite(ss->grad_norm)) snprintf(gn, sizeof gn, "%.6f", ss->grad_norm);
        fprintf(j->metrics,
                "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.6e, \"grad_norm\": %s, \"ms_per_step\": %.3f, "
                "\"tokens_per_s\": %.1f",
                (long long)p->step, ss->loss, ss->lr, gn, ss->seconds * 1e3, p->tokens_per_s);
        if (j->o.model.fp16)
            fprintf(j->metrics, ", \"loss_scale\": %.17g, \"skipped\": %d, \"skipped_total\": %lld",
                    ss->loss_scale, ss->skipped, (long long)ss->skipped_total);
        if (p->evaluated) fprintf(j->metrics, ", \"val_loss\": %.9g", p->val_loss);
        if (j->dp) fprintf(j->metrics, ", \"comm_wait_ms\": %.3f", ss->comm_wait_sec * 1e3);
        if (j->tp && j->m->tp > 1)
            fprintf(j->metrics, ", \"tp_comm_ms\": %.3f, \"tp_comm_mib\": %.4f, \"tp_comm_theory_mib\": %.4f",
                    j->tp_sec * 1e3, j->tp_bytes / 1048576.0,
                    sl_tp_comm_theory(j->m, j->B, j->T, j->accum) / 1048576.0);
        if (j->dp) { /* Note [DP communication volume]; no theory for ZeRO-3 */
            double th = sl_dp_comm_theory(j->dp);
            fprintf(j->metrics, ", \"dp_comm_mib\": %.6f", ss->dp_comm_bytes / 1048576.0);
            if (isfinite(th)) fprintf(j->metrics, ", \"dp_comm_theory_mib\": %.6f", th / 1048576.0);
        }
        if (j->tr.pipe)
            fprintf(j->metrics,
                    ", \"pipe_wait_ms\": %.3f, \"pp_comm_mib\": %.6f, \"pp_comm_theory_mib\": %.6f",
                    ss->pipe_wait_sec * 1e3, ss->pp_comm_bytes / 1048576.0,
                    sl_pipeline_comm_theory(j->tr.pipe) / 1048576.0);
        sl_train_moe_metrics(j, j->metrics);
        fprintf(j->metrics, "}\n");
        fflush(j->metrics);
    }
    tb_sink_step(j, p);
}

/* Note [SIGUSR1: checkpoint and exit for requeue]
 * Slurm's --signal=B:USR1@SEC (suanli submit; Note [Requeue on the time limit] in src/cli/cmd_submit.c)
 * warns a job before its time limit. The handler only sets a flag; after each step the ranks agree on it
 * (an all-reduce MAX of one int, so a rank that got the signal a step later still stops at the same step),
 * save and commit a checkpoint of that step (when --save-interval configured a writer), and return with
 * result->requeue = 1 without the final save or sample; `suanli train` then exits with SL_EXIT_REQUEUE. */
static volatile sig_atomic_t g_usr1;
static void on_usr1(int s) {
    (void)s;
    g_usr1 = 1;
}

static sl_status agree_usr1(const sl_train_job *j, int *stop) {
    int32_t flag = g_usr1 != 0, agg = flag;
    if (j->world && sl_comm_all_reduce(j->world, &flag, &agg, 1, SL_COMM_I32, SL_COMM_MAX) != SL_OK)
        return sl_train_fail(SL_ERR_PEER, "rank %d: %s", j->mesh.rank, sl_errmsg());
    *stop = agg != 0;
    return SL_OK;
}

/* the checkpoint of step `done` before a requeue exit */
static sl_status usr1_checkpoint(sl_train_job *j, int64_t done, const sl_train_callbacks *cb) {
    if (!j->ckw) {
        if (j->out)
            fprintf(j->out, "SIGUSR1 after step %lld: no --save-interval, so no checkpoint\n",
                    (long long)done);
        return SL_OK;
    }
    if (j->pending_step >= 0 && j->pending_step != done) SL_TRY(ckpt_poll(j, 1, cb));
    if (j->pending_step != done) SL_TRY(ckpt_begin(j, done));
    SL_TRY(ckpt_poll(j, 1, cb));
    /* every rank waits for rank 0's commit: a launcher stops the others once one rank exited (75 too) */
    int32_t one = 1, all = 1;
    if (j->world && sl_comm_all_reduce(j->world, &one, &all, 1, SL_COMM_I32, SL_COMM_MAX) != SL_OK)
        return sl_train_fail(SL_ERR_PEER, "rank %d: %s", j->mesh.rank, sl_errmsg());
    if (j->out)
        fprintf(j->out, "SIGUSR1 after step %lld: checkpoint step-%07lld committed; exiting for requeue\n",
                (long long)done, (long long)done);
    return SL_OK;
}

/* Rank 0 decides whether the time limit passed, so that all ranks stop at the same step. */
static sl_status check_time(const sl_train_job *j, double t_start, int *timed_out) {
    double mins = j->o.exit_duration_mins;
    *timed_out = mins > 0 && sl_time_sec() - t_start > mins * 60.0;
    if (j->world && mins > 0) {
        int32_t flag = *timed_out;
        if (sl_comm_broadcast(j->world, &flag, &flag, 1, SL_COMM_I32, 0) != SL_OK)
            return sl_train_fail(SL_ERR_PEER, "rank %d: %s", j->mesh.rank, sl_errmsg());
        *timed_out = flag;
    }
    return SL_OK;
}

/* Note [No steps to run]
 * --train-iters 0, or a resume at or past --train-iters, runs no step. The run then reports the val loss
 * of the weights it started from (fresh, --init-from, --load weights or the checkpoint), as Megatron-LM
 * still validates at the end: printed in the summary, recorded in metrics.jsonl as {"step": S, "val_loss":
 * X} with S the start step (no "loss": nothing was trained; suanli plot takes such a line), as TensorBoard's
 * "lm loss validation" at S, and in the saved config.json's val_loss. "final val loss nan" was printed. */
static sl_status eval_start_weights(sl_train_job *j, batch_src *vsrc, sl_train_result *r) {
    float vl;
    sl_status st = sl_trainer_eval(&j->tr, batch_fn, vsrc, (int)j->o.eval.iters, &vl);
    if (st != SL_OK) return sl_train_fail(st, "eval: %s", sl_errmsg());
    double es, eb;
    sl_tp_take_stats(j->tp, &es, &eb);
    sl_ep_take_stats(j->tp, &es, &eb);
    j->no_steps = 1;
    r->val_loss = vl;
    if (j->metrics) {
        fprintf(j->metrics, "{\"step\": %lld, \"val_loss\": %.9g}\n", (long long)j->start_step, vl);
        fflush(j->metrics);
    }
    if (j->tb &&
        (sl_tb_writer_scalar(j->tb, j->start_step, 0, "lm loss validation", vl) != SL_OK ||
         sl_tb_writer_flush(j->tb) != SL_OK) &&
        j->err)
        fprintf(j->err, "suanli train: tensorboard: %s\n", sl_errmsg());
    return SL_OK;
}

static sl_status step_loop(sl_train_job *j, const sl_train_callbacks *cb, sl_train_result *r) {
    const sl_train_opts *o = &j->o;
    batch_src tsrc = {j->train, j->B, j->T, (uint64_t)o->seed},
              vsrc = {j->val, j->B, j->T, (uint64_t)o->seed ^ 0x9e3779b97f4a7c15ull};
    double t_start = sl_time_sec(), t_steps = 0;
    sl_train_progress p = {.train_iters = o->train_iters, .val_loss = NAN};
    int64_t step = j->start_step;
    for (; step < o->train_iters; step++) {
        sl_step_stats *ss = &p.stats;
        sl_status st = sl_trainer_step(&j->tr, step, batch_fn, &tsrc, ss);
        if (st != SL_OK) return sl_train_fail(st, "step %lld: %s", (long long)step, sl_errmsg());
        SL_TRY(sl_train_moe_after_step(j)); /* before eval runs the forward again */
        if (!isfinite(ss->loss))
            return sl_train_fail(SL_ERR_INTERNAL, "step %lld: loss is %f; stopping", (long long)step,
                                 ss->loss);
        r->loss = ss->loss;
        sl_tp_take_stats(j->tp, &j->tp_sec, &j->tp_bytes); /* before eval adds its own */
        sl_ep_take_stats(j->tp, &j->ep_sec, &j->ep_bytes);
        t_steps += ss->seconds;
        p.step = step + 1;
        p.tokens_per_s = (double)j->B * j->T * j->accum * j->mesh.dp / ss->seconds;
        p.evaluated =
            (o->eval.interval > 0 && (step + 1) % o->eval.interval == 0) || step + 1 == o->train_iters;
        int timed_out;
        SL_TRY(check_time(j, t_start, &timed_out));
        if (timed_out) p.evaluated = 1;
        if (p.evaluated) {
            st = sl_trainer_eval(&j->tr, batch_fn, &vsrc, (int)o->eval.iters, &p.val_loss);
            if (st != SL_OK) return sl_train_fail(st, "eval: %s", sl_errmsg());
            double es, eb; /* eval's TP collectives are not the next step's */
            sl_tp_take_stats(j->tp, &es, &eb);
            sl_ep_take_stats(j->tp, &es, &eb);
            r->val_loss = p.val_loss;
        }
        report_step(j, &p, t_steps);
        SL_TRY(ckpt_after_step(j, step + 1, cb));
        fault_hooks(j, step + 1);
        int stop = cb && cb->on_step && cb->on_step(cb->user, &p), usr1 = 0;
        SL_TRY(agree_usr1(j, &usr1));
        if (usr1) {
            SL_TRY(usr1_checkpoint(j, step + 1, cb));
            r->requeue = 1;
            step++;
            break;
        }
        if (timed_out && j->out)
            fprintf(j->out, "stopping after %.1f minutes (--exit-duration-in-mins)\n",
                    (sl_time_sec() - t_start) / 60);
        if (timed_out || stop) {
            step++;
            break;
        }
    }
    r->steps = step;
    r->seconds = sl_time_sec() - t_start;
    if (step == j->start_step) SL_TRY(eval_start_weights(j, &vsrc, r));
    return SL_OK;
}

/* model.safetensors + config.json (GPT-2: suanli's layout; --init-from models, HF GPT-2 too: transformers')
 * and tokenizer.json (the HF model's own when it has one, else the data's). */
static sl_status save_final(const sl_train_job *j, sl_model *m, const sl_train_result *r) {
    const sl_train_opts *o = &j->o;
    const char *save = o->ckpt.save_dir, *init_from = o->model.init_from;
    char extra[512], tp[4096], hft[4096];
    snprintf(extra, sizeof extra,
             "{\"steps\": %lld, \"val_loss\": %.6f, \"seq_length\": %lld, \"seed\": %lld}",
             (long long)r->steps, isfinite(r->val_loss) ? r->val_loss : -1.0, (long long)o->data.seq_length,
             (long long)o->seed);
    const char *tname = sl_tokenizer_file_name(j->tok); /* the data's file name: .json or .model */
    snprintf(tp, sizeof tp, "%s/%s", save, tname);
    sl_status sst = m->arch == SL_ARCH_GPT2 && !init_from ? sl_model_save(m, save, extra)
                                                          : sl_hf_save(m, save, SL_F32, &j->hf_info);
    const char *tsrc = j->tokpath; /* an HF model keeps its own tokenizer.json */
    snprintf(hft, sizeof hft, "%s/tokenizer.json", init_from ? init_from : "");
    FILE *hf_tok = init_from ? fopen(hft, "r") : NULL;
    if (hf_tok) {
        fclose(hf_tok);
        tsrc = hft;
        snprintf(tp, sizeof tp, "%s/tokenizer.json", save);
    }
    if (sst == SL_OK) sst = copy_file(tsrc, tp);
    if (sst != SL_OK) return sl_train_fail(sst, "save: %s", sl_errmsg());
    if (j->out)
        fprintf(j->out, "saved %s/model.safetensors, config.json, tokenizer.json, metrics.jsonl\n", save);
    return SL_OK;
}

static sl_status finish(sl_train_job *j, const sl_train_callbacks *cb, const sl_train_result *r,
                        double t_start) {
    const sl_train_opts *o = &j->o;
    if (j->ckw) SL_TRY(ckpt_poll(j, 1, cb));
    if (j->ckw) SL_TRY(commit_poll(j, 1, cb));
    sl_status st;
    if (j->dp &&
        (st = sl_dp_gather_params(j->dp)) != SL_OK) /* ZeRO-3: whole weights for saving and sampling */
        return sl_train_fail(st, "rank %d: gathering parameters: %s", j->mesh.rank, sl_errmsg());
    if (j->out && j->no_steps) { /* Note [No steps to run] */
        char why[128];
        if (j->start_step > 0)
            snprintf(why, sizeof why, "resumed at step %lld, --train-iters %lld", (long long)j->start_step,
                     (long long)o->train_iters);
        else
            snprintf(why, sizeof why, "--train-iters %lld", (long long)o->train_iters);
        fprintf(j->out, "no steps to train (%s); val loss %.4f of the %s weights (%lld val micro-batches)\n",
                why, r->val_loss,
                j->resume || j->init_from_weights ? "loaded"
                : o->model.init_from              ? "--init-from"
                                                  : "initial",
                (long long)o->eval.iters);
    } else if (j->out) {
        fprintf(j->out, "trained %lld steps in %.1f s; final val loss %.4f\n", (long long)r->steps,
                sl_time_sec() - t_start, r->val_loss);
    }
    sl_model *m = j->m, *whole = NULL;
    if (m->ep > 1) { /* every EP rank's experts (collective over the EP group), then TP shards and stages */
        sl_model *stage = NULL;
        sl_model_split sp = {m->tp > 1 ? m->tp : 1,
                             m->tp_rank,
                             m->pp > 1 ? m->pp : 1,
                             m->pp_rank,
                             m->vpp,
                             m->pp_first_layers,
                             m->pp_last_layers,
                             1,
                             0,
                             m->etp};
        st = j->dp ? sl_dp_sync_params(j->dp) : SL_OK;
        if (st == SL_OK) st = sl_model_new_split(m, j->be, &sp, &stage);
        if (st == SL_OK) st = sl_ep_gather_whole(&j->mesh, m, stage);
        if (st == SL_OK && (m->tp > 1 || m->pp > 1)) {
            if (j->mesh.pp_rank == 0)
                st = sl_model_new_split(m, j->be, &(sl_model_split){1, 0, 1, 0, 1, 0, 0, 1, 0, 0}, &whole);
            if (st == SL_OK) st = sl_par_gather_whole(j->tp, &j->mesh, stage, whole);
        } else if (st == SL_OK) {
            whole = stage; /* the whole model already */
        }
        if (stage != whole) sl_model_free(stage);
        if (st != SL_OK) {
            sl_model_free(whole);
            return sl_train_fail(st, "rank %d: gathering the experts: %s", j->mesh.rank, sl_errmsg());
        }
        if (whole) {
            whole->moe = j->m->moe;
            m = whole;
        }
    } else if (j->tp || j->tr.pipe) {
        /* the TP shards and pipeline stages gathered into a whole model on the first stage, for saving and
         * sampling (collective: every rank, whatever it then does with it; only rank 0 saves and samples) */
        if (j->mesh.pp_rank != 0)
            st = SL_OK;
        else if (j->m->arch == SL_ARCH_GPT2)
            st = sl_gpt2_new_on(&j->cfg, j->be, &whole);
        else /* an --init-from Llama-family model */
            st = sl_llama_new_on(&j->m->lcfg, SL_F32, j->be, &whole);
        if (st == SL_OK) st = sl_par_gather_whole(j->tp, &j->mesh, j->m, whole);
        if (st != SL_OK) {
            sl_model_free(whole);
            return sl_train_fail(st, "rank %d: gathering the model: %s", j->mesh.rank, sl_errmsg());
        }
        if (whole) m = whole;
    }
    st = SL_OK;
    if (o->ckpt.save_dir && j->rank0) st = save_final(j, m, r);
    if (st == SL_OK && o->sample.tokens > 0) {
        if (j->out) fprintf(j->out, "---- sample ----\n");
        double dt;
        int n = (int)o->sample.tokens;
        st = sl_train_sample_print(m, j->tok, o->sample.prompt, n, (float)o->sample.temperature,
                                   (int)o->sample.top_k, (uint64_t)o->seed, j->out, &dt);
        if (st == SL_OK && j->err)
            fprintf(j->err, "[generated %d tokens in %.2f s, %.1f tokens/s]\n", n, dt, n / (dt > 0 ? dt : 1));
    }
    sl_model_free(whole);
    return st;
}

sl_status sl_train_run(const sl_train_opts *opts, const sl_train_callbacks *cb, sl_train_result *result) {
    sl_train_result r = {.resumed_step = -1, .loss = NAN, .val_loss = NAN};
    sl_train_job *j = calloc(1, sizeof *j);
    if (!j) return sl_fail(SL_ERR_NOMEM, "train: out of memory");
    double t_start = sl_time_sec();
    struct sigaction sa = {0}, old_usr1;
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    g_usr1 = 0;
    sigaction(SIGUSR1, &sa, &old_usr1); /* Note [SIGUSR1: checkpoint and exit for requeue] */
    sl_status st = sl_train_job_setup(j, opts);
    if (st == SL_OK) {
        if (j->resume) r.resumed_step = j->start_step;
        print_banner(j);
        st = print_stages(j);
        t_start = sl_time_sec();
        if (st == SL_OK) st = step_loop(j, cb, &r);
    }
    sigaction(SIGUSR1, &old_usr1, NULL);
    if (st == SL_OK && !r.requeue) st = finish(j, cb, &r, t_start);
    sl_tb_writer_close(j->tb);
    j->tb = NULL;
    sl_train_job_release(j, st != SL_OK);
    free(j);
    if (result) *result = r;
    return st;
}
