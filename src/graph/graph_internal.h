#ifndef SL_GRAPH_INTERNAL_H
#define SL_GRAPH_INTERNAL_H
#include "suanli/device.h"
#include "suanli/graph.h"

struct sl_graph {
    sl_ctx *ctx;
    sl_tensor **nodes; /* computed nodes in execution order */
    int n_nodes, cap_nodes;
    uint8_t *visited; /* by tensor id */
    int visited_cap;
    sl_tensor **grads;    /* by tensor id: gradient node computed by backward */
    int *last_grad_write; /* by tensor id (params): index of the last node writing into p->grad */
    int grads_cap;
    /* plan */
    sl_backend *backend;
    sl_buffer *arena;
    size_t arena_bytes; /* planned size */
    size_t *offsets;    /* by node index; SIZE_MAX if not owning storage */
    /* Note [Reserved rows]: the SL_FLAG_ROWS_CAP storages, planned apart in their own buffer */
    sl_buffer *cap_arena;
    size_t cap_bytes;   /* planned size of that region */
    void *cap_map;      /* its address space when reserved with mmap (NULL: allocated on the backend) */
    size_t cap_map_len; /* ... and that mapping's length (whole pages) */
    uint8_t *region;    /* by node index: where its storage lies (REGION_*, graph.c) */
    /* Note [Shared scratch]: the phases whose transient storages go to a region the caller shares */
    int n_phases;
    int phase_end[SL_GRAPH_MAX_PHASES];
    size_t scratch_bytes; /* planned size of the shared region (0: none) */
    sl_buffer *scratch;   /* borrowed: bound by sl_graph_bind_scratch */
    int planned;
    sl_collective_fn coll_fn; /* runs COLLECTIVE nodes (borrowed user pointer) */
    void *coll_user;
    int recompute, recompute_layers; /* sl_graph_set_recompute */
};

int sl_profile_enabled(void);
void sl_profile_add(sl_op op, double sec);
void sl_graph_push(sl_graph *g, sl_tensor *t);
void sl_graph_ensure_id_capacity(sl_graph *g);
/* Note [Host fallback]: SUANLI_HOST_FALLBACK=1 set; run node t (an op be does not support) on the CPU */
int sl_host_fallback_enabled(void);
sl_status sl_host_fallback(sl_backend *be, sl_tensor *t);
#endif
