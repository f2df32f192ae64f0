/* `suanli train --init-from` on MoE models (issue 17): a few steps of Qwen2-MoE and of the DeepSeek-V3-style
 * model with the MoE flags (capacity with token dropping, aux and z losses, the router override, the
 * DeepSeek-V3 bias update), metrics.jsonl's MoE fields (per-expert load, dropped fraction, aux / z losses),
 * `suanli plot` with the expert-load panel, and bad input: experts not divisible by --ep, top-k > experts,
 * capacity factors <= 0, unknown routers, MoE flags on a dense model: exit 2, one line naming the flag. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/base.h"
#include "testutil.h"

static char out[1 << 16];

static int one_line(void) {
    size_t n = strlen(out);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += out[i] == '\n';
    return lines == 1 && n > 0 && out[n - 1] == '\n';
}

/* exit 2, one line naming the flag, nothing written under the test dir (each bad run has a --save; tu_watch)
 */
static void bad(const char *what, const char *needle, int rc) {
    TU_CHECK(rc == 2, "%s: exit %d (want 2); output: %s", what, rc, out);
    TU_CHECK(tu_unchanged(), "%s: the run wrote under the test dir", what);
    TU_CHECK(one_line(), "%s: want one line, got: %s", what, out);
    TU_CHECK(strstr(out, needle) != NULL, "%s: message lacks '%s': %s", what, needle, out);
}

/* a model dir: the fixture's config + weights, the llama fixture's tokenizer (same vocab, 320) */
static void model_dir(const char *name, const char *dst) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && mkdir -p %s && cp %s/tests/fixtures/hf/%s/config.json %s/tests/fixtures/hf/%s/"
             "model.safetensors %s/ && cp %s/tests/fixtures/hf/llama/tokenizer.json %s/",
             dst, dst, SL_SOURCE_DIR, name, SL_SOURCE_DIR, name, dst, SL_SOURCE_DIR, dst);
    TU_CHECK(tu_run(cmd, NULL, 0) == 0, "copy %s", name);
}

/* the MoE fields of every metrics.jsonl line */
static void check_metrics(const char *run, int E, int steps, int expect_drops) {
    char path[1200], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    TU_CHECK(sl_file_read_all(path, &text, &len) == SL_OK, "read %s", path);
    int lines = 0, dropped = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        cJSON *o = cJSON_Parse(line);
        const cJSON *load = cJSON_GetObjectItemCaseSensitive(o, "moe_load");
        const cJSON *df = cJSON_GetObjectItemCaseSensitive(o, "moe_dropped_frac");
        const cJSON *aux = cJSON_GetObjectItemCaseSensitive(o, "moe_aux_loss");
        const cJSON *z = cJSON_GetObjectItemCaseSensitive(o, "moe_z_loss");
        TU_CHECK(cJSON_IsArray(load) && cJSON_GetArraySize(load) == E, "%s line %d: moe_load of %d experts",
                 run, lines + 1, E);
        TU_CHECK(cJSON_IsNumber(df) && df->valuedouble >= 0 && df->valuedouble < 1, "moe_dropped_frac");
        TU_CHECK(cJSON_IsNumber(aux) && aux->valuedouble > 0.5 && cJSON_IsNumber(z) && z->valuedouble > 0,
                 "moe_aux_loss %g (1 when balanced), moe_z_loss",
                 cJSON_IsNumber(aux) ? aux->valuedouble : -1);
        dropped += cJSON_IsNumber(df) && df->valuedouble > 0;
        cJSON_Delete(o);
        lines++;
    }
    free(text);
    TU_CHECK(lines == steps, "%s: %d metrics lines, want %d", run, lines, steps);
    if (expect_drops) TU_CHECK(dropped > 0, "%s: capacity factor 0.5 drops tokens", run);
}

int main(void) {
    const char *tmp = tu_tmpdir("moecli");
    char cmd[8192], txt[1100], qdir[1100], ddir[1100], data[1100], run[1100], flags[2048];
    snprintf(qdir, sizeof qdir, "%s/qwen2_moe", tmp);
    snprintf(ddir, sizeof ddir, "%s/deepseek_v3", tmp);
    model_dir("qwen2_moe", qdir);
    model_dir("deepseek_v3", ddir);
    snprintf(txt, sizeof txt, "%s/corpus.txt", tmp);
    FILE *f = fopen(txt, "w");
    for (int i = 0; i < 200; i++) fprintf(f, "the quick brown fox %d jumps over the lazy dog. ", i);
    fclose(f);
    snprintf(data, sizeof data, "%s/tok", tmp);
    snprintf(cmd, sizeof cmd,
             "%s data prepare --input %s --output-prefix %s --tokenizer-file %s/tokenizer.json", tu_cli(),
             txt, data, qdir);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "data prepare: %s", out);
    const char *base =
        "--seq-length 16 --micro-batch-size 2 --train-iters 3 --eval-interval 0 --eval-iters 1";

    /* Qwen2-MoE: capacity 0.5 (tokens dropped), aux + z losses, a plot */
    snprintf(run, sizeof run, "%s/run_q", tmp);
    snprintf(cmd, sizeof cmd,
             "%s train --data-path %s --init-from %s %s --moe-capacity-factor 0.5 --moe-aux-loss-coeff 0.01 "
             "--moe-z-loss-coeff 0.001 --save %s",
             tu_cli(), data, qdir, base, run);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "qwen2_moe train: %s", out);
    check_metrics(run, 8, 3, 1);
    snprintf(cmd, sizeof cmd, "%s plot %s", tu_cli(), run);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "plot: %s", out);
    snprintf(cmd, sizeof cmd, "grep -c 'expert load share' %s/loss.svg", run);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "the plot has the expert-load panel");

    /* DeepSeek-V3 style: dropless, the bias update moves e_score_correction_bias; a router override */
    snprintf(run, sizeof run, "%s/run_d", tmp);
    snprintf(cmd, sizeof cmd,
             "%s train --data-path %s --init-from %s %s --moe-router-bias-update-rate 0.01 --save %s",
             tu_cli(), data, ddir, base, run);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "deepseek_v3 train: %s", out);
    check_metrics(run, 8, 3, 0);
    snprintf(cmd, sizeof cmd,
             "%s train --data-path %s --init-from %s %s --moe-router softmax-topk --moe-router-topk 1 --save "
             "%s/r2",
             tu_cli(), data, qdir, base, tmp);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "router override: %s", out);

    /* bad input: exit 2, one line naming the flag, nothing written */
    tu_watch(tmp);
    struct {
        const char *what, *flags, *needle, *model;
    } cases[] = {
        {"experts not divisible by ep", "--expert-model-parallel-size 3", "--expert-model-parallel-size",
         qdir},
        {"top-k > experts", "--moe-router-topk 9", "--moe-router-topk", qdir},
        {"top-k > experts of the kept groups", "--moe-router-topk 5", "--moe-router-topk", ddir},
        {"capacity factor 0", "--moe-capacity-factor 0", "--moe-capacity-factor", qdir},
        {"capacity factor < 0", "--moe-capacity-factor -1.5", "--moe-capacity-factor", ddir},
        {"unknown router", "--moe-router top2", "--moe-router", qdir},
        {"num-experts mismatch", "--num-experts 6", "--num-experts", qdir},
        {"negative aux coefficient", "--moe-aux-loss-coeff -1", "--moe-aux-loss-coeff", qdir},
        {"bias update without a bias", "--moe-router-bias-update-rate 0.1", "--moe-router-bias-update-rate",
         qdir},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(flags, sizeof flags, "%s %s --save %s/bad%zu", base, cases[i].flags, tmp, i);
        snprintf(cmd, sizeof cmd, "%s train --data-path %s --init-from %s %s", tu_cli(), data, cases[i].model,
                 flags);
        bad(cases[i].what, cases[i].needle, tu_run(cmd, out, sizeof out));
    }
    /* MoE flags on a dense (fresh GPT-2) model; top-k > --num-experts and --ep with --num-experts alone */
    snprintf(cmd, sizeof cmd, "%s train --data-path %s %s --moe-aux-loss-coeff 0.1 --save %s/bad_dense",
             tu_cli(), data, base, tmp);
    bad("moe flag on a dense model", "--moe-", tu_run(cmd, out, sizeof out));
    snprintf(cmd, sizeof cmd,
             "%s train --data-path %s %s --num-experts 4 --moe-router-topk 5 --save %s/bad_topk", tu_cli(),
             data, base, tmp);
    bad("top-k > --num-experts", "--moe-router-topk", tu_run(cmd, out, sizeof out));
    snprintf(cmd, sizeof cmd, "%s train --data-path %s %s --num-experts 6 --ep 4 --save %s/bad_ep", tu_cli(),
             data, base, tmp);
    bad("--num-experts not divisible by --ep", "--expert-model-parallel-size", tu_run(cmd, out, sizeof out));
    return tu_finish("test_moe_cli");
}
