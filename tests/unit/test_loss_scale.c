/* Dynamic loss scaling rules (Note [Dynamic loss scaling]): Megatron-LM's DynamicGradScaler.update traced by
 * hand for hysteresis 2, a floor and growth (which refills the hysteresis tracker), GradScaler's behaviour at
 * hysteresis 1, and the flag checks. Exact: every scale is a power of two. */
#include <math.h>
#include <string.h>

#include "suanli/optim.h"
#include "testutil.h"

static void trace(const char *what, sl_loss_scale_config c, const int *inf, const float *want, int n) {
    sl_loss_scaler s;
    TU_CHECK(sl_loss_scaler_init(&s, &c) == SL_OK, "%s: init: %s", what, sl_errmsg());
    int skipped = 0;
    for (int i = 0; i < n; i++) {
        sl_loss_scaler_update(&s, inf[i]);
        skipped += inf[i];
        TU_CHECK(s.scale == want[i], "%s: after update %d (inf %d): scale %g, want %g", what, i, inf[i],
                 (double)s.scale, (double)want[i]);
    }
    TU_CHECK(s.skipped == skipped, "%s: %lld skipped, want %d", what, (long long)s.skipped, skipped);
}

int main(void) {
    /* Megatron: initial 1024, min 64, window 3, hysteresis 2 */
    const int inf[] = {1, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 1};
    const float want[] = {1024, 512, 256, 256, 256, 512, 512, 512, 256, 128, 64, 64};
    trace("hysteresis 2", (sl_loss_scale_config){1024, 64, 3, 2}, inf, want, 12);
    /* hysteresis 1 = torch.amp.GradScaler (backoff 0.5 on every inf step, growth 2 after `window` good steps;
     * an inf step restarts the count) */
    const int inf1[] = {1, 0, 0, 1, 0, 0, 0, 0, 1};
    const float want1[] = {512, 512, 512, 256, 256, 256, 512, 512, 256};
    trace("hysteresis 1", (sl_loss_scale_config){1024, 1, 3, 1}, inf1, want1, 9);
    /* growth never overflows f32 to inf */
    const int ok[] = {0, 0};
    const float big[] = {ldexpf(1.0f, 127), ldexpf(1.0f, 127)};
    trace("no inf scale", (sl_loss_scale_config){ldexpf(1.0f, 126), 1, 1, 1}, ok, big, 2);
    /* found-inf from the norm */
    TU_CHECK(sl_grad_found_inf(INFINITY) && sl_grad_found_inf(NAN) && !sl_grad_found_inf(3.0f), "found inf");
    /* bad settings name the flag */
    const struct {
        sl_loss_scale_config c;
        const char *flag;
    } bad[] = {{{0, 1, 10, 1}, "--initial-loss-scale"},
               {{-2, 1, 10, 1}, "--initial-loss-scale"},
               {{INFINITY, 1, 10, 1}, "--initial-loss-scale"},
               {{4, 0, 10, 1}, "--min-loss-scale"},
               {{4, 8, 10, 1}, "--min-loss-scale"},
               {{4, 1, 0, 1}, "--loss-scale-window"},
               {{4, 1, 10, 0}, "--hysteresis"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sl_loss_scaler s;
        TU_CHECK(sl_loss_scaler_init(&s, &bad[i].c) == SL_ERR_INVALID && strstr(sl_errmsg(), bad[i].flag),
                 "bad setting %zu: %s", i, sl_errmsg());
    }
    return tu_finish("test_loss_scale");
}
