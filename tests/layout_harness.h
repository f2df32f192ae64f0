/* One rank of a parallel layout, for the tests that train a tiny model split over threads as ranks
 * (loopback transport) and compare it with the single process or with another run: build the mesh, the
 * whole model and this rank's split of it (sl_tp_load_full), the trainer, TP and (when the mesh has dp > 1)
 * DP, run the steps, gather the weights. The values (model, seed, trainer config, ZeRO stage, steps) stay
 * with each test; what it reads from the run it has recorded (losses, parameters, ...) or reads in the
 * hooks.
 *
 * Usage:
 *   static tu_layout_tokens TOK = {B, T, V};
 *   static void *run_rank(void *arg) {  // arg: a rank_job with an sl_comm *world member
 *       rank_job *j = arg;
 *       tu_layout_spec sp = {.world = j->world, .tp = j->tp, .gpt2 = &CFG, .seed = 11, .tc = {...},
 *                            .dp = {.zero_stage = j->zero, .bucket_elems = 3000, .accum = j->accum},
 *                            .steps = STEPS, .data = tu_layout_synth, .data_user = &TOK,
 *                            .losses = j->losses};
 *       j->st = tu_layout_run_rank(&sp);
 *       return NULL;
 *   }
 *   TU_LAYOUT_THREADS(world, run_rank, jobs);  // jobs[r].world set, every rank run, joined */
#ifndef SL_LAYOUT_HARNESS_H
#define SL_LAYOUT_HARNESS_H
#include <stddef.h>

#include "suanli/parallel.h"
#include "suanli/train.h"

/* The tiny Llama-family shape the layout tests train (4 query heads, 2 kv heads of 8, hidden 32, MLP 48),
 * as designated initializers beside the test's own .arch and extras; V and T are the test's vocabulary and
 * sequence length: static const sl_llama_config C = {.arch = SL_ARCH_QWEN2, TU_TINY_LLAMA(2), .qkv_bias = 1};
 */
#define TU_TINY_LLAMA(layers)                                                                                \
    .n_layer = (layers), .n_head = 4, .n_kv_head = 2, .head_dim = 8, .hidden = 32, .intermediate = 48,       \
    .vocab_size = V, .max_seq_len = T, .rms_eps = 1e-5f, .rope_theta = 10000.0f

typedef struct tu_layout_rank tu_layout_rank;

typedef struct {
    sl_comm *world;                /* NULL: the single process */
    int tp, pp, ep, vpp;           /* mesh and split sizes (0 reads as 1); dp = world / (tp pp) */
    int first_layers, last_layers; /* an uneven pipeline split (0: even) */
    const sl_gpt2_config *gpt2;    /* the model: GPT-2 when set, else the Llama family's llama */
    const sl_llama_config *llama;  /* (the pointer is read while the model is built) */
    uint64_t seed;                 /* sl_model_init_weights of the whole model */
    sl_trainer_config tc;          /* .mesh and .dp_size are this rank's mesh's */
    sl_dp_opts dp;                 /* when the mesh has dp > 1; ready = sl_trainer_dp_ready: the trainer */
    int steps;                     /* sl_trainer_step with step 0 .. steps - 1 */
    sl_batch_fn data;              /* the batches */
    void *data_user;
    /* What the run records, each where set: the loss and gradient norm of every step; the MoE routing
     * statistics (sl_moe_graph_stats) of every step but under a pipeline: moe_load[step * n_experts + e]
     * with the Llama config's n_experts; the planned activation bytes (tr.plan.planned_bytes); a copy of
     * this rank's parameters after the gather (malloc'd: the caller frees it) and their count. */
    float *losses, *grad_norms;
    double *moe_load, *moe_dropped;
    size_t *planned;
    size_t *scratch; /* of which the pipeline slots' shared scratch region (tr.plan.scratch_bytes) */
    float **params;
    int64_t *numel;
    void *user; /* the hooks' */
    /* Hooks (each may be NULL; a status other than SL_OK ends the run with it): */
    sl_status (*prepare)(tu_layout_rank *R, void *user); /* the model built and loaded, before the trainer */
    sl_status (*ready)(tu_layout_rank *R, void *user);   /* the trainer with TP and DP, before step 0 */
    sl_status (*before_step)(tu_layout_rank *R, int step, void *user);
    sl_status (*after_step)(tu_layout_rank *R, int step, const sl_step_stats *ss, void *user);
    /* after the last step and sl_dp_gather_params (ZeRO-3: the whole weights again): read the results;
     * set R->m to NULL to keep the model (the caller frees it) */
    sl_status (*finish)(tu_layout_rank *R, void *user);
} tu_layout_spec;

struct tu_layout_rank {
    const tu_layout_spec *spec;
    sl_mesh mesh;
    sl_model *m;     /* this rank's model: its split, or the whole model when nothing is split */
    sl_model *whole; /* the whole model the split was loaded from (NULL when m is it) */
    sl_tp *tp;       /* when tp > 1 or ep > 1 */
    sl_dp *dp;       /* when the mesh has dp > 1 */
    sl_trainer tr;
};

/* The batches of the layout tests: micro-batch `micro` of `step` from tu_synth_tokens, B rows of T ids over
 * vocabulary V (an sl_batch_fn; tokens: a tu_layout_tokens). */
typedef struct {
    int B, T, V;
} tu_layout_tokens;
sl_status tu_layout_synth(void *tokens, int64_t step, int micro, int32_t *ids, int32_t *tg);

/* The layout tests' trainer: B rows of T per micro-batch, accum micro-batches per step and rank, dp ranks;
 * AdamW (0.9, 0.95, eps 1e-8, weight decay 0.1), lr 3e-3 warming up over `warmup` steps and decaying to
 * 3e-4 at step `steps`, gradients clipped at norm 1. The test adds what else it needs. */
sl_trainer_config tu_layout_tc(int B, int T, int accum, int dp, int warmup, int steps);

/* Runs one rank as the spec says; frees all it built but a model a hook kept. The first status other than
 * SL_OK (the mesh, the model, the trainer, DP, a step, a hook) ends the run and is returned. */
sl_status tu_layout_run_rank(const tu_layout_spec *spec);

/* Runs fn(&jobs[r]) on n threads, r < n, each job's `world` member (at world_off) set to rank r of a loopback
 * world of n ranks (NULL when n is 1), and joins them; the communicators are freed after. The loopback is a
 * check when n > 1; if it fails, the ranks run with no world (each a single process, or its mesh refuses
 * the layout). */
void tu_layout_threads(int n, void *(*fn)(void *), void *jobs, size_t stride, size_t world_off);
#define TU_LAYOUT_THREADS(n, fn, jobs)                                                                       \
    tu_layout_threads((n), (fn), (jobs), sizeof(jobs)[0], (size_t)((char *)&(jobs)[0].world - (char *)(jobs)))
#endif
