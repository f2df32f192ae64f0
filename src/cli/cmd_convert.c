/* suanli convert — GPT-2 weights between a Hugging Face directory and suanli's layout. */
#include <string.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "suanli/hf_gpt2.h"
#include "suanli/model_io.h"

int sl_cmd_convert(int argc, char **argv) {
    const char *from = NULL, *to = NULL, *in = NULL, *out = NULL;
    sl_flag flags[] = {
        {"from", SL_FLAG_STR, &from, 0, 0, "hf-gpt2 | suanli", 0},
        {"to", SL_FLAG_STR, &to, 0, 0, "suanli | hf-gpt2", 0},
        {"input", SL_FLAG_STR, &in, 0, 0, "source directory", 0},
        {"output", SL_FLAG_STR, &out, 0, 0, "destination directory (created)", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: suanli convert --from hf-gpt2 --to suanli --input HF_DIR --output DIR\n"
                   "       suanli convert --from suanli --to hf-gpt2 --input DIR --output HF_DIR\n");
            sl_flags_usage(flags, nf, stdout);
            return 0;
        }
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli convert: %s\n", sl_errmsg());
        return 2;
    }
    if (!from || !to || !in || !out) {
        fprintf(stderr, "suanli convert: --from, --to, --input and --output are required\n");
        return 2;
    }
    sl_model *m = NULL;
    sl_status st;
    if (!strcmp(from, "hf-gpt2") && !strcmp(to, "suanli")) {
        st = sl_hf_gpt2_import(in, &m);
        if (st == SL_OK) st = sl_mkdirs(out);
        if (st == SL_OK) st = sl_model_save(m, out, NULL);
    } else if (!strcmp(from, "suanli") && !strcmp(to, "hf-gpt2")) {
        st = sl_model_load(in, &m);
        if (st == SL_OK) st = sl_hf_gpt2_export(m, out);
    } else {
        fprintf(stderr, "suanli convert: unsupported conversion --from %s --to %s (hf-gpt2 <-> suanli)\n", from, to);
        return 2;
    }
    sl_model_free(m);
    if (st != SL_OK) {
        fprintf(stderr, "suanli convert: %s\n", sl_errmsg());
        return st == SL_ERR_NOMEM || st == SL_ERR_IO ? 1 : 2;
    }
    printf("converted %s (%s) -> %s (%s)\n", in, from, out, to);
    return 0;
}
