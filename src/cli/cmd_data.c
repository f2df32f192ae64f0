/* PLACEHOLDER during initial bring-up: replaced by the real implementation before any issue is resolved. */
#include <stdio.h>
#include "cli/commands.h"
int sl_cmd_data(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "suanli data: not built yet\n"); return 1; }
