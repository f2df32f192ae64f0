/* suanli bench train — ms/step, tokens/s and MFU of GPT-2 training steps on synthetic tokens.
 * MFU uses the host's peak for the GEMMs' dtype measured in the same run (sl_bench_fma_peak, or
 * sl_bench_bf16_peak with --bf16, from bench_ops.c; --fp16's GEMMs widen f16 to fp32 panels, Note [f16
 * GEMM], so against the fp32 peak), also with --device (a device's own peak is not known here; on PoCL's
 * CPU device it is the same host). --fp16 trains with dynamic loss scaling as `suanli train --fp16` (Note
 * [Dynamic loss scaling]; overflow steps skip the update and are counted). Peak RSS is the process's
 * ru_maxrss. */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_ops.h"
#include "bench_train.h"
#include "cli/flags.h"
#include "suanli/parallel.h"
#include "suanli/train.h"

typedef struct {
    int V;
    int64_t n; /* B x T */
} synth;

/* the same random micro-batch every step (the one the trainer's buffers were filled with below): the
 * pipeline schedule passes buffers of its own, so fill whatever we are given */
static sl_status synth_batch(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    synth *s = u;
    (void)step;
    (void)micro;
    for (int64_t i = 0; i < s->n; i++) {
        ids[i] = (int32_t)(sl_rng_u64(7, 0, (uint64_t)i) % (uint64_t)s->V);
        tg[i] = (int32_t)(sl_rng_u64(7, 1, (uint64_t)i) % (uint64_t)s->V);
    }
    return SL_OK;
}

/* --busy: a neighbour process that spins on one core until killed (and dies with us) */
static pid_t start_neighbour(void) {
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(0); /* the parent died before prctl: no one would kill us */
        volatile unsigned long x = 0;
        for (;;) x++;
    }
    return pid;
}

static double cpu_sec(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the timed steps (after `warm` untimed ones), with the --busy neighbour running throughout */
typedef struct {
    double *ts; /* seconds of each timed step */
    double wait_tot, step_tot, tp_tot, pipe_tot, tp_bytes, cpu_step, wall_mean;
    int64_t thr_sum;
    float loss, loss_scale; /* the last step's */
    int64_t skipped;        /* overflow steps (--fp16), timed ones only */
} timed;

static int run_timed(sl_trainer *tr, sl_tp *tp, synth *s, int64_t warm, int64_t steps, int busy, timed *r) {
    pid_t neighbour = busy ? start_neighbour() : 0;
    if (neighbour < 0) {
        fprintf(stderr, "suanli bench train: --busy: cannot fork the neighbour process\n");
        return 1;
    }
    double cpu0 = 0, wall0 = 0, tp_sec;
    int rc = 0;
    for (int64_t i = 0; i < warm + steps && !rc; i++) {
        if (i == warm) {
            cpu0 = cpu_sec();
            wall0 = sl_time_sec();
        }
        sl_step_stats ss;
        if (sl_trainer_step(tr, i, synth_batch, s, &ss) != SL_OK) {
            fprintf(stderr, "suanli bench train: %s\n", sl_errmsg());
            rc = 1;
            break;
        }
        sl_tp_take_stats(tp, &tp_sec, &r->tp_bytes);
        if (i >= warm) {
            r->thr_sum += ss.threads;
            r->tp_tot += tp_sec;
            r->pipe_tot += ss.pipe_wait_sec;
            r->ts[i - warm] = ss.seconds;
            r->wait_tot += ss.comm_wait_sec;
            r->step_tot += ss.seconds;
            r->skipped += ss.skipped;
        }
        r->loss = ss.loss;
        r->loss_scale = ss.loss_scale;
    }
    r->cpu_step = (cpu_sec() - cpu0) / (double)steps;
    r->wall_mean = (sl_time_sec() - wall0) / (double)steps;
    if (neighbour > 0) {
        kill(neighbour, SIGKILL);
        waitpid(neighbour, NULL, 0);
    }
    return rc;
}

/* the per-rank DP memory record (after the timing record) */
static void print_dp_memory(sl_dp *dp, int json, int64_t zero) {
    sl_dp_memory mem;
    sl_dp_memory_report(dp, &mem);
    printf(json ? "{\"bench\": \"train_dp_memory\", \"zero_stage\": %lld, \"param_mib\": %.1f, "
                  "\"slot_mib\": %.1f, "
                  "\"grad_mib\": %.1f, \"grad_shard_mib\": %.1f, \"optim_mib\": %.1f}\n"
                : "per rank (ZeRO-%lld): params %.1f MiB, slots %.1f MiB, grads %.1f MiB, grad shard "
                  "%.1f MiB, "
                  "optimizer %.1f MiB\n",
           (long long)zero, mem.param_bytes / 1048576.0, mem.slot_bytes / 1048576.0,
           mem.grad_bytes / 1048576.0, mem.grad_shard_bytes / 1048576.0, mem.optim_bytes / 1048576.0);
}

/* --plan-only: the activation arena the planner reserved for one step on this rank */
static void print_plan(const sl_gpt2_config *c, int64_t B, const sl_mesh *mesh, const sl_model *m,
                       const sl_trainer *tr) {
    printf("{\"bench\": \"train_plan\", \"L\": %d, \"NH\": %d, \"C\": %d, \"V\": %d, \"B\": %lld, \"T\": %d, "
           "\"tp\": %d, \"pp\": %d, \"dp\": %d, \"sp\": %d, \"activation_mib\": %.2f, \"naive_mib\": %.2f, "
           "\"param_mib_per_rank\": %.2f, \"rank\": %d, \"pp_rank\": %d, \"graph_slots\": %d, "
           "\"zero_bubble\": %d}\n",
           c->n_layer, c->n_head, c->n_embd, c->vocab_size, (long long)B, c->max_seq_len, mesh->tp, mesh->pp,
           mesh->dp, m->sp, tr->plan.planned_bytes / 1048576.0, tr->plan.naive_bytes / 1048576.0,
           m->numel * 4.0 / 1048576.0, mesh->rank, mesh->pp_rank, tr->pipe ? sl_pipeline_slots(tr->pipe) : 1,
           tr->cfg.pipe_schedule == SL_PIPE_ZB_H1);
}

/* the run's objects, freed; 0 */
static int free_run(sl_dp *dp, sl_tp *tp, sl_trainer *tr, sl_model *m, sl_mesh *mesh, sl_comm *world) {
    sl_dp_free(dp);
    sl_tp_free(tp);
    sl_trainer_free(tr);
    sl_model_free(m);
    sl_mesh_free(mesh);
    sl_comm_free(world);
    return 0;
}

/* the trainer's host batch: n random ids and targets below V (the same every run) */
static void fill_batch(sl_trainer *tr, int64_t n, int64_t V) {
    for (int64_t i = 0; i < n; i++) {
        tr->ids_buf[i] = (int32_t)(sl_rng_u64(7, 0, (uint64_t)i) % (uint64_t)V);
        tr->tg_buf[i] = (int32_t)(sl_rng_u64(7, 1, (uint64_t)i) % (uint64_t)V);
    }
}

/* --recompute-granularity / --recompute-method as sl_trainer_config.recompute, or -1 (said why) */
static int recompute_choice(const char *gran, const char *method) {
    if (gran && strcmp(gran, "full")) {
        fprintf(stderr, "suanli bench train: --recompute-granularity: expected full, got '%s'\n", gran);
        return -1;
    }
    if (method && strcmp(method, "uniform") && strcmp(method, "block")) {
        fprintf(stderr, "suanli bench train: --recompute-method: expected uniform or block, got '%s'\n",
                method);
        return -1;
    }
    return !gran                                ? SL_RECOMPUTE_NONE
           : method && !strcmp(method, "block") ? SL_RECOMPUTE_BLOCK
                                                : SL_RECOMPUTE_UNIFORM;
}

/* data parallelism over the mesh's DP group (none with one rank), as suanli train sets it up */
static int make_dp(sl_dp **dp, sl_mesh *mesh, sl_model *m, sl_trainer *tr, int64_t zero, int64_t bucket,
                   int64_t accum) {
    if (mesh->dp <= 1) return 0;
    sl_dp_opts o = {.zero_stage = (int)zero,
                    .bucket_elems = bucket,
                    .accum = (int)accum,
                    .ready = sl_trainer_dp_ready, /* as suanli train: overlap under PP */
                    .ready_user = tr};
    if (sl_dp_new(dp, mesh, m, tr->graph, &o) != SL_OK) {
        fprintf(stderr, "suanli bench train: %s\n", sl_errmsg());
        return 1;
    }
    tr->dp = *dp;
    return 0;
}

sl_trainer_config sl_bench_trainer_config(int64_t B, int64_t T, int64_t accum, sl_mesh *mesh, int zb,
                                          int rc_kind, int64_t rc_layers, int fp16, double init_scale) {
    sl_trainer_config tc = {.B = (int)B,
                            .T = (int)T,
                            .accum = (int)accum,
                            .dp_size = mesh->dp,
                            .lr = 1e-4f,
                            .min_lr = 1e-5f,
                            .clip = 1.0f,
                            .warmup = 0,
                            .decay_iters = 1000,
                            .hp = {0.9f, 0.95f, 1e-8f, 0.1f},
                            .mesh = mesh,
                            .dropout_seed = 1,
                            .pipe_schedule = zb ? SL_PIPE_ZB_H1 : SL_PIPE_1F1B,
                            .recompute = rc_kind,
                            .recompute_layers = (int)rc_layers};
    if (fp16) tc.loss_scale = (sl_loss_scale_config){(float)init_scale, 1.0f, 1000, 2};
    return tc;
}

/* the text report's last lines: the thread governor, and under --fp16 the loss scale */
static void print_text_tail(const sl_trainer *tr, double thr_mean, int busy, const timed *r, int64_t steps,
                            int fp16) {
    printf("threads: mean %.2f per step (%s, %lld switches, %lld probes, %lld held back by the load, "
           "%lld steps bound in the shared mode)%s; CPU %.1f ms/step; mean wall %.1f ms/step\n",
           thr_mean, tr->gov.on ? "adaptive" : "fixed", (long long)tr->gov.switches,
           (long long)tr->gov.probes, (long long)tr->gov.gated, (long long)tr->gov.shared_steps,
           busy ? "; a spinning neighbour process ran throughout" : "", r->cpu_step * 1e3,
           r->wall_mean * 1e3);
    if (fp16)
        printf("fp16 loss scale %g after the run; %lld of %lld timed steps skipped (overflow)\n",
               r->loss_scale, (long long)r->skipped, (long long)steps);
}

int sl_bench_train(int argc, char **argv) {
    int64_t L = 12, NH = 12, C = 768, V = 50257, B = 4, T = 64, steps = 5, warm = 1, threads = 2, accum = 1,
            zero = 0, bucket = 1 << 20, tpn = 1, ppn = 1, pfirst = 0, plast = 0, lanes = 1;
    int json = 0, bf16 = 0, fp16 = 0, sp = 0, plan_only = 0, busy = 0, fixed = 0, zb = 0;
    double pa = 0, ph = 0, init_scale = 4294967296.0;
    const char *device = "cpu", *recompute = NULL, *rc_method = NULL;
    int64_t rc_layers = 0;
    sl_flag flags[] = {
        {"device", SL_FLAG_STR, &device, 0, 0, "backend the model runs on: cpu (default), opencl[:N], strict",
         0},
        {"num-layers", SL_FLAG_INT, &L, 1, 1024, "(12)", 0},
        {"num-attention-heads", SL_FLAG_INT, &NH, 1, 1024, "(12)", 0},
        {"hidden-size", SL_FLAG_INT, &C, 1, 65536, "(768)", 0},
        {"vocab-size", SL_FLAG_INT, &V, 2, 1 << 24, "(50257)", 0},
        {"micro-batch-size", SL_FLAG_INT, &B, 1, 4096, "(4)", 0},
        {"seq-length", SL_FLAG_INT, &T, 1, 1 << 16, "(64)", 0},
        {"steps", SL_FLAG_INT, &steps, 1, 100000, "timed steps (5)", 0},
        {"warmup", SL_FLAG_INT, &warm, 0, 1000, "untimed steps (1)", 0},
        {"threads", SL_FLAG_INT, &threads, 1, 1024, "(2)", 0},
        {"accum", SL_FLAG_INT, &accum, 1, 4096, "micro-batches per step and rank (1)", 0},
        {"micro-batch-lanes", SL_FLAG_INT, &lanes, 1, 16,
         "the micro-batch's rows over this many graphs side by side (Note [Micro-batch lanes]; 1)", 0},
        {"zero-stage", SL_FLAG_INT, &zero, 0, 3, "ZeRO stage under DP (0)", 0},
        {"tensor-model-parallel-size", SL_FLAG_INT, &tpn, 1, 64, "TP ranks (1); world = dp x pp x tp", 0},
        {"pipeline-model-parallel-size", SL_FLAG_INT, &ppn, 1, 64, "pipeline stages (1); 1F1B over --accum",
         0},
        {"decoder-first-pipeline-num-layers", SL_FLAG_INT, &pfirst, 1, 1024,
         "layers on the first stage (uneven split; Note [Uneven pipeline stages])", 0},
        {"decoder-last-pipeline-num-layers", SL_FLAG_INT, &plast, 1, 1024, "layers on the last stage", 0},
        {"enable-zero-bubble", SL_FLAG_BOOL, &zb, 0, 1,
         "the ZB-H1 pipeline schedule instead of 1F1B (Note [Zero-bubble schedule])", 0},
        {"ddp-bucket-size", SL_FLAG_INT, &bucket, 1, 1ll << 40, "gradient bucket size in elements (1Mi)", 0},
        {"json", SL_FLAG_BOOL, &json, 0, 1, "machine-readable output", 0},
        {"sequence-parallel", SL_FLAG_BOOL, &sp, 0, 1, "sequence parallelism (with TP)", 0},
        {"plan-only", SL_FLAG_BOOL, &plan_only, 0, 1, "print the planned activation memory per rank and stop",
         0},
        {"bf16", SL_FLAG_BOOL, &bf16, 0, 1, "bf16 mixed precision", 0},
        {"fp16", SL_FLAG_BOOL, &fp16, 0, 1,
         "fp16 mixed precision with dynamic loss scaling (as train --fp16; MFU against the fp32 peak: the "
         "f16 GEMMs run widened)",
         0},
        {"initial-loss-scale", SL_FLAG_FLOAT, &init_scale, 1, 1e38, "--fp16: starting loss scale (2^32)", 0},
        {"busy", SL_FLAG_BOOL, &busy, 0, 1,
         "start a neighbour process that spins on one core for the whole run (a shared machine)", 0},
        {"fixed-threads", SL_FLAG_BOOL, &fixed, 0, 1,
         "keep --threads for every step (no adaptation: Note [Threads on a shared machine])", 0},
        {"attention-dropout", SL_FLAG_FLOAT, &pa, 0, 0.99, "dropout of the attention probabilities (0)", 0},
        {"hidden-dropout", SL_FLAG_FLOAT, &ph, 0, 0.99, "dropout of the hidden states (0)", 0},
        {"recompute-granularity", SL_FLAG_STR, &recompute, 0, 0,
         "full: every layer computed again in the backward (Note [Full recomputation]); MFU stays the "
         "model's 6 N FLOPs per token, as Megatron's",
         0},
        {"recompute-method", SL_FLAG_STR, &rc_method, 0, 0,
         "with --recompute-granularity full: uniform (default) or block (Megatron's)", 0},
        {"recompute-num-layers", SL_FLAG_INT, &rc_layers, 1, 1 << 20,
         "with --recompute-granularity full: layers per checkpoint (uniform) or recomputed (block) (1)", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    if (sl_flags_help(flags, nf, argc, argv, "usage: suanli bench train [flags]")) return 0;
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli bench train: %s\n", sl_errmsg());
        return 2;
    }
    if (bf16 && fp16) {
        fprintf(stderr, "suanli bench train: --fp16 and --bf16 exclude each other\n");
        return 2;
    }
    int rc_kind = recompute_choice(recompute, rc_method);
    if (rc_kind < 0) return 2;
    sl_threads_set((int)threads);
    /* under `suanli run -n N` (or mpirun/srun): data parallel, `accum` micro-batches per rank per step */
    sl_comm_env env = {0};
    sl_comm *world = NULL;
    sl_mesh mesh;
    sl_dp *dp = NULL;
    if (sl_comm_env_detect(&env) == SL_OK && env.size > 1 && sl_comm_init_env(&world, NULL) != SL_OK) {
        fprintf(stderr, "suanli bench train: %s\n", sl_errmsg());
        return 1;
    }
    if (sl_mesh_init(&mesh, world, (sl_mesh_dims){(int)tpn, (int)ppn, 1}) != SL_OK) {
        fprintf(stderr, "suanli bench train: %s\n", sl_errmsg());
        return 2;
    }
    /* --plan-only: every rank prints its record (the stages differ); else rank 0 reports */
    if (mesh.rank != 0 && !plan_only && !freopen("/dev/null", "w", stdout)) return 1;
    sl_gpt2_config cfg = {(int)L, (int)NH, (int)C, (int)V, (int)T};
    sl_model *m;
    sl_backend *be = sl_backend_get(device);
    if (!be) {
        fprintf(stderr, "suanli bench train: --device %s: %s\n", device, sl_errmsg());
        return 2;
    }
    sl_tp *tp = NULL;
    sl_model_split split = {mesh.tp, mesh.tp_rank, mesh.pp, mesh.pp_rank, 1, (int)pfirst, (int)plast, 1, 0,
                            0};
    if (sl_gpt2_new_par(&cfg, be, &split, &m) != SL_OK || (mesh.tp > 1 && sl_tp_new(&tp, &mesh) != SL_OK)) {
        fprintf(stderr, "suanli bench train: %s\n", sl_errmsg());
        return 2;
    }
    sl_model_init_weights(m, 1);
    m->sp = sp && mesh.tp > 1;
    m->compute_dtype = bf16 ? SL_BF16 : fp16 ? SL_F16 : SL_F32;
    m->attention_dropout = (float)pa;
    m->hidden_dropout = (float)ph;
    sl_trainer tr;
    sl_trainer_config tc =
        sl_bench_trainer_config(B, T, accum, &mesh, zb, rc_kind, rc_layers, fp16, init_scale);
    tc.lanes = (int)lanes;
    sl_status tst = sl_trainer_init(&tr, m, &tc);
    if (tst != SL_OK) {
        fprintf(stderr, "suanli bench train: %s\n", sl_errmsg());
        sl_model_free(m);
        return tst == SL_ERR_INVALID ? 2 : 1;
    }
    if (tp && sl_trainer_set_tp(&tr, tp) != SL_OK) {
        fprintf(stderr, "suanli bench train: %s\n", sl_errmsg());
        return 1;
    }
    if (make_dp(&dp, &mesh, m, &tr, zero, bucket, accum) != 0) return 1;
    if (plan_only) { /* what the planner reserved for one step's activations on this rank, and stop */
        print_plan(&cfg, B, &mesh, m, &tr);
        return free_run(dp, tp, &tr, m, &mesh, world);
    }
    fill_batch(&tr, B * T, V);
    if (fixed) tr.gov.on = 0;
    timed r = {.ts = malloc(sizeof(double) * (size_t)steps)};
    synth s = {(int)V, B * T};
    if (!r.ts || run_timed(&tr, tp, &s, warm, steps, busy, &r) != 0) return 1;
    double *ts = r.ts, wait_tot = r.wait_tot, step_tot = r.step_tot, tp_tot = r.tp_tot, pipe_tot = r.pipe_tot,
           tp_bytes = r.tp_bytes, cpu_step = r.cpu_step, wall_mean = r.wall_mean;
    float loss = r.loss;
    double thr_mean = (double)r.thr_sum / (double)steps;
    int early = dp ? sl_dp_take_early_launches(dp) : 0; /* buckets launched during backward, all steps */
    qsort(ts, (size_t)steps, sizeof(double), cmp_d);
    double med = ts[steps / 2];
    double tps = (double)(B * T) * (double)accum * mesh.dp / med;
    double wait_frac = step_tot > 0 ? wait_tot / step_tot : 0;
    double flops = sl_gpt2_flops_per_token(&cfg, (int)T) * tps;
    /* MFU against the peak of the dtype the GEMMs run in (PaLM's convention): bf16-mixed against the
     * measured vdpbf16ps peak, fp16-mixed against the fp32 FMA peak (the f16 GEMM widens its operands:
     * Note [f16 GEMM]); mfu_f32_peak keeps the fp32 figure for comparison */
    double peak32 = sl_bench_fma_peak((int)threads) * 1e9 * mesh.world; /* GFLOP/s -> FLOP/s, all ranks */
    double peak = bf16 ? sl_bench_bf16_peak((int)threads) * 1e9 * mesh.world : peak32;
    const char *dtname = bf16 ? "bf16-mixed" : fp16 ? "fp16-mixed" : "f32";
    const char *peakname = bf16 ? "bf16" : fp16 ? "fp32 (f16 widened)" : "fp32";
    struct rusage ru;
    double rss_mib = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : -1;
    double pipe_frac = step_tot > 0 ? pipe_tot / step_tot : 0;
    double tp_frac = step_tot > 0 ? tp_tot / step_tot : 0;
    double mfu = peak > 0 ? flops / peak : 0;
    int bal[2] = {0, 0}; /* the split the head's cost suggests (Note [Uneven pipeline stages]) */
    sl_pp_balanced_split((int)L, mesh.pp, sl_gpt2_head_layers(&cfg, (int)T), &bal[0], &bal[1]);
    if (json)
        printf(
            "{\"bench\": \"train\", \"device\": \"%s\", \"model\": \"gpt2\", \"L\": %lld, \"NH\": %lld, "
            "\"C\": %lld, \"V\": "
            "%lld, \"B\": %lld, "
            "\"T\": %lld, \"threads\": %lld, \"dtype\": \"%s\", \"ms_per_step\": %.2f, \"tokens_per_s\": "
            "%.2f, "
            "\"gflops\": %.2f, \"peak_gflops\": %.2f, \"mfu\": %.4f, \"activation_mib\": %.1f, \"loss\": "
            "%.4f, "
            "\"dp\": %d, \"accum\": %lld, \"zero_stage\": %lld, \"comm_wait_fraction\": %.4f, \"tp\": %d, "
            "\"tp_comm_fraction\": %.4f, \"tp_comm_mib_per_step\": %.2f, \"param_mib_per_rank\": %.1f, "
            "\"pp\": %d, \"pipe_wait_fraction\": %.4f, \"bubble_theory\": %.4f, \"first_layers\": %d, "
            "\"last_layers\": %d, \"balanced_first_layers\": %d, \"balanced_last_layers\": %d, \"busy\": %d, "
            "\"adaptive_threads\": %d, \"mean_threads\": %.2f, \"thread_switches\": %lld, \"probes\": "
            "%lld, \"cpu_ms_per_step\": %.2f, \"wall_ms_per_step_mean\": %.2f, "
            "\"tokens_per_s_mean\": %.2f, \"attention_dropout\": %g, \"hidden_dropout\": %g, "
            "\"mfu_f32_peak\": %.4f, \"peak_rss_mib\": %.1f, \"zero_bubble\": %d, \"probes_held_back\": "
            "%lld, "
            "\"load_signal\": %d, \"shared_mode_steps\": %lld, \"dp_early_launches\": %d, \"recompute\": "
            "%d, \"peak_dtype\": \"%s\", \"loss_scale\": %.17g, \"skipped_steps\": %lld, \"lanes\": %d}\n",
            device, (long long)L, (long long)NH, (long long)C, (long long)V, (long long)B, (long long)T,
            (long long)threads, dtname, med * 1e3, tps, flops / 1e9, peak / 1e9, mfu,
            tr.plan.planned_bytes / 1048576.0, loss, mesh.dp, (long long)accum, (long long)zero, wait_frac,
            mesh.tp, tp_frac, tp_bytes / 1048576.0, m->numel * 4.0 / 1048576.0, mesh.pp, pipe_frac,
            (double)(mesh.pp - 1) / (double)((zb ? 3 : 1) * accum + mesh.pp - 1), (int)pfirst, (int)plast,
            bal[0], bal[1], busy, tr.gov.on, thr_mean, (long long)tr.gov.switches, (long long)tr.gov.probes,
            cpu_step * 1e3, wall_mean * 1e3, (double)(B * T) * (double)accum * mesh.dp / wall_mean, pa, ph,
            peak32 > 0 ? flops / peak32 : 0, rss_mib, zb, (long long)tr.gov.gated, tr.gov.ncpu > 0,
            (long long)tr.gov.shared_steps, early, recompute != NULL, peakname, r.loss_scale,
            (long long)r.skipped, tr.lanes);
    else
        printf("GPT-2 on %s, L%lld NH%lld C%lld V%lld B%lld T%lld %s, %lld threads: %.1f ms/step (median of "
               "%lld), "
               "%.1f tokens/s, "
               "%.1f GFLOP/s, MFU %.1f%% of measured %.1f GFLOP/s %s peak; activations %.1f MiB; peak RSS "
               "%.0f MiB; dp %d x accum "
               "%lld, ZeRO-%lld, comm wait %.1f%% of step; tp %d, TP collectives %.1f%% of step\n",
               device, (long long)L, (long long)NH, (long long)C, (long long)V, (long long)B, (long long)T,
               bf16 || fp16 ? dtname : "fp32", (long long)threads, med * 1e3, (long long)steps, tps,
               flops / 1e9, 100 * mfu, peak / 1e9, peakname, tr.plan.planned_bytes / 1048576.0, rss_mib,
               mesh.dp, (long long)accum, (long long)zero, 100 * wait_frac, mesh.tp, 100 * tp_frac);
    if (!json) print_text_tail(&tr, thr_mean, busy, &r, steps, fp16);
    if (dp) print_dp_memory(dp, json, zero);
    free(ts);
    return free_run(dp, tp, &tr, m, &mesh, world);
}
