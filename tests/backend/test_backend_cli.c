/* `--device` end to end: `suanli train --device strict` (checkpoints, eval, resume, final save, sample) and
 * `suanli generate --device strict` (--load and an HF dir) give bitwise the CPU backend's files and tokens
 * (the strict backend runs the CPU kernels behind memory the host cannot touch, so tolerance 0), and bad
 * devices are refused with one line and exit 2. */
#define _GNU_SOURCE /* memmem */
#include <stdarg.h>
#include <string.h>

#include "device/cpu/kernels/gemm.h"
#include "suanli/base.h"
#include "testutil.h"

static char out[1 << 16];
static char dir[512];

/* the lines of `text` that carry results, without the timing lines ("[...]" and "loaded in ...") */
static void results_only(char *text) {
    char *g = strstr(text, "[generated"); /* stderr's timing line may land inside the sample's line */
    if (g) {
        char *end = strchr(g, ']');
        end = end ? end + 1 : g + strlen(g);
        memmove(g, end, strlen(end) + 1);
    }
    char *w = text;
    for (char *l = text; *l;) {
        char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l + 1) : strlen(l);
        int timing =
            l[0] == '[' || memmem(l, n, " s,", 3) || memmem(l, n, " in 0.", 6) || memmem(l, n, "/s", 2);
        if (!timing) {
            memmove(w, l, n);
            w += n;
        }
        l += n;
    }
    *w = 0;
}

#define run(...) tu_cli_run(out, sizeof out, __VA_ARGS__)

#define TINY                                                                                                 \
    "--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --micro-batch-size 4 "          \
    "--global-batch-size 8 --lr 1e-3 --save-interval 3 --eval-interval 3 --eval-iters 2 --threads 2"

int main(void) {
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("backend_cli"));
    char cmd[2048], a[1024], b[1024];
    snprintf(cmd, sizeof cmd, "head -c 30000 %s/data/tinyshakespeare.txt > %s/small.txt", SL_SOURCE_DIR, dir);
    TU_CHECK(system(cmd) == 0, "corpus");
    TU_CHECK(
        run("data prepare --input %s/small.txt --output-prefix %s/data --tokenizer-type byte", dir, dir) == 0,
        "prepare: %s", out);
    const char *dev[2] = {"cpu", "strict"};
    for (int i = 0; i < 2; i++) {
        /* 6 steps with checkpoints at 3 and 6, then resume to 9 */
        int rc = run("train --device %s --data-path %s/data " TINY
                     " --train-iters 6 --save %s/%s --sample-tokens 16",
                     dev[i], dir, dir, dev[i]);
        TU_CHECK(rc == 0, "train --device %s: %s", dev[i], out);
        rc = run("train --device %s --data-path %s/data " TINY " --train-iters 9 --save %s/%s --load %s/%s",
                 dev[i], dir, dir, dev[i], dir, dev[i]);
        TU_CHECK(rc == 0 && strstr(out, "resumed from"), "resume --device %s: %s", dev[i], out);
    }
    snprintf(a, sizeof a, "%s/cpu/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/strict/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "train --device strict: final weights bitwise the cpu run's");
    snprintf(a, sizeof a, "%s/cpu/step-0000006/shard-r00000.safetensors", dir);
    snprintf(b, sizeof b, "%s/strict/step-0000006/shard-r00000.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "train --device strict: checkpoint shard bitwise the cpu run's");
    /* generation from the trained dir and from an HF fixture (Mixtral: GQA + MoE, KV cache) */
    static char gen[2][1 << 16], hf[2][1 << 16];
    for (int i = 0; i < 2; i++) {
        int rc =
            run("generate --device %s --load %s/cpu --prompt ROMEO: --max-new-tokens 24 --temperature 0.7 "
                "--top-k 20 --seed 3",
                dev[i], dir);
        TU_CHECK(rc == 0, "generate --load --device %s: %s", dev[i], out);
        results_only(out);
        snprintf(gen[i], sizeof gen[i], "%s", out);
        rc = run(
            "generate --device %s --model %s/tests/fixtures/hf/mixtral --prompt-ids 1,5,9 --max-new-tokens 8 "
            "--temperature 0 --print-ids",
            dev[i], SL_SOURCE_DIR);
        TU_CHECK(rc == 0, "generate --model --device %s: %s", dev[i], out);
        results_only(out);
        snprintf(hf[i], sizeof hf[i], "%s", out);
    }
    TU_CHECK(strlen(gen[0]) > 20, "generate --load printed text: %s", gen[0]);
    TU_CHECK(!strcmp(gen[0], gen[1]), "generate --load: same text on strict as on cpu");
    TU_CHECK(!strcmp(hf[0], hf[1]) && strstr(hf[0], "\"ids\""), "generate --model: same ids on strict: %s",
             hf[1]);
    /* refusals: one line, exit 2, nothing written (tu_watch: no entry under dir created or changed) */
    tu_watch(dir);
    int rc = run("train --device tpu --data-path %s/data " TINY " --train-iters 1 --save %s/never", dir, dir);
    TU_CHECK(rc == 2 && strstr(out, "--device") && strstr(out, "unknown device 'tpu'"), "bad device: %s",
             out);
    TU_CHECK(tu_unchanged(), "bad device: the run wrote under %s", dir);
    /* bf16 weights on a backend without host-visible memory: copied into a device buffer (Note [bf16
     * weights on device memory]; they were refused, "need a host-visible backend"): the CPU's ids bitwise,
     * for a tied head (llama), qkv biases (qwen2) and bf16 experts (mixtral); with MOE_EXPERT refused by the
     * backend, the host fallback reads the experts' bf16 weights out of device memory */
    static const char *bfm[4] = {"llama", "qwen2", "mixtral", "mixtral"};
    for (int m = 0; m < 4; m++) {
        static char ids[2][1 << 14];
        for (int i = 0; i < 2; i++) {
            rc = tu_runf(ids[i], sizeof ids[i],
                         m == 3 && i ? "SUANLI_HOST_FALLBACK=1 SUANLI_STRICT_REFUSE=moe_expert" : "",
                         "%s generate --device %s --model %s/tests/fixtures/hf/%s --dtype bf16 --prompt-ids "
                         "1,5,9 --max-new-tokens 8 --temperature 0 --ignore-eos --print-ids",
                         tu_cli(), dev[i], SL_SOURCE_DIR, bfm[m]);
            TU_CHECK(rc == 0 && strstr(ids[i], "\"ids\""), "generate --dtype bf16 --device %s %s: %s", dev[i],
                     bfm[m], ids[i]);
            results_only(ids[i]);
        }
        TU_CHECK(!strcmp(ids[0], ids[1]), "bf16 %s%s: strict %s, cpu %s", bfm[m],
                 m == 3 ? " (host fallback)" : "", ids[1], ids[0]);
    }
    TU_CHECK(tu_unchanged(), "bf16 on strict: the run wrote under %s", dir);
    rc = run("train --device null --data-path %s/data " TINY " --train-iters 1 --save-interval 0", dir);
    TU_CHECK(rc != 0 && strstr(out, "not supported"), "null backend: the first op named: %s", out);
    rc = run("train --device cpu:1 --data-path %s/data " TINY " --train-iters 1 --save %s/never", dir, dir);
    TU_CHECK(rc == 2 && strstr(out, "takes no ':' suffix"), "cpu:1 refused: %s", out);
    TU_CHECK(tu_unchanged(), "cpu:1: the run wrote under %s", dir);
    /* suanli devices: every registered backend, the OpenCL runtime (devices, or why there are none), cuda */
    rc = run("devices");
    TU_CHECK(rc == 0 && strstr(out, "cpu ") && strstr(out, "ISA ") && strstr(out, "strict") &&
                 strstr(out, "cuda "),
             "devices: %s", out);
    /* which kernel the bf16 GEMM runs on this host (AMX tiles, vdpbf16ps or widened to fp32) */
    /* (this process's own dispatch: the CLI's probe gives the same answer, Note [Widened bf16 GEMM]) */
    const char *bk = sl_gemm_bf16_kernel_name();
    TU_CHECK(strstr(out, !strcmp(bk, "amx")           ? "bf16 GEMM on AMX tiles"
                         : !strcmp(bk, "avx512_bf16") ? "bf16 GEMM on vdpbf16ps"
                                                      : "bf16 GEMM on fp32 (widened)"),
             "devices names the bf16 GEMM: %s", out);
    /* cuda: the devices, or plainly why there are none (not built / no device / driver too old) */
    TU_CHECK(strstr(out, "cuda:0") || strstr(out, "cuda    not built") || strstr(out, "no device"),
             "devices says what cuda has: %s", out);
#ifdef SL_HAVE_OPENCL
    TU_CHECK(strstr(out, "opencl:0") || strstr(out, "no OpenCL platform") || strstr(out, "no device"),
             "devices lists opencl (devices or why none): %s", out);
#else
    TU_CHECK(strstr(out, "opencl  not built"), "devices says opencl is not built: %s", out);
#endif
    rc = run("devices --json");
    TU_CHECK(rc == 0 && strstr(out, "\"runtimes\":[{\"name\":\"cpu\""), "devices --json: %s", out);
    return tu_finish("test_backend_cli");
}
