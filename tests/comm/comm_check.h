/* Shared by the comm tests: the collective × dtype × op × size × in-place matrix, checked on
 * every rank against a serial reference computed from the same deterministic inputs. */
#ifndef SL_TEST_COMM_CHECK_H
#define SL_TEST_COMM_CHECK_H
#include "suanli/comm.h"

typedef struct cc_cfg {
    int large;  /* include 1Mi+3 (subset of dtype/op pairs) */
    int algos;  /* also force every all-reduce algorithm */
    int quick;  /* fewer dtype/op pairs (high rank counts over slow transports) */
    int window; /* all-reduce, reduce-scatter and all-gather(v) buffers from sl_comm_mem_alloc */
} cc_cfg;

/* Runs the matrix on comm; returns the number of failed cases on this rank (printed to stderr). */
int cc_run_matrix(sl_comm *c, const cc_cfg *cfg);
/* Split, async overlap, determinism, group send/recv; returns failures on this rank. */
int cc_run_extras(sl_comm *c);
/* Window collectives: bitwise equal to the ring (2 ranks) / direct algorithm (more), reproducible,
 * equal on every rank; asymmetric offsets fail promptly on every rank. Returns failures. */
int cc_run_window_extras(sl_comm *c);
/* Several hosts: the hierarchical all-reduce against the flat ring and an f64 reference on random
 * f32 data (reassociation bound), equal bits on every rank. 0 on one host. Returns failures. */
int cc_run_hier_check(sl_comm *c);
#endif
