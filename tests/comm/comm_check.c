/* See comm_check.h. Inputs are small integers, so every reduction is exact in every dtype and the
 * results must equal the reference bit for bit. */
#include "comm_check.h"
#include "comm/comm_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t SIZES[] = {0, 1, 7, 4093, (1u << 20) + 3};
enum { AR, RED, BC, AG, AGV, RS, A2A, A2AV, P2P, NCOLL };
static const char *COLL[] = {"all_reduce",     "reduce",     "broadcast",   "all_gather", "all_gatherv",
                             "reduce_scatter", "all_to_all", "all_to_allv", "send_recv"};

static double val(int rank, size_t i, int cas, sl_comm_redop op) {
    unsigned h = (unsigned)rank * 7919u + (unsigned)i * 104729u + (unsigned)cas * 31u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    if (op == SL_COMM_PROD) return h % 7 == 0 ? 2.0 : (h % 3 == 0 ? -1.0 : 1.0);
    return (double)(int)(h % 9) - 4.0;
}

static void put(sl_comm_dtype dt, void *b, size_t i, double v) {
    switch (dt) {
    case SL_COMM_F32:
        ((float *)b)[i] = (float)v;
        break;
    case SL_COMM_F64:
        ((double *)b)[i] = v;
        break;
    case SL_COMM_BF16:
        ((uint16_t *)b)[i] = sl_f32_to_bf16((float)v);
        break;
    case SL_COMM_F16:
        ((uint16_t *)b)[i] = sl_comm_f32_to_f16((float)v);
        break;
    case SL_COMM_I32:
        ((int32_t *)b)[i] = (int32_t)v;
        break;
    case SL_COMM_I64:
        ((int64_t *)b)[i] = (int64_t)v;
        break;
    case SL_COMM_U8:
        ((uint8_t *)b)[i] = (uint8_t)(int)v;
        break;
    default:
        break;
    }
}
static double get(sl_comm_dtype dt, const void *b, size_t i) {
    switch (dt) {
    case SL_COMM_F32:
        return ((const float *)b)[i];
    case SL_COMM_F64:
        return ((const double *)b)[i];
    case SL_COMM_BF16:
        return sl_bf16_to_f32(((const uint16_t *)b)[i]);
    case SL_COMM_F16:
        return sl_comm_f16_to_f32(((const uint16_t *)b)[i]);
    case SL_COMM_I32:
        return ((const int32_t *)b)[i];
    case SL_COMM_I64:
        return (double)((const int64_t *)b)[i];
    case SL_COMM_U8:
        return ((const uint8_t *)b)[i];
    default:
        return 0;
    }
}

/* reference reduction over ranks of element i (exact in double), then stored as the dtype */
static void ref_put(sl_comm_dtype dt, sl_comm_redop op, void *b, size_t bi, int n, size_t i, int cas) {
    double acc = val(0, i, cas, op);
    for (int r = 1; r < n; r++) {
        double v = val(r, i, cas, op);
        switch (op) {
        case SL_COMM_PROD:
            acc *= v;
            break;
        case SL_COMM_MAX:
            acc = v > acc ? v : acc;
            break;
        case SL_COMM_MIN:
            acc = v < acc ? v : acc;
            break;
        default:
            acc += v;
        }
    }
    if (op != SL_COMM_AVG) {
        put(dt, b, bi, acc);
        return;
    }
    switch (dt) {
    case SL_COMM_F64:
        put(dt, b, bi, acc / n);
        break;
    case SL_COMM_I32:
    case SL_COMM_I64:
        put(dt, b, bi, (double)((int64_t)acc / n));
        break;
    default:
        put(dt, b, bi, (double)((float)acc / (float)n));
        break; /* f32/bf16/f16 divide in f32 */
    }
}

static int compare(const char *what, sl_comm_dtype dt, const void *got, const void *want, size_t n) {
    size_t es = sl_comm_dtype_size(dt);
    if (n == 0 || !memcmp(got, want, n * es)) return 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es)) {
            fprintf(stderr, "FAIL %s: element %zu of %zu: got %g want %g\n", what, i, n, get(dt, got, i),
                    get(dt, want, i));
            break;
        }
    return 1;
}

static void *xmalloc(size_t b) {
    void *p = malloc(b ? b : 1);
    if (!p) abort();
    memset(p, 0xAB, b ? b : 1);
    return p;
}

/* Window mode: a bump allocator in one sl_comm_mem_alloc window, reset for every case. Every rank
 * allocates the same sizes in the same order for the collectives that use windows (the all-gather(v)
 * send buffer, whose size differs per rank, comes last), so the offsets are symmetric. */
static _Thread_local char *g_win;
static _Thread_local size_t g_win_bytes, g_win_used;
static void *balloc(size_t b) {
    if (!g_win) return xmalloc(b);
    size_t a = (b + 63) & ~(size_t)63;
    if (!a) a = 64;
    if (g_win_used + a > g_win_bytes) {
        fprintf(stderr, "window arena too small (%zu + %zu > %zu)\n", g_win_used, a, g_win_bytes);
        abort();
    }
    char *p = g_win + g_win_used;
    g_win_used += a;
    memset(p, 0xAB, a);
    return p;
}
/* The data-movement collectives (all-gather(v), all-to-all(v)) in window mode place each rank's buffers
 * by case and rank, so that one call mixes ranks whose send and receive buffers are in the window,
 * only one of them, or neither (Note [Window data movement] in src/comm/algo/sym.c): bit 0 of the
 * placement puts the send buffer in the window, bit 1 the receive buffer. */
static int placement(int cas, int r) { return g_win ? (int)((unsigned)(cas + r) % 4u) : 3; }
static void *palloc(int in_win, size_t b) { return in_win ? balloc(b) : xmalloc(b); }
static void bfree(void *p) {
    if (g_win && (char *)p >= g_win && (char *)p < g_win + g_win_bytes) return;
    free(p);
}

/* One case; returns 1 on failure. */
static int run_case(sl_comm *c, int coll, sl_comm_dtype dt, sl_comm_redop op, size_t count, int inplace,
                    int cas, const char *algo) {
    int n = sl_comm_size(c), r = sl_comm_rank(c);
    size_t es = sl_comm_dtype_size(dt);
    char what[256];
    snprintf(what, sizeof what, "rank %d/%d %s dt=%s op=%s count=%zu %s algo=%s", r, n, COLL[coll],
             sl_comm_dtype_name(dt), sl_comm_redop_name(op), count, inplace ? "in-place" : "out-of-place",
             algo);
    void *sb = NULL, *rb = NULL, *want = NULL;
    size_t nres = 0;
    sl_status st = SL_OK;
    int bad = 0;
    switch (coll) {
    case AR: {
        sb = balloc(count * es);
        for (size_t i = 0; i < count; i++) put(dt, sb, i, val(r, i, cas, op));
        rb = inplace ? sb : balloc(count * es);
        want = xmalloc(count * es);
        for (size_t i = 0; i < count; i++) ref_put(dt, op, want, i, n, i, cas);
        st = sl_comm_all_reduce(c, sb, rb, count, dt, op);
        nres = count;
        break;
    }
    case RED: {
        int root = cas % n;
        sb = xmalloc(count * es);
        for (size_t i = 0; i < count; i++) put(dt, sb, i, val(r, i, cas, op));
        rb = r != root ? NULL : inplace ? sb : xmalloc(count * es);
        want = xmalloc(count * es);
        if (r == root)
            for (size_t i = 0; i < count; i++) ref_put(dt, op, want, i, n, i, cas);
        st = sl_comm_reduce(c, sb, rb, count, dt, op, root);
        nres = r == root ? count : 0;
        break;
    }
    case BC: {
        int root = (cas + 1) % n;
        rb = xmalloc(count * es);
        want = xmalloc(count * es);
        for (size_t i = 0; i < count; i++) put(dt, want, i, val(root, i, cas, SL_COMM_SUM));
        if (r == root) {
            sb = inplace ? rb : xmalloc(count * es);
            memcpy(sb, want, count * es);
        }
        st = sl_comm_broadcast(c, sb, rb, count, dt, root);
        nres = count;
        if (sb == rb) sb = NULL;
        break;
    }
    case AG:
    case AGV: {
        size_t *cnt = calloc((size_t)n, sizeof(size_t)), *dsp = calloc((size_t)n, sizeof(size_t)), tot = 0;
        for (int k = 0; k < n; k++) cnt[k] = coll == AG ? count : count + (size_t)(k % 3);
        for (int k = n - 1; k >= 0; k--) { /* AGV: reversed placement */
            int kk = coll == AG ? n - 1 - k : k;
            dsp[kk] = tot;
            tot += cnt[kk];
        }
        int pl = placement(cas, r);
        rb = palloc(pl & 2, tot * es);
        want = xmalloc(tot * es);
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < cnt[k]; i++) put(dt, want, dsp[k] + i, val(k, i, cas, SL_COMM_SUM));
        if (inplace) {
            memcpy((char *)rb + dsp[r] * es, (char *)want + dsp[r] * es, cnt[r] * es);
            st = coll == AG ? sl_comm_all_gather(c, (char *)rb + dsp[r] * es, rb, count, dt)
                            : sl_comm_all_gatherv(c, (char *)rb + dsp[r] * es, rb, cnt, dsp, dt);
        } else {
            sb = palloc(pl & 1, cnt[r] * es);
            memcpy(sb, (char *)want + dsp[r] * es, cnt[r] * es);
            st = coll == AG ? sl_comm_all_gather(c, sb, rb, count, dt)
                            : sl_comm_all_gatherv(c, sb, rb, cnt, dsp, dt);
        }
        nres = tot;
        free(cnt);
        free(dsp);
        break;
    }
    case RS: {
        size_t tot = count * (size_t)n;
        sb = balloc(tot * es);
        for (size_t i = 0; i < tot; i++) put(dt, sb, i, val(r, i, cas, op));
        rb = inplace ? (char *)sb + (size_t)r * count * es : balloc(count * es);
        want = xmalloc(count * es);
        for (size_t i = 0; i < count; i++) ref_put(dt, op, want, i, n, (size_t)r * count + i, cas);
        st = sl_comm_reduce_scatter(c, sb, rb, count, dt, op);
        nres = count;
        if (inplace) rb = NULL;
        {
            void *res = inplace ? (char *)sb + (size_t)r * count * es : rb;
            if (st == SL_OK) bad = compare(what, dt, res, want, nres);
        }
        goto out;
    }
    case A2A: {
        size_t tot = count * (size_t)n;
        int pl = placement(cas, r);
        sb = palloc(pl & 1, tot * es);
        for (size_t i = 0; i < tot; i++) put(dt, sb, i, val(r, i, cas, SL_COMM_SUM));
        rb = inplace ? sb : palloc(pl & 2, tot * es);
        want = xmalloc(tot * es);
        for (int s = 0; s < n; s++)
            for (size_t i = 0; i < count; i++)
                put(dt, want, (size_t)s * count + i, val(s, (size_t)r * count + i, cas, SL_COMM_SUM));
        st = sl_comm_all_to_all(c, sb, rb, count, dt);
        nres = tot;
        break;
    }
    case A2AV: {
        size_t *sc = calloc((size_t)n, sizeof(size_t)), *sd = calloc((size_t)n, sizeof(size_t));
        size_t *rc = calloc((size_t)n, sizeof(size_t)), *rd = calloc((size_t)n, sizeof(size_t)), st_ = 0,
               rt = 0;
        for (int j = 0; j < n; j++) {
            sc[j] = count + (size_t)((r + 2 * j) % 3);
            rc[j] = count + (size_t)((j + 2 * r) % 3);
            sd[j] = st_, st_ += sc[j];
            rd[j] = rt, rt += rc[j];
        }
        int pl = placement(cas, r);
        sb = palloc(pl & 1, st_ * es);
        for (size_t i = 0; i < st_; i++) put(dt, sb, i, val(r, i, cas, SL_COMM_SUM));
        rb = palloc(pl & 2, rt * es);
        want = xmalloc(rt * es);
        for (int s = 0; s < n; s++) { /* sender s's sdispl for me = sum_{j<r} (count + (s+2j)%3) */
            size_t off = 0;
            for (int j = 0; j < r; j++) off += count + (size_t)((s + 2 * j) % 3);
            for (size_t i = 0; i < rc[s]; i++) put(dt, want, rd[s] + i, val(s, off + i, cas, SL_COMM_SUM));
        }
        st = sl_comm_all_to_allv(c, sb, sc, sd, rb, rc, rd, dt);
        nres = rt;
        free(sc), free(sd), free(rc), free(rd);
        break;
    }
    case P2P: {
        if (n == 1) return 0;
        int to = (r + 1) % n, from = (r - 1 + n) % n, to2 = (r + 2) % n, from2 = (r - 2 + n) % n;
        sb = xmalloc(count * es);
        for (size_t i = 0; i < count; i++) put(dt, sb, i, val(r, i, cas, SL_COMM_SUM));
        rb = xmalloc(2 * count * es);
        want = xmalloc(2 * count * es);
        for (size_t i = 0; i < count; i++) put(dt, want, i, val(from, i, cas, SL_COMM_SUM));
        for (size_t i = 0; i < count; i++) put(dt, want, count + i, val(from2, i, cas, SL_COMM_SUM));
        sl_comm_group_start();
        sl_status s1 = sl_comm_send(c, sb, count, dt, to);
        sl_status s2 = sl_comm_recv(c, rb, count, dt, from);
        sl_status s3 = SL_OK, s4 = SL_OK;
        if (to2 != r) {
            s3 = sl_comm_send(c, sb, count, dt, to2);
            s4 = sl_comm_recv(c, (char *)rb + count * es, count, dt, from2);
        } else
            memcpy((char *)rb + count * es, (char *)want + count * es, count * es);
        st = sl_comm_group_end();
        if (st == SL_OK) st = s1 ? s1 : s2 ? s2 : s3 ? s3 : s4;
        if (st == SL_OK) st = sl_comm_barrier(c); /* blocking calls in a group complete with the group */
        nres = 2 * count;
        break;
    }
    }
    if (st != SL_OK) {
        fprintf(stderr, "FAIL %s: status %s: %s\n", what, sl_status_name(st), sl_errmsg());
        bad = 1;
    } else if (nres) {
        bad = compare(what, dt, rb, want, nres);
    }
out:
    if (rb != sb) bfree(rb);
    bfree(sb);
    free(want);
    if (g_win) g_win_used = 0;
    return bad;
}

static int matrix(sl_comm *c, const cc_cfg *cfg);

int cc_run_matrix(sl_comm *c, const cc_cfg *cfg) {
    if (!cfg->window) return matrix(c, cfg);
    int n = sl_comm_size(c), r = sl_comm_rank(c);
    size_t maxcount = cfg->large ? SIZES[4] : SIZES[3];
    size_t bytes = (size_t)(2 * n + 2) * (maxcount + 2) * 8 + 8192; /* all-to-all: two n-block buffers */
    void *w = NULL;
    if (sl_comm_mem_alloc(c, bytes, &w) != SL_OK) {
        fprintf(stderr, "FAIL rank %d: sl_comm_mem_alloc(%zu): %s\n", r, bytes, sl_errmsg());
        return 1;
    }
    sl_comm_transport_kind k = sl_comm_transport(c);
    int want_shared = k == SL_COMM_TRANSPORT_SHM || k == SL_COMM_TRANSPORT_LOOPBACK;
    int fails = 0;
    if (sl_comm_mem_is_shared(c, w, bytes) != want_shared) {
        fprintf(stderr, "FAIL rank %d: window on %s is %sshared\n", r, sl_comm_transport_name(k),
                want_shared ? "not " : "");
        fails++;
    }
    g_win = w, g_win_bytes = bytes, g_win_used = 0;
    fails += matrix(c, cfg);
    g_win = NULL;
    if (sl_comm_mem_free(c, w) != SL_OK)
        fprintf(stderr, "FAIL rank %d: mem_free: %s\n", r, sl_errmsg()), fails++;
    return fails;
}

static int matrix(sl_comm *c, const cc_cfg *cfg) {
    int fails = 0, cas = 0;
    static const sl_comm_algo algos[] = {SL_COMM_ALGO_AUTO, SL_COMM_ALGO_RING, SL_COMM_ALGO_RD,
                                         SL_COMM_ALGO_DIRECT, SL_COMM_ALGO_HIER};
    /* hier: only where it means something (ranks on several hosts) */
    int nalgo = cfg->algos ? (sl_comm_nhosts(c) > 1 ? 5 : 4) : 1;
    for (int coll = 0; coll < NCOLL; coll++) {
        if (cfg->window && (coll == RED || coll == BC || coll == P2P)) continue;
        int reducing = coll == AR || coll == RED || coll == RS;
        for (int a = 0; a < (coll == AR || coll == BC || coll == RS ? nalgo : 1); a++) {
            if (coll == RS && a > 0 && algos[a] != SL_COMM_ALGO_DIRECT) continue; /* ring (auto) or direct */
            if (coll == BC && algos[a] == SL_COMM_ALGO_HIER) continue;            /* all-reduce only */
            sl_comm_set_algo(c, algos[a]);
            for (int dt = 0; dt < SL_COMM_DTYPE_COUNT; dt++) {
                if (reducing && dt == SL_COMM_U8) continue;
                for (int op = 0; op < (reducing ? SL_COMM_REDOP_COUNT : 1); op++) {
                    if (cfg->quick && reducing && op != (dt % SL_COMM_REDOP_COUNT) && op != SL_COMM_SUM)
                        continue;
                    for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
                        if (si == 4 &&
                            (!cfg->large || (reducing ? op != dt % SL_COMM_REDOP_COUNT : dt % 3 != 0)))
                            continue; /* large: one op per dtype, and two dtypes for data movement */
                        for (int ip = 0; ip < 2; ip++) {
                            if (coll == A2AV && ip) continue;
                            fails += run_case(c, coll, (sl_comm_dtype)dt, (sl_comm_redop)op, SIZES[si], ip,
                                              cas++, sl_comm_algo_name(algos[a]));
                            if (fails > 20) {
                                fprintf(stderr, "too many failures, stopping\n");
                                sl_comm_set_algo(c, SL_COMM_ALGO_AUTO);
                                return fails;
                            }
                        }
                    }
                }
            }
        }
    }
    sl_comm_set_algo(c, SL_COMM_ALGO_AUTO);
    return fails;
}

/* M floats of random data for rank r into out: f32 normal(0, 1), or for bf16 2M values (no NaN bit
 * patterns) made from M normals drawn into tmp. */
static void random_input(int bf16, float *out, float *tmp, size_t M, uint64_t seed, int r) {
    sl_rng_fill_normal(bf16 ? tmp : out, (int64_t)M, seed, (uint64_t)r, 0.f, 1.f);
    for (size_t i = 0; bf16 && i < 2 * M; i++)
        ((uint16_t *)out)[i] = sl_f32_to_bf16(tmp[i / 2] * (i % 2 ? 0.5f : 1.f));
}

/* Private buffers on shm and loopback take the staged all-reduce (Note [Staged all-reduce] in
 * src/comm/algo/sym.c) when the algorithm is auto: bitwise the reference algorithm's result (ring for
 * 2 ranks, direct for more), in place and out of place, f32 and bf16 with random data, over several
 * staging windows (uneven slices: M is not divisible by 2..8). */
static int staged_check(sl_comm *c) {
    int n = sl_comm_size(c), r = sl_comm_rank(c), fails = 0;
    sl_comm_transport_kind k = sl_comm_transport(c);
    if (n < 2 || (k != SL_COMM_TRANSPORT_SHM && k != SL_COMM_TRANSPORT_LOOPBACK)) return 0;
    const size_t M = 300007;
    float *x = malloc(sizeof(float) * M), *y = malloc(sizeof(float) * M), *z = malloc(sizeof(float) * M),
          *w = malloc(sizeof(float) * M);
    sl_comm_algo ref = n == 2 ? SL_COMM_ALGO_RING : SL_COMM_ALGO_DIRECT;
    for (int dt = 0; dt < 2; dt++) {
        sl_comm_dtype d = dt ? SL_COMM_BF16 : SL_COMM_F32;
        size_t cnt = dt ? 2 * M : M;
        random_input(dt, x, w, M, 77 + (uint64_t)dt, r);
        memcpy(z, x, sizeof(float) * M);
        sl_status s1 = sl_comm_all_reduce(c, x, y, cnt, d, SL_COMM_SUM);
        sl_status s2 = sl_comm_all_reduce(c, z, z, cnt, d, SL_COMM_SUM);
        sl_comm_set_algo(c, ref);
        sl_status s3 = sl_comm_all_reduce(c, x, w, cnt, d, SL_COMM_SUM);
        sl_comm_set_algo(c, SL_COMM_ALGO_AUTO);
        if (s1 || s2 || s3) {
            fprintf(stderr, "FAIL rank %d: staged all-reduce: %s\n", r, sl_errmsg());
            fails++;
            break;
        }
        if (memcmp(y, w, sizeof(float) * M) || memcmp(z, w, sizeof(float) * M))
            fprintf(stderr,
                    "FAIL rank %d: %s staged all-reduce (out of place %s, in place %s) and %s differ\n", r,
                    sl_comm_dtype_name(d), memcmp(y, w, sizeof(float) * M) ? "differs" : "equal",
                    memcmp(z, w, sizeof(float) * M) ? "differs" : "equal", sl_comm_algo_name(ref)),
                fails++;
    }
    free(x), free(y), free(z), free(w);
    return fails;
}

/* Two communicators over the same ranks with all-reduces in flight on both at once, submitted in opposite
 * orders by even and odd ranks (odd ranks finish B before they start A): each must see only its own
 * messages (the MPI transport keeps them apart by a tag per communicator; one tag for all survived a
 * mutation audit) */
static int concurrent_comms(sl_comm *c) {
    int n = sl_comm_size(c), r = sl_comm_rank(c), fails = 0;
    if (n < 2) return 0;
    enum { N = 4099 };
    sl_comm *ca = NULL, *cb = NULL;
    if (sl_comm_split(c, 0, r, &ca) != SL_OK || sl_comm_split(c, 0, r, &cb) != SL_OK || !ca || !cb) {
        fprintf(stderr, "FAIL rank %d: split for concurrent communicators: %s\n", r, sl_errmsg());
        sl_comm_free(ca);
        sl_comm_free(cb);
        return 1;
    }
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) a[i] = (float)(r + 1), b[i] = (float)(1000 * (r + 1) + i % 7);
    sl_comm_req *ra = NULL, *rb = NULL;
    sl_status sa, sb;
    if (r % 2 == 0) {
        sa = sl_comm_all_reduce_async(ca, a, a, N, SL_COMM_F32, SL_COMM_SUM, &ra);
        sb = sl_comm_all_reduce_async(cb, b, b, N, SL_COMM_F32, SL_COMM_SUM, &rb);
        if (sa == SL_OK) sa = sl_comm_wait(ra);
        if (sb == SL_OK) sb = sl_comm_wait(rb);
    } else {
        sb = sl_comm_all_reduce_async(cb, b, b, N, SL_COMM_F32, SL_COMM_SUM, &rb);
        if (sb == SL_OK) sb = sl_comm_wait(rb);
        sa = sl_comm_all_reduce_async(ca, a, a, N, SL_COMM_F32, SL_COMM_SUM, &ra);
        if (sa == SL_OK) sa = sl_comm_wait(ra);
    }
    float wa = (float)n * (float)(n + 1) / 2;
    int bad = sa != SL_OK || sb != SL_OK;
    for (int i = 0; i < N && !bad; i++) bad = a[i] != wa || b[i] != 1000.0f * wa + (float)(n * (i % 7));
    if (bad)
        fprintf(stderr,
                "FAIL rank %d: concurrent all-reduces on two communicators: %s / %s, a[0] %g b[0] %g\n", r,
                sl_status_name(sa), sl_status_name(sb), a[0], b[0]),
            fails++;
    free(a);
    free(b);
    sl_comm_free(ca);
    sl_comm_free(cb);
    return fails;
}

int cc_run_extras(sl_comm *c) {
    int n = sl_comm_size(c), r = sl_comm_rank(c), fails = 0;
    /* split: two colors, reversed key order; the last rank opts out when n > 2 */
    int color = (n > 2 && r == n - 1) ? SL_COMM_SPLIT_NONE : r % 2;
    sl_comm *sub = NULL;
    sl_status st = sl_comm_split(c, color, -r, &sub);
    if (st != SL_OK) {
        fprintf(stderr, "FAIL rank %d: split: %s\n", r, sl_errmsg());
        return 1;
    }
    if (color == SL_COMM_SPLIT_NONE) {
        if (sub) fprintf(stderr, "FAIL rank %d: split with color NONE returned a communicator\n", r), fails++;
    } else {
        int members[64], nm = 0;
        for (int k = n - 1; k >= 0; k--)
            if (k % 2 == color && !(n > 2 && k == n - 1)) members[nm++] = k;
        int myidx = -1;
        for (int i = 0; i < nm; i++)
            if (members[i] == r) myidx = i;
        if (!sub || sl_comm_size(sub) != nm || sl_comm_rank(sub) != myidx) {
            fprintf(stderr, "FAIL rank %d: split gave rank %d of %d, want %d of %d\n", r,
                    sub ? sl_comm_rank(sub) : -1, sub ? sl_comm_size(sub) : -1, myidx, nm);
            fails++;
        } else {
            int64_t x = r + 1, want = 0;
            for (int i = 0; i < nm; i++) want += members[i] + 1;
            st = sl_comm_all_reduce(sub, &x, &x, 1, SL_COMM_I64, SL_COMM_SUM);
            if (st != SL_OK || x != want)
                fprintf(stderr, "FAIL rank %d: all-reduce on split: %s got %lld want %lld\n", r, sl_errmsg(),
                        (long long)x, (long long)want),
                    fails++;
            /* nested split of the split, then a small matrix on it */
            sl_comm *sub2 = NULL;
            if (sl_comm_split(sub, 0, 0, &sub2) != SL_OK || !sub2 || sl_comm_size(sub2) != nm)
                fprintf(stderr, "FAIL rank %d: nested split: %s\n", r, sl_errmsg()), fails++;
            else {
                cc_cfg small = {.quick = 1};
                fails += cc_run_matrix(sub2, &small) ? 1 : 0;
            }
            sl_comm_free(sub2);
        }
        sl_comm_free(sub);
    }
    fails += concurrent_comms(c);
    /* async overlap: several all-reduces in flight, waited out of order; test() polling */
    enum { K = 4, N = 100003 };
    float *bufs[K];
    sl_comm_req *req[K];
    for (int k = 0; k < K; k++) {
        bufs[k] = malloc(sizeof(float) * N);
        for (int i = 0; i < N; i++) bufs[k][i] = (float)((r + k + i) % 5);
        st = sl_comm_all_reduce_async(c, bufs[k], bufs[k], N, SL_COMM_F32, SL_COMM_SUM, &req[k]);
        if (st != SL_OK)
            fprintf(stderr, "FAIL rank %d: async submit: %s\n", r, sl_errmsg()), fails++, req[k] = NULL;
    }
    int done = 0;
    while (req[K - 1] && !done) {
        if (sl_comm_test(req[K - 1], &done) != SL_OK) break;
    }
    for (int k = K - 1; k >= 0; k--) {
        if (!req[k]) continue;
        st = sl_comm_wait(req[k]);
        int bad = st != SL_OK;
        for (int i = 0; i < N && !bad; i++) {
            float want = 0;
            for (int q = 0; q < n; q++) want += (float)((q + k + i) % 5);
            bad = bufs[k][i] != want;
        }
        if (bad)
            fprintf(stderr, "FAIL rank %d: async all-reduce %d wrong (%s)\n", r, k, sl_errmsg()), fails++;
    }
    for (int k = 0; k < K; k++) free(bufs[k]);
    /* determinism: random floats, twice, bitwise equal and equal on every rank */
    size_t M = 50001;
    float *a = malloc(sizeof(float) * M), *b = malloc(sizeof(float) * M);
    sl_rng_fill_normal(a, (int64_t)M, 1234, (uint64_t)r, 0.f, 1.f);
    memcpy(b, a, sizeof(float) * M);
    if (sl_comm_all_reduce(c, a, a, M, SL_COMM_F32, SL_COMM_SUM) != SL_OK ||
        sl_comm_all_reduce(c, b, b, M, SL_COMM_F32, SL_COMM_SUM) != SL_OK)
        fprintf(stderr, "FAIL rank %d: determinism all-reduce: %s\n", r, sl_errmsg()), fails++;
    if (memcmp(a, b, sizeof(float) * M))
        fprintf(stderr, "FAIL rank %d: all-reduce not reproducible\n", r), fails++;
    float *g = malloc(sizeof(float) * 16 * (size_t)n);
    if (sl_comm_all_gather(c, a, g, 16, SL_COMM_F32) != SL_OK)
        fprintf(stderr, "FAIL rank %d: determinism all-gather: %s\n", r, sl_errmsg()), fails++;
    for (int q = 0; q < n; q++)
        if (memcmp(g + 16 * q, a, 16 * sizeof(float)))
            fprintf(stderr, "FAIL rank %d: ranks disagree bitwise\n", r), fails++;
    free(a), free(b), free(g);
    fails += staged_check(c);
    if (sl_comm_async_error(c) != SL_OK) fprintf(stderr, "FAIL rank %d: async error set\n", r), fails++;
    return fails;
}

/* ---- window collectives ---- */
static int win_compare(const char *what, int r, const void *a, const void *b, size_t bytes) {
    if (!memcmp(a, b, bytes)) return 0;
    fprintf(stderr, "FAIL rank %d: %s differ bitwise\n", r, what);
    return 1;
}

int cc_run_window_extras(sl_comm *c) {
    int n = sl_comm_size(c), r = sl_comm_rank(c), fails = 0;
    const size_t M = 300007; /* not divisible by 2..8: uneven slices, several chunks */
    size_t bytes = sizeof(float) * M * 2 + 4096;
    char *w = NULL;
    if (sl_comm_mem_alloc(c, bytes, (void **)&w) != SL_OK) {
        fprintf(stderr, "FAIL rank %d: sl_comm_mem_alloc: %s\n", r, sl_errmsg());
        return 1;
    }
    float *ws = (float *)w, *wr = ws + M, *ps = malloc(sizeof(float) * M), *pr = malloc(sizeof(float) * M);
    float *again = malloc(sizeof(float) * M), *g = malloc(sizeof(float) * 16 * (size_t)n);
    sl_comm_algo ref = n == 2 ? SL_COMM_ALGO_RING : SL_COMM_ALGO_DIRECT;
    int cmp_ref =
        n <= 2 || sl_comm_mem_is_shared(c, w, bytes); /* fallback memory runs the cost model's pick */
    for (int dt = 0; dt < 2; dt++) {                  /* f32 and bf16: random data, rounding in every step */
        sl_comm_dtype d = dt ? SL_COMM_BF16 : SL_COMM_F32;
        size_t cnt = dt ? 2 * M : M, es = sl_comm_dtype_size(d);
        random_input(dt, ps, again, M, 99 + (uint64_t)dt, r);
        /* window out-of-place, window in-place, private with the reference algorithm */
        memcpy(ws, ps, sizeof(float) * M);
        sl_status s1 = sl_comm_all_reduce(c, ws, wr, cnt, d, SL_COMM_SUM);
        memcpy(again, wr, sizeof(float) * M);
        sl_status s2 = sl_comm_all_reduce(c, ws, ws, cnt, d, SL_COMM_SUM);
        sl_comm_set_algo(c, ref);
        sl_status s3 = sl_comm_all_reduce(c, ps, pr, cnt, d, SL_COMM_SUM);
        sl_comm_set_algo(c, SL_COMM_ALGO_AUTO);
        if (s1 || s2 || s3) {
            fprintf(stderr, "FAIL rank %d: window all-reduce: %s\n", r, sl_errmsg());
            fails++;
            break;
        }
        char what[128];
        snprintf(what, sizeof what, "%s window all-reduce and %s all-reduce", sl_comm_dtype_name(d),
                 sl_comm_algo_name(ref));
        if (cmp_ref) fails += win_compare(what, r, wr, pr, cnt * es);
        fails += win_compare("in-place and out-of-place window all-reduce", r, ws, wr, cnt * es);
        /* reproducible run to run */
        memcpy(ws, ps, sizeof(float) * M);
        if (sl_comm_all_reduce(c, ws, wr, cnt, d, SL_COMM_SUM) != SL_OK)
            fprintf(stderr, "FAIL rank %d: window all-reduce: %s\n", r, sl_errmsg()), fails++;
        fails += win_compare("two runs of the window all-reduce", r, wr, again, cnt * es);
        /* equal on every rank */
        if (sl_comm_all_gather(c, wr, g, 16, SL_COMM_F32) != SL_OK)
            fprintf(stderr, "FAIL rank %d: all-gather: %s\n", r, sl_errmsg()), fails++;
        for (int q = 0; q < n; q++)
            fails += win_compare("ranks' window all-reduce results", r, g + 16 * q, wr, 64);
        /* reduce-scatter: window vs the reference (direct for n > 2: the same order as the window all-reduce)
         */
        size_t rc = cnt / (size_t)n;
        memcpy(ws, ps, sizeof(float) * M);
        sl_status s4 = sl_comm_reduce_scatter(c, ws, wr, rc, d, SL_COMM_SUM);
        sl_comm_set_algo(c, ref == SL_COMM_ALGO_RING ? SL_COMM_ALGO_AUTO : ref);
        sl_status s5 = sl_comm_reduce_scatter(c, ps, pr, rc, d, SL_COMM_SUM);
        sl_comm_set_algo(c, SL_COMM_ALGO_AUTO);
        if (s4 || s5)
            fprintf(stderr, "FAIL rank %d: reduce-scatter: %s\n", r, sl_errmsg()), fails++;
        else if (cmp_ref)
            fails += win_compare("window and reference reduce-scatter", r, wr, pr, rc * es);
    }
    /* asymmetric offsets: an error on every rank, promptly (not the deadline, not wrong data); the
     * communicator is failed afterwards, so this runs on a duplicate */
    sl_comm *dup = NULL;
    if (n > 1 && sl_comm_split(c, 0, r, &dup) == SL_OK && dup) {
        char *dw = NULL;
        if (sl_comm_mem_alloc(dup, 4096 * 3, (void **)&dw) != SL_OK) {
            fprintf(stderr, "FAIL rank %d: mem_alloc on dup: %s\n", r, sl_errmsg());
            fails++;
        } else {
            float *x = (float *)(dw + (r ? 4096 : 0));
            for (int i = 0; i < 256; i++) x[i] = 1.f;
            double t0 = sl_time_sec();
            sl_status st = sl_comm_all_reduce(dup, x, x, 256, SL_COMM_F32, SL_COMM_SUM);
            double dt = sl_time_sec() - t0;
            if (!sl_comm_mem_is_shared(dup, dw, 4096 * 3)) { /* tcp, mpi: private memory, no contract */
                if (st != SL_OK || x[0] != (float)n)
                    fprintf(stderr, "FAIL rank %d: all-reduce in fallback window memory: %s\n", r,
                            sl_errmsg()),
                        fails++;
            } else if (st == SL_OK || dt > 10.0) {
                fprintf(stderr, "FAIL rank %d: asymmetric window all-reduce gave %s after %.1f s\n", r,
                        sl_status_name(st), dt);
                fails++;
            } else if (r == 0) {
                printf("asymmetric window use: %s after %.3f s: %s\n", sl_status_name(st), dt, sl_errmsg());
            }
            sl_comm_mem_free(dup, dw);
        }
        sl_comm_free(dup);
    }
    free(ps), free(pr), free(again), free(g);
    if (sl_comm_mem_free(c, w) != SL_OK)
        fprintf(stderr, "FAIL rank %d: mem_free: %s\n", r, sl_errmsg()), fails++;
    int dummy = 0;
    if (sl_comm_mem_free(c, &dummy) == SL_OK)
        fprintf(stderr, "FAIL rank %d: mem_free of a foreign pointer\n", r), fails++;
    return fails;
}

/* The hierarchical all-reduce (algo/hier.c) against the flat ring on random f32 data, sizes 0, 1 (the
 * count % L tail only), 3, 4093 and 1Mi+3 (shards plus a tail), in place and out of place, SUM and AVG:
 * - every rank ends with the same bits (each block is reduced once and copied);
 * - ring and hier sum the n inputs of an element in different orders, so they differ by reassociation
 *   only: each is within gamma_{n-1} = (n-1)u sum_r |x_r| of the exact sum (u = 2^-24, the standard
 *   bound for a recursive sum), so |hier - ring| <= 2 (n-1) u sum_r |x_r|, with sum_r |x_r| taken
 *   from an f64 all-reduce of |x| (exact to well under u at these n);
 * - the same bound against the f64 all-reduce of x (the exact sum to 2^-53 relative).
 * Small-integer inputs (the matrix) are exact in every order, so there hier equals the reference
 * bit for bit. Returns failures on this rank; nothing to do on one host. */
int cc_run_hier_check(sl_comm *c) {
    int n = sl_comm_size(c), r = sl_comm_rank(c), fails = 0;
    if (sl_comm_nhosts(c) < 2 || n < 2) return 0;
    const size_t sizes[] = {0, 1, 3, 4093, (1u << 20) + 3};
    size_t M = sizes[4];
    float *x = malloc(4 * M), *h = malloc(4 * M), *g = malloc(4 * M);
    double *ex = malloc(8 * M), *ab = malloc(8 * M);
    const double u = ldexp(1.0, -24);
    for (size_t si = 0; si < 5 && !fails; si++) {
        size_t cnt = sizes[si];
        for (int cas = 0; cas < 4 && !fails; cas++) {
            int inplace = cas & 1;
            sl_comm_redop op = cas & 2 ? SL_COMM_AVG : SL_COMM_SUM;
            sl_rng_fill_normal(x, (int64_t)cnt, 991 + (uint64_t)si, (uint64_t)r, 0.f, 1.f);
            for (size_t i = 0; i < cnt; i++) ex[i] = x[i], ab[i] = fabs(x[i]);
            sl_status st = sl_comm_all_reduce(c, ex, ex, cnt, SL_COMM_F64, SL_COMM_SUM);
            if (st == SL_OK) st = sl_comm_all_reduce(c, ab, ab, cnt, SL_COMM_F64, SL_COMM_SUM);
            sl_comm_set_algo(c, SL_COMM_ALGO_RING);
            if (st == SL_OK) st = sl_comm_all_reduce(c, x, g, cnt, SL_COMM_F32, op);
            sl_comm_set_algo(c, SL_COMM_ALGO_HIER);
            if (inplace) memcpy(h, x, 4 * cnt);
            if (st == SL_OK) st = sl_comm_all_reduce(c, inplace ? h : x, h, cnt, SL_COMM_F32, op);
            sl_comm_set_algo(c, SL_COMM_ALGO_AUTO);
            if (st != SL_OK) {
                fprintf(stderr, "FAIL rank %d: hier check: %s\n", r, sl_errmsg());
                fails++;
                break;
            }
            /* AVG: each side also rounds its division once (u |result| each) */
            double div = op == SL_COMM_AVG ? n : 1, worst = 0;
            size_t wi = 0;
            for (size_t i = 0; i < cnt; i++) {
                double bound = (2.0 * (n - 1) * u * ab[i] + 2.0 * u * fabs(ex[i])) / div;
                double e1 = fabs((double)h[i] - (double)g[i]) / (bound > 0 ? bound : 1e-300);
                double e2 = fabs((double)h[i] - ex[i] / div) / (bound > 0 ? bound : 1e-300);
                double e = e1 > e2 ? e1 : e2;
                if (e > worst) worst = e, wi = i;
            }
            if (worst > 1.0) {
                fprintf(
                    stderr,
                    "FAIL rank %d: hier vs ring, %zu elements %s %s: element %zu hier %.9g ring %.9g exact "
                    "%.9g (%.2f x the reassociation bound)\n",
                    r, cnt, sl_comm_redop_name(op), inplace ? "in place" : "out of place", wi, h[wi], g[wi],
                    ex[wi] / div, worst);
                fails++;
            }
            /* the same bits on every rank: min and max over ranks of each element agree */
            if (cnt) {
                memcpy(g, h, 4 * cnt);
                memcpy(x, h, 4 * cnt);
                st = sl_comm_all_reduce(c, g, g, cnt, SL_COMM_F32, SL_COMM_MAX);
                if (st == SL_OK) st = sl_comm_all_reduce(c, x, x, cnt, SL_COMM_F32, SL_COMM_MIN);
                if (st != SL_OK || memcmp(g, x, 4 * cnt) || memcmp(g, h, 4 * cnt))
                    fprintf(stderr, "FAIL rank %d: hier all-reduce of %zu elements differs across ranks\n", r,
                            cnt),
                        fails++;
            }
        }
    }
    if (r == 0 && !fails)
        printf(
            "hier vs ring: %d ranks on %d hosts, within the reassociation bound, same bits on every rank\n",
            n, sl_comm_nhosts(c));
    free(x), free(h), free(g), free(ex), free(ab);
    return fails;
}
