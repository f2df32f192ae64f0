/* suanli/train.h — one training step over a model: micro-batches with gradient accumulation, global
 * grad-norm clipping, LR schedule, AdamW; and evaluation with the same graph's forward part.
 *
 * Usage:
 *   sl_trainer tr;
 *   sl_trainer_init(&tr, model, &(sl_trainer_config){.B = 4, .T = 64, .accum = 2, .lr = 1e-3, ...});
 *   for (step = 0; step < iters; step++) sl_trainer_step(&tr, step, my_batch_fn, user, &stats);
 *   sl_trainer_eval(&tr, my_val_batch_fn, user, 20, &val_loss);
 *   sl_trainer_free(&tr);
 */
#ifndef SUANLI_TRAIN_H
#define SUANLI_TRAIN_H

#include "suanli/device.h"
#include "suanli/nn.h"
#include "suanli/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sl_trainer_config {
    int B, T, accum;        /* micro-batch size, sequence length, micro-batches per step (per rank) */
    int dp_size;            /* data-parallel ranks (0 or 1: single process); the loss seed is 1/(accum*dp) */
    float lr, min_lr, clip; /* clip <= 0: no clipping */
    int64_t warmup, decay_iters;
    sl_adamw_hparams hp;
} sl_trainer_config;

typedef struct sl_step_stats {
    float loss, grad_norm, lr; /* loss: mean over every micro-batch of every dp rank */
    double seconds;
    double comm_wait_sec; /* time spent waiting for gradient reduction after backward (DP) */
} sl_step_stats;

typedef struct sl_dp sl_dp;

/* Fill one micro-batch: ids and targets are (B, T) int32. `micro` is the global micro-batch index of the
 * step (dp_rank * accum + local micro), so a DP run sees exactly the single-process batches. */
typedef sl_status (*sl_batch_fn)(void *user, int64_t step, int micro, int32_t *ids, int32_t *targets);

typedef struct sl_trainer {
    sl_trainer_config cfg;
    sl_model *model; /* borrowed */
    sl_graph *graph; /* forward + backward (owned) */
    sl_tensor *ids, *targets, *loss, *logits;
    int32_t *ids_buf, *tg_buf; /* host staging of one micro-batch */
    sl_buffer *input_buf;      /* ids and targets on the model's backend (owned) */
    int n_forward;             /* nodes [0, n_forward) are the forward pass */
    sl_adamw opt;              /* single-process optimizer state (allocated at the first step) */
    sl_dp *dp;                 /* borrowed; when set, gradients are reduced and the update is done by dp */
    int opt_ready;
    void (*pre_update)(void *user); /* optional: called right before the optimizer modifies the state */
    void *pre_update_user;
    int64_t opt_t; /* optimizer steps taken (both paths) */
    sl_plan_stats plan;
} sl_trainer;

sl_status sl_trainer_init(sl_trainer *tr, sl_model *m, const sl_trainer_config *cfg);
void sl_trainer_free(sl_trainer *tr);
/* Forward+backward over cfg.accum micro-batches (gradients accumulate with loss scale 1/accum),
 * clip, schedule, AdamW. stats->loss is the mean micro-batch loss before the update. */
sl_status sl_trainer_step(sl_trainer *tr, int64_t step, sl_batch_fn fn, void *user, sl_step_stats *stats);
/* Forward and backward of one micro-batch only (no update), gradients accumulate into the model. */
sl_status sl_trainer_forward_backward(sl_trainer *tr, const int32_t *ids, const int32_t *targets,
                                      float *loss);
/* Mean loss over `iters` micro-batches drawn with fn(user, i, 0, ...), forward only. */
sl_status sl_trainer_eval(sl_trainer *tr, sl_batch_fn fn, void *user, int iters, float *loss);

#ifdef __cplusplus
}
#endif
#endif
