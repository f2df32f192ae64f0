/* The job launcher behind `suanli run`: spawns the local ranks of a job with their environment
 * (torchrun-compatible: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
 * plus SUANLI_JOB_TOKEN and SUANLI_RESTART_COUNT), prefixes every output line with "[rank] ",
 * forwards SIGINT/SIGTERM/SIGHUP, and when one rank fails stops the others (SIGTERM, then SIGKILL
 * after the grace period) and reports which rank failed and why. Depends on base only. */
#ifndef SL_LAUNCH_H
#define SL_LAUNCH_H
#include "suanli/base.h"

typedef struct sl_launch_opts {
    int nproc;             /* ranks on this node (>= 1) */
    int nnodes;            /* nodes in the job (>= 1) */
    int node_rank;         /* this node, 0..nnodes-1 */
    char master_addr[256]; /* "" on one node: 127.0.0.1 and a free port */
    int master_port;
    double grace_sec;             /* SIGTERM -> SIGKILL delay (default 3) */
    int max_restarts;             /* restart the whole local group up to this many times after a failure */
    int prefix;                   /* prefix lines with "[rank] " (default 1) */
    int bind;                     /* 1 (and nproc > 1, enough CPUs): pin local rank i to the i-th block of
                                     allowed/nproc CPUs (like mpirun --bind-to); 0: leave it to the kernel */
    const char *const *cpu_lists; /* per local rank, a CPU list ("0-3,8"; NUMA-aware placement computed by
                                     the caller, suanli run --bind numa): pins rank i to it instead of the
                                     block rule above, and its OpenMP threads to its cores
                                     (OMP_PROC_BIND=close, OMP_PLACES=cores unless set); NULL: block rule */
    int hosts;                    /* pooled checkpoints (--ckpt-local-dir): ranks form this many "hosts" in
                                     consecutive groups, passed as SUANLI_HOSTS; 0: SUANLI_HOSTS from the
                                     environment, else every rank is its own host */
    char **argv;                  /* program and arguments, NULL-terminated (borrowed) */
} sl_launch_opts;

typedef struct sl_launch_result {
    int failed_rank; /* -1 when every rank exited 0 */
    int exit_code;   /* of the failed rank, or -1 */
    int signal;      /* that killed it, or 0 */
    int restarts;    /* restarts performed */
    int interrupted; /* the launcher received this signal (0: none) */
    int requeue;     /* the attempt failed and every rank that failed before the launcher signalled any
                        exited SL_LAUNCH_EXIT_RESTART (Note [Exit 75 asks for a restart]) */
} sl_launch_result;

/* EX_TEMPFAIL: a rank's "restart me" (suanli train after SIGUSR1 committed a checkpoint, SL_EXIT_REQUEUE) */
#define SL_LAUNCH_EXIT_RESTART 75

/* SL_OK when the ranks can exec `prog` (as execvp will: a path when it holds '/', else searched in PATH);
 * else SL_ERR_INVALID with a one-line message and *shell_code 127 (not found) or 126 (found, not
 * executable: a directory, no execute permission), the shell's exit codes. Called before any rank starts. */
sl_status sl_launch_check_program(const char *prog, int *shell_code);

/* Run the job to completion. SL_OK: every rank exited 0. SL_ERR_PEER: a rank failed (message
 * names rank and cause). SL_ERR_INVALID: bad options. SL_ERR_IO: could not spawn. */
sl_status sl_launch_run(const sl_launch_opts *o, sl_launch_result *res);
#endif
