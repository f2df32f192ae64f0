/* suanli convert — (1) --model HF_DIR: load a Hugging Face model directory (or what `suanli train --init-from
 * ... --save` wrote) and write it back in transformers' layout: config.json, model.safetensors (f32, bf16 or
 * f16), tokenizer.json and generation_config.json copied when present. (2) --from hf-gpt2|suanli --to
 * suanli|hf-gpt2: GPT-2 weights between HF and suanli's own layout. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "suanli/hf.h"
#include "suanli/hf_gpt2.h"
#include "suanli/model_io.h"

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

/* 1 when both name one existing directory: converting into the input would replace its files */
static int same_dir(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* an --output that exists and is no directory (or under a file): bad input (exit 2), refused before the
 * model is read; it exited 1 as a failed write */
static int output_not_dir(const char *out) {
    struct stat so;
    if (stat(out, &so) == 0 ? S_ISDIR(so.st_mode) : errno != ENOTDIR) return 0;
    fprintf(stderr, "suanli convert: --output %s: not a directory\n", out);
    return 1;
}

static int convert_hf(int argc, char **argv) {
    const char *in = NULL, *outd = NULL, *dtype = "f32";
    sl_flag flags[] = {
        {"model", SL_FLAG_STR, &in, 0, 0, "input: HF model dir (config.json, safetensors [+ index])", 0},
        {"output", SL_FLAG_STR, &outd, 0, 0, "output dir (created)", 0},
        {"dtype", SL_FLAG_STR, &dtype, 0, 0, "f32 | bf16 | f16 (f32; GPT-2: f32 only)", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    if (sl_flags_help(flags, nf, argc, argv,
                      "usage: suanli convert --model HF_DIR --output DIR [--dtype f32|bf16|f16]"))
        return 0;
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli convert: %s\n", sl_errmsg());
        return 2;
    }
    if (!in || !outd) {
        fprintf(stderr, "suanli convert: --model and --output are required\n");
        return 2;
    }
    sl_dtype dt = !strcmp(dtype, "f32")    ? SL_F32
                  : !strcmp(dtype, "bf16") ? SL_BF16
                  : !strcmp(dtype, "f16")  ? SL_F16
                                           : SL_DTYPE_COUNT;
    if (dt == SL_DTYPE_COUNT) {
        fprintf(stderr, "suanli convert: --dtype must be f32, bf16 or f16, got '%s'\n", dtype);
        return 2;
    }
    if (same_dir(in, outd)) {
        fprintf(stderr, "suanli convert: --output %s is the --model directory; give a new one\n", outd);
        return 2;
    }
    if (output_not_dir(outd)) return 2;
    sl_model *m = NULL;
    sl_hf_info info;
    if (sl_hf_load(in, &m, &info) != SL_OK) {
        fprintf(stderr, "suanli convert: %s\n", sl_errmsg());
        return 2;
    }
    if (m->arch == SL_ARCH_GPT2 && dt != SL_F32) { /* a bad request (exit 2), not a failed write */
        fprintf(stderr, "suanli convert: --dtype %s: GPT-2 is converted in f32 only\n", dtype);
        sl_model_free(m);
        return 2;
    }
    int rc = 0, made = access(outd, F_OK) != 0;
    if (sl_mkdirs(outd) != SL_OK || sl_hf_save(m, outd, dt, &info) != SL_OK) {
        fprintf(stderr, "suanli convert: %s\n", sl_errmsg());
        if (made) rmdir(outd); /* made for a write that failed (a full disk): left empty */
        rc = 1;
    } else if (!copy_if_present(in, outd, "tokenizer.json") ||
               !copy_if_present(in, outd, "generation_config.json")) {
        fprintf(stderr, "suanli convert: copying tokenizer/generation config: %s\n", sl_errmsg());
        rc = 1;
    } else {
        printf("converted %s (%s, %.2fM params, %s on disk) -> %s/model.safetensors (%s)\n", in,
               sl_arch_name(m->arch), (double)m->numel / 1e6, info.disk_dtype, outd, dtype);
    }
    sl_model_free(m);
    return rc;
}

static int convert_gpt2(int argc, char **argv) {
    const char *from = NULL, *to = NULL, *in = NULL, *out = NULL;
    sl_flag flags[] = {
        {"from", SL_FLAG_STR, &from, 0, 0, "hf-gpt2 | suanli", 0},
        {"to", SL_FLAG_STR, &to, 0, 0, "suanli | hf-gpt2", 0},
        {"input", SL_FLAG_STR, &in, 0, 0, "source directory", 0},
        {"output", SL_FLAG_STR, &out, 0, 0, "destination directory (created)", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    if (sl_flags_help(flags, nf, argc, argv,
                      "usage: suanli convert --from hf-gpt2 --to suanli --input HF_DIR --output DIR\n"
                      "       suanli convert --from suanli --to hf-gpt2 --input DIR --output HF_DIR"))
        return 0;
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli convert: %s\n", sl_errmsg());
        return 2;
    }
    if (!from || !to || !in || !out) {
        fprintf(stderr, "suanli convert: --from, --to, --input and --output are required\n");
        return 2;
    }
    if (same_dir(in, out)) {
        fprintf(stderr, "suanli convert: --output %s is the --input directory; give a new one\n", out);
        return 2;
    }
    if (output_not_dir(out)) return 2;
    sl_model *m = NULL;
    sl_hf_info info; /* bos/eos ids and dropouts: config.json to config.json, both ways */
    sl_status st;
    /* an input that cannot be read is bad input (exit 2, as --model's), a failed write is not */
    int loaded = 0, made = access(out, F_OK) != 0;
    if (!strcmp(from, "hf-gpt2") && !strcmp(to, "suanli")) {
        st = sl_hf_gpt2_import_ex(in, &m, &info);
        if (st == SL_OK) loaded = 1, st = sl_mkdirs(out);
        if (st == SL_OK) st = sl_model_save_ex(m, out, NULL, &info);
    } else if (!strcmp(from, "suanli") && !strcmp(to, "hf-gpt2")) {
        st = sl_model_load(in, &m);
        if (st == SL_OK) st = sl_model_load_info(in, &info);
        if (st == SL_OK) loaded = 1, st = sl_hf_gpt2_export_ex(m, out, &info);
    } else {
        fprintf(stderr, "suanli convert: unsupported conversion --from %s --to %s (hf-gpt2 <-> suanli)\n",
                from, to);
        return 2;
    }
    sl_model_free(m);
    if (st != SL_OK) {
        fprintf(stderr, "suanli convert: %s\n", sl_errmsg());
        if (made) rmdir(out); /* made for a write that failed: left empty */
        return st == SL_ERR_NOMEM || (st == SL_ERR_IO && loaded) ? 1 : 2;
    }
    /* the tokenizer goes along both ways: without it the converted dir could not encode a prompt */
    if (!copy_if_present(in, out, "tokenizer.json") || !copy_if_present(in, out, "tokenizer.model") ||
        !copy_if_present(in, out, "generation_config.json")) {
        fprintf(stderr, "suanli convert: copying tokenizer/generation config: %s\n", sl_errmsg());
        return 1;
    }
    printf("converted %s (%s) -> %s (%s)\n", in, from, out, to);
    return 0;
}

int sl_cmd_convert(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--from", 6) || !strncmp(argv[i], "--to", 4)) return convert_gpt2(argc, argv);
    return convert_hf(argc, argv);
}
