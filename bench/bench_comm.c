/* suanli bench comm [--json] [-n N] [--min-bytes B] [--max-bytes B] [--colls LIST] [--iters K] [--reps R]
 *                   [--window] [--consume] [--algos LIST]
 *
 * --algos ring,hier,...: all-reduce also timed with each listed algorithm forced (sl_comm_set_algo),
 * interleaved with the other columns, printed as "algos" (JSON) or extra columns; the plain column is
 * the automatic choice. On a multi-host communicator this compares the hierarchical all-reduce with the
 * flat ring over the same (hybrid) transport in one run (bench/comm_hosts.sh).
 *
 * --window: also run every call on buffers from sl_comm_mem_alloc (symmetric windows: the direct
 * algorithms of src/comm/algo/sym.c on shm), printed first as the "window" columns, beside the plain
 * (private buffers) and MPI columns of the same run.
 *
 * Runs inside a job (suanli run / mpirun / srun); with -n N outside a job it launches itself.
 * For each collective and size (x2 steps): time per call, algbw =
 * bytes / time, busbw = algbw x factor (all-reduce 2(n-1)/n; all-gather, reduce-scatter,
 * all-to-all (n-1)/n; broadcast 1), and #wrong elements of a checked call. In an MPI build under
 * mpirun the same loop runs through MPI_* in the same process for comparison.
 *
 * Timing: R blocks (--reps, default 5) of K calls each (--iters, default by size), the window, plain
 * and MPI blocks interleaved (window, plain, MPI, window, plain, MPI, ...) so that a slow spell of a
 * shared machine falls on all three alike; a block's time is the max over ranks of its mean per call,
 * and the printed time is the median block. --consume: after each call every rank reads one float per
 * cache line of its result (the time includes it, for all columns alike): the window all-reduce
 * stores into the peers' buffers, so without it a result line can stay in the writer's cache from
 * call to call, which no real consumer would allow. */
#define _GNU_SOURCE
#include "bench_comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch/launch.h"
#include "suanli/comm.h"
#ifdef SL_HAVE_MPI
#include <mpi.h>
#endif

enum { C_AR, C_AG, C_RS, C_A2A, C_BC, C_A2AV, C_COUNT };
static const char *CNAME[] = {"all_reduce", "all_gather", "reduce_scatter",
                              "all_to_all", "broadcast",  "all_to_allv"};
_Static_assert(sizeof CNAME / sizeof CNAME[0] == C_COUNT, "one name per collective");

/* all_to_allv: uniform counts (count/n per peer) through the v interface, the displacements of
 * all_to_all; sl_comm_all_to_allv against MPI_Alltoallv (size_t vs int arrays, filled once) */
#define MAX_V_RANKS 256
static size_t g_vc[MAX_V_RANKS], g_vd[MAX_V_RANKS];
#ifdef SL_HAVE_MPI
static int g_mc[MAX_V_RANKS], g_md[MAX_V_RANKS];
#endif
static void set_v(size_t per, int n) {
    for (int j = 0; j < n && j < MAX_V_RANKS; j++) {
        g_vc[j] = per, g_vd[j] = (size_t)j * per;
#ifdef SL_HAVE_MPI
        g_mc[j] = (int)per, g_md[j] = (int)((size_t)j * per);
#endif
    }
}

#define MAX_ALGOS 4
typedef struct bopts {
    int json, iters, reps, window;
    int nalgo; /* --algos: extra all-reduce columns, each with that algorithm forced */
    sl_comm_algo algos[MAX_ALGOS];
    size_t minb, maxb;
    int colls[C_COUNT];
} bopts;

static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s) return 0;
    double m = 1;
    if (*end == 'K' || *end == 'k')
        m = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        m = 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        m = 1024.0 * 1024 * 1024, end++;
    if (*end || !(v * m >= 0 && v * m <= 0x1p50)) return 0; /* NaN, inf, 1e30: no size_t */
    *out = (size_t)(v * m);
    return 1;
}

static double factor(int c, int n) {
    if (c == C_AR) return 2.0 * (n - 1) / n;
    if (c == C_BC) return 1.0;
    return (double)(n - 1) / n;
}

/* One call of collective c on `bytes` total (f32): ours (mpi=0) or MPI's (mpi=1). */
static sl_status call(sl_comm *comm, int mpi, int c, float *sb, float *rb, size_t count, int n) {
    size_t per = count / (size_t)n;
    (void)mpi;
#ifdef SL_HAVE_MPI
    if (mpi) {
        int rc = MPI_SUCCESS;
        switch (c) {
        case C_AR:
            rc = MPI_Allreduce(sb, rb, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
        case C_AG:
            rc = MPI_Allgather(sb, (int)per, MPI_FLOAT, rb, (int)per, MPI_FLOAT, MPI_COMM_WORLD);
            break;
        case C_RS:
            rc = MPI_Reduce_scatter_block(sb, rb, (int)per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
        case C_A2A:
            rc = MPI_Alltoall(sb, (int)per, MPI_FLOAT, rb, (int)per, MPI_FLOAT, MPI_COMM_WORLD);
            break;
        case C_BC:
            rc = MPI_Bcast(rb, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
            break;
        case C_A2AV:
            rc = MPI_Alltoallv(sb, g_mc, g_md, MPI_FLOAT, rb, g_mc, g_md, MPI_FLOAT, MPI_COMM_WORLD);
            break;
        }
        return rc == MPI_SUCCESS ? SL_OK : sl_fail(SL_ERR_PEER, "MPI call failed");
    }
#endif
    switch (c) {
    case C_AR:
        return sl_comm_all_reduce(comm, sb, rb, count, SL_COMM_F32, SL_COMM_SUM);
    case C_AG:
        return sl_comm_all_gather(comm, sb, rb, per, SL_COMM_F32);
    case C_RS:
        return sl_comm_reduce_scatter(comm, sb, rb, per, SL_COMM_F32, SL_COMM_SUM);
    case C_A2A:
        return sl_comm_all_to_all(comm, sb, rb, per, SL_COMM_F32);
    case C_A2AV:
        return sl_comm_all_to_allv(comm, sb, g_vc, g_vd, rb, g_vc, g_vd, SL_COMM_F32);
    default:
        return sl_comm_broadcast(comm, rb, rb, count, SL_COMM_F32, 0);
    }
}

/* Fill inputs so that every result element is known; count wrong elements after one call. */
static long check(sl_comm *comm, int mpi, int c, float *sb, float *rb, size_t count, int n, int r,
                  sl_status *st) {
    size_t per = count / (size_t)n, in = c == C_AG ? per : count, outn = (c == C_RS) ? per : count;
    for (size_t i = 0; i < in; i++) sb[i] = (float)(r + 1) + (float)(i % 5);
    for (size_t i = 0; i < count; i++) rb[i] = c == C_BC ? (r == 0 ? (float)(i % 11) : -1.f) : -1.f;
    *st = call(comm, mpi, c, sb, rb, count, n);
    if (*st != SL_OK) return -1;
    long wrong = 0;
    float tot = (float)n * (float)(n + 1) / 2;
    for (size_t i = 0; i < outn; i++) {
        float want;
        switch (c) {
        case C_AR:
            want = tot + (float)n * (float)(i % 5);
            break;
        case C_RS:
            want = tot + (float)n * (float)((r * per + i) % 5);
            break;
        case C_AG:
            want = (float)(i / per + 1) + (float)((i % per) % 5);
            break;
        case C_A2A:
        case C_A2AV:
            want = (float)(i / per + 1) + (float)((r * per + i % per) % 5);
            break;
        default:
            want = (float)(i % 11);
        }
        wrong += rb[i] != want;
    }
    return wrong;
}

static int iters_for(size_t bytes, int forced) {
    if (forced) return forced;
    if (bytes <= (64u << 10)) return 200;
    if (bytes <= (4u << 20)) return 40;
    if (bytes <= (32u << 20)) return 10;
    return 5;
}

/* mean time per call, max over ranks (warm: no warm-up calls first) */
/* --consume: the caller reads every cache line of its result after each call, as an optimizer reading
 * its gradients would, so a result a peer stored into this rank's buffer is paid for in the loop. */
static int g_consume;
static volatile float g_sink;
static void consume(const float *rb, size_t count) {
    float s = 0;
    for (size_t i = 0; i < count; i += 16) s += rb[i];
    g_sink = s;
}

static double timed(sl_comm *comm, int mpi, int c, float *sb, float *rb, size_t count, int n, int iters,
                    int warm, sl_status *st) {
    size_t outn = c == C_RS ? count / (size_t)n : count;
    for (int w = 0; w < 2 && !warm && *st == SL_OK; w++) *st = call(comm, mpi, c, sb, rb, count, n);
    if (*st == SL_OK) *st = sl_comm_barrier(comm);
    double t0 = sl_time_sec();
    for (int k = 0; k < iters && *st == SL_OK; k++) {
        *st = call(comm, mpi, c, sb, rb, count, n);
        if (g_consume) consume(rb, outn);
    }
    double t = (sl_time_sec() - t0) / iters;
    if (*st == SL_OK) *st = sl_comm_all_reduce(comm, &t, &t, 1, SL_COMM_F64, SL_COMM_MAX);
    return t;
}

#define MAX_REPS 101
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int k) {
    qsort(v, (size_t)k, sizeof *v, cmp_double);
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

static int relaunch(int n, int argc, char **argv) {
    /* suanli bench comm ... -n N outside a job: start N copies of ourselves */
    char **av = calloc((size_t)argc + 4, sizeof(char *));
    int k = 0;
    av[k++] = "/proc/self/exe";
    av[k++] = "bench";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-n")) {
            i++;
            continue;
        }
        av[k++] = argv[i];
    }
    char exe[4096];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l > 0) {
        exe[l] = 0;
        av[0] = exe;
    }
    sl_launch_opts o = {.nproc = n, .nnodes = 1, .grace_sec = 3, .prefix = 0, .bind = 1, .argv = av};
    sl_launch_result res;
    sl_status st = sl_launch_run(&o, &res);
    free(av);
    if (st != SL_OK) fprintf(stderr, "suanli bench comm: %s\n", sl_errmsg());
    return st == SL_OK ? 0 : 1;
}

/* v as an int in [lo, hi], else -1 (atoi read '5abc' as 5 and overflowed on 99999999999) */
static int parse_count(const char *v, int lo, int hi) {
    char *end;
    long x = strtol(v, &end, 10);
    return *v && !*end && x >= lo && x <= hi ? (int)x : -1;
}

/* the flags into *o and *nlaunch; returns -1 to go on, else the exit status (0: --help, 2: bad flag) */
static int parse_flags(int argc, char **argv, bopts *o, int *nlaunch) {
    int any = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json"))
            o->json = 1;
        else if (!strcmp(a, "--window"))
            o->window = 1;
        else if (!strcmp(a, "--consume"))
            g_consume = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: suanli bench comm [--json] [-n N] [--min-bytes B] [--max-bytes B] [--iters K] "
                   "[--reps R] [--window] [--consume] [--algos ring,rd,direct,hier]\n"
                   "                         [--colls "
                   "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,all_to_allv]\n"
                   "Run inside a job (suanli run -n N -- suanli bench comm, mpirun, srun) or pass -n N.\n");
            return 0;
        } else if ((!strcmp(a, "--min-bytes") || !strcmp(a, "--max-bytes")) && v) {
            if (!parse_size(v, a[2] == 'm' && a[3] == 'i' ? &o->minb : &o->maxb)) {
                fprintf(stderr, "suanli bench comm: %s: expected a size like 8, 64K, 256M, got '%s'\n", a, v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--iters") && v) {
            o->iters = parse_count(v, 1, 1 << 30);
            if (o->iters < 1) {
                fprintf(stderr, "suanli bench comm: --iters: expected an integer in 1..%d, got '%s'\n",
                        1 << 30, v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--reps") && v) {
            o->reps = parse_count(v, 1, MAX_REPS);
            if (o->reps < 1 || o->reps > MAX_REPS) {
                fprintf(stderr, "suanli bench comm: --reps: expected an integer in 1..%d, got '%s'\n",
                        MAX_REPS, v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "-n") && v) {
            *nlaunch = parse_count(v, 1, 4096);
            if (*nlaunch < 1) {
                fprintf(stderr, "suanli bench comm: -n: expected an integer in 1..4096, got '%s'\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--algos") && v) {
            char tmp[256];
            snprintf(tmp, sizeof tmp, "%s", v);
            for (char *s = strtok(tmp, ","); s; s = strtok(NULL, ",")) {
                int f = -1;
                for (int k = 0; k < SL_COMM_ALGO_COUNT; k++)
                    if (!strcmp(s, sl_comm_algo_name((sl_comm_algo)k))) f = k;
                if (f < 0 || o->nalgo == MAX_ALGOS) {
                    fprintf(
                        stderr,
                        "suanli bench comm: --algos: %s '%s' (want up to %d of auto,ring,rd,direct,hier)\n",
                        f < 0 ? "unknown algorithm" : "too many algorithms at", s, MAX_ALGOS);
                    return 2;
                }
                o->algos[o->nalgo++] = (sl_comm_algo)f;
            }
            i++;
        } else if (!strcmp(a, "--colls") && v) {
            char tmp[256];
            snprintf(tmp, sizeof tmp, "%s", v);
            for (char *s = strtok(tmp, ","); s; s = strtok(NULL, ",")) {
                int f = -1;
                for (int c = 0; c < C_COUNT; c++)
                    if (!strcmp(s, CNAME[c])) f = c;
                if (f < 0) {
                    fprintf(stderr, "suanli bench comm: --colls: unknown collective '%s'\n", s);
                    return 2;
                }
                o->colls[f] = any = 1;
            }
            i++;
        } else { /* a value flag last on the line fell through to here: "unknown flag '--reps'" */
            static const char *const valued[] = {"--min-bytes", "--max-bytes", "--iters", "--reps",
                                                 "-n",          "--algos",     "--colls"};
            int known = 0;
            for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(a, valued[k]);
            if (known)
                fprintf(stderr, "suanli bench comm: %s: missing value\n", a);
            else
                fprintf(stderr, "suanli bench comm: unknown flag '%s'\n", a);
            return 2;
        }
    }
    if (!any)
        for (int c = 0; c < C_COUNT; c++) o->colls[c] = 1;
    if (o->minb < 4) o->minb = 4;
    if (o->maxb < o->minb) { /* no size to run: it printed empty tables, exit 0 */
        fprintf(stderr, "suanli bench comm: --max-bytes %zu is below --min-bytes %zu\n", o->maxb, o->minb);
        return 2;
    }
    return -1;
}

#ifdef SL_HAVE_MPI
static void bench_mpi_fini(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}
#endif

int sl_bench_comm(int argc, char **argv) {
    bopts o = {.minb = 8, .maxb = (size_t)256 << 20, .reps = 5};
    int nlaunch = 0, rc = parse_flags(argc, argv, &o, &nlaunch);
    if (rc >= 0) return rc;
    if (nlaunch > 0 && !getenv("RANK") && !getenv("OMPI_COMM_WORLD_RANK") && !getenv("PMI_RANK") &&
        !getenv("SLURM_PROCID"))
        return relaunch(nlaunch, argc, argv);

#ifdef SL_HAVE_MPI
    /* under mpirun with MASTER_ADDR/MASTER_PORT exported our communicator bootstraps over TCP (shm,
     * tcp or hybrid, not the MPI transport), and MPI is initialised here only for its own column: both
     * run in the same processes, blocks interleaved (bench/comm_hosts.sh) */
    int mpi_inited = 0;
    MPI_Initialized(&mpi_inited);
    if (!mpi_inited && getenv("OMPI_COMM_WORLD_SIZE") && getenv("MASTER_PORT")) {
        int provided;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) == MPI_SUCCESS)
            atexit(bench_mpi_fini);
    }
#endif
    sl_comm *comm;
    if (sl_comm_init_env(&comm, NULL) != SL_OK) {
        fprintf(stderr, "suanli bench comm: %s\n", sl_errmsg());
        return 1;
    }
    int n = sl_comm_size(comm), r = sl_comm_rank(comm), have_mpi = 0;
    if (n > MAX_V_RANKS) o.colls[C_A2AV] = 0;
#ifdef SL_HAVE_MPI
    {
        int inited = 0, ws = 0;
        MPI_Initialized(&inited);
        if (inited) MPI_Comm_size(MPI_COMM_WORLD, &ws);
        have_mpi = inited && ws == n;
    }
#endif
    size_t maxcount = o.maxb / 4 + (size_t)n;
    float *sb = sl_malloc_aligned(maxcount * 4), *rb = sl_malloc_aligned(maxcount * 4);
    if (!sb || !rb) {
        fprintf(stderr, "suanli bench comm: cannot allocate 2 x %zu bytes\n", maxcount * 4);
        return 1;
    }
    memset(sb, 0, maxcount * 4);
    memset(rb, 0, maxcount * 4);
    float *wsb = NULL, *wrb = NULL;
    if (o.window) {
        if (sl_comm_mem_alloc(comm, maxcount * 4, (void **)&wsb) != SL_OK ||
            sl_comm_mem_alloc(comm, maxcount * 4, (void **)&wrb) != SL_OK) {
            fprintf(stderr, "suanli bench comm: sl_comm_mem_alloc: %s\n", sl_errmsg());
            return 1;
        }
        memset(wsb, 0, maxcount * 4);
        memset(wrb, 0, maxcount * 4);
    }
    int shared = o.window && sl_comm_mem_is_shared(comm, wsb, maxcount * 4);
    char host[64] = {0};
    gethostname(host, sizeof host - 1);
    const char *tp = sl_comm_transport_name(sl_comm_transport(comm));
    if (r == 0) {
        if (o.json)
            printf("{\"bench\":\"comm\",\"ranks\":%d,\"transport\":\"%s\",\"host\":\"%s\",\"dtype\":\"f32\","
                   "\"mpi\":%s,\"reps\":%d,\"window\":%s,\"results\":[",
                   n, tp, host, have_mpi ? "true" : "false", o.reps,
                   !o.window ? "false"
                   : shared  ? "\"shared\""
                             : "\"private\"");
        else
            printf("# suanli bench comm: %d ranks, transport %s, host %s, dtype f32, op sum, median of %d "
                   "interleaved blocks%s%s\n",
                   n, tp, host, o.reps, have_mpi ? ", MPI comparison in the same run" : "",
                   !o.window ? ""
                   : shared  ? ", window = sl_comm_mem_alloc buffers (shared)"
                             : ", window = sl_comm_mem_alloc buffers (private fallback on this transport)");
    }
    int first = 1, status = 0;
    sl_status st = SL_OK;
    for (int c = 0; c < C_COUNT && st == SL_OK; c++) {
        if (!o.colls[c]) continue;
        if (r == 0 && !o.json) {
            printf("#\n# %s\n# %12s %10s", CNAME[c], "bytes", "count");
            if (o.window) printf(" %11s %8s %7s |", "window(us)", "busbw", "#wrong");
            printf(" %11s %8s %8s %7s", "time(us)", "algbw", "busbw", "#wrong");
            if (have_mpi) printf(" | %11s %8s %8s %7s %6s", "mpi(us)", "algbw", "busbw", "#wrong", "ratio");
            for (int a = 0; c == C_AR && a < o.nalgo; a++)
                printf(" | %8s(us) %8s %7s", sl_comm_algo_name(o.algos[a]), "busbw", "#wrong");
            if (o.window) printf(" | %7s%s", "w/plain", have_mpi ? "  w/mpi" : "");
            printf("\n");
        }
        for (size_t bytes = o.minb; bytes <= o.maxb && st == SL_OK; bytes *= 2) {
            size_t count = bytes / 4;
            if (c != C_AR && c != C_BC) count = count / (size_t)n * (size_t)n;
            if (count == 0) continue;
            size_t b = count * 4;
            int it = iters_for(b, o.iters);
            set_v(count / (size_t)n, n);
            /* modes: 0 window buffers, 1 plain buffers, 2 MPI (plain buffers), 3.. plain buffers with
             * --algos[m-3] forced (all-reduce only) */
            enum { NM = 3 + MAX_ALGOS };
            int on[NM] = {o.window, 1, have_mpi};
            float *msb[NM] = {wsb, sb, sb}, *mrb[NM] = {wrb, rb, rb};
            for (int a = 0; a < MAX_ALGOS; a++)
                on[3 + a] = c == C_AR && a < o.nalgo, msb[3 + a] = sb, mrb[3 + a] = rb;
            long nwrong[NM] = {0};
            double bt[NM][MAX_REPS], tm[NM] = {0};
            for (int m = 0; m < NM && st == SL_OK; m++) {
                if (!on[m]) continue;
                if (m >= 3) sl_comm_set_algo(comm, o.algos[m - 3]);
                nwrong[m] = check(comm, m == 2, c, msb[m], mrb[m], count, n, r, &st);
                sl_comm_set_algo(comm, SL_COMM_ALGO_AUTO);
                if (st == SL_OK)
                    st = sl_comm_all_reduce(comm, &nwrong[m], &nwrong[m], 1, SL_COMM_I64, SL_COMM_SUM);
                if (nwrong[m]) status = 1;
            }
            for (int k = 0; k < o.reps && st == SL_OK; k++)
                for (int m = 0; m < NM && st == SL_OK; m++)
                    if (on[m]) {
                        if (m >= 3) sl_comm_set_algo(comm, o.algos[m - 3]);
                        bt[m][k] = timed(comm, m == 2, c, msb[m], mrb[m], count, n, it, k > 0, &st);
                        sl_comm_set_algo(comm, SL_COMM_ALGO_AUTO);
                    }
            for (int m = 0; m < NM && st == SL_OK; m++)
                if (on[m]) tm[m] = median(bt[m], o.reps);
            long wwrong = nwrong[0], wrong = nwrong[1], mwrong = nwrong[2];
            double wt = tm[0], t = tm[1], mt = tm[2];
            if (st != SL_OK) break;
            if (wrong) status = 1;
            double alg = (double)b / t / 1e9, bus = alg * factor(c, n);
            if (r != 0) continue;
            if (o.json) {
                printf("%s\n{\"coll\":\"%s\",\"bytes\":%zu,\"time_us\":%.3f,\"algbw\":%.4f,\"busbw\":%.4f,"
                       "\"wrong\":%ld",
                       first ? "" : ",", CNAME[c], b, t * 1e6, alg, bus, wrong);
                if (o.window)
                    printf(",\"window_time_us\":%.3f,\"window_busbw\":%.4f,\"window_wrong\":%ld", wt * 1e6,
                           (double)b / wt / 1e9 * factor(c, n), wwrong);
                if (have_mpi)
                    printf(",\"mpi_time_us\":%.3f,\"mpi_busbw\":%.4f,\"mpi_wrong\":%ld", mt * 1e6,
                           (double)b / mt / 1e9 * factor(c, n), mwrong);
                for (int a = 0; c == C_AR && a < o.nalgo; a++)
                    printf("%s\"%s\":{\"time_us\":%.3f,\"busbw\":%.4f,\"wrong\":%ld}",
                           a ? "," : ",\"algos\":{", sl_comm_algo_name(o.algos[a]), tm[3 + a] * 1e6,
                           (double)b / tm[3 + a] / 1e9 * factor(c, n), nwrong[3 + a]);
                if (c == C_AR && o.nalgo) printf("}");
                printf("}");
                first = 0;
            } else {
                printf("  %12zu %10zu", b, count);
                if (o.window)
                    printf(" %11.2f %8.3f %7ld |", wt * 1e6, (double)b / wt / 1e9 * factor(c, n), wwrong);
                printf(" %11.2f %8.3f %8.3f %7ld", t * 1e6, alg, bus, wrong);
                if (have_mpi)
                    printf(" | %11.2f %8.3f %8.3f %7ld %6.2f", mt * 1e6, (double)b / mt / 1e9,
                           (double)b / mt / 1e9 * factor(c, n), mwrong, mt / t);
                for (int a = 0; c == C_AR && a < o.nalgo; a++)
                    printf(" | %12.2f %8.3f %7ld", tm[3 + a] * 1e6,
                           (double)b / tm[3 + a] / 1e9 * factor(c, n), nwrong[3 + a]);
                if (o.window) {
                    printf(" | %7.2f", t / wt);
                    if (have_mpi) printf(" %6.2f", mt / wt);
                }
                printf("\n");
            }
            fflush(stdout);
        }
    }
    if (r == 0 && o.json) printf("\n]}\n");
    if (st != SL_OK) {
        fprintf(stderr, "suanli bench comm: rank %d: %s\n", r, sl_errmsg());
        status = 1;
    }
    sl_free_aligned(sb);
    sl_free_aligned(rb);
    if (st == SL_OK) {
        sl_comm_mem_free(comm, wsb);
        sl_comm_mem_free(comm, wrb);
    }
    sl_comm_free(comm);
    return status;
}
