/* bench_train.h — what `suanli bench train` (bench_train.c) shares with the other training benches. */
#ifndef SL_BENCH_TRAIN_H
#define SL_BENCH_TRAIN_H
#include <stdint.h>

#include "suanli/train.h"

/* The benches' trainer: AdamW at fixed hyperparameters (lr 1e-4 -> 1e-5 over 1000 steps, no warmup, clip 1,
 * betas 0.9 / 0.95, weight decay 0.1), dropout seed 1; zb: the ZB-H1 pipeline schedule, else 1F1B; rc_kind /
 * rc_layers: recomputation; fp16: train's loss-scale defaults from init_scale (src/train/job.c: min scale
 * 1, window 1000, hysteresis 2). */
sl_trainer_config sl_bench_trainer_config(int64_t B, int64_t T, int64_t accum, sl_mesh *mesh, int zb,
                                          int rc_kind, int64_t rc_layers, int fp16, double init_scale);
#endif
