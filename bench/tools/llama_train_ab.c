/* Training steps of a Llama-family model (random weights, synthetic tokens) in fp32, in bf16 autocast on the
 * bf16 GEMM (Note [bf16 GEMMs under autocast], src/nn/llama.c) and in bf16 autocast on the fp32 GEMM over
 * rounded operands (SUANLI_FUSED_WEIGHT_CAST=0: the path before it), interleaved in one process; prints the
 * median ms/step and tokens/s of each, and one JSON line with --json. `suanli bench train` covers GPT-2 only.
 *   cc -O2 -fopenmp -Iinclude -Ibuild/include bench/tools/llama_train_ab.c -Lbuild -lsuanli \
 *      -Wl,-rpath,$PWD/build -lm -o /tmp/llama_ab
 *   OMP_NUM_THREADS=2 /tmp/llama_ab [L C I NH KV V B T STEPS ROUNDS] [--json]
 * Defaults: a 12-layer, 768-wide Llama (I 2048, 12 heads, 4 kv heads, V 32000: 134M parameters), B 4, T 64,
 * 4 timed steps after one warm-up, 3 rounds. Not part of the build. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/nn.h"
#include "suanli/train.h"

typedef struct {
    int V;
    int64_t n;
} synth;

static sl_status batch(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    synth *s = u;
    (void)step, (void)micro;
    for (int64_t i = 0; i < s->n; i++) {
        ids[i] = (int32_t)(sl_rng_u64(7, 0, (uint64_t)i) % (uint64_t)s->V);
        tg[i] = (int32_t)(sl_rng_u64(7, 1, (uint64_t)i) % (uint64_t)s->V);
    }
    return SL_OK;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* mode 0: fp32; 1: bf16 on the bf16 GEMM; 2: bf16 on the fp32 GEMM (rounded operands) */
static double run(const sl_llama_config *cfg, int mode, int B, int T, int steps, float *loss) {
    if (mode == 2) setenv("SUANLI_FUSED_WEIGHT_CAST", "0", 1);
    sl_model *m = NULL;
    if (sl_llama_new(cfg, &m) != SL_OK) {
        fprintf(stderr, "llama_train_ab: %s\n", sl_errmsg());
        exit(1);
    }
    sl_model_init_weights(m, 1);
    if (mode) m->autocast_bf16 = 1;
    sl_trainer tr;
    sl_trainer_config tc = {.B = B,
                            .T = T,
                            .accum = 1,
                            .lr = 1e-4f,
                            .min_lr = 1e-5f,
                            .clip = 1.0f,
                            .decay_iters = 1000,
                            .hp = {0.9f, 0.95f, 1e-8f, 0.1f}};
    if (sl_trainer_init(&tr, m, &tc) != SL_OK) {
        fprintf(stderr, "llama_train_ab: %s\n", sl_errmsg());
        exit(1);
    }
    unsetenv("SUANLI_FUSED_WEIGHT_CAST");
    synth s = {cfg->vocab_size, (int64_t)B * T};
    double ts[64];
    for (int i = 0; i <= steps; i++) {
        sl_step_stats ss;
        double t0 = sl_time_sec();
        if (sl_trainer_step(&tr, i, batch, &s, &ss) != SL_OK) {
            fprintf(stderr, "llama_train_ab: %s\n", sl_errmsg());
            exit(1);
        }
        if (i > 0) ts[i - 1] = sl_time_sec() - t0; /* step 0: warm-up */
        *loss = ss.loss;
    }
    sl_trainer_free(&tr);
    sl_model_free(m);
    qsort(ts, (size_t)steps, sizeof(double), cmp_d);
    return ts[steps / 2];
}

int main(int argc, char **argv) {
    int json = 0, a[10] = {12, 768, 2048, 12, 4, 32000, 4, 64, 4, 3}, na = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (na < 10 && atoi(argv[i]) > 0)
            a[na++] = atoi(argv[i]);
        else {
            fprintf(stderr,
                    "usage: llama_train_ab [L C I NH KV V B T STEPS ROUNDS] [--json]   (positive integers; "
                    "'%s')\n",
                    argv[i]);
            return 2;
        }
    }
    if (a[8] < 1 || a[8] > 64) a[8] = 4;
    sl_llama_config cfg = {.arch = SL_ARCH_LLAMA,
                           .n_layer = a[0],
                           .hidden = a[1],
                           .intermediate = a[2],
                           .n_head = a[3],
                           .n_kv_head = a[4],
                           .head_dim = a[1] / a[3],
                           .vocab_size = a[5],
                           .max_seq_len = a[7],
                           .rms_eps = 1e-5f,
                           .rope_theta = 10000.0f};
    const char *names[3] = {"fp32", "bf16", "bf16-fp32-gemm"};
    double med[3][16];
    float loss[3] = {0, 0, 0};
    int rounds = a[9] < 1 ? 1 : a[9] > 16 ? 16 : a[9];
    for (int r = 0; r < rounds; r++)
        for (int mode = 0; mode < 3; mode++) med[mode][r] = run(&cfg, mode, a[6], a[7], a[8], &loss[mode]);
    double tps[3];
    for (int mode = 0; mode < 3; mode++) {
        qsort(med[mode], (size_t)rounds, sizeof(double), cmp_d);
        tps[mode] = (double)a[6] * a[7] / med[mode][rounds / 2];
        if (!json)
            printf("%-15s %8.1f ms/step %8.1f tokens/s (median of %d rounds x %d steps; last loss %.4f)\n",
                   names[mode], med[mode][rounds / 2] * 1e3, tps[mode], rounds, a[8], loss[mode]);
    }
    if (json)
        printf("{\"bench\": \"llama_train_ab\", \"L\": %d, \"C\": %d, \"I\": %d, \"NH\": %d, \"KV\": %d, "
               "\"V\": %d, "
               "\"B\": %d, \"T\": %d, \"tokens_per_s_fp32\": %.2f, \"tokens_per_s_bf16\": %.2f, "
               "\"tokens_per_s_bf16_fp32_gemm\": %.2f, \"bf16_over_fp32\": %.3f}\n",
               a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], tps[0], tps[1], tps[2], tps[1] / tps[0]);
    else
        printf("bf16 / fp32: %.2fx; bf16 on the fp32 GEMM / fp32: %.2fx\n", tps[1] / tps[0], tps[2] / tps[0]);
    return 0;
}
