/* Dynamic loss scaling for fp16 training (issue 19): Note [Dynamic loss scaling]. */
#include <math.h>

#include "suanli/optim.h"

/* Note [Dynamic loss scaling]
 * fp16 gradients underflow below 2^-24 and overflow above 65504, so the loss seed is multiplied by a scale S
 * (the FILL node that starts the backward, suanli/graph.h) and the gradients are divided by S again before
 * anything reads them. The rules are Megatron-LM's DynamicGradScaler
 * (megatron/core/optimizer/grad_scaler.py), whose flags `suanli train` takes (--initial-loss-scale,
 * --loss-scale-window, --hysteresis,
 * --min-loss-scale), with its constants backoff 0.5 and growth 2:
 *   - a step is an overflow step when any gradient is inf or nan. It is skipped: no optimizer update, no
 *     AdamW step count (torch's optimizer.step() is not called either); the LR schedule still follows the
 *     iteration number, as the step index of sl_trainer_step is the iteration (Megatron instead holds its
 *     scheduler back on skipped iterations: a difference only in the LR of later steps).
 *   - overflow: growth_tracker = 0; hysteresis_tracker -= 1; if it is <= 0, S = max(S * 0.5, min_scale).
 *   - finite: growth_tracker += 1; when it reaches `window`: growth_tracker = 0, hysteresis_tracker =
 *     hysteresis, S *= 2. (The hysteresis tracker is refilled only when the scale grows, as in Megatron.)
 * torch.amp.GradScaler is the case hysteresis = 1 (every overflow backs off) with growth_interval = window
 * and no floor (min_scale below any scale the run reaches): the fixture of tests/e2e/test_fp16_train.c.
 * Unscaling: S is a power of two from a power-of-two start, so g / S is exact (barring f32 subnormals) and
 * the trainer folds it into the clipping factor of the fused update (sl_adamw_step_scaled): the
 * gradient norm is the scaled norm divided by S, the update multiplies by clip_coef(norm) / S. The found-inf
 * test is that norm: a sum of squares in double cannot overflow for finite f32 values, so it is inf or nan
 * exactly when some gradient is. Under data parallelism the norm is the all-reduced one (the sum of every
 * rank's squares under ZeRO-2/3; the norm of the all-reduced gradients, in which an inf or nan of any rank
 * survives the sum, under stages 0/1), so every rank sees the same flag and skips the same step. */

sl_status sl_loss_scaler_init(sl_loss_scaler *s, const sl_loss_scale_config *c) {
    if (!(c->initial > 0) || !isfinite(c->initial))
        return sl_fail(SL_ERR_INVALID, "--initial-loss-scale must be a positive finite number (got %g)",
                       (double)c->initial);
    if (!(c->min_scale > 0) || c->min_scale > c->initial)
        return sl_fail(SL_ERR_INVALID, "--min-loss-scale must be > 0 and <= --initial-loss-scale (got %g)",
                       (double)c->min_scale);
    if (c->window < 1) return sl_fail(SL_ERR_INVALID, "--loss-scale-window must be >= 1 (got %d)", c->window);
    if (c->hysteresis < 1)
        return sl_fail(SL_ERR_INVALID, "--hysteresis must be >= 1 (got %d)", c->hysteresis);
    s->cfg = *c;
    s->scale = c->initial;
    s->growth_tracker = 0;
    s->hysteresis_tracker = c->hysteresis;
    s->skipped = 0;
    return SL_OK;
}

void sl_loss_scaler_update(sl_loss_scaler *s, int found_inf) {
    if (found_inf) {
        s->skipped++;
        s->growth_tracker = 0;
        s->hysteresis_tracker--;
        if (s->hysteresis_tracker <= 0) {
            float b = s->scale * 0.5f;
            s->scale = b > s->cfg.min_scale ? b : s->cfg.min_scale;
        }
        return;
    }
    if (++s->growth_tracker == s->cfg.window) {
        s->growth_tracker = 0;
        s->hysteresis_tracker = s->cfg.hysteresis;
        float g = s->scale * 2.0f;
        if (isfinite(g)) s->scale = g; /* GradScaler keeps the scale when growing would overflow f32 */
    }
}

int sl_grad_found_inf(float scaled_norm) { return !isfinite(scaled_norm); }
