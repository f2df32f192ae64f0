/* suanli generate — sample text from weights saved by `suanli train --save DIR` (--load), or from a
 * Hugging Face model directory (--model: config.json, safetensors shards, tokenizer.json). */
#include <ctype.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "suanli/ckpt.h"
#include "suanli/data.h"
#include "suanli/hf.h"
#include "suanli/model_io.h"
#include "suanli/train.h"

/* Print a sample continuing `prompt` (sl_train_sample_print) and its timing; an exit code. */
static int print_sample(sl_model *m, const sl_tokenizer *tok, const char *prompt, int n_tokens,
                        float temperature, int top_k, uint64_t seed) {
    double dt;
    sl_status st = sl_train_sample_print(m, tok, prompt, n_tokens, temperature, top_k, seed, stdout, &dt);
    if (st != SL_OK) {
        fprintf(stderr, "suanli: %s\n", sl_errmsg());
        return st == SL_ERR_INVALID ? 2 : 1;
    }
    fprintf(stderr, "[generated %d tokens in %.2f s, %.1f tokens/s]\n", n_tokens, dt,
            n_tokens / (dt > 0 ? dt : 1));
    return 0;
}

/* "1,2,3" -> ids; tokens that are not integers are looked up in the tokenizer (e.g. "<|im_end|>") */
static int parse_id_list(const char *s, const sl_hf_tokenizer *tok, int V, int32_t **out, int *n,
                         const char *flag) {
    int cap = 16;
    *n = 0;
    size_t len = strlen(s);
    if (len && (s[0] == ',' || s[len - 1] == ',' || strstr(s, ",,"))) { /* strtok_r would skip it */
        fprintf(stderr, "suanli generate: --%s: '%s' has an empty entry\n", flag, s);
        *out = NULL;
        return 0;
    }
    *out = malloc(sizeof(int32_t) * (size_t)cap);
    char *copy = strdup(s), *save = NULL;
    if (!*out || !copy) {
        free(copy);
        return 0;
    }
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end || end == t) v = tok ? sl_hf_tokenizer_token_id(tok, t) : -1;
        if (v < 0 || v >= V) {
            fprintf(stderr, "suanli generate: --%s: '%s' is not a token id in [0, %d)%s\n", flag, t, V,
                    tok ? " or a token" : "");
            free(copy);
            return 0;
        }
        if (*n == cap) {
            cap *= 2;
            int32_t *p = realloc(*out, sizeof(int32_t) * (size_t)cap);
            if (!p) {
                free(copy);
                return 0;
            }
            *out = p;
        }
        (*out)[(*n)++] = (int32_t)v;
    }
    free(copy);
    if (!*n) fprintf(stderr, "suanli generate: --%s is empty\n", flag);
    return *n > 0;
}

/* 1 when a comma-separated list has an entry that is not an integer (a token name to look up) */
static int has_names(const char *s) {
    for (const char *e = s; *e;) {
        size_t n = strcspn(e, ",");
        char *end;
        (void)strtol(e, &end, 10);
        if (n && end != e + n) return 1; /* an empty entry is parse_id_list's error */
        e += n + (e[n] == ',');
    }
    return 0;
}

typedef struct {
    const sl_hf_tokenizer *tok;
} stream;

static int stream_cb(void *user, int32_t t) {
    stream *s = user;
    if (!s->tok) return 0;
    char buf[512];
    int n = sl_hf_tokenizer_decode_one(s->tok, t, buf, sizeof buf);
    if (n > 0) fwrite(buf, 1, (size_t)n, stdout);
    fflush(stdout);
    return 0;
}

/* A model dir given to the other flag: suanli's own config.json names "architecture", a Hugging Face
 * one "architectures" / "model_type". The hint for the error, "" when the flag fits or the dir is neither */
static const char *other_flag_hint(const char *dir, int is_model_flag) {
    char p[4096], *t = NULL;
    size_t n;
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (sl_file_read_all(p, &t, &n) != SL_OK) return "";
    cJSON *r = cJSON_ParseWithLength(t, n);
    free(t);
    int own = cJSON_GetObjectItemCaseSensitive(r, "architecture") != NULL,
        hf = cJSON_GetObjectItemCaseSensitive(r, "architectures") ||
             cJSON_GetObjectItemCaseSensitive(r, "model_type");
    cJSON_Delete(r);
    if (is_model_flag && own && !hf) return " (this is a suanli model dir: use --load)";
    if (!is_model_flag && hf && !own) return " (this is a Hugging Face model dir: use --model)";
    return "";
}

static int run_hf(const char *dir, sl_backend *be, sl_dtype wdtype, const char *prompt,
                  const char *prompt_ids, const char *stop, int ignore_eos, int print_ids, int max_new,
                  const sl_sample_opts *so) {
    sl_model *m = NULL;
    sl_hf_tokenizer *tok = NULL;
    sl_hf_info info;
    int32_t *ids = NULL, *stops = NULL, *out = NULL;
    int n = 0, n_stop = 0, rc = 2;
    char path[4096];
    double t0 = sl_time_sec();
    /* a --dtype the --device cannot run is refused before the weights load (Note [Generation probe]) */
    sl_llama_config pc;
    if (be != sl_backend_cpu() && sl_hf_load_config(dir, &pc, NULL) == SL_OK &&
        sl_model_generate_probe(&pc, wdtype == SL_F16 ? SL_F32 : wdtype, wdtype, be) != SL_OK) {
        fprintf(stderr, "suanli generate: --dtype %s --device %s: cannot run %s (%s); --device cpu can\n",
                sl_dtype_name(wdtype), be->name, sl_arch_name(pc.arch), sl_errmsg());
        return 2;
    }
    /* f16: f32 weights, f16 compute (torch.autocast fp16 numerics: Note [Half autocast]) */
    if (sl_hf_load_on(dir, wdtype == SL_F16 ? SL_F32 : wdtype, be, &m, &info) != SL_OK) {
        fprintf(stderr, "suanli generate: %s%s\n", sl_errmsg(), other_flag_hint(dir, 1));
        return 2;
    }
    if (wdtype == SL_F16) m->compute_dtype = SL_F16;
    double load_s = sl_time_sec() - t0;
    int V = m->cfg.vocab_size;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    /* the tokenizer encodes --prompt, looks up token names in --prompt-ids / --stop and decodes the text
     * printed without --print-ids; with --prompt-ids it was loaded for none of these (names refused, the
     * generated text silently not printed). Needed: its errors stop; wanted only for the text: ids instead */
    int need_tok = !prompt_ids || prompt || has_names(prompt_ids) || (stop && has_names(stop));
    if (need_tok || (!print_ids && access(path, F_OK) == 0)) {
        if (sl_hf_tokenizer_load(path, &tok) != SL_OK) {
            if (need_tok) {
                fprintf(stderr, "suanli generate: %s (needed to %s)\n", sl_errmsg(),
                        !prompt_ids || prompt ? "encode the --prompt" : "look up token names");
                goto done;
            }
            tok = NULL;
        }
    }
    int ids_only = !print_ids && !tok; /* said after the flags' checks, whose errors are one line */
    if (ids_only) print_ids = 1;
    if (tok) {
        if (sl_hf_tokenizer_vocab_size(tok) > V) {
            fprintf(stderr, "suanli generate: %s has %d tokens but the model's vocab_size is %d\n", path,
                    sl_hf_tokenizer_vocab_size(tok), V);
            goto done;
        }
    }
    if (prompt_ids) {
        if (!parse_id_list(prompt_ids, tok, V, &ids, &n, "prompt-ids")) goto done;
    } else {
        sl_status est = sl_hf_tokenizer_encode(tok, prompt ? prompt : "", 1, &ids, &n);
        if (est != SL_OK || n == 0) { /* the encoder's reason first (invalid UTF-8 read as "empty") */
            fprintf(stderr, "suanli generate: cannot encode the --prompt: %s\n",
                    est != SL_OK ? sl_errmsg() : "it is empty");
            goto done;
        }
    }
    if (stop && !parse_id_list(stop, tok, V, &stops, &n_stop, "stop")) goto done;
    if (!ignore_eos && !stop) {
        stops = malloc(sizeof(int32_t) * SL_HF_MAX_EOS);
        if (!stops) goto done;
        for (int i = 0; i < info.n_eos; i++)
            if (info.eos_ids[i] >= 0 && info.eos_ids[i] < V) stops[n_stop++] = info.eos_ids[i];
    }
    /* the last generated token takes no position; GPT-2 refills its cache in windows */
    if (m->arch != SL_ARCH_GPT2 && (int64_t)n + max_new - 1 > m->lcfg.max_seq_len) {
        fprintf(stderr,
                "suanli generate: prompt (%d tokens) + --max-new-tokens (%d) - 1 exceeds the model's %d "
                "positions\n",
                n, max_new, m->lcfg.max_seq_len);
        goto done;
    }
    out = calloc((size_t)max_new + 1, sizeof(int32_t));
    if (!out) goto done;
    if (ids_only) fprintf(stderr, "suanli generate: no usable %s to decode the tokens: printing ids\n", path);
    fprintf(stderr,
            "[%s: %s, %.2fM params, weights %s on disk in %d file(s)%s, %s compute, loaded in %.2f s; prompt "
            "%d tokens]\n",
            dir, sl_arch_name(m->arch), (double)(m->numel + m->wnumel) / 1e6, info.disk_dtype, info.n_files,
            info.n_mapped ? " (memory-mapped)" : "", sl_dtype_name(wdtype), load_s, n);
    if (prompt && !print_ids) fputs(prompt, stdout);
    stream s = {print_ids ? NULL : tok};
    sl_gen_stats gs;
    if (sl_model_generate(m, ids, n, max_new, so, stops, n_stop, stream_cb, &s, out, &gs) != SL_OK) {
        fprintf(stderr, "\nsuanli generate: %s\n", sl_errmsg());
        rc = 1;
        goto done;
    }
    if (print_ids) {
        printf("{\"prompt_ids\": [");
        for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("], \"ids\": [");
        for (int i = 0; i < gs.n_generated; i++) printf("%s%d", i ? ", " : "", out[i]);
        printf("]}\n");
    } else {
        printf("\n");
    }
    int dec = gs.n_generated > 1 ? gs.n_generated - 1 : 0;
    fprintf(stderr,
            "[prompt: %d tokens in %.3f s, %.1f tokens/s | generation: %d tokens, %d decode steps in %.3f s, "
            "%.1f tokens/s%s]\n",
            n, gs.prompt_seconds, n / (gs.prompt_seconds > 0 ? gs.prompt_seconds : 1e-9), gs.n_generated, dec,
            gs.gen_seconds, dec / (gs.gen_seconds > 0 ? gs.gen_seconds : 1e-9),
            gs.stopped_by_eos ? ", stopped at a stop token" : "");
    rc = 0;
done:
    free(ids);
    free(stops);
    free(out);
    sl_hf_tokenizer_free(tok);
    sl_model_free(m);
    return rc;
}

/* --load of a checkpoint (a step dir that train --save-interval wrote, or the root holding `latest` and no
 * model.safetensors): the step's parameters, resharded whole from any saved layout (sl_ckpt_load), into a
 * GPT-2 built from its config.json; the tokenizer is the step dir's, else the run dir's (train --save writes
 * it there). A checkpoint of an --init-from model is refused naming the command that makes a model of it.
 * An exit code; 0 with *m and *tok set. */
static int load_checkpoint(const char *load, sl_backend *be, sl_model **m, sl_tokenizer **tok) {
    char step[4096], p[4200], run[4096], *t = NULL;
    size_t n;
    snprintf(p, sizeof p, "%s/manifest.json", load);
    if (access(p, F_OK) == 0)
        snprintf(step, sizeof step, "%s", load);
    else if (sl_ckpt_find_latest(load, step, sizeof step) != SL_OK) {
        fprintf(stderr, "suanli generate: --load %s: %s\n", load, sl_errmsg());
        return 2;
    }
    snprintf(p, sizeof p, "%s/config.json", step);
    cJSON *r = sl_file_read_all(p, &t, &n) == SL_OK ? cJSON_ParseWithLength(t, n) : NULL;
    free(t);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(r, "architecture");
    if (cJSON_IsString(a) && strcmp(a->valuestring, "gpt2")) {
        const char *sn = strstr(step, "step-");
        fprintf(
            stderr,
            "suanli generate: --load %s: a checkpoint of an --init-from %s model; make a model dir of it "
            "with "
            "`suanli train --data-path DATA --init-from HF_DIR --load %s --train-iters %lld --save OUT` (no "
            "more steps), then generate --model OUT\n",
            step, a->valuestring, step, sn ? atoll(sn + 5) : 0LL);
        cJSON_Delete(r);
        return 2;
    }
    cJSON_Delete(r);
    sl_gpt2_config cfg;
    sl_ckpt_state st = {0};
    if (sl_model_load_config(step, &cfg) != SL_OK || sl_gpt2_new_on(&cfg, be, m) != SL_OK ||
        (st.m = *m, sl_ckpt_load(step, &st)) != SL_OK) {
        fprintf(stderr, "suanli generate: --load %s: %s\n", step, sl_errmsg());
        return 2;
    }
    snprintf(run, sizeof run, "%s", step);
    char *sl = strrchr(run, '/');
    if (sl && sl > run && !sl[1]) *sl = 0, sl = strrchr(run, '/'); /* "run/step-N/" */
    if (sl)
        *sl = 0;
    else
        snprintf(run, sizeof run, ".");
    if (sl_tokenizer_load(step, tok) != SL_OK && sl_tokenizer_load(run, tok) != SL_OK) {
        fprintf(
            stderr,
            "suanli generate: --load %s: no tokenizer.json or tokenizer.model there or in %s (train --save "
            "writes it at the end of the run; copy the data's)\n",
            step, run);
        return 2;
    }
    fprintf(stderr, "[%s: checkpoint of step %lld]\n", step, (long long)st.step);
    return 0;
}

int sl_cmd_generate(int argc, char **argv) {
    const char *load = NULL, *model = NULL, *prompt = NULL, *prompt_ids = NULL, *stop = NULL, *dtype = "f32",
               *device = "cpu";
    int64_t n = 200, top_k = 0, seed = 1234, threads = 0;
    double temp = 0.8, top_p = 1.0;
    int ignore_eos = 0, print_ids = 0;
    sl_flag flags[] = {
        {"load", SL_FLAG_STR, &load, 0, 0,
         "dir with model.safetensors, config.json, tokenizer.json from suanli train, or a GPT-2 checkpoint "
         "(a "
         "step-N dir of --save-interval, or its run dir's latest)",
         0},
        {"model", SL_FLAG_STR, &model, 0, 0,
         "Hugging Face model dir (config.json, safetensors [+ index], tokenizer.json)", 0},
        {"prompt", SL_FLAG_STR, &prompt, 0, 0, "text to continue (newline)", 0},
        {"prompt-ids", SL_FLAG_STR, &prompt_ids, 0, 0,
         "--model: comma-separated prompt token ids instead of text", 0},
        {"max-new-tokens", SL_FLAG_INT, &n, 1, 1e7, "tokens to generate (200)", 0},
        {"temperature", SL_FLAG_FLOAT, &temp, 0, 100, "0 = greedy (0.8)", 0},
        {"top-k", SL_FLAG_INT, &top_k, 0, 1 << 24, "0 = off", 0},
        {"top-p", SL_FLAG_FLOAT, &top_p, 1e-6, 1, "nucleus sampling mass, 1 = off (--model)", 0},
        {"stop", SL_FLAG_STR, &stop, 0, 0,
         "--model: comma-separated stop token ids or tokens (default: the model's eos)", 0},
        {"ignore-eos", SL_FLAG_BOOL, &ignore_eos, 0, 1, "--model: do not stop at eos", 0},
        {"print-ids", SL_FLAG_BOOL, &print_ids, 0, 1,
         "--model: print prompt and generated ids as JSON instead of text (the default without a "
         "tokenizer.json)",
         0},
        {"dtype", SL_FLAG_STR, &dtype, 0, 0,
         "--model: f32 (exact) | bf16 (bf16 weights, memory-mapped when stored bf16; bf16 compute) | f16 "
         "(f32 "
         "weights, torch.autocast fp16 compute)",
         0},
        {"seed", SL_FLAG_INT, &seed, 0, 9.007199254740992e15, "sampling seed (1234)", 0},
        {"threads", SL_FLAG_INT, &threads, 0, 1024, "compute threads", 0},
        {"device", SL_FLAG_STR, &device, 0, 0,
         "backend: cpu (default), opencl[:N], strict (test backend); suanli devices lists them", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: suanli generate (--load DIR | --model HF_DIR) [flags]\n");
            sl_flags_usage(flags, nf, stdout);
            return 0;
        }
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli generate: %s\n", sl_errmsg());
        return 2;
    }
    if (!load == !model) {
        fprintf(stderr, "suanli generate: exactly one of --load or --model is required\n");
        return 2;
    }
    if (load) { /* the --model-only flags are refused, not ignored */
        static const char *const model_only[] = {"dtype",      "top-p",     "stop",
                                                 "ignore-eos", "print-ids", "prompt-ids"};
        for (size_t k = 0; k < sizeof model_only / sizeof model_only[0]; k++) {
            const sl_flag *f = sl_flags_find(flags, nf, model_only[k]);
            if (f && f->set) {
                fprintf(stderr,
                        "suanli generate: --%s applies to --model only; --load samples with --prompt, "
                        "--max-new-tokens, --temperature, --top-k and --seed\n",
                        model_only[k]);
                return 2;
            }
        }
    }
    if (threads > 0) sl_threads_set((int)threads);
    sl_backend *be = sl_backend_get(device);
    if (!be) {
        fprintf(stderr, "suanli generate: --device: %s\n", sl_errmsg());
        return 2;
    }
    if (model) {
        if (prompt && prompt_ids) {
            fprintf(stderr, "suanli generate: give --prompt or --prompt-ids, not both\n");
            return 2;
        }
        sl_dtype wd = !strcmp(dtype, "f32")    ? SL_F32
                      : !strcmp(dtype, "bf16") ? SL_BF16
                      : !strcmp(dtype, "f16")  ? SL_F16
                                               : SL_DTYPE_COUNT;
        if (wd == SL_DTYPE_COUNT) {
            fprintf(stderr, "suanli generate: --dtype must be f32, bf16 or f16, got '%s'\n", dtype);
            return 2;
        }
        sl_sample_opts so = {(float)temp, (int)top_k, (float)top_p, (uint64_t)seed};
        return run_hf(model, be, wd, prompt, prompt_ids, stop, ignore_eos, print_ids, (int)n, &so);
    }
    if (!prompt) prompt = "\n";
    sl_model *m = NULL;
    sl_tokenizer *tok = NULL;
    char tp[4096];
    /* the dir's tokenizer.json, else tokenizer.model: train --save copies the data's (SentencePiece data has
     * the latter, which a fixed "tokenizer.json" did not find) */
    snprintf(tp, sizeof tp, "%s/model.safetensors", load);
    if (access(tp, F_OK) != 0 && sl_ckpt_is_checkpoint(load)) {
        int lrc = load_checkpoint(load, be, &m, &tok);
        if (lrc != 0) {
            sl_model_free(m);
            return lrc;
        }
    } else if (sl_model_load_on(load, be, &m) != SL_OK || sl_tokenizer_load(load, &tok) != SL_OK) {
        fprintf(stderr, "suanli generate: %s%s\n", sl_errmsg(), m ? "" : other_flag_hint(load, 0));
        sl_model_free(m);
        return 2;
    }
    snprintf(tp, sizeof tp, "%s/%s", load, sl_tokenizer_file_name(tok));
    if (sl_tokenizer_vocab_size(tok) != m->cfg.vocab_size) {
        fprintf(stderr, "suanli generate: %s vocab %d does not match the model's %d\n", tp,
                sl_tokenizer_vocab_size(tok), m->cfg.vocab_size);
        sl_model_free(m);
        sl_tokenizer_free(tok);
        return 2;
    }
    int rc = print_sample(m, tok, prompt, (int)n, (float)temp, (int)top_k, (uint64_t)seed);
    sl_model_free(m);
    sl_tokenizer_free(tok);
    return rc;
}
