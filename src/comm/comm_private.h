/* The communicator object and its requests (shared by comm.c and init.c only). */
#ifndef SL_COMM_PRIVATE_H
#define SL_COMM_PRIVATE_H
#include "comm/comm_internal.h"

typedef enum {
    T_ALLREDUCE,
    T_REDUCE,
    T_BCAST,
    T_ALLGATHERV,
    T_REDSCAT,
    T_A2AV,
    T_SEND,
    T_RECV,
    T_BARRIER,
    T_GROUP
} task_kind;

struct sl_comm_req {
    sl_comm *comm;
    task_kind kind;
    const void *sb;
    void *rb;
    size_t count;
    sl_comm_dtype dt;
    sl_comm_redop op;
    int root;  /* root, or peer for send/recv */
    size_t *v; /* counts/displacements (owned) */
    int refs;  /* executor + user handle; guarded by comm->mu */
    int done;  /* guarded by comm->mu */
    sl_status st;
    char msg[300];
    sl_comm_req *next;       /* queue link */
    sl_comm_req *children;   /* T_GROUP members */
    sl_comm_req *next_child; /* group member link (and thread-local pending list) */
};

struct sl_comm {
    sl_transport *tp;
    int rank, size;
    double timeout;
    sl_comm_algo algo;
    sl_comm_opts opts;
    char name[200]; /* unique name (shm segments), parent for splits */
    char local_ip[64];
    char token[64];
    int *world_ranks; /* MPI: ranks in MPI_COMM_WORLD (NULL = identity) */
    int mpi_tag;
    int split_seq;
    sl_comm *local, *leaders; /* hierarchical (several hosts): owned sub-communicators */
    sl_comm *peers;           /* hierarchical: the ranks with this local rank on every host (owned) */
    int *host_of;             /* [rank] host index (NULL: one host) */
    int nhosts;
    atomic_int abort_flag;
    atomic_int err;
    pthread_mutex_t errmu;
    char errmsg[300];
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    sl_comm_req *qhead, *qtail;
    int busy, stop;
    pthread_t thread;
    void *scratch;
    size_t scratch_cap;
    sl_win *wins;     /* sl_comm_mem_alloc windows (changed only while acquired) */
    uint64_t win_seq; /* window operations run (algo/sym.c) */
    uint64_t win_ids; /* windows allocated so far */
    sl_win *stage;    /* staging window of the staged all-reduce (algo/sym.c), made on first use */
    int stage_state;  /* 0 not tried, 1 made, -1 unavailable (windows off, /dev/shm full) */
};

void sl_comm_acquire(sl_comm *c);
void sl_comm_release(sl_comm *c);
sl_status sl_comm_from_transport(sl_transport *tp, const sl_comm_opts *opts, const char *name,
                                 const char *local_ip, const int *world_ranks, int mpi_tag, sl_comm **out);
#endif
