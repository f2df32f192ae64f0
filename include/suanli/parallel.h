/* suanli/parallel.h — the device mesh and data parallelism (with ZeRO-1/2/3 sharding).
 *
 * Usage (one process per rank):
 *   sl_comm *world; sl_comm_init_env(&world, NULL);
 *   sl_mesh mesh; sl_mesh_init(&mesh, world, (sl_mesh_dims){.tp = 1, .pp = 1, .ep = 1});  // dp = rest
 *   sl_dp *dp; sl_dp_new(&dp, &mesh, model, &(sl_dp_opts){.zero_stage = 1, .bucket_elems = 1 << 20});
 *   trainer.dp = dp;          // the trainer then overlaps bucketed gradient reduction with backward
 *
 * Rank layout (Megatron order): rank = ((pp_rank * dp) + dp_rank) * tp + tp_rank; the expert axis folds
 * inside dp (ep_rank = dp_rank % ep). Each axis has its own sub-communicator (NULL when its size is 1).
 */
#ifndef SUANLI_PARALLEL_H
#define SUANLI_PARALLEL_H

#include "suanli/comm.h"
#include "suanli/graph.h"
#include "suanli/nn.h"
#include "suanli/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sl_mesh_dims {
    int tp, pp, ep; /* dp = world / (tp * pp); ep must divide dp */
} sl_mesh_dims;

typedef struct sl_mesh {
    int world, rank;
    int dp, tp, pp, ep;
    int dp_rank, tp_rank, pp_rank, ep_rank;
    sl_comm *world_comm;                            /* borrowed */
    sl_comm *dp_comm, *tp_comm, *pp_comm, *ep_comm; /* owned; NULL when that axis has size 1 */
    /* the expert-data-parallel group: the dp / ep ranks of the DP group with this ep_rank (they hold the
     * same experts; owned; NULL when dp == ep) */
    sl_comm *edp_comm;
} sl_mesh;

/* Validates the sizes (one-line error naming the flag) and splits the sub-communicators. world may be
 * NULL for a single process. */
sl_status sl_mesh_init(sl_mesh *mesh, sl_comm *world, sl_mesh_dims dims);
/* Rank placement (done by sl_mesh_init on a multi-host world): every tp group (tp consecutive ranks)
 * on one host, host_of[r] = rank r's host (sl_comm_host_of); else SL_ERR_INVALID naming the group. */
sl_status sl_mesh_check_hosts(int n, int tp, const int *host_of);
void sl_mesh_free(sl_mesh *mesh);

typedef struct sl_dp_opts {
    int zero_stage;       /* 0: all-reduce; 1: + sharded optimizer state; 2: + reduce-scattered grads;
                             3: + sharded parameters, gathered bucket by bucket just before use */
    int64_t bucket_elems; /* gradient bucket size in elements (0: 1 Mi) */
    int accum;            /* micro-batches per step; 1 lets stages 2 and 3 free the full-size gradient buffer
                             (gradient slots, see src/parallel/zero_slots.c); 0 = unknown: keep it */
    /* When a parameter's gradient is final, in the numbering of the hook calls (sl_dp_hook's i): NULL for
     * the last node of g that writes it. A pipeline stage numbers its chunks' last backward units
     * (sl_trainer_dp_ready); SL_DP_READY_LATE holds a bucket for sl_dp_finish_grads (a gradient changed
     * after the backward, as a pipeline's tied embedding); -1: no node writes it. */
    int (*ready)(void *user, const sl_tensor *param);
    void *ready_user;
} sl_dp_opts;
enum { SL_DP_READY_LATE = 0x7fffffff };

typedef struct sl_dp sl_dp;

/* Buckets are contiguous slices of the flat gradient buffer, formed in the order backward completes
 * them. Requires the graph (to know when each bucket's gradients are final). */
sl_status sl_dp_new(sl_dp **out, const sl_mesh *mesh, sl_model *m, sl_graph *g, const sl_dp_opts *o);
void sl_dp_free(sl_dp *dp);
/* The executor hook: launches a bucket's asynchronous reduction as soon as its last gradient write ran.
 * Active only while armed (the last micro-batch of a step). */
sl_status sl_dp_hook(sl_graph *g, int i, sl_tensor *n, void *user);
void sl_dp_arm(sl_dp *dp, int armed);
/* 1 when this dp's bucket plan came from the ready function fn with user (sl_dp_opts.ready) */
int sl_dp_ready_from(const sl_dp *dp, int (*fn)(void *, const sl_tensor *), const void *user);
/* Buckets the hook launched since the last call (during the armed backward), then reset: a test's evidence
 * that the reductions overlapped the backward. */
int sl_dp_take_early_launches(sl_dp *dp);
/* Bracket every execution of the graph (or of its forward range [0, end)) that runs with sl_dp_hook:
 * under ZeRO-3 begin launches the first parameter gathers and end waits for any still in flight. No-ops
 * for stages 0-2. */
sl_status sl_dp_begin_pass(sl_dp *dp, int end);
sl_status sl_dp_end_pass(sl_dp *dp);
/* ZeRO-3: all-gather the whole parameter buffer into m->params_mem again and bind the leaves to it (for
 * saving, sampling or reading the weights after training; collective). The next pass shards them
 * again. No-op for stages 0-2. */
sl_status sl_dp_gather_params(sl_dp *dp);
/* Wait for the parameter all-gathers the last ZeRO-1/2 update launched (they overlap the next forward,
 * whose nodes wait for them through sl_dp_hook): for callers that run the forward without the hook (a
 * pipeline stage's schedule). */
sl_status sl_dp_sync_params(sl_dp *dp);
/* Add delta[0..n) to parameters [lo, lo + n) of the flat buffer: ZeRO-3 adds to the elements of this rank's
 * shard (the others' owners add theirs: every rank must call it with the same delta); stages 0-2 to the
 * model's parameters. For updates outside the optimizer that are the same on every rank (the MoE bias). */
sl_status sl_dp_add_params(sl_dp *dp, int64_t lo, int64_t n, const float *delta);
/* ZeRO-3: this rank's parameter shard, indexed like the optimizer state (sl_dp_state); else NULL. */
float *sl_dp_param_shard(sl_dp *dp);
/* ZeRO-3: the buffer holding that shard (on a backend without host-visible memory the pointer above is NULL
 * and callers copy through the contract) */
sl_buffer *sl_dp_param_shard_buf(sl_dp *dp);
/* 1 when gradients live in slots (m->grads_mem is freed; the trainer must run one micro-batch per step). */
int sl_dp_grad_slots(const sl_dp *dp);
/* Wait for every bucket (after the graph ran); adds the wait time to *wait_sec. */
sl_status sl_dp_finish_grads(sl_dp *dp, double *wait_sec);
/* Global grad norm (squares summed over the rank's shard and all-reduced under ZeRO-2/3) and the clipping
 * factor, which the next sl_dp_optimizer_step applies inside the update (no separate pass). */
sl_status sl_dp_clip(sl_dp *dp, float max_norm, float *norm);
/* The same on loss-scaled gradients: *norm is the global norm times inv_scale (the unscaled norm; inf or nan
 * on every rank alike when any rank's gradients overflowed) and the factor applied in the update is
 * clip_coef(*norm) * inv_scale (Note [Dynamic loss scaling]). */
sl_status sl_dp_clip_unscale(sl_dp *dp, float max_norm, float inv_scale, float *norm);
/* Optimizer step: full AdamW (stage 0) or on this rank's shard followed by an all-gather of the
 * parameters (stages 1, 2; overlapped with the next forward) or nothing more (stage 3). */
sl_status sl_dp_optimizer_step(sl_dp *dp, float lr, int64_t t, sl_adamw_hparams hp);
/* Mean of a scalar over the dp group. */
sl_status sl_dp_mean(sl_dp *dp, float *v);
/* Bus bytes (NCCL's convention) of the gradient and parameter collectives this rank launched since the
 * last call, and the textbook count for one step (Note [DP communication volume] in dp.c; NAN for ZeRO-3) */
double sl_dp_take_comm_bytes(sl_dp *dp);
double sl_dp_comm_theory(const sl_dp *dp);
/* Bytes this rank holds for parameters, gradients (the reduced shard under ZeRO-2, plus the backward
 * accumulation buffer) and optimizer state, from the actual allocations. */
typedef struct sl_dp_memory {
    size_t param_bytes; /* full buffer; ZeRO-3: this rank's shard */
    size_t slot_bytes;  /* ZeRO-3 gathered parameter buckets + in-flight gradient buckets (one arena) */
    size_t grad_bytes;  /* full backward accumulation buffer (0 with gradient slots) */
    size_t grad_shard_bytes, optim_bytes;
} sl_dp_memory;
void sl_dp_memory_report(const sl_dp *dp, sl_dp_memory *mem);
int sl_dp_num_buckets(const sl_dp *dp);
int sl_dp_rank(const sl_dp *dp);
int sl_dp_zero_stage(const sl_dp *dp);
/* A range [lo, lo+len) of the flat parameter buffer owned by this rank; `off` indexes the rank's state
 * arrays. The checkpoint layer calls it sl_ckpt_seg (suanli/ckpt.h). */
typedef struct sl_dp_seg {
    int64_t lo, len, off;
} sl_dp_seg;
/* This rank's optimizer-state segments of the flat buffer (owned array, free()) and moment arrays
 * (borrowed), for checkpointing. Stage 0: one segment covering everything. */
sl_status sl_dp_state(sl_dp *dp, sl_dp_seg **segs, int *nseg, float **m1, float **m2);
/* the moments' backend buffers (indexed like sl_dp_state's arrays): what a checkpoint copies through the
 * contract when the backend's memory is not host-visible (the arrays are then NULL) */
void sl_dp_state_bufs(sl_dp *dp, sl_buffer **m1, sl_buffer **m2);
int sl_dp_size(const sl_dp *dp);

/* ---- tensor parallelism (src/parallel/tp.c; Note [Tensor-parallel graphs]) ----
 * Usage: sl_gpt2_new_tp(&cfg, be, mesh.tp, mesh.tp_rank, &m); sl_tp_new(&tp, &mesh);
 *        sl_tp_load_full(m, full_model_with_the_same_init);  // or a checkpoint
 *        trainer.tp = tp (before sl_trainer_init: the trainer installs the collective provider). */
typedef struct sl_tp sl_tp;
sl_status sl_tp_new(sl_tp **out, const sl_mesh *mesh);
void sl_tp_free(sl_tp *tp);
int sl_tp_size(const sl_tp *tp);
/* The graph's collective provider (sl_graph_set_collective) for COLLECTIVE nodes of group SL_GROUP_TP. */
sl_status sl_tp_collective(void *tp, sl_tensor *node);
/* Time spent in, and bytes sent by, TP collectives since the last call (then reset): bus bytes (Note [TP
 * communication volume]). */
void sl_tp_take_stats(sl_tp *tp, double *sec, double *bytes);
/* Copy parameter p between its full layout (`full`) and TP rank r's shard (Note [TP shard layout]). */
void sl_tp_shard_copy(const sl_param_info *p, int tp, int r, float *full, float *shard, int to_shard);
/* shard's parameters := its part of `full` (a whole model of the same architecture and config), by name:
 * a TP shard and/or a pipeline stage's parameters. */
sl_status sl_tp_load_full(sl_model *shard, const sl_model *full);
/* The full parameters, in a whole model's flat layout (sl_tp_full_numel floats), on every rank of the
 * TP group (collective; tp may be NULL for an unsplit model). */
sl_status sl_tp_gather_full(sl_tp *tp, const sl_model *shard, float *full);
int64_t sl_tp_full_numel(const sl_model *shard);
/* The whole model from every TP shard and pipeline stage, written into `whole` (a model of the same
 * config) on the pipeline's first stage (collective over the TP and pipeline groups; whole is unused on the
 * other stages and may be NULL there). */
sl_status sl_par_gather_whole(sl_tp *tp, const sl_mesh *mesh, const sl_model *stage, sl_model *whole);
/* Sum of squares of the gradients of the whole model (sharded parts all-reduced over the group,
 * replicated parameters counted once). */
sl_status sl_tp_grad_sumsq(sl_tp *tp, const sl_model *m, double *ss);
/* Megatron's TP communication per training step of a GPT-2 shard / stage in bus bytes per rank (Note [TP
 * communication volume]), for micro_batches (B, T) micro-batches. */
double sl_tp_comm_theory(const sl_model *m, int B, int T, int micro_batches);
/* Expert parallelism (src/parallel/ep.c; Note [Expert-parallel dispatch]): the same provider runs the
 * all-to-all(v) nodes of group SL_GROUP_EP over the mesh's EP communicator. Time inside them and bytes
 * sent to other ranks since the last call (then reset). */
void sl_ep_take_stats(sl_tp *tp, double *sec, double *bytes);
/* Moves the graphs' activation arenas into windows of the EP communicator (collective over the EP group:
 * same graphs in the same order; Note [EP activations in a window]); the windows live until sl_tp_free,
 * which must come after the graphs' last computation. No-op without EP. */
sl_status sl_ep_window_arenas(sl_tp *tp, sl_graph **graphs, int n);
/* One window of `bytes` of the EP communicator (collective over the EP group), freed by sl_tp_free; *out =
 * NULL without EP. */
sl_status sl_ep_window_alloc(sl_tp *tp, size_t bytes, void **out);
/* `whole` (the same split without EP: every expert; TP shard and pipeline stage as `mine`) from every EP
 * rank's experts: collective over the EP group; every rank gets it. */
sl_status sl_ep_gather_whole(const sl_mesh *mesh, const sl_model *mine, sl_model *whole);

#ifdef __cplusplus
}
#endif
#endif
