/* suanli run: launch N ranks of a program on this node (or one node of a multi-node job). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/topo.h"
#include "launch/launch.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: suanli run -n N [--nnodes M --node-rank R --master HOST:PORT] [--max-restarts K]\n"
        "                  [--grace SEC] [--bind auto|numa|core|none] [--no-prefix] [--hosts H] -- PROGRAM "
        "[ARGS...]\n"
        "  -n, --nproc-per-node N  ranks to start on this node\n"
        "  --nnodes M              nodes in the job (default 1); run once per node\n"
        "  --node-rank R           this node's index 0..M-1 (default 0)\n"
        "  --master HOST:PORT      rendezvous of rank 0 (required with --nnodes > 1)\n"
        "  --max-restarts K        restart the ranks of this node up to K times after a failure (not\n"
        "                          when the first failed rank exited 2, bad input: it would fail again)\n"
        "  --grace SEC             SIGTERM -> SIGKILL delay when stopping ranks (default 3)\n"
        "  --no-prefix             do not prefix output lines with [rank]\n"
        "  --bind MODE             numa: ranks in blocks over the NUMA nodes (hwloc), each on its node's\n"
        "                          cores, OpenMP threads bound to them; core: rank i on the i-th block of\n"
        "                          allowed/N CPUs; none; auto (default): numa when hwloc sees > 1 node\n"
        "  --hosts H               pooled checkpoints: consecutive groups of ranks act as H hosts\n"
        "                          (SUANLI_HOSTS; default: each rank is its own host)\n"
        "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
        "SUANLI_JOB_TOKEN (torchrun-compatible). Exit: 0 all ranks ok, 1 a rank failed, 2 bad usage,\n"
        "127 / 126 PROGRAM not found / not executable (no rank started), 128+S the launcher got signal S.\n"
        "Inside a Slurm allocation (SLURM_JOB_ID set, not already in a step) it execs\n"
        "  srun --nodes=M --ntasks-per-node=N --kill-on-bad-exit=1 PROGRAM ARGS   (SUANLI_RUN_NO_SRUN=1: "
        "don't)\n"
        "and the ranks take RANK/WORLD_SIZE from Slurm (SLURM_PROCID, SLURM_NTASKS).\n");
}

/* Under Slurm the allocation's launcher starts the ranks (one srun step over every node): suanli run
 * replaces itself with srun. Restarts are then the job's (suanli submit's --requeue), not ours. */
static int defer_to_srun(const sl_launch_opts *o, char **prog) {
    const char *job = getenv("SLURM_JOB_ID"), *no = getenv("SUANLI_RUN_NO_SRUN");
    if (!job || getenv("SLURM_STEP_ID") || (no && strcmp(no, "0"))) return 0;
    char srun[4096];
    if (!sl_cli_find_in_path("srun", srun, sizeof srun)) {
        fprintf(stderr, "suanli run: SLURM_JOB_ID is set but srun is not in PATH (is Slurm installed?); set "
                        "SUANLI_RUN_NO_SRUN=1 to launch locally\n");
        return 2;
    }
    int n = 0;
    while (prog[n]) n++;
    char **av = calloc((size_t)n + 5, sizeof(char *));
    char nodes[32], tasks[32];
    if (!av) return 0;
    snprintf(nodes, sizeof nodes, "--nodes=%d", o->nnodes);
    snprintf(tasks, sizeof tasks, "--ntasks-per-node=%d", o->nproc);
    av[0] = "srun";
    av[1] = nodes;
    av[2] = tasks;
    av[3] = "--kill-on-bad-exit=1";
    for (int i = 0; i < n; i++) av[4 + i] = prog[i];
    fprintf(stderr, "suanli run: inside Slurm job %s: exec srun %s %s --kill-on-bad-exit=1 %s ...%s\n", job,
            nodes, tasks, prog[0], o->max_restarts ? " (--max-restarts is left to the job's --requeue)" : "");
    fflush(stderr);
    execv(srun, av);
    fprintf(stderr, "suanli run: SLURM_JOB_ID is set but srun cannot be run (is Slurm installed?); "
                    "set SUANLI_RUN_NO_SRUN=1 to launch locally\n");
    free(av);
    return 2;
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || x > hi) {
        fprintf(stderr, "suanli run: %s: expected an integer in %d..%d, got '%s'\n", flag, lo, hi,
                v ? v : "");
        return 0;
    }
    *out = (int)x;
    return 1;
}

/* the flags that take a value; given last, or followed by the "--" before the program, it is missing (the
 * message had been "got ''" for `suanli run -n` and "got '--'" for `suanli run -n -- prog`) */
static int value_ok(const char *flag, const char *v) {
    static const char *const valued[] = {"-n",          "--nproc-per-node", "--nnodes",
                                         "--node-rank", "--max-restarts",   "--grace",
                                         "--master",    "--bind",           "--hosts"};
    int takes = 0;
    for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) takes |= !strcmp(flag, valued[k]);
    if (!takes) return 1;
    if (!v || !strcmp(v, "--")) {
        fprintf(stderr, "suanli run: %s: missing value\n", flag);
        return 0;
    }
    if (!*v) {
        fprintf(stderr, "suanli run: %s: empty value\n", flag);
        return 0;
    }
    return 1;
}

int sl_cmd_run(int argc, char **argv) {
    sl_launch_opts o = {.nproc = 0, .nnodes = 1, .grace_sec = 3.0, .prefix = 1, .bind = 1};
    const char *bind_mode = "auto";
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (a[0] != '-') break;
        if (!value_ok(a, v)) return 2;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--nproc-per-node")) {
            if (!parse_int(a, v, 1, 4096, &o.nproc)) return 2;
            i++;
        } else if (!strcmp(a, "--nnodes")) {
            if (!parse_int(a, v, 1, 100000, &o.nnodes)) return 2;
            i++;
        } else if (!strcmp(a, "--node-rank")) {
            if (!parse_int(a, v, 0, 99999, &o.node_rank)) return 2;
            i++;
        } else if (!strcmp(a, "--max-restarts")) {
            if (!parse_int(a, v, 0, 1000, &o.max_restarts)) return 2;
            i++;
        } else if (!strcmp(a, "--grace")) {
            char *end;
            o.grace_sec = v ? strtod(v, &end) : -1;
            if (!v || !*v || *end || !(o.grace_sec >= 0 && o.grace_sec <= 3600)) { /* NaN too */
                fprintf(stderr, "suanli run: --grace: expected seconds in 0..3600, got '%s'\n", v ? v : "");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--master")) {
            const char *colon = v ? strrchr(v, ':') : NULL;
            if (!colon || colon == v) {
                fprintf(stderr, "suanli run: --master: expected HOST:PORT, got '%s'\n", v ? v : "");
                return 2;
            }
            if ((size_t)(colon - v) >= sizeof o.master_addr) { /* it exited 2 without a word */
                fprintf(stderr, "suanli run: --master: host name longer than %zu characters\n",
                        sizeof o.master_addr - 1);
                return 2;
            }
            if (!parse_int("--master port", colon + 1, 1, 65535, &o.master_port)) return 2;
            memcpy(o.master_addr, v, (size_t)(colon - v));
            o.master_addr[colon - v] = 0;
            i++;
        } else if (!strcmp(a, "--bind")) {
            if (!v || (strcmp(v, "core") && strcmp(v, "none") && strcmp(v, "numa") && strcmp(v, "auto"))) {
                fprintf(stderr, "suanli run: --bind: expected auto, numa, core or none, got '%s'\n",
                        v ? v : "");
                return 2;
            }
            o.bind = strcmp(v, "none") != 0;
            bind_mode = v;
            i++;
        } else if (!strcmp(a, "--hosts")) {
            if (!parse_int(a, v, 1, 1 << 20, &o.hosts)) return 2;
            i++;
        } else if (!strcmp(a, "--no-prefix")) {
            o.prefix = 0;
        } else {
            fprintf(stderr, "suanli run: unknown flag '%s' (see suanli run --help)\n", a);
            return 2;
        }
    }
    if (o.nproc == 0) {
        fprintf(stderr, "suanli run: -n: the number of ranks is required (e.g. -n 4)\n");
        return 2;
    }
    if (i >= argc) {
        fprintf(stderr, "suanli run: no program given (suanli run -n N -- PROGRAM ARGS)\n");
        return 2;
    }
    if (o.node_rank >= o.nnodes) {
        fprintf(stderr, "suanli run: --node-rank: %d is not below --nnodes %d\n", o.node_rank, o.nnodes);
        return 2;
    }
    if (o.nnodes > 1 && !o.master_port) {
        fprintf(stderr, "suanli run: --master: HOST:PORT is required with --nnodes > 1\n");
        return 2;
    }
    if (o.hosts > o.nproc * o.nnodes) {
        fprintf(stderr, "suanli run: --hosts: %d exceeds the job's %d ranks\n", o.hosts, o.nproc * o.nnodes);
        return 2;
    }
    int srun_rc = defer_to_srun(&o, argv + i);
    if (srun_rc) return srun_rc;
    o.argv = argv + i;
    int exec_rc;
    if (sl_launch_check_program(o.argv[0], &exec_rc) != SL_OK) { /* before any rank starts */
        fprintf(stderr, "suanli run: %s\n", sl_errmsg());
        return exec_rc;
    }
    sl_rank_place *place = NULL;
    const char **lists = NULL;
    if (!strcmp(bind_mode, "numa") || !strcmp(bind_mode, "auto")) {
        place = calloc((size_t)o.nproc, sizeof *place);
        lists = calloc((size_t)o.nproc, sizeof *lists);
        char err[512];
        int nodes = place && lists ? sl_topo_place(o.nproc, NULL, place, err, sizeof err) : 0;
        if (nodes == 0 && !strcmp(bind_mode, "numa")) {
            fprintf(stderr, "suanli run: --bind numa: %s\n", place && lists ? err : "out of memory");
            free(place);
            free(lists);
            return 2;
        }
        if (nodes > 1 || (nodes == 1 && !strcmp(bind_mode, "numa"))) {
            for (int r = 0; r < o.nproc; r++) lists[r] = place[r].cpus;
            o.cpu_lists = lists;
        }
    }
    sl_launch_result res;
    sl_status st = sl_launch_run(&o, &res);
    free(place);
    free(lists);
    if (st == SL_OK) {
        if (res.restarts > 0)
            fprintf(stderr, "suanli run: every rank finished after %d restart%s\n", res.restarts,
                    res.restarts > 1 ? "s" : "");
        return 0;
    }
    fprintf(stderr, "suanli run: %s%s\n", sl_errmsg(),
            res.failed_rank >= 0 ? "; stopped the other ranks" : "");
    if (st == SL_ERR_INVALID) return 2;
    if (res.interrupted) return 128 + res.interrupted;
    return res.requeue ? SL_LAUNCH_EXIT_RESTART : 1; /* Note [Exit 75 asks for a restart] */
}
