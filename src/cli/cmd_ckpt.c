/* suanli ckpt inspect|verify DIR — DIR is a step dir or a checkpoint root (its newest valid step), or a
 * pooled store (--ckpt-local-dir: host-<h>/ subdirectories): placement and redundancy of its newest step.
 * suanli ckpt gather POOL OUT [--step N] — assemble a pooled checkpoint into the plain checkpoint root OUT.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "suanli/ckpt.h"

static int usage(void) {
    fprintf(
        stderr,
        "usage: suanli ckpt inspect|verify DIR\n"
        "       suanli ckpt gather POOL OUT [--step N]\n"
        "  DIR   a step dir, a checkpoint root (--save), or a pooled store (--ckpt-local-dir)\n"
        "  POOL  a pooled store; OUT (new or empty) receives OUT/step-N and OUT/latest, a checkpoint that\n"
        "        `suanli train --load OUT` resumes (newest step the surviving hosts can rebuild, or --step "
        "N)\n");
    return 2;
}

static int gather(int argc, char **argv) {
    long long step = -1;
    if (argc == 6 && !strcmp(argv[4], "--step")) {
        char *end;
        step = strtoll(argv[5], &end, 10);
        if (!*argv[5] || *end || step < 0) {
            fprintf(stderr, "suanli ckpt gather: --step: expected a step number, got '%s'\n", argv[5]);
            return 2;
        }
    } else if (argc != 4) {
        return usage();
    }
    const char *pool = argv[2], *out = argv[3];
    if (!sl_ckpt_is_pool(pool)) {
        fprintf(stderr, "suanli ckpt gather: %s: not a pooled store (no host-<h> directories)\n", pool);
        return 2;
    }
    if (access(out, F_OK) == 0 && rmdir(out) != 0) { /* an empty dir is fine; anything else is kept */
        fprintf(stderr, "suanli ckpt gather: %s: exists and is not empty; give a new directory\n", out);
        return 2;
    }
    int64_t got;
    if (sl_ckpt_pool_gather(pool, 0, step, out, &got) != SL_OK) {
        fprintf(stderr, "suanli ckpt gather: %s\n", sl_errmsg());
        return 2;
    }
    printf("gathered step %lld of %s into %s/step-%07lld\n", (long long)got, pool, out, (long long)got);
    return 0;
}

int sl_cmd_ckpt(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "gather")) return gather(argc, argv);
    if (argc != 3 || (strcmp(argv[1], "inspect") != 0 && strcmp(argv[1], "verify") != 0)) return usage();
    if (sl_ckpt_is_pool(argv[2]) && !sl_ckpt_is_checkpoint(argv[2])) {
        if (!strcmp(argv[1], "inspect")) {
            if (sl_ckpt_pool_inspect(argv[2], 0, stdout) != SL_OK) {
                fprintf(stderr, "suanli ckpt: %s\n", sl_errmsg());
                return 2;
            }
            return 0;
        }
        int64_t got;
        if (sl_ckpt_pool_gather(argv[2], 0, -1, NULL, &got) != SL_OK) {
            fprintf(stderr, "suanli ckpt: %s\n", sl_errmsg());
            return 2;
        }
        printf("%s: step-%07lld can be rebuilt; all checksums of the copies and blocks used match\n", argv[2],
               (long long)got);
        return 0;
    }
    char dir[4096];
    if (sl_ckpt_find_latest(argv[2], dir, sizeof dir) != SL_OK) {
        fprintf(stderr, "suanli ckpt: %s\n", sl_errmsg());
        return 2;
    }
    if (!strcmp(argv[1], "verify")) {
        printf("%s: all checksums match\n", dir);
        return 0;
    }
    if (sl_ckpt_inspect(dir, stdout) != SL_OK) {
        fprintf(stderr, "suanli ckpt: %s\n", sl_errmsg());
        return 2;
    }
    return 0;
}
