/* suanli/train.h — training: one step over a model (sl_trainer: micro-batches with gradient
 * accumulation, global grad-norm clipping, LR schedule, AdamW, evaluation with the same graph's forward
 * part) and a whole job (sl_train_run: model, data, DP/ZeRO, checkpoints with resume, eval, metrics,
 * final save, sample).
 *
 * Usage (a whole job with checkpoints; see tests/train/test_train_api.c):
 *   sl_train_opts o;
 *   sl_train_opts_default(&o);
 *   o.data.path = "out/tok";              // made by `suanli data prepare`
 *   o.train_iters = 100;
 *   o.ckpt.save_dir = o.ckpt.load_dir = "run1";  // resume from run1's newest checkpoint when there is one
 *   o.ckpt.save_interval = 20;
 *   sl_train_result r;
 *   if (sl_train_run(&o, NULL, &r) != SL_OK) fprintf(stderr, "%s\n", sl_errmsg());
 *
 * Usage (one step at a time):
 *   sl_trainer tr;
 *   sl_trainer_init(&tr, model, &(sl_trainer_config){.B = 4, .T = 64, .accum = 2, .lr = 1e-3, ...});
 *   for (step = 0; step < iters; step++) sl_trainer_step(&tr, step, my_batch_fn, user, &stats);
 *   sl_trainer_eval(&tr, my_val_batch_fn, user, 20, &val_loss);
 *   sl_trainer_free(&tr);
 */
#ifndef SUANLI_TRAIN_H
#define SUANLI_TRAIN_H

#include <stdio.h>

#include "suanli/ckpt.h"
#include "suanli/comm.h"
#include "suanli/data.h"
#include "suanli/device.h"
#include "suanli/nn.h"
#include "suanli/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sl_trainer_config {
    int B, T, accum;        /* micro-batch size, sequence length, micro-batches per step (per rank) */
    int dp_size;            /* data-parallel ranks (0 or 1: single process); the loss seed is 1/(accum*dp) */
    float lr, min_lr, clip; /* clip <= 0: no clipping */
    int64_t warmup, decay_iters;
    sl_adamw_hparams hp;
    const struct sl_mesh *mesh; /* borrowed; needed for a pipeline stage (m->pp > 1), else may be NULL */
    /* dynamic loss scaling (fp16; Note [Dynamic loss scaling]): off when loss_scale.initial is 0 */
    sl_loss_scale_config loss_scale;
    /* dropout (the model's attention_dropout / hidden_dropout): the masks' Philox key; micro-batch j of step
     * s draws stream s * (dp * accum) + j (Note [Dropout from counters], src/ops/build.c) */
    uint64_t dropout_seed;
    int pipe_schedule; /* a pipeline stage's schedule (sl_pipe_schedule; 0: 1F1B) */
    /* full recomputation (sl_graph_set_recompute): SL_RECOMPUTE_NONE (0), _UNIFORM (1: every
     * recompute_layers layers a checkpoint) or _BLOCK (the first recompute_layers layers); layers 0: 1 */
    int recompute, recompute_layers;
    /* micro-batch lanes (Note [Micro-batch lanes], src/train/lanes.c): the B rows of a micro-batch split
     * into `lanes` graphs run side by side, one thread each; 0 or 1: one graph */
    int lanes;
} sl_trainer_config;

typedef struct sl_step_stats {
    float loss, grad_norm, lr; /* loss: mean over every micro-batch of every dp rank */
    double seconds;
    double comm_wait_sec; /* time spent waiting for gradient reduction after backward (DP) */
    double pipe_wait_sec; /* pipeline stage: time blocked receiving activations/gradients (bubble + comm) */
    double pp_comm_bytes; /* pipeline stage: bytes this rank sent (Note [Pipeline communication volume]) */
    double dp_comm_bytes; /* DP: bus bytes of this rank's collectives (Note [DP communication volume]) */
    float loss_scale;     /* the scale this step's backward used (1 without loss scaling) */
    int skipped;          /* 1: inf/nan gradients, no update (grad_norm is then inf or nan) */
    int64_t skipped_total;
    int threads; /* compute threads of this step (Note [Threads on a shared machine]) */
} sl_step_stats;

typedef struct sl_dp sl_dp;
typedef struct sl_tp sl_tp;
typedef struct sl_trainer_lane sl_trainer_lane;
enum { SL_MAX_LANES = 16 };
typedef struct sl_pipeline sl_pipeline;

/* Fill one micro-batch: ids and targets are (B, T) int32. `micro` is the global micro-batch index of the
 * step (dp_rank * accum + local micro), so a DP run sees exactly the single-process batches. */
typedef sl_status (*sl_batch_fn)(void *user, int64_t step, int micro, int32_t *ids, int32_t *targets);

/* Note [Threads on a shared machine] (src/train/threads.c): the trainer's thread count adapts to
 * neighbours. The kernels' results do not depend on the thread count, so switching is free of numerical
 * effect; the governor times steps at the configured count n and at n - 1 and keeps the faster. */
typedef struct sl_thread_gov {
    int n_max, cur, alt; /* configured count; this step's; the probed alternative (0: none) */
    int on;              /* 0: fixed (one configured thread, SUANLI_ADAPTIVE_THREADS=0) */
    int64_t steps, next; /* steps seen; the step at which the next probe starts */
    int64_t interval;    /* steps between probes (doubles while the current count keeps winning) */
    int probe_left;      /* steps of the running probe still to time */
    double hist[8];      /* recent step times at cur (ring) */
    int nhist, hpos;
    double probe[4];
    int nprobe;
    int64_t switches, probes; /* for reports */
    /* the machine's load (Note [Threads on a shared machine]): runnable tasks that are not this process's,
     * the minimum of the last 3 samples (-1: unknown); the value at which the last probe of more threads
     * lost (-1: none); online CPUs (0: no signal, e.g. a CPU mask narrower than the machine) */
    int (*sample)(void); /* returns the other runnable tasks now, or -1; sl_thread_gov_init sets it */
    int ext, ext_hi, ext_lost, ncpu; /* ext_hi: the maximum of the last 3 samples */
    int ext_ring[3], ext_n;
    int ext_at_probe; /* the load when the running probe started */
    int64_t gated,
        up_at; /* steps a probe of more threads was held back by the load; last such probe's step */
    int shared,
        shared_n; /* the shared mode last applied, and at which count (Note [Binding on a shared machine]) */
    int64_t shared_steps; /* steps run in the shared mode (for reports) */
} sl_thread_gov;
/* the runnable tasks of this machine that are not this process's threads (Linux /proc), or -1 */
int sl_thread_gov_sample_machine(void);
void sl_thread_gov_init(sl_thread_gov *g, int n_max);
int sl_thread_gov_begin(sl_thread_gov *g);                /* sets and returns this step's thread count */
void sl_thread_gov_end(sl_thread_gov *g, double seconds); /* the step's wall time */

typedef struct sl_trainer {
    sl_trainer_config cfg;
    sl_thread_gov gov; /* Note [Threads on a shared machine] */
    sl_model *model;   /* borrowed */
    sl_graph *graph;   /* forward + backward (owned) */
    sl_tensor *ids, *targets, *loss, *logits;
    int32_t *ids_buf, *tg_buf; /* host staging of one micro-batch */
    sl_buffer *input_buf;      /* ids and targets on the model's backend (owned) */
    int n_forward;             /* nodes [0, n_forward) are the forward pass */
    sl_adamw opt;              /* single-process optimizer state (allocated at the first step) */
    sl_dp *dp;                 /* borrowed; when set, gradients are reduced and the update is done by dp */
    sl_tp *tp;                 /* borrowed; set by sl_trainer_set_tp for a TP-split model */
    sl_pipeline *pipe;         /* owned; a pipeline stage's graphs and schedule (m->pp > 1); graph is its
                                  first slot's */
    int opt_ready;
    void (*pre_update)(void *user); /* optional: called right before the optimizer modifies the state */
    void *pre_update_user;
    /* optional: called after each micro-batch's forward and backward (not under pipeline parallelism) */
    sl_status (*after_micro)(void *user, int micro);
    void *after_micro_user;
    int64_t opt_t; /* optimizer steps taken (both paths) */
    sl_plan_stats plan;
    sl_tensor *seed; /* the backward's FILL node d(loss) = seed_base * loss scale */
    float seed_base; /* 1 / (accum * dp) */
    int scaling;     /* dynamic loss scaling on (cfg.loss_scale.initial > 0) */
    sl_loss_scaler scaler;
    int lanes;             /* micro-batch lanes (>= 1); the graph above is lane 0's, for B / lanes rows */
    sl_trainer_lane *lane; /* owned: every lane, lane 0 borrowing the fields above (NULL: one lane) */
    int dp_pass; /* this step's DP pass began in a pipeline's last backward unit (Note [DP overlap under PP])
                  */
} sl_trainer;

sl_status sl_trainer_init(sl_trainer *tr, sl_model *m, const sl_trainer_config *cfg);
void sl_trainer_free(sl_trainer *tr);
/* A model split by tensor parallelism (m->tp > 1): runs the graph's collectives over tp's group and
 * takes the gradient norm over the whole model. */
sl_status sl_trainer_set_tp(sl_trainer *tr, sl_tp *tp);
/* sl_dp_opts.ready for this trainer (user: the sl_trainer): where a parameter's gradient is final. Under
 * pipeline parallelism it numbers the chunks' last backward units in schedule order, and holds the tied
 * embedding of the first and last stages (summed over the two after the backward) for the end of the step;
 * without a pipeline it is the graph's last write. Give it to the sl_dp of a pipeline stage so that its
 * reductions overlap the last backward units (Note [DP overlap under PP]). */
int sl_trainer_dp_ready(void *tr, const sl_tensor *param);
/* Forward+backward over cfg.accum micro-batches (gradients accumulate with loss scale 1/accum),
 * clip, schedule, AdamW. stats->loss is the mean micro-batch loss before the update. */
sl_status sl_trainer_step(sl_trainer *tr, int64_t step, sl_batch_fn fn, void *user, sl_step_stats *stats);
/* Forward and backward of one micro-batch only (no update), gradients accumulate into the model. */
sl_status sl_trainer_forward_backward(sl_trainer *tr, const int32_t *ids, const int32_t *targets,
                                      float *loss);
/* Mean loss over `iters` global batches, forward only: eval step i runs this rank's micro-batches of the
 * step's global batch, fn(user, i, dp_rank x accum + m, ...) for m < accum, and the mean is taken over the
 * DP group (Note [Evaluation over the global batch], trainer.c): every layout scores the same samples. */
sl_status sl_trainer_eval(sl_trainer *tr, sl_batch_fn fn, void *user, int iters, float *loss);

/* ---- pipeline parallelism (src/train/pipeline.c; Note [Pipeline stages and 1F1B]) ---- */
enum { SL_PIPE_MAX_CHUNKS = 16 }; /* model chunks per stage (interleaved schedule) */
/* the schedules: 1F1B (interleaved with m->vpp > 1 chunks), or ZB-H1 (Note [Zero-bubble schedule]) */
typedef enum { SL_PIPE_1F1B = 0, SL_PIPE_ZB_H1 = 1 } sl_pipe_schedule;
sl_status sl_pipeline_new(sl_pipeline **out, sl_model *m, const struct sl_mesh *mesh, int B, int T,
                          int n_micro, float loss_scale, sl_pipe_schedule sched);
void sl_pipeline_free(sl_pipeline *P);
/* The loss's gradient seed in every last-virtual-stage slot (the base 1/(accum x dp) times the fp16 loss
 * scale, Note [Dynamic loss scaling]); stages without the loss ignore it. */
void sl_pipeline_set_loss_seed(sl_pipeline *P, float v);
/* Called after each forward unit of sl_pipeline_step (not of evaluation) with the unit's model chunk and
 * slot graph, before the slot's outputs can be overwritten (the MoE bias loads are read there). */
typedef sl_status (*sl_pipeline_fwd_fn)(void *user, int chunk, sl_graph *g);
void sl_pipeline_set_after_forward(sl_pipeline *P, sl_pipeline_fwd_fn fn, void *user);
/* The last unit of sl_pipeline_step that writes chunk c's parameter gradients (its last backward, or its
 * last W under zero bubble) is run as fn(user, c, g, lo, hi) instead of computing nodes [lo, hi) of slot
 * graph g itself, so that data parallelism can launch its bucket reductions from that run (Note [DP
 * overlap under PP]). NULL: none. */
typedef sl_status (*sl_pipeline_last_fn)(void *user, int chunk, sl_graph *g, int lo, int hi);
void sl_pipeline_set_last_grads(sl_pipeline *P, sl_pipeline_last_fn fn, void *user);
int sl_pipeline_chunks(const sl_pipeline *P); /* model chunks of this stage (virtual stages) */
/* Where chunk c's last gradient-writing unit falls among the chunks' last such units in the schedule
 * (0: first); -1 when c has none. */
int sl_pipeline_last_order(const sl_pipeline *P, int c);
sl_graph *sl_pipeline_chunk_graph(sl_pipeline *P, int c); /* chunk c's first slot graph (same nodes as all) */
/* Training dropout for the next steps: micro-batch i of step s (i counted over the whole data-parallel
 * group, as sl_pipeline_step's micro0 + i) draws the masks of stream s x micro_per_step + i, those the
 * single process draws for it (Note [Dropout from counters]); on = 0 turns every slot's masks off. */
void sl_pipeline_set_dropout(sl_pipeline *P, int on, uint64_t seed, uint64_t micro_per_step);
sl_graph *sl_pipeline_graph(sl_pipeline *P, int k);
/* chunk c's slot graph that ran the step's last micro-batch (NULL for a chunk past the last) */
sl_graph *sl_pipeline_last_graph(sl_pipeline *P,
                                 int c);     /* slot k's graph, chunk by chunk (NULL past the last) */
int sl_pipeline_slots(const sl_pipeline *P); /* over every chunk */
sl_plan_stats sl_pipeline_plan(const sl_pipeline *P); /* activations of every slot, summed */
/* Moves the slots' shared scratch region (Note [Shared scratch]) into caller memory of at least its size
 * (e.g. a communicator window), which must outlive the pipeline's use; before the next step. */
sl_status sl_pipeline_move_scratch(sl_pipeline *P, void *host, size_t bytes);
/* The first slot's backward: *n_b nodes of B (the input's gradient) and *n_w of W run later (zero bubble);
 * 1F1B: n_w = 0 */
void sl_pipeline_backward_split(const sl_pipeline *P, int *n_b, int *n_w);
/* One step's forward and backward of n_micro micro-batches (global indices micro0..) in 1F1B order;
 * *loss: the last stage's mean loss (undefined on the other stages). */
sl_status sl_pipeline_step(sl_pipeline *P, int64_t step, int n_micro, int micro0, sl_batch_fn fn, void *user,
                           int overwrite, float *loss);
/* Forward only: `iters` eval steps of n_micro micro-batches (global indices micro0..); *loss: the last
 * stage's mean (undefined on the other stages) */
sl_status sl_pipeline_eval(sl_pipeline *P, int iters, int n_micro, int micro0, sl_batch_fn fn, void *user,
                           float *loss);
double sl_pipeline_take_wait(sl_pipeline *P);         /* seconds blocked in receives since the last call */
double sl_pipeline_take_bytes(sl_pipeline *P);        /* bytes sent since the last call */
double sl_pipeline_comm_theory(const sl_pipeline *P); /* bytes this rank sends per step, by the schedule */
void sl_pipeline_add_bytes(sl_pipeline *P, double bytes); /* counts the trainer's tied-embedding exchange */

/* ---- checkpoint state of a trainer (src/train/ckpt_trainer.c) ---- */

/* Fills st (borrowing the trainer's buffers); *segs is owned by the caller (free()). Allocates the
 * single-process optimizer state if it does not exist yet. */
sl_status sl_trainer_ckpt_state(sl_trainer *tr, int rank, int world, sl_ckpt_state *st, sl_ckpt_seg **segs);
/* After loading: the optimizer step count to continue from. */
void sl_trainer_set_adam_t(sl_trainer *tr, int64_t t);

/* ---- a whole training job (src/train/job.c, run.c) ----
 * Options are plain data; sl_train_opts_default fills every field with the `suanli train` defaults. Error
 * messages name options by their `suanli train` flag (--seq-length, --load, ...). Integer options are
 * int64_t and real ones double so a flag table can point straight at them. Strings, FILEs and the
 * communicator are borrowed for the duration of the call. */

typedef struct sl_train_model_opts {
    int64_t num_layers, hidden_size, num_heads; /* 0: from --load's config.json, else 4 / 128 / 4 */
    int64_t vocab_size;                         /* 0: the data's; else must equal it */
    int64_t max_positions;                      /* 0: seq_length (or the loaded config's) */
    const char *init_from; /* Hugging Face model dir (Llama family, GPT-2) to start from, or NULL; a
                              non-zero size above conflicts with it */
    int bf16;              /* bf16 mixed precision over fp32 master weights */
    int fp16;              /* fp16 mixed precision (torch.autocast fp16 numerics) with dynamic loss scaling */
    const char *device;    /* backend name (sl_backend_get): NULL = "cpu" */
    /* dropout probabilities in [0, 1) (Megatron's --attention-dropout / --hidden-dropout; sl_model's fields
     * say where); 0: none */
    double attention_dropout, hidden_dropout;
} sl_train_model_opts;

typedef struct sl_train_data_opts {
    const char *path;          /* required: a directory made by `suanli data prepare` */
    int64_t seq_length;        /* tokens per sample T (128) */
    int64_t micro_batch_size;  /* samples per micro-batch B (8) */
    int64_t global_batch_size; /* samples per step, a multiple of B x dp; 0: B x dp */
} sl_train_data_opts;

typedef struct sl_train_optim_opts {
    double lr, min_lr;                 /* peak and final LR of the cosine decay; min_lr < 0: lr / 10 */
    int64_t warmup_iters, decay_iters; /* linear warmup; cosine decay length (0: train_iters) */
    double weight_decay, clip_grad;    /* clip_grad 0: off */
    double beta1, beta2, eps;
    /* --fp16 dynamic loss scaling, Megatron's flags and defaults (Note [Dynamic loss scaling]) */
    double initial_loss_scale, min_loss_scale; /* 2^32, 1 */
    int64_t loss_scale_window, hysteresis;     /* 1000, 2 */
} sl_train_optim_opts;

typedef struct sl_train_eval_opts {
    int64_t interval; /* steps between val-loss evaluations; 0: at the end only */
    int64_t iters;    /* val micro-batches per evaluation */
} sl_train_eval_opts;

typedef struct sl_train_ckpt_opts {
    const char *save_dir;  /* model.safetensors, config.json, tokenizer.json, metrics.jsonl and the
                              step-NNNNNNN checkpoints; NULL: nothing is written */
    const char *load_dir;  /* resume from its newest valid checkpoint, or start from its model.safetensors;
                              equal to save_dir: resume when there is a checkpoint, else start fresh */
    int64_t save_interval; /* steps between checkpoints under save_dir; 0: none */
    int64_t keep;          /* checkpoints to keep; 0: all */
    /* pooled node-local storage (suanli/ckpt.h sl_ckpt_pool): with local_dir the step checkpoints go to
       local_dir/host-<h> (h from SUANLI_HOSTS: rank * hosts / world) instead of save_dir, made redundant
       by `replicas` copies (default 1) or erasure coding `ec` ("K+M"); resuming looks there too */
    const char *local_dir;
    int64_t replicas;
    const char *ec;
    int shared; /* tiers: also drain every pooled save into save_dir (a shared mount), in the background */
    int64_t local_keep; /* pooled steps kept on each host (0: keep, which then applies to save_dir only) */
} sl_train_ckpt_opts;

typedef struct sl_train_parallel_opts {
    sl_comm *comm;      /* borrowed world communicator; NULL: from the environment (suanli run, torchrun, MPI,
                           Slurm), single process when there is none. Aborted when the run fails. */
    int64_t tp, pp, ep; /* mesh axes */
    int64_t etp;        /* --expert-tensor-parallel-size: 1 (experts whole on every TP rank) or tp (split) */
    int64_t sequence_parallel;        /* 1: sequence parallelism on top of tp > 1 */
    int64_t layers_per_virtual_stage; /* > 0: interleaved 1F1B with num-layers / (pp x this) model chunks
                                         per stage (--num-layers-per-virtual-pipeline-stage) */
    int64_t first_stage_layers;       /* > 0: layers of the first pipeline stage, the others share the rest
                                         (--decoder-first-pipeline-num-layers; Note [Uneven pipeline stages]) */
    int64_t last_stage_layers;        /* > 0: layers of the last stage (--decoder-last-pipeline-num-layers) */
    int64_t zero_bubble;              /* 1: the ZB-H1 schedule (--enable-zero-bubble; Note [Zero-bubble
                                         schedule]) */
    int64_t zero_stage;               /* 0..3 */
    int64_t bucket_elems;             /* gradient bucket size in elements */
    /* --recompute-granularity (Megatron's): NULL (nothing recomputed) or "full", transformer layers computed
     * again in the backward from their kept inputs (Note [Full recomputation], src/graph/autodiff.c);
     * --recompute-method "uniform" (default) or "block", --recompute-num-layers (1) */
    const char *recompute_granularity, *recompute_method;
    int64_t recompute_num_layers;
    /* --micro-batch-lanes: each micro-batch's rows split over this many graphs run side by side, one
     * thread each (Note [Micro-batch lanes], src/train/lanes.c); 0 or 1: one graph */
    int64_t micro_batch_lanes;
} sl_train_parallel_opts;

/* Mixture of experts (MoE models from --init-from; src/train/train_moe.c). Megatron-LM's flag names. */
typedef struct sl_train_moe_opts {
    const char *router; /* --moe-router: NULL/"config", "topk-softmax", "softmax-topk", "sigmoid" */
    double
        capacity_factor; /* --moe-capacity-factor: > 0 drops tokens past capacity; NAN (default): dropless */
    double aux_loss_coeff;   /* --moe-aux-loss-coeff: Switch load-balancing loss (0) */
    double z_loss_coeff;     /* --moe-z-loss-coeff: router z-loss (0) */
    double bias_update_rate; /* --moe-router-bias-update-rate: DeepSeek-V3 aux-loss-free balancing (0) */
    int64_t num_experts;     /* --num-experts: 0, or must equal the model's */
    int64_t topk;            /* --moe-router-topk: 0 = the model's num_experts_per_tok */
} sl_train_moe_opts;

typedef struct sl_train_log_opts {
    int64_t interval; /* steps between progress lines */
    FILE *out;        /* rank 0's progress lines, notes and the sample; NULL: silent */
    FILE *err;        /* warnings and generation timing; NULL: silent */
    const char
        *tensorboard_dir; /* rank 0 writes TensorBoard event files there (suanli/metrics.h); NULL: none */
} sl_train_log_opts;

typedef struct sl_train_sample_opts {
    int64_t tokens; /* print a sample of this many tokens at the end (rank 0); 0: none */
    const char *prompt;
    double temperature;
    int64_t top_k; /* 0: off */
} sl_train_sample_opts;

typedef struct sl_train_opts {
    int64_t train_iters;       /* optimizer steps */
    int64_t seed;              /* seeds init, data order and the sample */
    int64_t threads;           /* compute threads; 0: OpenMP's default */
    double exit_duration_mins; /* stop (eval, save) after this many minutes; 0: off */
    sl_train_model_opts model;
    sl_train_data_opts data;
    sl_train_optim_opts optim;
    sl_train_eval_opts eval;
    sl_train_ckpt_opts ckpt;
    sl_train_parallel_opts parallel;
    sl_train_log_opts log;
    sl_train_sample_opts sample;
    sl_train_moe_opts moe;
} sl_train_opts;

void sl_train_opts_default(sl_train_opts *o);

/* What a step callback sees (every rank). */
typedef struct sl_train_progress {
    int64_t step, train_iters; /* step: optimizer steps done, 1-based */
    sl_step_stats stats;
    double tokens_per_s;
    int evaluated;  /* 1: val_loss was computed after this step */
    float val_loss; /* NaN before the first evaluation */
} sl_train_progress;

typedef struct sl_train_callbacks {
    void *user;
    /* After each step (and its eval, metrics line and checkpoint start). Return non-zero to stop after this
     * step: the pending checkpoint is committed and the final files are saved. Under DP every rank must
     * return the same. May be NULL. */
    int (*on_step)(void *user, const sl_train_progress *p);
    /* Rank 0, after checkpoint `step` was committed under dir. May be NULL. */
    void (*on_checkpoint)(void *user, int64_t step, const char *dir);
} sl_train_callbacks;

typedef struct sl_train_result {
    int64_t steps;        /* optimizer steps done in total (incl. those before a resume) */
    int64_t resumed_step; /* the checkpoint step resumed from; -1: none */
    float loss, val_loss; /* last step's training loss; last val loss (NaN if none) */
    double seconds;       /* wall time of the step loop */
    int requeue;          /* stopped by SIGUSR1 after a checkpoint (no final save): exit SL_EXIT_REQUEUE */
} sl_train_result;

/* `suanli train`'s exit status after SIGUSR1 (EX_TEMPFAIL): checkpoint committed, requeue the job. */
#define SL_EXIT_REQUEUE 75

/* SIGUSR1 during the run: checkpoint at the end of the current step and return with result->requeue = 1
 * (Note [SIGUSR1: checkpoint and exit for requeue] in src/train/run.c).
 * Runs the whole job: the inputs are checked (and every rank's options compared) before anything is
 * written; then the step loop with eval, metrics, checkpoints and fault hooks (SUANLI_FAULT_KILL_AT_STEP,
 * SUANLI_FAULT_HANG_AT_STEP, SUANLI_FAULT_RANK; docs/ENV.md), the final save and the sample.
 * Returns SL_ERR_INVALID exactly when the options or the files they name are bad (nothing was written);
 * any other failure is a runtime one. cb and result may be NULL. */
sl_status sl_train_run(const sl_train_opts *opts, const sl_train_callbacks *cb, sl_train_result *result);

/* Print `prompt` and n_tokens sampled after it to out (NULL: nothing printed), token by token. A prompt
 * that does not encode (or encodes to nothing) fails with SL_ERR_INVALID. *seconds (may be NULL): the
 * generation time. */
sl_status sl_train_sample_print(sl_model *m, const sl_tokenizer *tok, const char *prompt, int n_tokens,
                                float temperature, int top_k, uint64_t seed, FILE *out, double *seconds);

#ifdef __cplusplus
}
#endif
#endif
