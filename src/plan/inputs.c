/* The planner's inputs: cluster files (configs/cluster/ files) and model configurations (builtin names,
 * Hugging Face config.json, `suanli train` config files). Every error is one line naming the file and
 * the field. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json_util.h"
#include "suanli/hf.h"
#include "suanli/plan.h"

/* root[key] as a number in [lo, hi]; missing: *out = dflt, or an error when dflt is NAN */
static sl_status num(const cJSON *o, const char *path, const char *where, const char *key, double lo,
                     double hi, double dflt, double *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it) {
        if (isnan(dflt)) return sl_fail(SL_ERR_INVALID, "%s: missing field '%s%s'", path, where, key);
        *out = dflt;
        return SL_OK;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < lo || it->valuedouble > hi)
        return sl_fail(SL_ERR_INVALID, "%s: field '%s%s' must be a number in [%g, %g]", path, where, key, lo,
                       hi);
    *out = it->valuedouble;
    return SL_OK;
}

static sl_status integer(const cJSON *o, const char *path, const char *key, int64_t lo, int64_t hi,
                         int64_t *out) {
    double v = 0;
    SL_TRY(num(o, path, "", key, (double)lo, (double)hi, NAN, &v));
    if (v != floor(v)) return sl_fail(SL_ERR_INVALID, "%s: field '%s' must be an integer", path, key);
    *out = (int64_t)v;
    return SL_OK;
}

static sl_status link_of(const cJSON *links, const char *path, const char *name, sl_plan_link *l) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(links, name);
    char where[64];
    snprintf(where, sizeof where, "links.%s.", name);
    if (!cJSON_IsObject(o))
        return sl_fail(SL_ERR_INVALID, "%s: missing field 'links.%s' (an object with alpha_us, beta_GBps)",
                       path, name);
    double a = 0, b = 0;
    SL_TRY(num(o, path, where, "alpha_us", 0, 1e7, NAN, &a));
    SL_TRY(num(o, path, where, "beta_GBps", 1e-6, 1e6, NAN, &b));
    l->alpha_s = a * 1e-6;
    l->beta_Bps = b * 1e9;
    return SL_OK;
}

static sl_status cluster_fields(const cJSON *root, const char *path, sl_plan_cluster *cl) {
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
    snprintf(cl->name, sizeof cl->name, "%s", cJSON_IsString(nm) ? nm->valuestring : "cluster");
    SL_TRY(integer(root, path, "hosts", 1, 1 << 24, &cl->hosts));
    SL_TRY(integer(root, path, "devices_per_host", 1, 1 << 16, &cl->devices_per_host));
    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(root, "device");
    if (!cJSON_IsObject(dev))
        return sl_fail(SL_ERR_INVALID, "%s: missing field 'device' (peak_TFLOPs, memory_GiB, mem_bw_GBps)",
                       path);
    double tf = 0, gib = 0, bw = 0, eff = 0, res = 0;
    SL_TRY(num(dev, path, "device.", "peak_TFLOPs", 1e-6, 1e6, NAN, &tf));
    SL_TRY(num(dev, path, "device.", "memory_GiB", 1e-6, 1e6, NAN, &gib));
    SL_TRY(num(dev, path, "device.", "mem_bw_GBps", 1e-3, 1e6, NAN, &bw));
    SL_TRY(num(dev, path, "device.", "gemm_efficiency", 1e-3, 1, 0.5, &eff));
    SL_TRY(num(dev, path, "device.", "memory_reserve", 0, 0.9, 0.05, &res));
    cl->peak_flops = tf * 1e12;
    cl->mem_bytes = gib * 1073741824.0;
    cl->mem_bw_Bps = bw * 1e9;
    cl->gemm_efficiency = eff;
    cl->mem_reserve = res;
    const cJSON *links = cJSON_GetObjectItemCaseSensitive(root, "links");
    if (!cJSON_IsObject(links))
        return sl_fail(SL_ERR_INVALID, "%s: missing field 'links' (intra_host, inter_host)", path);
    SL_TRY(link_of(links, path, "intra_host", &cl->intra));
    const cJSON *inter = cJSON_GetObjectItemCaseSensitive(links, "inter_host");
    if (cl->hosts > 1 || inter)
        SL_TRY(link_of(links, path, "inter_host", &cl->inter));
    else
        cl->inter = cl->intra;
    cl->nics_per_host = cl->devices_per_host;
    if (cJSON_IsObject(inter)) {
        double nics = 0;
        SL_TRY(num(inter, path, "links.inter_host.", "nics_per_host", 1, 1 << 16,
                   (double)cl->devices_per_host, &nics));
        if (nics != floor(nics))
            return sl_fail(SL_ERR_INVALID, "%s: field 'links.inter_host.nics_per_host' must be an integer",
                           path);
        cl->nics_per_host = (int64_t)nics;
    }
    SL_TRY(num(links, path, "links.", "dp_overlap", 0, 1, 0.0, &cl->overlap));
    if (cl->hosts > 1 && cl->inter.beta_Bps > cl->intra.beta_Bps * 1.0001)
        return sl_fail(
            SL_ERR_INVALID,
            "%s: field 'links.inter_host.beta_GBps' (%g) is above links.intra_host.beta_GBps (%g): "
            "inconsistent",
            path, cl->inter.beta_Bps / 1e9, cl->intra.beta_Bps / 1e9);
    const cJSON *rel = cJSON_GetObjectItemCaseSensitive(root, "reliability");
    if (!cJSON_IsObject(rel))
        return sl_fail(SL_ERR_INVALID,
                       "%s: missing field 'reliability' (host_mtbf_hours, ckpt_write_GBps, ckpt_read_GBps)",
                       path);
    double w = 0, r = 0;
    SL_TRY(num(rel, path, "reliability.", "host_mtbf_hours", 1e-3, 1e9, NAN, &cl->mtbf_hours));
    SL_TRY(num(rel, path, "reliability.", "ckpt_write_GBps", 1e-6, 1e6, NAN, &w));
    SL_TRY(num(rel, path, "reliability.", "ckpt_read_GBps", 1e-6, 1e6, NAN, &r));
    SL_TRY(num(rel, path, "reliability.", "restart_sec", 0, 1e6, 30, &cl->restart_sec));
    double aw = 0, ar = 0; /* the store's aggregate bandwidth caps hosts x per-host (0: no cap) */
    SL_TRY(num(rel, path, "reliability.", "ckpt_aggregate_write_GBps", 0, 1e9, 0, &aw));
    SL_TRY(num(rel, path, "reliability.", "ckpt_aggregate_read_GBps", 0, 1e9, 0, &ar));
    cl->ckpt_agg_write_Bps = aw * 1e9;
    cl->ckpt_agg_read_Bps = ar * 1e9;
    cl->ckpt_write_Bps = w * 1e9;
    cl->ckpt_read_Bps = r * 1e9;
    const cJSON *la = cJSON_GetObjectItemCaseSensitive(root, "launcher");
    if (la && !cJSON_IsString(la)) /* "launcher": 1 or ["slurm"] planned for suanli run without a word */
        return sl_fail(SL_ERR_INVALID, "%s: field 'launcher' must be the string \"run\" or \"slurm\"", path);
    snprintf(cl->launcher, sizeof cl->launcher, "%s", cJSON_IsString(la) ? la->valuestring : "run");
    if (strcmp(cl->launcher, "run") && strcmp(cl->launcher, "slurm"))
        return sl_fail(SL_ERR_INVALID, "%s: field 'launcher' must be \"run\" or \"slurm\", got \"%s\"", path,
                       cl->launcher);
    return SL_OK;
}

sl_status sl_plan_cluster_load(const char *path, sl_plan_cluster *cl) {
    memset(cl, 0, sizeof *cl);
    cJSON *root;
    sl_status st = sl_json_read_object(path, &root);
    if (st != SL_OK) {
        char msg[1024]; /* sl_errmsg's buffer is the one sl_fail writes */
        snprintf(msg, sizeof msg, "%s", sl_errmsg());
        return sl_fail(SL_ERR_INVALID, "--cluster: %s", msg);
    }
    st = cluster_fields(root, path, cl);
    cJSON_Delete(root);
    return st;
}

sl_status sl_plan_cluster_apply_ckpt_bench(sl_plan_cluster *cl, const char *path) {
    cJSON *root;
    if (sl_json_read_object(path, &root) != SL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", sl_errmsg());
        return sl_fail(SL_ERR_INVALID, "--ckpt-bench: %s", msg);
    }
    double mib = 0, wmbs = 0, back = 0;
    sl_status st = num(root, path, "", "ckpt_mib", 1e-6, 1e12, NAN, &mib);
    if (st == SL_OK) st = num(root, path, "", "write_mb_s", 1e-6, 1e9, NAN, &wmbs);
    if (st == SL_OK) st = num(root, path, "", "kill_to_training_s", 0, 1e9, NAN, &back);
    cJSON_Delete(root);
    if (st != SL_OK) return st;
    cl->ckpt_write_Bps = wmbs * 1e6;
    double read_sec =
        back - cl->restart_sec; /* the rest of kill -> training again is reading the checkpoint */
    if (read_sec < 0.1 * back) read_sec = 0.1 * back;
    cl->ckpt_read_Bps = mib * 1048576.0 / read_sec;
    return SL_OK;
}

/* ---- models ---- */

typedef struct {
    const char *name;
    sl_plan_model m;
} builtin;

#define GPT2(nm, L, H, C, V, T)                                                                              \
    {                                                                                                        \
        nm, { nm, SL_PLAN_GPT2, L, C, H, H, (C) / (H), 4 * (C), V, T, 1, 0, 0, 0, 0, 0, 0 }                  \
    }
#define LLAMA(nm, L, H, KV, C, F, V, T, tie)                                                                 \
    {                                                                                                        \
        nm, { nm, SL_PLAN_LLAMA, L, C, H, KV, (C) / (H), F, V, T, tie, 0, 0, 0, 0, 0, 0 }                    \
    }
static const builtin BUILTINS[] = {
    GPT2("gpt2-tiny", 4, 4, 128, 256, 256),
    GPT2("gpt2-demo", 4, 6, 192, 256, 128),
    GPT2("gpt2-124m", 12, 12, 768, 50257, 1024),
    GPT2("gpt2-350m", 24, 16, 1024, 50257, 1024),
    GPT2("gpt2-774m", 36, 20, 1280, 50257, 1024),
    GPT2("gpt2-1.5b", 48, 25, 1600, 50257, 1024),
    LLAMA("llama-1b", 16, 32, 8, 2048, 8192, 128256, 8192, 1),
    LLAMA("llama-7b", 32, 32, 32, 4096, 11008, 32000, 4096, 0),
    LLAMA("llama-8b", 32, 32, 8, 4096, 14336, 128256, 8192, 0),
    LLAMA("llama-70b", 80, 64, 8, 8192, 28672, 128256, 8192, 0),
    LLAMA("llama-405b", 126, 128, 8, 16384, 53248, 128256, 8192, 0),
};

const char *sl_plan_builtin_names(void) {
    return "gpt2-tiny, gpt2-demo, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, llama-1b, llama-7b, llama-8b, "
           "llama-70b, llama-405b";
}

static sl_status check_model(const sl_plan_model *m, const char *src) {
    if (m->n_layer < 1 || m->hidden < 1 || m->n_head < 1 || m->vocab < 1 || m->ffn < 1)
        return sl_fail(SL_ERR_INVALID,
                       "--model %s: layers, hidden size, heads, ffn and vocabulary must be >= 1", src);
    if (m->hidden % m->n_head && m->arch == SL_PLAN_GPT2)
        return sl_fail(SL_ERR_INVALID, "--model %s: hidden size %lld is not a multiple of the heads %lld",
                       src, (long long)m->hidden, (long long)m->n_head);
    if (m->n_kv_head < 1 || m->n_head % m->n_kv_head)
        return sl_fail(SL_ERR_INVALID, "--model %s: %lld heads is not a multiple of %lld key/value heads",
                       src, (long long)m->n_head, (long long)m->n_kv_head);
    return SL_OK;
}

/* a `suanli train` config (configs/demo.json): GPT-2 sizes */
static sl_status from_train_config(const char *path, const cJSON *root, sl_plan_model *m) {
    int L, C, H, V = 50257, T = 1024;
    SL_TRY(sl_json_int(root, path, "num_layers", 1, &L));
    SL_TRY(sl_json_int(root, path, "hidden_size", 1, &C));
    SL_TRY(sl_json_int(root, path, "num_attention_heads", 1, &H));
    if (cJSON_GetObjectItemCaseSensitive(root, "vocab_size"))
        SL_TRY(sl_json_int(root, path, "vocab_size", 1, &V));
    if (cJSON_GetObjectItemCaseSensitive(root, "seq_length"))
        SL_TRY(sl_json_int(root, path, "seq_length", 1, &T));
    *m = (sl_plan_model){"", SL_PLAN_GPT2, L, C, H, H, C / H, 4 * (int64_t)C, V, T, 1, 0, 0, 0, 0, 0, 0};
    return SL_OK;
}

static sl_status from_hf(const char *dir, sl_plan_model *m) {
    sl_hf_config c;
    SL_TRY(sl_hf_config_read(dir, &c, NULL));
    if (c.arch == SL_HF_GPT2) {
        *m = (sl_plan_model){"",
                             SL_PLAN_GPT2,
                             c.n_layer,
                             c.hidden,
                             c.n_head,
                             c.n_head,
                             c.hidden / c.n_head,
                             4 * (int64_t)c.hidden,
                             c.vocab_size,
                             c.max_seq_len,
                             1,
                             0,
                             0,
                             0,
                             0,
                             0,
                             0};
    } else {
        *m = (sl_plan_model){"",
                             SL_PLAN_LLAMA,
                             c.n_layer,
                             c.hidden,
                             c.n_head,
                             c.n_kv_head,
                             c.head_dim,
                             c.intermediate,
                             c.vocab_size,
                             c.max_seq_len,
                             c.tie_embeddings,
                             c.n_experts,
                             c.n_experts_per_tok,
                             c.arch == SL_HF_MIXTRAL ? c.intermediate : c.moe_intermediate,
                             c.shared_intermediate,
                             c.arch == SL_HF_DEEPSEEK_V3 ? c.first_dense : 0,
                             c.arch == SL_HF_QWEN2_MOE     ? SL_PLAN_MOE_QWEN2
                             : c.arch == SL_HF_DEEPSEEK_V3 ? SL_PLAN_MOE_DEEPSEEK
                                                           : SL_PLAN_MOE_MIXTRAL};
    }
    return SL_OK;
}

sl_status sl_plan_model_load(const char *spec, sl_plan_model *md) {
    memset(md, 0, sizeof *md);
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (!strcmp(spec, BUILTINS[i].name)) {
            *md = BUILTINS[i].m;
            return SL_OK;
        }
    struct stat sb;
    if (stat(spec, &sb) != 0)
        return sl_fail(SL_ERR_INVALID, "--model: '%s' is neither a file, a directory nor a builtin (%s)",
                       spec, sl_plan_builtin_names());
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", spec);
    sl_status st = SL_OK;
    if (S_ISDIR(sb.st_mode)) {
        st = from_hf(dir, md);
    } else {
        cJSON *root;
        st = sl_json_read_object(spec, &root);
        if (st == SL_OK) {
            if (cJSON_GetObjectItemCaseSensitive(root, "num_layers")) {
                st = from_train_config(spec, root, md);
            } else { /* an HF config.json: its directory (which is read as DIR/config.json) */
                char *slash = strrchr(dir, '/');
                if (strcmp(slash ? slash + 1 : dir, "config.json") != 0)
                    st = sl_fail(SL_ERR_INVALID,
                                 "%s: no 'num_layers' (not a train config) and not named config.json (an HF "
                                 "config: give its directory)",
                                 spec);
                else if (slash)
                    *slash = 0;
                else
                    snprintf(dir, sizeof dir, ".");
                if (st == SL_OK) st = from_hf(dir, md);
            }
            cJSON_Delete(root);
        }
    }
    if (st != SL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", sl_errmsg());
        return sl_fail(SL_ERR_INVALID, "--model: %s", msg);
    }
    const char *base = strrchr(spec, '/');
    snprintf(md->name, sizeof md->name, "%s", base && base[1] ? base + 1 : spec);
    return check_model(md, spec);
}
