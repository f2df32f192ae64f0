/* suanli ckpt inspect|verify DIR — DIR is a step dir or a checkpoint root (its newest valid step). */
#include <string.h>

#include "cli/commands.h"
#include "suanli/ckpt.h"

int sl_cmd_ckpt(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "inspect") != 0 && strcmp(argv[1], "verify") != 0)) {
        fprintf(stderr, "usage: suanli ckpt inspect|verify DIR\n");
        return 2;
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
