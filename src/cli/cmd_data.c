/* suanli data prepare | info — token shards from a text file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "suanli/data.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: suanli data prepare --input FILE --output-prefix DIR [--tokenizer-type byte|bpe]\n"
        "                           [--vocab-size N] [--tokenizer-file F] [--val-fraction F]\n"
        "                           [--shard-tokens N]\n"
        "       suanli data info DIR\n"
        "  prepare  tokenize FILE into DIR/train_NNN.bin, DIR/val_NNN.bin and DIR/tokenizer.json\n"
        "           --tokenizer-type  byte (vocab 256, default) or bpe (trained on the train part)\n"
        "           --vocab-size      bpe vocab size in [257, %d]\n"
        "           --tokenizer-file  tokenize with this file instead: a tokenizer.json (suanli's or\n"
        "                             Hugging Face's) or a SentencePiece tokenizer.model; copied into DIR\n"
        "           --val-fraction    the last F of the text is the val split (default 0.1, in (0,1))\n"
        "           --shard-tokens    max tokens per shard file (default %lld)\n"
        "  info     validate and summarize the shards and tokenizer in DIR\n",
        SL_BPE_MAX_VOCAB, (long long)SL_SHARD_DEFAULT_TOKENS);
}

static int parse_i64(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int cmd_prepare(int argc, char **argv) {
    sl_prepare_opts o = {0};
    sl_prepare_stats S;
    o.tokenizer_type = "byte";
    o.stats = &S;
    const char *vs = NULL, *vf = NULL, *sh = NULL;
    int type_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        static const char *const flags[] = {"--input",         "--output-prefix", "--tokenizer-type",
                                            "--vocab-size",    "--val-fraction",  "--shard-tokens",
                                            "--tokenizer-file"};
        int f = -1;
        for (int k = 0; k < 7 && f < 0; k++) {
            size_t n = strlen(flags[k]);
            if (!strncmp(a, flags[k], n) && (a[n] == 0 || a[n] == '=')) {
                f = k;
                if (a[n] == '=')
                    val = a + n + 1;
                else if (i + 1 < argc)
                    val = argv[++i];
            }
        }
        if (f < 0) {
            fprintf(stderr, "suanli data prepare: unknown flag '%s' (see --help)\n", a);
            return 2;
        }
        if (!val) {
            fprintf(stderr, "suanli data prepare: flag %s needs a value\n", flags[f]);
            return 2;
        }
        switch (f) {
        case 0:
            o.input = val;
            break;
        case 1:
            o.output_dir = val;
            break;
        case 2:
            o.tokenizer_type = val;
            break;
        case 3:
            vs = val;
            break;
        case 4:
            vf = val;
            break;
        case 5:
            sh = val;
            break;
        default:
            o.tokenizer_file = val;
            break;
        }
        if (f == 2) type_given = 1;
    }
    if (o.tokenizer_file && !*o.tokenizer_file) { /* the library reads "" as not given: the byte tokenizer */
        fprintf(stderr, "suanli data prepare: --tokenizer-file: empty value\n");
        return 2;
    }
    if (o.tokenizer_file && (type_given || vs)) {
        fprintf(stderr, "suanli data prepare: --tokenizer-file conflicts with --%s\n",
                type_given ? "tokenizer-type" : "vocab-size");
        return 2;
    }
    if (!o.input) {
        fprintf(stderr, "suanli data prepare: --input FILE is required\n");
        return 2;
    }
    if (!o.output_dir) {
        fprintf(stderr, "suanli data prepare: --output-prefix DIR is required\n");
        return 2;
    }
    long long v;
    if (vs) {
        if (!parse_i64(vs, 0, 1LL << 40, &v)) {
            fprintf(stderr, "suanli data prepare: --vocab-size '%s' is not a non-negative integer\n", vs);
            return 2;
        }
        if (v > SL_BPE_MAX_VOCAB) {
            fprintf(stderr, "suanli data prepare: vocab size %lld out of range (max %d)\n", v,
                    SL_BPE_MAX_VOCAB);
            return 2;
        }
        o.vocab_size = (int)v;
    } else if (!strcmp(o.tokenizer_type, "bpe")) {
        fprintf(stderr, "suanli data prepare: --tokenizer-type bpe needs --vocab-size N (257..%d)\n",
                SL_BPE_MAX_VOCAB);
        return 2;
    }
    if (vf) {
        char *end;
        errno = 0;
        double d = strtod(vf, &end);
        if (!*vf || *end || errno || !(d > 0 && d < 1)) {
            fprintf(stderr, "suanli data prepare: --val-fraction '%s' must be a number in (0, 1)\n", vf);
            return 2;
        }
        o.val_fraction = d;
    }
    if (sh) {
        if (!parse_i64(sh, 1, 1LL << 40, &v)) {
            fprintf(stderr, "suanli data prepare: --shard-tokens '%s' must be a positive integer\n", sh);
            return 2;
        }
        o.shard_tokens = v;
    }
    sl_status st = sl_data_prepare(&o);
    if (st != SL_OK) {
        fprintf(stderr, "suanli data: %s\n", sl_errmsg());
        return st == SL_ERR_INVALID ? 2 : 1;
    }
    printf("input      %s: %lld bytes\n", o.input, (long long)S.input_bytes);
    if (o.tokenizer_file) {
        sl_tokenizer *tk = NULL;
        if (sl_tokenizer_load(o.output_dir, &tk) == SL_OK)
            printf("tokenizer  %s/%s: %s from %s, vocab %d", o.output_dir, sl_tokenizer_file_name(tk),
                   sl_tokenizer_type(tk), o.tokenizer_file, S.vocab_size);
        sl_tokenizer_free(tk);
    } else {
        printf("tokenizer  %s/tokenizer.json: %s, vocab %d", o.output_dir, o.tokenizer_type, S.vocab_size);
    }
    if (S.tokenizer_sec > 0) printf(", trained in %.3f s", S.tokenizer_sec);
    printf("\n");
    printf("train      %s/train_000.bin%s: %lld tokens in %d shard%s\n", o.output_dir,
           S.train_shards > 1 ? " ..." : "", (long long)S.train_tokens, S.train_shards,
           S.train_shards > 1 ? "s" : "");
    printf("val        %s/val_000.bin%s: %lld tokens in %d shard%s\n", o.output_dir,
           S.val_shards > 1 ? " ..." : "", (long long)S.val_tokens, S.val_shards,
           S.val_shards > 1 ? "s" : "");
    printf("ratio      %.3f bytes/token; encode %.3f s; total %.3f s\n",
           (double)S.input_bytes /
               (double)(S.train_tokens + S.val_tokens > 0 ? S.train_tokens + S.val_tokens : 1),
           S.encode_sec, S.total_sec);
    return 0;
}

static int cmd_info(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "suanli data info: expected one argument DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    sl_tokenizer *tok = NULL;
    sl_status st = sl_tokenizer_load(dir, &tok);
    if (st != SL_OK) { /* no data dir there (no or a malformed tokenizer): bad input (it exited 1) */
        fprintf(stderr, "suanli data info: %s\n", sl_errmsg());
        return st == SL_ERR_NOMEM ? 1 : 2;
    }
    printf("tokenizer  %s, vocab %d\n", sl_tokenizer_type(tok), sl_tokenizer_vocab_size(tok));
    sl_tokenizer_free(tok);
    const char *splits[] = {"train", "val"};
    for (int i = 0; i < 2; i++) {
        sl_dataset *ds;
        if (sl_dataset_open(dir, splits[i], &ds) != SL_OK) { /* a shard that fails validation: 1 */
            fprintf(stderr, "suanli data info: %s\n", sl_errmsg());
            return 1;
        }
        printf("%-10s %lld tokens in %d shard(s), vocab %d, checksums ok\n", splits[i],
               (long long)sl_dataset_num_tokens(ds), sl_dataset_num_shards(ds), sl_dataset_vocab_size(ds));
        sl_dataset_close(ds);
    }
    return 0;
}

int sl_cmd_data(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "prepare")) return cmd_prepare(argc - 1, argv + 1);
    if (!strcmp(argv[1], "info")) return cmd_info(argc - 1, argv + 1);
    fprintf(stderr, "suanli data: unknown subcommand '%s' (expected prepare or info)\n", argv[1]);
    return 2;
}
