/* suanli bench moe — training throughput of a small Qwen2-MoE (issue 17, item 6): E experts, top-k, a shared
 * expert, random weights and tokens, under `suanli run -n N` data parallel with the experts spread over
 * --expert-model-parallel-size ranks. Reports tokens/s (median step), the fraction of the step inside the
 * expert all-to-alls (dispatch, combine and the count exchanges, forward and backward) and inside the
 * gradient reduction waits, the bytes each rank sent through the all-to-alls per step, the step graph's
 * planned activations (the arena and the received rows' reserved region, with how much of that region is
 * resident: Note [Reserved rows]), the peak RSS and the RSS after the steps (SUANLI_MOE_PACKED=0: the
 * per-expert buffers instead of the packed experts of Note [Packed experts], for an A/B;
 * SUANLI_PLAN_RESERVE=0: everything in one arena). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_train.h"
#include "cli/flags.h"
#include "suanli/parallel.h"
#include "suanli/train.h"

typedef struct {
    int V;
    int64_t n;
} synth;

static sl_status synth_batch(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    synth *s = u;
    for (int64_t i = 0; i < s->n; i++) { /* every rank and step its own tokens: routing varies */
        uint64_t k = ((uint64_t)step * 4096 + (uint64_t)micro) * (uint64_t)s->n + (uint64_t)i;
        ids[i] = (int32_t)(sl_rng_u64(7, 0, k) % (uint64_t)s->V);
        tg[i] = (int32_t)(sl_rng_u64(7, 1, k) % (uint64_t)s->V);
    }
    return SL_OK;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* resident memory now (VmRSS, MiB; -1 where /proc is not there): after the timed steps, beside the peak */
static double rss_now_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kib = atof(line + 6);
    if (f) fclose(f);
    return kib < 0 ? -1 : kib / 1024.0;
}

static int fail(const char *what) {
    fprintf(stderr, "suanli bench moe: %s%s\n", what, sl_errmsg());
    return 1;
}

int sl_bench_moe(int argc, char **argv) {
    int64_t L = 4, NH = 8, NKV = 4, C = 256, E = 8, K = 2, I = 256, S = 512, V = 4096, B = 4, T = 64,
            steps = 8, warm = 2, threads = 1, ep = 1, zero = 0;
    int json = 0, bf16 = 0, mixtral = 0;
    double cf = 0;
    const char *rcg = NULL;
    sl_flag flags[] = {
        {"num-layers", SL_FLAG_INT, &L, 1, 1024, "(4)", 0},
        {"num-attention-heads", SL_FLAG_INT, &NH, 1, 1024, "(8)", 0},
        {"num-query-groups", SL_FLAG_INT, &NKV, 1, 1024, "kv heads (4)", 0},
        {"hidden-size", SL_FLAG_INT, &C, 8, 65536, "(256)", 0},
        {"num-experts", SL_FLAG_INT, &E, 1, SL_MOE_MAX_EXPERTS, "(8)", 0},
        {"moe-router-topk", SL_FLAG_INT, &K, 1, SL_MOE_MAX_EXPERTS, "(2)", 0},
        {"moe-ffn-hidden-size", SL_FLAG_INT, &I, 1, 1 << 20, "expert width (256)", 0},
        {"moe-shared-expert-intermediate-size", SL_FLAG_INT, &S, 0, 1 << 22, "(512; 0: none)", 0},
        {"moe-capacity-factor", SL_FLAG_FLOAT, &cf, 0, 1e6, "(0: dropless)", 0},
        {"vocab-size", SL_FLAG_INT, &V, 2, 1 << 24, "(4096)", 0},
        {"micro-batch-size", SL_FLAG_INT, &B, 1, 4096, "(4)", 0},
        {"seq-length", SL_FLAG_INT, &T, 1, 1 << 16, "(64)", 0},
        {"steps", SL_FLAG_INT, &steps, 1, 100000, "timed steps (8)", 0},
        {"warmup", SL_FLAG_INT, &warm, 0, 1000, "untimed steps (2)", 0},
        {"threads", SL_FLAG_INT, &threads, 1, 1024, "(1)", 0},
        {"expert-model-parallel-size", SL_FLAG_INT, &ep, 1, 4096, "EP ranks (1); must divide the world", 0},
        {"ep", SL_FLAG_INT, &ep, 1, 4096, "short for --expert-model-parallel-size", 0},
        {"zero-stage", SL_FLAG_INT, &zero, 0, 2, "ZeRO stage under DP (0)", 0},
        {"bf16", SL_FLAG_BOOL, &bf16, 0, 1, "bf16 mixed precision (autocast numerics; fp32 master weights)",
         0},
        {"recompute-granularity", SL_FLAG_STR, &rcg, 0, 0,
         "full: every layer computed again in the backward (Note [Full recomputation])", 0},
        {"mixtral", SL_FLAG_BOOL, &mixtral, 0, 1,
         "a Mixtral block instead of Qwen2-MoE's (top-k then softmax, no shared expert, no qkv bias)", 0},
        {"json", SL_FLAG_BOOL, &json, 0, 1, "machine-readable output", 0},
    };
    if (sl_flags_help(flags, (int)(sizeof flags / sizeof flags[0]), argc, argv,
                      "usage: suanli bench moe [flags]"))
        return 0;
    if (sl_flags_parse(flags, (int)(sizeof flags / sizeof flags[0]), argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli bench moe: %s\n", sl_errmsg());
        return 2;
    }
    if (rcg && strcmp(rcg, "full")) {
        fprintf(stderr, "suanli bench moe: --recompute-granularity: expected full, got '%s'\n", rcg);
        return 2;
    }
    sl_threads_set((int)threads);
    sl_comm_env env = {0};
    sl_comm *world = NULL;
    sl_mesh mesh;
    if (sl_comm_env_detect(&env) == SL_OK && env.size > 1 && sl_comm_init_env(&world, NULL) != SL_OK)
        return fail("");
    if (sl_mesh_init(&mesh, world, (sl_mesh_dims){1, 1, (int)ep}) != SL_OK) {
        fprintf(stderr, "suanli bench moe: %s\n", sl_errmsg());
        return 2;
    }
    if (mesh.rank != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    if (mixtral && S > 0) S = 0; /* Mixtral has no shared expert */
    sl_llama_config cfg = {.arch = mixtral ? SL_ARCH_MIXTRAL : SL_ARCH_QWEN2_MOE,
                           .n_layer = (int)L,
                           .n_head = (int)NH,
                           .n_kv_head = (int)NKV,
                           .head_dim = (int)(C / NH),
                           .hidden = (int)C,
                           .intermediate = (int)I,
                           .moe_intermediate = (int)I,
                           .shared_intermediate = (int)S,
                           .n_experts = (int)E,
                           .n_experts_per_tok = (int)K,
                           .vocab_size = (int)V,
                           .max_seq_len = (int)T,
                           .rms_eps = 1e-6f,
                           .rope_theta = 10000.0f,
                           .qkv_bias = !mixtral};
    sl_model *m = NULL;
    sl_tp *tp = NULL;
    sl_model_split split = {1, 0, 1, 0, 1, 0, 0, (int)ep, mesh.ep_rank, 0};
    if (sl_llama_new_par(&cfg, sl_backend_cpu(), &split, &m) != SL_OK) {
        fprintf(stderr, "suanli bench moe: %s\n", sl_errmsg());
        return 2;
    }
    sl_model_init_weights(m, 1);
    m->moe.capacity_factor = (float)cf;
    m->compute_dtype = bf16 ? SL_BF16 : SL_F32;
    if (ep > 1 && sl_tp_new(&tp, &mesh) != SL_OK) return fail("");
    sl_trainer tr;
    sl_trainer_config tc =
        sl_bench_trainer_config(B, T, 1, &mesh, 0, rcg ? SL_RECOMPUTE_UNIFORM : SL_RECOMPUTE_NONE, 1, 0, 0);
    if (sl_trainer_init(&tr, m, &tc) != SL_OK) return fail("");
    if (tp && sl_trainer_set_tp(&tr, tp) != SL_OK) return fail("");
    sl_dp *dp = NULL;
    if (mesh.dp > 1) {
        sl_dp_opts o = {.zero_stage = (int)zero,
                        .bucket_elems = 1 << 20,
                        .accum = 1,
                        .ready = sl_trainer_dp_ready,
                        .ready_user = &tr};
        if (sl_dp_new(&dp, &mesh, m, tr.graph, &o) != SL_OK) return fail("");
        tr.dp = dp;
    }
    synth s = {(int)V, B * T};
    double *ts = malloc(sizeof(double) * (size_t)steps), a2a_tot = 0, a2a_bytes = 0, wait_tot = 0,
           step_tot = 0;
    for (int64_t i = 0; i < warm + steps; i++) {
        sl_step_stats ss;
        double sec, bytes;
        if (sl_trainer_step(&tr, i, synth_batch, &s, &ss) != SL_OK) /* micro: the DP rank */
            return fail("");
        sl_ep_take_stats(tp, &sec, &bytes);
        if (i < warm) continue;
        ts[i - warm] = ss.seconds;
        a2a_tot += sec;
        a2a_bytes += bytes;
        wait_tot += ss.comm_wait_sec;
        step_tot += ss.seconds;
    }
    qsort(ts, (size_t)steps, sizeof(double), cmp_d);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const char *pk = getenv("SUANLI_MOE_PACKED");
    int packed = !(pk && pk[0] == '0' && !pk[1]);
    /* planned activations: the arena plus the reserved rows' region (Note [Reserved rows]), of which
     * only the pages the received rows touched are resident */
    double act_mib = (double)(sl_graph_arena_bytes(tr.graph) + sl_graph_cap_bytes(tr.graph)) / 1048576.0,
           rsv_mib = (double)sl_graph_cap_bytes(tr.graph) / 1048576.0,
           rsv_res_mib = (double)sl_graph_cap_resident(tr.graph) / 1048576.0,
           rss_mib = (double)ru.ru_maxrss / 1024.0, rss_end_mib = rss_now_mib();
    double med = ts[steps / 2], tps = (double)(B * T) * mesh.dp / med;
    double a2a_frac = step_tot > 0 ? a2a_tot / step_tot : 0,
           wait_frac = step_tot > 0 ? wait_tot / step_tot : 0;
    if (json)
        printf("{\"bench\": \"moe_train\", \"model\": \"%s\", \"L\": %lld, \"C\": %lld, \"E\": %lld, "
               "\"topk\": %lld, \"moe_ffn\": %lld, \"shared\": %lld, \"V\": %lld, \"B\": %lld, \"T\": %lld, "
               "\"threads\": %lld, \"world\": %d, \"dp\": %d, \"ep\": %lld, \"zero_stage\": %lld, "
               "\"capacity_factor\": %g, \"params_per_rank\": %lld, \"ms_per_step\": %.2f, \"tokens_per_s\": "
               "%.1f, \"a2a_fraction\": %.4f, \"a2a_mib_per_step\": %.3f, \"comm_wait_fraction\": %.4f, "
               "\"packed_experts\": %d, \"bf16\": %d, \"recompute\": %d, \"activation_mib\": %.1f, "
               "\"reserved_rows_mib\": %.2f, "
               "\"reserved_resident_mib\": %.2f, \"peak_rss_mib\": %.1f, \"rss_mib\": %.1f}\n",
               mixtral ? "mixtral" : "qwen2_moe", (long long)L, (long long)C, (long long)E, (long long)K,
               (long long)I, (long long)S, (long long)V, (long long)B, (long long)T, (long long)threads,
               mesh.world, mesh.dp, (long long)ep, (long long)zero, cf, (long long)m->numel, med * 1e3, tps,
               a2a_frac, a2a_bytes / steps / 1048576.0, wait_frac, packed, bf16, rcg != NULL, act_mib,
               rsv_mib, rsv_res_mib, rss_mib, rss_end_mib);
    else
        printf("%s L%lld C%lld, %lld experts top-%lld, B%lld T%lld, %lld threads x %d ranks (dp %d, ep "
               "%lld): %.1f ms/step, %.1f tokens/s; all-to-all %.1f%% of the step (%.2f MiB sent per rank), "
               "gradient waits %.1f%%; %lld parameters per rank; activations %.1f MiB (%s experts; received "
               "rows: %.2f MiB reserved, %.2f resident), peak RSS %.1f MiB (%.1f MiB after the steps)\n",
               mixtral ? "Mixtral" : "Qwen2-MoE", (long long)L, (long long)C, (long long)E, (long long)K,
               (long long)B, (long long)T, (long long)threads, mesh.world, mesh.dp, (long long)ep, med * 1e3,
               tps, 100 * a2a_frac, a2a_bytes / steps / 1048576.0, 100 * wait_frac, (long long)m->numel,
               act_mib, packed ? "packed" : "per-expert", rsv_mib, rsv_res_mib, rss_mib, rss_end_mib);
    free(ts);
    sl_dp_free(dp);
    sl_tp_free(tp);
    sl_trainer_free(&tr);
    sl_model_free(m);
    sl_mesh_free(&mesh);
    sl_comm_free(world);
    return 0;
}
