/* suanli train — GPT-2 on token shards. Flag names follow Megatron-LM where one exists. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include <signal.h>
#include <unistd.h>

#include "suanli/ckpt.h"
#include "suanli/ckpt_trainer.h"
#include "suanli/data.h"
#include "suanli/hf.h"
#include "suanli/model_io.h"
#include "suanli/parallel.h"
#include "suanli/train.h"

typedef struct {
    int64_t num_layers, hidden_size, num_heads, seq_length, max_pos, micro_bs, global_bs, train_iters;
    int64_t warmup, decay_iters, seed, eval_interval, eval_iters, log_interval, threads, vocab_size,
        sample_tokens;
    double lr, min_lr, wd, clip, beta1, beta2, eps, exit_mins, temperature;
    int64_t top_k, tp, pp, ep, zero_stage, bucket, save_interval, save_keep;
    int bf16;
    const char *data_path, *save, *load, *config, *sample_prompt, *init_from;
} train_args;

typedef struct {
    const sl_dataset *ds;
    int B, T;
    uint64_t seed;
} batch_src;

static sl_status batch_fn(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    batch_src *s = u;
    return sl_dataset_batch(s->ds, s->B, s->T, s->seed, (uint64_t)step, 0, micro, ids, tg);
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

static int print_token_cb(void *user, int32_t t) {
    const sl_tokenizer *tok = user;
    char buf[256];
    int n = sl_tokenizer_decode_token(tok, t, buf, sizeof buf);
    if (n > 0) fwrite(buf, 1, (size_t)n, stdout);
    fflush(stdout);
    return 0;
}

/* Shared with generate: print a sample continuing `prompt`. */
int sl_cli_print_sample(sl_model *m, const sl_tokenizer *tok, const char *prompt, int n_tokens,
                        float temperature, int top_k, uint64_t seed) {
    int32_t *ids = NULL;
    int64_t n = 0;
    if (sl_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n) != SL_OK || n == 0) {
        free(ids);
        fprintf(stderr, "suanli: cannot encode the prompt: %s\n", sl_errmsg());
        return 2;
    }
    fwrite(prompt, 1, strlen(prompt), stdout);
    sl_sample_opts so = {temperature, top_k, 1.0f, seed};
    double t0 = sl_time_sec();
    sl_status st =
        sl_model_generate(m, ids, (int)n, n_tokens, &so, NULL, 0, print_token_cb, (void *)tok, NULL, NULL);
    double dt = sl_time_sec() - t0;
    free(ids);
    printf("\n");
    if (st != SL_OK) {
        fprintf(stderr, "suanli: generate: %s\n", sl_errmsg());
        return 1;
    }
    fprintf(stderr, "[generated %d tokens in %.2f s, %.1f tokens/s]\n", n_tokens, dt,
            n_tokens / (dt > 0 ? dt : 1));
    return 0;
}

static sl_status copy_file(const char *src, const char *dst) {
    char *buf;
    size_t n;
    SL_TRY(sl_file_read_all(src, &buf, &n));
    sl_status st = sl_file_write_atomic(dst, buf, n);
    free(buf);
    return st;
}

static void wait_snapshot(void *w) { sl_ckpt_writer_wait_snapshot(w); }

/* Commit a pending checkpoint once every rank's writer finished (or wait for it with force). */
static sl_status ckpt_poll(sl_ckpt_writer *w, sl_comm *world, const sl_mesh *mesh, const char *root,
                           int64_t *pending, int force, int keep, const char *model_json,
                           const char *layout_json) {
    if (*pending < 0) return SL_OK;
    if (force) sl_ckpt_writer_wait(w);
    int32_t flags[2] = {sl_ckpt_writer_done(w), 0}, agg[2];
    if (world) {
        if (sl_comm_all_reduce(world, &flags[0], &agg[0], 1, SL_COMM_I32, SL_COMM_MIN) != SL_OK)
            return sl_fail(SL_ERR_PEER, "%s", sl_errmsg());
    } else {
        agg[0] = flags[0];
    }
    if (!agg[0]) return SL_OK;
    sl_status ws = sl_ckpt_writer_wait(w);
    flags[1] = ws != SL_OK;
    if (world) {
        if (sl_comm_all_reduce(world, &flags[1], &agg[1], 1, SL_COMM_I32, SL_COMM_MAX) != SL_OK)
            return sl_fail(SL_ERR_PEER, "%s", sl_errmsg());
    } else {
        agg[1] = flags[1];
    }
    if (agg[1]) {
        fprintf(stderr, "suanli train: rank %d: checkpoint step %lld failed: %s\n", mesh->rank,
                (long long)*pending, ws != SL_OK ? sl_errmsg() : "on another rank");
        return SL_ERR_IO;
    }
    if (mesh->rank == 0) {
        double t0 = sl_time_sec();
        sl_status cs = sl_ckpt_commit(root, *pending, mesh->world, keep, model_json, layout_json);
        if (cs != SL_OK) {
            fprintf(stderr, "suanli train: checkpoint commit: %s\n", sl_errmsg());
            return cs;
        }
        const char *mem = sl_ckpt_mem_root();
        if (mem && sl_ckpt_commit(mem, *pending, mesh->world, 1, model_json, layout_json) != SL_OK)
            SL_LOGW("in-memory checkpoint copy not committed: %s", sl_errmsg());
        double ws_ = sl_ckpt_writer_write_seconds(w);
        printf("checkpoint step %lld committed: stall %.1f ms, background write %.2f s (%.0f MB/s from rank "
               "0), commit %.1f ms\n",
               (long long)*pending, sl_ckpt_writer_stall(w) * 1e3, ws_,
               sl_ckpt_writer_bytes(w) / 1e6 / (ws_ > 0 ? ws_ : 1), (sl_time_sec() - t0) * 1e3);
        fflush(stdout);
    }
    *pending = -1;
    return SL_OK;
}

int sl_cmd_train(int argc, char **argv) {
    train_args a = {.num_layers = 4,
                    .hidden_size = 128,
                    .num_heads = 4,
                    .seq_length = 128,
                    .max_pos = 0,
                    .micro_bs = 8,
                    .global_bs = 0,
                    .train_iters = 1000,
                    .warmup = 0,
                    .decay_iters = 0,
                    .seed = 1234,
                    .eval_interval = 100,
                    .eval_iters = 20,
                    .log_interval = 1,
                    .threads = 0,
                    .vocab_size = 0,
                    .sample_tokens = 0,
                    .lr = 1e-3,
                    .min_lr = -1,
                    .wd = 0.1,
                    .clip = 1.0,
                    .beta1 = 0.9,
                    .beta2 = 0.95,
                    .eps = 1e-8,
                    .exit_mins = 0,
                    .temperature = 0.8,
                    .top_k = 0,
                    .sample_prompt = "\n",
                    .tp = 1,
                    .pp = 1,
                    .ep = 1,
                    .zero_stage = 0,
                    .bucket = 1 << 20,
                    .save_interval = 0,
                    .save_keep = 2};
    sl_flag flags[] = {
        {"config", SL_FLAG_STR, &a.config, 0, 0, "JSON file whose keys are these flag names", 0},
        {"data-path", SL_FLAG_STR, &a.data_path, 0, 0, "directory made by 'suanli data prepare' (required)",
         0},
        {"num-layers", SL_FLAG_INT, &a.num_layers, 1, 1024, "transformer layers (4)", 0},
        {"hidden-size", SL_FLAG_INT, &a.hidden_size, 1, 65536, "model width C (128)", 0},
        {"num-attention-heads", SL_FLAG_INT, &a.num_heads, 1, 4096, "attention heads (4)", 0},
        {"seq-length", SL_FLAG_INT, &a.seq_length, 1, 1 << 20, "tokens per sample T (128)", 0},
        {"max-position-embeddings", SL_FLAG_INT, &a.max_pos, 1, 1 << 20, "position table size (= seq-length)",
         0},
        {"vocab-size", SL_FLAG_INT, &a.vocab_size, 2, 1 << 24,
         "must equal the data's vocab (default: from data)", 0},
        {"micro-batch-size", SL_FLAG_INT, &a.micro_bs, 1, 1 << 20, "samples per micro-batch B (8)", 0},
        {"global-batch-size", SL_FLAG_INT, &a.global_bs, 1, 1 << 30,
         "samples per step (= micro-batch-size); a multiple of it", 0},
        {"train-iters", SL_FLAG_INT, &a.train_iters, 0, 1e12, "optimizer steps (1000)", 0},
        {"lr", SL_FLAG_FLOAT, &a.lr, 0, 10, "peak learning rate (1e-3)", 0},
        {"min-lr", SL_FLAG_FLOAT, &a.min_lr, 0, 10, "final learning rate of the cosine decay (lr/10)", 0},
        {"lr-warmup-iters", SL_FLAG_INT, &a.warmup, 0, 1e12, "linear warmup steps (0)", 0},
        {"lr-decay-iters", SL_FLAG_INT, &a.decay_iters, 0, 1e12, "cosine decay length (= train-iters)", 0},
        {"weight-decay", SL_FLAG_FLOAT, &a.wd, 0, 10, "AdamW decoupled weight decay on 2-D weights (0.1)", 0},
        {"clip-grad", SL_FLAG_FLOAT, &a.clip, 0, 1e9, "global grad-norm clip, 0 = off (1.0)", 0},
        {"adam-beta1", SL_FLAG_FLOAT, &a.beta1, 0, 0.999999, "(0.9)", 0},
        {"adam-beta2", SL_FLAG_FLOAT, &a.beta2, 0, 0.999999, "(0.95)", 0},
        {"adam-eps", SL_FLAG_FLOAT, &a.eps, 0, 1, "(1e-8)", 0},
        {"seed", SL_FLAG_INT, &a.seed, 0, 9.007199254740992e15, "seeds init and data order (1234)", 0},
        {"eval-interval", SL_FLAG_INT, &a.eval_interval, 0, 1e12,
         "steps between val-loss evaluations, 0 = end only (100)", 0},
        {"eval-iters", SL_FLAG_INT, &a.eval_iters, 1, 1e6, "val micro-batches per evaluation (20)", 0},
        {"log-interval", SL_FLAG_INT, &a.log_interval, 1, 1e12, "steps between progress lines (1)", 0},
        {"exit-duration-in-mins", SL_FLAG_FLOAT, &a.exit_mins, 0, 1e9,
         "stop (eval, save) after this many minutes, 0 = off", 0},
        {"save", SL_FLAG_STR, &a.save, 0, 0,
         "output dir: model.safetensors, config.json, tokenizer.json, metrics.jsonl", 0},
        {"load", SL_FLAG_STR, &a.load, 0, 0,
         "resume from the newest valid checkpoint under this dir, or start from its model.safetensors", 0},
        {"save-interval", SL_FLAG_INT, &a.save_interval, 0, 1e12,
         "steps between checkpoints under --save, 0 = none", 0},
        {"save-keep", SL_FLAG_INT, &a.save_keep, 0, 1e6, "checkpoints to keep, 0 = all (2)", 0},
        {"init-from", SL_FLAG_STR, &a.init_from, 0, 0,
         "start from a Hugging Face model dir (Llama/Qwen2/Mistral/Mixtral/Baichuan2); --save writes HF "
         "layout; with --load, resume that model's checkpoints",
         0},
        {"threads", SL_FLAG_INT, &a.threads, 0, 1024, "compute threads (default: OpenMP's)", 0},
        {"sample-tokens", SL_FLAG_INT, &a.sample_tokens, 0, 1e6, "print a sample of N tokens at the end (0)",
         0},
        {"sample-prompt", SL_FLAG_STR, &a.sample_prompt, 0, 0, "prompt for the sample", 0},
        {"temperature", SL_FLAG_FLOAT, &a.temperature, 0, 100, "sample temperature (0.8)", 0},
        {"top-k", SL_FLAG_INT, &a.top_k, 0, 1 << 24, "sample top-k, 0 = off", 0},
        {"tensor-model-parallel-size", SL_FLAG_INT, &a.tp, 1, 4096,
         "tensor-parallel ranks (1; >1 not implemented yet)", 0},
        {"tp", SL_FLAG_INT, &a.tp, 1, 4096, "short for --tensor-model-parallel-size", 0},
        {"pipeline-model-parallel-size", SL_FLAG_INT, &a.pp, 1, 4096,
         "pipeline stages (1; >1 not implemented yet)", 0},
        {"pp", SL_FLAG_INT, &a.pp, 1, 4096, "short for --pipeline-model-parallel-size", 0},
        {"expert-model-parallel-size", SL_FLAG_INT, &a.ep, 1, 4096,
         "expert-parallel ranks (1; >1 needs MoE models)", 0},
        {"ep", SL_FLAG_INT, &a.ep, 1, 4096, "short for --expert-model-parallel-size", 0},
        {"bf16", SL_FLAG_BOOL, &a.bf16, 0, 1,
         "bf16 mixed precision, fp32 master weights and optimizer (GPT-2: bf16 matmul operands; --init-from "
         "models: PyTorch autocast numerics)",
         0},
        {"zero-stage", SL_FLAG_INT, &a.zero_stage, 0, 3,
         "0: DP all-reduce, 1: shard optimizer state, 2: + gradients, 3: + parameters", 0},
        {"ddp-bucket-size", SL_FLAG_INT, &a.bucket, 1, 1ll << 40, "gradient bucket size in elements (1Mi)",
         0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: suanli train --data-path DIR [flags]\n");
            sl_flags_usage(flags, nf, stdout);
            return 0;
        }
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli train: %s\n", sl_errmsg());
        return 2;
    }
#define BAD(...)                                                                                             \
    do {                                                                                                     \
        fprintf(stderr, "suanli train: " __VA_ARGS__);                                                       \
        fprintf(stderr, "\n");                                                                               \
        rc = 2;                                                                                              \
        goto out;                                                                                            \
    } while (0)
    int rc = 0;
    sl_dataset *train = NULL, *val = NULL;
    sl_tokenizer *tok = NULL;
    sl_model *m = NULL;
    sl_trainer tr = {0};
    FILE *metrics = NULL;
    int trainer_ok = 0, mesh_ok = 0;
    sl_comm *world = NULL;
    sl_mesh mesh;
    sl_dp *dp = NULL;
    sl_ckpt_writer *ckw = NULL;
    sl_comm_env env = {0};
    if (sl_comm_env_detect(&env) != SL_OK) BAD("%s", sl_errmsg());
    if (env.size > 1 && sl_comm_init_env(&world, NULL) != SL_OK) {
        fprintf(stderr, "suanli train: rank %d: %s\n", env.rank, sl_errmsg());
        return 1;
    }
    if (sl_mesh_init(&mesh, world, (sl_mesh_dims){(int)a.tp, (int)a.pp, (int)a.ep}) != SL_OK)
        BAD("%s", sl_errmsg());
    mesh_ok = 1;
    if (mesh.tp > 1 || mesh.pp > 1)
        BAD("tensor and pipeline parallelism are not implemented yet (--tp %d --pp %d); use data parallelism",
            mesh.tp, mesh.pp);
    if (mesh.ep > 1) BAD("--expert-model-parallel-size %d needs an MoE model; GPT-2 has no experts", mesh.ep);
    int rank0 = mesh.rank == 0;
    if (!rank0) a.sample_tokens = 0;
    if (world) {
        /* every rank must run the same configuration: compare a hash of the arguments */
        uint64_t h = 1469598103934665603ull, hs[1024];
        for (int i = 1; i < argc; i++)
            for (const char *c = argv[i];; c++) {
                h = (h ^ (uint8_t)*c) * 1099511628211ull;
                if (!*c) break;
            }
        if (mesh.world > 1024) BAD("world size %d exceeds 1024", mesh.world);
        if (sl_comm_all_gather(world, &h, hs, 1, SL_COMM_I64) != SL_OK) {
            fprintf(stderr, "suanli train: rank %d: config exchange: %s\n", mesh.rank, sl_errmsg());
            rc = 1;
            goto out;
        }
        for (int r = 0; r < mesh.world; r++)
            if (hs[r] != hs[0])
                BAD("rank %d was started with a different configuration than rank 0 (argument hash differs)",
                    r);
    }
    if (!a.data_path) BAD("--data-path is required");
    if (a.global_bs == 0) a.global_bs = a.micro_bs * mesh.dp;
    if (a.global_bs % (a.micro_bs * mesh.dp) != 0)
        BAD("--global-batch-size %lld is not a multiple of --micro-batch-size %lld x data-parallel size %d",
            (long long)a.global_bs, (long long)a.micro_bs, mesh.dp);
    if (a.min_lr < 0) a.min_lr = a.lr / 10;
    if (a.min_lr > a.lr) BAD("--min-lr %g exceeds --lr %g", a.min_lr, a.lr);
    if (a.decay_iters == 0) a.decay_iters = a.train_iters;
    if (a.warmup > a.decay_iters && a.decay_iters > 0)
        BAD("--lr-warmup-iters %lld exceeds the decay length %lld", (long long)a.warmup,
            (long long)a.decay_iters);
    if (a.threads > 0) sl_threads_set((int)a.threads);

    if (sl_dataset_open(a.data_path, "train", &train) != SL_OK) BAD("%s", sl_errmsg());
    if (sl_dataset_open(a.data_path, "val", &val) != SL_OK) BAD("%s", sl_errmsg());
    char tokpath[4096];
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", a.data_path);
    if (sl_tokenizer_load(tokpath, &tok) != SL_OK) BAD("%s", sl_errmsg());
    int data_vocab = sl_dataset_vocab_size(train);
    if (sl_dataset_vocab_size(val) != data_vocab)
        BAD("%s: train and val shards disagree on vocab size", a.data_path);

    sl_hf_info hf_info;
    if (a.init_from) {
        /* with --load: resume a checkpoint of this model (the architecture still comes from --init-from) */
        const char *arch_flags[] = {"num-layers", "num-attention-heads", "hidden-size", "vocab-size",
                                    "max-position-embeddings"};
        for (int i = 0; i < 5; i++)
            if (sl_flags_find(flags, nf, arch_flags[i])->set)
                BAD("--%s conflicts with --init-from (the architecture comes from %s/config.json)",
                    arch_flags[i], a.init_from);
        if (sl_hf_load(a.init_from, &m, &hf_info) != SL_OK) BAD("--init-from: %s", sl_errmsg());
        if (data_vocab > m->cfg.vocab_size)
            BAD("the data's vocab size %d exceeds the model's vocab_size %d (%s)", data_vocab,
                m->cfg.vocab_size, a.init_from);
        int lim = m->lcfg.sliding_window && m->lcfg.sliding_window < m->lcfg.max_seq_len
                      ? m->lcfg.sliding_window
                      : m->lcfg.max_seq_len;
        if (a.seq_length > lim)
            BAD("--seq-length %lld exceeds the model's %d positions (or sliding window)",
                (long long)a.seq_length, lim);
        if (sl_dataset_num_tokens(train) < a.seq_length + 1 || sl_dataset_num_tokens(val) < a.seq_length + 1)
            BAD("%s: a split has fewer than seq-length+1 = %lld tokens", a.data_path,
                (long long)a.seq_length + 1);
    }
    sl_gpt2_config cfg = {(int)a.num_layers, (int)a.num_heads, (int)a.hidden_size,
                          a.vocab_size ? (int)a.vocab_size : data_vocab,
                          (int)(a.max_pos ? a.max_pos : a.seq_length)};
    char ckdir[4096] = "", wpath[4200] = "";
    int resume = 0, init_from_weights = 0;
    if (a.init_from) {
        cfg = m->cfg;
        m->autocast_bf16 = a.bf16;
    }
    if (a.load) {
        snprintf(wpath, sizeof wpath, "%s/model.safetensors", a.load);
        const char *mem = sl_ckpt_mem_root();
        char memdir[4096];
        if (sl_ckpt_is_checkpoint(a.load)) {
            if (sl_ckpt_find_latest(a.load, ckdir, sizeof ckdir) != SL_OK) BAD("--load: %s", sl_errmsg());
            resume = 1;
        }
        if (mem && a.save && !strcmp(a.load, a.save) && sl_ckpt_is_checkpoint(mem) &&
            sl_ckpt_find_latest(mem, memdir, sizeof memdir) == SL_OK) {
            /* step dirs are named step-NNNNNNN: compare their steps */
            const char *ms = strrchr(memdir, '/'), *ds = resume ? strrchr(ckdir, '/') : NULL;
            if (ms && (!ds || strcmp(ms, ds) >= 0)) {
                snprintf(ckdir, sizeof ckdir, "%s", memdir);
                resume = 1;
            }
        }
        if (resume) {
            /* found above */
        } else if (a.init_from && !(a.save && !strcmp(a.load, a.save))) {
            BAD("--load %s with --init-from: no checkpoint (step-*/manifest.json) there", a.load);
        } else if (!a.init_from && access(wpath, F_OK) == 0) {
            init_from_weights = 1;
        } else if (a.save && !strcmp(a.load, a.save)) {
            printf("note: no checkpoint in %s yet; starting from scratch\n", a.load);
        } else {
            BAD("--load %s: no checkpoint (step-*/manifest.json) and no model.safetensors there", a.load);
        }
    }
    if (resume && a.init_from) {
        if (sl_model_check_config(ckdir, m) != SL_OK) BAD("--load: %s", sl_errmsg());
    } else if (resume || init_from_weights) {
        sl_gpt2_config lc;
        const char *cdir = resume ? ckdir : a.load;
        if (sl_model_load_config(cdir, &lc) != SL_OK) BAD("--load: %s", sl_errmsg());
        const char *names[] = {"num-layers", "num-attention-heads", "hidden-size", "vocab-size",
                               "max-position-embeddings"};
        int lv[] = {lc.n_layer, lc.n_head, lc.n_embd, lc.vocab_size, lc.max_seq_len};
        int fv[] = {cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.max_seq_len};
        for (int i = 0; i < 5; i++)
            if (sl_flags_find(flags, nf, names[i])->set && lv[i] != fv[i])
                BAD("--%s %d conflicts with %d in %s/config.json", names[i], fv[i], lv[i], cdir);
        cfg = lc;
    }
    if (cfg.vocab_size != data_vocab && !a.init_from)
        BAD("model vocab size %d does not match the data's vocab size %d (%s)", cfg.vocab_size, data_vocab,
            a.data_path);
    if (a.seq_length > cfg.max_seq_len)
        BAD("--seq-length %lld exceeds the model's position table %d", (long long)a.seq_length,
            cfg.max_seq_len);
    if (sl_dataset_num_tokens(train) < a.seq_length + 1 || sl_dataset_num_tokens(val) < a.seq_length + 1)
        BAD("%s: a split has fewer than seq-length+1 = %lld tokens", a.data_path,
            (long long)a.seq_length + 1);
    if (!a.init_from && sl_gpt2_new(&cfg, &m) != SL_OK) BAD("%s", sl_errmsg());
    if (a.init_from) {
        /* weights loaded above */
    } else if (init_from_weights) {
        if (sl_model_load_weights(m, wpath) != SL_OK) BAD("--load: %s", sl_errmsg());
    } else {
        sl_model_init_weights(m, (uint64_t)a.seed);
    }
    if (a.save && rank0) {
        if (sl_mkdirs(a.save) != SL_OK) BAD("--save: %s", sl_errmsg());
        char mp[4096];
        snprintf(mp, sizeof mp, "%s/metrics.jsonl", a.save);
        metrics = fopen(mp, resume ? "a" : "w");
        if (!metrics) BAD("--save: cannot write %s", mp);
    }

    m->compute_dtype = a.bf16 ? SL_BF16 : SL_F32;
    int B = (int)a.micro_bs, T = (int)a.seq_length, accum = (int)(a.global_bs / (a.micro_bs * mesh.dp));
    sl_trainer_config tc = {.B = B,
                            .T = T,
                            .accum = accum,
                            .dp_size = mesh.dp,
                            .lr = (float)a.lr,
                            .min_lr = (float)a.min_lr,
                            .clip = (float)a.clip,
                            .warmup = a.warmup,
                            .decay_iters = a.decay_iters,
                            .hp = {(float)a.beta1, (float)a.beta2, (float)a.eps, (float)a.wd}};
    if (sl_trainer_init(&tr, m, &tc) != SL_OK) {
        fprintf(stderr, "suanli train: %s\n", sl_errmsg());
        rc = 1;
        goto out;
    }
    trainer_ok = 1;
    if (mesh.dp > 1) {
        sl_dp_opts dpo = {(int)a.zero_stage, a.bucket, accum};
        if (sl_dp_new(&dp, &mesh, m, tr.graph, &dpo) != SL_OK) BAD("%s", sl_errmsg());
        tr.dp = dp;
    } else if (a.zero_stage > 0 && rank0) {
        printf("note: --zero-stage %lld has no effect with one data-parallel rank\n",
               (long long)a.zero_stage);
    }
    if (!rank0) {
        /* only rank 0 talks and writes */
        if (!freopen("/dev/null", "w", stdout)) BAD("cannot silence rank %d", mesh.rank);
    }
    printf("suanli train: %s L=%d H=%d C=%d V=%d T=%d | %.2fM params | micro-batch %d x accum %d x dp %d | "
           "%s | %d threads, %s\n",
           m->arch == SL_ARCH_GPT2 ? "GPT-2" : sl_arch_name(m->arch), cfg.n_layer, cfg.n_head, cfg.n_embd,
           cfg.vocab_size, T, (double)m->numel / 1e6, B, accum, mesh.dp,
           a.bf16 ? "bf16 mixed precision" : "fp32", sl_threads_get(), sl_cpu_isa_name());
    if (dp) {
        sl_dp_memory mem;
        sl_dp_memory_report(dp, &mem);
        printf("data parallel: %d ranks, ZeRO-%lld, %d gradient buckets | per rank: params %.1f MiB", mesh.dp,
               (long long)a.zero_stage, sl_dp_num_buckets(dp), mem.param_bytes / 1048576.0);
        printf(", grads %.1f MiB (+ %.1f MiB reduced shard), optimizer state %.1f MiB",
               mem.grad_bytes / 1048576.0, mem.grad_shard_bytes / 1048576.0, mem.optim_bytes / 1048576.0);
        if (mem.slot_bytes) printf(", slots %.1f MiB", mem.slot_bytes / 1048576.0);
        printf("\n");
    }
    printf("activation memory: planned %.1f MiB (naive sum %.1f MiB) | data: %lld train / %lld val tokens\n",
           tr.plan.planned_bytes / 1048576.0, tr.plan.naive_bytes / 1048576.0,
           (long long)sl_dataset_num_tokens(train), (long long)sl_dataset_num_tokens(val));
    fflush(stdout);

    int64_t pending_step = -1;
    char model_json[512], layout_json[1024];
    snprintf(
        model_json, sizeof model_json,
        "{\"architecture\": \"%s\", \"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, \"vocab_size\": %d, "
        "\"max_seq_len\": %d}",
        sl_arch_name(m->arch), cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.max_seq_len);
    int64_t step = 0;
    if (resume) {
        sl_ckpt_state cst;
        sl_ckpt_seg *segs = NULL;
        double t0 = sl_time_sec();
        sl_status ls = sl_trainer_ckpt_state(&tr, mesh.rank, mesh.world, &cst, &segs);
        if (ls == SL_OK) ls = sl_ckpt_load(ckdir, &cst);
        free(segs);
        if (ls != SL_OK) BAD("--load: %s", sl_errmsg());
        step = cst.step;
        sl_trainer_set_adam_t(&tr, cst.adam_t);
        printf("resumed from %s at step %lld (%.2f s)\n", ckdir, (long long)step, sl_time_sec() - t0);
    }
    if (a.save && a.save_interval > 0) {
        ckw = sl_ckpt_writer_new();
        if (!ckw) BAD("out of memory");
        sl_ckpt_state cst;
        sl_ckpt_seg *segs = NULL;
        size_t need = 0;
        if (sl_trainer_ckpt_state(&tr, mesh.rank, mesh.world, &cst, &segs) == SL_OK)
            for (int k = 0; k < cst.nseg; k++)
                need +=
                    (size_t)cst.seg[k].len * (size_t)((cst.write_params ? 1 : 0) + (cst.write_optim ? 2 : 0));
        free(segs);
        if (sl_ckpt_writer_reserve(ckw, need) != SL_OK) BAD("--save-interval: %s", sl_errmsg());
        tr.pre_update = wait_snapshot;
        tr.pre_update_user = ckw;
    }
    batch_src tsrc = {train, B, T, (uint64_t)a.seed},
              vsrc = {val, B, T, (uint64_t)a.seed ^ 0x9e3779b97f4a7c15ull};
    double t_start = sl_time_sec(), t_steps = 0;
    float val_loss = NAN;
    const char *fault_at = getenv("SUANLI_FAULT_KILL_AT_STEP"), *fault_rank = getenv("SUANLI_FAULT_RANK"),
               *restart = getenv("SUANLI_RESTART_COUNT");
    for (; step < a.train_iters; step++) {
        sl_step_stats ss;
        if (sl_trainer_step(&tr, step, batch_fn, &tsrc, &ss) != SL_OK) {
            fprintf(stderr, "suanli train: step %lld: %s\n", (long long)step, sl_errmsg());
            rc = 1;
            goto out;
        }
        if (!isfinite(ss.loss)) {
            fprintf(stderr, "suanli train: step %lld: loss is %f; stopping\n", (long long)step, ss.loss);
            rc = 1;
            goto out;
        }
        t_steps += ss.seconds;
        double tps = (double)B * T * accum * mesh.dp / ss.seconds;
        int do_eval = (a.eval_interval > 0 && (step + 1) % a.eval_interval == 0) || step + 1 == a.train_iters;
        int timed_out = a.exit_mins > 0 && sl_time_sec() - t_start > a.exit_mins * 60.0;
        if (world && a.exit_mins > 0) {
            /* all ranks must stop at the same step: rank 0 decides */
            int32_t flag = timed_out;
            if (sl_comm_broadcast(world, &flag, &flag, 1, SL_COMM_I32, 0) != SL_OK) {
                fprintf(stderr, "suanli train: rank %d: %s\n", mesh.rank, sl_errmsg());
                rc = 1;
                goto out;
            }
            timed_out = flag;
        }
        if (timed_out) do_eval = 1;
        if (do_eval) {
            if (sl_trainer_eval(&tr, batch_fn, &vsrc, (int)a.eval_iters, &val_loss) != SL_OK) {
                fprintf(stderr, "suanli train: eval: %s\n", sl_errmsg());
                rc = 1;
                goto out;
            }
        }
        if ((step + 1) % a.log_interval == 0 || do_eval || step == 0) {
            char eta[32];
            fmt_eta(t_steps / (double)(step + 1) * (double)(a.train_iters - step - 1), eta, sizeof eta);
            printf("step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.1f ms/step | %.0f tokens/s | "
                   "ETA %s",
                   (long long)step + 1, (long long)a.train_iters, ss.loss, ss.lr, ss.grad_norm,
                   ss.seconds * 1e3, tps, eta);
            if (dp) printf(" | comm wait %.1f ms", ss.comm_wait_sec * 1e3);
            if (do_eval) printf(" | val loss %.4f", val_loss);
            printf("\n");
            fflush(stdout);
        }
        if (metrics) {
            fprintf(
                metrics,
                "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms_per_step\": %.3f, "
                "\"tokens_per_s\": %.1f",
                (long long)step + 1, ss.loss, ss.lr, ss.grad_norm, ss.seconds * 1e3, tps);
            if (do_eval) fprintf(metrics, ", \"val_loss\": %.6f", val_loss);
            if (dp) fprintf(metrics, ", \"comm_wait_ms\": %.3f", ss.comm_wait_sec * 1e3);
            fprintf(metrics, "}\n");
            fflush(metrics);
        }
        if (ckw) {
            if (ckpt_poll(ckw, world, &mesh, a.save, &pending_step, 0, (int)a.save_keep, model_json,
                          layout_json) != SL_OK) {
                rc = 1;
                goto out;
            }
            if ((step + 1) % a.save_interval == 0 && pending_step >= 0 &&
                ckpt_poll(ckw, world, &mesh, a.save, &pending_step, 1, (int)a.save_keep, model_json,
                          layout_json) != SL_OK) {
                rc = 1; /* the previous save is still being written: finish it first */
                goto out;
            }
            if ((step + 1) % a.save_interval == 0) {
                sl_ckpt_state cst;
                sl_ckpt_seg *segs = NULL;
                sl_status cs = sl_trainer_ckpt_state(&tr, mesh.rank, mesh.world, &cst, &segs);
                cst.step = step + 1;
                cst.seed = (uint64_t)a.seed;
                snprintf(
                    layout_json, sizeof layout_json,
                    "{\"world\": %d, \"dp\": %d, \"tp\": %d, \"pp\": %d, \"ep\": %d, \"zero_stage\": %lld, "
                    "\"adam_t\": %lld, \"seed\": %lld, \"data_position\": {\"step\": %lld, \"seed\": %lld}, "
                    "\"rng\": \"philox4x32-10 counter = step\", \"micro_batch_size\": %d, "
                    "\"global_batch_size\": %lld, "
                    "\"seq_length\": %d}",
                    mesh.world, mesh.dp, mesh.tp, mesh.pp, mesh.ep, (long long)(dp ? a.zero_stage : 0),
                    (long long)cst.adam_t, (long long)a.seed, (long long)(step + 1), (long long)a.seed, B,
                    (long long)a.global_bs, T);
                if (cs == SL_OK) cs = sl_ckpt_save_begin(ckw, a.save, &cst);
                free(segs);
                if (cs != SL_OK) {
                    fprintf(stderr, "suanli train: rank %d: checkpoint: %s\n", mesh.rank, sl_errmsg());
                    rc = 1;
                    goto out;
                }
                if (rank0) {
                    /* the model config travels with the checkpoint */
                    char cp[4300];
                    snprintf(cp, sizeof cp, "%s/step-%07lld.tmp%s/config.json", a.save, (long long)(step + 1),
                             restart ? restart : "");
                    sl_file_write_atomic(cp, model_json, strlen(model_json));
                    const char *mem = sl_ckpt_mem_root();
                    if (mem) {
                        snprintf(cp, sizeof cp, "%s/step-%07lld.tmp%s", mem, (long long)(step + 1),
                                 restart ? restart : "");
                        if (sl_mkdirs(cp) == SL_OK) {
                            strncat(cp, "/config.json", sizeof cp - strlen(cp) - 1);
                            sl_file_write_atomic(cp, model_json, strlen(model_json));
                        }
                    }
                }
                pending_step = step + 1;
            }
        }
        if (fault_at && atoll(fault_at) == step + 1 && (!restart || !strcmp(restart, "0")) &&
            (!fault_rank || atoi(fault_rank) == mesh.rank)) {
            fprintf(stderr, "suanli train: rank %d: SUANLI_FAULT_KILL_AT_STEP=%s: killing myself\n",
                    mesh.rank, fault_at);
            fflush(stderr);
            raise(SIGKILL);
        }
        const char *hang_at = getenv("SUANLI_FAULT_HANG_AT_STEP");
        if (hang_at && atoll(hang_at) == step + 1 && (!restart || !strcmp(restart, "0")) &&
            (!fault_rank || atoi(fault_rank) == mesh.rank)) {
            fprintf(stderr, "suanli train: rank %d: SUANLI_FAULT_HANG_AT_STEP=%s: stopping myself\n",
                    mesh.rank, hang_at);
            fflush(stderr);
            raise(SIGSTOP); /* a hung rank: alive but silent */
        }
        if (timed_out) {
            printf("stopping after %.1f minutes (--exit-duration-in-mins)\n", (sl_time_sec() - t_start) / 60);
            step++;
            break;
        }
    }
    if (ckw && ckpt_poll(ckw, world, &mesh, a.save, &pending_step, 1, (int)a.save_keep, model_json,
                         layout_json) != SL_OK) {
        rc = 1;
        goto out;
    }
    if (dp && sl_dp_gather_params(dp) != SL_OK) { /* ZeRO-3: whole weights for saving and sampling */
        fprintf(stderr, "suanli train: rank %d: gathering parameters: %s\n", mesh.rank, sl_errmsg());
        rc = 1;
        goto out;
    }
    printf("trained %lld steps in %.1f s; final val loss %.4f\n", (long long)step, sl_time_sec() - t_start,
           val_loss);
    if (a.save && rank0) {
        char extra[512], tp[4096];
        snprintf(extra, sizeof extra,
                 "{\"steps\": %lld, \"val_loss\": %.6f, \"seq_length\": %lld, \"seed\": %lld}",
                 (long long)step, isfinite(val_loss) ? val_loss : -1.0, (long long)a.seq_length,
                 (long long)a.seed);
        snprintf(tp, sizeof tp, "%s/tokenizer.json", a.save);
        sl_status sst = m->arch == SL_ARCH_GPT2 ? sl_model_save(m, a.save, extra)
                                                : sl_hf_save(m, a.save, SL_F32, &hf_info);
        char hft[4096];
        const char *tsrc = tokpath; /* an HF model keeps its own tokenizer.json */
        snprintf(hft, sizeof hft, "%s/tokenizer.json", a.init_from ? a.init_from : "");
        FILE *hf_tok = a.init_from ? fopen(hft, "r") : NULL;
        if (hf_tok) {
            fclose(hf_tok);
            tsrc = hft;
        }
        if (sst != SL_OK || copy_file(tsrc, tp) != SL_OK) {
            fprintf(stderr, "suanli train: save: %s\n", sl_errmsg());
            rc = 1;
            goto out;
        }
        printf("saved %s/model.safetensors, config.json, tokenizer.json, metrics.jsonl\n", a.save);
    }
    if (a.sample_tokens > 0) {
        printf("---- sample ----\n");
        rc = sl_cli_print_sample(m, tok, a.sample_prompt, (int)a.sample_tokens, (float)a.temperature,
                                 (int)a.top_k, (uint64_t)a.seed);
    }
out:
    sl_ckpt_writer_free(ckw);
    if (metrics) fclose(metrics);
    sl_dp_free(dp);
    if (trainer_ok) sl_trainer_free(&tr);
    if (mesh_ok) sl_mesh_free(&mesh);
    if (rc != 0 && world) sl_comm_abort(world);
    sl_comm_free(world);
    sl_model_free(m);
    sl_tokenizer_free(tok);
    sl_dataset_close(train);
    sl_dataset_close(val);
    return rc;
#undef BAD
}
