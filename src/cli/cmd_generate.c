/* suanli generate — sample text from weights saved by `suanli train --save DIR`. */
#include <string.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "suanli/data.h"
#include "suanli/model_io.h"

int sl_cli_print_sample(sl_model *m, const sl_tokenizer *tok, const char *prompt, int n_tokens, float temperature,
                        int top_k, uint64_t seed);

int sl_cmd_generate(int argc, char **argv) {
    const char *load = NULL, *prompt = "\n";
    int64_t n = 200, top_k = 0, seed = 1234, threads = 0;
    double temp = 0.8;
    sl_flag flags[] = {
        {"load", SL_FLAG_STR, &load, 0, 0, "dir with model.safetensors, config.json, tokenizer.json (required)", 0},
        {"prompt", SL_FLAG_STR, &prompt, 0, 0, "text to continue (newline)", 0},
        {"max-new-tokens", SL_FLAG_INT, &n, 1, 1e7, "tokens to generate (200)", 0},
        {"temperature", SL_FLAG_FLOAT, &temp, 0, 100, "0 = greedy (0.8)", 0},
        {"top-k", SL_FLAG_INT, &top_k, 0, 1 << 24, "0 = off", 0},
        {"seed", SL_FLAG_INT, &seed, 0, 9.007199254740992e15, "sampling seed (1234)", 0},
        {"threads", SL_FLAG_INT, &threads, 0, 1024, "compute threads", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: suanli generate --load DIR [flags]\n");
            sl_flags_usage(flags, nf, stdout);
            return 0;
        }
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli generate: %s\n", sl_errmsg());
        return 2;
    }
    if (!load) {
        fprintf(stderr, "suanli generate: --load is required\n");
        return 2;
    }
    if (threads > 0) sl_threads_set((int)threads);
    sl_model *m = NULL;
    sl_tokenizer *tok = NULL;
    char tp[4096];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", load);
    if (sl_model_load(load, &m) != SL_OK || sl_tokenizer_load(tp, &tok) != SL_OK) {
        fprintf(stderr, "suanli generate: %s\n", sl_errmsg());
        sl_model_free(m);
        return 2;
    }
    if (sl_tokenizer_vocab_size(tok) != m->cfg.vocab_size) {
        fprintf(stderr, "suanli generate: %s vocab %d does not match the model's %d\n", tp, sl_tokenizer_vocab_size(tok),
                m->cfg.vocab_size);
        sl_model_free(m);
        sl_tokenizer_free(tok);
        return 2;
    }
    int rc = sl_cli_print_sample(m, tok, prompt, (int)n, (float)temp, (int)top_k, (uint64_t)seed);
    sl_model_free(m);
    sl_tokenizer_free(tok);
    return rc;
}
