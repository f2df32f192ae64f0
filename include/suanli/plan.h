/* suanli/plan.h — the layout planner: cluster files, a per-device memory model that follows suanli's own
 * allocations, a step-time model (roofline compute, alpha-beta communication per link class, pipeline
 * bubble), the ranking of dp x tp x pp x ep x micro-batch x ZeRO x recomputation layouts, Young/Daly
 * checkpoint intervals and a discrete-event simulation of failures. docs/PLANNER.md has the formulas.
 *
 * Usage:
 *   sl_plan_cluster cl;  sl_plan_cluster_load("configs/cluster/this-host.json", &cl);
 *   sl_plan_model md;    sl_plan_model_load("gpt2-124m", &md);          // builtin, HF dir or train config
 *   sl_plan_job job = {.global_batch = 8, .seq_len = 64};
 *   sl_plan_layout *v; int n;
 *   sl_plan_enumerate(&md, &cl, &job, &v, &n);                          // ranked, fitting layouts first
 *   printf("%.3f s/step, %.1f MiB\n", v[0].step_sec, v[0].mem.total / 1048576.0);
 *   free(v);
 * Nothing here allocates device memory or talks to other ranks; everything is plain data.
 */
#ifndef SUANLI_PLAN_H
#define SUANLI_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "suanli/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A link class: time of an n-byte message = alpha + n / beta. */
typedef struct sl_plan_link {
    double alpha_s;  /* latency, seconds */
    double beta_Bps; /* bandwidth per device, bytes/s */
} sl_plan_link;

typedef struct sl_plan_cluster {
    char name[64];
    int64_t hosts, devices_per_host;
    double peak_flops;      /* per device, dense matmul FLOP/s of the training precision */
    double gemm_efficiency; /* fraction of peak_flops the backend's GEMMs reach (calibrated: --probe) */
    double mem_bw_Bps;      /* per device memory bandwidth (non-matmul ops, optimizer) */
    double mem_bytes;       /* per device memory */
    double mem_reserve;     /* fraction of mem_bytes kept free (allocator, runtime, fragmentation) */
    double overlap;         /* fraction of data-parallel communication hidden behind backward, 0..1 */
    sl_plan_link intra, inter;
    /* network interfaces per host (links.inter_host.nics_per_host, default devices_per_host): inter.beta_Bps
     * is per NIC, and the flows that leave a host at once share its NICs (Note [Planner DP across hosts]) */
    int64_t nics_per_host;
    double mtbf_hours;                            /* per host (a host failure stops the job) */
    double ckpt_write_Bps;                        /* per host, to the checkpoint store */
    double ckpt_read_Bps;                         /* per host, restore */
    double ckpt_agg_write_Bps, ckpt_agg_read_Bps; /* the store's aggregate caps (0: none) */
    double restart_sec; /* fixed cost of a restart (relaunch, rendezvous, graph build) */
    char launcher[16];  /* "run" (suanli run) or "slurm" */
} sl_plan_cluster;

typedef enum { SL_PLAN_GPT2, SL_PLAN_LLAMA, SL_PLAN_ARCH_COUNT } sl_plan_arch;

typedef struct sl_plan_model {
    char name[64];
    sl_plan_arch arch;
    int64_t n_layer, hidden, n_head, n_kv_head, head_dim, ffn, vocab, max_seq;
    int tied;                 /* tied input/output embedding */
    int64_t n_experts, top_k; /* MoE (0: dense) */
    /* MoE layers (n_experts > 0): each routed expert's width (moe_intermediate_size; Mixtral: ffn), the
     * shared experts' total width (0: none), how many leading layers stay dense with width ffn (DeepSeek's
     * first_k_dense_replace), and the flavour's extra parameters: SL_PLAN_MOE_QWEN2 adds a 1 x C
     * shared-expert gate, SL_PLAN_MOE_DEEPSEEK an E-element router bias (Note [Planner memory model]) */
    int64_t moe_ffn, shared_ffn, first_dense;
    int moe_kind;
} sl_plan_model;

enum { SL_PLAN_MOE_MIXTRAL, SL_PLAN_MOE_QWEN2, SL_PLAN_MOE_DEEPSEEK };

typedef struct sl_plan_job {
    int64_t global_batch; /* samples per optimizer step */
    int64_t seq_len;      /* T */
    int64_t bucket_elems; /* DP gradient bucket size (0: 1Mi, suanli train's default) */
    int64_t devices;      /* 0: every device of the cluster */
    /* restrictions (0: enumerate) */
    int64_t tp, pp, ep, dp, micro_batch, zero; /* zero: stage + 1 to fix it (0: enumerate 0..3) */
    int recompute;                             /* 0 enumerate, 1 none only, 2 full only */
    int sp;                                    /* sequence parallelism: 0 enumerate, 1 off only, 2 on only */
    int etp; /* expert tensor parallelism: 0 enumerate, 1 experts whole on every TP rank only, 2 split only */
} sl_plan_job;

/* Per-device bytes, the largest pipeline stage. */
typedef struct sl_plan_mem {
    double params, grads, grad_shard, optim, slots, activations, total;
} sl_plan_mem;

typedef struct sl_plan_layout {
    int64_t dp, tp, pp, ep, vpp; /* vpp: virtual stages per device (interleaved 1F1B when > 1) */
    /* 1: the routed experts' intermediate dimension split over the TP group (--expert-tensor-parallel-size
     * = tp; Qwen2-MoE / DeepSeek-V3 experts, tp > 1); 0: every TP rank holds and runs the experts whole */
    int etp;
    int64_t micro_batch, accum; /* accum = micro-batches per step per data-parallel rank */
    int zero, recompute;        /* recompute: 0 none, 1 full (layer inputs kept) */
    int sp;                     /* 1: sequence parallelism (tp > 1, dense models) */
    /* pp > 1 without interleaving: the layers of the first / last stage the planner chose so that the
     * slowest stage (the last holds the LM head) is fastest, 0 / 0 for the even split (sl_pp_balanced_split;
     * suanli train's --decoder-first/last-pipeline-num-layers) */
    int64_t first_layers, last_layers;
    sl_plan_mem mem;
    int fits;
    double t_compute, t_dp_comm, t_tp_comm, t_pp_comm, t_ep_comm, t_optim; /* seconds per step */
    double bubble;                                                         /* fraction of the pipeline */
    /* the DP all-reduce: 1 when suanli runs it hierarchically (the DP group spans hosts with dp_per_host > 1
     * of its ranks on each; Note [Hierarchical sub-communicators] in src/comm/init.c), else a flat ring */
    int dp_hier;
    int64_t dp_per_host;
    double step_sec, tokens_per_s, mfu;
    int runnable; /* suanli can train this layout today (no ZeRO-3 with pp > 1, no EP on Mixtral) */
} sl_plan_layout;

/* Cluster file (JSON; configs/cluster/). Every error names the file and the field. */
sl_status sl_plan_cluster_load(const char *path, sl_plan_cluster *cl);
/* Take the checkpoint write bandwidth and the restore time from a `bench/ckpt.sh --json` record (ckpt_mib,
 * write_mb_s, kill_to_training_s): the measured save and restore of suanli's own checkpoints. The read
 * bandwidth is set so that restart_sec + ckpt_mib / read = kill_to_training_s. */
sl_status sl_plan_cluster_apply_ckpt_bench(sl_plan_cluster *cl, const char *path);
/* A builtin name (gpt2-124m, gpt2-tiny, llama-7b, llama-70b, ...), a Hugging Face model dir or its
 * config.json, or a `suanli train` config JSON (num_layers, hidden_size, num_attention_heads,
 * vocab_size, seq_length). */
sl_status sl_plan_model_load(const char *spec, sl_plan_model *md);
const char *sl_plan_builtin_names(void); /* comma-separated */

int64_t sl_plan_model_params(const sl_plan_model *md);              /* total parameters */
double sl_plan_flops_per_token(const sl_plan_model *md, int64_t T); /* training FLOPs (6N + attention) */

/* Memory and time of one layout (fills l->mem, l->fits, the times). Returns SL_ERR_INVALID naming the
 * flag when the layout is inconsistent with the model, the cluster or the job. */
sl_status sl_plan_evaluate(const sl_plan_model *md, const sl_plan_cluster *cl, const sl_plan_job *job,
                           sl_plan_layout *l);
/* Every consistent layout, fitting ones first, then by step time. *out owned by the caller (free()). */
sl_status sl_plan_enumerate(const sl_plan_model *md, const sl_plan_cluster *cl, const sl_plan_job *job,
                            sl_plan_layout **out, int *n);

/* Activation bytes of one micro-batch as suanli's planner (sl_graph_plan) lays them out, per device. */
double sl_plan_activation_bytes(const sl_plan_model *md, int64_t B, int64_t T, int64_t tp, int64_t ep,
                                int etp, int recompute, int sp);

/* Calibration: GEMM FLOP/s and copy bandwidth of the CPU backend with `threads` threads (a short probe,
 * ~1 s). */
sl_status sl_plan_probe(int threads, double *gemm_flops, double *copy_Bps);

/* ---- checkpoint interval and failures (src/plan/failures.c) ---- */

typedef struct sl_plan_ckpt {
    double save_sec;    /* time the job is stalled or exposed per checkpoint (delta) */
    double restore_sec; /* restart + load (R) */
    double mtbf_sec;    /* of the whole job: host MTBF / hosts */
} sl_plan_ckpt;

double sl_plan_young_interval(double save_sec, double mtbf_sec);
double sl_plan_daly_interval(double save_sec, double mtbf_sec);
/* Expected fraction of wall time that is useful work for interval tau, exponential failures, restarts
 * that can fail too (Daly 2006): tau / (M e^{R/M} (e^{(tau+delta)/M} - 1)). */
double sl_plan_expected_goodput(const sl_plan_ckpt *c, double tau);

typedef struct sl_plan_sim_opts {
    double work_sec;      /* useful work the run must complete */
    double interval_sec;  /* checkpoint interval tau (work between saves) */
    int64_t hosts;        /* hosts the job needs */
    double host_mtbf_sec; /* per host */
    double save_sec, restore_sec;
    int64_t spares;    /* hot spare hosts */
    double repair_sec; /* a failed host is back in the pool after this long */
    uint64_t seed;
} sl_plan_sim_opts;

typedef struct sl_plan_sim_result {
    double wall_sec, goodput, lost_host_hours;
    int64_t failures, checkpoints, waits_for_spare;
    double wait_sec; /* time stopped because no spare host was available */
} sl_plan_sim_result;

/* Deterministic given the seed. */
sl_status sl_plan_simulate(const sl_plan_sim_opts *o, sl_plan_sim_result *r);

#ifdef __cplusplus
}
#endif
#endif
