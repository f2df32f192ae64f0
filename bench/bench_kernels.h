/* bench_kernels.h — `suanli bench kernels`: the non-GEMM CPU kernels (GELU, bias/residual add, acc,
 * sum_to, LayerNorm, cross-entropy, embedding backward, attention, AdamW) on GPT-2 124M training
 * shapes: the SIMD kernel (sl_k_*) against its scalar reference (sl_k_*_ref), timed alternately in the
 * same run; medians, their ratio, and the achieved GB/s (memory-bound kernels) or GFLOP/s (attention). */
#ifndef SL_BENCH_KERNELS_H
#define SL_BENCH_KERNELS_H
/* argv[0] == "kernels". Flags: --json, --threads N (2), --reps R (median of R, default 5),
 * --micro-batch-size B (4), --seq-length T (64), --hidden-size C (768), --num-attention-heads NH (12),
 * --vocab-size V (50257). Returns an exit code (2 on bad flags). */
int sl_bench_kernels(int argc, char **argv);
#endif
