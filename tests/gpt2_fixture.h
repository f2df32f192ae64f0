/* Shared access to tests/fixtures/gpt2_parity.safetensors (scripts/gen_gpt2_parity.py). */
#ifndef SL_TESTS_GPT2_FIXTURE_H
#define SL_TESTS_GPT2_FIXTURE_H
#include <stdlib.h>

#include "suanli/safetensors.h"
#include "suanli/train.h"

static const sl_safetensors *g_st;
static inline int meta_i(const char *k) { return atoi(sl_safetensors_meta(g_st, k)); }
static inline float meta_f(const char *k) { return (float)atof(sl_safetensors_meta(g_st, k)); }

/* micro-batches from a (steps, accum, B, T+1) token tensor */
typedef struct {
    const int32_t *tok;
    int B, T, accum;
} feed;

static inline sl_status feed_fn(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    feed *f = u;
    const int32_t *base = f->tok + ((step * f->accum + micro) * f->B) * (int64_t)(f->T + 1);
    for (int b = 0; b < f->B; b++)
        for (int t = 0; t < f->T; t++) {
            ids[b * f->T + t] = base[b * (f->T + 1) + t];
            tg[b * f->T + t] = base[b * (f->T + 1) + t + 1];
        }
    return SL_OK;
}
#endif
