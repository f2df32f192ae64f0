/* Private to src/parallel: the data-parallel state shared by dp.c (buckets, reduction, clipping, the
 * sharded optimizer) and zero_slots.c (ZeRO-3 parameter gathers and gradient slots). */
#ifndef SUANLI_PARALLEL_DP_INTERNAL_H
#define SUANLI_PARALLEL_DP_INTERNAL_H

#include "suanli/parallel.h"

typedef struct {
    int64_t lo, hi, q;  /* [lo, hi) in the flat buffer; q = part length per rank (ZeRO) */
    int64_t soff, toff; /* offsets of this rank's part and of the tail in the shard arrays */
    int ready;          /* graph node index after which the bucket's gradients are final */
    /* gradient slots (Note [Gradient slots]) */
    int gz;       /* the slot is zeroed and the bucket's gradient leaves bound to it after node gz */
    int gw0;      /* first node that touches the bucket's gradients (gz = gw0 - 1); INT_MAX: none */
    int gdone;    /* the reduction is waited for and copied to the shard after node gdone */
    int64_t goff; /* slot offset in the arena */
    int pfirst;   /* first node that reads the bucket's parameters (INT_MAX: none) */
    sl_comm_req *req, *req_tail;
    sl_comm_req *preq; /* ZeRO-1/2: the parameter all-gather after the update, waited for before pfirst */
} bucket;

/* one use interval of a bucket's gathered parameters (Note [ZeRO-3 gather schedule]) */
typedef struct {
    int k;       /* bucket */
    int L, S, E; /* gather launched after node L (-1: before the pass); used by nodes [S, E] */
    int64_t off; /* element offset of its slot in the arena */
    sl_comm_req *req;
    int launched;
} z3_iv;

struct sl_dp {
    sl_comm *comm; /* dp communicator (NULL: dp == 1) */
    int n, r, zero;
    sl_model *m;
    bucket *b; /* sorted by ready */
    int nb, next, armed;
    float *m1, *m2; /* AdamW moments: full (stage 0) or shard (stages 1-3); host mappings of: */
    sl_buffer *m1_buf, *m2_buf;
    float *gshard; /* stages 2, 3: this rank's reduced gradients (its parts, then tails) */
    sl_buffer *gshard_buf;
    int64_t shard_len; /* elements this rank updates */
    double wait_sec;
    float gscale; /* gradient clipping factor of this step (sl_dp_clip), applied by the update */
    /* slots: ZeRO-3 parameter gathers and gradient slots share one arena */
    sl_graph *g;
    int gslots;    /* gradients live in slots; m->grads_mem is freed */
    float *pshard; /* stage 3: this rank's parameters, indexed like m1/m2 */
    sl_buffer *pshard_buf;
    float *arena;
    int64_t arena_len;
    z3_iv *iv;  /* sorted by S */
    int *by_l;  /* interval indices sorted by L */
    int *by_gz; /* bucket indices sorted by gz */
    int *by_pf; /* bucket indices sorted by pfirst */
    int niv, cl, cs, cgz, cgd, cpf, range_end;
    int pgather;      /* ZeRO-1/2: parameter all-gathers in flight (Note [Overlapped parameter gather]) */
    int *pbucket;     /* parameter index -> bucket */
    int materialized; /* sl_dp_gather_params made m->params_mem whole again */
    float *gwin;      /* m->grads_mem moved into a symmetric window (Note [Gradients in a window]) */
    sl_graph *gwin_graph;
};

/* zero_slots.c */
sl_status sl_dp_slots_build(sl_dp *dp, sl_graph *g); /* stages 1-3: use points, slots */
/* ZeRO-1/2: wait for every parameter all-gather still in flight */
sl_status sl_dp_sync_params(sl_dp *dp);
/* ZeRO-1/2: launch the in-place all-gathers of the updated parameter parts (in forward-use order) */
sl_status sl_dp_launch_param_gathers(sl_dp *dp);
void sl_dp_slots_free(sl_dp *dp);
sl_status sl_dp_slots_advance(sl_dp *dp, int i); /* events after node i (-1: before the first) */
/* after the last node: wait for and copy every gradient reduction not yet copied */
sl_status sl_dp_slots_finish(sl_dp *dp);
/* dp.c */
sl_status sl_dp_launch_bucket(sl_dp *dp, bucket *b);

#endif
