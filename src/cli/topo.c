/* NUMA-aware rank placement with hwloc (see topo.h). */
#include "cli/topo.h"

#include <hwloc.h>
#include <stdio.h>
#include <string.h>

static void place_one(hwloc_topology_t t, int r, int n, int nodes, sl_rank_place *p) {
    int node = (int)((long long)r * nodes / n);
    int first = -1, last = -1; /* ranks on this node */
    for (int k = 0; k < n; k++)
        if ((int)((long long)k * nodes / n) == node) {
            if (first < 0) first = k;
            last = k;
        }
    int on_node = last - first + 1, idx = r - first;
    hwloc_obj_t nd = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)node);
    hwloc_const_cpuset_t cs = nd ? nd->cpuset : hwloc_topology_get_topology_cpuset(t);
    int cores = hwloc_get_nbobjs_inside_cpuset_by_type(t, cs, HWLOC_OBJ_CORE);
    int per = cores >= on_node ? cores / on_node : 1;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    size_t k = 0;
    p->node = node;
    p->cores[0] = 0;
    for (int c = 0; c < per; c++) {
        int ci = cores >= on_node ? idx * per + c : idx % (cores > 0 ? cores : 1);
        hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(t, cs, HWLOC_OBJ_CORE, (unsigned)ci);
        if (!core) continue;
        hwloc_bitmap_or(set, set, core->cpuset);
        if (k < sizeof p->cores)
            k += (size_t)snprintf(p->cores + k, sizeof p->cores - k, "%s%u", c ? " " : "",
                                  core->logical_index);
    }
    hwloc_bitmap_list_snprintf(p->cpus, sizeof p->cpus, set);
    hwloc_bitmap_free(set);
}

int sl_topo_place(int n, const char *synthetic, sl_rank_place *out, char *err, size_t errcap) {
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0) {
        snprintf(err, errcap, "hwloc could not initialise");
        return 0;
    }
    if (synthetic && hwloc_topology_set_synthetic(t, synthetic) != 0) {
        snprintf(err, errcap, "--synthetic: hwloc rejects '%s'", synthetic);
        hwloc_topology_destroy(t);
        return 0;
    }
    if (hwloc_topology_load(t) != 0) {
        snprintf(err, errcap, "hwloc could not load the topology (HWLOC_XMLFILE?)");
        hwloc_topology_destroy(t);
        return 0;
    }
    int nodes = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
    if (nodes < 1) nodes = 1;
    for (int r = 0; r < n; r++) place_one(t, r, n, nodes, &out[r]);
    hwloc_topology_destroy(t);
    return nodes;
}
