/* suanli plot RUN_DIR [RUN_DIR ...] [--output FILE.svg] [--title T] — flags only; the SVG is drawn by
 * sl_plot_runs (src/train/plot.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "suanli/metrics.h"

static void usage(FILE *f) {
    fprintf(
        f, "usage: suanli plot RUN_DIR [RUN_DIR ...] [--output FILE.svg] [--title T]\n"
           "  draws train loss, val loss, tokens/s and learning rate from each RUN_DIR/metrics.jsonl\n"
           "  (runs overlaid) into one SVG; default: RUN_DIR/loss.svg for one run, ./loss.svg for several\n");
}

int sl_cmd_plot(int argc, char **argv) {
    sl_plot_opts o = {0};
    const char **runs = calloc((size_t)argc, sizeof *runs);
    int n = 0;
    if (!runs) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--output") ? &o.output : !strcmp(a, "--title") ? &o.title : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            free(runs);
            return 0;
        }
        if (dst) {
            if (i + 1 >= argc) {
                fprintf(stderr, "suanli plot: %s: missing value\n", a);
                free(runs);
                return 2;
            }
            *dst = argv[++i];
        } else if (!strncmp(a, "--output=", 9)) {
            o.output = a + 9;
        } else if (!strncmp(a, "--title=", 8)) {
            o.title = a + 8;
        } else if (!strncmp(a, "--", 2)) {
            fprintf(stderr, "suanli plot: unknown flag %s\n", a);
            free(runs);
            return 2;
        } else {
            runs[n++] = a;
        }
    }
    if (o.output && !*o.output) {
        fprintf(stderr, "suanli plot: --output: empty value\n");
        free(runs);
        return 2;
    }
    if (n == 0) {
        usage(stderr);
        free(runs);
        return 2;
    }
    char written[4200];
    sl_status st = sl_plot_runs(runs, n, &o, written, sizeof written);
    free(runs);
    if (st != SL_OK) {
        fprintf(stderr, "suanli plot: %s\n", sl_errmsg());
        return st == SL_ERR_INVALID ? 2 : 1;
    }
    printf("wrote %s\n", written);
    return 0;
}
