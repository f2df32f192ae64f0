/* The text sample printed at the end of a run (and by `suanli generate` for saved weights). */
#include <string.h>

#include "train/train_internal.h"

typedef struct {
    const sl_tokenizer *tok;
    FILE *out;
} sample_sink;

static int print_token_cb(void *user, int32_t t) {
    const sample_sink *s = user;
    char buf[256];
    int n = sl_tokenizer_decode_token(s->tok, t, buf, sizeof buf);
    if (s->out) {
        if (n > 0) fwrite(buf, 1, (size_t)n, s->out);
        fflush(s->out);
    }
    return 0;
}

sl_status sl_train_sample_print(sl_model *m, const sl_tokenizer *tok, const char *prompt, int n_tokens,
                                float temperature, int top_k, uint64_t seed, FILE *out, double *seconds) {
    int32_t *ids = NULL;
    int64_t n = 0;
    if (sl_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n) != SL_OK || n == 0) {
        free(ids);
        return sl_train_bad("cannot encode the prompt: %s", sl_errmsg());
    }
    if (out) fwrite(prompt, 1, strlen(prompt), out);
    sl_sample_opts so = {temperature, top_k, 1.0f, seed};
    sample_sink sink = {tok, out};
    double t0 = sl_time_sec();
    sl_status st =
        sl_model_generate(m, ids, (int)n, n_tokens, &so, NULL, 0, print_token_cb, &sink, NULL, NULL);
    double dt = sl_time_sec() - t0;
    free(ids);
    if (out) fprintf(out, "\n");
    if (seconds) *seconds = dt;
    if (st != SL_OK) return sl_train_fail(st, "generate: %s", sl_errmsg());
    return SL_OK;
}
