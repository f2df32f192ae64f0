/* Sampling and autoregressive generation. */
#include <math.h>
#include <string.h>

#include "suanli/device.h"
#include "suanli/nn.h"

typedef struct {
    double v; /* logit / temperature: a float overflowed to inf for a tiny temperature (inf - inf = nan) */
    int32_t i;
} cand;

static int cmp_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return x->i - y->i;
}

int32_t sl_sample_logits(const float *logits, int V, const sl_sample_opts *o, uint64_t counter) {
    int32_t best = 0;
    for (int j = 1; j < V; j++)
        if (logits[j] > logits[best]) best = j;
    if (o->temperature <= 0) return best;
    cand *c = malloc(sizeof(cand) * (size_t)V);
    if (!c) return best;
    for (int j = 0; j < V; j++) c[j] = (cand){(double)logits[j] / o->temperature, j};
    qsort(c, (size_t)V, sizeof *c, cmp_desc);
    int k = (o->top_k > 0 && o->top_k < V) ? o->top_k : V;
    double z = 0;
    for (int j = 0; j < k; j++) z += exp(c[j].v - c[0].v);
    if (o->top_p > 0 && o->top_p < 1) {
        double cum = 0;
        for (int j = 0; j < k; j++) {
            cum += exp(c[j].v - c[0].v) / z;
            if (cum >= o->top_p) {
                k = j + 1;
                break;
            }
        }
        z = 0;
        for (int j = 0; j < k; j++) z += exp(c[j].v - c[0].v);
    }
    double u = sl_rng_uniform(o->seed, 0x5a3f1e, counter) * z, acc = 0;
    int32_t pick = c[k - 1].i;
    for (int j = 0; j < k; j++) {
        acc += exp(c[j].v - c[0].v);
        if (u < acc) {
            pick = c[j].i;
            break;
        }
    }
    free(c);
    return pick;
}

sl_status sl_gpt2_generate(sl_model *m, const int32_t *prompt, int n_prompt, int max_new,
                           const sl_sample_opts *o, sl_token_cb cb, void *user) {
    int W = m->cfg.max_seq_len, V = m->cfg.vocab_size;
    if (n_prompt < 1) return sl_fail(SL_ERR_INVALID, "generate: empty prompt");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return sl_fail(SL_ERR_INVALID, "generate: prompt token %d out of vocab", prompt[i]);
    int mark = sl_ctx_mark(m->ctx); /* Note [Generation graphs are temporary] in generate_kv.c */
    int64_t cap = (int64_t)n_prompt + max_new;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)cap), *win = calloc((size_t)W, sizeof(int32_t));
    float *row = malloc(sizeof(float) * (size_t)V);
    sl_graph *g = sl_graph_new(m->ctx);
    sl_buffer *ids_buf = NULL;
    sl_status st = SL_OK;
    if (!seq || !win || !row || !g) {
        st = sl_fail(SL_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    SL_CHECK(sl_backend_alloc(m->backend, sizeof(int32_t) * (size_t)W, &ids_buf));
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)n_prompt);
    sl_tensor *ids = sl_new_tensor_2d(m->ctx, SL_I32, 1, W);
    sl_tensor_bind_buffer(ids, ids_buf, 0);
    sl_tensor *logits;
    sl_gpt2_build(m, ids, NULL, &logits);
    sl_graph_build_forward(g, logits);
    SL_CHECK(sl_graph_plan(g, m->backend, NULL));
    int64_t n = n_prompt;
    for (int s = 0; s < max_new; s++) {
        int64_t start = n > W ? n - W : 0, len = n - start;
        memcpy(win, seq + start, sizeof(int32_t) * (size_t)len);
        SL_CHECK(sl_backend_copy_in(ids_buf, 0, win, sizeof(int32_t) * (size_t)W));
        SL_CHECK(sl_graph_compute(g, NULL, NULL));
        SL_CHECK(sl_backend_copy_out(logits->buffer,
                                     logits->buffer_offs + sizeof(float) * (size_t)((len - 1) * V), row,
                                     sizeof(float) * (size_t)V));
        int32_t t = sl_sample_logits(row, V, o, (uint64_t)n);
        seq[n++] = t;
        if (cb && cb(user, t)) break;
    }
done:
    sl_graph_free(g);
    sl_backend_free(m->backend, ids_buf);
    sl_ctx_reset(m->ctx, mark); /* after every buffer of the call is freed */
    free(seq);
    free(win);
    free(row);
    return st;
}
