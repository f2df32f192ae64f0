/* bench_generate.c — `suanli bench generate`: KV-cache inference of a random-weight Llama in bf16 against
 * the machine's memory bandwidth and GEMM speed, measured in the same run.
 *
 * Note [Decode at the memory limit]
 * Decoding one token multiplies a single activation row by every weight matrix: it reads each weight once
 * and does 2 FLOPs per 2-byte weight, far below the FMA peak, so its ceiling is the read bandwidth. The
 * bench measures that ceiling with a STREAM-like probe: a read-only pass (vector loads into an integer sum)
 * over the model's own bf16 weight block, at the same thread count, before and after the decode runs. The
 * bytes a decode step must read are the bf16 weights (every projection and the LM head), the f32 norms,
 * one embedding row and the KV cache up to the step's position (counted at the mean position of the timed
 * steps). limit tokens/s = probe bytes/s / bytes per token; the fraction is measured / limit.
 * Note [Decode fraction per run]
 * Some hosts change speed by the second (a VM whose two vCPUs read 31-33 or 51-61 GB/s by the minute,
 * docs/BENCHMARKS.md): a decode run in one mode against a median probe from the other read 0.65 or 1.28.
 * So each run is compared with the two probe passes that bracket it (their mean), and the reported
 * fraction is the median of those per-run fractions (fraction_per_run in the JSON); the probe median and
 * the decode median are still printed as they are.
 * The prompt is one batched forward of M = prompt-length rows (the prefill graph); its FLOPs (2 per weight
 * of the projections and head per token, plus attention) are compared with sl_gemm_bf16 on the MLP's
 * (M, intermediate, hidden) shape timed in the same run. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/flags.h"
#include "device/cpu/kernels/gemm.h"
#include "suanli/nn.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t r[4];
    _mm256_storeu_si256((__m256i *)r, s0);
    uint64_t t = r[0] + r[1] + r[2] + r[3];
    for (; i < n; i++) t += p[i];
    return t;
}

static uint64_t sum_scalar(const uint8_t *p, size_t n) {
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++) t += p[i];
    return t;
}

static volatile uint64_t probe_sink; /* keeps the sums alive */

/* Read bandwidth (bytes/s) of one read-only pass over [p, p+n) split evenly over nthr threads. */
static double read_bw(const void *p, size_t n, int nthr) {
    int avx2 = __builtin_cpu_supports("avx2");
    uint64_t total = 0;
    double t0 = sl_time_sec();
#pragma omp parallel num_threads(nthr) reduction(+ : total)
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        size_t per = (n / (size_t)nt) & ~(size_t)127, a = per * (size_t)t, b = t == nt - 1 ? n : a + per;
        const uint8_t *q = (const uint8_t *)p + a;
        total += avx2 ? sum_avx2(q, b - a) : sum_scalar(q, b - a);
    }
    double dt = sl_time_sec() - t0;
    probe_sink += total;
    return (double)n / dt;
}

static int pick_shape(const char *size, sl_llama_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = SL_ARCH_LLAMA;
    c->rms_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->max_seq_len = 4096;
    c->vocab_size = 32000;
    if (!strcmp(size, "7b")) { /* Llama-2-7B: 6.74e9 params, 13.5 GB in bf16 */
        c->hidden = 4096, c->n_layer = 32, c->n_head = 32, c->n_kv_head = 32, c->intermediate = 11008;
    } else if (!strcmp(size, "1b")) { /* TinyLlama-1.1B: 1.1e9 params, 2.2 GB in bf16 */
        c->hidden = 2048, c->n_layer = 22, c->n_head = 32, c->n_kv_head = 4, c->intermediate = 5632;
    } else if (!strcmp(size, "small")) { /* 0.14e9 params (0.28 GB): still far beyond the caches */
        c->hidden = 1024, c->n_layer = 8, c->n_head = 16, c->n_kv_head = 4, c->intermediate = 2816;
    } else {
        return 0;
    }
    c->head_dim = c->hidden / c->n_head;
    return 1;
}

int sl_bench_generate(int argc, char **argv) {
    const char *size = "1b";
    int64_t threads = 2, P = 32, D = 16, reps = 3;
    int json = 0;
    sl_flag flags[] = {
        {"size", SL_FLAG_STR, &size, 0, 0, "Llama shape: 7b (13.5 GB bf16) | 1b (TinyLlama, 2.2 GB) | small",
         0},
        {"threads", SL_FLAG_INT, &threads, 1, 1024, "(2)", 0},
        {"prompt-length", SL_FLAG_INT, &P, 1, 4096, "prompt tokens, one batched prefill (32)", 0},
        {"decode-tokens", SL_FLAG_INT, &D, 1, 4096, "timed decode steps per run (16)", 0},
        {"reps", SL_FLAG_INT, &reps, 1, 100, "runs; medians are reported (3)", 0},
        {"json", SL_FLAG_BOOL, &json, 0, 1, "machine-readable output", 0},
    };
    if (sl_flags_help(flags, (int)(sizeof flags / sizeof flags[0]), argc, argv,
                      "usage: suanli bench generate [flags]"))
        return 0;
    if (sl_flags_parse(flags, (int)(sizeof flags / sizeof flags[0]), argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli bench generate: %s\n", sl_errmsg());
        return 2;
    }
    sl_llama_config cfg;
    if (!pick_shape(size, &cfg)) {
        fprintf(stderr, "suanli bench generate: --size: '%s' is not 7b, 1b or small\n", size);
        return 2;
    }
    if (P + D + 1 > cfg.max_seq_len) {
        fprintf(stderr, "suanli bench generate: --prompt-length + --decode-tokens exceed %d positions\n",
                cfg.max_seq_len);
        return 2;
    }
    sl_threads_set((int)threads);
    sl_model *m = NULL;
    double t0 = sl_time_sec();
    if (sl_llama_new_ex(&cfg, SL_BF16, &m) != SL_OK || sl_model_init_bf16_random(m, 1) != SL_OK) {
        fprintf(stderr, "suanli bench generate: %s\n", sl_errmsg());
        sl_model_free(m);
        return 1;
    }
    double init_s = sl_time_sec() - t0;
    int64_t C = cfg.hidden, V = cfg.vocab_size, L = cfg.n_layer, KD = (int64_t)cfg.n_kv_head * cfg.head_dim;
    int64_t emb = V * C;                                /* f32 embedding: one row read per token */
    double wbytes = 2.0 * (double)m->wnumel;            /* every bf16 projection and the head */
    double fbytes = 4.0 * (double)(m->numel - emb + C); /* norms + one embedding row */
    double kv_pos = P + 0.5 * D;                        /* mean cache length of the timed decode steps */
    double kvbytes = 2.0 * 4.0 * (double)L * kv_pos * (double)KD;
    double tok_bytes = wbytes + fbytes + kvbytes;

    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)P), *out = malloc(sizeof(int32_t) * (size_t)(D + 1));
    int nr = (int)reps, np = 2 * nr + 1;
    double *bw = calloc((size_t)np, sizeof(double)), *dec = calloc((size_t)nr, sizeof(double)),
           *pre = calloc((size_t)nr, sizeof(double)), *gm = calloc((size_t)nr, sizeof(double));
    if (!prompt || !out || !bw || !dec || !pre || !gm) {
        fprintf(stderr, "suanli bench generate: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < P; i++) prompt[i] = (int32_t)(sl_rng_u64(3, 0, (uint64_t)i) % (uint64_t)V);
    /* GEMM anchor: the MLP up projection at M = P rows, bf16 in, fp32 out */
    int64_t I = cfg.intermediate;
    uint16_t *ga = sl_malloc_aligned(2 * (size_t)(P * C)), *gb = m->wmem; /* any I x C bf16 block */
    float *gc = sl_malloc_aligned(4 * (size_t)(P * I));
    if (!ga || !gc) {
        fprintf(stderr, "suanli bench generate: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < P * C; i++) ga[i] = m->wmem[i * 7 % m->wnumel];
    sl_sample_opts so = {0, 0, 1.0f, 1};
    sl_gen_stats gs = {0};
    int ip = 0;
    bw[ip++] = read_bw(m->wmem, (size_t)wbytes, (int)threads); /* warm-up pass: pages touched, TLB */
    ip = 0;
    bw[ip++] = read_bw(m->wmem, (size_t)wbytes, (int)threads);
    /* one untimed generation plans both graphs once (page faults of the arenas, the GEMM buffers) */
    if (sl_model_generate(m, prompt, (int)P, 2, &so, NULL, 0, NULL, NULL, out, &gs) != SL_OK) {
        fprintf(stderr, "suanli bench generate: %s\n", sl_errmsg());
        return 1;
    }
    for (int r = 0; r < nr; r++) {
        if (sl_model_generate(m, prompt, (int)P, (int)D + 1, &so, NULL, 0, NULL, NULL, out, &gs) != SL_OK) {
            fprintf(stderr, "suanli bench generate: %s\n", sl_errmsg());
            return 1;
        }
        dec[r] = gs.gen_seconds / (double)(gs.n_generated - 1);
        pre[r] = gs.prompt_seconds;
        bw[ip++] = read_bw(m->wmem, (size_t)wbytes, (int)threads);
        double g0 = sl_time_sec();
        sl_gemm_bf16(0, 1, P, I, C, 1.0f, ga, C, gb, C, 0.0f, gc, I);
        gm[r] = 2.0 * (double)P * (double)I * (double)C / (sl_time_sec() - g0);
        bw[ip++] = read_bw(m->wmem, (size_t)wbytes, (int)threads);
    }
    /* Note [Decode fraction per run]: run r sits between probe passes 2r and 2r + 1 */
    double *fr = calloc((size_t)nr, sizeof(double));
    if (!fr) {
        fprintf(stderr, "suanli bench generate: out of memory\n");
        return 1;
    }
    for (int r = 0; r < nr; r++) fr[r] = (tok_bytes / dec[r]) / (0.5 * (bw[2 * r] + bw[2 * r + 1]));
    char frs[64 * 8] = "";
    for (int r = 0, o = 0; r < nr && o < (int)sizeof frs - 16; r++)
        o += snprintf(frs + o, sizeof frs - (size_t)o, "%s%.3f", r ? ", " : "", fr[r]);
    double frac = median(fr, nr);
    free(fr);
    double bwm = median(bw, ip), decm = median(dec, nr), prem = median(pre, nr), gmm = median(gm, nr);
    double tps = 1.0 / decm, limit = bwm / tok_bytes;
    /* prefill FLOPs: 2 per projection/head weight per token; attention 4 * P^2/2 * QD per layer */
    double QD = (double)cfg.n_head * cfg.head_dim;
    double pflop = 2.0 * (double)m->wnumel * (double)P + 4.0 * 0.5 * (double)P * (double)P * QD * (double)L;
    double pgf = pflop / prem;
    const char *kern = sl_gemm_kernel_name();
    if (json) {
        printf(
            "{\"bench\": \"generate\", \"size\": \"%s\", \"threads\": %lld, \"params\": %.0f, "
            "\"weight_gb\": %.3f, \"bytes_per_token_gb\": %.3f, \"prompt_tokens\": %lld, "
            "\"decode_tokens\": %lld, \"reps\": %d, \"gemm_kernel\": \"%s\", \"decode_tokens_per_s\": %.3f, "
            "\"decode_ms_per_token\": %.2f, \"probe_read_gb_s\": %.2f, \"decode_gb_s\": %.2f, "
            "\"limit_tokens_per_s\": %.3f, \"fraction_of_limit\": %.3f, \"fraction_per_run\": [%s], "
            "\"prompt_tokens_per_s\": %.2f, "
            "\"prompt_gflop_s\": %.1f, \"gemm_gflop_s\": %.1f, \"prompt_vs_gemm\": %.3f, \"init_s\": %.1f}\n",
            size, (long long)threads, (double)(m->numel + m->wnumel), wbytes / 1e9, tok_bytes / 1e9,
            (long long)P, (long long)D, nr, kern, tps, decm * 1e3, bwm / 1e9, tok_bytes / decm / 1e9, limit,
            frac, frs, (double)P / prem, pgf / 1e9, gmm / 1e9, pgf / gmm, init_s);
    } else {
        printf("Llama %s bf16 (random weights, %.2f GB of bf16 weights, %.3f GB read per token), %lld "
               "threads, kernel %s\n",
               size, wbytes / 1e9, tok_bytes / 1e9, (long long)threads, kern);
        printf("  read-bandwidth probe : %.2f GB/s (median of %d passes over the weights)\n", bwm / 1e9, ip);
        printf(
            "  decode               : %.3f tokens/s (%.1f ms/token, %.2f GB/s); %.1f%% of the limit set by "
            "the probe passes around each run (median; per run %s), the median probe's limit %.3f "
            "tokens/s\n",
            tps, decm * 1e3, tok_bytes / decm / 1e9, 100 * frac, frs, limit);
        printf("  prompt (%lld tokens)  : %.2f tokens/s, %.1f GFLOP/s; bf16 GEMM (%lld x %lld x %lld) %.1f "
               "GFLOP/s: %.2fx\n",
               (long long)P, (double)P / prem, pgf / 1e9, (long long)P, (long long)I, (long long)C, gmm / 1e9,
               pgf / gmm);
    }
    free(prompt);
    free(out);
    free(bw);
    free(dec);
    free(pre);
    free(gm);
    sl_free_aligned(ga);
    sl_free_aligned(gc);
    sl_model_free(m);
    return 0;
}
