/* bench_ops.h — `suanli bench ops`: GEMM throughput on GPT-2 124M training shapes versus the machine's
 * measured FMA peak and the anchors OpenBLAS and oneDNN (loaded with dlopen when installed). */
#ifndef SL_BENCH_OPS_H
#define SL_BENCH_OPS_H
/* argv[0] == "ops". Flags: --json, --threads N (measure at 1 and N threads; default 2), --reps R (median of
 * R timed runs per point, default 3), --quick (BT = 256 only, 1 rep unless --reps, no bf16 rows), --device
 * NAME (fp32 cases as MATMUL nodes on backend NAME beside the cpu backend at N threads, same run: Note [bench
 * ops --device]). Returns an exit code. */
int sl_bench_ops(int argc, char **argv);
/* Measured fp32 FMA peak (FLOP/s) with nthr threads; used by bench train for MFU. */
double sl_bench_fma_peak(int nthr);
/* measured GFLOP/s of vdpbf16ps chains on nthr threads (AVX512_BF16), else the f32 FMA peak (the
 * emulated bf16 GEMM widens to f32) */
double sl_bench_bf16_peak(int nthr);
#endif
