/* NUMA-aware placement of the local ranks from hwloc, shared by `suanli topo --ranks` and
 * `suanli run --bind numa|auto` (src/cli/topo.c). */
#ifndef SL_CLI_TOPO_H
#define SL_CLI_TOPO_H
#include <stddef.h>

typedef struct sl_rank_place {
    int node;        /* NUMA node (logical index) */
    char cpus[256];  /* OS CPU list of its cores' PUs, e.g. "0-3,64-67" */
    char cores[256]; /* logical core indexes, space separated */
} sl_rank_place;

/* Ranks 0..n-1 go to NUMA nodes in blocks (rank r on node r * nodes / n) and share that node's cores in
 * blocks (cores / ranks-on-node each; round-robin when there are fewer cores than ranks). Uses the
 * topology hwloc loads (HWLOC_XMLFILE / HWLOC_SYNTHETIC honoured), or `synthetic` when not NULL.
 * Returns the number of NUMA nodes (>= 1), or 0 when hwloc fails (err filled). */
int sl_topo_place(int n, const char *synthetic, sl_rank_place *out, char *err, size_t errcap);
#endif
