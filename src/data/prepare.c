/* `data prepare`: text file -> tokenizer.json + train/val token shards, all-or-nothing.
 *
 * Note [Atomic prepare]
 *   Every output is first written and fsynced under a hidden temporary name in the output directory
 *   (".train_000.bin.tmp.PID", ...). Only when all of them exist are they renamed into place, then stale
 *   shards of an earlier, larger prepare are removed (the loader reads <split>_000, _001 ... up to the first
 *   gap) and the directory is fsynced. Any failure before the renames unlinks the temporaries, so a reader
 *   never sees shards from two different runs or a half-written file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_internal.h"

#define MAX_STAGED 2048

typedef struct {
    char tmp[MAX_STAGED][2][1024]; /* [i][0] temporary, [i][1] final */
    int n;
} staging;

static sl_status stage_path(staging *sg, const char *dir, const char *name, char **tmp) {
    if (sg->n == MAX_STAGED)
        return sl_fail(SL_ERR_INVALID, "prepare: too many output files (raise --shard-tokens)");
    int a = snprintf(sg->tmp[sg->n][0], sizeof sg->tmp[0][0], "%s/.%s.tmp.%d", dir, name, (int)getpid());
    int b = snprintf(sg->tmp[sg->n][1], sizeof sg->tmp[0][1], "%s/%s", dir, name);
    if (a >= (int)sizeof sg->tmp[0][0] || b >= (int)sizeof sg->tmp[0][1])
        return sl_fail(SL_ERR_INVALID, "prepare: output path too long: %s", dir);
    *tmp = sg->tmp[sg->n][0];
    sg->n++;
    return SL_OK;
}

static void unstage_all(staging *sg) {
    for (int i = 0; i < sg->n; i++) unlink(sg->tmp[i][0]);
    sg->n = 0;
}

static sl_status write_split(staging *sg, const char *dir, const char *split, const int32_t *tok, int64_t n,
                             int vocab, int64_t per_shard, int *nshards) {
    int64_t ns = n == 0 ? 1 : (n + per_shard - 1) / per_shard;
    if (ns > 1000)
        return sl_fail(SL_ERR_INVALID,
                       "prepare: %lld shards for split %s; at most 1000 (raise the shard size)",
                       (long long)ns, split);
    for (int64_t s = 0; s < ns; s++) {
        char name[64], *tmp;
        snprintf(name, sizeof name, "%s_%03d.bin", split, (int)s);
        SL_TRY(stage_path(sg, dir, name, &tmp));
        int64_t off = s * per_shard, cnt = n - off < per_shard ? n - off : per_shard;
        void *buf;
        size_t len;
        SL_TRY(sl__shard_encode(tmp, tok + off, cnt, vocab, &buf, &len));
        sl_status st = sl_file_write_synced(tmp, buf, len);
        free(buf);
        if (st != SL_OK) return st;
    }
    *nshards = (int)ns;
    return SL_OK;
}

static void remove_stale(const char *dir, const char *split, int from) {
    char path[4200];
    for (int i = from;; i++) {
        snprintf(path, sizeof path, "%s/%s_%03d.bin", dir, split, i);
        if (unlink(path) != 0) break;
    }
}

sl_status sl_data_prepare(const sl_prepare_opts *o) {
    double t0 = sl_time_sec();
    if (!o || !o->input || !*o->input) return sl_fail(SL_ERR_INVALID, "prepare: --input is required");
    if (!o->output_dir || !*o->output_dir)
        return sl_fail(SL_ERR_INVALID, "prepare: --output-prefix is required");
    const char *tt = o->tokenizer_type ? o->tokenizer_type : "byte";
    const char *tf = o->tokenizer_file && *o->tokenizer_file ? o->tokenizer_file : NULL;
    int is_bpe = 0;
    if (tf)
        tt = "file";
    else if (!strcmp(tt, "byte"))
        is_bpe = 0;
    else if (!strcmp(tt, "bpe"))
        is_bpe = 1;
    else
        return sl_fail(SL_ERR_INVALID, "prepare: unknown tokenizer type '%s' (expected byte or bpe)", tt);
    if (tf && o->vocab_size != 0)
        return sl_fail(SL_ERR_INVALID, "prepare: --vocab-size does not apply to --tokenizer-file %s", tf);
    if (is_bpe && (o->vocab_size < 257 || o->vocab_size > SL_BPE_MAX_VOCAB))
        return sl_fail(SL_ERR_INVALID, "prepare: --vocab-size %d out of range for bpe: [257, %d]",
                       o->vocab_size, SL_BPE_MAX_VOCAB);
    if (!tf && !is_bpe && o->vocab_size != 0 && o->vocab_size != 256)
        return sl_fail(SL_ERR_INVALID, "prepare: the byte tokenizer has vocab size 256, not %d",
                       o->vocab_size);
    double vf = o->val_fraction == 0 ? 0.1 : o->val_fraction;
    if (!(vf > 0 && vf < 1)) return sl_fail(SL_ERR_INVALID, "prepare: val fraction %g must be in (0, 1)", vf);
    int64_t per_shard = o->shard_tokens ? o->shard_tokens : SL_SHARD_DEFAULT_TOKENS;
    if (per_shard < 1)
        return sl_fail(SL_ERR_INVALID, "prepare: shard size %lld must be >= 1", (long long)per_shard);

    struct stat sb;
    if (stat(o->input, &sb) != 0)
        return sl_fail(SL_ERR_INVALID, "prepare: input file %s: %s", o->input, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return sl_fail(SL_ERR_INVALID, "prepare: input %s is not a regular file", o->input);
    if (sb.st_size == 0) return sl_fail(SL_ERR_INVALID, "prepare: input file %s is empty", o->input);
    /* bad input as a bad --input is (it exited 1 as an I/O error), before anything is written */
    sl_tokenizer *tok = NULL;
    if (tf) {
        sl_status ts = sl_tokenizer_load(tf, &tok);
        if (ts != SL_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", sl_errmsg()); /* sl_fail formats into the same buffer */
            return ts == SL_ERR_NOMEM ? ts : sl_fail(SL_ERR_INVALID, "prepare: --tokenizer-file: %s", why);
        }
    }
    /* the highest directory of output_dir that is missing: a failure removes what this call made */
    char made[4096];
    snprintf(made, sizeof made, "%s", o->output_dir);
    if (access(made, F_OK) == 0)
        made[0] = 0;
    else
        for (char *s; (s = strrchr(made, '/')) && s != made;) {
            *s = 0;
            if (access(made, F_OK) == 0) {
                *s = '/';
                break;
            }
        }
    if (sl_mkdirs(o->output_dir) != SL_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", sl_errmsg());
        sl_tokenizer_free(tok);
        return sl_fail(SL_ERR_INVALID, "prepare: output directory not writable: %s", why);
    }

    sl_status st = SL_OK;
    char *text = NULL;
    size_t len = 0;
    int32_t *tr = NULL, *va = NULL;
    int64_t ntr = 0, nva = 0;
    sl_prepare_stats S;
    memset(&S, 0, sizeof S);
    staging *sg = calloc(1, sizeof *sg);
    if (!sg) {
        sl_tokenizer_free(tok);
        return sl_fail(SL_ERR_NOMEM, "prepare: out of memory");
    }
    SL_CHECK(sl_file_read_all(o->input, &text, &len));
    size_t nval = (size_t)floor((double)len * vf);
    size_t ntrain = len - nval;
    if (ntrain == 0 || nval == 0) {
        st = sl_fail(SL_ERR_INVALID, "prepare: input %s (%zu bytes) too small for a train/val split at %g",
                     o->input, len, vf);
        goto done;
    }
    double t1 = sl_time_sec();
    if (tf) { /* loaded before the output directory was made */
        if (strcmp(sl_tokenizer_type(tok), "byte") && strcmp(sl_tokenizer_type(tok), "bpe"))
            while (ntrain > 1 && ((unsigned char)text[ntrain] & 0xC0) == 0x80) ntrain--; /* UTF-8 boundary */
        nval = len - ntrain;
    } else if (is_bpe)
        SL_CHECK(sl_tokenizer_train_bpe(text, ntrain, o->vocab_size, &tok));
    else
        SL_CHECK(sl_tokenizer_new_byte(&tok));
    double t2 = sl_time_sec();
    size_t from = 0; /* the split being encoded starts at this byte of the input */
    st = sl_tokenizer_encode(tok, text, ntrain, &tr, &ntr);
    if (st == SL_OK) {
        from = ntrain;
        st = sl_tokenizer_encode(tok, text + ntrain, nval, &va, &nva);
    }
    if (st != SL_OK) {
        st = sl_fail(st, "prepare: input %s (%s split, from byte %zu): %s", o->input, from ? "val" : "train",
                     from, sl_errmsg());
        goto done;
    }
    double t3 = sl_time_sec();
    int V = sl_tokenizer_vocab_size(tok);
    SL_CHECK(write_split(sg, o->output_dir, "train", tr, ntr, V, per_shard, &S.train_shards));
    SL_CHECK(write_split(sg, o->output_dir, "val", va, nva, V, per_shard, &S.val_shards));
    char *tmp;
    const char *tname = sl_tokenizer_file_name(tok);
    SL_CHECK(stage_path(sg, o->output_dir, tname, &tmp));
    SL_CHECK(sl_tokenizer_save(tok, tmp));
    /* commit */
    for (int i = 0; i < sg->n; i++) {
        if (rename(sg->tmp[i][0], sg->tmp[i][1]) != 0) {
            st = sl_fail(SL_ERR_IO, "%s: rename failed: %s", sg->tmp[i][1], strerror(errno));
            for (int j = 0; j < i; j++) unlink(sg->tmp[j][1]); /* undo: leave no mixed set */
            goto done;
        }
    }
    sg->n = 0;
    { /* the loader prefers tokenizer.json: never leave one of an earlier prepare next to a tokenizer.model */
        char other[4200];
        snprintf(other, sizeof other, "%s/%s", o->output_dir,
                 strcmp(tname, "tokenizer.json") ? "tokenizer.json" : "tokenizer.model");
        unlink(other);
    }
    remove_stale(o->output_dir, "train", S.train_shards);
    remove_stale(o->output_dir, "val", S.val_shards);
    sl_fsync_dir(o->output_dir);
    S.input_bytes = (int64_t)len;
    S.train_tokens = ntr;
    S.val_tokens = nva;
    S.vocab_size = V;
    S.tokenizer_sec = is_bpe ? t2 - t1 : 0;
    S.encode_sec = t3 - t2;
    S.total_sec = sl_time_sec() - t0;
    if (o->stats) *o->stats = S;
done:
    unstage_all(sg);
    free(sg);
    if (st != SL_OK && made[0]) { /* rmdir: only what is still empty */
        char p[4096];
        snprintf(p, sizeof p, "%s", o->output_dir);
        for (char *s; rmdir(p) == 0 && strlen(p) > strlen(made) && (s = strrchr(p, '/'));) *s = 0;
    }
    free(text);
    free(tr);
    free(va);
    sl_tokenizer_free(tok);
    return st;
}
