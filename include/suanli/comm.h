/* suanli/comm.h — collective communication (NCCL-shaped) over shm, TCP, MPI or in-process threads.
 *
 * Usage (one process per rank, started by `suanli run -n 4 -- prog`, mpirun or srun):
 *   sl_comm *comm;
 *   if (sl_comm_init_env(&comm, NULL) != SL_OK) { fprintf(stderr, "%s\n", sl_errmsg()); return 1; }
 *   sl_comm_all_reduce(comm, grads, grads, n, SL_COMM_F32, SL_COMM_SUM);      // blocking, in place
 *
 *   sl_comm_req *req;                                                         // overlap with compute
 *   sl_comm_all_reduce_async(comm, bucket, bucket, n, SL_COMM_BF16, SL_COMM_AVG, &req);
 *   ... compute ...
 *   sl_status st = sl_comm_wait(req);                                         // frees req
 *
 *   sl_comm *row;                                                             // sub-communicator
 *   sl_comm_split(comm, sl_comm_rank(comm) / 2, sl_comm_rank(comm), &row);
 *   sl_comm_free(row); sl_comm_free(comm);
 *
 * Threads as ranks (tests): sl_comm_init_loopback(n, comms) creates n communicators in one process;
 * each must then be driven by its own thread.
 *
 * Semantics:
 * - Every rank must issue the same collectives in the same order on a communicator (as in NCCL/MPI).
 *   Operations run in issue order on the communicator's progress thread; the caller's buffers must
 *   stay valid and untouched until the request completes. Blocking calls = async + wait.
 * - In-place: pass the same pointer as send and receive buffer; for all-gather(v) pass
 *   sendbuf = recvbuf + (this rank's offset), for reduce-scatter recvbuf = sendbuf + rank*recvcount
 *   (see each call).
 * - Reductions are deterministic: for a given (algorithm, rank count, count) results are bitwise
 *   identical run to run and on every rank. AVG = SUM then divide by the rank count (integer division
 *   for integer types).
 * - No call waits forever: each operation has a deadline (SUANLI_COMM_TIMEOUT seconds, default 300,
 *   or sl_comm_opts.timeout_sec). A dead peer gives SL_ERR_PEER, a silent one SL_ERR_TIMEOUT, on
 *   every rank. After any failure the communicator is in error (sl_comm_async_error) and every later
 *   operation fails fast; free it and create a new one.
 * - Thread safety: one thread issues operations on a given communicator at a time; sl_comm_abort and
 *   sl_comm_async_error may be called from any thread.
 * Ownership: communicators and requests are owned by the caller (sl_comm_free, sl_comm_wait /
 * sl_comm_req_free). Returned strings are borrowed.
 */
#ifndef SUANLI_COMM_H
#define SUANLI_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "suanli/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sl_comm_dtype {
    SL_COMM_F32 = 0,
    SL_COMM_BF16,
    SL_COMM_F16,
    SL_COMM_F64,
    SL_COMM_I32,
    SL_COMM_I64,
    SL_COMM_U8, /* bytes: no reduction, only data movement */
    SL_COMM_DTYPE_COUNT
} sl_comm_dtype;

typedef enum sl_comm_redop {
    SL_COMM_SUM = 0,
    SL_COMM_PROD,
    SL_COMM_MAX,
    SL_COMM_MIN,
    SL_COMM_AVG,
    SL_COMM_REDOP_COUNT
} sl_comm_redop;

typedef enum sl_comm_transport_kind {
    SL_COMM_TRANSPORT_AUTO = 0, /* shm when all ranks share a host, else tcp (SUANLI_COMM_TRANSPORT) */
    SL_COMM_TRANSPORT_SHM,
    SL_COMM_TRANSPORT_TCP,
    SL_COMM_TRANSPORT_MPI,
    SL_COMM_TRANSPORT_LOOPBACK,
    SL_COMM_TRANSPORT_HYBRID, /* several hosts: shm to the ranks of this host, tcp to the others */
    SL_COMM_TRANSPORT_COUNT
} sl_comm_transport_kind;

size_t sl_comm_dtype_size(sl_comm_dtype dt);
const char *sl_comm_dtype_name(sl_comm_dtype dt);
const char *sl_comm_redop_name(sl_comm_redop op);
const char *sl_comm_transport_name(sl_comm_transport_kind k);

typedef struct sl_comm sl_comm;
typedef struct sl_comm_req sl_comm_req;

/* Options; zero-initialised (or NULL) means defaults/environment. */
typedef struct sl_comm_opts {
    sl_comm_transport_kind transport; /* AUTO: SUANLI_COMM_TRANSPORT, else shm on one host, else tcp */
    double timeout_sec;               /* 0: SUANLI_COMM_TIMEOUT, else 300 */
} sl_comm_opts;

/* ---- creation ---- */
/* A unique id names one job's rendezvous (host:port of rank 0's bootstrap server and a random token).
 * Rank 0 creates it, ships it to the other ranks by any means, and every rank calls init_rank. */
typedef struct sl_comm_unique_id {
    char bytes[128];
} sl_comm_unique_id;
sl_status sl_comm_get_unique_id(sl_comm_unique_id *id);
sl_status sl_comm_init_rank(sl_comm **out, int nranks, const sl_comm_unique_id *id, int rank,
                            const sl_comm_opts *opts);

/* Describe where rank/size/rendezvous come from. Recognised, in order: SUANLI_RANK/SUANLI_WORLD_SIZE,
 * torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), OpenMPI (OMPI_COMM_WORLD_*),
 * MPICH/PMI (PMI_RANK, PMI_SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODELIST).
 * Rendezvous: MASTER_ADDR/MASTER_PORT; else (Slurm) the first node of the node list and a port derived
 * from the job id; else, under mpirun in an MPI build, MPI itself. Token: SUANLI_JOB_TOKEN. */
typedef struct sl_comm_env {
    int rank, size, local_rank, local_size;
    char master_addr[256];
    int master_port;
    char token[64];
    const char *source; /* "suanli", "torchrun", "openmpi", "pmi", "slurm" (borrowed, static) */
} sl_comm_env;
sl_status sl_comm_env_detect(sl_comm_env *env);
sl_status sl_comm_init_env(sl_comm **out, const sl_comm_opts *opts);

/* n communicators connected through in-process memory; comms[i] has rank i. Free each one. */
sl_status sl_comm_init_loopback(int n, sl_comm **comms, const sl_comm_opts *opts);

/* Collective over comm: ranks with the same color form a new communicator ordered by (key, rank).
 * color < 0 (SL_COMM_SPLIT_NONE): this rank gets *out = NULL. Blocking. */
#define SL_COMM_SPLIT_NONE (-1)
sl_status sl_comm_split(sl_comm *comm, int color, int key, sl_comm **out);

/* Waits for queued operations (bounded by the deadline), stops the progress thread, frees. NULL ok. */
void sl_comm_free(sl_comm *comm);
/* Fail every pending and future operation with SL_ERR_ABORTED and tell the peers (they fail with
 * SL_ERR_PEER). Safe from any thread, including while another thread waits. Still call sl_comm_free. */
void sl_comm_abort(sl_comm *comm);
/* SL_OK, or the first error the communicator hit (a failed or aborted operation). Never blocks. */
sl_status sl_comm_async_error(sl_comm *comm);

int sl_comm_rank(const sl_comm *comm);
int sl_comm_size(const sl_comm *comm);
sl_comm_transport_kind sl_comm_transport(const sl_comm *comm);
/* Topology seen at creation (host = SUANLI_COMM_HOSTNAME, else the hostname): the number of hosts the
 * ranks span, and the host index (0..nhosts-1, numbered by first appearance in rank order) of `rank`.
 * In-process (loopback) communicators are one host. */
int sl_comm_nhosts(const sl_comm *comm);
int sl_comm_host_of(const sl_comm *comm, int rank);

/* ---- requests ---- */
/* Block until done or the deadline; returns the operation's status and frees req. */
sl_status sl_comm_wait(sl_comm_req *req);
/* *done = 1 when finished (then the status is returned and req is still owned: wait or free it). */
sl_status sl_comm_test(sl_comm_req *req, int *done);
/* Frees a request; if it is still running, waits for it first. */
void sl_comm_req_free(sl_comm_req *req);

/* ---- group calls ----
 * Between group_start and group_end (per thread, nestable), operations are queued but not started;
 * group_end submits them as one unit in which all sends and receives progress together, so exchange
 * patterns that would deadlock as separate blocking calls work. group_end returns once the unit is
 * queued, not when it finished: inside a group use the async calls and wait on their requests (a blocking
 * call inside a group returns SL_OK at once, and its operation is known to be done only after a later
 * blocking call on the same communicator returns, since a communicator runs its queue in order). */
void sl_comm_group_start(void);
sl_status sl_comm_group_end(void);

/* ---- collectives (counts are elements; *_async variants return a request in *req) ---- */
/* recvbuf[i] = op over ranks of sendbuf[i]; count elements. sendbuf == recvbuf is in place. */
sl_status sl_comm_all_reduce(sl_comm *c, const void *sendbuf, void *recvbuf, size_t count, sl_comm_dtype dt,
                             sl_comm_redop op);
sl_status sl_comm_all_reduce_async(sl_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                   sl_comm_dtype dt, sl_comm_redop op, sl_comm_req **req);
/* Result only on root (recvbuf ignored elsewhere, may be NULL). */
sl_status sl_comm_reduce(sl_comm *c, const void *sendbuf, void *recvbuf, size_t count, sl_comm_dtype dt,
                         sl_comm_redop op, int root);
sl_status sl_comm_reduce_async(sl_comm *c, const void *sendbuf, void *recvbuf, size_t count, sl_comm_dtype dt,
                               sl_comm_redop op, int root, sl_comm_req **req);
/* root's sendbuf -> everyone's recvbuf (root: sendbuf == recvbuf in place). */
sl_status sl_comm_broadcast(sl_comm *c, const void *sendbuf, void *recvbuf, size_t count, sl_comm_dtype dt,
                            int root);
sl_status sl_comm_broadcast_async(sl_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                  sl_comm_dtype dt, int root, sl_comm_req **req);
/* recvbuf (size*count) = concat over ranks of sendbuf (count). In place: sendbuf == recvbuf + rank*count. */
sl_status sl_comm_all_gather(sl_comm *c, const void *sendbuf, void *recvbuf, size_t count, sl_comm_dtype dt);
sl_status sl_comm_all_gather_async(sl_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                   sl_comm_dtype dt, sl_comm_req **req);
/* Rank r contributes counts[r] elements placed at displs[r] of recvbuf. counts/displs are copied. */
sl_status sl_comm_all_gatherv(sl_comm *c, const void *sendbuf, void *recvbuf, const size_t *counts,
                              const size_t *displs, sl_comm_dtype dt);
sl_status sl_comm_all_gatherv_async(sl_comm *c, const void *sendbuf, void *recvbuf, const size_t *counts,
                                    const size_t *displs, sl_comm_dtype dt, sl_comm_req **req);
/* recvbuf (recvcount) = op over ranks of sendbuf[rank*recvcount ...]; sendbuf has size*recvcount.
 * In place: recvbuf == sendbuf + rank*recvcount. */
sl_status sl_comm_reduce_scatter(sl_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                                 sl_comm_dtype dt, sl_comm_redop op);
sl_status sl_comm_reduce_scatter_async(sl_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                                       sl_comm_dtype dt, sl_comm_redop op, sl_comm_req **req);
/* Block j of sendbuf (count elements) goes to rank j, arriving at block (sender) of recvbuf.
 * In place (sendbuf == recvbuf) is supported. */
sl_status sl_comm_all_to_all(sl_comm *c, const void *sendbuf, void *recvbuf, size_t count, sl_comm_dtype dt);
sl_status sl_comm_all_to_all_async(sl_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                   sl_comm_dtype dt, sl_comm_req **req);
/* v-variant: sendcounts[j] elements from sdispls[j] go to rank j, received at rdispls[sender].
 * Arrays are copied. sendbuf == recvbuf is not allowed here. */
sl_status sl_comm_all_to_allv(sl_comm *c, const void *sendbuf, const size_t *sendcounts,
                              const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                              const size_t *rdispls, sl_comm_dtype dt);
sl_status sl_comm_all_to_allv_async(sl_comm *c, const void *sendbuf, const size_t *sendcounts,
                                    const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                    const size_t *rdispls, sl_comm_dtype dt, sl_comm_req **req);
/* Point to point; matched in issue order per (sender, receiver) pair. */
sl_status sl_comm_send(sl_comm *c, const void *buf, size_t count, sl_comm_dtype dt, int peer);
sl_status sl_comm_send_async(sl_comm *c, const void *buf, size_t count, sl_comm_dtype dt, int peer,
                             sl_comm_req **req);
sl_status sl_comm_recv(sl_comm *c, void *buf, size_t count, sl_comm_dtype dt, int peer);
sl_status sl_comm_recv_async(sl_comm *c, void *buf, size_t count, sl_comm_dtype dt, int peer,
                             sl_comm_req **req);
sl_status sl_comm_barrier(sl_comm *c);
sl_status sl_comm_barrier_async(sl_comm *c, sl_comm_req **req);

/* ---- symmetric memory (NCCL's registered/symmetric buffers) ----
 * sl_comm_mem_alloc is collective: every rank calls it with the same size, in the same order relative
 * to the other window calls. On shm (processes on one host) the memory is a shared mapping that every
 * rank maps; with threads as ranks (loopback) it is shared process memory; on tcp, mpi or ranks on
 * several hosts it is ordinary private memory, so callers need no special case; likewise on every rank
 * (with a warning) when some rank cannot create its shared part (/dev/shm too small). Not zeroed.
 * Use it symmetrically: when the buffers of an all-reduce (send and receive), reduce-scatter (send)
 * or all-gather(v) (receive) lie in such windows at the same offset of the same window on every rank
 * and no algorithm other than direct is forced (sl_comm_set_algo / SUANLI_COMM_ALGO), the collective
 * runs a direct algorithm that reads the peers' buffers in place (src/comm/algo/sym.c) instead of
 * copying through the transport. Results: bitwise those of the ring for 2 ranks, of the direct
 * algorithm (rank order 0..n-1) for more (NaN payloads aside); deterministic either way. Every rank
 * checks that all ranks passed the same windows and offsets: asymmetric use fails on every rank
 * (SL_ERR_INVALID); window buffers on some ranks and private ones on others fail at the deadline.
 * The other collectives treat window memory as ordinary memory.
 * sl_comm_mem_free(c, ptr) takes a pointer returned by sl_comm_mem_alloc (NULL: no-op); call it on
 * every rank, after the operations using the buffer completed. Windows left are freed by
 * sl_comm_free. Both wait for the communicator's queued operations. Ownership: the communicator's. */
sl_status sl_comm_mem_alloc(sl_comm *c, size_t bytes, void **ptr);
sl_status sl_comm_mem_free(sl_comm *c, void *ptr);
/* 1 when [ptr, ptr+bytes) lies in a window shared with the peers (0: private or fallback memory). */
int sl_comm_mem_is_shared(const sl_comm *c, const void *ptr, size_t bytes);

/* ---- algorithms (exposed for tests and the benchmark) ---- */
typedef enum sl_comm_algo {
    SL_COMM_ALGO_AUTO = 0, /* cost model */
    SL_COMM_ALGO_RING,     /* bandwidth-optimal rings */
    SL_COMM_ALGO_RD,       /* recursive doubling (all-reduce), binomial trees (bcast/reduce) */
    SL_COMM_ALGO_DIRECT,   /* everyone to everyone in one step (small messages) */
    SL_COMM_ALGO_HIER,     /* several hosts: reduce-scatter inside each host (shm), all-reduce of
                              each shard among the hosts' ranks holding it (tcp/mpi), all-gather
                              inside each host (algo/hier.c) */
    SL_COMM_ALGO_COUNT
} sl_comm_algo;
const char *sl_comm_algo_name(sl_comm_algo a);
/* Force an algorithm on this communicator (SUANLI_COMM_ALGO=auto|ring|rd|direct|hier sets the
 * default; hier applies to all-reduce on multi-host communicators and falls back to auto elsewhere). */
void sl_comm_set_algo(sl_comm *comm, sl_comm_algo a);

#ifdef __cplusplus
}
#endif
#endif
