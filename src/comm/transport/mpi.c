/* MPI transport (built when an MPI is found): non-blocking MPI_Isend/MPI_Irecv on a private
 * duplicate of MPI_COMM_WORLD, one tag per communicator, polled with MPI_Testall under our own
 * deadline. Also the out-of-band all-gather used when a job is started by mpirun without
 * MASTER_ADDR. Needs MPI_THREAD_MULTIPLE (each communicator has its own progress thread). */
#define _GNU_SOURCE
#include <mpi.h>
#include <string.h>

#include "comm/comm_internal.h"

static MPI_Comm g_world = MPI_COMM_NULL;
static int g_we_initialised;

static void mpi_fini(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

static sl_status mpi_ensure(void) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return sl_fail(SL_ERR_IO, "MPI_Init_thread failed");
        if (provided < MPI_THREAD_MULTIPLE) SL_LOGW("MPI provides thread level %d < MULTIPLE", provided);
        g_we_initialised = 1;
        atexit(mpi_fini);
    }
    if (g_world == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &g_world);
    return SL_OK;
}

int sl_mpi_world_rank_size(int *rank, int *size) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) return 0;
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    return 1;
}

static sl_status world_allgather(sl_oob *o, const void *mine, void *all, size_t bytes) {
    (void)o;
    if (MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, g_world) != MPI_SUCCESS)
        return sl_fail(SL_ERR_PEER, "MPI_Allgather failed");
    return SL_OK;
}

sl_status sl_mpi_oob_world(sl_oob *o) {
    SL_TRY(mpi_ensure());
    memset(o, 0, sizeof *o);
    MPI_Comm_rank(g_world, &o->rank);
    MPI_Comm_size(g_world, &o->size);
    o->allgather = world_allgather;
    sl_net_first_ip(o->local_ip, sizeof o->local_ip);
    return SL_OK;
}

typedef struct mpi_tp {
    sl_transport base;
    int *wr; /* world rank of each rank */
    int tag;
    char *stage;
    size_t stage_cap;
} mpi_tp;

#define MAXCHUNK ((size_t)1 << 30)

static sl_status mpi_exchange(sl_transport *t_, sl_xfer *x, int n, double deadline) {
    mpi_tp *t = (mpi_tp *)t_;
    size_t need = 0, nreq = 0;
    for (int i = 0; i < n; i++) {
        if (x[i].kind == SL_XFER_RECV_REDUCE) need += x[i].bytes;
        nreq += (x[i].bytes + MAXCHUNK - 1) / MAXCHUNK;
    }
    if (need > t->stage_cap) {
        free(t->stage);
        t->stage = malloc(need);
        t->stage_cap = t->stage ? need : 0;
        if (!t->stage) return sl_fail(SL_ERR_NOMEM, "mpi transport: out of memory");
    }
    /* Real statuses, not MPI_STATUSES_IGNORE: MPICH defines that as (MPI_Status *)1 and gcc 12 rejects
     * it for the MPI_Status[] parameter (-Wstringop-overflow). */
    MPI_Request *req = malloc(sizeof(MPI_Request) * (nreq ? nreq : 1));
    MPI_Status *sts = malloc(sizeof(MPI_Status) * (nreq ? nreq : 1));
    if (!req || !sts) {
        free(req);
        free(sts);
        return sl_fail(SL_ERR_NOMEM, "mpi transport: out of memory");
    }
    size_t k = 0, so = 0;
    for (int i = 0; i < n; i++) {
        char *b = x[i].kind == SL_XFER_RECV_REDUCE ? t->stage + so : x[i].buf;
        if (x[i].kind == SL_XFER_RECV_REDUCE) {
            x[i].aux = so;
            so += x[i].bytes;
        }
        for (size_t off = 0; off < x[i].bytes; off += MAXCHUNK) {
            int len = (int)(x[i].bytes - off < MAXCHUNK ? x[i].bytes - off : MAXCHUNK);
            if (x[i].kind == SL_XFER_SEND)
                MPI_Isend(b + off, len, MPI_BYTE, t->wr[x[i].peer], t->tag, g_world, &req[k++]);
            else
                MPI_Irecv(b + off, len, MPI_BYTE, t->wr[x[i].peer], t->tag, g_world, &req[k++]);
        }
    }
    unsigned iter = 0;
    sl_status st = SL_OK;
    for (;;) {
        int flag = 0;
        if (MPI_Testall((int)k, req, &flag, sts) != MPI_SUCCESS) {
            st = sl_fail(SL_ERR_PEER, "MPI_Testall failed");
            break;
        }
        if (flag) break;
        if (atomic_load(t->base.abort_flag))
            st = sl_fail(SL_ERR_ABORTED, "communicator aborted");
        else if (sl_time_sec() > deadline)
            st = sl_fail(SL_ERR_TIMEOUT, "mpi transport: no progress from peer before the deadline");
        if (st != SL_OK) {
            for (size_t j = 0; j < k; j++)
                if (req[j] != MPI_REQUEST_NULL) MPI_Cancel(&req[j]);
            break;
        }
        sl_comm_backoff(&iter, 256);
    }
    free(req);
    free(sts);
    if (st != SL_OK) return st;
    for (int i = 0; i < n; i++)
        if (x[i].kind == SL_XFER_RECV_REDUCE)
            sl_comm_reduce_kernel(x[i].dt, x[i].op, x[i].buf, x[i].src, t->stage + x[i].aux,
                                  x[i].bytes / sl_comm_dtype_size(x[i].dt));
    return SL_OK;
}

static void mpi_abort(sl_transport *t) { (void)t; /* mpirun tears the job down when a rank dies */ }

static void mpi_destroy(sl_transport *t_) {
    mpi_tp *t = (mpi_tp *)t_;
    if (!t) return;
    free(t->wr);
    free(t->stage);
    free(t);
}

static const sl_transport_vt mpi_vt = {"mpi", mpi_exchange, mpi_abort, mpi_destroy};

sl_status sl_tp_mpi_new(sl_oob *oob, sl_transport **out) {
    sl_status st = mpi_ensure();
    int wrank = 0;
    mpi_tp *t = calloc(1, sizeof *t);
    if (st == SL_OK && (!t || !(t->wr = malloc(sizeof(int) * (size_t)oob->size))))
        st = sl_fail(SL_ERR_NOMEM, "mpi transport: out of memory");
    if (st == SL_OK) {
        MPI_Comm_rank(g_world, &wrank);
        st = oob->allgather(oob, &wrank, t->wr, sizeof(int));
    }
    /* ranks that MPI_Init'ed as singletons (a launcher that set up no MPI job) all say world rank 0 */
    for (int a = 0; st == SL_OK && a < oob->size; a++)
        for (int b = a + 1; st == SL_OK && b < oob->size; b++)
            if (t->wr[a] == t->wr[b])
                st = sl_fail(SL_ERR_INVALID,
                             "MPI transport: ranks %d and %d are both MPI_COMM_WORLD rank %d (start the job "
                             "with mpirun, or srun --mpi=pmix / --mpi=pmi2, or use another transport)",
                             a, b, t->wr[a]);
    if (st != SL_OK) {
        mpi_destroy(t ? &t->base : NULL);
        return st;
    }
    unsigned h = 2166136261u;
    for (const char *p = oob->name; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
    t->tag = (int)(h % 30000u) + 1;
    t->base = (sl_transport){.vt = &mpi_vt,
                             .kind = SL_COMM_TRANSPORT_MPI,
                             .rank = oob->rank,
                             .size = oob->size,
                             .alpha = 3e-6,
                             .beta = 1.0 / 4e9};
    *out = &t->base;
    return SL_OK;
}
