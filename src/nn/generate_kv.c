/* Generation over any architecture: the prompt is prefilled in one graph and one token per step is decoded
 * through a second graph that shares the KV cache (positions are a run-time parameter). GPT-2 asked for more
 * tokens than its learned positions decodes through the cache in windows (Note [GPT-2 past its positions]).
 * Stop tokens end generation. */
#include <string.h>

#include "suanli/device.h"
#include "suanli/nn.h"

typedef struct {
    const int32_t *stop;
    int n_stop, hit, count;
    int32_t *out;
    sl_token_cb cb;
    void *user;
} wrap;

/* returns 1 when generation must stop */
static int on_token(wrap *w, int32_t t) {
    if (w->out) w->out[w->count] = t;
    w->count++;
    int stop = w->cb ? w->cb(w->user, t) : 0;
    for (int i = 0; i < w->n_stop; i++)
        if (w->stop[i] == t) w->hit = stop = 1;
    return stop;
}

/* Note [GPT-2 past its positions]
 * GPT-2 has W = max_seq_len learned positions, added to the token embeddings at the input, so a cached key
 * is only valid at the position it was computed for. The cache-free path of generate.c (sl_gpt2_generate)
 * recomputes the whole last-W window for every token (W times a decode step's work, at W = 128 the demo's
 * 400-token sample ran at 125-167 tokens/s for a 1.85M-parameter model). Here the cache is filled as for a
 * short generation; when it is full, the last W/2 tokens are prefilled again at positions 0..W/2-1 in one
 * batched forward and decoding continues through the cache. Every token then sees between W/2 and W
 * tokens of context (the sliding window sees exactly W): identical tokens while prompt + generated fit in
 * W, different ones after the first refill, at a cost of one decode step plus 2/W of a W/2-token prefill
 * per token. sl_gpt2_generate remains the exact sliding window (test_kv_decode compares the two). */
static sl_status gpt2_windowed(sl_model *m, const int32_t *prompt, int n_prompt, int max_new,
                               const sl_sample_opts *o, wrap *w, sl_gen_stats *stats) {
    int W = m->cfg.max_seq_len, V = m->cfg.vocab_size, keep = W / 2 > 0 ? W / 2 : 1;
    int len = n_prompt < W ? n_prompt : W, mark = sl_ctx_mark(m->ctx);
    sl_kv_cache kv;
    SL_TRY(sl_kv_cache_new(m, 1, W, &kv)); /* positions for 3 graphs: len + 1 + keep <= 2W + 2 */
    kv.last_only = 1;
    sl_status st = SL_OK;
    int64_t n = n_prompt;
    int32_t *seq = malloc(sizeof(int32_t) * ((size_t)n_prompt + (size_t)max_new));
    float *row = malloc(sizeof(float) * (size_t)V);
    sl_buffer *ids_buf = NULL; /* W window ids, then the decode id */
    sl_graph *gp = sl_graph_new(m->ctx), *gr = sl_graph_new(m->ctx), *gd = sl_graph_new(m->ctx);
    if (!seq || !row || !gp || !gr || !gd) {
        st = sl_fail(SL_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)n_prompt);
    size_t wbytes = sizeof(int32_t) * (size_t)W;
    SL_CHECK(sl_backend_alloc(m->backend, wbytes + sizeof(int32_t), &ids_buf));
    sl_tensor *ip = sl_new_tensor_2d(m->ctx, SL_I32, 1, len), *ir = sl_new_tensor_2d(m->ctx, SL_I32, 1, keep),
              *id = sl_new_tensor_2d(m->ctx, SL_I32, 1, 1);
    sl_tensor_bind_buffer(ip, ids_buf, 0);
    sl_tensor_bind_buffer(ir, ids_buf, 0);
    sl_tensor_bind_buffer(id, ids_buf, wbytes);
    sl_tensor *lp = sl_model_build_kv(m, ip, &kv, 0), *lr = sl_model_build_kv(m, ir, &kv, 0);
    sl_tensor *ld = sl_model_build_kv(m, id, &kv, len < W ? len : W - 1); /* its position is set per step */
    sl_graph_build_forward(gp, lp);
    sl_graph_build_forward(gr, lr);
    sl_graph_build_forward(gd, ld);
    SL_CHECK(sl_graph_plan(gp, m->backend, NULL));
    SL_CHECK(sl_graph_plan(gr, m->backend, NULL));
    SL_CHECK(sl_graph_plan(gd, m->backend, NULL));
    double t0 = sl_time_sec();
    SL_CHECK(sl_backend_copy_in(ids_buf, 0, seq + n - len, sizeof(int32_t) * (size_t)len));
    SL_CHECK(sl_graph_compute(gp, NULL, NULL));
    SL_CHECK(sl_tensor_copy_out(lp, row)); /* the last position's logits (last_only) */
    int32_t t = sl_sample_logits(row, V, o, (uint64_t)n);
    stats->prompt_seconds = sl_time_sec() - t0;
    t0 = sl_time_sec();
    int pos = len; /* where t, the newest token, goes in the cache */
    seq[n++] = t;
    int stop = on_token(w, t);
    for (int s = 1; s < max_new && !stop; s++) {
        if (pos == W) { /* full: the last keep tokens again, at positions 0..keep-1 */
            SL_CHECK(sl_backend_copy_in(ids_buf, 0, seq + n - keep, sizeof(int32_t) * (size_t)keep));
            SL_CHECK(sl_graph_compute(gr, NULL, NULL));
            SL_CHECK(sl_tensor_copy_out(lr, row));
            pos = keep;
        } else {
            int32_t cur = t;
            SL_CHECK(sl_backend_copy_in(ids_buf, wbytes, &cur, sizeof cur));
            SL_CHECK(sl_kv_graph_set_pos(gd, pos));
            SL_CHECK(sl_graph_compute(gd, NULL, NULL));
            SL_CHECK(sl_tensor_copy_out(ld, row));
            pos++;
        }
        t = sl_sample_logits(row, V, o, (uint64_t)n);
        seq[n++] = t;
        stop = on_token(w, t);
    }
    stats->gen_seconds = sl_time_sec() - t0;
done:
    sl_graph_free(gp);
    sl_graph_free(gr);
    sl_graph_free(gd);
    sl_backend_free(m->backend, ids_buf);
    free(seq);
    free(row);
    sl_kv_cache_free(&kv);
    sl_ctx_reset(m->ctx, mark);
    return st;
}

sl_status sl_model_generate(sl_model *m, const int32_t *prompt, int n_prompt, int max_new,
                            const sl_sample_opts *o, const int32_t *stop, int n_stop, sl_token_cb cb,
                            void *user, int32_t *out_tokens, sl_gen_stats *stats) {
    wrap w = {stop, n_stop, 0, 0, out_tokens, cb, user};
    sl_gen_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    stats->n_prompt = n_prompt;
    int V = m->cfg.vocab_size;
    if (n_prompt < 1) return sl_fail(SL_ERR_INVALID, "generate: empty prompt");
    if (max_new < 0) return sl_fail(SL_ERR_INVALID, "generate: max_new must be >= 0");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return sl_fail(SL_ERR_INVALID, "generate: prompt token %d out of vocab (%d)", prompt[i], V);
    if (max_new == 0) return SL_OK;
    int max_pos = m->arch == SL_ARCH_GPT2 ? m->cfg.max_seq_len : m->lcfg.max_seq_len;
    /* the positions taken: the prompt's and every generated token's but the last, which is never fed back */
    int64_t S = (int64_t)n_prompt + max_new - 1;
    if (m->arch == SL_ARCH_GPT2 && S > max_pos) {
        /* beyond GPT-2's learned positions: windows through the cache */
        sl_status st = gpt2_windowed(m, prompt, n_prompt, max_new, o, &w, stats);
        stats->n_generated = w.count;
        stats->stopped_by_eos = w.hit;
        return st;
    }
    if (S > max_pos)
        return sl_fail(
            SL_ERR_INVALID,
            "generate: prompt (%d tokens) + max-new-tokens (%d) - 1 exceeds the model's %d positions",
            n_prompt, max_new, max_pos);
    /* Note [Generation graphs are temporary]
     * The cache leaves and both graphs' nodes are built in the model's ctx, after a mark; they are dropped
     * (sl_ctx_reset) when the call returns, together with the graphs, their arenas and the cache memory,
     * so generate can be called any number of times on one model (tests/e2e/test_generate_loop.c). */
    int mark = sl_ctx_mark(m->ctx);
    sl_kv_cache kv;
    SL_TRY(sl_kv_cache_new(m, 1, (int)S, &kv));
    kv.last_only = 1; /* only the prompt's last row is sampled: the head runs on one row */
    sl_status st = SL_OK;
    int32_t cur = 0;
    float *row = malloc(sizeof(float) * (size_t)V);
    sl_buffer *ids_buf = NULL; /* prompt ids, then the decode id, on the model's backend */
    sl_graph *gp = sl_graph_new(m->ctx), *gd = sl_graph_new(m->ctx);
    if (!row || !gp || !gd) {
        st = sl_fail(SL_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    size_t pbytes = sizeof(int32_t) * (size_t)n_prompt;
    SL_CHECK(sl_backend_alloc(m->backend, pbytes + sizeof(int32_t), &ids_buf));
    SL_CHECK(sl_backend_copy_in(ids_buf, 0, prompt, pbytes));
    sl_tensor *ids_p = sl_set_name(sl_new_tensor_2d(m->ctx, SL_I32, 1, n_prompt), "prompt_ids");
    sl_tensor *ids_d = sl_set_name(sl_new_tensor_2d(m->ctx, SL_I32, 1, 1), "decode_id");
    sl_tensor_bind_buffer(ids_p, ids_buf, 0);
    sl_tensor_bind_buffer(ids_d, ids_buf, pbytes);
    sl_tensor *lp = sl_model_build_kv(m, ids_p, &kv, 0);
    /* its position is set per step; built at one inside the cache (S == n_prompt: no decode step runs) */
    sl_tensor *ld = sl_model_build_kv(m, ids_d, &kv, n_prompt < S ? n_prompt : (int)S - 1);
    sl_graph_build_forward(gp, lp);
    sl_graph_build_forward(gd, ld);
    SL_CHECK(sl_graph_plan(gp, m->backend, NULL));
    SL_CHECK(sl_graph_plan(gd, m->backend, NULL));
    double t0 = sl_time_sec();
    SL_CHECK(sl_graph_compute(gp, NULL, NULL));
    SL_CHECK(sl_tensor_copy_out(lp, row)); /* (1, 1, V) */
    int32_t t = sl_sample_logits(row, V, o, (uint64_t)n_prompt);
    stats->prompt_seconds = sl_time_sec() - t0;
    t0 = sl_time_sec();
    int done_ = on_token(&w, t);
    for (int s = 1; s < max_new && !done_; s++) {
        int pos = n_prompt + s - 1;
        cur = t;
        SL_CHECK(sl_backend_copy_in(ids_buf, pbytes, &cur, sizeof cur));
        SL_CHECK(sl_kv_graph_set_pos(gd, pos));
        SL_CHECK(sl_graph_compute(gd, NULL, NULL));
        SL_CHECK(sl_tensor_copy_out(ld, row));
        t = sl_sample_logits(row, V, o, (uint64_t)(pos + 1));
        done_ = on_token(&w, t);
    }
    stats->gen_seconds = sl_time_sec() - t0;
done:
    stats->n_generated = w.count;
    stats->stopped_by_eos = w.hit;
    sl_graph_free(gp);
    sl_graph_free(gd);
    sl_backend_free(m->backend, ids_buf);
    free(row);
    sl_kv_cache_free(&kv);
    sl_ctx_reset(m->ctx, mark);
    return st;
}

/* Note [Generation probe]
 * Whether a backend runs a model's generation depends on the ops its graphs hold, which the architecture,
 * the head shapes and the compute dtype decide (an accelerator may run the f32 graphs but not the
 * half-numerics RoPE of f16 compute), not on the model's width, depth or vocabulary. The probe builds the
 * prefill and decode graphs of a model with the same family, head size, heads per kv head, experts and
 * compute dtype but 16-wide layers, a 16-token vocabulary and the dense layers only as many as come
 * before the first sparse one, on the backend, and asks supports_op of every node: generate refuses a
 * pair that cannot run before it loads anything. */
sl_status sl_model_generate_probe(const sl_llama_config *c, sl_dtype wdtype, sl_dtype compute,
                                  sl_backend *be) {
    sl_model *m = NULL;
    sl_status st;
    if (c->arch == SL_ARCH_GPT2) {
        int hs = c->n_head > 0 ? c->hidden / c->n_head : 1;
        sl_gpt2_config g = {1, 1, hs > 0 ? hs : 1, 16, 4};
        st = sl_gpt2_new_on(&g, be, &m);
    } else {
        sl_llama_config t = *c;
        t.n_layer = c->first_dense + 1 < c->n_layer ? c->first_dense + 1 : c->n_layer;
        t.n_head = c->n_kv_head > 0 ? c->n_head / c->n_kv_head : 1;
        t.n_kv_head = 1;
        t.hidden = t.intermediate = t.vocab_size = 16;
        t.max_seq_len = 4;
        if (t.moe_intermediate) t.moe_intermediate = 16;
        if (t.shared_intermediate) t.shared_intermediate = 16;
        st = sl_llama_new_on(&t, wdtype, be, &m);
    }
    if (st != SL_OK) return st;
    m->compute_dtype = compute;
    int mark = sl_ctx_mark(m->ctx);
    sl_kv_cache kv;
    st = sl_kv_cache_new(m, 1, 4, &kv);
    if (st != SL_OK) {
        sl_model_free(m);
        return st;
    }
    kv.last_only = 1;
    sl_graph *g[2] = {sl_graph_new(m->ctx), sl_graph_new(m->ctx)};
    if (!g[0] || !g[1]) st = sl_fail(SL_ERR_NOMEM, "generate: out of memory");
    for (int k = 0; k < 2 && st == SL_OK; k++) {
        sl_tensor *ids = sl_new_tensor_2d(m->ctx, SL_I32, 1, k ? 1 : 2);
        sl_graph_build_forward(g[k], sl_model_build_kv(m, ids, &kv, k ? 2 : 0));
        for (int i = 0; i < sl_graph_n_nodes(g[k]) && st == SL_OK; i++) {
            sl_tensor *n = sl_graph_node(g[k], i);
            if (n->op != SL_OP_VIEW && n->op != SL_OP_COLLECTIVE && !sl_graph_can_run(be, n))
                st = sl_fail(SL_ERR_UNSUPPORTED, "backend %s cannot run op %s (%s) of %s compute", be->name,
                             sl_op_name(n->op), sl_dtype_name(n->dtype), sl_dtype_name(compute));
        }
    }
    sl_graph_free(g[0]);
    sl_graph_free(g[1]);
    sl_kv_cache_free(&kv);
    sl_ctx_reset(m->ctx, mark);
    sl_model_free(m);
    return st;
}
