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
} sl_mesh;

/* Validates the sizes (one-line error naming the flag) and splits the sub-communicators. world may be
 * NULL for a single process. */
sl_status sl_mesh_init(sl_mesh *mesh, sl_comm *world, sl_mesh_dims dims);
void sl_mesh_free(sl_mesh *mesh);

typedef struct sl_dp_opts {
    int zero_stage;       /* 0: all-reduce; 1: + sharded optimizer state; 2: + reduce-scattered grads;
                             3: + sharded parameters, gathered bucket by bucket just before use */
    int64_t bucket_elems; /* gradient bucket size in elements (0: 1 Mi) */
    int accum;            /* micro-batches per step; 1 lets stages 2 and 3 free the full-size gradient buffer
                             (gradient slots, see src/parallel/zero_slots.c); 0 = unknown: keep it */
} sl_dp_opts;

typedef struct sl_dp sl_dp;

/* Buckets are contiguous slices of the flat gradient buffer, formed in the order backward completes
 * them. Requires the graph (to know when each bucket's gradients are final). */
sl_status sl_dp_new(sl_dp **out, const sl_mesh *mesh, sl_model *m, sl_graph *g, const sl_dp_opts *o);
void sl_dp_free(sl_dp *dp);
/* The executor hook: launches a bucket's asynchronous reduction as soon as its last gradient write ran.
 * Active only while armed (the last micro-batch of a step). */
sl_status sl_dp_hook(sl_graph *g, int i, sl_tensor *n, void *user);
void sl_dp_arm(sl_dp *dp, int armed);
/* Bracket every execution of the graph (or of its forward range [0, end)) that runs with sl_dp_hook:
 * under ZeRO-3 begin launches the first parameter gathers and end waits for any still in flight. No-ops
 * for stages 0-2. */
sl_status sl_dp_begin_pass(sl_dp *dp, int end);
sl_status sl_dp_end_pass(sl_dp *dp);
/* ZeRO-3: all-gather the whole parameter buffer into m->params_mem again and bind the leaves to it (for
 * saving, sampling or reading the weights after training; collective). The next pass shards them
 * again. No-op for stages 0-2. */
sl_status sl_dp_gather_params(sl_dp *dp);
/* ZeRO-3: this rank's parameter shard, indexed like the optimizer state (sl_dp_state); else NULL. */
float *sl_dp_param_shard(sl_dp *dp);
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
int sl_dp_size(const sl_dp *dp);

#ifdef __cplusplus
}
#endif
#endif
