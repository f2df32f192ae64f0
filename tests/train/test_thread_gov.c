/* The trainer's thread governor (Note [Threads on a shared machine], src/train/threads.c).
 * 1. Its decisions on synthetic step times: on a "busy" machine where 1 thread is faster than 2 it moves
 *    to 1 thread within a few probes and stays; on a quiet one it stays at 2 and its probes become rare
 *    (interval doubling): at most 8 probes, i.e. 16 slower steps, in 300; when the neighbour leaves it
 *    comes back to 2 threads. With the machine's load known, a lost probe of 2 threads is not repeated while
 *    the load stays, and 2 threads come back as soon as it falls.
 * 2. Value neutrality: ten training steps of a GPT-2 with dropout whose thread count changes every step
 *    (1, 2, 1, ...) give bitwise the weights of ten steps at a fixed 2 threads. */
#include <string.h>

#include "suanli/nn.h"
#include "suanli/train.h"
#include "testutil.h"

/* step seconds of a machine where n threads take t[n] */
static int run_gov(sl_thread_gov *g, int steps, const double t[3], int *probe_steps) {
    int slow = 0;
    for (int i = 0; i < steps; i++) {
        int n = sl_thread_gov_begin(g);
        slow += n != g->cur;
        sl_thread_gov_end(g, t[n]);
    }
    if (probe_steps) *probe_steps = slow;
    return g->cur;
}

/* the machine's load as the governor samples it (tests set it; the real sampler reads /proc) */
static int fake_ext;
static int fake_sample(void) { return fake_ext; }
static void no_signal(sl_thread_gov *g) { g->ncpu = 0; }
static void fake_signal(sl_thread_gov *g) {
    g->ncpu = 2;
    g->sample = fake_sample;
}

/* With the load known (one neighbour on a 2-CPU machine), a probe of 2 threads that lost is not repeated
 * while the neighbour stays: over 300 busy steps only the first probes run, where the governor without
 * the signal keeps probing (at doubling intervals); when the neighbour leaves, 2 threads come back within
 * 5 steps. A niced neighbour that leaves our cores alone (2 threads stay faster) costs one probe. */
static void test_load_signal(void) {
    sl_thread_gov g;
    const double busy[3] = {0, 0.060, 0.150}, quiet[3] = {0, 0.058, 0.044};
    int blind_steps, seen_steps;
    sl_thread_gov_init(&g, 2);
    no_signal(&g);
    run_gov(&g, 300, busy, &blind_steps);
    int64_t blind_probes = g.probes;
    sl_thread_gov_init(&g, 2);
    fake_signal(&g);
    fake_ext = 1;
    int cur = run_gov(&g, 300, busy, &seen_steps);
    printf("busy 300 steps: %lld probes (%d steps at the other count) blind, %lld (%d) with the load, %lld "
           "held back\n",
           (long long)blind_probes, blind_steps, (long long)g.probes, seen_steps, (long long)g.gated);
    TU_CHECK(cur == 1 && g.probes <= 1 && seen_steps <= 2 && g.gated > 200,
             "busy with the load: at %d threads, %lld probes, %d probe steps, %lld held back", cur,
             (long long)g.probes, seen_steps, (long long)g.gated);
    TU_CHECK(blind_probes > g.probes && blind_steps > seen_steps,
             "the load signal saves nothing: %lld vs %lld probes", (long long)blind_probes,
             (long long)g.probes);
    fake_ext = 0; /* the neighbour left */
    int64_t at = g.steps;
    while (g.cur == 1 && g.steps < at + 20) run_gov(&g, 1, quiet, NULL);
    /* 3 samples without the neighbour, then a 2-step probe */
    TU_CHECK(g.cur == 2 && g.steps <= at + 5, "neighbour left: at %d threads after %lld steps", g.cur,
             (long long)(g.steps - at));
    sl_thread_gov_init(&g, 2); /* a niced neighbour: 2 threads stay faster */
    fake_signal(&g);
    fake_ext = 1;
    cur = run_gov(&g, 300, quiet, &seen_steps);
    TU_CHECK(cur == 2 && g.switches == 0 && g.probes <= 8 && seen_steps <= 16,
             "niced neighbour: at %d threads, %lld switches, %lld probes (%d steps)", cur,
             (long long)g.switches, (long long)g.probes, seen_steps);
    sl_threads_set(2);
}

static void test_decisions(void) {
    sl_thread_gov g;
    setenv("SUANLI_ADAPTIVE_THREADS", "1", 1);
    sl_thread_gov_init(&g, 2);
    no_signal(&g); /* probes only: the decisions must not depend on this machine's load */
    const double busy[3] = {0, 0.060, 0.150}, quiet[3] = {0, 0.058, 0.044};
    int cur = run_gov(&g, 30, busy, NULL);
    TU_CHECK(cur == 1 && g.switches == 1, "busy: at %d threads after 30 steps, %lld switches", cur,
             (long long)g.switches);
    cur = run_gov(&g, 200, busy, NULL);
    TU_CHECK(cur == 1 && g.switches == 1, "busy: left 1 thread (%d, %lld switches)", cur,
             (long long)g.switches);
    cur = run_gov(&g, 300, quiet, NULL); /* the neighbour left: the next probe (<= 128 steps) moves back */
    TU_CHECK(cur == 2, "quiet again: still at %d threads", cur);
    sl_thread_gov_init(&g, 2);
    no_signal(&g);
    int probe_steps;
    cur = run_gov(&g, 300, quiet, &probe_steps);
    TU_CHECK(cur == 2 && g.switches == 0, "quiet: at %d threads, %lld switches", cur, (long long)g.switches);
    TU_CHECK(g.probes <= 8 && probe_steps <= 16, "quiet: %lld probes, %d slower steps in 300",
             (long long)g.probes, probe_steps);
    printf("quiet: %lld probes (%d steps at 1 thread) in 300 steps\n", (long long)g.probes, probe_steps);
    setenv("SUANLI_ADAPTIVE_THREADS", "0", 1);
    sl_thread_gov_init(&g, 2);
    TU_CHECK(run_gov(&g, 50, busy, NULL) == 2 && g.probes == 0, "SUANLI_ADAPTIVE_THREADS=0 adapted");
    unsetenv("SUANLI_ADAPTIVE_THREADS");
    sl_threads_set(2);
}

static sl_status batch(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    (void)u;
    tu_synth_tokens(6, 32, 96, step, micro, ids, tg);
    return SL_OK;
}

static float *train(int alternate) {
    sl_gpt2_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 96, .max_seq_len = 32};
    sl_model *m;
    TU_CHECK(sl_gpt2_new(&cfg, &m) == SL_OK, "model: %s", sl_errmsg());
    sl_model_init_weights(m, 3);
    m->attention_dropout = 0.1f;
    m->hidden_dropout = 0.1f;
    sl_threads_set(2);
    sl_trainer tr;
    sl_trainer_config tc = {
        .B = 6, .T = 32, .accum = 2, .lr = 1e-3f, .clip = 1.0f, .decay_iters = 10, .dropout_seed = 17};
    TU_CHECK(sl_trainer_init(&tr, m, &tc) == SL_OK, "trainer: %s", sl_errmsg());
    tr.gov.on = 0; /* the test sets the count itself */
    for (int s = 0; s < 10; s++) {
        if (alternate) sl_threads_set(1 + s % 2);
        sl_step_stats ss;
        TU_CHECK(sl_trainer_step(&tr, s, batch, NULL, &ss) == SL_OK, "step: %s", sl_errmsg());
    }
    float *w = malloc(sizeof(float) * (size_t)m->numel);
    memcpy(w, m->params_mem, sizeof(float) * (size_t)m->numel);
    int64_t n = m->numel;
    sl_trainer_free(&tr);
    sl_model_free(m);
    sl_threads_set(2);
    float *r = malloc(sizeof(float) * (size_t)(n + 1));
    r[0] = (float)n;
    memcpy(r + 1, w, sizeof(float) * (size_t)n);
    free(w);
    return r;
}

/* The shared mode (Note [Binding on a shared machine]) follows the load: on while a neighbour oversubscribes
 * the machine at the step's count, off once the load is gone (all of the last 3 samples) or at 1 thread;
 * a fixed count (on = 0) still gets it. */
static void test_shared_mode(void) {
    sl_thread_gov g;
    const double t[3] = {0, 0.060, 0.050};
    sl_thread_gov_init(&g, 2);
    fake_signal(&g);
    fake_ext = 1;
    int n = sl_thread_gov_begin(&g);
    TU_CHECK(n == 2 && g.shared == 1 && sl_threads_shared() == 1, "busy at %d threads: shared %d, flag %d", n,
             g.shared, sl_threads_shared());
    sl_thread_gov_end(&g, t[n]);
    fake_ext = 0;
    for (int i = 0; i < 3; i++) sl_thread_gov_end(&g, t[sl_thread_gov_begin(&g)]);
    TU_CHECK(g.shared == 0 && sl_threads_shared() == 0, "quiet again: shared %d, flag %d", g.shared,
             sl_threads_shared());
    sl_thread_gov_init(&g, 2);
    fake_signal(&g);
    g.on = 0;
    fake_ext = 1;
    n = sl_thread_gov_begin(&g);
    TU_CHECK(n == 2 && g.shared == 1 && g.shared_steps == 1, "fixed count, busy: shared %d after %lld steps",
             g.shared, (long long)g.shared_steps);
    fake_ext = 5; /* at 1 thread the mode is off whatever the load */
    g.cur = 1;
    sl_thread_gov_begin(&g);
    TU_CHECK(g.shared == 0 && sl_threads_shared() == 0, "1 thread: shared %d", g.shared);
    sl_threads_shared_mode(2, 0);
    sl_threads_set(2);
}

int main(void) {
    test_decisions();
    test_load_signal();
    test_shared_mode();
    float *a = train(0), *b = train(1);
    TU_CHECK(a[0] == b[0] && !memcmp(a, b, sizeof(float) * (size_t)(a[0] + 1)),
             "weights after steps on 1/2 alternating threads differ from 2 threads");
    free(a), free(b);
    return tu_finish("test_thread_gov");
}
