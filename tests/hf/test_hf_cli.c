/* `suanli generate --model HF_DIR`: greedy continuation of a text prompt (tokenizer.json + sharded
 * safetensors) identical to transformers, sampling flags, stop tokens, and every bad-input path:
 * missing/inconsistent config fields, unsupported architectures, shape mismatches, missing tensors,
 * truncated safetensors, headers pointing outside the file, huge header lengths, broken shard indexes.
 * Each bad input must exit 2 with one line naming the field or tensor. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "suanli/base.h"
#include "suanli/safetensors.h"
#include "testutil.h"

static char out[1 << 16];

static int one_line(void) {
    size_t n = strlen(out);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += out[i] == '\n';
    return lines == 1 && n > 0 && out[n - 1] == '\n';
}

static int gen(const char *dir, const char *extra) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --prompt-ids 5,6,7 --max-new-tokens 4 --temperature 0 %s", tu_cli(), dir,
             extra);
    return tu_run(cmd, out, sizeof out);
}

/* exit 2, one line naming the problem, and nothing written under the watched test dir (tu_watch) */
static void bad(const char *what, const char *needle, int rc) {
    TU_CHECK(rc == 2, "%s: exit %d (want 2); output: %s", what, rc, out);
    TU_CHECK(tu_unchanged(), "%s: the run changed the model dir", what);
    TU_CHECK(one_line(), "%s: want one line, got: %s", what, out);
    TU_CHECK(strstr(out, needle) != NULL, "%s: message lacks '%s': %s", what, needle, out);
}

/* exit 0, a generation, and the warning `needle` exactly once (Note [Token ids below vocab_size]) */
static void warned(const char *what, const char *needle, int rc) {
    const char *w = strstr(out, needle);
    TU_CHECK(rc == 0 && strstr(out, "\"ids\""), "%s: exit %d (want 0, ids); output: %s", what, rc, out);
    TU_CHECK(w && !strstr(w + 1, needle), "%s: want the warning '%s' once: %s", what, needle, out);
}

static void copy_fixture(const char *name, const char *dst) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s/tests/fixtures/hf/%s %s", dst, SL_SOURCE_DIR, name, dst);
    TU_CHECK(tu_run(cmd, NULL, 0) == 0, "copy %s", name);
}

/* set config.json[key] = value (JSON text), or delete it when value == NULL */
static void set_cfg(const char *dir, const char *key, const char *value) {
    char path[1024], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_CHECK(sl_file_read_all(path, &text, &len) == SL_OK, "read config");
    cJSON *r = cJSON_ParseWithLength(text, len);
    free(text);
    cJSON_DeleteItemFromObjectCaseSensitive(r, key);
    if (value) cJSON_AddItemToObject(r, key, cJSON_Parse(value));
    char *s = cJSON_Print(r);
    FILE *f = fopen(path, "w");
    fputs(s, f);
    fclose(f);
    free(s);
    cJSON_Delete(r);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

/* a safetensors file with the given header and `data` bytes of payload */
static void write_st(const char *path, const char *header, uint64_t hlen_override, size_t data) {
    uint64_t hl = hlen_override ? hlen_override : strlen(header);
    FILE *f = fopen(path, "wb");
    fwrite(&hl, 8, 1, f);
    fputs(header, f);
    for (size_t i = 0; i < data; i++) fputc(0, f);
    fclose(f);
}

/* rewrite the safetensors file `path` with its tensors and n extra F32 [2] tensors named extra[] */
static void add_tensors(const char *path, const char *const *extra, int n) {
    sl_safetensors *st;
    TU_CHECK(sl_safetensors_open(path, &st) == SL_OK, "open %s: %s", path, sl_errmsg());
    int k = sl_safetensors_count(st);
    sl_st_tensor ts[256];
    static const float two[2] = {1.5f, -2.5f};
    TU_CHECK(k + n <= 256, "%s: %d tensors", path, k);
    for (int i = 0; i < k && i < 256; i++) ts[i] = *sl_safetensors_get(st, i);
    for (int i = 0; i < n && k + i < 256; i++)
        ts[k + i] = (sl_st_tensor){
            .name = extra[i], .dtype = "F32", .ndim = 1, .shape = {2}, .data = two, .nbytes = sizeof two};
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.new", path); /* the source stays mapped while it is written */
    TU_CHECK(sl_safetensors_write(tmp, ts, k + n < 256 ? k + n : 256, NULL) == SL_OK, "write %s: %s", tmp,
             sl_errmsg());
    sl_safetensors_close(st);
    TU_CHECK(rename(tmp, path) == 0, "rename %s", tmp);
}

/* tensors in the files that the model does not use were ignored in silence (transformers warns "Some weights
 * of the model checkpoint were not used"): one warning line with the count and the first three names; known
 * buffers (rotary inv_freq, GPT-2's attention masks, a tied lm_head) pass silently; the model still loads */
static void test_unused_tensors(void) {
    const char *tmp = tu_tmpdir("hfunused");
    char d[600], f[700];
    const char *harmless[] = {"model.layers.0.self_attn.rotary_emb.inv_freq",
                              "model.layers.1.self_attn.rotary_emb.inv_freq"};
    snprintf(d, sizeof d, "%s/qwen2", tmp);
    copy_fixture("qwen2", d);
    snprintf(f, sizeof f, "%s/model.safetensors", d);
    add_tensors(f, harmless, 2);
    TU_CHECK(gen(d, "") == 0 && !strstr(out, "warn"), "known buffers only: %s", out);
    const char *extra[] = {"model.layers.0.mlp.extra_proj.weight", "score.weight", "model.pooler.weight",
                           "model.pooler.bias"};
    add_tensors(f, extra, 4);
    TU_CHECK(gen(d, "") == 0, "qwen2 with 4 unused tensors loads: %s", out);
    char *w = strstr(out, "[suanli warn]"), *e = w ? strchr(w, '\n') : NULL;
    if (e) *e = 0;
    TU_CHECK(
        w &&
            strstr(w, "/qwen2: 4 tensors in the checkpoint not used by the qwen2 model: "
                      "'model.layers.0.mlp.extra_proj.weight', 'score.weight', 'model.pooler.weight', ...") &&
            !strstr(w, "inv_freq"),
        "unused warning: %s", w ? w : out);
    /* a sharded checkpoint: a tensor in a shard that weight_map does not list is unused too */
    snprintf(d, sizeof d, "%s/llama", tmp);
    copy_fixture("llama", d);
    snprintf(f, sizeof f, "%s/model-00002-of-00004.safetensors", d);
    add_tensors(f, extra + 1, 1);
    TU_CHECK(gen(d, "") == 0 &&
                 strstr(out, "1 tensor in the checkpoint not used by the llama model: 'score.weight'\n"),
             "sharded: %s", out);
    /* GPT-2: the causal-mask buffers and the tied head are known; one extra tensor is named */
    const char *g2[] = {"h.0.attn.bias", "h.0.attn.masked_bias", "lm_head.weight",
                        "transformer.h.0.ln_3.weight"};
    snprintf(d, sizeof d, "%s/gpt2", tmp);
    copy_fixture("gpt2", d);
    snprintf(f, sizeof f, "%s/model.safetensors", d);
    add_tensors(f, g2, 4);
    TU_CHECK(gen(d, "") == 0 && strstr(out, "1 tensor in the checkpoint not used by the gpt2 model: "
                                            "'transformer.h.0.ln_3.weight'\n"),
             "gpt2: %s", out);
}

static void test_greedy_text(void) {
    char path[1024], *text, cmd[4096];
    size_t len;
    snprintf(path, sizeof path, "%s/tests/fixtures/hf/llama/prompt.json", SL_SOURCE_DIR);
    TU_CHECK(sl_file_read_all(path, &text, &len) == SL_OK, "read prompt.json");
    cJSON *r = cJSON_ParseWithLength(text, len);
    free(text);
    snprintf(
        cmd, sizeof cmd,
        "%s generate --model %s/tests/fixtures/hf/llama --prompt '%s' --max-new-tokens 32 --temperature 0 "
        "--ignore-eos --print-ids",
        tu_cli(), SL_SOURCE_DIR, cJSON_GetObjectItem(r, "prompt")->valuestring);
    int rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0, "generate: exit %d: %s", rc, out);
    char *js = strstr(out, "{\"prompt_ids\"");
    cJSON *got = js ? cJSON_Parse(js) : NULL;
    TU_CHECK(got != NULL, "no JSON ids in output: %s", out);
    if (got) {
        char *a = cJSON_PrintUnformatted(cJSON_GetObjectItem(got, "prompt_ids")),
             *b = cJSON_PrintUnformatted(cJSON_GetObjectItem(r, "ids"));
        char *c = cJSON_PrintUnformatted(cJSON_GetObjectItem(got, "ids")),
             *d = cJSON_PrintUnformatted(cJSON_GetObjectItem(r, "greedy"));
        TU_CHECK(!strcmp(a, b), "prompt ids (tokenizer.json + BOS template): got %s want %s", a, b);
        TU_CHECK(!strcmp(c, d), "greedy 32 tokens: got %s want %s", c, d);
        printf("CLI greedy continuation of \"%s\": %s\n", cJSON_GetObjectItem(r, "prompt")->valuestring,
               !strcmp(c, d) ? "identical to transformers" : "DIFFERENT");
        free(a), free(b), free(c), free(d);
        cJSON_Delete(got);
    }
    TU_CHECK(strstr(out, "tokens/s") != NULL, "tokens/s report");
    /* a tiny temperature is greedy: logit / 1e-39 overflowed a float to inf, inf - inf = nan in the
     * softmax, and the sampler fell back to the least likely of the candidates (ids near V) */
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s/tests/fixtures/hf/llama --prompt '%s' --max-new-tokens 32 --temperature "
             "1e-39 "
             "--ignore-eos --print-ids",
             tu_cli(), SL_SOURCE_DIR, cJSON_GetObjectItem(r, "prompt")->valuestring);
    rc = tu_run(cmd, out, sizeof out);
    js = strstr(out, "{\"prompt_ids\"");
    got = js ? cJSON_Parse(js) : NULL;
    TU_CHECK(rc == 0 && got != NULL, "generate --temperature 1e-39: exit %d: %s", rc, out);
    if (got) {
        char *c = cJSON_PrintUnformatted(cJSON_GetObjectItem(got, "ids")),
             *d = cJSON_PrintUnformatted(cJSON_GetObjectItem(r, "greedy"));
        TU_CHECK(!strcmp(c, d), "--temperature 1e-39: got %s want the greedy %s", c, d);
        free(c), free(d);
        cJSON_Delete(got);
    }
    /* --prompt-ids loaded no tokenizer: the generated text was not printed at all (an empty line), and
     * token names in --prompt-ids / --stop were refused. The text of the prompt's ids must be what --prompt
     * prints after the prompt; a name is the tokenizer's id; without a tokenizer.json the ids are printed */
    {
        static char text[1 << 16];
        const char *p = cJSON_GetObjectItem(r, "prompt")->valuestring;
        char *idl = cJSON_PrintUnformatted(cJSON_GetObjectItem(r, "ids")); /* "[a,b,...]" */
        idl[strlen(idl) - 1] = 0;
        snprintf(cmd, sizeof cmd,
                 "{ %s generate --model %s/tests/fixtures/hf/llama --prompt '%s' --max-new-tokens 32 "
                 "--temperature 0 --ignore-eos 2>/dev/null; }",
                 tu_cli(), SL_SOURCE_DIR, p);
        rc = tu_run(cmd, text, sizeof text);
        TU_CHECK(rc == 0 && !strncmp(text, p, strlen(p)), "--prompt text: %s", text);
        snprintf(cmd, sizeof cmd,
                 "{ %s generate --model %s/tests/fixtures/hf/llama --prompt-ids %s --max-new-tokens 32 "
                 "--temperature 0 --ignore-eos 2>/dev/null; }",
                 tu_cli(), SL_SOURCE_DIR, idl + 1);
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 0 && strlen(out) > 1 && !strcmp(out, text + strlen(p)),
                 "--prompt-ids text: got '%s' want '%s'", out, text + strlen(p));
        free(idl);
        snprintf(cmd, sizeof cmd,
                 "%s generate --model %s/tests/fixtures/hf/llama --prompt-ids '<|begin_of_text|>,5,9' --stop "
                 "'<|end_of_text|>' --max-new-tokens 2 --print-ids",
                 tu_cli(), SL_SOURCE_DIR);
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 0 && strstr(out, "\"prompt_ids\": [0, 5, 9]"), "token names in --prompt-ids: %s", out);
        snprintf(cmd, sizeof cmd,
                 "{ %s generate --model %s/tests/fixtures/hf/qwen2 --prompt-ids 5,9 --max-new-tokens 3 "
                 "--temperature 0 2>/dev/null; }",
                 tu_cli(), SL_SOURCE_DIR);
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 0 && strstr(out, "\"prompt_ids\": [5, 9], \"ids\": ["),
                 "--prompt-ids without a tokenizer prints ids: %s", out);
    }
    /* text mode, sampling, a stop token that is generated greedily at step 3 -> exactly 3 tokens */
    int third = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "greedy"), 2)->valueint;
    snprintf(
        cmd, sizeof cmd,
        "%s generate --model %s/tests/fixtures/hf/llama --prompt '%s' --max-new-tokens 32 --temperature 0 "
        "--stop %d --print-ids",
        tu_cli(), SL_SOURCE_DIR, cJSON_GetObjectItem(r, "prompt")->valuestring, third);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0 && strstr(out, "stopped at a stop token") && strstr(out, "generation: 3 tokens"),
             "stop token: %s", out);
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s/tests/fixtures/hf/qwen2 --prompt-ids 1,2,3 --max-new-tokens 8 "
             "--temperature 0.7 --top-k 20 --top-p 0.9 --seed 7",
             tu_cli(), SL_SOURCE_DIR);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0, "sampling: exit %d: %s", rc, out);
    snprintf(
        cmd, sizeof cmd,
        "%s generate --model %s/tests/fixtures/hf/qwen2 --prompt-ids 1,2,3 --max-new-tokens 8 --dtype bf16",
        tu_cli(), SL_SOURCE_DIR);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0 && strstr(out, "memory-mapped") && strstr(out, "bf16 compute"), "bf16: exit %d: %s", rc,
             out);
    snprintf(cmd, sizeof cmd, "%s generate --model %s/tests/fixtures/hf/qwen2 --prompt-ids 1 --dtype f8",
             tu_cli(), SL_SOURCE_DIR);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 2 && one_line() && strstr(out, "--dtype"), "bad dtype: %s", out);
    cJSON_Delete(r);
}

static void greedy_ids(const char *dir, char *ids, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --prompt-ids 0,43,72,305,82 --max-new-tokens 16 --temperature 0 "
             "--ignore-eos --print-ids 2>/dev/null",
             tu_cli(), dir);
    int rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0, "generate %s: exit %d: %s", dir, rc, out);
    char *js = strstr(out, "\"ids\"");
    snprintf(ids, cap, "%s", js ? js : "none");
}

/* convert (f32, bf16), train --init-from (0 and 3 steps) + --save, convert back: a round trip */
static void test_round_trip(void) {
    const char *tmp = tu_tmpdir("hfrt");
    char src[1024], cmd[8192], a[4096], b[4096], d1[1100], d2[1100], data[1100], run[1100], back[1100],
        txt[1100];
    snprintf(src, sizeof src, "%s/tests/fixtures/hf/llama", SL_SOURCE_DIR);
    snprintf(d1, sizeof d1, "%s/f32", tmp);
    snprintf(d2, sizeof d2, "%s/bf16", tmp);
    greedy_ids(src, a, sizeof a);
    snprintf(cmd, sizeof cmd, "%s convert --model %s --output %s", tu_cli(), src, d1);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "convert f32: %s", out);
    greedy_ids(d1, b, sizeof b);
    TU_CHECK(!strcmp(a, b), "convert f32 round trip changes greedy ids: %s vs %s", a, b);
    { /* eos 2 in config.json and in generation_config.json was written back as [2, 2] */
        char cp[1200], *txt = NULL;
        size_t len;
        snprintf(cp, sizeof cp, "%s/config.json", d1);
        cJSON *c = sl_file_read_all(cp, &txt, &len) == SL_OK ? cJSON_ParseWithLength(txt, len) : NULL;
        const cJSON *e = cJSON_GetObjectItem(c, "eos_token_id");
        TU_CHECK(cJSON_IsNumber(e) && e->valueint == 2, "converted config.json eos_token_id: want 2");
        /* the float eps was written as the double 9.99999974737875e-06, not the fixture's 1e-05 */
        e = cJSON_GetObjectItem(c, "rms_norm_eps");
        TU_CHECK(cJSON_IsNumber(e) && e->valuedouble == 1e-5, "converted rms_norm_eps %.17g, want 1e-05",
                 cJSON_IsNumber(e) ? e->valuedouble : -1.0);
        cJSON_Delete(c);
        free(txt);
    }
    snprintf(cmd, sizeof cmd, "%s convert --model %s --output %s --dtype bf16", tu_cli(), src, d2);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0 && strstr(out, "bf16"), "convert bf16: %s", out);
    greedy_ids(d2, b, sizeof b);
    TU_CHECK(strcmp(b, "none") != 0, "bf16 copy generates");
    snprintf(cmd, sizeof cmd, "%s convert --model %s --output %s --dtype f16", tu_cli(), src, d2);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0 && strstr(out, "f16"), "convert f16: %s", out);
    greedy_ids(d2, b, sizeof b);
    TU_CHECK(strcmp(b, "none") != 0, "f16 copy generates");
    snprintf(cmd, sizeof cmd, "%s convert --model %s --output %s --dtype f8", tu_cli(), src, d2);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 2 && one_line() && strstr(out, "--dtype"), "bad dtype: %s", out);
    /* a write that fails (past the file size limit, as on a full disk) left the new --output dir behind */
    snprintf(
        cmd, sizeof cmd,
        "trap '' XFSZ; ulimit -f 1; %s convert --model %s --output %s/nospace 2>&1; test -e %s/nospace && "
        "echo LEFT",
        tu_cli(), src, tmp, tmp);
    TU_CHECK(tu_run(cmd, out, sizeof out) != 0 && strstr(out, "nospace/model.safetensors") &&
                 !strstr(out, "LEFT"),
             "failed convert: %s", out);
    /* into a directory holding a sharded model: the file written is what loads, not the old shards */
    snprintf(
        cmd, sizeof cmd,
        "cp -r %s %s/resave && %s convert --model %s --output %s/resave --dtype f16 && %s generate --model "
        "%s/resave --prompt-ids 0 --max-new-tokens 1 --temperature 0 2>&1",
        src, tmp, tu_cli(), d1, tmp, tu_cli(), tmp);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0 && strstr(out, "weights F16 on disk in 1 file(s)"),
             "convert over a sharded model: %s", out);
    snprintf(cmd, sizeof cmd, "%s convert --model %s --output %s/ --dtype bf16", tu_cli(), d1, d1);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 2 && one_line() && strstr(out, "--model directory"),
             "output is the input: %s", out);
    greedy_ids(d1, b, sizeof b);
    TU_CHECK(!strcmp(a, b), "a refused convert into its input changed it: %s vs %s", a, b);
    /* train --init-from */
    snprintf(txt, sizeof txt, "%s/corpus.txt", tmp);
    FILE *f = fopen(txt, "w");
    for (int i = 0; i < 200; i++) fprintf(f, "the quick brown fox %d jumps over the lazy dog. ", i);
    fclose(f);
    snprintf(data, sizeof data, "%s/data", tmp);
    /* tokenized with the model's own tokenizer: train --init-from refuses data of another tokenizer */
    snprintf(cmd, sizeof cmd, "%s data prepare --input %s --output-prefix %s/bytes", tu_cli(), txt, tmp);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "data prepare (bytes): %s", out);
    snprintf(cmd, sizeof cmd, "%s train --data-path %s/bytes --init-from %s --seq-length 16 --train-iters 1",
             tu_cli(), tmp, src);
    int brc = tu_run(cmd, out, sizeof out);
    TU_CHECK(brc == 2 && one_line() && strstr(out, "not tokenized with the model's tokenizer"),
             "init-from on byte-level data refused: rc %d %s", brc, out);
    snprintf(cmd, sizeof cmd,
             "%s data prepare --input %s --output-prefix %s --tokenizer-file %s/tokenizer.json", tu_cli(),
             txt, data, src);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "data prepare: %s", out);
    snprintf(run, sizeof run, "%s/run0", tmp);
    snprintf(cmd, sizeof cmd,
             "%s train --data-path %s --init-from %s --seq-length 16 --micro-batch-size 2 --train-iters 0 "
             "--eval-iters 1 --save %s",
             tu_cli(), data, src, run);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "train 0 steps: %s", out);
    greedy_ids(run, b, sizeof b);
    TU_CHECK(!strcmp(a, b), "train --init-from + --save (0 steps) changes greedy ids: %s vs %s", a, b);
    snprintf(run, sizeof run, "%s/run3", tmp);
    snprintf(cmd, sizeof cmd,
             "%s train --data-path %s --init-from %s --seq-length 16 --micro-batch-size 2 --train-iters 3 "
             "--eval-iters 1 --lr 3e-3 --save %s",
             tu_cli(), data, src, run);
    int rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0 && strstr(out, "llama L=2") && strstr(out, "step 3/3"), "train 3 steps: exit %d: %s", rc,
             out);
    /* --save into the --init-from dir replaced its config.json and weights (and dropped its shard index) */
    snprintf(cmd, sizeof cmd,
             "%s train --data-path %s --init-from %s --seq-length 16 --micro-batch-size 2 --train-iters 1 "
             "--eval-iters 1 --save %s/",
             tu_cli(), data, d1, d1);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 2 && one_line() && strstr(out, "is the --init-from directory"),
             "save into init-from: %d %s", rc, out);
    greedy_ids(d1, b, sizeof b);
    TU_CHECK(!strcmp(a, b), "a refused train --save into its --init-from changed it: %s vs %s", a, b);
    /* checkpoints of an HF-family model: killed at step 4 of 6 and resumed (the architecture comes from
     * --init-from, the state from the checkpoint) -> the same final weights as the uninterrupted run;
     * also DP=2 ZeRO-3 with a rank killed under `suanli run --max-restarts` */
    {
        char ra[1100], rb[1100], fa[1200], fb[1200];
        const char *common = "--seq-length 16 --micro-batch-size 2 --train-iters 6 --lr-decay-iters 6 "
                             "--eval-interval 0 --eval-iters 1 --lr 3e-3 --threads 1";
        snprintf(ra, sizeof ra, "%s/ck_base", tmp);
        snprintf(rb, sizeof rb, "%s/ck_kill", tmp);
        snprintf(cmd, sizeof cmd, "%s train --data-path %s --init-from %s %s --save %s", tu_cli(), data, src,
                 common, ra);
        TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "llama baseline: %s", out);
        snprintf(
            cmd, sizeof cmd,
            "env SUANLI_FAULT_KILL_AT_STEP=4 %s train --data-path %s --init-from %s %s --save %s --load %s "
            "--save-interval 2",
            tu_cli(), data, src, common, rb, rb);
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc != 0 && strstr(out, "killing myself"), "llama killed at step 4: rc %d %s", rc, out);
        snprintf(cmd, sizeof cmd,
                 "%s train --data-path %s --init-from %s %s --save %s --load %s --save-interval 2", tu_cli(),
                 data, src, common, rb, rb);
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 0 && strstr(out, "resumed from"), "llama resume: rc %d %s", rc, out);
        snprintf(fa, sizeof fa, "%s/model.safetensors", ra);
        snprintf(fb, sizeof fb, "%s/model.safetensors", rb);
        TU_CHECK(tu_same_file(fa, fb), "llama: resumed final weights bitwise equal to the uninterrupted run");
        /* resuming without --init-from names the fix */
        snprintf(cmd, sizeof cmd, "%s train --data-path %s %s --save %s --load %s", tu_cli(), data, common,
                 rb, rb);
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 2 && one_line() && strstr(out, "--init-from"), "llama ckpt without --init-from: %s",
                 out);
        /* DP=2, ZeRO-3 */
        snprintf(ra, sizeof ra, "%s/ck_dp_base", tmp);
        snprintf(rb, sizeof rb, "%s/ck_dp_kill", tmp);
        snprintf(cmd, sizeof cmd,
                 "env SUANLI_COMM_ALGO=direct SUANLI_COMM_TIMEOUT=60 %s run -n 2 -- %s train --data-path %s "
                 "--init-from %s %s --micro-batch-size 1 --zero-stage 3 --save %s",
                 tu_cli(), tu_cli(), data, src, common, ra);
        TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "llama dp2 zero3 baseline: %s", out);
        snprintf(
            cmd, sizeof cmd,
            "env SUANLI_COMM_ALGO=direct SUANLI_COMM_TIMEOUT=60 SUANLI_FAULT_KILL_AT_STEP=4 "
            "SUANLI_FAULT_RANK=1 "
            "%s run -n 2 --max-restarts 1 -- %s train --data-path %s --init-from %s %s --micro-batch-size 1 "
            "--zero-stage 3 --save %s --load %s --save-interval 2",
            tu_cli(), tu_cli(), data, src, common, rb, rb);
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 0 && strstr(out, "killing myself") && strstr(out, "resumed from"),
                 "llama dp2 zero3 kill + restart: rc %d %s", rc, out);
        snprintf(fa, sizeof fa, "%s/model.safetensors", ra);
        snprintf(fb, sizeof fb, "%s/model.safetensors", rb);
        TU_CHECK(tu_same_file(fa, fb),
                 "llama dp2 zero3: final weights after kill + restart bitwise identical");
    }
    snprintf(back, sizeof back, "%s/back", tmp);
    snprintf(cmd, sizeof cmd, "%s convert --model %s --output %s --dtype bf16", tu_cli(), run, back);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "convert trained: %s", out);
    greedy_ids(back, b, sizeof b);
    TU_CHECK(strcmp(b, "none") != 0, "trained + converted model generates");
    snprintf(cmd, sizeof cmd, "%s train --data-path %s --init-from %s --hidden-size 32 --train-iters 1",
             tu_cli(), data, src);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 2 && one_line() && strstr(out, "--hidden-size conflicts"), "init-from + arch flag: %s",
             out);
    snprintf(cmd, sizeof cmd, "%s train --data-path %s --init-from /nonexistent --train-iters 1", tu_cli(),
             data);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 2 && one_line() && strstr(out, "config.json"), "init-from missing dir: %s", out);
    printf("round trip (convert f32, train --init-from + save, convert bf16): checked\n");
}

/* a converted config.json keeps what was read: Qwen2-MoE's qkv_bias (dropped), Baichuan's model_max_length
 * (written as max_position_embeddings, which BaichuanConfig does not read) */
static void test_config_kept(void) {
    const char *tmp = tu_tmpdir("hfcfg");
    const char *names[] = {"qwen2_moe", "baichuan"};
    for (int k = 0; k < 2; k++) {
        char cmd[4096], p[1100], *txt = NULL;
        size_t len;
        snprintf(cmd, sizeof cmd, "%s convert --model %s/tests/fixtures/hf/%s --output %s/%s", tu_cli(),
                 SL_SOURCE_DIR, names[k], tmp, names[k]);
        TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "convert %s: %s", names[k], out);
        snprintf(p, sizeof p, "%s/%s/config.json", tmp, names[k]);
        cJSON *c = sl_file_read_all(p, &txt, &len) == SL_OK ? cJSON_ParseWithLength(txt, len) : NULL;
        free(txt);
        if (k == 0) {
            TU_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(c, "qkv_bias")), "qwen2_moe: qkv_bias true kept");
        } else {
            const cJSON *e = cJSON_GetObjectItem(c, "model_max_length");
            TU_CHECK(cJSON_IsNumber(e) && e->valueint == 128 &&
                         !cJSON_GetObjectItem(c, "max_position_embeddings"),
                     "baichuan: model_max_length 128 kept");
        }
        cJSON_Delete(c);
    }
}

/* the last generated token takes no position: prompt 120 + 9 new fits 128 positions (was refused); the
 * boundary run extends the run one token shorter, and its last token is what a prefill of all 128 positions
 * gives (the KV cache sized to the positions taken); one more is refused */
static void test_position_limit(void) {
    char cmd[8192], p[1024] = "", ids[3][4096];
    for (int i = 1; i <= 120; i++) snprintf(p + strlen(p), sizeof p - strlen(p), "%s%d", i > 1 ? "," : "", i);
    const int news[] = {8, 9};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd,
                 "%s generate --model %s/tests/fixtures/hf/qwen2 --prompt-ids %s --max-new-tokens %d "
                 "--temperature 0 --ignore-eos --print-ids 2>&1",
                 tu_cli(), SL_SOURCE_DIR, p, news[k]);
        int rc = tu_run(cmd, out, sizeof out);
        char *js = strstr(out, "\"ids\": [");
        TU_CHECK(rc == 0 && js, "prompt 120 + %d new on 128 positions: rc %d %s", news[k], rc, out);
        snprintf(ids[k], sizeof ids[k], "%s", js ? js + 7 : "");
    }
    /* "[a, ..., h]}" vs "[a, ..., h, i]}": the shorter run's ids are a prefix */
    size_t n8 = strlen(ids[0]) > 3 ? strlen(ids[0]) - 3 : 0;
    TU_CHECK(n8 > 0 && !strncmp(ids[0], ids[1], n8) && !strncmp(ids[1] + n8, ", ", 2),
             "boundary run extends the shorter one: %s vs %s", ids[0], ids[1]);
    /* the prompt + the 8 first generated tokens (128 positions), one new token: prefill only */
    char q[2048], *last = strrchr(ids[1], ',');
    snprintf(q, sizeof q, "%s,%.*s", p, (int)n8 - 1, ids[0] + 1);
    for (char *c = q; *c; c++)
        if (*c == ' ') memmove(c, c + 1, strlen(c));
    snprintf(
        cmd, sizeof cmd,
        "%s generate --model %s/tests/fixtures/hf/qwen2 --prompt-ids %s --max-new-tokens 1 --temperature 0 "
        "--ignore-eos --print-ids 2>&1",
        tu_cli(), SL_SOURCE_DIR, q);
    int rc = tu_run(cmd, out, sizeof out);
    char *js = strstr(out, "\"ids\": [");
    snprintf(ids[2], sizeof ids[2], "%s", js ? js + 8 : "");
    TU_CHECK(rc == 0 && last && atoi(ids[2]) == atoi(last + 1),
             "the boundary token (decoded at position 127) is the 128-token prefill's: %s vs %s", last, out);
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s/tests/fixtures/hf/qwen2 --prompt-ids %s --max-new-tokens 10 2>&1",
             tu_cli(), SL_SOURCE_DIR, p);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 2 && one_line() && strstr(out, "exceeds the model's 128 positions"),
             "120 + 10 refused: %s", out);
}

/* train --help: --init-from, --tp and --pp did not name GPT-2 though an HF GPT-2 trains from --init-from,
 * under TP and PP too */
static void test_train_help(void) {
    static char h[1 << 16];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s train --help", tu_cli());
    TU_CHECK(tu_run(cmd, h, sizeof h) == 0, "train --help");
    const char *flags[] = {"--init-from ", "--tensor-model-parallel-size ",
                           "--pipeline-model-parallel-size "};
    for (int k = 0; k < 3; k++) {
        char *l = strstr(h, flags[k]), *e = l ? strchr(l, '\n') : NULL;
        if (e) *e = 0;
        TU_CHECK(l && strstr(l, "GPT-2") && (k == 0 || strstr(l, "HF GPT-2")), "train --help %s: %s",
                 flags[k], l ? l : "missing");
        if (e) *e = '\n';
    }
}

/* bos / eos / pad ids in config.json and generation_config.json: malformed ones refused naming the field,
 * ones past vocab_size ignored with a warning (Note [Token ids below vocab_size]) */
static void test_token_ids(const char *td, const char *d) {
    char p[1024];
    /* token ids (Note [Token ids in config.json]): cJSON's valueint kept -1 and truncated 2.5; null is
     * transformers' "none" and stays accepted */
    copy_fixture("qwen2", d);
    set_cfg(d, "bos_token_id", "null");
    set_cfg(d, "eos_token_id", "null");
    TU_CHECK(gen(d, "") == 0, "bos/eos null: generates: %s", out);
    const char *ids[][3] = {
        {"bos_token_id", "-1",
         "config.json: field 'bos_token_id' must be a token id (an integer >= 0) or null"},
        {"bos_token_id", "1.5",
         "config.json: field 'bos_token_id' must be a token id (an integer >= 0) or null"},
        {"eos_token_id", "-2",
         "config.json: field 'eos_token_id' must be a token id (an integer >= 0), a list"},
        {"eos_token_id", "2.5",
         "config.json: field 'eos_token_id' must be a token id (an integer >= 0), a list"},
        {"eos_token_id", "[2, -7]", "config.json: field 'eos_token_id' must hold token ids (integers >= 0)"},
        {"eos_token_id", "[2, null]",
         "config.json: field 'eos_token_id' must hold token ids (integers >= 0)"},
        {"eos_token_id", "3e9",
         "config.json: field 'eos_token_id' must be a token id (an integer >= 0), a list"}};
    for (int i = 0; i < 7; i++) {
        copy_fixture("qwen2", d);
        set_cfg(d, ids[i][0], ids[i][1]);
        char what[96];
        snprintf(what, sizeof what, "%s %s", ids[i][0], ids[i][1]);
        bad(what, ids[i][2], gen(d, ""));
    }
    copy_fixture("qwen2", d);
    snprintf(p, sizeof p, "%s/generation_config.json", d);
    write_bytes(p, "{\"eos_token_id\": [-1]}", 22);
    bad("generation_config.json eos -1",
        "generation_config.json: field 'eos_token_id' must hold token ids (integers >= 0)", gen(d, ""));
    /* token ids at or past vocab_size (320 in the fixtures; Note [Token ids below vocab_size]): accepted
     * once without a word, then refused; transformers loads such configs (its tiny GPT-2s carry bos/eos
     * 50256), so now ignored with one warning each, and the generation runs */
    const char *big[][3] = {
        {"eos_token_id", "320",
         "config.json: field 'eos_token_id': token id 320 is not below vocab_size 320; ignored"},
        {"eos_token_id", "[2, 4000]",
         "config.json: field 'eos_token_id': token id 4000 is not below vocab_size 320; ignored"},
        {"bos_token_id", "320",
         "config.json: field 'bos_token_id': token id 320 is not below vocab_size 320; ignored"},
        {"pad_token_id", "1000000",
         "config.json: field 'pad_token_id': token id 1000000 is not below vocab_size 320; ignored"}};
    for (int i = 0; i < 4; i++) {
        copy_fixture("qwen2", d);
        set_cfg(d, big[i][0], big[i][1]);
        char what[96];
        snprintf(what, sizeof what, "%s %s", big[i][0], big[i][1]);
        warned(what, big[i][2], gen(d, "--print-ids"));
    }
    copy_fixture("qwen2", d);
    set_cfg(d, "eos_token_id", "[2, 319]");
    set_cfg(d, "pad_token_id", "-1"); /* "none" in some configs: pad_token_id is only bounded above */
    TU_CHECK(gen(d, "") == 0, "eos 319 (vocab_size 320), pad -1: generates: %s", out);
    /* what transformers writes for a tiny GPT-2 (GPT2Config's defaults): bos/eos 50256 past vocab_size 320;
     * generation_config.json removed, so no stop token is left: --max-new-tokens 6 gives 6 ids */
    copy_fixture("gpt2", d);
    set_cfg(d, "bos_token_id", "50256");
    set_cfg(d, "eos_token_id", "50256");
    snprintf(p, sizeof p, "%s/generation_config.json", d);
    TU_CHECK(remove(p) == 0, "rm generation_config.json");
    int grc = gen(d, "--print-ids --max-new-tokens 6");
    warned("GPT-2 bos_token_id 50256",
           "config.json: field 'bos_token_id': token id 50256 is not below vocab_size 320; ignored", grc);
    warned("GPT-2 eos_token_id 50256",
           "config.json: field 'eos_token_id': token id 50256 is not below vocab_size 320; ignored", grc);
    {
        const char *ids = strstr(out, "\"ids\": [");
        int n = 0;
        for (const char *c = ids ? ids + 8 : ""; *c && *c != ']'; c++) n += *c == ',';
        TU_CHECK(ids && n == 5, "GPT-2 with bos/eos 50256: 6 new tokens, no stop token: %s", out);
    }
    copy_fixture("qwen2", d);
    snprintf(p, sizeof p, "%s/generation_config.json", d);
    write_bytes(p, "{\"eos_token_id\": [2, 320]}", 26);
    warned("generation_config.json eos 320",
           "generation_config.json: field 'eos_token_id': token id 320 is not below vocab_size 320; ignored",
           gen(d, "--print-ids"));
    { /* train --init-from: an eos past the vocabulary (refused for a while) is ignored there too */
        char tcmd[2400];
        copy_fixture("llama", d);
        set_cfg(d, "eos_token_id", "320");
        snprintf(tcmd, sizeof tcmd,
                 "head -c 5000 %s/data/tinyshakespeare.txt > %s/t.txt && $SUANLI_CLI data prepare --input "
                 "%s/t.txt --output-prefix %s/bytes --tokenizer-file %s/tokenizer.json",
                 SL_SOURCE_DIR, td, td, td, d);
        TU_CHECK(tu_run(tcmd, out, sizeof out) == 0, "data prepare: %s", out);
        snprintf(tcmd, sizeof tcmd,
                 "$SUANLI_CLI train --data-path %s/bytes --init-from %s --seq-length 16 "
                 "--train-iters 1",
                 td, d);
        int trc = tu_run(tcmd, out, sizeof out);
        TU_CHECK(trc == 0 && strstr(out, "field 'eos_token_id': token id 320 is not below vocab_size 320; "
                                         "ignored"),
                 "train --init-from, eos_token_id 320 past the vocabulary: a warning, and it trains: %s",
                 out);
    }
}

int main(void) {
    test_unused_tensors();
    test_train_help();
    test_position_limit();
    test_config_kept();
    test_greedy_text();
    test_round_trip();
    char d[600];
    const char *td = tu_tmpdir("hfcli");
    snprintf(d, sizeof d, "%s/m", td);
    tu_watch(td);
    char p[1024];

    bad("missing dir", "config.json", gen("/nonexistent/model", ""));
    bad("no model flag", "--load or --model", tu_run("$SUANLI_CLI generate --prompt x", out, sizeof out));
    /* a model dir given to the other flag: the error names the flag that reads it */
    copy_fixture("qwen2", d);
    snprintf(p, sizeof p, "$SUANLI_CLI generate --load %s --max-new-tokens 1", d);
    bad("--load of a Hugging Face dir", "use --model", tu_run(p, out, sizeof out));
    snprintf(p, sizeof p, "%s/config.json", d);
    write_bytes(p, "{\"architecture\": \"gpt2\"}", 24);
    bad("--model of a suanli dir", "use --load", gen(d, ""));
    copy_fixture("qwen2", d);
    bad("prompt id out of range", "--prompt-ids", gen(d, "--prompt-ids 99999"));
    /* a prompt that is not UTF-8 was reported as empty */
    char dl[600];
    snprintf(dl, sizeof dl, "%s/ml", td);
    copy_fixture("llama", dl); /* a tokenizer.json (the qwen2 fixture has none) */
    snprintf(p, sizeof p,
             "$SUANLI_CLI generate --model %s --prompt \"$(printf '\\377\\376')\" --max-new-tokens 2", dl);
    bad("prompt not UTF-8", "cannot encode the --prompt: tokenizer: text is not valid UTF-8",
        tu_run(p, out, sizeof out));
    /* strtok skipped empty entries: "1,,2" ran as 1,2 */
    bad("empty prompt id", "--prompt-ids: '5,,6' has an empty entry", gen(d, "--prompt-ids 5,,6"));
    bad("trailing comma in --stop", "--stop: '7,' has an empty entry", gen(d, "--stop 7,"));
    set_cfg(d, "hidden_size", NULL);
    bad("missing hidden_size", "missing field 'hidden_size'", gen(d, ""));
    set_cfg(d, "hidden_size", "\"64\"");
    bad("string hidden_size", "'hidden_size' must be an integer", gen(d, ""));
    set_cfg(d, "hidden_size", "1e300"); /* was an undefined double -> int conversion (fuzz_hf_config) */
    bad("huge hidden_size", "'hidden_size' must be an integer", gen(d, ""));
    set_cfg(d, "hidden_size", "64");
    set_cfg(d, "num_hidden_layers", "0");
    bad("zero layers", "field 'num_hidden_layers' must be in [1, 16777216], got 0", gen(d, ""));
    copy_fixture("qwen2", d);
    set_cfg(d, "architectures", "[\"GPTNeoXForCausalLM\"]");
    bad("unsupported arch", "unsupported architecture 'GPTNeoXForCausalLM'", gen(d, ""));
    copy_fixture("qwen2", d);
    set_cfg(d, "num_key_value_heads", "3");
    bad("inconsistent heads", "num_key_value_heads", gen(d, ""));
    copy_fixture("qwen2", d);
    set_cfg(d, "intermediate_size", "100");
    bad("shape mismatch",
        "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [128,64], config.json implies [100,64]",
        gen(d, ""));
    copy_fixture("qwen2", d);
    set_cfg(d, "tie_word_embeddings", "false");
    bad("missing tensor", "missing tensor 'lm_head.weight'", gen(d, ""));
    copy_fixture("qwen2", d);
    set_cfg(d, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4}");
    set_cfg(d, "rope_parameters", NULL);
    bad("rope scaling", "rope_scaling", gen(d, ""));
    set_cfg(d, "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8}");
    set_cfg(d, "rope_parameters", NULL);
    bad("llama3 rope scaling without its fields", "missing field 'low_freq_factor'", gen(d, ""));
    copy_fixture("qwen2", d);
    set_cfg(d, "hidden_act", "\"gelu\"");
    bad("activation", "hidden_act", gen(d, ""));
    copy_fixture("qwen2", d);
    set_cfg(d, "rms_norm_eps", "-1");
    bad("bad eps", "rms_norm_eps", gen(d, ""));
    copy_fixture("mixtral", d);
    set_cfg(d, "num_experts_per_tok", "9");
    bad("experts per token", "num_experts_per_tok", gen(d, ""));
    set_cfg(d, "num_experts_per_tok", "0");
    bad("zero experts per token", "field 'num_experts_per_tok' must be in [1, 16777216], got 0", gen(d, ""));
    /* shared experts whose width overflowed an int (fuzz_hf_config, regress-shared-overflow.bin) */
    copy_fixture("deepseek_v3", d);
    set_cfg(d, "n_shared_experts", "1073741824");
    bad("shared experts overflow", "field 'n_shared_experts' must be in [0, ", gen(d, ""));
    copy_fixture("qwen2_moe", d);
    set_cfg(d, "shared_expert_intermediate_size", "-8");
    bad("negative shared width", "field 'shared_expert_intermediate_size' must be in [0, ", gen(d, ""));
    test_token_ids(td, d);

    /* safetensors damage */
    copy_fixture("qwen2", d);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    TU_CHECK(truncate(p, 100000) == 0, "truncate");
    bad("truncated safetensors", "model.safetensors", gen(d, ""));
    write_st(p, "{}", (uint64_t)1 << 60, 0);
    bad("huge header length", "model.safetensors", gen(d, ""));
    write_st(p,
             "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8000000]}}",
             0, 8);
    bad("offsets outside the file", "model.safetensors", gen(d, ""));
    write_st(p, "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0,
             8);
    bad("tensor shape vs config", "tensor 'model.embed_tokens.weight' has shape [2]", gen(d, ""));
    write_bytes(p, "", 0);
    bad("empty safetensors", "model.safetensors", gen(d, ""));

    /* sharded: index names a missing shard; index malformed */
    copy_fixture("llama", d);
    snprintf(p, sizeof p, "%s/model-00002-of-00004.safetensors", d);
    remove(p);
    bad("missing shard", "model-00002-of-00004.safetensors", gen(d, ""));
    copy_fixture("llama", d);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    const char *bad_map = "{\"weight_map\": 3}", *esc = "{\"weight_map\": {\"x\": \"../../etc/passwd\"}}";
    write_bytes(p, bad_map, strlen(bad_map));
    bad("bad index", "weight_map", gen(d, ""));
    write_bytes(p, esc, strlen(esc));
    bad("index escapes dir", "weight_map entry 'x'", gen(d, ""));
    return tu_finish("test_hf_cli");
}
