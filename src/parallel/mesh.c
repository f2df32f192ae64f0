/* The device mesh: dp x pp x tp (x ep inside dp) with one sub-communicator per axis. */
#include <stdlib.h>
#include <string.h>

#include "suanli/parallel.h"

/* Note [Rank placement]
 * Launchers number ranks host by host (suanli run --nnodes: node k holds ranks k*nproc...; srun and
 * mpirun by default fill a node before the next), and the mesh makes tp the fastest-varying axis
 * (tp_rank = rank % tp), then dp, then pp. So a tp group is tp consecutive ranks, and it lies inside
 * one host exactly when every host's ranks are consecutive and tp divides the ranks per host. TP
 * all-reduces run in every layer's forward and backward (the most frequent, latency-bound traffic),
 * so a tp group that straddles hosts puts them on the slow link: refused, with the fix in the message.
 * dp (and pp) groups then span hosts, and the DP gradient all-reduce takes the hierarchical
 * algorithm over their hybrid communicator (src/comm/algo/hier.c). */
sl_status sl_mesh_check_hosts(int n, int tp, const int *host_of) {
    if (!host_of || tp <= 1) return SL_OK;
    for (int g = 0; g + tp <= n; g += tp)
        for (int k = g + 1; k < g + tp; k++)
            if (host_of[k] != host_of[g]) {
                int per = 0;
                for (int r = 0; r < n; r++) per += host_of[r] == host_of[g];
                return sl_fail(
                    SL_ERR_INVALID,
                    "--tensor-model-parallel-size %d: tp group of ranks %d..%d spans hosts %d and %d "
                    "(host %d has %d ranks); tp must divide the ranks per host, ranks numbered host by "
                    "host",
                    tp, g, g + tp - 1, host_of[g], host_of[k], host_of[g], per);
            }
    return SL_OK;
}

sl_status sl_mesh_init(sl_mesh *mesh, sl_comm *world, sl_mesh_dims d) {
    memset(mesh, 0, sizeof *mesh);
    int n = world ? sl_comm_size(world) : 1, r = world ? sl_comm_rank(world) : 0;
    if (d.tp < 1) return sl_fail(SL_ERR_INVALID, "--tensor-model-parallel-size must be >= 1, got %d", d.tp);
    if (d.pp < 1) return sl_fail(SL_ERR_INVALID, "--pipeline-model-parallel-size must be >= 1, got %d", d.pp);
    if (d.ep < 1) return sl_fail(SL_ERR_INVALID, "--expert-model-parallel-size must be >= 1, got %d", d.ep);
    if (n % (d.tp * d.pp) != 0)
        return sl_fail(SL_ERR_INVALID,
                       "world size %d is not divisible by tensor x pipeline parallel size %d x %d", n, d.tp,
                       d.pp);
    int dp = n / (d.tp * d.pp);
    if (dp % d.ep != 0)
        return sl_fail(SL_ERR_INVALID,
                       "data-parallel size %d is not divisible by --expert-model-parallel-size %d", dp, d.ep);
    if (world && sl_comm_nhosts(world) > 1) {
        int *host_of = malloc(sizeof(int) * (size_t)n);
        if (!host_of) return sl_fail(SL_ERR_NOMEM, "mesh: out of memory");
        for (int q = 0; q < n; q++) host_of[q] = sl_comm_host_of(world, q);
        sl_status hs = sl_mesh_check_hosts(n, d.tp, host_of);
        free(host_of);
        SL_TRY(hs);
    }
    mesh->world = n;
    mesh->rank = r;
    mesh->dp = dp;
    mesh->tp = d.tp;
    mesh->pp = d.pp;
    mesh->ep = d.ep;
    mesh->tp_rank = r % d.tp;
    mesh->dp_rank = (r / d.tp) % dp;
    mesh->pp_rank = r / (d.tp * dp);
    mesh->ep_rank = mesh->dp_rank % d.ep;
    mesh->world_comm = world;
    if (!world || n == 1) return SL_OK;
    sl_status st = SL_OK;
    /* every rank takes part in every split (collective), in a fixed order */
    int dp_color = mesh->pp_rank * d.tp + mesh->tp_rank;
    int tp_color = mesh->pp_rank * dp + mesh->dp_rank;
    int pp_color = mesh->dp_rank * d.tp + mesh->tp_rank;
    int ep_color = (mesh->pp_rank * d.tp + mesh->tp_rank) * (dp / d.ep) + mesh->dp_rank / d.ep;
    sl_comm *c;
    SL_CHECK(sl_comm_split(world, dp_color, r, &c));
    if (dp > 1)
        mesh->dp_comm = c;
    else
        sl_comm_free(c);
    SL_CHECK(sl_comm_split(world, tp_color, r, &c));
    if (d.tp > 1)
        mesh->tp_comm = c;
    else
        sl_comm_free(c);
    SL_CHECK(sl_comm_split(world, pp_color, r, &c));
    if (d.pp > 1)
        mesh->pp_comm = c;
    else
        sl_comm_free(c);
    SL_CHECK(sl_comm_split(world, ep_color, r, &c));
    if (d.ep > 1)
        mesh->ep_comm = c;
    else
        sl_comm_free(c);
    int edp_color = (mesh->pp_rank * d.tp + mesh->tp_rank) * d.ep + mesh->ep_rank;
    SL_CHECK(sl_comm_split(world, edp_color, r, &c));
    if (d.ep > 1 && dp / d.ep > 1)
        mesh->edp_comm = c;
    else
        sl_comm_free(c);
done:
    if (st != SL_OK) sl_mesh_free(mesh);
    return st;
}

void sl_mesh_free(sl_mesh *mesh) {
    sl_comm_free(mesh->dp_comm);
    sl_comm_free(mesh->tp_comm);
    sl_comm_free(mesh->pp_comm);
    sl_comm_free(mesh->ep_comm);
    sl_comm_free(mesh->edp_comm);
    mesh->dp_comm = mesh->tp_comm = mesh->pp_comm = mesh->ep_comm = mesh->edp_comm = NULL;
}
