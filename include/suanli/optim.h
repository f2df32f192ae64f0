/* suanli/optim.h — AdamW, gradient-norm clipping and the LR schedule over a model's flat buffers. The
 * arithmetic is the model backend's (sl_backend_adamw / sumsq / scale), so the same code path serves
 * every device and the single-process and data-parallel runs alike (src/parallel calls the same state
 * operations on its shards).
 *
 * Usage:
 *   sl_adamw opt; sl_adamw_init(&opt, m, (sl_adamw_hparams){0.9f, 0.95f, 1e-8f, 0.1f});
 *   float norm; sl_grad_norm(m, &norm);
 *   sl_adamw_step_scaled(&opt, m, lr, sl_clip_coef(norm, 1.0f));
 *   sl_adamw_free(&opt);
 */
#ifndef SUANLI_OPTIM_H
#define SUANLI_OPTIM_H

#include "suanli/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- optimizer (its arithmetic runs on the model's backend: sl_backend_adamw / sumsq / scale) ---- */
typedef struct sl_adamw {
    sl_adamw_hparams hp;
    sl_buffer *m, *v; /* flat moments on the model's backend (owned) */
    int64_t numel;
    int64_t t;            /* steps taken */
    sl_adamw_span *spans; /* one per f32 parameter (owned) */
    int n_spans;
    sl_backend *backend; /* the model's (borrowed) */
} sl_adamw;

sl_status sl_adamw_init(sl_adamw *opt, const sl_model *m, sl_adamw_hparams hp);
void sl_adamw_free(sl_adamw *opt);
/* One AdamW step (PyTorch semantics: decoupled decay p *= 1 - lr*wd, bias-corrected moments). */
sl_status sl_adamw_step(sl_adamw *opt, sl_model *m, float lr);
/* The same step on gradients multiplied by gscale on the fly: bitwise equal to scaling the gradients first
 * (gradient clipping fused into the update: no separate pass over the gradients). */
sl_status sl_adamw_step_scaled(sl_adamw *opt, sl_model *m, float lr, float gscale);
/* Global L2 norm of the gradients (double sums in a fixed order: deterministic for any thread count). */
sl_status sl_grad_norm(const sl_model *m, float *norm);
/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0. */
float sl_clip_coef(float norm, float max_norm);
/* Global L2 norm of the gradients into *norm (before clipping); if max_norm > 0 and the norm exceeds it,
 * scale the gradients by max_norm / (norm + 1e-6) (torch.nn.utils.clip_grad_norm_). */
sl_status sl_clip_grad_norm(sl_model *m, float max_norm, float *norm);
/* ---- dynamic loss scaling (fp16): Megatron's rules, Note [Dynamic loss scaling] in loss_scale.c ---- */
typedef struct sl_loss_scale_config {
    float initial;   /* --initial-loss-scale (Megatron's default 2^32) */
    float min_scale; /* --min-loss-scale (1) */
    int window;      /* --loss-scale-window: finite steps before the scale doubles (1000) */
    int hysteresis;  /* --hysteresis: overflow steps (since the last growth) before it halves (2) */
} sl_loss_scale_config;
typedef struct sl_loss_scaler {
    sl_loss_scale_config cfg;
    float scale;
    int growth_tracker, hysteresis_tracker;
    int64_t skipped; /* overflow steps so far */
} sl_loss_scaler;
/* Validates c (one-line message naming the flag) and starts at c->initial. */
sl_status sl_loss_scaler_init(sl_loss_scaler *s, const sl_loss_scale_config *c);
/* After a step whose gradients were (found_inf = 1) or were not finite. */
void sl_loss_scaler_update(sl_loss_scaler *s, int found_inf);
/* 1 when the global norm of the scaled gradients says some gradient is inf or nan. */
int sl_grad_found_inf(float scaled_norm);
/* Linear warmup over `warmup` steps ((it+1)/warmup), then cosine from lr to min_lr at `decay_iters`. */
float sl_lr_schedule(int64_t it, float lr, float min_lr, int64_t warmup, int64_t decay_iters);

#ifdef __cplusplus
}
#endif
#endif
