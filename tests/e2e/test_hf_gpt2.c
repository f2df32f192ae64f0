/* GPT-2 from/to Hugging Face (fixture: scripts/gen_hf_gpt2.py, transformers GPT2LMHeadModel):
 * imported weights give transformers' logits (max|d| <= 1e-4); export writes the same tensors back
 * (byte-identical) and re-imports bitwise; `suanli convert` both ways; bad config/tensors -> clear errors. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "suanli/device.h"
#include "suanli/hf_gpt2.h"
#include "suanli/model_io.h"
#include "suanli/safetensors.h"
#include "testutil.h"

#define FIX SL_SOURCE_DIR "/tests/fixtures/hf_gpt2"

static char out[1 << 15];

/* config.json[key] of dir as a number (NAN when absent or not a number) */
static double cfg_num(const char *dir, const char *key) {
    char p[1024], *t = NULL;
    size_t n;
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (sl_file_read_all(p, &t, &n) != SL_OK) return NAN;
    cJSON *r = cJSON_ParseWithLength(t, n);
    free(t);
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r, key);
    double v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    cJSON_Delete(r);
    return v;
}

/* set config.json[key] of dir to the JSON text value, or delete it (value NULL) */
static void set_cfg(const char *dir, const char *key, const char *value) {
    char p[1024], *t = NULL;
    size_t n;
    snprintf(p, sizeof p, "%s/config.json", dir);
    TU_CHECK(sl_file_read_all(p, &t, &n) == SL_OK, "read %s", p);
    cJSON *r = cJSON_ParseWithLength(t, n);
    free(t);
    cJSON_DeleteItemFromObjectCaseSensitive(r, key);
    if (value) cJSON_AddItemToObject(r, key, cJSON_Parse(value));
    char *text = cJSON_Print(r);
    TU_CHECK(sl_file_write_atomic(p, text, strlen(text)) == SL_OK, "write %s", p);
    free(text);
    cJSON_Delete(r);
}

/* DIR/tk_s (convert --to suanli of the fixture: bos 1, eos 2, dropouts 0.1): a config.json without the
 * fields (as written before) still converts, without them; an eos list goes through; a field of the wrong
 * type or range is refused naming it, exit 2, nothing written */
static void test_suanli_config_fields(const char *dir) {
    char s[700], cmd[4096], o[800];
    snprintf(s, sizeof s, "%s/tk_s", dir);
    snprintf(o, sizeof o, "%s/tk_o", dir);
    const char *keys[] = {"bos_token_id", "eos_token_id", "attn_pdrop", "resid_pdrop", "embd_pdrop"};
    for (int i = 0; i < 5; i++) set_cfg(s, keys[i], NULL);
    snprintf(cmd, sizeof cmd, "%s convert --from suanli --to hf-gpt2 --input %s --output %s", tu_cli(), s, o);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "older suanli config.json converts: %s", out);
    TU_CHECK(isnan(cfg_num(o, "bos_token_id")) && isnan(cfg_num(o, "attn_pdrop")),
             "without the fields: no bos, GPT2Config's default dropouts");
    set_cfg(s, "eos_token_id", "[2, 7]");
    set_cfg(s, "attn_pdrop", "0.25");
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "eos list: %s", out);
    char p[900], *t = NULL;
    size_t n;
    snprintf(p, sizeof p, "%s/config.json", o);
    cJSON *r = sl_file_read_all(p, &t, &n) == SL_OK ? cJSON_ParseWithLength(t, n) : NULL;
    free(t);
    const cJSON *e = cJSON_GetObjectItem(r, "eos_token_id");
    TU_CHECK(cJSON_GetArraySize(e) == 2 && cJSON_GetArrayItem(e, 1)->valueint == 7 &&
                 cfg_num(o, "attn_pdrop") == 0.25,
             "eos [2, 7] and attn_pdrop 0.25 carried");
    cJSON_Delete(r);
    const char *bad[][3] = {{"attn_pdrop", "\"0.1\"", "'attn_pdrop' must be a number in [0, 1)"},
                            {"embd_pdrop", "1.5", "'embd_pdrop' must be a number in [0, 1)"},
                            {"bos_token_id", "-3", "'bos_token_id' must be a token id"},
                            {"eos_token_id", "[2, 1e30]", "'eos_token_id' must hold at most 8 token ids"},
                            {"eos_token_id", "\"2\"", "'eos_token_id' must be a token id or a list"}};
    for (int i = 0; i < 5; i++) {
        set_cfg(s, bad[i][0], bad[i][1]);
        snprintf(cmd, sizeof cmd, "%s convert --from suanli --to hf-gpt2 --input %s --output %s/never",
                 tu_cli(), s, dir);
        int rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 2 && strstr(out, "tk_s/config.json: field ") && strstr(out, bad[i][2]) &&
                     strchr(out, '\n') == out + strlen(out) - 1,
                 "%s %s: rc %d %s", bad[i][0], bad[i][1], rc, out);
        snprintf(p, sizeof p, "%s/never", dir);
        TU_CHECK(access(p, F_OK) != 0, "%s %s: the output dir was made", bad[i][0], bad[i][1]);
        set_cfg(s, bad[i][0], NULL);
    }
}

/* the GPT-2 fixture with a tokenizer.json (dropouts 0.1, bos 1, eos 2): (1) convert --from/--to carried
 * no tokenizer.json, so the converted dir could not encode a --prompt ("tokenizer.json: cannot open");
 * (2) its config.json, as convert --model and train --init-from --save write it, lost bos/eos and wrote
 * the dropouts as 0 */
static void test_tokenizer_and_config(const char *dir) {
    char g[700], h[700], cmd[4096], a[1024], b[1024];
    snprintf(g, sizeof g, "%s/tk", dir);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && cp %s/tests/fixtures/hf/gpt2/* %s/tests/fixtures/hf/llama/tokenizer.json %s/", g,
             SL_SOURCE_DIR, SL_SOURCE_DIR, g);
    TU_CHECK(system(cmd) == 0, "gpt2 dir with a tokenizer");
    snprintf(
        cmd, sizeof cmd,
        "%s convert --from hf-gpt2 --to suanli --input %s --output %s/tk_s && %s convert --from suanli --to "
        "hf-gpt2 --input %s/tk_s --output %s/tk_h",
        tu_cli(), g, dir, tu_cli(), dir, dir);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "convert with a tokenizer: %s", out);
    snprintf(a, sizeof a, "%s/tokenizer.json", g);
    snprintf(h, sizeof h, "%s/tk_h", dir);
    snprintf(b, sizeof b, "%s/tokenizer.json", h);
    TU_CHECK(tu_same_file(a, b), "convert --from/--to: tokenizer.json carried both ways");
    snprintf(cmd, sizeof cmd,
             "%s generate --load %s/tk_s --prompt 'the quick' --max-new-tokens 4 --temperature 0 2>&1",
             tu_cli(), dir);
    int rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0 && !strncmp(out, "the quick", 9), "generate --load of the converted dir: rc %d %s", rc,
             out);
    char ids[2][4096];
    for (int k = 0; k < 2; k++) {
        snprintf(
            cmd, sizeof cmd,
            "%s generate --model %s --prompt 'the quick' --max-new-tokens 6 --temperature 0 --ignore-eos "
            "--print-ids 2>/dev/null",
            tu_cli(), k ? h : g);
        rc = tu_run(cmd, ids[k], sizeof ids[k]);
        TU_CHECK(rc == 0 && strstr(ids[k], "\"ids\""), "generate --model --prompt: rc %d %s", rc, ids[k]);
    }
    const char *i0 = strstr(ids[0], "{\"prompt_ids\""), *i1 = strstr(ids[1], "{\"prompt_ids\"");
    TU_CHECK(i0 && i1 && !strcmp(i0, i1), "converted back: the same greedy ids: %s vs %s", ids[0], ids[1]);
    /* convert --model: config.json keeps bos/eos and the dropouts */
    snprintf(cmd, sizeof cmd, "%s convert --model %s --output %s/tk_m", tu_cli(), g, dir);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "convert --model gpt2: %s", out);
    /* train --init-from + --save writes the same config.json */
    snprintf(
        cmd, sizeof cmd,
        "for i in $(seq 60); do echo \"the quick brown fox $i jumps over the lazy dog.\"; done > %s/c.txt && "
        "%s data prepare --input %s/c.txt --output-prefix %s/data --tokenizer-file %s/tokenizer.json && "
        "%s train --data-path %s/data --init-from %s --seq-length 16 --micro-batch-size 2 --train-iters 1 "
        "--eval-iters 1 --threads 1 --save %s/tk_t",
        dir, tu_cli(), dir, dir, g, tu_cli(), dir, g, dir);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0, "train --init-from gpt2 --save: rc %d %s", rc, out);
    /* convert --to suanli, then --to hf-gpt2: suanli's config.json had no fields for them (lost) */
    const char *outs[] = {"tk_m", "tk_t", "tk_s", "tk_h"};
    for (int k = 0; k < 4; k++) {
        snprintf(a, sizeof a, "%s/%s", dir, outs[k]);
        TU_CHECK(cfg_num(a, "bos_token_id") == 1 && cfg_num(a, "eos_token_id") == 2, "%s: bos %g eos %g",
                 outs[k], cfg_num(a, "bos_token_id"), cfg_num(a, "eos_token_id"));
        TU_CHECK(cfg_num(a, "attn_pdrop") == 0.1 && cfg_num(a, "resid_pdrop") == 0.1 &&
                     cfg_num(a, "embd_pdrop") == 0.1,
                 "%s: dropouts %g %g %g, want 0.1", outs[k], cfg_num(a, "attn_pdrop"),
                 cfg_num(a, "resid_pdrop"), cfg_num(a, "embd_pdrop"));
    }
    test_suanli_config_fields(dir);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

int main(void) {
    sl_threads_set(2);
    sl_model *m;
    TU_CHECK(sl_hf_gpt2_import(FIX, &m) == SL_OK, "import: %s", sl_errmsg());
    sl_safetensors *ref;
    TU_CHECK(sl_safetensors_open(FIX "/reference.safetensors", &ref) == SL_OK, "reference: %s", sl_errmsg());
    const sl_st_tensor *ids = sl_safetensors_find(ref, "ids"), *lg = sl_safetensors_find(ref, "logits");
    int64_t B = ids->shape[0], T = ids->shape[1];
    sl_tensor *x = sl_new_tensor_2d(m->ctx, SL_I32, B, T);
    int32_t *idv = malloc(ids->nbytes);
    memcpy(idv, ids->data, ids->nbytes);
    sl_tensor_bind(x, idv);
    sl_tensor *logits;
    sl_gpt2_build(m, x, NULL, &logits);
    sl_graph *g = sl_graph_new(m->ctx);
    sl_graph_build_forward(g, logits);
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK, "plan");
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "forward: %s", sl_errmsg());
    float *reff = malloc(lg->nbytes);
    memcpy(reff, lg->data, lg->nbytes);
    double md = 0;
    for (size_t i = 0; i < lg->nbytes / 4; i++) {
        double d = fabs(((float *)logits->data)[i] - reff[i]);
        if (d > md) md = d;
    }
    printf("logits vs transformers: max|d| = %.3g\n", md);
    TU_CHECK(md <= 1e-4, "logits max|d| %.3g", md);
    sl_graph_free(g);

    /* export -> identical tensors; re-import -> identical parameters */
    const char *dir = tu_tmpdir("hfgpt2");
    char exp[600], p1[800];
    snprintf(exp, sizeof exp, "%s/export", dir);
    TU_CHECK(sl_hf_gpt2_export(m, exp) == SL_OK, "export: %s", sl_errmsg());
    sl_safetensors *a, *b;
    snprintf(p1, sizeof p1, "%s/model.safetensors", exp);
    TU_CHECK(sl_safetensors_open(FIX "/model.safetensors", &a) == SL_OK &&
                 sl_safetensors_open(p1, &b) == SL_OK,
             "open");
    int same = 0;
    for (int i = 0; i < sl_safetensors_count(a); i++) {
        const sl_st_tensor *ta = sl_safetensors_get(a, i), *tb = sl_safetensors_find(b, ta->name);
        if (!tb) continue; /* e.g. attention-mask buffers in old checkpoints */
        TU_CHECK(ta->nbytes == tb->nbytes && memcmp(ta->data, tb->data, ta->nbytes) == 0 &&
                     ta->ndim == tb->ndim && ta->shape[0] == tb->shape[0],
                 "exported %s differs", ta->name);
        same++;
    }
    TU_CHECK(same == m->n_params, "every parameter exported (%d of %d)", same, m->n_params);
    sl_safetensors_close(a);
    sl_safetensors_close(b);
    sl_model *m2;
    TU_CHECK(sl_hf_gpt2_import(exp, &m2) == SL_OK, "re-import: %s", sl_errmsg());
    TU_CHECK(memcmp(m2->params_mem, m->params_mem, sizeof(float) * (size_t)m->numel) == 0,
             "round trip bitwise");
    sl_model_free(m2);

    /* CLI both ways */
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s convert --from hf-gpt2 --to suanli --input %s --output %s/s && %s convert --from suanli "
             "--to hf-gpt2 --input %s/s --output %s/h && cmp %s/h/model.safetensors %s/model.safetensors",
             tu_cli(), FIX, dir, tu_cli(), dir, dir, dir, exp);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "convert CLI round trip: %s", out);

    /* the output is the input (another spelling of it): refused, nothing replaced */
    {
        char cp[800], *before = NULL, *after = NULL;
        size_t nb = 0, na = 0;
        snprintf(cp, sizeof cp, "%s/s/config.json", dir);
        TU_CHECK(sl_file_read_all(cp, &before, &nb) == SL_OK, "read %s", cp);
        snprintf(cmd, sizeof cmd, "%s convert --from suanli --to hf-gpt2 --input %s/s --output %s/s/.",
                 tu_cli(), dir, dir);
        TU_CHECK(tu_run(cmd, out, sizeof out) == 2 && strstr(out, "--input directory"),
                 "output is the input: %s", out);
        TU_CHECK(sl_file_read_all(cp, &after, &na) == SL_OK && na == nb && !memcmp(before, after, nb),
                 "output is the input: %s was replaced", cp);
        free(before), free(after);
    }

    /* bad input */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/bad", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/model.safetensors %s/", bad, FIX, bad);
    TU_CHECK(system(cmd) == 0, "copy");
    snprintf(p1, sizeof p1, "%s/config.json", bad);
    write_file(p1, "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 48, \"vocab_size\": 97, "
                   "\"n_positions\": 32}");
    sl_model *mb = NULL;
    TU_CHECK(sl_hf_gpt2_import(bad, &mb) == SL_ERR_FORMAT && strstr(sl_errmsg(), "'n_head'"),
             "missing field: %s", sl_errmsg());
    write_file(p1, "{\"model_type\": \"llama\"}");
    TU_CHECK(sl_hf_gpt2_import(bad, &mb) != SL_OK && strstr(sl_errmsg(), "config.json"), "arch: %s",
             sl_errmsg());
    write_file(
        p1, "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 4, \"n_embd\": 48, \"vocab_size\": 97, "
            "\"n_positions\": 32, \"activation_function\": \"relu\"}");
    TU_CHECK(sl_hf_gpt2_import(bad, &mb) == SL_ERR_UNSUPPORTED && strstr(sl_errmsg(), "activation_function"),
             "act: %s", sl_errmsg());
    write_file(p1, "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 4, \"n_embd\": 48, "
                   "\"vocab_size\": 98, \"n_positions\": 32}");
    TU_CHECK(sl_hf_gpt2_import(bad, &mb) == SL_ERR_FORMAT && strstr(sl_errmsg(), "wte.weight"),
             "shape mismatch names the tensor: %s", sl_errmsg());
    write_file(p1, "{\"model_type\": \"gpt2\", \"n_layer\": 3, \"n_head\": 4, \"n_embd\": 48, "
                   "\"vocab_size\": 97, \"n_positions\": 32}");
    TU_CHECK(sl_hf_gpt2_import(bad, &mb) == SL_ERR_FORMAT && strstr(sl_errmsg(), "h.2."),
             "missing tensor: %s", sl_errmsg());
    snprintf(cmd, sizeof cmd, "%s convert --from hf-gpt2 --to suanli --input %s --output %s/never", tu_cli(),
             bad, dir);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 2 && strstr(out, "h.2."), "CLI error: %s", out);
    /* a write that fails (past the file size limit, as on a full disk) left the new --output dir behind */
    snprintf(cmd, sizeof cmd,
             "trap '' XFSZ; ulimit -f 1; %s convert --from hf-gpt2 --to suanli --input %s --output "
             "%s/nospace 2>&1; "
             "test -e %s/nospace && echo LEFT",
             tu_cli(), FIX, dir, dir);
    TU_CHECK(tu_run(cmd, out, sizeof out) != 0 && strstr(out, "nospace/model.safetensors") &&
                 !strstr(out, "LEFT"),
             "failed convert: %s", out);
    /* --dtype bf16 of a GPT-2 exited 1 (as a failed write) where other bad requests exit 2 */
    {
        char nv[800];
        snprintf(nv, sizeof nv, "%s/never", dir);
        snprintf(cmd, sizeof cmd, "%s convert --model %s --output %s --dtype bf16", tu_cli(), FIX, nv);
        int rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 2 && strstr(out, "--dtype bf16") && strchr(out, '\n') == out + strlen(out) - 1 &&
                     access(nv, F_OK) != 0,
                 "convert --model gpt2 --dtype bf16: %d: %s", rc, out);
    }
    /* a missing input dir exited 1 (an I/O error, as a failed write), where --model's exits 2 */
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "%s convert --from %s --input %s/nothing --output %s/never", tu_cli(),
                 k ? "suanli --to hf-gpt2" : "hf-gpt2 --to suanli", dir, dir);
        int rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 2 && strstr(out, "nothing/config.json") && strchr(out, '\n') == out + strlen(out) - 1,
                 "missing --input: %d: %s", rc, out);
    }
    test_tokenizer_and_config(dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    TU_CHECK(system(cmd) == 0, "cleanup");
    free(idv);
    free(reff);
    sl_safetensors_close(ref);
    sl_model_free(m);
    return tu_finish("test_hf_gpt2");
}
