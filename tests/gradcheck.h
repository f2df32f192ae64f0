/* Shared op-test harness: parameters with gradient leaves, forward runs, and the finite-difference
 * gradient check used by tests/ops/test_ops.c and tests/hf/test_llama_ops.c. */
#ifndef SL_TESTS_GRADCHECK_H
#define SL_TESTS_GRADCHECK_H
#include "suanli/device.h"
#include "suanli/graph.h"

#define MAXP 6
typedef struct {
    sl_ctx *ctx;
    sl_tensor *params[MAXP];
    float *pdata[MAXP], *gdata[MAXP];
    int np;
} tc;

typedef sl_tensor *(*build_fn)(tc *t);

/* Random-initialised f32 parameter N(0, scale) with a bound gradient leaf; RNG key set by gc_set_key. */
sl_tensor *param(tc *t, int ndim, const int64_t *ne, float scale);
void gc_set_key(uint64_t key);
void tc_free(tc *t); /* frees parameters and the ctx */
/* Run the forward graph of `out`; returns a malloc'd copy of its values. */
float *fwd(tc *t, sl_tensor *out);
/* loss = sum(out * R) with R fixed random; every parameter's analytic gradient must match central finite
 * differences (probed on a spread subset of elements) within 5e-3 of max|FD|. */
void grad_check(const char *name, build_fn fn);
#endif
