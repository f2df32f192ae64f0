/* Creating communicators: from a unique id, from the environment (torchrun / OpenMPI / PMI /
 * Slurm / suanli run), as in-process loopback groups, and by splitting. */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_private.h"

static sl_status parse_transport(const char *v, sl_comm_transport_kind *k) {
    for (int i = 0; i < SL_COMM_TRANSPORT_COUNT; i++)
        if (!strcmp(v, sl_comm_transport_name((sl_comm_transport_kind)i))) {
            *k = (sl_comm_transport_kind)i;
            return SL_OK;
        }
    return sl_fail(SL_ERR_INVALID, "SUANLI_COMM_TRANSPORT=%s: want auto|shm|tcp|mpi|hybrid", v);
}

static uint64_t nonce64(void) {
    uint64_t x = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&x, sizeof x, 1, f) != 1) x = 0;
        fclose(f);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return x ^ ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec;
}

/* Build a communicator over an oob: pick the transport, create it, start the progress thread. */
static sl_status split_kind(sl_comm *c, int color, int key, sl_comm_transport_kind kind, sl_comm **out);

/* Host identity for topology: SUANLI_COMM_HOSTNAME (tests pretend several hosts), else hostname. */
static void host_id(char *host, size_t cap) {
    const char *v = getenv("SUANLI_COMM_HOSTNAME");
    memset(host, 0, cap);
    if (v && *v)
        snprintf(host, cap, "%s", v);
    else
        gethostname(host, cap - 1);
}

/* This machine's kernel: the boot id (one per booted kernel, shared by its network namespaces and
 * containers, which share its CPUs), else the host id (Note [Ranks sharing a machine], fifo.c) */
static void machine_id(char *id, size_t cap) {
    memset(id, 0, cap);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f || !fgets(id, (int)cap, f)) host_id(id, cap);
    if (f) fclose(f);
}

/* host_of[r] = index of rank r's host (numbered by first appearance); returns the host count and the
 * most ranks on one host (*maxlocal) */
static int host_index(const char *hosts, size_t hl, int n, int *host_of, int *maxlocal) {
    int nh = 0, *cnt = calloc((size_t)n, sizeof(int));
    for (int r = 0; r < n; r++) {
        host_of[r] = -1;
        for (int q = 0; q < r && host_of[r] < 0; q++)
            if (!strcmp(hosts + (size_t)q * hl, hosts + (size_t)r * hl)) host_of[r] = host_of[q];
        if (host_of[r] < 0) host_of[r] = nh++;
        if (cnt) cnt[host_of[r]]++;
    }
    *maxlocal = cnt ? 0 : n; /* out of memory: assume several ranks per host */
    for (int h = 0; h < nh && cnt; h++)
        if (cnt[h] > *maxlocal) *maxlocal = cnt[h];
    free(cnt);
    return nh;
}

/* Note [Hierarchical sub-communicators]
 * A communicator whose ranks span hosts, with more than one rank on some host, gets `local` (this
 * host's ranks, shm) and, when every host has the same number L of ranks, `peers` (the ranks with
 * this local rank on every host, over the network transport): the hierarchical all-reduce
 * (algo/hier.c) reduce-scatters inside the host, all-reduces shard l among the local ranks l of
 * all hosts and all-gathers inside the host, so each host sends (H-1)/H of the vector per rank
 * once instead of a flat ring's share per rank. Uneven hosts get `leaders` (local rank 0 of every
 * host) for the older reduce / leaders' all-reduce / broadcast form. SUANLI_COMM_HIER=0: neither. */
static sl_status build_hier(sl_comm *c) {
    const char *v = getenv("SUANLI_COMM_HIER");
    if (v && !strcmp(v, "0")) return SL_OK;
    int maxlocal = 0, local_rank = 0, even = 1, *cnt = calloc((size_t)c->nhosts, sizeof(int));
    if (!cnt) return sl_fail(SL_ERR_NOMEM, "communicator: out of memory");
    for (int r = 0; r < c->size; r++) {
        if (r < c->rank && c->host_of[r] == c->host_of[c->rank]) local_rank++;
        cnt[c->host_of[r]]++;
    }
    for (int h = 0; h < c->nhosts; h++) {
        if (cnt[h] > maxlocal) maxlocal = cnt[h];
        even &= cnt[h] == cnt[0];
    }
    free(cnt);
    if (maxlocal < 2) return SL_OK; /* one rank per host: nothing to gain */
    sl_comm_transport_kind net =
        c->tp->kind == SL_COMM_TRANSPORT_MPI ? SL_COMM_TRANSPORT_MPI : SL_COMM_TRANSPORT_TCP;
    SL_TRY(split_kind(c, c->host_of[c->rank], c->rank, SL_COMM_TRANSPORT_SHM, &c->local));
    if (even)
        SL_TRY(split_kind(c, local_rank, c->rank, net, &c->peers));
    else
        SL_TRY(split_kind(c, local_rank == 0 ? 0 : SL_COMM_SPLIT_NONE, c->rank, net, &c->leaders));
    SL_LOGD("comm: rank %d: hierarchical all-reduce, %d ranks on this host, %s", c->rank,
            sl_comm_size(c->local),
            even         ? "shards among host peers"
            : c->leaders ? "host leader"
                         : "not a leader");
    return SL_OK;
}

static sl_status comm_create(sl_oob *oob, const sl_comm_opts *opts, sl_comm_transport_kind kind,
                             int oob_is_mpi, sl_comm **out) {
    sl_status st = SL_OK;
    char *all = NULL;
    int *host_of = NULL, nh = 1, maxlocal = 1;
    if (kind == SL_COMM_TRANSPORT_AUTO && opts) kind = opts->transport;
    if (kind == SL_COMM_TRANSPORT_AUTO) {
        const char *v = getenv("SUANLI_COMM_TRANSPORT");
        if (v && *v) SL_TRY(parse_transport(v, &kind));
    }
    /* rank 0's nonce makes the shm names of this communicator unique on the host */
    uint64_t nonce = nonce64(), *nonces = calloc((size_t)oob->size, sizeof(uint64_t));
    char host[64];
    /* hybrid (a split of a hybrid communicator, or forced) decides again from this group's hosts */
    int auto_kind = kind == SL_COMM_TRANSPORT_AUTO || kind == SL_COMM_TRANSPORT_HYBRID;
    host_id(host, sizeof host);
    all = calloc((size_t)oob->size, sizeof host);
    host_of = calloc((size_t)oob->size, sizeof(int));
    if (!nonces || !all || !host_of) {
        st = sl_fail(SL_ERR_NOMEM, "communicator: out of memory");
        goto done;
    }
    SL_CHECK(oob->allgather(oob, &nonce, nonces, sizeof nonce));
    if (kind != SL_COMM_TRANSPORT_LOOPBACK && oob->size > 1) {
        SL_CHECK(oob->allgather(oob, host, all, sizeof host));
        nh = host_index(all, sizeof host, oob->size, host_of, &maxlocal);
        if (nh > 1) { /* every rank computes the same nh: they all take part */
            char mid[64], *mall = calloc((size_t)oob->size, sizeof mid);
            if (!mall) {
                st = sl_fail(SL_ERR_NOMEM, "communicator: out of memory");
                goto done;
            }
            machine_id(mid, sizeof mid);
            st = oob->allgather(oob, mid, mall, sizeof mid);
            int same = 0;
            for (int r = 0; st == SL_OK && r < oob->size; r++)
                same += !memcmp(mall + (size_t)r * sizeof mid, mid, sizeof mid);
            free(mall);
            if (st != SL_OK) goto done;
            sl_comm_note_machine_ranks(same);
        }
    }
    if (auto_kind) {
        kind = nh == 1        ? SL_COMM_TRANSPORT_SHM
               : oob_is_mpi   ? SL_COMM_TRANSPORT_MPI
               : maxlocal > 1 ? SL_COMM_TRANSPORT_HYBRID
                              : SL_COMM_TRANSPORT_TCP;
        if (nh > 1)
            SL_LOGI("comm: ranks span %d hosts; using the %s transport", nh, sl_comm_transport_name(kind));
    }
    char base[200];
    snprintf(base, sizeof base, "%s", oob->name);
    snprintf(oob->name, sizeof oob->name, "%.150s-%016llx", base, (unsigned long long)nonces[0]);
    sl_transport *tp = NULL;
    switch (kind) {
    case SL_COMM_TRANSPORT_SHM:
        st = sl_tp_shm_new(oob, &tp);
        break;
    case SL_COMM_TRANSPORT_TCP:
        st = sl_tp_tcp_new(oob, &tp);
        break;
    case SL_COMM_TRANSPORT_HYBRID:
        st = sl_tp_hybrid_new(oob, host_of, &tp);
        break;
    case SL_COMM_TRANSPORT_LOOPBACK:
        st = sl_tp_loopback_new(oob, &tp);
        break;
    case SL_COMM_TRANSPORT_MPI:
#ifdef SL_HAVE_MPI
        st = sl_tp_mpi_new(oob, &tp);
#else
        st = sl_fail(SL_ERR_UNSUPPORTED,
                     "MPI transport: this build has no MPI (install libopenmpi-dev and rebuild)");
#endif
        break;
    default:
        st = sl_fail(SL_ERR_INVALID, "bad transport %d", (int)kind);
    }
    snprintf(oob->name, sizeof oob->name, "%s", base);
    if (st != SL_OK) goto done;
    char name[200];
    snprintf(name, sizeof name, "%.150s-%016llx", base, (unsigned long long)nonces[0]);
    SL_CHECK(sl_comm_from_transport(tp, opts, name, oob->local_ip, oob->world_ranks, oob->mpi_tag, out));
    snprintf((*out)->token, sizeof(*out)->token, "%s", oob->token);
    (*out)->nhosts = nh;
    if (nh > 1) {
        (*out)->host_of = host_of;
        host_of = NULL;
    }
    if (auto_kind && nh > 1) {
        st = build_hier(*out);
        if (st != SL_OK) {
            sl_comm_free(*out);
            *out = NULL;
        }
    }
done:
    free(nonces);
    free(all);
    free(host_of);
    return st;
}

sl_status sl_comm_init_loopback(int n, sl_comm **comms, const sl_comm_opts *opts) {
    if (n < 1) return sl_fail(SL_ERR_INVALID, "loopback: need at least 1 rank (got %d)", n);
    sl_transport **tps = calloc((size_t)n, sizeof *tps);
    if (!tps) return sl_fail(SL_ERR_NOMEM, "loopback: out of memory");
    sl_status st = sl_tp_loopback_new_all(n, tps);
    if (st != SL_OK) {
        free(tps);
        return st;
    }
    char name[64];
    snprintf(name, sizeof name, "lb-%016llx", (unsigned long long)nonce64());
    for (int r = 0; r < n; r++) {
        if (st == SL_OK)
            st = sl_comm_from_transport(tps[r], opts, name, "127.0.0.1", NULL, 0, &comms[r]);
        else
            tps[r]->vt->destroy(tps[r]);
        if (st != SL_OK) comms[r] = NULL;
    }
    free(tps);
    if (st != SL_OK) {
        for (int r = 0; r < n; r++) sl_comm_free(comms[r]);
        return st;
    }
    return SL_OK;
}

/* ---- split: an oob made of direct exchanges between the group's members over the parent ---- */
typedef struct split_ctx {
    sl_comm *parent;
    int *members; /* parent ranks, in new-rank order */
} split_ctx;

static sl_status split_allgather(sl_oob *o, const void *mine, void *all, size_t bytes) {
    split_ctx *s = o->ctx;
    int n = o->size, me = o->rank, k = 0;
    sl_xfer *x = calloc(2 * (size_t)n, sizeof *x);
    if (!x) return sl_fail(SL_ERR_NOMEM, "split: out of memory");
    memcpy((char *)all + (size_t)me * bytes, mine, bytes);
    for (int j = 0; j < n; j++) {
        if (j == me) continue;
        x[k++] = (sl_xfer){.kind = SL_XFER_SEND, .peer = s->members[j], .buf = (void *)mine, .bytes = bytes};
        x[k++] = (sl_xfer){.kind = SL_XFER_RECV,
                           .peer = s->members[j],
                           .buf = (char *)all + (size_t)j * bytes,
                           .bytes = bytes};
    }
    sl_transport *tp = s->parent->tp;
    sl_status st = tp->vt->exchange(tp, x, k, sl_time_sec() + s->parent->timeout);
    free(x);
    return st;
}

sl_status sl_comm_split(sl_comm *c, int color, int key, sl_comm **out) {
    if (!c || !out) return sl_fail(SL_ERR_INVALID, "sl_comm_split: NULL argument");
    return split_kind(c, color, key, c->tp->kind, out);
}

static sl_status split_kind(sl_comm *c, int color, int key, sl_comm_transport_kind kind, sl_comm **out) {
    *out = NULL;
    int n = c->size, mine[2] = {color < 0 ? -1 : color, key};
    int *all = malloc(sizeof(int) * 2 * (size_t)n), *members = malloc(sizeof(int) * (size_t)n);
    int *wr = malloc(sizeof(int) * (size_t)n);
    sl_status st = SL_OK;
    if (!all || !members || !wr) {
        st = sl_fail(SL_ERR_NOMEM, "split: out of memory");
        goto done;
    }
    SL_CHECK(sl_comm_all_gather(c, mine, all, 2, SL_COMM_I32));
    int seq = c->split_seq++;
    if (color < 0) goto done;
    int nm = 0, me = -1;
    for (int r = 0; r < n; r++) {
        if (all[2 * r] != color) continue;
        int i = nm++; /* insertion by (key, rank) */
        while (i > 0 && all[2 * members[i - 1] + 1] > all[2 * r + 1]) {
            members[i] = members[i - 1];
            i--;
        }
        members[i] = r;
    }
    for (int i = 0; i < nm; i++) {
        if (members[i] == c->rank) me = i;
        wr[i] = c->world_ranks ? c->world_ranks[members[i]] : members[i];
    }
    split_ctx sc = {c, members};
    sl_oob oob = {
        .rank = me,
        .size = nm,
        .allgather = split_allgather,
        .ctx = &sc,
        .world_ranks = wr,
        .mpi_tag = (int)(((unsigned)c->mpi_tag * 131u + (unsigned)seq * 17u + (unsigned)color) % 30000u) + 1};
    snprintf(oob.local_ip, sizeof oob.local_ip, "%s", c->local_ip);
    snprintf(oob.name, sizeof oob.name, "%.160s.s%dc%d", c->name, seq, color);
    snprintf(oob.token, sizeof oob.token, "%s", c->token);
    sl_comm_acquire(c);
    if (atomic_load(&c->err) != SL_OK)
        st = sl_fail((sl_status)atomic_load(&c->err), "split: parent communicator failed: %s", c->errmsg);
    else
        st = comm_create(&oob, &c->opts, kind, 0, out);
    sl_comm_release(c);
done:
    free(all);
    free(members);
    free(wr);
    return st;
}

/* ---- environment ---- */
static int env_int(const char *name, int *out, sl_status *st) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1000000) {
        *st = sl_fail(SL_ERR_INVALID, "environment variable %s=%s is not a valid non-negative integer", name,
                      v);
        return 0;
    }
    *out = (int)x;
    return 1;
}

/* First host of a Slurm node list: "node[03-05,7],gpu1" -> "node03". */
static void slurm_first_host(const char *list, char *out, size_t cap) {
    size_t i = 0, o = 0;
    while (list[i] && list[i] != ',' && list[i] != '[' && o + 1 < cap) out[o++] = list[i++];
    if (list[i] == '[') {
        i++;
        while (list[i] && list[i] != '-' && list[i] != ',' && list[i] != ']' && o + 1 < cap)
            out[o++] = list[i++];
    }
    out[o] = 0;
}

sl_status sl_comm_env_detect(sl_comm_env *e) {
    sl_status st = SL_OK;
    memset(e, 0, sizeof *e);
    e->local_rank = -1;
    e->local_size = -1;
    e->size = -1;
    if (env_int("RANK", &e->rank, &st) && env_int("WORLD_SIZE", &e->size, &st)) {
        e->source = getenv("SUANLI_JOB_TOKEN") ? "suanli" : "torchrun";
        env_int("LOCAL_RANK", &e->local_rank, &st);
        env_int("LOCAL_WORLD_SIZE", &e->local_size, &st);
    } else if (env_int("OMPI_COMM_WORLD_RANK", &e->rank, &st) &&
               env_int("OMPI_COMM_WORLD_SIZE", &e->size, &st)) {
        e->source = "openmpi";
        env_int("OMPI_COMM_WORLD_LOCAL_RANK", &e->local_rank, &st);
        env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &e->local_size, &st);
    } else if (env_int("PMI_RANK", &e->rank, &st) && env_int("PMI_SIZE", &e->size, &st)) {
        e->source = "pmi";
        env_int("MPI_LOCALRANKID", &e->local_rank, &st);
        env_int("MPI_LOCALNRANKS", &e->local_size, &st);
    } else if (env_int("SLURM_PROCID", &e->rank, &st) && env_int("SLURM_NTASKS", &e->size, &st)) {
        e->source = "slurm";
        env_int("SLURM_LOCALID", &e->local_rank, &st);
    } else if (st == SL_OK) {
        e->rank = 0, e->size = 1, e->source = "single";
    }
    if (st != SL_OK) return st;
    if (e->size < 1 || e->rank >= e->size)
        return sl_fail(SL_ERR_INVALID, "%s environment: rank %d is not below world size %d", e->source,
                       e->rank, e->size);
    const char *ma = getenv("MASTER_ADDR");
    int port = 0;
    if (ma && *ma) snprintf(e->master_addr, sizeof e->master_addr, "%s", ma);
    if (env_int("MASTER_PORT", &port, &st)) e->master_port = port;
    if (st != SL_OK) return st;
    if (e->master_port > 65535)
        return sl_fail(SL_ERR_INVALID, "MASTER_PORT=%d is not a TCP port", e->master_port);
    const char *jid = getenv("SLURM_JOB_ID"), *nl = getenv("SLURM_STEP_NODELIST");
    if (!nl) nl = getenv("SLURM_JOB_NODELIST");
    if (!strcmp(e->source, "slurm") && !e->master_addr[0] && nl)
        slurm_first_host(nl, e->master_addr, sizeof e->master_addr);
    if (!strcmp(e->source, "slurm") && !e->master_port && jid) {
        /* Note [Slurm rendezvous port]: a port derived from the job and step, in [12000, 32000), below
         * Linux's ephemeral range (32768-60999 by default). The range was [20000, 40000): a CI run's srun
         * step drew 36192 while another test's connection held it as an ephemeral port ("cannot listen on
         * port 36192: Address already in use"). MASTER_PORT overrides it. */
        const char *step = getenv("SLURM_STEP_ID");
        e->master_port =
            12000 + (int)((strtoul(jid, NULL, 10) * 7 + (step ? strtoul(step, NULL, 10) : 0)) % 20000);
    }
    if (e->master_port && !e->master_addr[0]) snprintf(e->master_addr, sizeof e->master_addr, "127.0.0.1");
    const char *tok = getenv("SUANLI_JOB_TOKEN");
    if (tok && *tok)
        snprintf(e->token, sizeof e->token, "%.63s", tok);
    else if (jid)
        snprintf(e->token, sizeof e->token, "slurm-%.40s-%s", jid,
                 getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : "0");
    else
        snprintf(e->token, sizeof e->token, "port-%d", e->master_port);
    return SL_OK;
}

static sl_status single_allgather(sl_oob *o, const void *mine, void *all, size_t bytes) {
    (void)o;
    memcpy(all, mine, bytes);
    return SL_OK;
}

static void token_name(const char *token, char *out, size_t cap) { sl_shm_job_prefix(token, out, cap); }

sl_status sl_comm_init_env(sl_comm **out, const sl_comm_opts *opts) {
    sl_comm_env e;
    *out = NULL;
    SL_TRY(sl_comm_env_detect(&e));
    double timeout = opts && opts->timeout_sec > 0 ? opts->timeout_sec : sl_comm_env_timeout();
    if (e.size == 1) {
        sl_oob o = {.rank = 0, .size = 1, .allgather = single_allgather};
        snprintf(o.local_ip, sizeof o.local_ip, "127.0.0.1");
        token_name(e.token, o.name, sizeof o.name);
        sl_comm_transport_kind k = opts && opts->transport ? opts->transport : SL_COMM_TRANSPORT_SHM;
        return comm_create(&o, opts, k, 0, out);
    }
    int is_mpi = !strcmp(e.source, "openmpi") || !strcmp(e.source, "pmi");
    if (!e.master_port) {
#ifdef SL_HAVE_MPI
        if (is_mpi) {
            sl_oob o;
            SL_TRY(sl_mpi_oob_world(&o));
            if (o.size != e.size || o.rank != e.rank)
                return sl_fail(
                    SL_ERR_INVALID,
                    "MPI_COMM_WORLD is rank %d of %d but the %s environment says %d of %d "
                    "(this build's MPI does not match the launcher; set MASTER_ADDR/MASTER_PORT to "
                    "bootstrap over TCP instead)",
                    o.rank, o.size, e.source, e.rank, e.size);
            snprintf(o.token, sizeof o.token, "%s", e.token);
            token_name("mpi", o.name, sizeof o.name);
            return comm_create(&o, opts, SL_COMM_TRANSPORT_AUTO, 1, out);
        }
#endif
        (void)is_mpi;
        return sl_fail(SL_ERR_INVALID,
                       "%s environment (rank %d of %d) has no rendezvous: set MASTER_ADDR and MASTER_PORT%s",
                       e.source, e.rank, e.size, is_mpi ? " (or build with MPI)" : "");
    }
    sl_oob *o;
    SL_TRY(sl_bootstrap_oob_new(e.master_addr, e.master_port, e.token, e.rank, e.size, timeout, &o));
    token_name(e.token, o->name, sizeof o->name);
    sl_status st = comm_create(o, opts, SL_COMM_TRANSPORT_AUTO, 0, out);
    sl_bootstrap_oob_free(o);
    return st;
}

sl_status sl_comm_init_rank(sl_comm **out, int nranks, const sl_comm_unique_id *id, int rank,
                            const sl_comm_opts *opts) {
    char addr[128], token[64];
    int port;
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return sl_fail(SL_ERR_INVALID, "sl_comm_init_rank: rank %d / nranks %d out of range", rank, nranks);
    if (!sl_comm_unique_id_parse(id, addr, sizeof addr, &port, token, sizeof token))
        return sl_fail(SL_ERR_INVALID, "sl_comm_init_rank: malformed unique id");
    double timeout = opts && opts->timeout_sec > 0 ? opts->timeout_sec : sl_comm_env_timeout();
    sl_oob *o;
    SL_TRY(sl_bootstrap_oob_new(addr, port, token, rank, nranks, timeout, &o));
    token_name(token, o->name, sizeof o->name);
    sl_status st = comm_create(o, opts, SL_COMM_TRANSPORT_AUTO, 0, out);
    sl_bootstrap_oob_free(o);
    return st;
}
