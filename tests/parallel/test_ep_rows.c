/* The expert-parallel received rows in reserved address space (Note [Reserved rows], src/graph/graph.c),
 * with threads as ranks (loopback): a small Qwen2-MoE with many experts and top-1, so that the worst case
 * the receive side is sized for (ep x k rows per token) is ep times what a balanced router delivers.
 * - (a) the rows past the counts are never read: the reserved region is filled with NaN before every step,
 *   and the losses of every step and the final weights of every rank equal bitwise those of the
 *   SUANLI_PLAN_RESERVE=0 run (everything in the one arena, as before the note), at ep 2 and ep 4;
 * - (b) the region exists only where rows are received: sl_graph_cap_bytes > 0 under EP with the packed
 *   experts, 0 in the single process, under SUANLI_PLAN_RESERVE=0 and with the per-expert buffers
 *   (SUANLI_MOE_PACKED=0, which flags nothing);
 * - (c) resident memory follows the rows that arrive: at ep 4 a balanced router delivers a quarter of the
 *   worst case; these random weights deliver 22-37 % to the four ranks (the most of any step, from the
 *   routing statistics), and sl_graph_cap_resident is 25-41 % of sl_graph_cap_bytes (the pages touched
 *   over all steps; page rounding and the experts' dw2 scratch, written whole, add a few points). Bars:
 *   under half of the reservation, and within 10 points of the largest received fraction.
 * A kernel made to read one row past an expert's counted rows (tried on MOE_PACKED_FFN_BACK_W) fails (a):
 * NaN losses from the second step on. */
#include <stdlib.h>
#include <string.h>

#include "graph/graph_internal.h"
#include "layout_harness.h"
#include "testutil.h"

enum { STEPS = 4, B = 4, T = 32, V = 512, E = 32, MAXR = 4 };

static const sl_llama_config MCFG = {.arch = SL_ARCH_QWEN2_MOE,
                                     .n_layer = 2,
                                     .n_head = 4,
                                     .n_kv_head = 2,
                                     .head_dim = 32,
                                     .hidden = 128,
                                     .intermediate = 64,
                                     .moe_intermediate = 32,
                                     .shared_intermediate = 0,
                                     .n_experts = E,
                                     .n_experts_per_tok = 1,
                                     .norm_topk_prob = 0,
                                     .vocab_size = V,
                                     .max_seq_len = T,
                                     .rms_eps = 1e-6f,
                                     .rope_theta = 10000.0f,
                                     .qkv_bias = 1};

/* uniform random tokens (every rank, step and micro-batch its own): the router spreads them over the
 * experts about evenly */
static sl_status synth(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    (void)u;
    for (int i = 0; i < B * T; i++) {
        uint64_t k = ((uint64_t)step * 64 + (uint64_t)micro) * B * T + (uint64_t)i;
        ids[i] = (int32_t)(sl_rng_u64(9, 0, k) % V);
        tg[i] = (int32_t)(sl_rng_u64(9, 1, k) % V);
    }
    return SL_OK;
}

typedef struct {
    sl_comm *world; /* NULL: the single process */
    int ep, poison;
    float losses[STEPS];
    double load[STEPS][E]; /* this rank's tokens per expert, summed over the layers */
    float *params;         /* this rank's final parameters (owned) */
    int64_t numel;
    size_t cap_bytes, cap_resident, arena_bytes;
    sl_status st;
} rank_job;

/* NaN in every byte of the reserved region: a kernel reading a row it did not write this step (past the
 * counts) carries NaN into the loss or the weights */
static sl_status poison(tu_layout_rank *R, int step, void *u) {
    sl_graph *g = R->tr.graph;
    (void)step;
    if (((rank_job *)u)->poison && g->cap_map) memset(g->cap_map, 0xff, g->cap_map_len);
    return SL_OK;
}

static sl_status finish(tu_layout_rank *R, void *u) {
    rank_job *j = u;
    j->cap_bytes = sl_graph_cap_bytes(R->tr.graph);
    j->cap_resident = sl_graph_cap_resident(R->tr.graph);
    j->arena_bytes = sl_graph_arena_bytes(R->tr.graph);
    return SL_OK;
}

static void *run_rank(void *arg) {
    rank_job *j = arg;
    tu_layout_spec s = {.world = j->world,
                        .ep = j->ep,
                        .llama = &MCFG,
                        .seed = 5,
                        .tc = {.B = B,
                               .T = T,
                               .accum = 1,
                               .lr = 3e-3f,
                               .min_lr = 3e-4f,
                               .clip = 0.5f,
                               .warmup = 1,
                               .decay_iters = STEPS,
                               .hp = {0.9f, 0.95f, 1e-8f, 0.1f}},
                        .dp = {.zero_stage = 0, .bucket_elems = 3000, .accum = 1},
                        .steps = STEPS,
                        .data = synth,
                        .losses = j->losses,
                        .moe_load = &j->load[0][0],
                        .params = &j->params,
                        .numel = &j->numel,
                        .user = j,
                        .before_step = poison,
                        .finish = finish};
    j->st = tu_layout_run_rank(&s);
    return NULL;
}

/* n ranks (n = ep: the whole world is one EP group; 1: the single process) with the environment as set */
static void run(int n, int ep, int poison, rank_job *jobs) {
    for (int r = 0; r < n; r++) jobs[r] = (rank_job){.ep = ep, .poison = poison};
    TU_LAYOUT_THREADS(n, run_rank, jobs);
    for (int r = 0; r < n; r++)
        TU_CHECK(jobs[r].st == SL_OK && jobs[r].params, "ep %d rank %d: %s (%s)", ep, r,
                 sl_status_name(jobs[r].st), sl_errmsg());
}

static void free_jobs(rank_job *jobs, int n) {
    for (int r = 0; r < n; r++) free(jobs[r].params);
}

/* (a) and (b) at one ep: the poisoned reserved run against the one-arena run, bitwise */
static void check_bitwise(int ep) {
    rank_job rsv[MAXR], one[MAXR];
    unsetenv("SUANLI_PLAN_RESERVE");
    run(ep, ep, 1, rsv);
    setenv("SUANLI_PLAN_RESERVE", "0", 1);
    run(ep, ep, 0, one);
    unsetenv("SUANLI_PLAN_RESERVE");
    for (int r = 0; r < ep; r++) {
        if (!rsv[r].params || !one[r].params) continue;
        TU_CHECK(rsv[r].cap_bytes > 0, "ep %d rank %d: no reserved region", ep, r);
        TU_CHECK(one[r].cap_bytes == 0, "ep %d rank %d: SUANLI_PLAN_RESERVE=0 reserved %zu bytes", ep, r,
                 one[r].cap_bytes);
        for (int s = 0; s < STEPS; s++)
            TU_CHECK(!memcmp(&rsv[r].losses[s], &one[r].losses[s], sizeof(float)) && rsv[r].losses[s] > 0,
                     "ep %d rank %d step %d: loss %.9g with the reserved rows poisoned, %.9g in one arena",
                     ep, r, s, (double)rsv[r].losses[s], (double)one[r].losses[s]);
        int64_t bad = -1;
        for (int64_t i = 0; i < rsv[r].numel && bad < 0; i++)
            if (memcmp(&rsv[r].params[i], &one[r].params[i], sizeof(float))) bad = i;
        TU_CHECK(rsv[r].numel == one[r].numel && bad < 0,
                 "ep %d rank %d: final weights differ first at element %lld (%.9g vs %.9g)", ep, r,
                 (long long)bad, bad >= 0 ? (double)rsv[r].params[bad] : 0.0,
                 bad >= 0 ? (double)one[r].params[bad] : 0.0);
    }
    printf("ep %d: reserved run (NaN-poisoned) == one-arena run bitwise over %d steps; rank 0: arena %zu + "
           "reserved %zu B vs one arena %zu B; losses %.6f .. %.6f\n",
           ep, STEPS, rsv[0].arena_bytes, rsv[0].cap_bytes, one[0].arena_bytes, (double)rsv[0].losses[0],
           (double)rsv[0].losses[STEPS - 1]);
    free_jobs(rsv, ep);
    free_jobs(one, ep);
}

/* (b) no region without received rows; (c) resident memory well below the reservation */
static void check_sizes(void) {
    rank_job jobs[MAXR];
    run(1, 1, 0, jobs);
    TU_CHECK(jobs[0].cap_bytes == 0 && jobs[0].cap_resident == 0, "single process: %zu bytes reserved",
             jobs[0].cap_bytes);
    free_jobs(jobs, 1);
    setenv("SUANLI_MOE_PACKED", "0", 1);
    run(2, 2, 0, jobs);
    unsetenv("SUANLI_MOE_PACKED");
    for (int r = 0; r < 2; r++)
        TU_CHECK(jobs[r].cap_bytes == 0, "ep 2 per-expert buffers: rank %d reserved %zu bytes", r,
                 jobs[r].cap_bytes);
    free_jobs(jobs, 2);
    run(4, 4, 0, jobs);
    for (int r = 0; r < 4; r++) {
        double frac = jobs[r].cap_bytes ? (double)jobs[r].cap_resident / (double)jobs[r].cap_bytes : 1,
               most = 0;
        for (int s = 0; s < STEPS; s++) { /* rows received by rank r (its experts' block) / the worst case */
            double got = 0;
            for (int q = 0; q < 4; q++)
                for (int e = r * E / 4; e < (r + 1) * E / 4; e++) got += jobs[q].load[s][e];
            got /= (double)MCFG.n_layer * 4 * B * T * MCFG.n_experts_per_tok;
            if (got > most) most = got;
        }
        printf("ep 4 rank %d: reserved %zu B, resident %zu B (%.1f%%) after %d steps, at most %.1f%% of the "
               "worst case's rows received in a step (mean of the layers); arena %zu B\n",
               r, jobs[r].cap_bytes, jobs[r].cap_resident, 100 * frac, STEPS, 100 * most,
               jobs[r].arena_bytes);
        TU_CHECK(jobs[r].cap_bytes > 0 && jobs[r].cap_resident > 0 && frac < 0.5 && frac <= most + 0.10,
                 "ep 4 rank %d: %zu of %zu reserved bytes resident, %.1f%% of the rows received (bar: under "
                 "half, and within 10 points)",
                 r, jobs[r].cap_resident, jobs[r].cap_bytes, 100 * most);
    }
    free_jobs(jobs, 4);
}

int main(void) {
    sl_threads_set(1);
    check_bitwise(2);
    check_bitwise(4);
    check_sizes();
    printf("reserved rows: ok\n");
    return tu_finish("test_ep_rows");
}
