/* Private to src/parallel: the data-parallel state of dp.c (buckets, reduction, clipping, the sharded
 * optimizer) and zero_slots.c (ZeRO-3 parameter gathers, gradient slots, the ZeRO-1/2 parameter
 * all-gathers), one small struct per concern.
 *
 * Ownership: every part is written only by the file named here (read by either):
 *   sl_dp's own fields   the group, the model and the graph: set by sl_dp_new (dp.c), then read-only
 *   buckets              dp.c: the bucket plan, built by sl_dp_new, read-only afterwards
 *   reduce               dp.c: launches and waits for the bucket reductions; zero_slots.c's hook events
 *                        drive it through sl_dp_reduce_ready / sl_dp_reduce_wait / sl_dp_reduce_restart and
 *                        add the time they block to reduce.wait_sec
 *   shard                dp.c: the sharded optimizer state; zero_slots.c copies reduced gradient slots
 *                        into shard.grad_buf and gathers the parameters from shard.param_buf
 *   window               dp.c: Note [Gradients in a window]
 *   slots                zero_slots.c: the slot arena, the ZeRO-3 gather schedule, the gradient slots and
 *                        the ZeRO-1/2 parameter all-gathers; dp.c reads slots.arena.len (memory report)
 *                        and gets a bucket's gradient slot with sl_dp_grad_slot
 * Model state is moved with backend operations (sl_backend_copy / sl_backend_memset_zero on m->params_buf,
 * m->grads_buf, the shard buffers and the arena buffer); the communicator calls take the host mappings
 * (data parallelism requires host-visible memory, see sl_dp_new). */
#ifndef SUANLI_PARALLEL_DP_INTERNAL_H
#define SUANLI_PARALLEL_DP_INTERNAL_H

#include "suanli/device.h"
#include "suanli/parallel.h"

/* ---- the bucket plan (Note [DP buckets and shards]) ---- */
typedef struct dp_bucket {
    int64_t lo, hi;   /* [lo, hi) in the flat buffer */
    int64_t q;        /* ZeRO: part length per rank (len / n); 0 for stage 0 */
    int64_t part_off; /* ZeRO: offset of this rank's part in the shard arrays */
    int64_t tail_off; /* ZeRO: offset of the tail (len - n*q elements, owned by every rank) in them */
    int ready;        /* graph node index after which the bucket's gradients are final */
    int expert;       /* 1: routed experts' parameters, reduced over the expert-data-parallel group */
} dp_bucket;

typedef struct dp_buckets {
    dp_bucket *v; /* sorted by ready: the order backward completes them */
    int count;
} dp_buckets;

/* ---- the gradient reduction of a step ---- */
typedef struct dp_bucket_reqs {
    sl_comm_req *part; /* stages 0, 1: the bucket's all-reduce; 2, 3: the reduce-scatter of its parts */
    sl_comm_req *tail; /* stages 2, 3: the all-reduce of its tail */
} dp_bucket_reqs;

typedef struct dp_reduce {
    int armed;            /* the hook launches reductions (the last micro-batch of a step) */
    int next_launch;      /* buckets [0, next_launch) of the ready order are launched */
    dp_bucket_reqs *reqs; /* per bucket, in flight until waited for */
    double wait_sec;      /* time blocked inside the pass (reductions due, parameter gathers), reported and
                             reset by sl_dp_finish_grads */
    int early;            /* buckets launched by the hook (sl_dp_take_early_launches) */
} dp_reduce;

/* ---- the sharded optimizer state (backend buffers on m->backend; m1, m2, param: host mappings) ---- */
typedef struct dp_shard {
    int64_t len;                /* elements this rank updates: numel (stage 0), its parts and tails (1-3) */
    float *m1, *m2;             /* AdamW moments: full (stage 0) or shard (stages 1-3), mappings of: */
    sl_buffer *m1_buf, *m2_buf; /* (sl_dp_state hands the mappings to the checkpoint layer) */
    sl_buffer *grad_buf;        /* stages 2, 3: this rank's reduced gradients (its parts, then tails) */
    float *param;               /* stage 3: this rank's parameters, indexed like m1/m2 (mapping of:) */
    sl_buffer *param_buf;
    float gscale; /* gradient clipping factor of this step (sl_dp_clip), applied by the update */
} dp_shard;

/* ---- Note [Gradients in a window] ---- */
typedef struct dp_window {
    float *grads; /* the symmetric window m->grads_buf wraps while DP lives (NULL: not moved) */
    /* Note [Staged gradients]: a backend without host-visible memory keeps its gradients; this host window
     * (numel floats) holds each bucket's copy while it is reduced (NULL: not staged) */
    float *stage;
} dp_window;

/* ---- the slot schedule (zero_slots.c) ---- */
/* Both kinds of slot live in one arena. */
typedef struct dp_arena {
    sl_buffer *buf; /* on m->backend; with peers it wraps a symmetric window (sl_comm_mem_alloc) */
    float *map;     /* host mapping of buf (the window itself with peers), for the communicator calls */
    int64_t len;    /* elements the slot plan needs */
} dp_arena;

/* one use interval of a bucket's gathered parameters (Note [ZeRO-3 gather schedule]) */
typedef struct z3_iv {
    int k;       /* bucket */
    int L, S, E; /* gather launched after node L (-1: before the pass); used by nodes [S, E] */
    int64_t off; /* element offset of its slot in the arena */
    sl_comm_req *req;
    int launched;
} z3_iv;

/* stage 3: the parameter gathers */
typedef struct dp_z3 {
    z3_iv *iv; /* sorted by S */
    int count;
    int *by_launch;   /* interval indices sorted by L */
    int next_launch;  /* by_launch[0, next_launch) are launched (or skipped) this pass */
    int next_use;     /* iv[0, next_use) are waited for and bound (or skipped) this pass */
    int materialized; /* sl_dp_gather_params made m->params_buf whole again */
} dp_z3;

/* one bucket's gradient slot (Note [Gradient slots]) */
typedef struct dp_grad_slot {
    int gw0;        /* first node that touches the bucket's gradients; INT_MAX: none */
    int zero_after; /* the slot is zeroed and the gradient leaves bound to it after this node (gw0 - 1) */
    int done_after; /* the reduction is waited for and copied to the shard after this node */
    int64_t off;    /* element offset of the slot in the arena */
} dp_grad_slot;

/* stages 2, 3 with sl_dp_opts.accum == 1 (sl_dp.grad_slots) */
typedef struct dp_grad_slots {
    dp_grad_slot *v; /* per bucket */
    int *by_zero;    /* bucket indices sorted by zero_after */
    int next_zero;   /* by_zero[0, next_zero) are zeroed and bound (or skipped) this pass */
    int next_done;   /* buckets [0, next_done) of the ready order are completed this pass */
} dp_grad_slots;

/* stages 1, 2: the in-place all-gathers of the updated parameters (Note [Overlapped parameter gather]) */
typedef struct dp_param_gathers {
    int in_flight;      /* launched after the last update, not all waited for yet */
    int *pfirst;        /* per bucket: first node that reads its parameters (INT_MAX: none) */
    int *by_pfirst;     /* bucket indices sorted by pfirst */
    sl_comm_req **reqs; /* per bucket */
    int next_wait;      /* by_pfirst[0, next_wait) are waited for this pass */
} dp_param_gathers;

typedef struct dp_slots {
    int *param_bucket; /* parameter index -> bucket */
    int pass_end;      /* the pass runs nodes [0, pass_end) (sl_dp_begin_pass) */
    dp_arena arena;
    dp_z3 z3;
    dp_grad_slots grad;
    dp_param_gathers pgather;
} dp_slots;

struct sl_dp {
    sl_comm *comm;    /* dp communicator (NULL: dp == 1) */
    sl_comm *tp_comm; /* the mesh's TP communicator when the model is TP-split (the gradient norm) */
    sl_comm *pp_comm; /* the mesh's pipeline communicator for a pipeline stage (the gradient norm) */
    int n, r;         /* group size and this rank */
    /* expert parallelism: the expert-data-parallel group (NULL: size 1) of the expert buckets, its size and
     * this rank in it, and the EP group (the gradient norm sums the experts over it) */
    sl_comm *edp_comm, *ep_comm;
    int en, er;
    int zero;       /* ZeRO stage */
    int grad_slots; /* gradients live in slots (Note [Gradient slots]); m->grads_buf is freed */
    sl_model *m;
    sl_graph *g;                             /* the training graph */
    int (*ready)(void *, const sl_tensor *); /* sl_dp_opts.ready, ready_user */
    void *ready_user;
    dp_buckets buckets;
    dp_reduce reduce;
    dp_shard shard;
    dp_window window;
    dp_slots slots;
    double comm_bytes; /* bus bytes of the collectives launched since sl_dp_take_comm_bytes (dp_count) */
};

static inline size_t f32_bytes(int64_t n) { return sizeof(float) * (size_t)n; }
/* Note [DP communication volume]: the bytes each rank sends on a ring for a collective over `full` f32
 * elements in all (NCCL's bus bytes): (n-1)/n of them for an all-gather or a reduce-scatter (factor 1),
 * twice that for an all-reduce (factor 2). sl_dp_comm_theory gives the textbook count beside it. */
static inline void dp_count(sl_dp *dp, int factor, int64_t full) {
    if (dp->comm && dp->n > 1)
        dp->comm_bytes += factor * (double)(dp->n - 1) / dp->n * (double)f32_bytes(full);
}

/* the group that reduces bucket b: its size, this rank's index in it, its communicator (NULL: size 1) */
static inline int bk_n(const sl_dp *dp, const dp_bucket *b) { return b->expert ? dp->en : dp->n; }
static inline int bk_r(const sl_dp *dp, const dp_bucket *b) { return b->expert ? dp->er : dp->r; }
static inline sl_comm *bk_comm(const sl_dp *dp, const dp_bucket *b) {
    return b->expert ? dp->edp_comm : dp->comm;
}

/* dp_count over bucket b's group (the expert-data-parallel group for expert buckets) */
static inline void dp_count_bk(sl_dp *dp, const dp_bucket *b, int factor, int64_t full) {
    int n = bk_n(dp, b);
    if (bk_comm(dp, b) && n > 1) dp->comm_bytes += factor * (double)(n - 1) / n * (double)f32_bytes(full);
}

/* wait for *r if set and clear it */
static inline sl_status dp_wait_req(sl_comm_req **r) {
    sl_status st = SL_OK;
    if (*r) st = sl_comm_wait(*r);
    *r = NULL;
    return st;
}

/* dp.c: the reduction, for the hook events */
/* launch the reductions of the buckets ready after node i (while armed, or always with gradient slots) */
sl_status sl_dp_reduce_ready(sl_dp *dp, int i);
/* wait for bucket k's reductions, adding the time to reduce.wait_sec */
sl_status sl_dp_reduce_wait(sl_dp *dp, int k);
void sl_dp_reduce_restart(sl_dp *dp); /* a new pass: no bucket launched yet */

/* zero_slots.c */
sl_status sl_dp_slots_build(sl_dp *dp); /* stages 1-3: use points, slots */
/* ZeRO-1/2: wait for every parameter all-gather still in flight */
/* ZeRO-1/2: launch the in-place all-gathers of the updated parameter parts (in forward-use order) */
sl_status sl_dp_launch_param_gathers(sl_dp *dp);
/* ZeRO-3: after sl_dp_gather_params, drop the whole parameter buffer again (training goes on) */
void sl_dp_reshard_params(sl_dp *dp);
void sl_dp_slots_free(sl_dp *dp);
sl_status sl_dp_slots_advance(sl_dp *dp, int i); /* events after node i (-1: before the first) */
/* after the last node: wait for and copy every gradient reduction not yet copied */
sl_status sl_dp_slots_finish(sl_dp *dp);
/* host address of bucket k's gradient slot (gradient slots only) */
float *sl_dp_grad_slot(const sl_dp *dp, int k);

#endif
