/* suanli plan — rank the layouts of a model on a cluster (src/plan), print the best one's launch command,
 * the checkpoint interval (Young/Daly) and the expected goodput; --simulate-failures runs the discrete-event
 * simulation of a long run. Flags only; the model is in the library (docs/PLANNER.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "suanli/plan.h"

typedef struct {
    const char *model, *cluster, *recompute, *sp, *data, *ckpt_bench;
    int64_t global_batch, seq_len, devices, tp, pp, ep, etp, dp, mb, zero, bucket, top, threads, spares, seed;
    double mtbf_hours, save_sec, restore_sec, interval_sec, work_hours, repair_hours;
    int probe, json, simulate;
} plan_args;

static int plan_flags(plan_args *a, sl_flag *f) {
    const sl_flag t[] = {
        {"model", SL_FLAG_STR, &a->model, 0, 0,
         "builtin name, HF model dir / config.json, or train config (required)", 0},
        {"cluster", SL_FLAG_STR, &a->cluster, 0, 0, "cluster JSON (configs/cluster/*.json) (required)", 0},
        {"global-batch", SL_FLAG_INT, &a->global_batch, 1, 1ll << 40, "samples per step (default: devices)",
         0},
        {"seq-len", SL_FLAG_INT, &a->seq_len, 1, 1 << 24, "tokens per sample (default: min(model's, 2048))",
         0},
        {"devices", SL_FLAG_INT, &a->devices, 1, 1ll << 32, "devices to use (default: all of the cluster)",
         0},
        {"tp", SL_FLAG_INT, &a->tp, 1, 4096, "fix tensor parallelism", 0},
        {"pp", SL_FLAG_INT, &a->pp, 1, 4096, "fix pipeline parallelism", 0},
        {"ep", SL_FLAG_INT, &a->ep, 1, 4096, "fix expert parallelism", 0},
        {"expert-tensor-parallel-size", SL_FLAG_INT, &a->etp, 1, 4096,
         "1: routed experts whole on every TP rank; = tp: split over TP (default: both)", 0},
        {"dp", SL_FLAG_INT, &a->dp, 1, 1ll << 32, "fix data parallelism", 0},
        {"micro-batch", SL_FLAG_INT, &a->mb, 1, 1 << 20, "fix the micro-batch size", 0},
        {"zero", SL_FLAG_INT, &a->zero, 0, 3, "fix the ZeRO stage", 0},
        {"recompute", SL_FLAG_STR, &a->recompute, 0, 0, "none | full | any (default any)", 0},
        {"sequence-parallel", SL_FLAG_STR, &a->sp, 0, 0, "off | on | any (default any; on needs tp > 1)", 0},
        {"bucket-elems", SL_FLAG_INT, &a->bucket, 1, 1ll << 40, "DP bucket size in elements (1Mi)", 0},
        {"top", SL_FLAG_INT, &a->top, 1, 100000, "layouts to print (10)", 0},
        {"probe", SL_FLAG_BOOL, &a->probe, 0, 0, "calibrate GEMM efficiency and bandwidth on this host", 0},
        {"threads", SL_FLAG_INT, &a->threads, 0, 1024, "threads per device for --probe (default: all)", 0},
        {"json", SL_FLAG_BOOL, &a->json, 0, 0, "print the ranked layouts as JSON lines", 0},
        {"data-path", SL_FLAG_STR, &a->data, 0, 0, "data dir for the printed launch command", 0},
        {"mtbf-hours", SL_FLAG_FLOAT, &a->mtbf_hours, 1e-6, 1e12, "host MTBF (default: the cluster's)", 0},
        {"save-sec", SL_FLAG_FLOAT, &a->save_sec, 0, 1e9,
         "measured checkpoint save time (default: size / bw)", 0},
        {"restore-sec", SL_FLAG_FLOAT, &a->restore_sec, 0, 1e9, "measured restart + restore time", 0},
        {"ckpt-bench", SL_FLAG_STR, &a->ckpt_bench, 0, 0,
         "bench/ckpt.sh --json record: measured checkpoint write bandwidth and restore time", 0},
        {"simulate-failures", SL_FLAG_BOOL, &a->simulate, 0, 0, "discrete-event simulation of a long run", 0},
        {"interval-sec", SL_FLAG_FLOAT, &a->interval_sec, 1e-3, 1e12, "checkpoint interval (default: Daly's)",
         0},
        {"work-hours", SL_FLAG_FLOAT, &a->work_hours, 1e-3, 1e9, "useful hours the simulated run needs (720)",
         0},
        {"spares", SL_FLAG_INT, &a->spares, 0, 1 << 24, "hot spare hosts (default: hosts / 50, >= 1)", 0},
        {"repair-hours", SL_FLAG_FLOAT, &a->repair_hours, 0, 1e9, "a failed host returns after (24)", 0},
        {"seed", SL_FLAG_INT, &a->seed, 0, 1ll << 62, "simulation seed (1)", 0},
    };
    int n = (int)(sizeof t / sizeof t[0]);
    memcpy(f, t, sizeof t);
    return n;
}

static void layout_line(const sl_plan_layout *l, int rank) {
    const double G = 1073741824.0;
    printf(
        "%4d  %5lld %3lld %2s %3lld %3lld %3lld %3lld %4lld %5lld %4d %-4s | %9.4f %11.1f %5.1f%% | %8.2f = "
        "%6.2f "
        "%6.2f "
        "%6.2f %6.2f %6.2f | %-4s %s\n",
        rank, (long long)l->dp, (long long)l->tp, l->sp ? "sp" : "", (long long)l->pp, (long long)l->ep,
        (long long)(l->etp ? l->tp : 1), (long long)l->vpp, (long long)l->micro_batch, (long long)l->accum,
        l->zero, l->recompute ? "full" : "none", l->step_sec, l->tokens_per_s, 100.0 * l->mfu,
        l->mem.total / G, l->mem.params / G, l->mem.grads / G, (l->mem.grad_shard + l->mem.optim) / G,
        l->mem.slots / G, l->mem.activations / G, l->fits ? "yes" : "NO",
        l->runnable ? "runs today" : "model-only");
}

static void layout_json(const sl_plan_layout *l, int rank) {
    printf(
        "{\"rank\": %d, \"dp\": %lld, \"tp\": %lld, \"sp\": %d, \"pp\": %lld, \"ep\": %lld, \"etp\": %lld, "
        "\"vpp\": "
        "%lld, "
        "\"micro_batch\": "
        "%lld, \"accum\": %lld, \"zero\": %d, \"recompute\": %d, \"step_sec\": %.6f, \"tokens_per_s\": %.3f, "
        "\"mfu\": %.5f, \"bubble\": %.5f, \"t_compute\": %.6f, \"t_dp_comm\": %.6f, \"t_tp_comm\": %.6f, "
        "\"t_pp_comm\": %.6f, \"t_ep_comm\": %.6f, \"t_optim\": %.6f, \"mem_total\": %.0f, \"mem_params\": "
        "%.0f, "
        "\"mem_grads\": %.0f, \"mem_grad_shard\": %.0f, \"mem_optim\": %.0f, \"mem_slots\": %.0f, "
        "\"mem_activations\": %.0f, \"fits\": %d, \"runnable\": %d, \"first_layers\": %lld, "
        "\"last_layers\": %lld, \"dp_allreduce\": \"%s\", \"dp_per_host\": %lld}\n",
        rank, (long long)l->dp, (long long)l->tp, l->sp, (long long)l->pp, (long long)l->ep,
        (long long)(l->etp ? l->tp : 1), (long long)l->vpp, (long long)l->micro_batch, (long long)l->accum,
        l->zero, l->recompute, l->step_sec, l->tokens_per_s, l->mfu, l->bubble, l->t_compute, l->t_dp_comm,
        l->t_tp_comm, l->t_pp_comm, l->t_ep_comm, l->t_optim, l->mem.total, l->mem.params, l->mem.grads,
        l->mem.grad_shard, l->mem.optim, l->mem.slots, l->mem.activations, l->fits, l->runnable,
        (long long)l->first_layers, (long long)l->last_layers, l->dp_hier ? "hier" : "ring",
        (long long)l->dp_per_host);
}

static void launch_command(const plan_args *a, const sl_plan_model *md, const sl_plan_cluster *cl,
                           const sl_plan_layout *l, int64_t T, int64_t G, int64_t save_steps) {
    int64_t W = l->dp * l->tp * l->pp, per = W < cl->devices_per_host ? W : cl->devices_per_host;
    int64_t nodes = (W + cl->devices_per_host - 1) / cl->devices_per_host;
    char model[256];
    if (md->arch == SL_PLAN_GPT2)
        snprintf(model, sizeof model, "--num-layers %lld --hidden-size %lld --num-attention-heads %lld",
                 (long long)md->n_layer, (long long)md->hidden, (long long)md->n_head);
    else
        snprintf(model, sizeof model, "--init-from HF_DIR_OF_%s", md->name);
    char par[512] = "";
    int k = 0;
    if (l->tp > 1)
        k +=
            snprintf(par + k, sizeof par - (size_t)k, " --tensor-model-parallel-size %lld", (long long)l->tp);
    if (l->sp) k += snprintf(par + k, sizeof par - (size_t)k, " --sequence-parallel");
    if (l->pp > 1)
        k += snprintf(par + k, sizeof par - (size_t)k, " --pipeline-model-parallel-size %lld",
                      (long long)l->pp);
    if (l->first_layers)
        k += snprintf(par + k, sizeof par - (size_t)k, " --decoder-first-pipeline-num-layers %lld",
                      (long long)l->first_layers);
    if (l->last_layers)
        k += snprintf(par + k, sizeof par - (size_t)k, " --decoder-last-pipeline-num-layers %lld",
                      (long long)l->last_layers);
    if (l->vpp > 1)
        k += snprintf(par + k, sizeof par - (size_t)k, " --num-layers-per-virtual-pipeline-stage %lld",
                      (long long)(md->n_layer / (l->pp * l->vpp)));
    if (l->ep > 1)
        k +=
            snprintf(par + k, sizeof par - (size_t)k, " --expert-model-parallel-size %lld", (long long)l->ep);
    if (l->etp)
        k += snprintf(par + k, sizeof par - (size_t)k, " --expert-tensor-parallel-size %lld",
                      (long long)l->tp);
    if (l->zero) k += snprintf(par + k, sizeof par - (size_t)k, " --zero-stage %d", l->zero);
    if (l->recompute) snprintf(par + k, sizeof par - (size_t)k, " --recompute-granularity full");
    char train[1024];
    snprintf(
        train, sizeof train,
        "suanli train --data-path %s %s --seq-length %lld --micro-batch-size %lld --global-batch-size %lld%s "
        "--save run --load run --save-interval %lld",
        a->data ? a->data : "DATA", model, (long long)T, (long long)l->micro_batch, (long long)G, par,
        (long long)save_steps);
    if (!strcmp(cl->launcher, "slurm"))
        printf("launch: suanli submit --nodes %lld --ntasks-per-node %lld --time 24:00:00 -- %s\n",
               (long long)nodes, (long long)per, train);
    else if (nodes > 1)
        printf("launch (on each of %lld hosts, R = 0..%lld): suanli run -n %lld --nnodes %lld --node-rank R "
               "--master HOST0:29500 --max-restarts 3 -- %s\n",
               (long long)nodes, (long long)(nodes - 1), (long long)per, (long long)nodes, train);
    else
        printf("launch: suanli run -n %lld --max-restarts 3 -- %s\n", (long long)per, train);
    if (!l->runnable)
        printf("note: this layout uses %s, which suanli train does not run yet (model-only)\n",
               l->ep > 1 && md->moe_kind == SL_PLAN_MOE_MIXTRAL
                   ? "expert parallelism on Mixtral (its experts are not split by EP)"
                   : "ZeRO-3 with pipeline stages");
}

typedef struct {
    sl_plan_ckpt ck;
    double ckpt_bytes, tau_young, tau_daly;
    int64_t hosts;
} ckpt_advice;

static void advise(const plan_args *a, const sl_plan_model *md, const sl_plan_cluster *cl,
                   const sl_plan_layout *l, ckpt_advice *ad) {
    int64_t W = l->dp * l->tp * l->pp;
    ad->hosts = (W + cl->devices_per_host - 1) / cl->devices_per_host;
    ad->ckpt_bytes = 12.0 * (double)sl_plan_model_params(md); /* fp32 params + two AdamW moments */
    double H = (double)ad->hosts, wbw = cl->ckpt_write_Bps * H, rbw = cl->ckpt_read_Bps * H;
    if (cl->ckpt_agg_write_Bps > 0 && cl->ckpt_agg_write_Bps < wbw) wbw = cl->ckpt_agg_write_Bps;
    if (cl->ckpt_agg_read_Bps > 0 && cl->ckpt_agg_read_Bps < rbw) rbw = cl->ckpt_agg_read_Bps;
    ad->ck.save_sec = a->save_sec >= 0 ? a->save_sec : ad->ckpt_bytes / wbw;
    ad->ck.restore_sec = a->restore_sec >= 0 ? a->restore_sec : cl->restart_sec + ad->ckpt_bytes / rbw;
    double mtbf_h = a->mtbf_hours > 0 ? a->mtbf_hours : cl->mtbf_hours;
    ad->ck.mtbf_sec = mtbf_h * 3600.0 / (double)ad->hosts;
    ad->tau_young = sl_plan_young_interval(ad->ck.save_sec, ad->ck.mtbf_sec);
    ad->tau_daly = sl_plan_daly_interval(ad->ck.save_sec, ad->ck.mtbf_sec);
    printf("checkpoint: %.2f GiB (fp32 params + AdamW moments), save %.1f s%s, restore %.1f s%s; job MTBF "
           "%.2f h "
           "(host MTBF %.0f h / %lld hosts)\n",
           ad->ckpt_bytes / 1073741824.0, ad->ck.save_sec,
           a->save_sec >= 0 ? " (measured)" : " (size / write bw)", ad->ck.restore_sec,
           a->restore_sec >= 0 ? " (measured)" : " (restart + size / read bw)", ad->ck.mtbf_sec / 3600.0,
           mtbf_h, (long long)ad->hosts);
    printf("checkpoint interval: Young sqrt(2 delta M) = %.0f s, Daly = %.0f s = every %lld steps; expected "
           "goodput "
           "%.2f%% at Daly's interval (%.2f%% at Young's)\n",
           ad->tau_young, ad->tau_daly, (long long)fmax(1.0, round(ad->tau_daly / l->step_sec)),
           100.0 * sl_plan_expected_goodput(&ad->ck, ad->tau_daly),
           100.0 * sl_plan_expected_goodput(&ad->ck, ad->tau_young));
}

enum { SIM_REPS = 10 }; /* replicas (seeds seed .. seed+9) averaged per interval */

static double mean_goodput(const sl_plan_sim_opts *o, sl_plan_sim_result *first) {
    double sum = 0;
    for (int k = 0; k < SIM_REPS; k++) {
        sl_plan_sim_opts s = *o;
        s.seed = o->seed + (uint64_t)k;
        sl_plan_sim_result x;
        if (sl_plan_simulate(&s, &x) != SL_OK) return -1;
        if (k == 0 && first) *first = x;
        sum += x.goodput;
    }
    return sum / SIM_REPS;
}

static int simulate(const plan_args *a, const ckpt_advice *ad) {
    sl_plan_sim_opts o = {.work_sec = a->work_hours * 3600.0,
                          .interval_sec = a->interval_sec > 0 ? a->interval_sec : ad->tau_daly,
                          .hosts = ad->hosts,
                          .host_mtbf_sec = ad->ck.mtbf_sec * (double)ad->hosts,
                          .save_sec = ad->ck.save_sec,
                          .restore_sec = ad->ck.restore_sec,
                          .spares = a->spares >= 0 ? a->spares : (ad->hosts / 50 > 1 ? ad->hosts / 50 : 1),
                          .repair_sec = a->repair_hours * 3600.0,
                          .seed = (uint64_t)a->seed};
    sl_plan_sim_result r;
    double g = mean_goodput(&o, &r);
    if (g < 0) {
        fprintf(stderr, "suanli plan: %s\n", sl_errmsg());
        return 2;
    }
    printf(
        "simulation (seeds %llu..%llu): %.0f h of work on %lld hosts, %lld spares, repair %.0f h, interval "
        "%.0f s: "
        "goodput %.2f%% (mean of %d runs; analytic, unlimited spares: %.2f%%); first run: wall %.1f h, %lld "
        "failures, %lld checkpoints, %.0f host-hours lost, %lld waits for a spare (%.1f h)\n",
        (unsigned long long)o.seed, (unsigned long long)o.seed + SIM_REPS - 1, a->work_hours,
        (long long)o.hosts, (long long)o.spares, a->repair_hours, o.interval_sec, 100.0 * g, SIM_REPS,
        100.0 * sl_plan_expected_goodput(&ad->ck, o.interval_sec), r.wall_sec / 3600.0, (long long)r.failures,
        (long long)r.checkpoints, r.lost_host_hours, (long long)r.waits_for_spare, r.wait_sec / 3600.0);
    /* the simulated optimum: the same seeds for every interval (common random numbers) */
    double best_tau = 0, best_g = -1;
    for (int i = 0; i <= 40; i++) {
        sl_plan_sim_opts s = o;
        s.interval_sec = ad->tau_daly * pow(2.0, -3.0 + 6.0 * i / 40.0);
        double x = mean_goodput(&s, NULL);
        if (x > best_g) {
            best_g = x;
            best_tau = s.interval_sec;
        }
    }
    sl_plan_sim_opts d = o;
    d.interval_sec = ad->tau_daly;
    double gd = mean_goodput(&d, NULL);
    printf("simulated optimum: interval %.0f s (%.2fx Daly's %.0f s), goodput %.2f%%; Daly's interval "
           "simulated: "
           "%.2f%% (%.2f points below the optimum)\n",
           best_tau, best_tau / ad->tau_daly, ad->tau_daly, 100.0 * best_g, 100.0 * gd,
           100.0 * (best_g - gd));
    return 0;
}

static int calibrate(const plan_args *a, sl_plan_cluster *cl) {
    double gf, bw;
    if (sl_plan_probe((int)a->threads, &gf, &bw) != SL_OK) {
        fprintf(stderr, "suanli plan: --probe: %s\n", sl_errmsg());
        return 1;
    }
    cl->mem_bw_Bps = bw;
    if (gf > cl->peak_flops) { /* the file's peak is not this host's (another CPU): the measured rate is */
        printf("probe: GEMM %.1f GFLOP/s, above the file's %.1f GFLOP/s peak: the peak is taken as %.1f "
               "(efficiency 1), copy %.1f GB/s (read + written)\n",
               gf / 1e9, cl->peak_flops / 1e9, gf / 1e9, bw / 1e9);
        cl->peak_flops = gf;
        cl->gemm_efficiency = 1.0;
        return 0;
    }
    cl->gemm_efficiency = gf / cl->peak_flops;
    printf("probe: GEMM %.1f GFLOP/s (%.0f%% of the file's %.1f GFLOP/s peak), copy %.1f GB/s (read + "
           "written)\n",
           gf / 1e9, 100.0 * cl->gemm_efficiency, cl->peak_flops / 1e9, bw / 1e9);
    return 0;
}

int sl_cmd_plan(int argc, char **argv) {
    plan_args a = {.recompute = "any",
                   .sp = "any",
                   .top = 10,
                   .zero = -1,
                   .mtbf_hours = -1,
                   .save_sec = -1,
                   .restore_sec = -1,
                   .work_hours = 720,
                   .spares = -1,
                   .repair_hours = 24,
                   .seed = 1};
    sl_flag flags[40];
    int nf = plan_flags(&a, flags);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: suanli plan --model MODEL --cluster CLUSTER.json [flags]\n"
                   "ranks dp x tp x pp x ep x micro-batch x ZeRO x recomputation layouts by predicted step "
                   "time\n"
                   "(memory per device must fit); prints the best's launch command, the checkpoint interval\n"
                   "(Young/Daly) and the expected goodput. Exit: 0 ok, 2 bad input or nothing fits.\n");
            sl_flags_usage(flags, nf, stdout);
            return 0;
        }
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli plan: %s\n", sl_errmsg());
        return 2;
    }
    if (!a.model || !a.cluster) {
        fprintf(stderr, "suanli plan: --%s: required (see suanli plan --help)\n",
                a.model ? "cluster" : "model");
        return 2;
    }
    int rc = strcmp(a.recompute, "any") ? !strcmp(a.recompute, "none")   ? 1
                                          : !strcmp(a.recompute, "full") ? 2
                                                                         : -1
                                        : 0;
    if (rc < 0) {
        fprintf(stderr, "suanli plan: --recompute: expected none, full or any, got '%s'\n", a.recompute);
        return 2;
    }
    int spf = !strcmp(a.sp, "any") ? 0 : !strcmp(a.sp, "off") ? 1 : !strcmp(a.sp, "on") ? 2 : -1;
    if (spf < 0) {
        fprintf(stderr, "suanli plan: --sequence-parallel: expected off, on or any, got '%s'\n", a.sp);
        return 2;
    }
    sl_plan_cluster cl;
    sl_plan_model md;
    if (sl_plan_cluster_load(a.cluster, &cl) != SL_OK || sl_plan_model_load(a.model, &md) != SL_OK) {
        fprintf(stderr, "suanli plan: %s\n", sl_errmsg());
        return 2;
    }
    if (a.ckpt_bench && sl_plan_cluster_apply_ckpt_bench(&cl, a.ckpt_bench) != SL_OK) {
        fprintf(stderr, "suanli plan: %s\n", sl_errmsg());
        return 2;
    }
    if (a.probe && calibrate(&a, &cl)) return 1;
    int64_t W = a.devices > 0 ? a.devices : cl.hosts * cl.devices_per_host;
    if (a.etp > 1 && a.tp > 0 && a.etp != a.tp) {
        fprintf(
            stderr,
            "suanli plan: --expert-tensor-parallel-size %lld: must be 1 or the tensor-parallel size (--tp "
            "%lld)\n",
            (long long)a.etp, (long long)a.tp);
        return 2;
    }
    int64_t T = a.seq_len > 0 ? a.seq_len : (md.max_seq < 2048 ? md.max_seq : 2048);
    sl_plan_job job = {.global_batch = a.global_batch > 0 ? a.global_batch : W,
                       .seq_len = T,
                       .bucket_elems = a.bucket,
                       .devices = a.devices,
                       .tp = a.tp > 0    ? a.tp
                             : a.etp > 1 ? a.etp
                                         : 0,
                       .pp = a.pp,
                       .ep = a.ep,
                       .etp = a.etp == 1  ? 1
                              : a.etp > 1 ? 2
                                          : 0,
                       .dp = a.dp,
                       .micro_batch = a.mb,
                       .zero = a.zero >= 0 ? a.zero + 1 : 0,
                       .recompute = rc,
                       .sp = spf};
    sl_plan_layout *v;
    int n;
    if (sl_plan_enumerate(&md, &cl, &job, &v, &n) != SL_OK) {
        fprintf(stderr, "suanli plan: %s\n", sl_errmsg());
        return 2;
    }
    if (!v[0].fits) {
        double least = v[0].mem.total;
        for (int i = 1; i < n; i++) least = fmin(least, v[i].mem.total);
        fprintf(
            stderr,
            "suanli plan: no layout fits: the smallest needs %.2f GiB per device, the cluster's devices have "
            "%.2f GiB (%.0f%% usable)\n",
            least / 1073741824.0, cl.mem_bytes / 1073741824.0, 100.0 * (1.0 - cl.mem_reserve));
        free(v);
        return 2;
    }
    if (a.json) {
        for (int i = 0; i < n && i < a.top; i++) layout_json(&v[i], i + 1);
        free(v);
        return 0;
    }
    printf("suanli plan: %s (%.3gB params) on %s: %lld hosts x %lld devices (%.1f TFLOP/s peak, %.0f%% "
           "reached by "
           "GEMMs; %.1f GiB each); global batch %lld x %lld tokens; %d layouts\n",
           md.name, (double)sl_plan_model_params(&md) / 1e9, cl.name, (long long)cl.hosts,
           (long long)cl.devices_per_host, cl.peak_flops / 1e12, 100.0 * cl.gemm_efficiency,
           cl.mem_bytes / 1073741824.0, (long long)job.global_batch, (long long)T, n);
    printf(
        "rank     dp  tp sp  pp  ep etp vpp   mb accum zero rc   |    step s    tokens/s   MFU | GiB/dev = "
        "params grads "
        "shard+opt slots act | fits\n");
    for (int i = 0; i < n && i < a.top; i++) layout_line(&v[i], i + 1);
    int best_run = -1;
    for (int i = 0; i < n && best_run < 0; i++)
        if (v[i].fits && v[i].runnable) best_run = i;
    if (best_run >= a.top) layout_line(&v[best_run], best_run + 1);
    if (best_run < 0)
        printf("(no layout that suanli train runs today fits: it runs dp x tp x pp (+ ep for Qwen2-MoE / "
               "DeepSeek-V3), with or without recomputation, but no ZeRO-3 with pp)\n");
    const sl_plan_layout *b = &v[0];
    printf(
        "best: dp %lld tp %lld%s pp %lld ep %lld%s%s, micro-batch %lld x %lld, ZeRO-%d, recompute %s: %.4f "
        "s/step, "
        "%.0f tokens/s, MFU %.1f%%, bubble %.1f%%, %.2f GiB per device\n",
        (long long)b->dp, (long long)b->tp, b->sp ? " (sequence parallel)" : "", (long long)b->pp,
        (long long)b->ep, b->etp ? " (experts split over tp)" : "", b->vpp > 1 ? " (interleaved)" : "",
        (long long)b->micro_batch, (long long)b->accum, b->zero, b->recompute ? "full" : "none", b->step_sec,
        b->tokens_per_s, 100.0 * b->mfu, 100.0 * b->bubble, b->mem.total / 1073741824.0);
    ckpt_advice ad;
    advise(&a, &md, &cl, b, &ad);
    launch_command(&a, &md, &cl, b, T, job.global_batch,
                   (int64_t)fmax(1.0, round(ad.tau_daly / b->step_sec)));
    if (!b->runnable && best_run >= 0) {
        printf("best layout suanli runs today (rank %d, %.4f s/step, %.2f GiB per device):\n", best_run + 1,
               v[best_run].step_sec, v[best_run].mem.total / 1073741824.0);
        launch_command(&a, &md, &cl, &v[best_run], T, job.global_batch,
                       (int64_t)fmax(1.0, round(ad.tau_daly / v[best_run].step_sec)));
    }
    int ret = a.simulate ? simulate(&a, &ad) : 0;
    free(v);
    return ret;
}
