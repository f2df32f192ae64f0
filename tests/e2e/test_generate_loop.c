/* sl_model_generate called many times in one process (a server's loop) must not grow memory:
 *   - the model's node arena (sl_ctx) holds exactly as many tensors after every call as before the first
 *     (Note [Generation graphs are temporary] in src/nn/generate_kv.c); before the fix it filled up and
 *     aborted after a few hundred calls;
 *   - RSS after call 1000 is within RSS_BOUND_KIB of RSS after call 10 (release build; skipped under ASan,
 *     whose quarantine keeps freed memory resident; LSan checks the same loop for leaks there);
 *   - every call generates the same greedy tokens.
 * Paths: the Llama KV-cache path (tests/fixtures/hf/llama, f32 and bf16) and GPT-2's KV-cache and
 * sliding-window paths (a tiny random GPT-2). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "suanli/model_io.h"
#include "suanli/nn.h"
#include "testutil.h"

#define RSS_BOUND_KIB 1024

#if defined(__SANITIZE_ADDRESS__)
#define SL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SL_TEST_ASAN 1
#endif
#endif
#ifndef SL_TEST_ASAN
#define SL_TEST_ASAN 0
#endif

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
    fclose(f);
    return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Runs `calls` generations of max_new greedy tokens; checks the ctx count and the tokens every call and,
 * when check_rss, RSS after call 10 vs after the last call. */
static void loop(const char *what, sl_model *m, int n_prompt, int max_new, int calls, int check_rss) {
    int32_t prompt[8] = {1, 5, 9, 3, 7, 2, 4, 6};
    int32_t first[64], out[64];
    sl_sample_opts so = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 1};
    const int n0 = sl_ctx_count(m->ctx);
    long rss10 = 0, rss_end = 0;
    int bad_ctx = 0, bad_tok = 0, bad_st = 0, n_first = 0;
    for (int c = 1; c <= calls; c++) {
        sl_gen_stats gs;
        if (sl_model_generate(m, prompt, n_prompt, max_new, &so, NULL, 0, NULL, NULL, out, &gs) != SL_OK) {
            if (!bad_st++) fprintf(stderr, "%s: call %d: %s\n", what, c, sl_errmsg());
            continue;
        }
        if (c == 1) {
            n_first = gs.n_generated;
            memcpy(first, out, sizeof(int32_t) * (size_t)n_first);
        } else if (gs.n_generated != n_first || memcmp(first, out, sizeof(int32_t) * (size_t)n_first)) {
            bad_tok++;
        }
        if (sl_ctx_count(m->ctx) != n0 && !bad_ctx++)
            fprintf(stderr, "%s: call %d: ctx holds %d tensors, %d before the first call\n", what, c,
                    sl_ctx_count(m->ctx), n0);
        if (c == 10) rss10 = rss_kib();
    }
    rss_end = rss_kib();
    TU_CHECK(bad_st == 0, "%s: %d of %d calls failed", what, bad_st, calls);
    TU_CHECK(n_first == max_new, "%s: %d tokens generated, asked for %d", what, n_first, max_new);
    TU_CHECK(bad_ctx == 0, "%s: the node arena grew across calls", what);
    TU_CHECK(bad_tok == 0, "%s: %d calls generated other tokens than the first", what, bad_tok);
    printf("%s: %d calls of %d+%d tokens: ctx %d tensors; RSS after call 10: %ld KiB, after call %d: %ld KiB "
           "(%+ld KiB)\n",
           what, calls, n_prompt, max_new, sl_ctx_count(m->ctx), rss10, calls, rss_end, rss_end - rss10);
    if (check_rss && !SL_TEST_ASAN)
        TU_CHECK(rss_end - rss10 <= RSS_BOUND_KIB,
                 "%s: RSS grew by %ld KiB from call 10 to call %d (bound %d)", what, rss_end - rss10, calls,
                 RSS_BOUND_KIB);
}

int main(void) {
    sl_threads_set(1);
    const char *dir = SL_SOURCE_DIR "/tests/fixtures/hf/llama";
    sl_model *m = NULL;
    if (sl_hf_load(dir, &m, NULL) == SL_OK) {
        loop("llama f32 kv", m, 4, 4, 1000, 1);
        sl_model_free(m);
    } else {
        TU_CHECK(0, "load %s: %s", dir, sl_errmsg());
    }
    if (sl_hf_load_ex(dir, SL_BF16, &m, NULL) == SL_OK) {
        loop("llama bf16 kv", m, 4, 4, 200, 0);
        sl_model_free(m);
    } else {
        TU_CHECK(0, "load %s (bf16): %s", dir, sl_errmsg());
    }
    sl_gpt2_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 64, .max_seq_len = 16};
    if (sl_gpt2_new(&cfg, &m) == SL_OK) {
        sl_model_init_weights(m, 7);
        loop("gpt2 kv", m, 4, 8, 300, 0);
        loop("gpt2 sliding window", m, 4, 16, 100, 0); /* 4 + 16 > 16 positions */
        sl_model_free(m);
    } else {
        TU_CHECK(0, "gpt2_new: %s", sl_errmsg());
    }
    return tu_finish("test_generate_loop");
}
