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
        sb = xmalloc(count * es);
        for (size_t i = 0; i < count; i++) put(dt, sb, i, val(r, i, cas, op));
        rb = inplace ? sb : xmalloc(count * es);
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
        rb = xmalloc(tot * es);
        want = xmalloc(tot * es);
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < cnt[k]; i++) put(dt, want, dsp[k] + i, val(k, i, cas, SL_COMM_SUM));
        if (inplace) {
            memcpy((char *)rb + dsp[r] * es, (char *)want + dsp[r] * es, cnt[r] * es);
            st = coll == AG ? sl_comm_all_gather(c, (char *)rb + dsp[r] * es, rb, count, dt)
                            : sl_comm_all_gatherv(c, (char *)rb + dsp[r] * es, rb, cnt, dsp, dt);
        } else {
            sb = xmalloc(cnt[r] * es);
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
        sb = xmalloc(tot * es);
        for (size_t i = 0; i < tot; i++) put(dt, sb, i, val(r, i, cas, op));
        rb = inplace ? (char *)sb + (size_t)r * count * es : xmalloc(count * es);
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
        sb = xmalloc(tot * es);
        for (size_t i = 0; i < tot; i++) put(dt, sb, i, val(r, i, cas, SL_COMM_SUM));
        rb = inplace ? sb : xmalloc(tot * es);
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
        sb = xmalloc(st_ * es);
        for (size_t i = 0; i < st_; i++) put(dt, sb, i, val(r, i, cas, SL_COMM_SUM));
        rb = xmalloc(rt * es);
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
    if (rb != sb) free(rb);
    free(sb);
    free(want);
    return bad;
}

int cc_run_matrix(sl_comm *c, const cc_cfg *cfg) {
    int fails = 0, cas = 0;
    static const sl_comm_algo algos[] = {SL_COMM_ALGO_AUTO, SL_COMM_ALGO_RING, SL_COMM_ALGO_RD,
                                         SL_COMM_ALGO_DIRECT};
    int nalgo = cfg->algos ? 4 : 1;
    for (int coll = 0; coll < NCOLL; coll++) {
        int reducing = coll == AR || coll == RED || coll == RS;
        for (int a = 0; a < (coll == AR || coll == BC || coll == RS ? nalgo : 1); a++) {
            if (coll == RS && a > 0 && algos[a] != SL_COMM_ALGO_DIRECT) continue; /* ring (auto) or direct */
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
                cc_cfg small = {0, 0, 1};
                fails += cc_run_matrix(sub2, &small) ? 1 : 0;
            }
            sl_comm_free(sub2);
        }
        sl_comm_free(sub);
    }
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
    if (sl_comm_async_error(c) != SL_OK) fprintf(stderr, "FAIL rank %d: async error set\n", r), fails++;
    return fails;
}
