/* suanli — one CLI for the whole stack. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "suanli/base.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: suanli <command> [flags]\n"
        "  train     train a model (GPT-2) on token shards\n"
        "  generate  sample text from saved weights\n"
        "  data      prepare token shards: suanli data prepare --input F --output-prefix DIR\n"
        "  run       launch N ranks: suanli run -n N -- PROGRAM ARGS\n"
        "  bench     benchmarks: suanli bench ops|comm|train [--json]\n"
        "  ckpt      checkpoints: suanli ckpt inspect|verify DIR\n"
        "  plot      loss, val loss, tokens/s, lr of runs into an SVG: suanli plot RUN_DIR... [--output F]\n"
        "  convert   model formats: HF dir -> HF safetensors (f32|bf16); GPT-2 HF <-> suanli (--from/--to)\n"
        "  devices   backends and the devices present (--device NAME or NAME:N)\n"
        "  plan      rank parallel layouts of a model on a cluster: --model M --cluster C.json "
        "[--simulate-failures]\n"
        "  topo      hosts, NUMA nodes, cores and caches this process sees (hwloc)\n"
        "  submit    write (--go: submit) an sbatch script for a training command\n"
        "run 'suanli <command> --help' for its flags\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *c = argv[1];
    if (!strcmp(c, "-h") || !strcmp(c, "--help") || !strcmp(c, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(c, "train")) return sl_cmd_train(argc - 1, argv + 1);
    if (!strcmp(c, "generate")) return sl_cmd_generate(argc - 1, argv + 1);
    if (!strcmp(c, "data")) return sl_cmd_data(argc - 1, argv + 1);
    if (!strcmp(c, "run")) return sl_cmd_run(argc - 1, argv + 1);
    if (!strcmp(c, "bench")) return sl_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(c, "ckpt")) return sl_cmd_ckpt(argc - 1, argv + 1);
    if (!strcmp(c, "convert")) return sl_cmd_convert(argc - 1, argv + 1);
    if (!strcmp(c, "plot")) return sl_cmd_plot(argc - 1, argv + 1);
    if (!strcmp(c, "devices")) return sl_cmd_devices(argc - 1, argv + 1);
    if (!strcmp(c, "plan")) return sl_cmd_plan(argc - 1, argv + 1);
    if (!strcmp(c, "topo")) return sl_cmd_topo(argc - 1, argv + 1);
    if (!strcmp(c, "submit")) return sl_cmd_submit(argc - 1, argv + 1);
    fprintf(stderr, "suanli: unknown command '%s'\n", c);
    usage(stderr);
    return 2;
}
