/* suanli convert — load a Hugging Face model directory (or what `suanli train --init-from ... --save`
 * wrote) and write it back in transformers' layout: config.json, model.safetensors (f32 or bf16),
 * tokenizer.json and generation_config.json copied when present. */
#include <string.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "suanli/hf.h"

static int copy_if_present(const char *src_dir, const char *dst_dir, const char *name) {
    char src[4096], dst[4096], *buf;
    size_t n;
    snprintf(src, sizeof src, "%s/%s", src_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dst_dir, name);
    FILE *f = fopen(src, "r");
    if (!f) return 1;
    fclose(f);
    if (sl_file_read_all(src, &buf, &n) != SL_OK) return 0;
    sl_status st = sl_file_write_atomic(dst, buf, n);
    free(buf);
    return st == SL_OK;
}

int sl_cmd_convert(int argc, char **argv) {
    const char *in = NULL, *outd = NULL, *dtype = "f32";
    sl_flag flags[] = {
        {"model", SL_FLAG_STR, &in, 0, 0, "input: HF model dir (config.json, safetensors [+ index])", 0},
        {"output", SL_FLAG_STR, &outd, 0, 0, "output dir (created)", 0},
        {"dtype", SL_FLAG_STR, &dtype, 0, 0, "f32 | bf16 (f32)", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: suanli convert --model HF_DIR --output DIR [--dtype f32|bf16]\n");
            sl_flags_usage(flags, nf, stdout);
            return 0;
        }
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli convert: %s\n", sl_errmsg());
        return 2;
    }
    if (!in || !outd) {
        fprintf(stderr, "suanli convert: --model and --output are required\n");
        return 2;
    }
    sl_dtype dt = !strcmp(dtype, "f32") ? SL_F32 : !strcmp(dtype, "bf16") ? SL_BF16 : SL_DTYPE_COUNT;
    if (dt == SL_DTYPE_COUNT) {
        fprintf(stderr, "suanli convert: --dtype must be f32 or bf16, got '%s'\n", dtype);
        return 2;
    }
    sl_model *m = NULL;
    sl_hf_info info;
    if (sl_hf_load(in, &m, &info) != SL_OK) {
        fprintf(stderr, "suanli convert: %s\n", sl_errmsg());
        return 2;
    }
    int rc = 0;
    if (sl_mkdirs(outd) != SL_OK || sl_hf_save(m, outd, dt, &info) != SL_OK) {
        fprintf(stderr, "suanli convert: %s\n", sl_errmsg());
        rc = 1;
    } else if (!copy_if_present(in, outd, "tokenizer.json") || !copy_if_present(in, outd, "generation_config.json")) {
        fprintf(stderr, "suanli convert: copying tokenizer/generation config: %s\n", sl_errmsg());
        rc = 1;
    } else {
        printf("converted %s (%s, %.2fM params, %s on disk) -> %s/model.safetensors (%s)\n", in, sl_arch_name(m->arch),
               (double)m->numel / 1e6, info.disk_dtype, outd, dtype);
    }
    sl_model_free(m);
    return rc;
}
