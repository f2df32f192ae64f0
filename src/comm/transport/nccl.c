/* NCCL transport — a SKETCH, compile-only (built when the CUDA backend is, with NCCL found:
 * cmake/cuda.cmake defines SL_HAVE_NCCL). Never run: no GPU was available when it was written, and
 * nothing creates it yet (there is no SL_COMM_TRANSPORT_NCCL kind and init.c does not call
 * sl_tp_nccl_new).
 *
 * Note [NCCL transport sketch]
 * It implements the transport vtable (comm_internal.h) the way the MPI transport does, with NCCL
 * point-to-point calls: one ncclComm_t per communicator (unique id from rank 0 through the oob
 * all-gather, ncclCommInitRank), one exchange = host buffers staged into one device buffer, ncclSend /
 * ncclRecv inside ncclGroupStart/End on a private stream, polled with cudaStreamQuery under the deadline
 * and the abort flag (ncclCommAbort on either), received bytes copied back, RECV_REDUCE reduced on the
 * host with sl_comm_reduce_kernel. That keeps the comm layer's contract (host bytes, base-only
 * algorithms) and is correct, but it is not what DP/ZeRO with --device cuda needs. Missing:
 *  1. wiring: an SL_COMM_TRANSPORT_NCCL kind (suanli/comm.h), "nccl" in sl_comm_transport_name and
 *     SUANLI_COMM_TRANSPORT, the case in init.c comm_create, split support;
 *  2. device selection per rank (here: SUANLI_CUDA_DEVICE, else local rank % device count; the CUDA
 *     backend must pick the same device);
 *  3. device-resident collectives: data parallelism keeps gradients in host-visible memory today
 *     (docs/ADDING-A-BACKEND.md: "What stays host-only"); with a CUDA backend the DP buffer operations
 *     should call ncclAllReduce / ncclReduceScatter / ncclAllGather on the backend's device buffers, on
 *     the backend's stream, above this transport (a device-collective hook in src/parallel, not a byte
 *     transport), without the host staging done here;
 *  4. tests (tests/comm matrix over nccl on >= 2 GPUs) and the cost model (alpha/beta are guesses). */
#ifdef SL_HAVE_NCCL
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "comm/comm_internal.h"

sl_status sl_tp_nccl_new(sl_oob *oob, sl_transport **out);

typedef struct nccl_tp {
    sl_transport base;
    ncclComm_t comm;
    cudaStream_t stream;
    char *dstage; /* device staging: every transfer of one exchange side by side */
    char *hstage; /* host staging of RECV_REDUCE payloads */
    size_t cap, hcap;
} nccl_tp;

static sl_status nccl_fail(ncclResult_t r, const char *what) {
    return sl_fail(SL_ERR_PEER, "nccl transport: %s failed (%s)", what, ncclGetErrorString(r));
}
static sl_status cuda_fail(cudaError_t e, const char *what) {
    return sl_fail(SL_ERR_IO, "nccl transport: %s failed (%s)", what, cudaGetErrorString(e));
}

static sl_status grow(nccl_tp *t, size_t dev, size_t host) {
    if (dev > t->cap) {
        cudaFree(t->dstage);
        t->dstage = NULL;
        t->cap = 0;
        cudaError_t e = cudaMalloc((void **)&t->dstage, dev);
        if (e != cudaSuccess) return cuda_fail(e, "cudaMalloc (staging)");
        t->cap = dev;
    }
    if (host > t->hcap) {
        free(t->hstage);
        t->hstage = malloc(host);
        t->hcap = t->hstage ? host : 0;
        if (!t->hstage) return sl_fail(SL_ERR_NOMEM, "nccl transport: out of memory");
    }
    return SL_OK;
}

static sl_status nccl_exchange(sl_transport *t_, sl_xfer *x, int n, double deadline) {
    nccl_tp *t = (nccl_tp *)t_;
    size_t dev = 0, host = 0;
    for (int i = 0; i < n; i++) {
        x[i].aux = dev;
        dev += (x[i].bytes + 255) / 256 * 256;
        if (x[i].kind == SL_XFER_RECV_REDUCE) host += x[i].bytes;
    }
    SL_TRY(grow(t, dev ? dev : 256, host));
    cudaError_t ce = cudaSuccess;
    for (int i = 0; i < n && ce == cudaSuccess; i++)
        if (x[i].kind == SL_XFER_SEND && x[i].bytes)
            ce = cudaMemcpyAsync(t->dstage + x[i].aux, x[i].buf, x[i].bytes, cudaMemcpyHostToDevice,
                                 t->stream);
    if (ce != cudaSuccess) return cuda_fail(ce, "staging a send");
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n && r == ncclSuccess; i++) {
        if (!x[i].bytes) continue;
        if (x[i].kind == SL_XFER_SEND)
            r = ncclSend(t->dstage + x[i].aux, x[i].bytes, ncclUint8, x[i].peer, t->comm, t->stream);
        else
            r = ncclRecv(t->dstage + x[i].aux, x[i].bytes, ncclUint8, x[i].peer, t->comm, t->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r != ncclSuccess || r2 != ncclSuccess) return nccl_fail(r != ncclSuccess ? r : r2, "send/recv");
    size_t ho = 0;
    for (int i = 0; i < n && ce == cudaSuccess; i++) {
        if (x[i].kind == SL_XFER_SEND || !x[i].bytes) continue;
        char *dst = x[i].kind == SL_XFER_RECV ? x[i].buf : t->hstage + ho;
        if (x[i].kind == SL_XFER_RECV_REDUCE) ho += x[i].bytes;
        ce = cudaMemcpyAsync(dst, t->dstage + x[i].aux, x[i].bytes, cudaMemcpyDeviceToHost, t->stream);
    }
    if (ce != cudaSuccess) return cuda_fail(ce, "staging a receive");
    unsigned iter = 0;
    for (;;) {
        ce = cudaStreamQuery(t->stream);
        if (ce == cudaSuccess) break;
        if (ce != cudaErrorNotReady) return cuda_fail(ce, "exchange");
        sl_status st = SL_OK;
        if (atomic_load(t->base.abort_flag))
            st = sl_fail(SL_ERR_ABORTED, "communicator aborted");
        else if (sl_time_sec() > deadline)
            st = sl_fail(SL_ERR_TIMEOUT, "nccl transport: no progress from peer before the deadline");
        if (st != SL_OK) {
            ncclCommAbort(t->comm);
            t->comm = NULL;
            return st;
        }
        sl_comm_backoff(&iter, 256);
    }
    ho = 0;
    for (int i = 0; i < n; i++)
        if (x[i].kind == SL_XFER_RECV_REDUCE) {
            sl_comm_reduce_kernel(x[i].dt, x[i].op, x[i].buf, x[i].src, t->hstage + ho,
                                  x[i].bytes / sl_comm_dtype_size(x[i].dt));
            ho += x[i].bytes;
        }
    return SL_OK;
}

static void nccl_abort(sl_transport *t) {
    (void)t; /* the exchange loop sees the abort flag and aborts NCCL */
}

static void nccl_destroy(sl_transport *t_) {
    nccl_tp *t = (nccl_tp *)t_;
    if (!t) return;
    if (t->comm) ncclCommDestroy(t->comm);
    if (t->stream) cudaStreamDestroy(t->stream);
    cudaFree(t->dstage);
    free(t->hstage);
    free(t);
}

static const sl_transport_vt nccl_vt = {"nccl", nccl_exchange, nccl_abort, nccl_destroy};

sl_status sl_tp_nccl_new(sl_oob *oob, sl_transport **out) {
    nccl_tp *t = calloc(1, sizeof *t);
    ncclUniqueId *ids = calloc((size_t)oob->size, sizeof *ids);
    sl_status st = t && ids ? SL_OK : sl_fail(SL_ERR_NOMEM, "nccl transport: out of memory");
    int ndev = 0;
    const char *e = getenv("SUANLI_CUDA_DEVICE");
    if (st == SL_OK && cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
    if (st == SL_OK && ndev == 0) st = sl_fail(SL_ERR_UNSUPPORTED, "nccl transport: no CUDA device");
    if (st == SL_OK) {
        cudaError_t ce = cudaSetDevice(e && *e ? atoi(e) : oob->rank % ndev); /* missing: the local rank */
        if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking);
        if (ce != cudaSuccess) st = cuda_fail(ce, "device setup");
    }
    ncclUniqueId mine;
    memset(&mine, 0, sizeof mine);
    if (st == SL_OK && oob->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&mine);
        if (r != ncclSuccess) st = nccl_fail(r, "ncclGetUniqueId");
    }
    /* every rank takes part in the all-gather, even after a local failure, so no peer hangs in it */
    sl_status ag = oob->allgather(oob, &mine, ids, sizeof mine);
    if (st == SL_OK) st = ag;
    if (st == SL_OK) {
        ncclResult_t r = ncclCommInitRank(&t->comm, oob->size, ids[0], oob->rank);
        if (r != ncclSuccess) st = nccl_fail(r, "ncclCommInitRank");
    }
    free(ids);
    if (st != SL_OK) {
        nccl_destroy(t ? &t->base : NULL);
        return st;
    }
    t->base = (sl_transport){.vt = &nccl_vt,
                             .kind = SL_COMM_TRANSPORT_TCP, /* missing: an SL_COMM_TRANSPORT_NCCL kind */
                             .rank = oob->rank,
                             .size = oob->size,
                             .alpha = 10e-6,
                             .beta = 1.0 / 20e9};
    *out = &t->base;
    return SL_OK;
}
#endif
