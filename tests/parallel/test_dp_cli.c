/* DP through the CLI and the launcher: `suanli run -n 2 -- suanli train` reproduces the single-process
 * run's losses (and the same run under mpirun); bad layouts and mismatched configs fail with a clear error on
 * every rank, no hang. */
#include <string.h>
#include <unistd.h>

#include "suanli/base.h"
#include "testutil.h"

static char out[1 << 17];

#define run(...)                                                                                             \
    tu_runf(out, sizeof out, "SUANLI_COMM_ALGO=direct SUANLI_COMM_TIMEOUT=60 timeout 300", __VA_ARGS__)

#define TINY                                                                                                 \
    "--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 "          \
    "--global-batch-size 4 --train-iters 8 --eval-interval 0 --eval-iters 1 --threads 1"

int main(void) {
    const char *cli = tu_cli();
    char dir[512], data[600];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("dpcli"));
    int rc = tu_prepare_corpus(dir, 20000, data, sizeof data, out, sizeof out);
    TU_CHECK(rc == 0, "prepare: %s", out);
    rc = run("%s train --data-path %s " TINY " --save %s/single", cli, data, dir);
    TU_CHECK(rc == 0, "single: %s", out);
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --save %s/dp2", cli, cli, data, dir);
    TU_CHECK(rc == 0, "dp2: %s", out);
    TU_CHECK(strstr(out, "comm wait") && strstr(out, "data parallel: 2 ranks"),
             "progress shows dp and comm wait: %s", out);
    TU_CHECK(!strstr(out, "[1] step"), "only rank 0 logs progress");
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/single/metrics.jsonl", dir);
    snprintf(b, sizeof b, "%s/dp2/metrics.jsonl", dir);
    for (int s = 1; s <= 8; s++) {
        double x = tu_metric_at(a, s, "loss"), y = tu_metric_at(b, s, "loss");
        TU_CHECK(fabs(x - y) <= 1e-6 * fabs(x), "step %d: single %.7f dp2 %.7f", s, x, y);
    }
    /* the same program under mpirun (OpenMPI's environment; suanli's own transports): same weights. OpenMPI
     * 4.1 leaks in MPI_Init (no frame of ours), so leak checking is off for this run, as in tests/comm. */
    if (system("command -v mpirun >/dev/null 2>&1") == 0) {
        rc = run("env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                 "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 "
                 "mpirun --oversubscribe -np 2 %s "
                 "train --data-path %s " TINY " --save %s/mpi2",
                 cli, data, dir);
        TU_CHECK(rc == 0 && strstr(out, "data parallel: 2 ranks"), "dp2 under mpirun: %s", out);
        snprintf(a, sizeof a, "%s/dp2/model.safetensors", dir);
        snprintf(b, sizeof b, "%s/mpi2/model.safetensors", dir);
        TU_CHECK(tu_same_file(a, b), "DP under mpirun equals DP under suanli run bitwise");
    } else {
        printf("mpirun not installed: DP under mpirun skipped\n");
    }
    /* ZeRO-3 through the CLI: parameters sharded and gathered per bucket (eval included), gathered whole
     * for saving and sampling at the end; same weights as plain DP, bitwise (rank-ordered reduction) */
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY
             " --zero-stage 3 --save %s/dp2z3 --sample-tokens 8",
             cli, cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "ZeRO-3") && strstr(out, "slots") && strstr(out, "---- sample"),
             "dp2 zero3: %s", out);
    snprintf(a, sizeof a, "%s/dp2/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/dp2z3/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "ZeRO-3 saved weights equal plain DP's bitwise");
    snprintf(a, sizeof a, "%s/dp2/metrics.jsonl", dir);
    snprintf(b, sizeof b, "%s/dp2z3/metrics.jsonl", dir);
    for (int s = 1; s <= 8; s++) {
        double x = tu_metric_at(a, s, "loss"), y = tu_metric_at(b, s, "loss");
        TU_CHECK(x == y, "step %d: dp2 %.7f dp2 zero3 %.7f", s, x, y);
    }
    /* micro-batch lanes under DP (Note [Micro-batch lanes]): each rank's 2 lanes of one row each, ZeRO-1; the
     * loss at the DP bar of the single process (test_lanes holds the weights); ZeRO-2 refused by name with
     * exit 2 on each rank (the launcher exits non-zero) before anything is written */
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY
             " --zero-stage 1 --micro-batch-lanes 2 --save %s/lanes",
             cli, cli, data, dir);
    TU_CHECK(rc == 0, "dp2 with lanes: %s", out);
    snprintf(a, sizeof a, "%s/single/metrics.jsonl", dir);
    snprintf(b, sizeof b, "%s/lanes/metrics.jsonl", dir);
    for (int s = 1; s <= 8; s++) {
        double x = tu_metric_at(a, s, "loss"), y = tu_metric_at(b, s, "loss");
        TU_CHECK(fabs(x - y) <= 1e-6 * fabs(x), "step %d: single %.7f dp2 with lanes %.7f", s, x, y);
    }
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY
             " --zero-stage 2 --micro-batch-lanes 2 --save %s/lanes_z2",
             cli, cli, data, dir);
    snprintf(a, sizeof a, "%s/lanes_z2", dir);
    TU_CHECK(rc != 0 && strstr(out, "--micro-batch-lanes 2: not supported with --zero-stage 2") &&
                 access(a, F_OK) != 0,
             "lanes with ZeRO-2: rc %d %s", rc, out);
    /* bad layouts: clear error on every rank, exit non-zero, no hang */
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --global-batch-size 6", cli, cli, data);
    TU_CHECK(rc != 0 && strstr(out, "[0]") && strstr(out, "[1]") && strstr(out, "data-parallel size 2"),
             "batch not divisible by dp: rc %d %s", rc, out);
    rc = run("%s run -n 3 -- %s train --data-path %s " TINY " --tp 2", cli, cli, data);
    TU_CHECK(rc != 0 && strstr(out, "not divisible by tensor"), "tp does not divide world: rc %d %s", rc,
             out);
    /* mismatched configuration between ranks: rank 1 gets another seed */
    rc = run("%s run -n 2 -- sh -c 'exec %s train --data-path %s " TINY " --seed $((1 + $RANK))'", cli, cli,
             data);
    TU_CHECK(rc != 0 && strstr(out, "different configuration"), "config mismatch detected: rc %d %s", rc,
             out);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_finish("test_dp_cli");
}
