/* suanli topo — the host, NUMA nodes, cores, PUs and caches this process sees, from hwloc; with --ranks N
 * the NUMA-aware placement of N ranks (ranks spread over NUMA nodes in blocks, each rank's cores inside one
 * node). hwloc honours HWLOC_XMLFILE and HWLOC_SYNTHETIC, and --synthetic DESC sets a synthetic topology
 * (e.g. "numa:2 core:4 pu:1"), so a two-node machine can be shown (and tested) on a one-node host. */
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/topo.h"
#include "suanli/base.h"

static void usage(FILE *f) {
    fprintf(f, "usage: suanli topo [--synthetic DESC] [--ranks N] [--export-xml FILE]\n"
               "  prints the host, NUMA nodes (memory, cores, PUs) and caches (hwloc; HWLOC_XMLFILE and\n"
               "  HWLOC_SYNTHETIC are honoured). --ranks N: the NUMA-aware CPU block of each of N ranks.\n"
               "  --export-xml FILE: write the topology as hwloc XML (for HWLOC_XMLFILE elsewhere).\n");
}

static void print_caches(hwloc_topology_t t) {
    static const hwloc_obj_type_t types[] = {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE};
    for (int k = 0; k < 3; k++) {
        int n = hwloc_get_nbobjs_by_type(t, types[k]);
        if (n <= 0) continue;
        hwloc_obj_t o = hwloc_get_obj_by_type(t, types[k], 0);
        printf("  L%d cache: %d x %llu KiB\n", k + 1, n, (unsigned long long)(o->attr->cache.size / 1024));
    }
}

static int print_ranks(const char *synthetic, int nranks) {
    sl_rank_place *p = calloc((size_t)nranks, sizeof *p);
    char err[512];
    if (!p || !sl_topo_place(nranks, synthetic, p, err, sizeof err)) {
        fprintf(stderr, "suanli topo: %s\n", p ? err : "out of memory");
        free(p);
        return 1;
    }
    printf("placement of %d ranks (suanli run --bind numa):\n", nranks);
    for (int r = 0; r < nranks; r++)
        printf("  rank %d: NUMA node %d, cores %s (CPUs %s)\n", r, p[r].node, p[r].cores, p[r].cpus);
    free(p);
    return 0;
}

int sl_cmd_topo(int argc, char **argv) {
    const char *synthetic = NULL, *xml_out = NULL;
    int nranks = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--export-xml") && v) {
            if (!*v) { /* was ": rename failed: No such file or directory" */
                fprintf(stderr, "suanli topo: --export-xml: empty value\n");
                return 2;
            }
            xml_out = v;
            i++;
        } else if (!strcmp(a, "--synthetic") && v) {
            synthetic = v;
            i++;
        } else if (!strcmp(a, "--ranks") && v) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 65536) {
                fprintf(stderr, "suanli topo: --ranks: expected an integer in 1..65536, got '%s'\n", v);
                return 2;
            }
            nranks = (int)n;
            i++;
        } else {
            fprintf(stderr, "suanli topo: unknown flag or missing value '%s' (see suanli topo --help)\n", a);
            return 2;
        }
    }
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0) {
        fprintf(stderr, "suanli topo: hwloc could not initialise\n");
        return 1;
    }
    if (synthetic && hwloc_topology_set_synthetic(t, synthetic) != 0) {
        fprintf(stderr, "suanli topo: --synthetic: hwloc rejects '%s'\n", synthetic);
        hwloc_topology_destroy(t);
        return 2;
    }
    if (hwloc_topology_load(t) != 0) {
        fprintf(stderr, "suanli topo: hwloc could not load the topology (HWLOC_XMLFILE?)\n");
        hwloc_topology_destroy(t);
        return 2;
    }
    if (xml_out) { /* through memory, then atomically: hwloc's own writer left an empty file on a full disk */
        char *xml = NULL;
        int len = 0;
        if (hwloc_topology_export_xmlbuffer(t, &xml, &len, 0) != 0) {
            fprintf(stderr, "suanli topo: --export-xml: hwloc could not export the topology\n");
            hwloc_topology_destroy(t);
            return 1;
        }
        sl_status st =
            sl_file_write_atomic(xml_out, xml, len > 0 ? (size_t)len - 1 : 0); /* len counts the NUL */
        hwloc_free_xmlbuffer(t, xml);
        if (st != SL_OK) {
            fprintf(stderr, "suanli topo: --export-xml: %s\n", sl_errmsg());
            hwloc_topology_destroy(t);
            return 2;
        }
    }
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    int nn = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE),
        np = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);
    int nc = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE), npu = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
    printf("host %s%s: %d package(s), %d NUMA node(s), %d core(s), %d PU(s)\n", host,
           synthetic || getenv("HWLOC_XMLFILE") || getenv("HWLOC_SYNTHETIC") ? " (synthetic/XML topology)"
                                                                             : "",
           np, nn, nc, npu);
    for (int i = 0; i < nn; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)i);
        char cpus[256];
        hwloc_bitmap_list_snprintf(cpus, sizeof cpus, o->cpuset);
        printf("  NUMA node %u: %.2f GiB, %d core(s), PUs %s\n", o->os_index,
               (double)o->attr->numanode.local_memory / 1073741824.0,
               hwloc_get_nbobjs_inside_cpuset_by_type(t, o->cpuset, HWLOC_OBJ_CORE), cpus);
    }
    print_caches(t);
    hwloc_topology_destroy(t);
    return nranks ? print_ranks(synthetic, nranks) : 0;
}
