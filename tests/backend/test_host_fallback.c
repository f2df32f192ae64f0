/* The executor's host fallback (Note [Host fallback], src/graph/host_fallback.c), end to end through the CLI.
 * The strict backend keeps device memory PROT_NONE outside its own calls and runs the CPU's kernels; with
 * SUANLI_STRICT_REFUSE=all it claims no op at all, so with SUANLI_HOST_FALLBACK=1 every node of the step runs
 * through the fallback's staging. An operand the staging missed would fault, a result it failed to copy back
 * would change the numbers: the files must be bitwise the CPU run's (tolerance 0: the same kernels on the
 * same bytes). Covered: GPT-2 with hidden and attention dropout (the mask bits in aux bytes), GPT-2 bf16
 * (casts, half attention), Qwen2-MoE with capacity dropping and router losses, DeepSeek-V3 (sigmoid routing,
 * group-limited top-k, shared experts), a checkpoint resume, and KV-cache generation from an HF Mixtral.
 * Without SUANLI_HOST_FALLBACK the first refused op is named with the variable to set, exit non-zero, and
 * the run's save directory gets no weights. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static char out[1 << 16];
static char dir[512];

#define run(...) tu_cli_run(out, sizeof out, __VA_ARGS__)
#define FB "SUANLI_HOST_FALLBACK=1 SUANLI_STRICT_REFUSE=all"

#define TINY                                                                                                 \
    "--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --micro-batch-size 4 "          \
    "--global-batch-size 8 --lr 1e-3 --eval-interval 3 --eval-iters 2 --threads 2"

/* cpu vs strict with every op refused: `flags` for train, files under dir/<tag>_{cpu,fb} compared */
static void pair(const char *tag, const char *flags, const char *file) {
    char a[1024], b[1024];
    int rc = run("train --device cpu %s --save %s/%s_cpu", flags, dir, tag);
    TU_CHECK(rc == 0, "%s on cpu: %s", tag, out);
    rc = tu_runf(out, sizeof out, FB, "%s train --device strict %s --save %s/%s_fb", tu_cli(), flags, dir,
                 tag);
    TU_CHECK(rc == 0, "%s on strict through the fallback: %s", tag, out);
    TU_CHECK(strstr(out, "runs on the host"), "%s: the fallback warns once per op kind: %s", tag, out);
    snprintf(a, sizeof a, "%s/%s_cpu/%s", dir, tag, file);
    snprintf(b, sizeof b, "%s/%s_fb/%s", dir, tag, file);
    TU_CHECK(tu_same_file(a, b), "%s: %s through the host fallback is bitwise the cpu run's", tag, file);
}

static void model_dir(const char *name, char *dst, size_t cap) {
    char cmd[4096];
    snprintf(dst, cap, "%s/%s", dir, name);
    snprintf(
        cmd, sizeof cmd,
        "mkdir -p %s && cp %s/tests/fixtures/hf/%s/config.json %s/tests/fixtures/hf/%s/model.safetensors "
        "%s/ && cp %s/tests/fixtures/hf/llama/tokenizer.json %s/",
        dst, SL_SOURCE_DIR, name, SL_SOURCE_DIR, name, dst, SL_SOURCE_DIR, dst);
    TU_CHECK(tu_run(cmd, NULL, 0) == 0, "copy %s", name);
}

/* the {"prompt_ids": ...} line of a generate run's output, cut at its end (a sanitizer's report may follow)
 */
static const char *json_line(char *out) {
    char *j = strstr(out, "{\"prompt_ids\"");
    if (j && strchr(j, '\n')) *strchr(j, '\n') = 0;
    return j;
}

int main(void) {
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("host_fallback"));
    char cmd[4096], flags[2048], qdir[600], ddir[600];
    snprintf(cmd, sizeof cmd, "head -c 30000 %s/data/tinyshakespeare.txt > %s/small.txt", SL_SOURCE_DIR, dir);
    TU_CHECK(system(cmd) == 0, "corpus");
    TU_CHECK(run("data prepare --input %s/small.txt --output-prefix %s/bytes --tokenizer-type byte", dir,
                 dir) == 0,
             "prepare bytes: %s", out);

    /* GPT-2 with dropout: 6 steps with a checkpoint at 3, then a resume to 9 on each side */
    snprintf(flags, sizeof flags,
             "--data-path %s/bytes " TINY " --attention-dropout 0.1 --hidden-dropout 0.1 --save-interval 3",
             dir);
    char six[2200];
    snprintf(six, sizeof six, "%s --train-iters 6", flags);
    pair("gpt2_drop", six, "model.safetensors");
    int rc = run("train --device cpu %s --train-iters 9 --save %s/gpt2_drop_cpu --load %s/gpt2_drop_cpu",
                 flags, dir, dir);
    TU_CHECK(rc == 0, "resume on cpu: %s", out);
    rc = tu_runf(out, sizeof out, FB,
                 "%s train --device strict %s --train-iters 9 --save %s/gpt2_drop_fb --load %s/gpt2_drop_fb",
                 tu_cli(), flags, dir, dir);
    TU_CHECK(rc == 0 && strstr(out, "resumed from"), "resume through the fallback: %s", out);
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s/gpt2_drop_cpu/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/gpt2_drop_fb/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "resumed GPT-2: final weights bitwise the cpu run's");

    snprintf(flags, sizeof flags, "--data-path %s/bytes " TINY " --train-iters 4 --bf16", dir);
    pair("gpt2_bf16", flags, "model.safetensors");

    /* routed MoE families from HF layouts: the llama fixture's tokenizer (vocab 320) for both */
    model_dir("qwen2_moe", qdir, sizeof qdir);
    model_dir("deepseek_v3", ddir, sizeof ddir);
    TU_CHECK(
        run("data prepare --input %s/small.txt --output-prefix %s/tok --tokenizer-file %s/tokenizer.json",
            dir, dir, qdir) == 0,
        "prepare tok: %s", out);
    const char *moe = "--seq-length 16 --micro-batch-size 2 --train-iters 3 --eval-interval 0 --eval-iters 1";
    snprintf(flags, sizeof flags,
             "--data-path %s/tok --init-from %s %s --moe-capacity-factor 0.5 --moe-aux-loss-coeff 0.01 "
             "--moe-z-loss-coeff 0.001",
             dir, qdir, moe);
    pair("qwen2_moe", flags, "model.safetensors");
    snprintf(flags, sizeof flags, "--data-path %s/tok --init-from %s %s", dir, ddir, moe);
    pair("deepseek_v3", flags, "model.safetensors");

    /* KV-cache generation (GQA + MoE) */
    static char ids[2][1 << 16];
    const char *gen = "generate --model %s/tests/fixtures/hf/mixtral --prompt-ids 1,5,9 --max-new-tokens 8 "
                      "--temperature 0 --print-ids --device %s";
    snprintf(cmd, sizeof cmd, gen, SL_SOURCE_DIR, "cpu");
    rc = tu_runf(ids[0], sizeof ids[0], "", "%s %s 2>/dev/null", tu_cli(), cmd);
    TU_CHECK(rc == 0 && strstr(ids[0], "\"ids\""), "generate on cpu: %s", ids[0]);
    snprintf(cmd, sizeof cmd, gen, SL_SOURCE_DIR, "strict");
    rc = tu_runf(ids[1], sizeof ids[1], FB, "%s %s 2>/dev/null", tu_cli(), cmd);
    const char *j0 = json_line(ids[0]), *j1 = json_line(ids[1]);
    TU_CHECK(rc == 0 && j0 && j1 && !strcmp(j0, j1), "generate through the fallback: the cpu's ids: %s vs %s",
             ids[1], ids[0]);

    /* without the variable: the first refused op named, with what to set; no weights saved */
    rc = tu_runf(out, sizeof out, "SUANLI_STRICT_REFUSE=layernorm,moe_route",
                 "%s train --device strict --data-path %s/bytes " TINY " --train-iters 2 --save %s/refused",
                 tu_cli(), dir, dir);
    TU_CHECK(rc != 0 && strstr(out, "backend strict: op layernorm (f32) not supported") &&
                 strstr(out, "SUANLI_HOST_FALLBACK=1"),
             "refused op named: %s", out);
    snprintf(a, sizeof a, "%s/refused/model.safetensors", dir);
    TU_CHECK(access(a, F_OK) != 0, "refused run saved no weights");
    /* a refusal of only the routed ops: the rest runs on the device, the same bits */
    snprintf(flags, sizeof flags,
             "--data-path %s/tok --init-from %s %s --moe-capacity-factor 0.5 --moe-aux-loss-coeff 0.01", dir,
             qdir, moe);
    rc = run("train --device cpu %s --save %s/part_cpu", flags, dir);
    TU_CHECK(rc == 0, "qwen2_moe on cpu: %s", out);
    rc =
        tu_runf(out, sizeof out,
                "SUANLI_HOST_FALLBACK=1 SUANLI_STRICT_REFUSE=moe_route,moe_route_back,moe_gather,moe_combine",
                "%s train --device strict %s --save %s/part_fb", tu_cli(), flags, dir);
    TU_CHECK(rc == 0 && strstr(out, "op moe_route (f32) runs on the host") && !strstr(out, "op matmul"),
             "only the refused ops run on the host: %s", out);
    snprintf(a, sizeof a, "%s/part_cpu/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/part_fb/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "routed ops on the host, the rest on the device: bitwise the cpu run's");
    return tu_finish("test_host_fallback");
}
