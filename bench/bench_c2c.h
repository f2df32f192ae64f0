/* bench_c2c.h — `suanli bench c2c`: the core-to-core round trip, two threads bouncing one cache line
 * between two CPUs of this process's affinity mask (Note [Micro-batch lanes]: on the 2-core VM the host
 * places the two vCPUs under one L3, ~60 ns, or apart, ~350 ns, and multi-threaded steps of small models
 * follow it). The bench scripts print it beside their timings so a reader can tell the placement. */
#ifndef SL_BENCH_C2C_H
#define SL_BENCH_C2C_H
/* argv[0] == "c2c". Flags: --json, --iters N (round trips per rep, 200000), --reps R (median, 3),
 * --cpus A,B (default: the first two CPUs of the affinity mask). Returns an exit code (2 on bad flags or
 * fewer than two CPUs). */
int sl_bench_c2c(int argc, char **argv);
#endif
