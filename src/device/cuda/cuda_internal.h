/* Internal interface of the CUDA backend's host side: the device state, tensor resolution and the helpers
 * shared by cuda_backend.c (device, memory, copies, state operations), cuda_ops.c (supports_op, dispatch,
 * elementwise ops, cuBLAS GEMMs) and cuda_ops_nn.c (norms, attention, losses, Llama ops). The kernels'
 * launchers are in cuda_kernels.h. Nothing outside src/device/cuda includes it. */
#ifndef SL_CUDA_INTERNAL_H
#define SL_CUDA_INTERNAL_H

#include <cublas_v2.h>

#include "device/cuda/cuda_kernels.h"
#include "suanli/device.h"

typedef struct cu_state {
    int tried;          /* initialisation attempted */
    sl_status init_st;  /* its result */
    char init_err[512]; /* its message */
    int device;
    char device_name[256];
    int cc_major, cc_minor;
    size_t total_mem;
    cudaStream_t stream; /* every copy, memset, kernel and GEMM of the backend, in order */
    cublasHandle_t blas;
    int tf32;          /* SUANLI_CUDA_TF32=1: fp32 GEMMs on tensor cores (TF32 inputs, fp32 accumulate) */
    int deterministic; /* SUANLI_CUDA_DETERMINISTIC=1: ordered embedding backward (no atomics) */
    void *scratch;     /* grown on demand: per-node temporaries (stream-ordered) */
    size_t scratch_size;
    int *flag; /* 2 device ints: an out-of-range id seen by a kernel (1, value) */
} cu_state;

extern cu_state g_cu;

/* cuBLAS entry points, resolved by cu_blas_load (cuda_blas.c, Note [cuBLAS loaded on first use]) */
typedef struct cu_blas_api {
    void *handle; /* dlopen handle; NULL until loaded */
    __typeof__(&cublasCreate_v2) create;
    __typeof__(&cublasSetStream_v2) set_stream;
    __typeof__(&cublasGemmEx) gemm_ex;
    __typeof__(&cublasGemmStridedBatchedEx) gemm_strided_batched_ex;
} cu_blas_api;
extern cu_blas_api g_blas;
/* load cuBLAS once; on failure a message naming the library goes to err */
sl_status cu_blas_load(char *err, size_t cap);

sl_status cu_fail(cudaError_t err, const char *what);
sl_status cu_blas_fail(cublasStatus_t st, const char *what);
/* a launcher's result -> sl_status naming the kernel */
static inline sl_status cu_ok(cudaError_t err, const char *what) {
    return err == cudaSuccess ? SL_OK : cu_fail(err, what);
}
/* Device address of tensor t (a source or the output of node n), refusing memory that is not one of this
 * backend's buffers (a leaf bound to host memory with sl_tensor_bind) by name. */
sl_status cu_ptr_of(const sl_tensor *n, const sl_tensor *t, void **p);
/* the aux area after t's data */
sl_status cu_aux_of(const sl_tensor *n, const sl_tensor *t, float **p);
/* a scratch region of at least `bytes` (valid until the next cu_scratch call) */
sl_status cu_scratch(size_t bytes, void **out);
/* read the kernels' out-of-range flag (synchronizes); non-zero -> an error naming `what` */
sl_status cu_check_flag(const char *what, int64_t limit);

/* 5-D iteration forms (leading 1s) */
typedef struct cu_it5 {
    cu_v5 ne, nb;
} cu_it5;
cu_it5 cu_it5_of(const sl_tensor *t);
cu_it5 cu_it5_broadcast(const sl_tensor *b, const sl_tensor *out);
cu_v5 cu_contig_nb(cu_v5 ne);
cu_v5 cu_flat_ne(int64_t n);
/* flat span versions of scale / fill over f32 elements */
sl_status cu_ew_flat(int op, float f, float *p, int64_t n);

int cu_supports(const sl_tensor *n);
sl_status cu_compute(sl_tensor *n);
sl_status cu_op_nn(sl_tensor *n); /* norms, softmax, attention, embedding, loss, llama ops */
#endif
