/* suanli ckpt inspect|verify DIR — DIR is a step dir or a checkpoint root (its newest valid step), or a
 * pooled store (--ckpt-local-dir: host-<h>/ subdirectories): placement and redundancy of its newest step.
 * suanli ckpt gather POOL OUT [--step N] — assemble a pooled checkpoint into the plain checkpoint root OUT.
 * Under `suanli run -n H` (one rank per host) the pooled forms run on a cluster without a shared file
 * system: rank h reads only POOL/host-<h>, its node-local disk, and the other hosts' files come over the
 * comm library (sl_ckpt_pool_*_comm); rank 0 prints and writes OUT. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "suanli/ckpt.h"
#include "suanli/comm.h"

/* the job's communicator when run as `suanli run -n H` (one rank per host), else NULL; *bad: exit code */
static sl_comm *hosts_comm(const char *cmd, int *bad) {
    sl_comm_env env = {0};
    sl_comm *w = NULL;
    *bad = 0;
    if (sl_comm_env_detect(&env) != SL_OK || env.size <= 1) return NULL;
    const char *hs = getenv("SUANLI_HOSTS");
    if (hs && *hs && atoi(hs) != env.size) {
        fprintf(stderr, "suanli ckpt %s: run one rank per host (SUANLI_HOSTS=%s, %d ranks)\n", cmd, hs,
                env.size);
        *bad = 2;
        return NULL;
    }
    if (sl_comm_init_env(&w, NULL) != SL_OK) {
        fprintf(stderr, "suanli ckpt %s: %s\n", cmd, sl_errmsg());
        *bad = 1;
        return NULL;
    }
    return w;
}

/* 1 on every rank when ok holds on every rank (w NULL: ok itself) */
static int all_ok(sl_comm *w, int ok) {
    int32_t v = ok != 0, r = 0;
    if (!w) return ok;
    if (sl_comm_all_reduce(w, &v, &r, 1, SL_COMM_I32, SL_COMM_MIN) != SL_OK) return 0;
    return r;
}
static int any_ok(sl_comm *w, int ok) {
    int32_t v = ok != 0, r = 0;
    if (!w) return ok;
    if (sl_comm_all_reduce(w, &v, &r, 1, SL_COMM_I32, SL_COMM_MAX) != SL_OK) return 0;
    return r;
}

/* The exit status of a failed pooled read (Note [Transfer failures] in src/ckpt/pool.c): a transfer that
 * failed (a peer host lost, a connection reset, a deadline passed) is a runtime failure, 1, which a retry
 * may cure; missing or damaged data is 2. A transfer failure is printed by every rank that saw it (rank 0
 * may be the host that was lost), anything else by rank 0. */
static int pooled_failure(const char *what, sl_status st, int me) {
    int peer = st == SL_ERR_PEER || st == SL_ERR_TIMEOUT;
    if (me == 0 || peer) fprintf(stderr, "suanli ckpt %s: %s\n", what, sl_errmsg());
    return peer ? 1 : 2;
}

static int usage(FILE *f) {
    fprintf(
        f,
        "usage: suanli ckpt inspect|verify DIR\n"
        "       suanli ckpt gather POOL OUT [--step N]\n"
        "  DIR   a step dir, a checkpoint root (--save), or a pooled store (--ckpt-local-dir)\n"
        "  POOL  a pooled store; OUT (new or empty) receives OUT/step-N and OUT/latest, a checkpoint that\n"
        "        `suanli train --load OUT` resumes (newest step the surviving hosts can rebuild, or --step "
        "N)\n"
        "exit status: 0 ok; 2 bad arguments, or data missing or damaged; 1 a transfer from a peer host\n"
        "failed (under suanli run: a host lost, a connection reset, SUANLI_COMM_TIMEOUT passed) or another\n"
        "runtime failure\n");
    return f == stdout ? 0 : 2;
}

static int dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n == 0;
}

/* The arguments' shape (sl_cmd_ckpt: argc >= 2): one line naming what is wrong and 2, else 0. A wrong
 * subcommand, a missing or extra argument and `--step` without a value printed the whole usage text. */
static int check_args(int argc, char **argv) {
    const char *sub = argv[1];
    int gathering = !strcmp(sub, "gather");
    if (!gathering && strcmp(sub, "inspect") != 0 && strcmp(sub, "verify") != 0) {
        fprintf(stderr, "suanli ckpt: unknown subcommand '%s' (expected inspect, verify or gather)\n", sub);
        return 2;
    }
    int want = gathering ? 4 : 3;
    if (argc < want) {
        fprintf(stderr, "suanli ckpt %s: expected %s (see suanli ckpt --help)\n", sub,
                gathering ? "POOL and OUT" : "one argument DIR");
        return 2;
    }
    for (int i = 2; i < want; i++)
        if (!argv[i][0]) {
            fprintf(stderr, "suanli ckpt %s: %s: empty path\n", sub,
                    i == 2 ? (gathering ? "POOL" : "DIR") : "OUT");
            return 2;
        }
    if (argc > want && (!gathering || strcmp(argv[4], "--step") != 0 || argc > 6)) {
        const char *a = gathering && !strcmp(argv[4], "--step") ? argv[6] : argv[want];
        fprintf(stderr, "suanli ckpt %s: unexpected argument '%s'\n", sub, a);
        return 2;
    }
    if (argc == 5) {
        fprintf(stderr, "suanli ckpt gather: --step: missing value\n");
        return 2;
    }
    return 0;
}

static int gather(int argc, char **argv, sl_comm *w) {
    long long step = -1;
    int me = w ? sl_comm_rank(w) : 0;
    if (argc == 6) { /* check_args: argv[4] is --step */
        char *end;
        errno = 0;
        step = strtoll(argv[5], &end, 10);
        if (!*argv[5] || *end || errno || step < 0) { /* 1e20 was read as LLONG_MAX */
            fprintf(stderr, "suanli ckpt gather: --step: expected a step number, got '%s'\n", argv[5]);
            return 2;
        }
    }
    const char *pool = argv[2], *out = argv[3];
    if (!any_ok(w, sl_ckpt_is_pool(pool))) { /* under comm: some host holds its part of the pool */
        if (me == 0)
            fprintf(stderr, "suanli ckpt gather: %s: not a pooled store (no host-<h> directories)\n", pool);
        return 2;
    }
    /* an empty dir is fine (and kept, whatever happens next); anything else is refused (OUT is rank 0's) */
    int free_out = me != 0 || access(out, F_OK) != 0 || dir_is_empty(out);
    if (!all_ok(w, free_out)) {
        if (me == 0)
            fprintf(stderr, "suanli ckpt gather: %s: exists and is not empty; give a new directory\n", out);
        return 2;
    }
    int64_t got;
    int made = access(out, F_OK) != 0;
    sl_status st = w ? sl_ckpt_pool_gather_comm(pool, w, step, out, &got)
                     : sl_ckpt_pool_gather(pool, 0, step, out, &got);
    if (st != SL_OK) {
        int rc = pooled_failure("gather", st, me);
        if (me == 0 && made) rmdir(out); /* OUT made for a gather that failed (--step N absent): left empty */
        return rc;
    }
    if (me == 0)
        printf("gathered step %lld of %s into %s/step-%07lld%s\n", (long long)got, pool, out, (long long)got,
               w ? " (each host read its own directory; the rest came over the network)" : "");
    return 0;
}

static int pooled(const char *what, const char *dir, sl_comm *w) {
    int me = w ? sl_comm_rank(w) : 0;
    if (!strcmp(what, "inspect")) {
        sl_status st = w ? sl_ckpt_pool_inspect_comm(dir, w, stdout) : sl_ckpt_pool_inspect(dir, 0, stdout);
        return st != SL_OK ? pooled_failure(what, st, me) : 0;
    }
    int64_t got;
    sl_status st =
        w ? sl_ckpt_pool_gather_comm(dir, w, -1, NULL, &got) : sl_ckpt_pool_gather(dir, 0, -1, NULL, &got);
    if (st != SL_OK) return pooled_failure(what, st, me);
    if (me == 0)
        printf("%s: step-%07lld can be rebuilt; all checksums of the copies and blocks used match\n", dir,
               (long long)got);
    return 0;
}

int sl_cmd_ckpt(int argc, char **argv) {
    for (int i = 1; i < argc; i++) /* 'ckpt inspect --help' was read as the directory "--help" */
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout);
    if (argc < 2) return usage(stderr);
    int gathering = !strcmp(argv[1], "gather"), bad_args = check_args(argc, argv);
    if (bad_args) return bad_args;
    int bad;
    sl_comm *w = hosts_comm(argv[1], &bad);
    if (bad) return bad;
    int rc = -1;
    if (gathering)
        rc = gather(argc, argv, w);
    else if (any_ok(w, sl_ckpt_is_pool(argv[2]) && !sl_ckpt_is_checkpoint(argv[2])))
        rc = pooled(argv[1], argv[2], w);
    else if (w) {
        if (sl_comm_rank(w) == 0)
            fprintf(stderr, "suanli ckpt %s: %s: under suanli run, a pooled store (--ckpt-local-dir) only\n",
                    argv[1], argv[2]);
        rc = 2;
    }
    sl_comm_free(w);
    if (rc >= 0) return rc;
    char dir[4096];
    if (sl_ckpt_find_latest(argv[2], dir, sizeof dir) != SL_OK) {
        fprintf(stderr, "suanli ckpt: %s\n", sl_errmsg());
        return 2;
    }
    if (!strcmp(argv[1], "verify")) {
        printf("%s: all checksums match\n", dir);
        return 0;
    }
    if (sl_ckpt_inspect(dir, stdout) != SL_OK) {
        fprintf(stderr, "suanli ckpt: %s\n", sl_errmsg());
        return 2;
    }
    return 0;
}
