/* Internal contracts of the comm layer: transfers, the transport vtable, out-of-band exchange,
 * the communicator object. Depends on base only. */
#ifndef SL_COMM_INTERNAL_H
#define SL_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "suanli/comm.h"

/* ---- element kernels (dtype.c) ---- */
/* dst[i] = a[i] op b[i] for n elements (dst may alias a or b). AVG reduces as SUM. */
/* memcpy with streaming (non-temporal) stores on x86-64: Note [Non-temporal stores] (transport/fifo.c) */
void sl_comm_stream_copy(void *dst, const void *src, size_t len);
void sl_comm_reduce_kernel(sl_comm_dtype dt, sl_comm_redop op, void *dst, const void *a, const void *b,
                           size_t n);
/* x[i] /= divisor (AVG finalisation; integer division for integer types). */
void sl_comm_div_kernel(sl_comm_dtype dt, void *x, size_t n, int divisor);
uint16_t sl_comm_f32_to_f16(float f);
float sl_comm_f16_to_f32(uint16_t h);

/* ---- transfers: the only thing transports know how to do ----
 * Note [Transfers are byte streams per ordered pair]
 * Between two ranks of one communicator there is one FIFO byte stream in each direction. Since
 * every rank issues the same operations in the same order (on one progress thread), the bytes of
 * consecutive transfers line up without tags. Inside one exchange, several transfers to the same
 * peer in the same direction are processed in array order. */
typedef enum { SL_XFER_SEND = 0, SL_XFER_RECV, SL_XFER_RECV_REDUCE } sl_xfer_kind;
typedef struct sl_xfer {
    sl_xfer_kind kind;
    int peer;
    void *buf;       /* SEND: source; RECV/RECV_REDUCE: destination */
    const void *src; /* RECV_REDUCE: buf = src op incoming (src may equal buf) */
    size_t bytes;
    sl_comm_dtype dt;
    sl_comm_redop op;
    size_t done; /* bytes completed (transport bookkeeping) */
    size_t aux;  /* transport bookkeeping */
} sl_xfer;

typedef struct sl_transport sl_transport;

/* ---- symmetric windows: an optional transport capability ----
 * Note [Symmetric windows]
 * A window is memory every rank of a communicator can load and store directly: on shm one POSIX
 * shared-memory object per rank, mapped by all ranks (the name is unlinked as soon as everyone has
 * mapped it, so a killed job leaves nothing in /dev/shm); on loopback (threads) one heap block cut in
 * n equal regions. Transports that can offer this fill in `win` (sl_win_vt); the others (tcp, mpi)
 * leave it NULL and sl_comm_mem_alloc falls back to private memory, so callers need no special case.
 * The algorithms in algo/sym.c see only this contract: `peer[r]` (rank r's window as mapped in this
 * process), and per-rank control words with a transport-provided wait that obeys the deadline, the
 * abort flag and peer liveness exactly like exchange (Note [Waiting], transport/fifo.c). They never
 * touch slot FIFOs, segment headers or pids.
 * shm reserves the pages at allocation (posix_fallocate), so a /dev/shm too small is reported then;
 * every rank sees every rank's verdict, and sl_comm_mem_alloc then falls back to private memory on
 * all ranks together.
 * Windows are symmetric: allocated collectively with the same size on every rank, numbered in
 * allocation order (`id`, equal on every rank), and used at the same offset on every rank. */
#define SL_WIN_CTL 64 /* control words per rank: see algo/sym.c for their use */
typedef struct sl_win sl_win;
struct sl_win {
    char *base;   /* this rank's window */
    size_t bytes; /* usable bytes (same on every rank) */
    char **peer;  /* [r] rank r's window in this address space; peer[rank] == base */
    uint64_t id;  /* allocation number on this communicator (same on every rank) */
    int shared;   /* 0: private fallback memory (no direct algorithms) */
    void *priv;   /* transport bookkeeping */
    sl_win *next; /* the communicator's list */
};
typedef struct sl_win_vt {
    /* Collective: a window of `bytes` on every rank; fills w->base/peer/priv. */
    sl_status (*alloc)(sl_transport *t, sl_win *w, double deadline);
    void (*release)(sl_transport *t, sl_win *w); /* local; peers may still hold their mappings */
    /* rank r's SL_WIN_CTL control words (shared, written only by rank r) */
    _Atomic uint64_t *(*ctl)(sl_transport *t, int r);
    /* wait until ctl(peer)[word] >= v; error on deadline, abort or a dead peer */
    sl_status (*wait)(sl_transport *t, int peer, int word, uint64_t v, double deadline);
} sl_win_vt;

typedef struct sl_transport_vt {
    const char *name;
    /* Run all transfers to completion concurrently; error on deadline, abort or dead peer. */
    sl_status (*exchange)(sl_transport *t, sl_xfer *x, int n, double deadline);
    /* Tell peers we are gone; make running exchanges return. Any thread; idempotent. */
    void (*abort)(sl_transport *t);
    void (*destroy)(sl_transport *t);
} sl_transport_vt;
struct sl_transport {
    const sl_transport_vt *vt;
    sl_comm_transport_kind kind;
    int rank, size;
    atomic_int *abort_flag; /* the communicator's; checked while waiting */
    double alpha, beta;     /* cost model: seconds per message, seconds per byte */
    const sl_win_vt *win;   /* symmetric windows (NULL: not offered) */
    /* Optional (NULL: not offered; the same on every rank): copy len bytes at address addr of peer's
     * address space into dst (shm: process_vm_readv, Note [Single-copy pulls]); worth it from
     * peer_read_min bytes. Error if the peer's memory cannot be read. */
    sl_status (*peer_read)(sl_transport *t, int peer, void *dst, uint64_t addr, size_t len);
    size_t peer_read_min;
};

/* ---- out-of-band exchange used while building transports ---- */
typedef struct sl_oob sl_oob;
struct sl_oob {
    int rank, size;
    /* all[r*bytes ...] = rank r's mine. Collective over the oob's ranks. */
    sl_status (*allgather)(sl_oob *o, const void *mine, void *all, size_t bytes);
    void *ctx;
    char local_ip[64];   /* address peers can reach this rank at (TCP transport) */
    char name[200];      /* unique per communicator on a host (shm names) */
    char token[64];      /* job token (TCP handshakes) */
    int *world_ranks;    /* MPI transport: this group's ranks in MPI_COMM_WORLD (NULL: identity) */
    int mpi_tag;         /* MPI transport: tag separating communicators */
    void *loopback_hint; /* loopback: unused by others */
};

sl_status sl_tp_shm_new(sl_oob *oob, sl_transport **out);
sl_status sl_tp_loopback_new(sl_oob *oob, sl_transport **out);
sl_status sl_tp_loopback_new_all(int n, sl_transport **out);
sl_status sl_tp_tcp_new(sl_oob *oob, sl_transport **out);
/* shm to the ranks r with host_of[r] == host_of[rank], tcp to the others (transport/hybrid.c) */
sl_status sl_tp_hybrid_new(sl_oob *oob, const int *host_of, sl_transport **out);
#ifdef SL_HAVE_MPI
sl_status sl_tp_mpi_new(sl_oob *oob, sl_transport **out);
sl_status sl_mpi_oob_world(sl_oob *oob); /* MPI_Init if needed; oob over MPI_COMM_WORLD */
int sl_mpi_world_rank_size(int *rank, int *size);
#endif

/* Bootstrap (bootstrap.c): TCP rendezvous store as an oob; root = rank 0 listens. */
sl_status sl_bootstrap_oob_new(const char *addr, int port, const char *token, int rank, int size,
                               double timeout, sl_oob **out);
void sl_bootstrap_oob_free(sl_oob *oob);
int sl_comm_unique_id_parse(const sl_comm_unique_id *id, char *addr, size_t addrcap, int *port, char *token,
                            size_t tokcap);
int sl_bootstrap_take_listener(const char *token); /* fd kept by get_unique_id, or -1 */
sl_status sl_net_first_ip(char *buf, size_t cap);

/* Wait helpers shared by transports. */
/* spin `spin` times, then yield, then short sleeps; see Note [Waiting] in transport/fifo.c */
void sl_comm_backoff(unsigned *iter, unsigned spin);
unsigned sl_comm_spin_budget(int local_ranks); /* long spins only when every rank has a core */
/* Note [Ranks sharing a machine]: the most ranks of one job seen on this machine's kernel (pretend hosts:
 * network namespaces, SUANLI_COMM_HOSTNAME); sl_comm_spin_budget counts them as sharing the CPUs */
void sl_comm_note_machine_ranks(int n);
double sl_comm_env_timeout(void);

/* ---- algorithms (algo/) ---- */
typedef struct sl_algo_ctx {
    sl_transport *tp;
    int rank, size;
    double deadline;
    void **scratch; /* grow-only scratch owned by the communicator */
    size_t *scratch_cap;
    sl_comm_algo algo; /* forced, or AUTO */
    sl_comm *local;    /* hierarchical: ranks on this host (shm), or NULL */
    sl_comm *leaders;  /* hierarchical, uneven hosts: local rank 0 of every host, NULL elsewhere */
    sl_comm *peers;    /* hierarchical, even hosts: this local rank on every host */
    sl_win *wins;      /* the communicator's windows (algo/sym.c) */
    uint64_t *win_seq; /* window operations so far (same count on every rank) */
    sl_win **stage;    /* the staged all-reduce's window (algo/sym.c) and whether it exists */
    int *stage_state;  /* 0 not tried, 1 made, -1 unavailable (SUANLI_COMM_WINDOWS=0, /dev/shm full) */
} sl_algo_ctx;

sl_status sl_prim_exchange(sl_algo_ctx *c, sl_xfer *x, int n);
sl_status sl_prim_sendrecv(sl_algo_ctx *c, int sp, const void *sb, size_t sbytes, int rp, void *rb,
                           size_t rbytes);
sl_status sl_prim_send_recv_reduce(sl_algo_ctx *c, int sp, const void *sb, size_t sbytes, int rp, void *dst,
                                   const void *src, size_t rbytes, sl_comm_dtype dt, sl_comm_redop op);
void *sl_algo_scratch(sl_algo_ctx *c, size_t bytes);

sl_comm_algo sl_algo_choose_allreduce(const sl_algo_ctx *c, size_t bytes);
sl_status sl_algo_allreduce(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                            sl_comm_redop op);
sl_status sl_algo_allreduce_ring(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                 sl_comm_redop op);
sl_status sl_algo_allreduce_rd(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                               sl_comm_redop op);
sl_status sl_algo_allreduce_direct(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                   sl_comm_redop op);
sl_status sl_algo_allreduce_hier(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                 sl_comm_redop op);
sl_status sl_algo_reduce(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                         sl_comm_redop op, int root);
sl_status sl_algo_broadcast(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                            int root);
sl_status sl_algo_allgatherv(sl_algo_ctx *c, const void *sb, void *rb, const size_t *counts,
                             const size_t *displs, sl_comm_dtype dt);
sl_status sl_algo_reduce_scatter_direct(sl_algo_ctx *c, const void *sb, void *rb, size_t recvcount,
                                        sl_comm_dtype dt, sl_comm_redop op);
sl_status sl_algo_reduce_scatter(sl_algo_ctx *c, const void *sb, void *rb, size_t recvcount, sl_comm_dtype dt,
                                 sl_comm_redop op);
sl_status sl_algo_alltoallv(sl_algo_ctx *c, const void *sb, const size_t *scounts, const size_t *sdispls,
                            void *rb, const size_t *rcounts, const size_t *rdispls, sl_comm_dtype dt);
sl_status sl_algo_barrier(sl_algo_ctx *c);

/* algo/sym.c: direct algorithms on symmetric windows. Each returns SL_ERR_UNSUPPORTED without side
 * effects when its buffers do not all lie in shared windows on this rank (then the caller runs the
 * ordinary algorithm); otherwise it runs the window algorithm, which checks that every rank passed
 * the same call (same windows and offsets) before touching peer memory. */
sl_status sl_sym_allreduce(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                           sl_comm_redop op);
sl_status sl_sym_reduce_scatter(sl_algo_ctx *c, const void *sb, void *rb, size_t recvcount, sl_comm_dtype dt,
                                sl_comm_redop op);
sl_status sl_sym_allgatherv(sl_algo_ctx *c, const void *sb, void *rb, const size_t *counts,
                            const size_t *displs, sl_comm_dtype dt);
/* sendbuf must not alias recvbuf (a2a.c copies an in-place send buffer away first) */
sl_status sl_sym_alltoallv(sl_algo_ctx *c, const void *sb, const size_t *scounts, const size_t *sdispls,
                           void *rb, const size_t *rcounts, const size_t *rdispls, sl_comm_dtype dt);
sl_win *sl_win_find(sl_win *list, const void *p, size_t bytes);
/* the transport offers windows and no algorithm other than direct (same reduction order) is forced */
sl_status sl_sym_allreduce_staged(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                  sl_comm_redop op);
static inline int sl_sym_enabled(const sl_algo_ctx *c) {
    return (c->algo == SL_COMM_ALGO_AUTO || c->algo == SL_COMM_ALGO_DIRECT) && c->tp->win;
} /* shared window holding [p, p+bytes) */

#endif
