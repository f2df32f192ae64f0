/* A training job's checks and setup: communicator and mesh, the options every rank must share, data,
 * the model (fresh, --init-from, --load weights or a checkpoint), the trainer with DP/ZeRO, the resumed
 * state and the checkpoint writer; the output directory last (Note [Bad input before any write]). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "suanli/metrics.h"
#include "suanli/model_io.h"
#include "train/train_internal.h"
#include "train/lanes.h"

/* Note [Bad input before any write]
 * Every check of the options and of the files they name runs before the first byte is written: the save
 * directory and metrics.jsonl are created at the very end of setup, after the checkpoint to resume from
 * was loaded. A rejected run (SL_ERR_INVALID, the CLI's exit status 2) therefore leaves nothing behind,
 * and a caller can tell bad input from a runtime failure by the status alone. */

sl_status sl_train_bad(const char *fmt, ...) {
    char buf[2048]; /* formatted here first: the arguments may point into sl_errmsg()'s buffer */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return sl_fail(SL_ERR_INVALID, "%s", buf);
}

sl_status sl_train_fail(sl_status st, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (st == SL_OK || st == SL_ERR_INVALID) st = SL_ERR_INTERNAL;
    return sl_fail(st, "%s", buf);
}

void sl_train_opts_default(sl_train_opts *o) {
    *o = (sl_train_opts){
        .train_iters = 1000,
        .seed = 1234,
        .data = {.seq_length = 128, .micro_batch_size = 8},
        .optim = {.lr = 1e-3,
                  .min_lr = -1,
                  .weight_decay = 0.1,
                  .clip_grad = 1.0,
                  .beta1 = 0.9,
                  .beta2 = 0.95,
                  .eps = 1e-8,
                  .initial_loss_scale = 4294967296.0,
                  .min_loss_scale = 1.0,
                  .loss_scale_window = 1000,
                  .hysteresis = 2},
        .eval = {.interval = 100, .iters = 20},
        .ckpt = {.keep = 2},
        .parallel = {.tp = 1, .pp = 1, .ep = 1, .etp = 1, .bucket_elems = 1 << 20},
        .log = {.interval = 1, .out = stdout, .err = stderr},
        .sample = {.prompt = "\n", .temperature = 0.8},
        .moe = {.capacity_factor = NAN},
    };
}

/* FNV-1a over every option that shapes the run (not the FILE or communicator pointers) */
static void hash_bytes(uint64_t *h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) *h = (*h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
}
static void hash_str(uint64_t *h, const char *s) {
    if (s)
        hash_bytes(h, s, strlen(s) + 1);
    else
        hash_bytes(h, "\xff", 1);
}
static uint64_t opts_hash(const sl_train_opts *o) {
    uint64_t h = 1469598103934665603ull;
    int64_t iv[] = {o->train_iters,
                    o->seed,
                    o->threads,
                    o->model.num_layers,
                    o->model.hidden_size,
                    o->model.num_heads,
                    o->model.vocab_size,
                    o->model.max_positions,
                    o->model.bf16,
                    o->model.fp16,
                    o->optim.loss_scale_window,
                    o->optim.hysteresis,
                    o->data.seq_length,
                    o->data.micro_batch_size,
                    o->data.global_batch_size,
                    o->optim.warmup_iters,
                    o->optim.decay_iters,
                    o->eval.interval,
                    o->eval.iters,
                    o->ckpt.save_interval,
                    o->ckpt.keep,
                    o->ckpt.replicas,
                    o->ckpt.shared,
                    o->ckpt.local_keep,
                    o->parallel.tp,
                    o->parallel.pp,
                    o->parallel.ep,
                    o->parallel.sequence_parallel,
                    o->parallel.layers_per_virtual_stage,
                    o->parallel.first_stage_layers,
                    o->parallel.last_stage_layers,
                    o->parallel.zero_bubble,
                    o->parallel.zero_stage,
                    o->parallel.bucket_elems,
                    o->log.interval,
                    o->sample.tokens,
                    o->sample.top_k,
                    o->moe.num_experts,
                    o->moe.topk};
    double dv[] = {o->exit_duration_mins,   o->optim.lr,
                   o->optim.min_lr,         o->optim.weight_decay,
                   o->optim.clip_grad,      o->optim.beta1,
                   o->optim.beta2,          o->optim.eps,
                   o->sample.temperature,   o->moe.capacity_factor,
                   o->moe.aux_loss_coeff,   o->moe.z_loss_coeff,
                   o->moe.bias_update_rate, o->optim.initial_loss_scale,
                   o->optim.min_loss_scale, o->model.attention_dropout,
                   o->model.hidden_dropout};
    hash_str(&h, o->moe.router);
    hash_bytes(&h, iv, sizeof iv);
    hash_bytes(&h, dv, sizeof dv);
    const char *sv[] = {o->model.init_from, o->data.path,    o->ckpt.save_dir,  o->ckpt.load_dir,
                        o->sample.prompt,   o->model.device, o->ckpt.local_dir, o->ckpt.ec};
    for (size_t i = 0; i < sizeof sv / sizeof sv[0]; i++) hash_str(&h, sv[i]);
    return h;
}

/* The world communicator, the mesh, and the check that every rank runs the same options. */
static sl_status setup_comm(sl_train_job *j) {
    sl_train_opts *o = &j->o;
    j->world = o->parallel.comm;
    if (!j->world) {
        sl_comm_env env = {0};
        if (sl_comm_env_detect(&env) != SL_OK) return sl_train_bad("%s", sl_errmsg());
        if (env.size > 1) {
            sl_status st = sl_comm_init_env(&j->world, NULL);
            if (st != SL_OK) return sl_train_fail(st, "rank %d: %s", env.rank, sl_errmsg());
            j->own_world = 1;
        }
    }
    sl_mesh_dims dims = {(int)o->parallel.tp, (int)o->parallel.pp, (int)o->parallel.ep};
    if (sl_mesh_init(&j->mesh, j->world, dims) != SL_OK) return sl_train_bad("%s", sl_errmsg());
    j->mesh_ok = 1;
    const sl_mesh *mesh = &j->mesh;
    if (o->parallel.sequence_parallel && mesh->tp < 2)
        return sl_train_bad("--sequence-parallel needs --tensor-model-parallel-size > 1 (got %d)", mesh->tp);
    if (o->parallel.zero_bubble && mesh->pp < 2)
        return sl_train_bad("--enable-zero-bubble needs --pipeline-model-parallel-size > 1 (got %d)",
                            mesh->pp);
    if ((o->parallel.first_stage_layers || o->parallel.last_stage_layers) && mesh->pp < 2)
        return sl_train_bad("--decoder-%s-pipeline-num-layers: needs --pipeline-model-parallel-size > 1",
                            o->parallel.first_stage_layers ? "first" : "last");
    if (o->parallel.layers_per_virtual_stage > 0 && mesh->pp < 2)
        return sl_train_bad(
            "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1");
    if (mesh->tp > 1 || mesh->pp > 1) {
        /* Tensor and pipeline parallelism (src/parallel/tp.c, src/train/pipeline.c): GPT-2 models and
         * --init-from Llama-family models, split in make_model; host-visible memory */
        const char *flag = mesh->tp > 1 ? "--tensor-model-parallel-size" : "--pipeline-model-parallel-size";
        int n = mesh->tp > 1 ? mesh->tp : mesh->pp;
        if (o->model.init_from) { /* the Llama family (the MoE models too: Note [MoE under TP]) and HF GPT-2;
                                     not Baichuan's W_pack */
            sl_llama_config hc;
            if (sl_hf_load_config(o->model.init_from, &hc, NULL) == SL_OK && hc.arch == SL_ARCH_BAICHUAN)
                return sl_train_bad("%s %d: not implemented for --init-from %s models (the packed W_pack "
                                    "projection)",
                                    flag, n, sl_arch_name(hc.arch));
        }
        if (o->parallel.sequence_parallel && o->data.seq_length % mesh->tp)
            return sl_train_bad("--sequence-parallel: --seq-length %lld is not divisible by "
                                "--tensor-model-parallel-size %d",
                                (long long)o->data.seq_length, mesh->tp);
        int64_t lv = o->parallel.layers_per_virtual_stage;
        if ((o->parallel.first_stage_layers || o->parallel.last_stage_layers) && lv > 0)
            return sl_train_bad(
                "--decoder-%s-pipeline-num-layers with --num-layers-per-virtual-pipeline-stage "
                "is not supported (uneven stages without interleaving)",
                o->parallel.first_stage_layers ? "first" : "last");
        if (o->parallel.zero_bubble && lv > 0)
            return sl_train_bad("--enable-zero-bubble with --num-layers-per-virtual-pipeline-stage is not "
                                "supported (ZB-H1 is a 1F1B schedule; use one or the other)");
        if (mesh->pp > 1 && o->parallel.zero_stage == 3)
            return sl_train_bad(
                "--zero-stage 3 with --pipeline-model-parallel-size %d is not supported (use 0, "
                "1 or 2)",
                mesh->pp);
    }
    SL_TRY(sl_train_moe_check(j)); /* expert counts vs --ep first: their message names the flag */
    j->rank0 = mesh->rank == 0;
    if (j->world) {
        /* every rank must run the same configuration: compare a hash of the options */
        uint64_t h = opts_hash(o), hs[1024];
        if (mesh->world > 1024) return sl_train_bad("world size %d exceeds 1024", mesh->world);
        sl_status st = sl_comm_all_gather(j->world, &h, hs, 1, SL_COMM_I64);
        if (st != SL_OK) return sl_train_fail(st, "rank %d: config exchange: %s", mesh->rank, sl_errmsg());
        for (int r = 0; r < mesh->world; r++)
            if (hs[r] != hs[0])
                return sl_train_bad(
                    "rank %d was started with a different configuration than rank 0 (argument hash differs)",
                    r);
    }
    if (!j->rank0) o->sample.tokens = 0;
    return SL_OK;
}

/* Options that need no file: batch layout and the LR schedule; their defaults that depend on the mesh. */
/* --save-interval without --save; --ckpt-local-dir, --ckpt-replicas, --ckpt-ec and the job's hosts
 * (SUANLI_HOSTS, set by suanli run). */
static sl_status check_pool(sl_train_job *j) {
    const sl_train_ckpt_opts *c = &j->o.ckpt;
    /* the checkpoint writer (and with it the in-memory copy, SUANLI_MEM_CKPT_DIR, and the pool's commit)
     * exists only under --save: without it --save-interval saved nothing and the run exited 0 */
    if (c->save_interval > 0 && !c->save_dir)
        return sl_train_bad("--save-interval %lld needs --save (the run directory checkpoints are committed "
                            "under%s); without it nothing would be saved",
                            (long long)c->save_interval, c->local_dir ? ", also with --ckpt-local-dir" : "");
    if (!c->local_dir) {
        if (c->replicas > 0) return sl_train_bad("--ckpt-replicas needs --ckpt-local-dir");
        if (c->shared) return sl_train_bad("--ckpt-shared needs --ckpt-local-dir");
        if (c->local_keep > 0) return sl_train_bad("--ckpt-local-keep needs --ckpt-local-dir");
        if (c->ec) return sl_train_bad("--ckpt-ec needs --ckpt-local-dir");
        return SL_OK;
    }
    struct stat sb; /* a file there failed at the first checkpoint, after training (exit 1, --save written) */
    if (stat(c->local_dir, &sb) == 0 ? !S_ISDIR(sb.st_mode) : errno == ENOTDIR)
        return sl_train_bad("--ckpt-local-dir: %s: not a directory", c->local_dir);
    int world = j->mesh.world, hosts = 1;
    const char *eh = getenv("SUANLI_HOSTS");
    if (eh && *eh) {
        char *end;
        long v = strtol(eh, &end, 10);
        if (*end || v < 1 || v > world)
            return sl_train_bad("SUANLI_HOSTS=%s: expected a host count in 1..%d (the job's ranks)", eh,
                                world);
        hosts = (int)v;
    }
    sl_ckpt_pool *p = &j->pool;
    *p = (sl_ckpt_pool){.local_root = c->local_dir,
                        .hosts = hosts,
                        .host = sl_ckpt_pool_host_of(j->mesh.rank, world, hosts),
                        .replicas = c->replicas > 0 ? (int)c->replicas : 1};
    if (c->ec) {
        if (c->replicas > 0)
            return sl_train_bad("--ckpt-ec: give either --ckpt-replicas or --ckpt-ec, not both");
        if (sl_ckpt_pool_parse_ec(c->ec, &p->ec_k, &p->ec_m) != SL_OK) return sl_train_bad("%s", sl_errmsg());
        p->replicas = 0;
    }
    if (sl_ckpt_pool_check(p) != SL_OK) return sl_train_bad("%s", sl_errmsg());
    j->pooled = 1;
    return SL_OK;
}

/* Note [--save is a run directory]
 * --save names a run directory: checkpoints go under it as step-NNNNNNN, the final weights and
 * metrics.jsonl beside them (Megatron-LM's --save: iter_NNNNNNN under it). A step directory (one holding
 * manifest.json) as --save, as in `--load run/step-0000010 --save run/step-0000010`, would nest new step
 * directories inside that checkpoint and write the final weights into it; it is refused, naming the run
 * directory to give instead (resuming from that one step stays `--load run/step-0000010 --save run`). */
static sl_status check_save_not_step(const char *save) {
    if (!save) return SL_OK;
    char mp[4200];
    snprintf(mp, sizeof mp, "%s/manifest.json", save);
    if (access(mp, F_OK) != 0) return SL_OK;
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", save);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/') parent[--n] = 0; /* "run/step-0000010/" */
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == parent)
        parent[1] = 0; /* "/step-0000010": the root */
    else
        *slash = 0;
    return sl_train_bad("--save %s is a checkpoint step directory (it holds manifest.json): new checkpoints "
                        "would nest inside it; give the run directory that holds it (--save %s)",
                        save, parent);
}

/* A fresh run (no --load) writes its checkpoints, `latest` and model.safetensors into --save: an earlier
 * run's there would be overwritten step by step, and its newer step dirs would outlive the new run's
 * (pruning keeps the newest by step; a later --load resumes the newest). So a fresh run refuses a --save
 * that holds an earlier run's checkpoints or final model (found by the command-line audit of 2026-12-06:
 * the new run's just-committed checkpoint was pruned and `latest` named a deleted directory). */
static sl_status check_save_fresh(const sl_train_opts *o) {
    const char *save = o->ckpt.save_dir;
    if (!save || o->ckpt.load_dir) return SL_OK;
    struct stat isb, ssb; /* --save is the --init-from dir: refused later, naming that (make_model) */
    if (o->model.init_from && stat(o->model.init_from, &isb) == 0 && stat(save, &ssb) == 0 &&
        isb.st_dev == ssb.st_dev && isb.st_ino == ssb.st_ino)
        return SL_OK;
    char mp[4200];
    snprintf(mp, sizeof mp, "%s/model.safetensors", save);
    int64_t newest = sl_ckpt_is_checkpoint(save) ? sl_ckpt_newest_step(save) : -1;
    if (newest < 0 && access(mp, F_OK) != 0) return SL_OK;
    char what[64];
    if (newest >= 0)
        snprintf(what, sizeof what, "checkpoints (newest step-%07lld)", (long long)newest);
    else
        snprintf(what, sizeof what, "model.safetensors");
    return sl_train_bad("--save %s already holds an earlier run's %s: pass --load %s to resume it, or choose "
                        "another --save",
                        save, what, save);
}

static sl_status check_opts(sl_train_job *j) {
    sl_train_opts *o = &j->o;
    sl_train_data_opts *d = &o->data;
    sl_train_optim_opts *op = &o->optim;
    int dp = j->mesh.dp;
    if (o->model.fp16 && o->model.bf16) return sl_train_bad("--fp16 and --bf16 exclude each other");
    if (!(o->model.attention_dropout >= 0 && o->model.attention_dropout < 1))
        return sl_train_bad("--attention-dropout %g is not in [0, 1)", o->model.attention_dropout);
    if (!(o->model.hidden_dropout >= 0 && o->model.hidden_dropout < 1))
        return sl_train_bad("--hidden-dropout %g is not in [0, 1)", o->model.hidden_dropout);
    if (o->model.fp16) { /* the loss scaler's own checks, messages naming the flag */
        sl_loss_scaler probe;
        if (sl_loss_scaler_init(
                &probe, &(sl_loss_scale_config){(float)op->initial_loss_scale, (float)op->min_loss_scale,
                                                (int)op->loss_scale_window, (int)op->hysteresis}) != SL_OK)
            return sl_train_bad("%s", sl_errmsg());
    }
    const char *rg = o->parallel.recompute_granularity;
    if (rg && strcmp(rg, "full"))
        return sl_train_bad("--recompute-granularity: expected full, got '%s'%s", rg,
                            strcmp(rg, "selective") ? ""
                                                    : " (selective is what always happens here: attention "
                                                      "never stores its T x T scores)");
    const char *rm = o->parallel.recompute_method;
    if (!rg && (rm || o->parallel.recompute_num_layers))
        return sl_train_bad("%s needs --recompute-granularity full",
                            rm ? "--recompute-method" : "--recompute-num-layers");
    if (rm && strcmp(rm, "uniform") && strcmp(rm, "block"))
        return sl_train_bad("--recompute-method: expected uniform or block, got '%s'", rm);
    if (!d->path) return sl_train_bad("--data-path is required");
    if (d->global_batch_size == 0) d->global_batch_size = d->micro_batch_size * dp;
    if (d->global_batch_size % (d->micro_batch_size * dp) != 0)
        return sl_train_bad(
            "--global-batch-size %lld is not a multiple of --micro-batch-size %lld x data-parallel size %d",
            (long long)d->global_batch_size, (long long)d->micro_batch_size, dp);
    if (op->min_lr < 0) op->min_lr = op->lr / 10;
    if (op->min_lr > op->lr) return sl_train_bad("--min-lr %g exceeds --lr %g", op->min_lr, op->lr);
    if (op->decay_iters == 0) op->decay_iters = o->train_iters;
    if (op->warmup_iters > op->decay_iters && op->decay_iters > 0)
        return sl_train_bad("--lr-warmup-iters %lld exceeds the decay length %lld",
                            (long long)op->warmup_iters, (long long)op->decay_iters);
    if (o->threads > 0) sl_threads_set((int)o->threads);
    SL_TRY(check_save_not_step(o->ckpt.save_dir));
    SL_TRY(check_save_fresh(o));
    return check_pool(j);
}

static sl_status open_data(sl_train_job *j) {
    const char *path = j->o.data.path;
    if (sl_dataset_open(path, "train", &j->train) != SL_OK) return sl_train_bad("%s", sl_errmsg());
    if (sl_dataset_open(path, "val", &j->val) != SL_OK) return sl_train_bad("%s", sl_errmsg());
    /* the data's tokenizer: tokenizer.json, or tokenizer.model for SentencePiece data */
    if (sl_tokenizer_load(path, &j->tok) != SL_OK) return sl_train_bad("%s", sl_errmsg());
    snprintf(j->tokpath, sizeof j->tokpath, "%s/%s", path, sl_tokenizer_file_name(j->tok));
    if (sl_dataset_vocab_size(j->val) != sl_dataset_vocab_size(j->train))
        return sl_train_bad("%s: train and val shards disagree on vocab size", path);
    return SL_OK;
}

/* Note [Evaluation is at most one pass over the val split]
 * An evaluation runs --eval-iters global batches of G x T tokens (eval step i draws val batch i; Note
 * [Evaluation over the global batch] in trainer.c). More than one pass' worth of the val split's tokens,
 * ceil((N - 1) / (G x T)) batches, re-reads windows it already scored: `--eval-iters 1000000` over a
 * 2000-token split ran 1e6 forwards at every evaluation. The count is capped at one pass, and the banner
 * says so in one line (eval_iters_asked). */
static void cap_eval_iters(sl_train_job *j) {
    sl_train_opts *o = &j->o;
    int64_t g = o->data.global_batch_size > 0 ? o->data.global_batch_size : o->data.micro_batch_size;
    int64_t n = sl_dataset_num_tokens(j->val), bt = g * o->data.seq_length;
    int64_t pass = n > 1 && bt > 0 ? (n - 1 + bt - 1) / bt : 1;
    if (o->eval.iters <= pass) return;
    j->eval_iters_asked = o->eval.iters;
    o->eval.iters = pass;
}

static int short_split(const sl_train_job *j) {
    int64_t need = j->o.data.seq_length + 1;
    return sl_dataset_num_tokens(j->train) < need || sl_dataset_num_tokens(j->val) < need;
}

/* --init-from: the architecture and weights come from a Hugging Face model dir. */
static sl_status load_init_from(sl_train_job *j, int data_vocab) {
    const sl_train_opts *o = &j->o;
    const char *dir = o->model.init_from;
    /* with --load: resume a checkpoint of this model (the architecture still comes from --init-from) */
    const char *names[] = {"num-layers", "num-attention-heads", "hidden-size", "vocab-size",
                           "max-position-embeddings"};
    int64_t given[] = {o->model.num_layers, o->model.num_heads, o->model.hidden_size, o->model.vocab_size,
                       o->model.max_positions};
    for (int i = 0; i < 5; i++)
        if (given[i])
            return sl_train_bad(
                "--%s conflicts with --init-from (the architecture comes from %s/config.json)", names[i],
                dir);
    /* the model dir's config first (its errors name config.json), then the data must be tokenized with the
     * model's own tokenizer (issue 19), before the weights are read */
    sl_llama_config probe;
    if (sl_hf_load_config(dir, &probe, NULL) != SL_OK) return sl_train_bad("--init-from: %s", sl_errmsg());
    if (sl_tokenizer_files_match(o->data.path, dir) != SL_OK)
        return sl_train_bad(
            "--init-from: the data was not tokenized with the model's tokenizer (prepare it with "
            "`suanli data prepare --tokenizer-file %s/tokenizer.json`): %s",
            dir, sl_errmsg());
    if (sl_hf_load_on(dir, SL_F32, j->be, &j->m, &j->hf_info) != SL_OK)
        return sl_train_bad("--init-from: %s", sl_errmsg());
    sl_model *m = j->m;
    if (data_vocab > m->cfg.vocab_size)
        return sl_train_bad("the data's vocab size %d exceeds the model's vocab_size %d (%s)", data_vocab,
                            m->cfg.vocab_size, dir);
    /* a sequence longer than Mistral's sliding window trains through the windowed ATTENTION (CPU kernels;
     * the CUDA and OpenCL backends refuse windowed nodes when the graph is planned) */
    int lim = m->cfg.max_seq_len; /* cfg mirrors lcfg for the Llama family; HF GPT-2 has only cfg */
    if (o->data.seq_length > lim)
        return sl_train_bad("--seq-length %lld exceeds the model's %d positions",
                            (long long)o->data.seq_length, lim);
    if (short_split(j))
        return sl_train_bad("%s: a split has fewer than seq-length+1 = %lld tokens", o->data.path,
                            (long long)o->data.seq_length + 1);
    j->cfg = m->cfg;
    m->autocast_bf16 = o->model.bf16;
    return SL_OK;
}

/* Note [Pooled restore]
 * Collective (every rank calls it). The first rank of each host assembles the newest step that the
 * surviving hosts can rebuild (intact copies, or erasure-code decoding) into LOCAL/host-<h>/.restore/step-N:
 * with several ranks the first ranks do it together (sl_ckpt_pool_restore), each reading only its own
 * host's directory and receiving the other hosts' files over a communicator of the first ranks (Note [Pool
 * transfers over comm]); one process reads every host directory itself (sl_ckpt_pool_gather). The ranks agree
 * (all-reduce) that every host found the same step, and each rank then loads from its host's copy. A pool
 * with steps of which none can be rebuilt is an error naming what is missing (bad input: exit 2, not
 * restarted); an empty pool is a fresh start. A restore that failed because a host was lost or missed the
 * communicators' deadline (SL_ERR_PEER, Note [Peer failures in a pooled restore] in src/ckpt/pool.c) is a
 * runtime failure (exit 1, which `suanli run --max-restarts` and the Slurm script retry): a leader
 * contributes 2 for it to the MAX all-reduce below and 1 for any other failure, so every rank reports the
 * same class.
 */
static sl_status pool_restore(sl_train_job *j, char *dir, size_t cap, int *found) {
    const sl_ckpt_pool *p = &j->pool;
    int rank = j->mesh.rank, world = j->mesh.world;
    int leader = rank == 0 || sl_ckpt_pool_host_of(rank - 1, world, p->hosts) != p->host;
    char restore[3900], msg[1500] = "";
    snprintf(restore, sizeof restore, "%s/host-%d/.restore", p->local_root, p->host);
    int64_t got = -1, v[3] = {0, INT64_MAX, INT64_MIN}, agg[3];
    double t0 = sl_time_sec();
    *found = 0;
    sl_comm *lc = NULL; /* the hosts' first ranks: reads of another host's files come over it */
    if (j->world && world > 1 && sl_comm_split(j->world, leader ? 0 : 1, p->host, &lc) != SL_OK)
        return sl_train_fail(SL_ERR_PEER, "rank %d: pooled restore: %s", rank, sl_errmsg());
    if (leader) {
        /* what interrupted saves of this host left (Note [Stale temp dirs] in src/ckpt/ckpt.c; the restore
         * clears .restore itself) */
        char hroot[3900];
        snprintf(hroot, sizeof hroot, "%s/host-%d", p->local_root, p->host);
        sl_ckpt_remove_stale_tmp(hroot, NULL, 0);
        sl_status st = lc ? sl_ckpt_pool_restore(p, lc, restore, &got)
                          : sl_ckpt_pool_gather(p->local_root, p->hosts, -1, restore, &got);
        if (st == SL_ERR_IO &&
            strstr(sl_errmsg(), "no pooled checkpoint")) { /* no step at all: a fresh start */
            got = -1;
        } else if (st != SL_OK) {
            snprintf(msg, sizeof msg, "%s", sl_errmsg());
            v[0] = st == SL_ERR_PEER || st == SL_ERR_TIMEOUT ? 2 : 1;
        }
        v[1] = v[2] = got;
    }
    sl_comm_free(lc);
    if (j->world) {
        if (sl_comm_all_reduce(j->world, &v[0], &agg[0], 1, SL_COMM_I64, SL_COMM_MAX) != SL_OK ||
            sl_comm_all_reduce(j->world, &v[1], &agg[1], 1, SL_COMM_I64, SL_COMM_MIN) != SL_OK ||
            sl_comm_all_reduce(j->world, &v[2], &agg[2], 1, SL_COMM_I64, SL_COMM_MAX) != SL_OK)
            return sl_train_fail(SL_ERR_PEER, "rank %d: pooled restore: %s%s%s", rank, msg,
                                 msg[0] && !strstr(msg, sl_errmsg()) ? "; then " : "",
                                 msg[0] && strstr(msg, sl_errmsg()) ? "" : sl_errmsg());
    } else {
        memcpy(agg, v, sizeof agg);
    }
    if (agg[0] == 2) /* a peer failure on some host: a runtime failure, restartable */
        return sl_train_fail(SL_ERR_PEER, "rank %d: pooled restore from %s: %s%s", rank, p->local_root,
                             v[0] == 2 || !msg[0] ? "" : msg,
                             v[0] == 2 ? msg
                             : msg[0]  ? "; a peer host was lost during the restore (on another host)"
                                       : "a peer host was lost during the restore (on another host)");
    if (agg[0])
        return sl_train_bad("--ckpt-local-dir: %s",
                            msg[0] ? msg : "the pooled restore failed on another host");
    if (agg[1] != agg[2])
        return sl_train_bad("--ckpt-local-dir %s: hosts rebuilt different steps (%lld and %lld)",
                            p->local_root, (long long)agg[1], (long long)agg[2]);
    if (agg[1] < 0) return SL_OK;
    snprintf(dir, cap, "%s/step-%07lld", restore, (long long)agg[1]);
    *found = 1;
    j->pool_restored = 1; /* the same on every rank (agreed above) */
    if (j->out && rank == 0)
        fprintf(j->out, "pooled checkpoint step %lld reassembled from %s (%d hosts, %.2f s)\n",
                (long long)agg[1], p->local_root, p->hosts,
                sl_time_sec() - t0); /* bench/ckpt_pool_net.sh reads the time */
    return SL_OK;
}

/* Note [.restore is removed once loaded]
 * The step a pooled restore rebuilt (LOCAL/host-<h>/.restore/step-N: a full copy of the step, every rank's
 * shard) is read once, by the resume's load of each rank of the host, or not at all when the disk or
 * in-memory copy was newer. It stayed until the next restore emptied it, a full step's bytes on every host's
 * local disk for the rest of the run. Once every rank of the job has loaded (an all-reduce when a host has
 * several ranks: they share the host's .restore), each host's first rank removes the step, `latest` and the
 * then empty .restore (sl_ckpt_pool_restore_remove). A removal that fails only warns: the next restore
 * empties .restore first. */
static sl_status pool_restore_done(sl_train_job *j) {
    if (!j->pool_restored) return SL_OK;
    const sl_ckpt_pool *p = &j->pool;
    int rank = j->mesh.rank, world = j->mesh.world;
    if (j->world && world > p->hosts) { /* a host's ranks share its .restore: all of them have loaded */
        int32_t one = 1, all = 1;
        if (sl_comm_all_reduce(j->world, &one, &all, 1, SL_COMM_I32, SL_COMM_MAX) != SL_OK)
            return sl_train_fail(SL_ERR_PEER, "rank %d: pooled restore: %s", rank, sl_errmsg());
    }
    j->pool_restored = 0;
    if (!(rank == 0 || sl_ckpt_pool_host_of(rank - 1, world, p->hosts) != p->host)) return SL_OK;
    char restore[3900];
    snprintf(restore, sizeof restore, "%s/host-%d/.restore", p->local_root, p->host);
    if (sl_ckpt_pool_restore_remove(restore) != SL_OK)
        SL_LOGW("pooled restore: the loaded step stays: %s", sl_errmsg());
    return SL_OK;
}

/* Note [Where a resume came from]
 * "resumed from X at step N" (run.c) named ckdir, the directory loaded. For a pooled restore that is
 * LOCAL/host-<h>/.restore/step-N, which is removed as soon as every rank has loaded it (Note [.restore is
 * removed once loaded]): the log named a directory that was never there afterwards, and nothing said the
 * data had come from the pool. ckfrom names the source instead: "pooled checkpoint LOCAL step-N" (the pool
 * and the step the surviving hosts rebuilt, which stay), "in-memory copy MEM/step-N" (the launcher's tmpfs
 * copy, SUANLI_MEM_CKPT_DIR, removed when the launcher exits), or the step dir under --load itself. Parsers
 * (bench/ckpt.sh, tests/fault/netns_pool.sh, slurm_requeue.sh, test_ckpt_kill.c, test_ckpt_pool.c,
 * test_ckpt_io.c) read the text after "resumed from " up to " at step N", and the step from "step-". */
static void set_ckpt_source(sl_train_job *j, int from_pool, int from_mem) {
    const char *step = strrchr(j->ckdir, '/');
    step = step ? step + 1 : j->ckdir;
    if (from_pool)
        snprintf(j->ckfrom, sizeof j->ckfrom, "pooled checkpoint %s %s", j->pool.local_root, step);
    else if (from_mem)
        snprintf(j->ckfrom, sizeof j->ckfrom, "in-memory copy %.4000s", j->ckdir);
    else
        snprintf(j->ckfrom, sizeof j->ckfrom, "%s", j->ckdir);
}

/* load_dir: a checkpoint to resume (the newest valid one, or the newer in-memory copy), else the weights
 * in load_dir/model.safetensors, else (load_dir == save_dir) a fresh start. With --ckpt-local-dir the pool
 * is a candidate too (Note [Pooled restore]). */
static sl_status find_start(sl_train_job *j) {
    const sl_train_opts *o = &j->o;
    const char *load = o->ckpt.load_dir, *save = o->ckpt.save_dir, *init_from = o->model.init_from;
    int same = save && !strcmp(load, save);
    snprintf(j->wpath, sizeof j->wpath, "%s/model.safetensors", load);
    const char *mem = sl_ckpt_mem_root();
    char memdir[4096];
    char pooldir[4000];
    int have_pool = 0;
    if (j->pooled) SL_TRY(pool_restore(j, pooldir, sizeof pooldir, &have_pool));
    /* Note [One verification per restart]
     * The in-memory copy is tried first when it is at least as new as every other candidate (step dirs
     * compared by name, without reading them): then neither the disk copy nor the pool is read, and the
     * one verification of its checksums here is the only one (the load trusts it, ckpt_verified). */
    char lm[4200];
    snprintf(lm, sizeof lm, "%s/manifest.json", load);
    int64_t disk_newest = access(lm, F_OK) == 0 ? INT64_MAX /* --load names a step dir: not this path */
                          : sl_ckpt_is_checkpoint(load) ? sl_ckpt_newest_step(load)
                                                        : -1;
    int64_t pool_step = have_pool ? (int64_t)strtoll(strrchr(pooldir, '/') + 6, NULL, 10) : -1;
    int mem_state = 0; /* the in-memory copy: 0 not looked at yet, 1 memdir verified, -1 none usable */
    if (mem && same && sl_ckpt_is_checkpoint(mem) && sl_ckpt_newest_step(mem) >= disk_newest &&
        sl_ckpt_newest_step(mem) >= pool_step) {
        mem_state = sl_ckpt_find_latest(mem, memdir, sizeof memdir) == SL_OK ? 1 : -1;
        if (mem_state == 1 && (int64_t)strtoll(strrchr(memdir, '/') + 6, NULL, 10) >=
                                  (disk_newest > pool_step ? disk_newest : pool_step)) {
            snprintf(j->ckdir, sizeof j->ckdir, "%s", memdir);
            j->resume = 1;
            j->ckpt_verified = 1;
            set_ckpt_source(j, 0, 1);
            return SL_OK;
        }
    }
    int from_pool = 0, from_mem = 0;
    if (sl_ckpt_is_checkpoint(load)) {
        if (sl_ckpt_find_latest(load, j->ckdir, sizeof j->ckdir) != SL_OK)
            return sl_train_bad("--load: %s", sl_errmsg());
        j->resume = 1;
        j->ckpt_verified = 1;
    }
    if (have_pool) {
        const char *ps = strrchr(pooldir, '/'), *ds = j->resume ? strrchr(j->ckdir, '/') : NULL;
        if (!ds || strcmp(ps, ds) >= 0) {
            snprintf(j->ckdir, sizeof j->ckdir, "%s", pooldir);
            j->resume = 1;
            j->ckpt_verified = 0;
            from_pool = 1;
        }
    }
    if (mem && same && mem_state >= 0 && sl_ckpt_is_checkpoint(mem) &&
        (mem_state == 1 || sl_ckpt_find_latest(mem, memdir, sizeof memdir) == SL_OK)) {
        /* step dirs are named step-NNNNNNN: compare their steps */
        const char *ms = strrchr(memdir, '/'), *ds = j->resume ? strrchr(j->ckdir, '/') : NULL;
        if (ms && (!ds || strcmp(ms, ds) >= 0)) {
            snprintf(j->ckdir, sizeof j->ckdir, "%s", memdir);
            j->resume = 1;
            j->ckpt_verified = 1;
            from_pool = 0;
            from_mem = 1;
        }
    }
    if (j->resume) {
        set_ckpt_source(j, from_pool, from_mem); /* found above */
    } else if (init_from && !same) {
        return sl_train_bad("--load %s with --init-from: no checkpoint (step-*/manifest.json) there", load);
    } else if (!init_from && access(j->wpath, F_OK) == 0) {
        j->init_from_weights = 1;
    } else if (same) {
        j->note_fresh = 1; /* printed once setup succeeded (Note [Notes after the checks]) */
    } else {
        return sl_train_bad("--load %s: no checkpoint (step-*/manifest.json) and no model.safetensors there",
                            load);
    }
    if (j->resume && init_from) {
        if (sl_model_check_config(j->ckdir, j->m) != SL_OK) return sl_train_bad("--load: %s", sl_errmsg());
    } else if (j->resume || j->init_from_weights) {
        sl_gpt2_config lc;
        const char *cdir = j->resume ? j->ckdir : load;
        if (sl_model_load_config(cdir, &lc) != SL_OK) return sl_train_bad("--load: %s", sl_errmsg());
        const char *names[] = {"num-layers", "num-attention-heads", "hidden-size", "vocab-size",
                               "max-position-embeddings"};
        int64_t given[] = {o->model.num_layers, o->model.num_heads, o->model.hidden_size, o->model.vocab_size,
                           o->model.max_positions};
        int lv[] = {lc.n_layer, lc.n_head, lc.n_embd, lc.vocab_size, lc.max_seq_len};
        int fv[] = {j->cfg.n_layer, j->cfg.n_head, j->cfg.n_embd, j->cfg.vocab_size, j->cfg.max_seq_len};
        for (int i = 0; i < 5; i++)
            if (given[i] && lv[i] != fv[i])
                return sl_train_bad("--%s %d conflicts with %d in %s/config.json", names[i], fv[i], lv[i],
                                    cdir);
        j->cfg = lc;
    }
    return SL_OK;
}

/* Note [A resume keeps the seed]
 * The data order (Note [Deterministic batches]) and the dropout masks are functions of (seed, step): a
 * resume with another --seed would continue the checkpoint's weights on a different sample sequence, and
 * nothing would say so. The manifest records the seed (train.seed); a resume whose --seed differs is bad
 * input, naming both values and the checkpoint. A manifest without the field (older checkpoints) takes the
 * run's --seed. --init-from alone (weights only, a fresh run) reads no manifest and is not affected. The
 * check reads the manifest alone (sl_ckpt_load_train_state) right after the checkpoint is chosen, before
 * the model, the trainer and the load of the state (it had come after the whole load). */
static sl_status check_resume_seed(const sl_train_job *j) {
    if (!j->resume) return SL_OK;
    uint64_t seed = (uint64_t)j->o.seed;
    sl_ckpt_state meta = {.seed = seed}; /* kept when the manifest records none */
    if (sl_ckpt_load_train_state(j->ckdir, &meta) != SL_OK) return sl_train_bad("--load: %s", sl_errmsg());
    if (meta.seed != seed)
        return sl_train_bad("--seed %llu differs from the seed %llu that %s was trained with: the data order "
                            "and dropout masks would change; pass --seed %llu to resume it",
                            (unsigned long long)seed, (unsigned long long)meta.seed, j->ckdir,
                            (unsigned long long)meta.seed);
    return SL_OK;
}

/* The model: its shape from the options, --init-from or --load; weights fresh, loaded or (resume) later. */
static sl_status make_model(sl_train_job *j) {
    const sl_train_opts *o = &j->o;
    const sl_train_model_opts *mo = &o->model;
    int data_vocab = sl_dataset_vocab_size(j->train);
    j->be = sl_backend_get(mo->device ? mo->device : "cpu");
    if (!j->be) return sl_train_bad("--device: %s", sl_errmsg());
    struct stat isb, ssb; /* the final save would replace the model's config.json and weights */
    if (mo->init_from && o->ckpt.save_dir && stat(mo->init_from, &isb) == 0 &&
        stat(o->ckpt.save_dir, &ssb) == 0 && isb.st_dev == ssb.st_dev && isb.st_ino == ssb.st_ino)
        return sl_train_bad(
            "--save %s is the --init-from directory (the final save would replace its weights); "
            "give another one",
            o->ckpt.save_dir);
    if (mo->init_from) SL_TRY(load_init_from(j, data_vocab));
    if (!mo->init_from)
        j->cfg = (sl_gpt2_config){
            (int)(mo->num_layers ? mo->num_layers : 4), (int)(mo->num_heads ? mo->num_heads : 4),
            (int)(mo->hidden_size ? mo->hidden_size : 128), mo->vocab_size ? (int)mo->vocab_size : data_vocab,
            (int)(mo->max_positions ? mo->max_positions : o->data.seq_length)};
    if (o->ckpt.load_dir) SL_TRY(find_start(j));
    SL_TRY(check_resume_seed(j)); /* Note [A resume keeps the seed] */
    if (j->cfg.vocab_size != data_vocab && !mo->init_from)
        return sl_train_bad("model vocab size %d does not match the data's vocab size %d (%s)",
                            j->cfg.vocab_size, data_vocab, o->data.path);
    if (o->data.seq_length > j->cfg.max_seq_len)
        return sl_train_bad("--seq-length %lld exceeds the model's position table %d",
                            (long long)o->data.seq_length, j->cfg.max_seq_len);
    if (short_split(j))
        return sl_train_bad("%s: a split has fewer than seq-length+1 = %lld tokens", o->data.path,
                            (long long)o->data.seq_length + 1);
    int64_t lv = o->parallel.layers_per_virtual_stage, per_stage = j->cfg.n_layer / j->mesh.pp;
    if (lv > 0 && (j->cfg.n_layer % j->mesh.pp || per_stage % lv || per_stage / lv < 2))
        return sl_train_bad("--num-layers-per-virtual-pipeline-stage %lld: num-layers %d is not "
                            "--pipeline-model-parallel-size %d x %lld x (2 or more model chunks)",
                            (long long)lv, j->cfg.n_layer, j->mesh.pp, (long long)lv);
    j->vpp = lv > 0 ? (int)(per_stage / lv) : 1;
    int64_t n_micro = o->data.global_batch_size / (o->data.micro_batch_size * j->mesh.dp);
    if (j->vpp > SL_PIPE_MAX_CHUNKS) /* sl_pipeline_new's checks, here as bad input (they exited 1) */
        return sl_train_bad(
            "--num-layers-per-virtual-pipeline-stage %lld: %d model chunks per stage, at most %d",
            (long long)lv, j->vpp, SL_PIPE_MAX_CHUNKS);
    if (j->vpp > 1 && n_micro % j->mesh.pp)
        return sl_train_bad("--num-layers-per-virtual-pipeline-stage: the interleaved schedule needs "
                            "micro-batches per step (%lld: --global-batch-size / (--micro-batch-size x "
                            "data-parallel size)) to be a multiple of --pipeline-model-parallel-size %d",
                            (long long)n_micro, j->mesh.pp);
    if (!mo->init_from) { /* --init-from: the whole model and its weights loaded above */
        if (sl_gpt2_new_on(&j->cfg, j->be, &j->m) != SL_OK) return sl_train_bad("%s", sl_errmsg());
        if (j->init_from_weights) {
            if (sl_model_load_weights(j->m, j->wpath) != SL_OK)
                return sl_train_bad("--load: %s", sl_errmsg());
        } else if (!j->resume) { /* a resumed run loads every parameter from the checkpoint (make_trainer) */
            SL_TRY(sl_model_init_weights_ex(j->m, (uint64_t)o->seed));
        }
    }
    if (j->mesh.tp > 1 || j->mesh.pp > 1 || j->mesh.ep > 1) { /* this rank's part of the whole model */
        sl_model *whole = j->m, *shard = NULL;
        j->m = NULL;
        sl_model_split split = {j->mesh.tp,
                                j->mesh.tp_rank,
                                j->mesh.pp,
                                j->mesh.pp_rank,
                                j->vpp,
                                (int)o->parallel.first_stage_layers,
                                (int)o->parallel.last_stage_layers,
                                j->mesh.ep,
                                j->mesh.ep_rank,
                                o->parallel.etp > 1};
        sl_status st = sl_model_new_split(whole, j->be, &split, &shard);
        if (st == SL_OK) st = sl_tp_load_full(shard, whole);
        if (st == SL_OK) shard->autocast_bf16 = whole->autocast_bf16;
        sl_model_free(whole);
        if (st != SL_OK) {
            sl_model_free(shard);
            return sl_train_bad("%s", sl_errmsg());
        }
        shard->sp = (int)o->parallel.sequence_parallel;
        j->m = shard;
    }
    return SL_OK;
}

/* Bytes of one checkpoint snapshot of this rank, reserved ahead of the first save. */
static sl_status reserve_writer(sl_train_job *j) {
    j->ckw = sl_ckpt_writer_new();
    if (!j->ckw) return sl_train_bad("out of memory");
    sl_ckpt_state cst;
    sl_ckpt_seg *segs = NULL;
    size_t need = 0;
    if (sl_trainer_ckpt_state(&j->tr, j->mesh.rank, j->mesh.world, &cst, &segs) == SL_OK)
        for (int k = 0; k < cst.nseg; k++)
            need += (size_t)cst.seg[k].len * (size_t)((cst.write_params ? 1 : 0) + (cst.write_optim ? 2 : 0));
    free(segs);
    if (sl_ckpt_writer_reserve(j->ckw, need) != SL_OK)
        return sl_train_bad("--save-interval: %s", sl_errmsg());
    if (j->pooled && j->world && sl_comm_size(j->world) > 1) {
        /* Note [Pool transfers over comm]: the writer threads' own communicator */
        if (sl_comm_split(j->world, 0, j->mesh.rank, &j->ckpt_comm) != SL_OK)
            return sl_train_fail(SL_ERR_PEER, "rank %d: checkpoint communicator: %s", j->mesh.rank,
                                 sl_errmsg());
        j->pool.comm = j->ckpt_comm;
    }
    if (j->pooled) sl_ckpt_writer_set_pool(j->ckw, &j->pool);
    if (j->pooled && j->o.ckpt.shared)
        sl_ckpt_writer_set_drain(j->ckw, j->o.ckpt.save_dir, (int)j->o.ckpt.keep);
    return SL_OK;
}

static void wait_snapshot(void *w) { sl_ckpt_writer_wait_snapshot(w); }

/* The trainer, DP/ZeRO, the resumed state and the checkpoint writer. */
static sl_status make_trainer(sl_train_job *j) {
    const sl_train_opts *o = &j->o;
    sl_model *m = j->m;
    m->compute_dtype = o->model.bf16 ? SL_BF16 : o->model.fp16 ? SL_F16 : SL_F32;
    m->attention_dropout = (float)o->model.attention_dropout; /* read when the graph is built */
    m->hidden_dropout = (float)o->model.hidden_dropout;
    SL_TRY(sl_train_moe_apply(j)); /* before the trainer builds the graph */
    j->B = (int)o->data.micro_batch_size;
    j->T = (int)o->data.seq_length;
    j->accum = (int)(o->data.global_batch_size / (o->data.micro_batch_size * j->mesh.dp));
    sl_trainer_config tc = {.B = j->B,
                            .T = j->T,
                            .accum = j->accum,
                            .dp_size = j->mesh.dp,
                            .lr = (float)o->optim.lr,
                            .min_lr = (float)o->optim.min_lr,
                            .clip = (float)o->optim.clip_grad,
                            .warmup = o->optim.warmup_iters,
                            .decay_iters = o->optim.decay_iters,
                            .hp = {(float)o->optim.beta1, (float)o->optim.beta2, (float)o->optim.eps,
                                   (float)o->optim.weight_decay},
                            .mesh = &j->mesh,
                            .pipe_schedule = o->parallel.zero_bubble ? SL_PIPE_ZB_H1 : SL_PIPE_1F1B,
                            .recompute = !o->parallel.recompute_granularity ? SL_RECOMPUTE_NONE
                                         : o->parallel.recompute_method &&
                                                 !strcmp(o->parallel.recompute_method, "block")
                                             ? SL_RECOMPUTE_BLOCK
                                             : SL_RECOMPUTE_UNIFORM,
                            .recompute_layers = (int)o->parallel.recompute_num_layers,
                            .lanes = (int)o->parallel.micro_batch_lanes,
                            /* the masks' Philox key: the run's seed, moved off the data loader's key */
                            .dropout_seed = (uint64_t)o->seed ^ 0x64726f706f757421ull};
    if (o->model.fp16)
        tc.loss_scale =
            (sl_loss_scale_config){(float)o->optim.initial_loss_scale, (float)o->optim.min_loss_scale,
                                   (int)o->optim.loss_scale_window, (int)o->optim.hysteresis};
    if (sl_lanes_check(m, &tc) != SL_OK) return sl_train_bad("%s", sl_errmsg()); /* bad input: exit 2 */
    if (tc.lanes > 1 && j->mesh.dp > 1 && o->parallel.zero_stage >= 2) /* Note [Micro-batch lanes] */
        return sl_train_bad("--micro-batch-lanes %d: not supported with --zero-stage %d", tc.lanes,
                            (int)o->parallel.zero_stage);
    sl_status st = sl_trainer_init(&j->tr, m, &tc);
    if (st != SL_OK) return sl_train_fail(st, "%s", sl_errmsg());
    j->trainer_ok = 1;
    SL_TRY(sl_train_moe_bias_setup(j));
    if (j->mesh.tp > 1 || j->mesh.ep > 1) { /* the collective provider of TP and EP nodes */
        if (sl_tp_new(&j->tp, &j->mesh) != SL_OK || sl_trainer_set_tp(&j->tr, j->tp) != SL_OK)
            return sl_train_bad("%s", sl_errmsg());
    }
    if (j->mesh.dp > 1) {
        /* the buckets' ready points from the trainer: under PP, the chunks' last backward units and the tied
         * embedding held for the first + last stage sum (Note [DP overlap under PP]) */
        sl_dp_opts dpo = {.zero_stage = (int)o->parallel.zero_stage,
                          .bucket_elems = o->parallel.bucket_elems,
                          .accum = j->accum,
                          .ready = sl_trainer_dp_ready,
                          .ready_user = &j->tr};
        if (sl_dp_new(&j->dp, &j->mesh, m, j->tr.graph, &dpo) != SL_OK)
            return sl_train_bad("%s", sl_errmsg());
        j->tr.dp = j->dp;
    }
    if (j->resume) {
        sl_ckpt_state cst;
        sl_ckpt_seg *segs = NULL;
        double t0 = sl_time_sec();
        sl_status ls = sl_trainer_ckpt_state(&j->tr, j->mesh.rank, j->mesh.world, &cst, &segs);
        cst.verified = j->ckpt_verified; /* Note [One verification per restart] */
        cst.seed = (uint64_t)o->seed;    /* checked before (Note [A resume keeps the seed]) */
        if (ls == SL_OK) ls = sl_ckpt_load(j->ckdir, &cst);
        free(segs);
        if (ls != SL_OK) return sl_train_bad("--load: %s", sl_errmsg());
        j->start_step = cst.step;
        sl_trainer_set_adam_t(&j->tr, cst.adam_t);
        if (cst.has_scaler &&
            j->tr.scaling) { /* else an fp16 run from an fp32 checkpoint: the initial scale */
            sl_loss_scaler *ls = &j->tr.scaler;
            ls->scale = (float)cst.loss_scale;
            ls->growth_tracker = (int)cst.growth_tracker;
            ls->hysteresis_tracker = (int)cst.hysteresis_tracker;
            ls->skipped = cst.skipped;
        }
        j->resume_seconds = sl_time_sec() - t0;
    }
    SL_TRY(pool_restore_done(j)); /* Note [.restore is removed once loaded] */
    if (o->ckpt.save_dir && o->ckpt.save_interval > 0) {
        SL_TRY(reserve_writer(j));
        j->tr.pre_update = wait_snapshot;
        j->tr.pre_update_user = j->ckw;
    }
    return SL_OK;
}

double sl_train_cpu_seconds(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

/* Note [A refused output removes what it made]
 * open_outputs creates directories (mkdir -p) for --tensorboard-dir and --save. Before each it records the
 * first component of the path that does not exist yet; when a later output is refused, or the open of this
 * one fails after its directories were made, it removes the event file it created and rmdirs the
 * directories from the leaf up to that component: exactly what this call made (rmdir never removes a
 * directory that is not empty, and no pre-existing one is touched). `--tensorboard-dir new/a/tb` with a
 * refused --save had left new/a behind (only tb was removed). */
static void first_missing(const char *path, char *top, size_t cap) {
    char buf[4096];
    size_t n = strlen(path);
    top[0] = 0;
    if (n == 0 || n >= sizeof buf) return;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) /* the prefixes sl_mkdirs creates, in its order */
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            if (access(buf, F_OK) != 0) {
                snprintf(top, cap, "%s", buf);
                return;
            }
            buf[i] = c;
        }
}

/* rmdir path, then each parent up to and including top (a prefix of path; "" : none was made) */
static void unmake_dirs(const char *path, const char *top) {
    size_t lt = strlen(top);
    if (!lt) return;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    while (strlen(buf) >= lt) {
        rmdir(buf); /* fails on a non-empty one (not only ours) and on a leaf never made */
        char *slash = strrchr(buf, '/');
        while (slash && slash > buf && slash[1] == 0) { /* "a/b/": strip the trailing '/' first */
            *slash = 0;
            slash = strrchr(buf, '/');
        }
        if (!slash || slash == buf) return;
        *slash = 0;
    }
}

/* Note [metrics.jsonl after a resume]
 * A resumed run appends to metrics.jsonl, but the lines of steps after the checkpoint it resumed from were
 * written by the attempt that died: they are dropped first (and a last line cut short), so the file holds
 * each step once (the attempt's lines up to the checkpoint, then the resumed run's), as an uninterrupted
 * run's does; `suanli plot` and readers that take a step's first line saw the dead attempt's values and a
 * line going back. */
static sl_status trim_metrics(const char *path, int64_t step) {
    char *text;
    size_t len;
    if (access(path, F_OK) != 0) return SL_OK;
    SL_TRY(sl_file_read_all(path, &text, &len));
    size_t w = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        if (!nl) break; /* a line cut short by the death: the next line would be glued to it */
        size_t n = (size_t)(nl - (text + i)) + 1;
        long long s;
        if (!(sscanf(text + i, "{\"step\": %lld", &s) == 1 && s > step)) {
            memmove(text + w, text + i, n);
            w += n;
        }
        i += n;
    }
    sl_status st = w == len ? SL_OK : sl_file_write_atomic(path, text, w);
    free(text);
    return st;
}

/* The only writes of setup, after every check (Note [Bad input before any write]): the TensorBoard file
 * first (a refused --tensorboard-dir had already made --save and truncated its metrics.jsonl), then --save;
 * a refused output removes what this call made (Note [A refused output removes what it made]). */
static sl_status open_outputs(sl_train_job *j) {
    const char *save = j->o.ckpt.save_dir, *tbdir = j->o.log.tensorboard_dir;
    if (!j->rank0) return SL_OK;
    char tb_top[4096] = "", save_top[4096] = "", mp[4200];
    if (tbdir) {
        first_missing(tbdir, tb_top, sizeof tb_top);
        /* a resume: a SessionLog START at its first step makes TensorBoard drop what the dead attempt
         * logged from that step on (metrics.jsonl is trimmed the same way: Note [metrics.jsonl after a
         * resume]) */
        sl_status ts = sl_tb_writer_open(tbdir, &j->tb);
        if (ts == SL_OK && j->resume &&
            (sl_tb_writer_session_start(j->tb, j->start_step + 1, 0) != SL_OK ||
             sl_tb_writer_flush(j->tb) != SL_OK)) {
            ts = SL_ERR_IO;
            remove(sl_tb_writer_path(j->tb));
            sl_tb_writer_close(j->tb);
            j->tb = NULL;
        }
        if (ts != SL_OK) {
            sl_status st = sl_train_bad("--tensorboard-dir: %s", sl_errmsg());
            unmake_dirs(tbdir, tb_top);
            return st;
        }
    }
    if (!save) return SL_OK;
    snprintf(mp, sizeof mp, "%s/metrics.jsonl", save);
    first_missing(save, save_top, sizeof save_top);
    sl_status st = sl_mkdirs(save) != SL_OK ? sl_train_bad("--save: %s", sl_errmsg()) : SL_OK;
    if (st == SL_OK) { /* Note [Stale temp dirs] in src/ckpt/ckpt.c: no writer of this attempt runs yet */
        const char *roots[2] = {save, sl_ckpt_mem_root()};
        for (int i = 0; i < 2; i++) {
            char names[512];
            int n = roots[i] ? sl_ckpt_remove_stale_tmp(roots[i], names, sizeof names) : 0;
            if (n && j->out)
                fprintf(j->out, "removed %d temp file(s) of interrupted saves from %s: %s\n", n, roots[i],
                        names);
        }
    }
    if (st == SL_OK && j->resume && trim_metrics(mp, j->start_step) != SL_OK)
        st = sl_train_bad("--save: cannot rewrite %s: %s", mp, sl_errmsg());
    if (st == SL_OK && !(j->metrics = fopen(mp, j->resume ? "a" : "w")))
        st = sl_train_bad("--save: cannot write %s: %s", mp, strerror(errno));
    if (st != SL_OK) {
        unmake_dirs(save, save_top);
        if (j->tb) {
            remove(sl_tb_writer_path(j->tb));
            sl_tb_writer_close(j->tb);
            j->tb = NULL;
            unmake_dirs(tbdir, tb_top);
        }
    }
    return st;
}

/* Note [In-memory roots on every node]
 * Each node's launcher owns its own in-memory root (SUANLI_MEM_CKPT_DIR, a /dev/shm dir: Note [In-memory
 * checkpoint copy] in src/launch/launch.c) and every rank's writer mirrors its shard into its node's root as
 * step-N.tmpK. Only rank 0 tended the in-memory root: it commits it (rename, `latest`, keep 1) and its
 * restart's setup removes what interrupted saves left (Note [Stale temp dirs]). On a multi-node job no
 * commit reaches the other nodes' roots, so every save's step-N.tmpK stayed there, a node's share of every
 * checkpoint in tmpfs (RAM) until the launcher exited, and stale ones of a killed attempt too. Now the first
 * local rank of every node (LOCAL_RANK 0 as the launcher, torchrun, mpirun or srun sets it; without one, the
 * first rank of its host) cleans its node's root: at setup it removes the stale temp dirs as rank 0 does,
 * and once every writer of step N finished (ckpt_poll) it removes that step's uncommitted copy (mem_drop).
 * Those copies are not committed instead: a node's root holds its own ranks' shards only, so a committed
 * one would be chosen by the node's ranks at a restart and fail to load (ZeRO shards of other nodes
 * missing). A root shared with rank 0 (one tmpfs dir given to several launchers on one machine: same boot
 * id, device and inode) is left to rank 0's commit. Test: tests/fault/test_ckpt_io.c (two launchers as two
 * nodes). */
static int node_first(const sl_train_job *j) {
    sl_comm_env env = {0};
    if (!j->world) return 1;
    if (sl_comm_env_detect(&env) == SL_OK && env.local_rank >= 0 && env.size == j->mesh.world)
        return env.local_rank == 0;
    int me = j->mesh.rank, h = sl_comm_host_of(j->world, me);
    for (int r = 0; r < me; r++)
        if (sl_comm_host_of(j->world, r) == h) return 0;
    return 1;
}

typedef struct {
    uint64_t dev, ino;
    char boot[48];
} mem_id;

static void mem_root_id(const char *mem, mem_id *id) {
    struct stat sb;
    memset(id, 0, sizeof *id);
    if (!mem || stat(mem, &sb) != 0) return;
    id->dev = (uint64_t)sb.st_dev;
    id->ino = (uint64_t)sb.st_ino;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(id->boot, sizeof id->boot, f)) id->boot[0] = 0;
        fclose(f);
    }
}

/* Note [A partial in-memory copy is not committed]
 * Rank 0 committed its in-memory root like the disk copy, with the sidecars found there. On a multi-node
 * job that root holds only the shards of rank 0's node (the others write into their own nodes' roots), so
 * the committed copy was partial; it verified (its listed files are intact) and, being the newest, was what
 * rank 0's node loaded at a restart, which failed ("checkpoint has no tensor 'param/...'", bad input: exit 2,
 * not restarted) where the disk copy would have resumed. Rank 0 now commits its in-memory root only when
 * every rank writes into that same root (mem_partial: one all-reduce at setup); otherwise each node's copy
 * is dropped like the other nodes' (mem_drop, Note [In-memory roots on every node]) and a restart reads
 * the disk copy. Test: tests/fault/test_ckpt_io.c (two launchers as two nodes, a rank killed). */

/* Collective (under --save): Note [In-memory roots on every node] */
static sl_status mem_roots_setup(sl_train_job *j) {
    const char *mem = sl_ckpt_mem_root();
    if (!j->world || !j->o.ckpt.save_dir) return SL_OK;
    mem_id r0, mine;
    if (mem) (void)sl_mkdirs(mem); /* as the writers would (a root that does not exist yet has no inode) */
    mem_root_id(mem, &mine);
    r0 = mine;
    if (sl_comm_broadcast(j->world, &r0, &r0, sizeof r0, SL_COMM_U8, 0) != SL_OK)
        return sl_train_fail(SL_ERR_PEER, "rank %d: in-memory checkpoint root: %s", j->mesh.rank,
                             sl_errmsg());
    int32_t shared =
                mine.ino && r0.ino && mine.dev == r0.dev && mine.ino == r0.ino && !strcmp(mine.boot, r0.boot),
            whole = 0;
    if (sl_comm_all_reduce(j->world, &shared, &whole, 1, SL_COMM_I32, SL_COMM_MIN) != SL_OK)
        return sl_train_fail(SL_ERR_PEER, "rank %d: in-memory checkpoint root: %s", j->mesh.rank,
                             sl_errmsg());
    j->mem_partial = !whole; /* Note [A partial in-memory copy is not committed] */
    if (j->rank0) {
        j->mem_drop = mem && !whole;
        return SL_OK;
    }
    if (!mem || shared || !node_first(j)) return SL_OK;
    j->mem_drop = 1;
    char names[512];
    int n = sl_ckpt_remove_stale_tmp(mem, names, sizeof names);
    if (n && j->out)
        fprintf(j->out, "removed %d temp file(s) of interrupted saves from %s: %s\n", n, mem, names);
    return SL_OK;
}

sl_status sl_train_job_setup(sl_train_job *j, const sl_train_opts *opts) {
    memset(j, 0, sizeof *j);
    j->o = *opts;
    j->out = opts->log.out;
    j->err = opts->log.err;
    j->pending_step = -1;
    j->committing_step = -1;
    j->setup_t0 = sl_time_sec();
    j->setup_cpu0 = sl_train_cpu_seconds();
    SL_TRY(setup_comm(j));
    SL_TRY(check_opts(j));
    SL_TRY(open_data(j));
    cap_eval_iters(j);
    SL_TRY(make_model(j));
    SL_TRY(make_trainer(j));
    SL_TRY(mem_roots_setup(j)); /* Note [In-memory roots on every node] */
    SL_TRY(open_outputs(j));
    /* Note [Notes after the checks]: a run refused in setup prints its one error line only, so the notes
     * that setup finds wait until every check passed ("note: no checkpoint ..." had preceded the error of
     * a refused `--load new --save new`) */
    if (j->out && j->note_fresh) {
        fprintf(j->out, "note: no checkpoint in %s yet; starting from scratch\n", j->o.ckpt.load_dir);
        fflush(j->out); /* every rank says it; a killed rank must not lose it */
    }
    if (j->out && j->rank0 && j->mesh.dp == 1 && j->o.parallel.zero_stage > 0)
        fprintf(j->out, "note: --zero-stage %lld has no effect with one data-parallel rank\n",
                (long long)j->o.parallel.zero_stage);
    if (!j->rank0) j->out = NULL; /* only rank 0 talks */
    const sl_gpt2_config *c = &j->cfg;
    snprintf(
        j->model_json, sizeof j->model_json,
        "{\"architecture\": \"%s\", \"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, \"vocab_size\": %d, "
        "\"max_seq_len\": %d}",
        sl_arch_name(j->m->arch), c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->max_seq_len);
    return SL_OK;
}

void sl_train_job_release(sl_train_job *j, int failed) {
    if (failed && j->ckpt_comm) sl_comm_abort(j->ckpt_comm); /* a writer thread may wait on a peer */
    sl_ckpt_writer_free(j->ckw);
    sl_comm_free(j->ckpt_comm);
    if (j->metrics) fclose(j->metrics);
    sl_dp_free(j->dp);
    sl_tp_free(j->tp);
    if (j->trainer_ok) sl_trainer_free(&j->tr);
    if (j->mesh_ok) sl_mesh_free(&j->mesh);
    if (failed && j->world) sl_comm_abort(j->world);
    if (j->own_world) sl_comm_free(j->world);
    sl_model_free(j->m);
    free(j->moe_loads);
    sl_tokenizer_free(j->tok);
    sl_dataset_close(j->train);
    sl_dataset_close(j->val);
    memset(j, 0, sizeof *j);
}
