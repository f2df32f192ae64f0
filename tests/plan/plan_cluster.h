/* The cluster the planner tests model: one host of `devices` CPU devices, round numbers (not measured). */
#ifndef SL_TEST_PLAN_CLUSTER_H
#define SL_TEST_PLAN_CLUSTER_H
#include <stdio.h>

#include "suanli/plan.h"

static inline sl_plan_cluster local_cluster(int64_t devices) {
    sl_plan_cluster cl = {.hosts = 1,
                          .devices_per_host = devices,
                          .peak_flops = 1e11,
                          .gemm_efficiency = 0.8,
                          .mem_bw_Bps = 1.5e10,
                          .mem_bytes = 1e10,
                          .mem_reserve = 0.05,
                          .intra = {1e-6, 5e9},
                          .inter = {1e-6, 5e9},
                          .mtbf_hours = 1000,
                          .ckpt_write_Bps = 2.5e8,
                          .ckpt_read_Bps = 4e8,
                          .restart_sec = 5};
    snprintf(cl.launcher, sizeof cl.launcher, "run");
    return cl;
}

#endif
