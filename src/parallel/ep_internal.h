/* Private to src/parallel: the expert-parallel collectives (ep.c), called by the collective provider. */
#ifndef SUANLI_PARALLEL_EP_INTERNAL_H
#define SUANLI_PARALLEL_EP_INTERNAL_H
#include "suanli/parallel.h"

/* Runs an EP COLLECTIVE node (ALLTOALL, ALLTOALLV, ALLTOALLV_REV) over comm (P ranks; NULL when P = 1);
 * adds the bytes this rank sent to other ranks to *bytes. */
sl_status sl_ep_collective(sl_comm *comm, int P, sl_tensor *n, double *bytes);
#endif
