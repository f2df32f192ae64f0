/* generate_hf — load a Hugging Face model directory and continue a prompt, with suanli's public API only.
 *
 *   generate_hf HF_DIR [PROMPT] [MAX_NEW_TOKENS] [TEMPERATURE]
 *
 * HF_DIR holds config.json, model.safetensors (or an index with shards) and tokenizer.json: Llama, Qwen2,
 * Mistral, Mixtral, Baichuan2 or GPT-2 (see suanli/hf.h). The text streams to stdout as it is generated;
 * a summary line goes to stderr. Exit status: 0 ok, 1 generation failed, 2 bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <suanli/suanli.h>

static int print_token(void *user, int32_t id) {
    const sl_hf_tokenizer *tok = user;
    char buf[256];
    int n = sl_hf_tokenizer_decode_one(tok, id, buf, (int)sizeof buf);
    if (n > 0) fwrite(buf, 1, (size_t)n, stdout);
    fflush(stdout);
    return 0; /* 0: keep going (stop tokens are handled by sl_model_generate) */
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s HF_DIR [PROMPT] [MAX_NEW_TOKENS] [TEMPERATURE]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *prompt = argc > 2 ? argv[2] : "Hello";
    int max_new = argc > 3 ? atoi(argv[3]) : 32;
    float temperature = argc > 4 ? (float)atof(argv[4]) : 0.0f; /* 0: greedy */
    sl_model *m = NULL;
    sl_hf_tokenizer *tok = NULL;
    sl_hf_info info;
    int32_t *ids = NULL, *out = NULL;
    int n = 0, rc = 2;
    char path[4096];

    fprintf(stderr, "suanli %s\n", sl_version());
    if (sl_hf_load(dir, &m, &info) != SL_OK) goto fail; /* f32; sl_hf_load_ex(dir, SL_BF16, ...) for bf16 */
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (sl_hf_tokenizer_load(path, &tok) != SL_OK) goto fail;
    if (sl_hf_tokenizer_encode(tok, prompt, 1, &ids, &n) != SL_OK) goto fail; /* 1: add BOS etc. */
    if (n + max_new > m->cfg.max_seq_len && m->arch != SL_ARCH_GPT2) {
        fprintf(stderr, "prompt (%d tokens) + %d new tokens exceed the model's %d positions\n", n, max_new,
                m->cfg.max_seq_len);
        goto done;
    }
    out = calloc((size_t)max_new + 1, sizeof *out);
    if (!out) goto done;

    sl_sample_opts so = {.temperature = temperature, .top_k = 40, .top_p = 1.0f, .seed = 1234};
    sl_gen_stats gs;
    fputs(prompt, stdout);
    /* stop at any of the model's eos tokens (config.json / generation_config.json) */
    if (sl_model_generate(m, ids, n, max_new, &so, info.eos_ids, info.n_eos, print_token, tok, out, &gs) !=
        SL_OK) {
        rc = 1;
        goto fail;
    }
    printf("\n");
    fprintf(stderr, "generate_hf: %s (%s), prompt %d tokens, generated %d tokens in %.3f s%s\n", dir,
            sl_arch_name(m->arch), gs.n_prompt, gs.n_generated, gs.prompt_seconds + gs.gen_seconds,
            gs.stopped_by_eos ? " (stopped at eos)" : "");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "generate_hf: %s\n", sl_errmsg());
done:
    free(ids);
    free(out);
    sl_hf_tokenizer_free(tok);
    sl_model_free(m);
    return rc;
}
