/* The trainable mixture-of-experts ops on the OpenCL backend (kernels/moe.cl): routing and its backward, the
 * router losses, the per-expert gather / combine, the expert-parallel pairs (counts, pack, unpack, gather,
 * scatter, regroup) and the routed SwiGLU experts, per-expert (MOE_EXPERT_FFN) and packed (MOE_PACKED_FFN);
 * and inference's MOE_EXPERT with the bf16 numerics (Note [OpenCL bf16 experts]; the f32 one is in
 * opencl_ops_nn.c).
 *
 * Note [OpenCL MoE kernels]
 * Semantics are the CPU kernels' (src/device/cpu/kernels/moe.c, moe_ep.c, moe_packed.c), f32, and the
 * packed experts' autocast numerics (Note [Packed experts under autocast] below). Order guarantees:
 * - routing: one work-item per token runs the CPU's route_row (scores with exp in double rounded once where
 *   the device has fp64, as glibc's expf rounds; the first maximum wins every argmax, as in the CPU's scans;
 *   group-limited top-k on the sum of each group's top two), so the selection is the CPU's; the capacity is
 *   one work-item per expert scanning its column in token order (an expert keeps its first `capacity`
 *   tokens, later ones are marked dropped): the CPU's serial scan restricted to one column, the same result;
 *   for a sequence shard under SP (src2, Note [Capacity under sequence parallelism] in src/nn/moe.c) the
 *   scan starts each batch row at the position every shard's counts give it, as the CPU does (whole-number
 *   counts: the float sums are exact), and MOE_EP_COUNTS counts per batch row (one work-item per (row,
 *   expert)); tests/backend/test_opencl_train.c runs tp 2 + SP with a capacity on the device;
 * - row maps (token -> row of expert e, (token, expert) -> packed row, received row -> local expert row) are
 *   built on the device by scans in the CPU's order (k_moe_kept_map and k_moe_ep_map: one work-item;
 *   k_moe_col_count / k_moe_pair_rows: one per expert, expert-major then token order); the data movement
 *   then runs one work-item per (row, column) element;
 * - every sum runs in the CPU's order from the CPU's start value: a token's unpacked row over its experts in
 *   expert order from 0, each gate gradient's dot over the columns in order, the router losses over (token,
 *   expert) in row-major order in double (one work-item; needs cl_khr_fp64, refused by name without it),
 *   the routing backward per token as the CPU's loops; so these ops give the CPU's bits (exp aside);
 * - the expert FFNs run the backend's GEMM (ocl_gemm: the register-blocked kernel, or the tiled one on
 *   GPU-type devices) on the expert's rows only, as the CPU runs sl_sgemm on them: their values are the
 *   MATMUL node's (the GEMM's summation order, not the CPU's). The row counts a GEMM needs on the host are
 *   read back at the node (a blocking read of up to E floats: the route's kept counts or the exchanged
 *   counts) and validated there as the CPU validates them;
 * - where the CPU fails (an expert keeping more tokens than its rows, more kept pairs than packed rows,
 *   exchanged counts that are not whole numbers within the rows), the map kernels map only rows within the
 *   tensors and raise the backend's flag, which the node reads back (8 bytes, blocking) and turns into the
 *   CPU's error: silently clamping would make a wrong capacity look like a dropped token.
 * Temporaries (row maps, the experts' hidden rows) live in the second scratch region (ocl_scratch2), which
 * the GEMM does not use. */
#include <string.h>

#include "device/opencl/opencl_internal.h"

#define REF(t, r) SL_TRY(ocl_ref_of(n, (t), (r)))

static int f32_rows(const sl_tensor *t) { return t && t->dtype == SL_F32 && t->ndim == 2 && t->nb[1] == 1; }
static int f32c(const sl_tensor *t) { return t && t->dtype == SL_F32 && sl_is_contiguous(t); }

/* the packed chain node f's numerics: f32, or autocast bf16 / f16 (the bf16 GEMM needs the register-blocked
 * GEMM's bf16 path) */
static int half_ok(const sl_tensor *f) {
    int h = f->iparams[3];
    return h == 0 || h == SL_F16 || (h == SL_BF16 && (!f->iparams[4] || g_ocl.gemm_kind == OCL_GEMM_REG));
}

/* MOE_ROUTE's src2 (sl_moe_route_shard): P x B x E f32 counts for B blocks of the N rows, this shard < P, as
 * the CPU kernel checks them */
static int shard_counts_ok(const sl_tensor *n) {
    const sl_tensor *pc = n->src[2];
    int64_t N = n->src[0]->ne[0], E = n->src[0]->ne[1], B = n->iparams[SL_MOE_ROUTE_IP_BLOCKS],
            me = n->iparams[SL_MOE_ROUTE_IP_SHARD];
    if (!f32c(pc) || B < 1 || N % B || sl_nelements(pc) % (B * E)) return 0;
    return me >= 0 && me < sl_nelements(pc) / (B * E);
}

static int bf16_expert_ok(const sl_tensor *n); /* MOE_EXPERT's bf16 numerics (Note [OpenCL bf16 experts]) */

/* 1: supported, 0: refused (f32 only; the autocast numerics of the packed experts; the router losses without
 * fp64), -1: not an op of this file */
int ocl_moe_supports(const sl_tensor *n) {
    const sl_tensor *a = n->src[0];
    switch (n->op) {
    case SL_OP_MOE_ROUTE: /* src2: a sequence shard's capacity offsets (shard_counts_ok) */
        return n->dtype == SL_F32 && f32_rows(a) && (!n->src[1] || f32c(n->src[1])) && a->ne[1] <= 1024 &&
               n->iparams[3] <= 64 && (!n->src[2] || shard_counts_ok(n));
    case SL_OP_MOE_ROUTE_BACK:
        return n->dtype == SL_F32 && f32_rows(n->src[1]);
    case SL_OP_MOE_ROUTER_LOSS:
    case SL_OP_MOE_ROUTER_LOSS_BACK:
        return g_ocl.has_fp64 && n->dtype == SL_F32 &&
               f32_rows(n->op == SL_OP_MOE_ROUTER_LOSS ? a : n->src[1]);
    case SL_OP_MOE_GATHER:
    case SL_OP_MOE_COMBINE:
    case SL_OP_MOE_COMBINE_BACK_GATE:
    case SL_OP_MOE_EP_PACK:
    case SL_OP_MOE_EP_UNPACK:
    case SL_OP_MOE_EP_UNPACK_BACK_GATE:
    case SL_OP_MOE_EP_GATHER:
    case SL_OP_MOE_EP_SCATTER:
    case SL_OP_MOE_EP_REGROUP:
        return n->dtype == SL_F32 && f32_rows(a) && (!n->src[2] || f32_rows(n->src[2]));
    case SL_OP_MOE_EP_COUNTS:
    case SL_OP_MOE_EXPERT_FFN:
    case SL_OP_MOE_EXPERT_FFN_BACK:
    case SL_OP_MOE_EXPERT_FFN_BACK_X:
        return n->dtype == SL_F32;
    case SL_OP_MOE_PACKED_FFN: /* autocast: bf16 / f16 roundings; the bf16 GEMM on the register-blocked one */
        return n->dtype == SL_F32 && half_ok(n);
    case SL_OP_MOE_PACKED_FFN_BACK:
        return n->dtype == SL_F32 && half_ok(a) && f32_rows(n->src[1]);
    case SL_OP_MOE_PACKED_FFN_BACK_W:
    case SL_OP_MOE_PACKED_FFN_DX:
        return n->dtype == SL_F32 && half_ok(a->src[0]);
    case SL_OP_MOE_EXPERT: /* the bf16 numerics of inference here (Note [OpenCL bf16 experts]); f32: -1, the
                              shared table and ocl_op_nn */
        return n->iparams[1] ? bf16_expert_ok(n) : -1;
    default:
        return -1;
    }
}

/* count floats of t from element `at` (past t's data: aux) into dst, waiting for them */
static sl_status read_floats(const sl_tensor *n, const sl_tensor *t, int64_t at, int64_t count, float *dst) {
    ocl_ref r;
    REF(t, &r);
    if (count <= 0) return SL_OK;
    cl_int err = clEnqueueReadBuffer(g_ocl.queue, r.mem, CL_TRUE, sizeof(float) * (size_t)(r.off + at),
                                     sizeof(float) * (size_t)count, dst, 0, NULL, NULL);
    return err == CL_SUCCESS ? SL_OK : ocl_fail(err, "reading the expert counts");
}

static sl_status fill(ocl_ref r, int64_t at, int64_t count, float v) {
    return count > 0 ? ocl_ew_flat(EW_FILL, v, r.mem, r.off + at, count) : SL_OK;
}

/* the map kernels' overflow flag (g_ocl.flag: 1, count or -1), read and cleared after the node: an error as
 * the CPU kernel's */
static sl_status moe_check(const sl_tensor *n, int64_t rows) {
    int set, v;
    SL_TRY(ocl_read_flag("reading the MoE row check", &set, &v));
    if (!set) return SL_OK;
    if (v < 0)
        return sl_fail(SL_ERR_INVALID, "%s '%s': the exchanged token counts are invalid", sl_op_name(n->op),
                       n->name);
    return sl_fail(SL_ERR_INVALID, "%s '%s': %d kept tokens, more than the %lld rows", sl_op_name(n->op),
                   n->name, v, (long long)rows);
}

/* a whole count in [0, hi], else -1 */
static int64_t whole(float v, int64_t hi) {
    return v >= 0 && v <= (float)hi && v == (float)(int64_t)v ? (int64_t)v : -1;
}

/* ---------------- routing and the router losses ---------------- */

static sl_status op_route(sl_tensor *n) {
    const sl_tensor *a = n->src[0], *bias = n->src[1];
    int64_t N = a->ne[0], E = a->ne[1];
    ocl_ref o, x, b;
    REF(n, &o);
    REF(a, &x);
    if (bias)
        REF(bias, &b);
    else
        b = x;
    ocl_call c = ocl_begin(OK_MOE_ROUTE_ROW);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, x);
    ocl_long(&c, a->nb[0]);
    ocl_long(&c, N);
    ocl_long(&c, E);
    ocl_ref_arg(&c, b);
    ocl_int(&c, bias != NULL);
    for (int i = 0; i < 5; i++) ocl_int(&c, n->iparams[i]); /* k, sigmoid, norm, groups, top groups */
    ocl_float(&c, n->fparams[0]);
    ocl_int(&c, n->iparams[SL_MOE_ROUTE_IP_HALF]);
    SL_TRY(ocl_run1(&c, (size_t)N));
    /* a sequence shard: every shard's counts per batch row place its tokens (Note [Capacity under sequence
     * parallelism], src/nn/moe.c) */
    const sl_tensor *prior = n->src[2];
    int64_t B = prior ? n->iparams[SL_MOE_ROUTE_IP_BLOCKS] : 1;
    ocl_ref pc = o;
    if (prior) REF(prior, &pc);
    ocl_call k = ocl_begin(OK_MOE_ROUTE_CAP);
    ocl_ref_arg(&k, o);
    ocl_long(&k, N);
    ocl_long(&k, E);
    ocl_long(&k, n->iparams[5]);
    ocl_ref_arg(&k, pc);
    ocl_long(&k, prior ? sl_nelements(prior) / (B * E) : 0);
    ocl_long(&k, B);
    ocl_long(&k, prior ? n->iparams[SL_MOE_ROUTE_IP_SHARD] : 0);
    return ocl_run1(&k, (size_t)E);
}

static sl_status op_route_back(sl_tensor *n) {
    const sl_tensor *f = n->src[0], *g = n->src[1];
    ocl_ref o, rf, rg;
    REF(n, &o);
    REF(f, &rf);
    REF(g, &rg);
    ocl_call c = ocl_begin(OK_MOE_ROUTE_BACK);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, rf);
    ocl_ref_arg(&c, rg);
    ocl_long(&c, g->nb[0]);
    ocl_long(&c, f->ne[0]);
    ocl_long(&c, f->ne[1]);
    ocl_int(&c, f->iparams[1]);
    ocl_int(&c, f->iparams[2]);
    ocl_float(&c, f->fparams[0]);
    ocl_int(&c, f->iparams[SL_MOE_ROUTE_IP_HALF]);
    return ocl_run1(&c, (size_t)f->ne[0]);
}

static sl_status op_router_loss(sl_tensor *n) {
    const sl_tensor *x = n->src[0], *route = n->src[1];
    ocl_ref o, rx, rr;
    REF(n, &o);
    REF(x, &rx);
    REF(route, &rr);
    ocl_call c = ocl_begin(OK_MOE_ROUTER_LOSS);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, rx);
    ocl_long(&c, x->nb[0]);
    ocl_ref_arg(&c, rr);
    ocl_long(&c, x->ne[0]);
    ocl_long(&c, x->ne[1]);
    ocl_int(&c, route->iparams[0]);
    ocl_int(&c, route->iparams[1]);
    ocl_float(&c, n->fparams[0]);
    ocl_float(&c, n->fparams[1]);
    return ocl_run1(&c, 1);
}

static sl_status op_router_loss_back(sl_tensor *n) {
    const sl_tensor *f = n->src[0], *x = n->src[1], *route = n->src[2], *dl = n->src[3];
    ocl_ref o, rx, rr, rd;
    REF(n, &o);
    REF(x, &rx);
    REF(route, &rr);
    REF(dl, &rd);
    ocl_call c = ocl_begin(OK_MOE_ROUTER_LOSS_BACK);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, rx);
    ocl_long(&c, x->nb[0]);
    ocl_ref_arg(&c, rr);
    ocl_ref_arg(&c, rd);
    ocl_long(&c, x->ne[0]);
    ocl_long(&c, x->ne[1]);
    ocl_int(&c, route->iparams[0]);
    ocl_int(&c, route->iparams[1]);
    ocl_float(&c, f->fparams[0]);
    ocl_float(&c, f->fparams[1]);
    return ocl_run1(&c, (size_t)x->ne[0]);
}

/* ---------------- per-expert gather / combine ---------------- */

/* expert e's kept tokens: map (R ints) then tok (N ints) in scratch2 */
static sl_status kept_map(const sl_tensor *n, const sl_tensor *route, int64_t e, int64_t R, cl_mem *m) {
    int64_t N = route->ne[0], E = route->ne[1];
    ocl_ref rr;
    REF(route, &rr);
    SL_TRY(ocl_scratch2(sizeof(cl_int) * (size_t)(R + N + 1), m));
    ocl_call c = ocl_begin(OK_MOE_KEPT_MAP);
    ocl_mem(&c, *m);
    ocl_ref_arg(&c, rr);
    ocl_long(&c, N);
    ocl_long(&c, E);
    ocl_long(&c, e);
    ocl_long(&c, R);
    ocl_mem(&c, g_ocl.flag);
    return ocl_run1(&c, 1);
}

/* k_moe_rows: o[q] <- x[map[q]] (times the weight) for nrows rows of C */
typedef struct {
    ocl_ref o, x, acc, w;
    int64_t ldo, ldx, lda, ws, wc;
    cl_mem map;
    int64_t mo; /* element offset of the map (ints) */
    int64_t C, nrows;
    int fill, weighted;
} rows_args;

static sl_status run_rows(const rows_args *a) {
    ocl_call c = ocl_begin(OK_MOE_ROWS);
    ocl_ref_arg(&c, a->o);
    ocl_long(&c, a->ldo);
    ocl_ref_arg(&c, a->x);
    ocl_long(&c, a->ldx);
    ocl_ref_arg(&c, (ocl_ref){a->map, a->mo});
    ocl_long(&c, a->C);
    ocl_long(&c, a->nrows);
    ocl_int(&c, a->fill);
    ocl_ref_arg(&c, a->fill == 2 ? a->acc : a->x);
    ocl_long(&c, a->lda);
    ocl_ref_arg(&c, a->weighted ? a->w : a->x);
    ocl_long(&c, a->ws);
    ocl_long(&c, a->wc);
    ocl_int(&c, a->weighted);
    size_t g[2] = {(size_t)a->C, (size_t)a->nrows};
    return ocl_run(&c, 2, g, NULL);
}

static sl_status op_gather(sl_tensor *n) {
    const sl_tensor *x = n->src[0], *route = n->src[1];
    int64_t R = n->ne[0], C = n->ne[1], e = n->iparams[0];
    cl_mem m;
    SL_TRY(kept_map(n, route, e, R, &m));
    rows_args a = {.ldo = C,
                   .ldx = x->nb[0],
                   .map = m,
                   .mo = 0,
                   .C = C,
                   .nrows = R,
                   .fill = n->iparams[2] ? 0 : 1,
                   .weighted = n->iparams[1],
                   .ws = route->ne[1],
                   .wc = e};
    REF(n, &a.o);
    REF(x, &a.x);
    REF(route, &a.w);
    SL_TRY(run_rows(&a));
    return moe_check(n, R);
}

static sl_status op_combine(sl_tensor *n) {
    const sl_tensor *y = n->src[0], *route = n->src[1], *acc = n->src[2];
    int64_t N = n->ne[0], C = n->ne[1], E = route->ne[1], e = n->iparams[0], R = y->ne[0];
    cl_mem m;
    SL_TRY(kept_map(n, route, e, R, &m));
    ocl_ref o, ry, rw, ra;
    REF(n, &o);
    REF(y, &ry);
    REF(route, &rw);
    if (acc)
        REF(acc, &ra);
    else
        ra = o;
    ocl_call c = ocl_begin(OK_MOE_COMBINE);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, ry);
    ocl_long(&c, y->nb[0]);
    ocl_ref_arg(&c, (ocl_ref){m, R});
    ocl_ref_arg(&c, ra);
    ocl_long(&c, acc ? acc->nb[0] : C);
    ocl_int(&c, acc != NULL);
    ocl_ref_arg(&c, rw);
    ocl_long(&c, E);
    ocl_long(&c, e);
    ocl_int(&c, n->iparams[1]);
    ocl_long(&c, C);
    ocl_long(&c, N);
    size_t g[2] = {(size_t)C, (size_t)N};
    SL_TRY(ocl_run(&c, 2, g, NULL));
    return moe_check(n, R);
}

static sl_status op_combine_back_gate(sl_tensor *n) {
    const sl_tensor *y = n->src[0], *route = n->src[1], *dy = n->src[2];
    int64_t N = n->ne[0], E = n->ne[1], C = y->ne[1], e = n->iparams[0], R = y->ne[0];
    cl_mem m;
    SL_TRY(kept_map(n, route, e, R, &m));
    ocl_ref o, ry, rd;
    REF(n, &o);
    REF(y, &ry);
    REF(dy, &rd);
    ocl_call c = ocl_begin(OK_MOE_COMBINE_BACK_GATE);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, ry);
    ocl_long(&c, y->nb[0]);
    ocl_ref_arg(&c, rd);
    ocl_long(&c, dy->nb[0]);
    ocl_ref_arg(&c, (ocl_ref){m, R});
    ocl_long(&c, N);
    ocl_long(&c, E);
    ocl_long(&c, e);
    ocl_long(&c, C);
    SL_TRY(ocl_run1(&c, (size_t)(N * E)));
    return moe_check(n, R);
}

/* ---------------- expert-parallel pairs ---------------- */

static sl_status op_ep_counts(sl_tensor *n) {
    const sl_tensor *route = n->src[0];
    ocl_ref o, rr;
    REF(n, &o);
    REF(route, &rr);
    int64_t B = n->iparams[0] > 1 ? n->iparams[0] : 1; /* per block of rows (sl_moe_route_block_counts) */
    ocl_call c = ocl_begin(OK_MOE_EP_COUNTS);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, rr);
    ocl_long(&c, route->ne[0]);
    ocl_long(&c, route->ne[1]);
    ocl_long(&c, B);
    return ocl_run1(&c, (size_t)(B * route->ne[1]));
}

/* the packed row of every kept pair (row[n E + e] at element E of *m), S rows at most */
static sl_status pair_rows(const sl_tensor *n, const sl_tensor *route, int64_t S, cl_mem *m) {
    int64_t N = route->ne[0], E = route->ne[1];
    ocl_ref rr;
    REF(route, &rr);
    SL_TRY(ocl_scratch2(sizeof(cl_int) * (size_t)(E + N * E + 1), m));
    ocl_call c = ocl_begin(OK_MOE_COL_COUNT);
    ocl_mem(&c, *m);
    ocl_ref_arg(&c, rr);
    ocl_long(&c, N);
    ocl_long(&c, E);
    SL_TRY(ocl_run1(&c, (size_t)E));
    ocl_call k = ocl_begin(OK_MOE_PAIR_ROWS);
    ocl_mem(&k, *m);
    ocl_ref_arg(&k, rr);
    ocl_long(&k, N);
    ocl_long(&k, E);
    ocl_long(&k, S);
    ocl_mem(&k, g_ocl.flag);
    return ocl_run1(&k, (size_t)E);
}

/* EP_PACK (pack = 1) and EP_UNPACK (0) */
static sl_status op_pack(sl_tensor *n, int pack) {
    const sl_tensor *x = n->src[0], *route = n->src[1];
    int64_t N = route->ne[0], E = route->ne[1], C = n->ne[1], S = pack ? n->ne[0] : x->ne[0];
    cl_mem m;
    SL_TRY(pair_rows(n, route, S, &m));
    ocl_ref o, rx, rw;
    REF(n, &o);
    REF(x, &rx);
    REF(route, &rw);
    ocl_call c = ocl_begin(pack ? OK_MOE_PACK : OK_MOE_UNPACK);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, rx);
    ocl_long(&c, x->nb[0]);
    ocl_ref_arg(&c, (ocl_ref){m, E});
    ocl_ref_arg(&c, rw);
    ocl_int(&c, n->iparams[1]);
    ocl_long(&c, N);
    ocl_long(&c, E);
    ocl_long(&c, C);
    size_t g[2] = {(size_t)C, (size_t)N};
    SL_TRY(ocl_run(&c, 2, g, NULL));
    return moe_check(n, S);
}

static sl_status op_unpack_back_gate(sl_tensor *n) {
    const sl_tensor *y = n->src[0], *route = n->src[1], *dy = n->src[2];
    int64_t N = n->ne[0], E = n->ne[1], C = y->ne[1];
    cl_mem m;
    SL_TRY(pair_rows(n, route, y->ne[0], &m));
    ocl_ref o, ry, rd;
    REF(n, &o);
    REF(y, &ry);
    REF(dy, &rd);
    ocl_call c = ocl_begin(OK_MOE_UNPACK_BACK_GATE);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, ry);
    ocl_long(&c, y->nb[0]);
    ocl_ref_arg(&c, rd);
    ocl_long(&c, dy->nb[0]);
    ocl_ref_arg(&c, (ocl_ref){m, E});
    ocl_long(&c, N);
    ocl_long(&c, E);
    ocl_long(&c, C);
    SL_TRY(ocl_run1(&c, (size_t)(N * E)));
    return moe_check(n, y->ne[0]);
}

/* EP_GATHER (mode 0), EP_SCATTER (1), EP_REGROUP (2: to expert-major, 3: back): a row map of the received
 * rows, then the rows moved */
static sl_status op_ep_rows(sl_tensor *n) {
    const sl_tensor *x = n->src[0], *rcnt = n->src[1], *acc = n->src[2];
    int64_t C = n->ne[1], rows = n->ne[0], El, l = 0, lrows = 0;
    int mode;
    if (n->op == SL_OP_MOE_EP_REGROUP) {
        El = n->iparams[1], mode = 2 + n->iparams[0];
    } else {
        El = n->iparams[1], l = n->iparams[0];
        mode = n->op == SL_OP_MOE_EP_SCATTER;
        rows = mode ? n->ne[0] : x->ne[0]; /* the received rows */
        lrows = mode ? x->ne[0] : n->ne[0];
    }
    int64_t nmap = n->ne[0];
    cl_mem m;
    ocl_ref rc;
    REF(rcnt, &rc);
    SL_TRY(ocl_scratch2(sizeof(cl_int) * (size_t)(nmap + 1), &m));
    ocl_call c = ocl_begin(OK_MOE_EP_MAP);
    ocl_mem(&c, m);
    ocl_ref_arg(&c, rc);
    ocl_long(&c, rcnt->ne[0] / El);
    ocl_long(&c, El);
    ocl_long(&c, l);
    ocl_long(&c, n->op == SL_OP_MOE_EP_REGROUP ? 0 : n->iparams[3]); /* one source's rows */
    ocl_long(&c, rows);
    ocl_long(&c, lrows);
    ocl_long(&c, nmap);
    ocl_int(&c, mode);
    ocl_mem(&c, g_ocl.flag);
    SL_TRY(ocl_run1(&c, 1));
    int fill = n->op == SL_OP_MOE_EP_SCATTER  ? (acc ? 2 : 1)
               : n->op == SL_OP_MOE_EP_GATHER ? (n->iparams[2] ? 0 : 1)
                                              : !(n->flags & SL_FLAG_ROWS_CAP); /* Note [Reserved rows] */
    rows_args a = {.ldo = C,
                   .ldx = x->nb[0],
                   .map = m,
                   .mo = 0,
                   .C = C,
                   .nrows = nmap,
                   .fill = fill,
                   .lda = acc ? acc->nb[0] : C};
    REF(n, &a.o);
    REF(x, &a.x);
    if (acc) REF(acc, &a.acc);
    SL_TRY(run_rows(&a));
    return moe_check(n, n->ne[0]);
}

/* ---------------- the routed SwiGLU experts ---------------- */

static sl_status gemm32(int M, int N, int K, ocl_ref a, int64_t lda, int tA, ocl_ref b, int64_t ldb, int tB,
                        ocl_ref c, int64_t ldc, int beta1) {
    return ocl_gemm(M, N, K, a, lda, tA, b, ldb, tB, c, ldc, beta1, SL_F32, 0, 0);
}

/* half: 0 none, 1 bf16, 2 f16 (k_moe_* kernels) */
static sl_status swiglu_h(ocl_ref h, ocl_ref a1, ocl_ref a3, int64_t n, int half) {
    ocl_call c = ocl_begin(OK_MOE_SWIGLU);
    ocl_ref_arg(&c, h);
    ocl_ref_arg(&c, a1);
    ocl_ref_arg(&c, a3);
    ocl_long(&c, n);
    ocl_int(&c, half);
    return ocl_run1(&c, (size_t)n);
}
static sl_status swiglu(ocl_ref h, ocl_ref a1, ocl_ref a3, int64_t n) { return swiglu_h(h, a1, a3, n, 0); }

static sl_status swiglu_back_h(ocl_ref d1, ocl_ref d3, ocl_ref a1, ocl_ref a3, int64_t n, int half) {
    ocl_call c = ocl_begin(OK_MOE_SWIGLU_BACK);
    ocl_ref_arg(&c, d1);
    ocl_ref_arg(&c, d3);
    ocl_ref_arg(&c, a1);
    ocl_ref_arg(&c, a3);
    ocl_long(&c, n);
    ocl_int(&c, half);
    return ocl_run1(&c, (size_t)n);
}
static sl_status swiglu_back(ocl_ref d1, ocl_ref d3, ocl_ref a1, ocl_ref a3, int64_t n) {
    return swiglu_back_h(d1, d3, a1, a3, n, 0);
}

static ocl_ref at(ocl_ref r, int64_t off) { return (ocl_ref){r.mem, r.off + off}; }

/* y (cnt rows of C) = w2 (silu(w1 x) * w3 x) with a1 = w1 x, a3 = w3 x (cnt rows of I, kept) */
static sl_status ffn_forward(const sl_tensor *n, int64_t cnt, int64_t C, int64_t I, ocl_ref x, ocl_ref y,
                             ocl_ref a1, ocl_ref a3) {
    if (cnt <= 0) return SL_OK;
    if (cnt > INT32_MAX || C > INT32_MAX || I > INT32_MAX)
        return sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: expert '%s' too large", n->name);
    ocl_ref w1, w3, w2;
    REF(n->src[1], &w1);
    REF(n->src[2], &w3);
    REF(n->src[3], &w2);
    cl_mem hm;
    SL_TRY(ocl_scratch2(sizeof(float) * (size_t)(cnt * I), &hm));
    ocl_ref h = {hm, 0};
    SL_TRY(gemm32((int)cnt, (int)I, (int)C, x, C, 0, w1, C, 1, a1, I, 0));
    SL_TRY(gemm32((int)cnt, (int)I, (int)C, x, C, 0, w3, C, 1, a3, I, 0));
    SL_TRY(swiglu(h, a1, a3, cnt * I));
    return gemm32((int)cnt, (int)C, (int)I, h, I, 0, w2, I, 1, y, C, 0);
}

/* dw2 = dy^T h, then d(w1 x) into d1 and d(w3 x) into d3 (h and dh in d1's rows first) */
static sl_status ffn_back(const sl_tensor *n, int64_t cnt, int64_t C, int64_t I, ocl_ref dy, int64_t ds,
                          ocl_ref w2, ocl_ref a1, ocl_ref a3, ocl_ref d1, ocl_ref d3, ocl_ref dw2) {
    if (cnt <= 0) return fill(dw2, 0, C * I, 0.0f);
    if (cnt > INT32_MAX || C > INT32_MAX || I > INT32_MAX)
        return sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: expert '%s' too large", n->name);
    SL_TRY(swiglu(d1, a1, a3, cnt * I));
    SL_TRY(gemm32((int)C, (int)I, (int)cnt, dy, ds, 1, d1, I, 0, dw2, I, 0)); /* dw2 = dy^T h */
    SL_TRY(gemm32((int)cnt, (int)I, (int)C, dy, ds, 0, w2, I, 0, d1, I, 0));  /* dh = dy w2 */
    return swiglu_back(d1, d3, a1, a3, cnt * I);
}

/* dw1 = d1^T x, dw3 = d3^T x (when dw1 is set), dx = d1 w1 + d3 w3 (when dx is set) */
static sl_status ffn_back_x(const sl_tensor *n, int64_t cnt, int64_t C, int64_t I, ocl_ref x, ocl_ref d1,
                            ocl_ref d3, ocl_ref w1, ocl_ref w3, const ocl_ref *dw1, const ocl_ref *dx) {
    if (cnt <= 0) return dw1 ? fill(*dw1, 0, 2 * I * C, 0.0f) : SL_OK;
    if (cnt > INT32_MAX || C > INT32_MAX || I > INT32_MAX)
        return sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: expert '%s' too large", n->name);
    if (dw1) {
        SL_TRY(gemm32((int)I, (int)C, (int)cnt, d1, I, 1, x, C, 0, *dw1, C, 0));
        SL_TRY(gemm32((int)I, (int)C, (int)cnt, d3, I, 1, x, C, 0, at(*dw1, I * C), C, 0));
    }
    if (dx) {
        SL_TRY(gemm32((int)cnt, (int)C, (int)I, d1, I, 0, w1, C, 0, *dx, C, 0));
        SL_TRY(gemm32((int)cnt, (int)C, (int)I, d3, I, 0, w3, C, 0, *dx, C, 1));
    }
    return SL_OK;
}

/* MOE_EXPERT_FFN's kept count: the route's kept count of e, or (El > 0) the received counts of local expert e
 */
static sl_status expert_count(const sl_tensor *n, int64_t R, int64_t *cnt) {
    const sl_tensor *src = n->src[4];
    int64_t e = n->iparams[0], El = n->iparams[1];
    float v[1024];
    if (El > 0) {
        int64_t E = src->ne[0], P = E / El, tot = 0;
        if (E > 1024) return sl_fail(SL_ERR_UNSUPPORTED, "moe_expert_ffn: more than 1024 experts");
        SL_TRY(read_floats(n, src, 0, E, v));
        for (int64_t p = 0; p < P && tot >= 0; p++) {
            int64_t w = whole(v[p * El + e], R);
            tot = w < 0 ? -1 : tot + w;
        }
        *cnt = tot;
    } else {
        int64_t N = src->ne[0], E = src->ne[1];
        SL_TRY(read_floats(n, src, 3 * N * E + E + e, 1, v));
        *cnt = whole(v[0], R);
    }
    if (*cnt < 0 || *cnt > R)
        return sl_fail(SL_ERR_INVALID,
                       "moe_expert_ffn: expert %lld keeps %lld tokens, more than its %lld rows", (long long)e,
                       (long long)*cnt, (long long)R);
    return SL_OK;
}

static sl_status op_expert_ffn(sl_tensor *n) {
    int64_t R = n->ne[0], C = n->ne[1], I = n->src[1]->ne[0], cnt;
    SL_TRY(expert_count(n, R, &cnt));
    ocl_ref o, x;
    REF(n, &o);
    REF(n->src[0], &x);
    SL_TRY(fill(o, R * C, 1, (float)cnt)); /* aux: count, w1 x, w3 x */
    SL_TRY(fill(o, cnt * C, (R - cnt) * C, 0.0f));
    return ffn_forward(n, cnt, C, I, x, o, at(o, R * C + 1), at(o, R * C + 1 + R * I));
}

/* the count the forward stored in its aux */
static sl_status stored_count(const sl_tensor *n, const sl_tensor *f, int64_t *cnt) {
    float v;
    SL_TRY(read_floats(n, f, f->ne[0] * f->ne[1], 1, &v));
    *cnt = whole(v, f->ne[0]);
    return *cnt < 0 ? sl_fail(SL_ERR_INVALID, "%s: bad stored count %g", sl_op_name(n->op), (double)v)
                    : SL_OK;
}

static sl_status op_expert_ffn_back(sl_tensor *n) {
    const sl_tensor *f = n->src[0], *dy = n->src[1], *w2 = n->src[2];
    int64_t R = f->ne[0], C = f->ne[1], I = w2->ne[1], cnt;
    SL_TRY(stored_count(n, f, &cnt));
    ocl_ref o, rf, rd, rw2;
    REF(n, &o);
    REF(f, &rf);
    REF(dy, &rd);
    REF(w2, &rw2);
    return ffn_back(n, cnt, C, I, rd, dy->nb[0], rw2, at(rf, R * C + 1), at(rf, R * C + 1 + R * I), o,
                    at(o, R * I), at(o, 2 * R * I));
}

static sl_status op_expert_ffn_back_x(sl_tensor *n) {
    const sl_tensor *f = n->src[0], *b = n->src[1], *x = n->src[2], *w1 = n->src[3], *w3 = n->src[4];
    int64_t R = f->ne[0], C = f->ne[1], I = w1->ne[0], cnt;
    SL_TRY(stored_count(n, f, &cnt));
    ocl_ref o, rb, rx, r1, r3;
    REF(n, &o);
    REF(b, &rb);
    REF(x, &rx);
    REF(w1, &r1);
    REF(w3, &r3);
    ocl_ref dw1 = at(o, R * C);
    return ffn_back_x(n, cnt, C, I, rx, rb, at(rb, R * I), r1, r3, &dw1, &o);
}

/* ---------------- the packed experts under autocast ---------------- */

/* Note [Packed experts under autocast] (src/device/cpu/kernels/moe_packed.c) on the device: the same
 * roundings (k_moe_round, the rounding variants of k_moe_swiglu / k_moe_swiglu_back, k_moe_add_rounded); with
 * the bf16 GEMM (iparams[4], bf16 only) the operands go as bf16 rows into the register-blocked GEMM's bf16
 * path, the f32 weights rounded as they are packed and the weight gradients rounded in its writeback, as the
 * MATMUL nodes of the per-expert path compute them; without it (fp16, or bf16 with
 * SUANLI_FUSED_WEIGHT_CAST=0), f32 GEMMs on rounded copies. Temporaries: a carve of scratch2. */
typedef struct {
    int half;  /* 1 bf16, 2 f16 */
    int fused; /* the bf16 GEMM */
} moe_num;

/* an expert's received rows per source rank (the CPU's grad_blocks): n blocks, E / El <= 1024 */
typedef struct {
    int64_t n, rows[1024];
} row_blocks;

static moe_num num_of(const sl_tensor *f) {
    int h = f->iparams[3];
    moe_num m = {h == SL_BF16 ? 1 : h == SL_F16 ? 2 : 0, 0};
    m.fused = m.half == 1 && f->iparams[4];
    return m;
}

/* rows x cols of s (ld apart) rounded into packed rows at d: f32 (bf = 0) or bf16 bits (bf = 1; d.off counts
 * 2-byte elements) */
static sl_status round_rows(ocl_ref d, int bf, ocl_ref s, int64_t ld, int64_t rows, int64_t cols, int half) {
    ocl_call c = ocl_begin(OK_MOE_ROUND);
    ocl_ref_arg(&c, d);
    ocl_ref_arg(&c, d);
    ocl_ref_arg(&c, s);
    ocl_long(&c, ld);
    ocl_long(&c, cols);
    ocl_long(&c, rows * cols);
    ocl_int(&c, half);
    ocl_int(&c, bf);
    return ocl_run1(&c, (size_t)(rows * cols));
}
static sl_status round_in_place(ocl_ref d, int64_t n, int half) { return round_rows(d, 0, d, n, 1, n, half); }

/* a carve of scratch2: *at floats used so far; returns the region (f32 element offsets) */
static ocl_ref carve(cl_mem m, int64_t *used, int64_t floats) {
    ocl_ref r = {m, *used};
    *used += (floats + 15) / 16 * 16;
    return r;
}
static ocl_ref as_bf(ocl_ref r) {
    return (ocl_ref){r.mem, 2 * r.off};
} /* the same bytes as 2-byte elements */

static sl_status packed_fwd_half(const sl_tensor *n, moe_num nm, int64_t cnt, int64_t C, int64_t I, ocl_ref x,
                                 ocl_ref y, ocl_ref a1, ocl_ref a3) {
    ocl_ref w1, w3, w2;
    REF(n->src[1], &w1);
    REF(n->src[2], &w3);
    REF(n->src[3], &w2);
    cl_mem m;
    int64_t used = 0;
    SL_TRY(ocl_scratch2(sizeof(float) * (size_t)(2 * cnt * C + 3 * I * C + 2 * cnt * I + 96), &m));
    ocl_ref xr = carve(m, &used, cnt * C), h = carve(m, &used, cnt * I), hh = carve(m, &used, cnt * I);
    int M = (int)cnt, Ci = (int)C, Ii = (int)I;
    if (nm.fused) {
        SL_TRY(round_rows(as_bf(xr), 1, x, C, cnt, C, 1));
        SL_TRY(ocl_gemm(M, Ii, Ci, as_bf(xr), C, 0, w1, C, 1, a1, I, 0, SL_BF16, 1, 0));
        SL_TRY(ocl_gemm(M, Ii, Ci, as_bf(xr), C, 0, w3, C, 1, a3, I, 0, SL_BF16, 1, 0));
    } else {
        ocl_ref W1 = carve(m, &used, I * C), W3 = carve(m, &used, I * C);
        SL_TRY(round_rows(xr, 0, x, C, cnt, C, nm.half));
        SL_TRY(round_rows(W1, 0, w1, C, I, C, nm.half));
        SL_TRY(round_rows(W3, 0, w3, C, I, C, nm.half));
        SL_TRY(gemm32(M, Ii, Ci, xr, C, 0, W1, C, 1, a1, I, 0));
        SL_TRY(gemm32(M, Ii, Ci, xr, C, 0, W3, C, 1, a3, I, 0));
    }
    SL_TRY(round_in_place(a1, cnt * I, nm.half));
    SL_TRY(round_in_place(a3, cnt * I, nm.half));
    SL_TRY(swiglu_h(h, a1, a3, cnt * I, nm.half));
    if (nm.fused) {
        SL_TRY(round_rows(as_bf(hh), 1, h, I, cnt, I, 1));
        SL_TRY(ocl_gemm(M, Ci, Ii, as_bf(hh), I, 0, w2, I, 1, y, C, 0, SL_BF16, 1, 0));
    } else {
        ocl_ref W2 = carve(m, &used, I * C);
        SL_TRY(round_rows(W2, 0, w2, I, C, I, nm.half));
        SL_TRY(gemm32(M, Ci, Ii, h, I, 0, W2, I, 1, y, C, 0));
    }
    return round_in_place(y, cnt * C, nm.half);
}

/* dw (M x N) = the sum over the row blocks bk of R(A_b^T B_b) in f32, in block order (Note [EP weight
 * gradients per source rank], src/device/cpu/kernels/moe_packed.c: an EP rank rounds each source rank's
 * block, as the single process rounds each micro-batch); A rows lda apart, B rows ldb apart (bf16 elements
 * under the bf16 GEMM, whose writeback rounds), R the half rounding; t: M x N of scratch when bk has more
 * than one block. One block: the one GEMM as before. */
static sl_status dw_blocks(moe_num nm, int64_t M, int64_t N, ocl_ref A, int64_t lda, ocl_ref B, int64_t ldb,
                           const row_blocks *bk, ocl_ref t, ocl_ref dw) {
    int64_t r0 = 0;
    int done = 0;
    for (int64_t b = 0; b < bk->n; r0 += bk->rows[b++]) {
        if (!bk->rows[b]) continue;
        ocl_ref dst = done ? t : dw, a = at(A, r0 * lda), bb = at(B, r0 * ldb);
        int K = (int)bk->rows[b];
        if (nm.fused)
            SL_TRY(ocl_gemm((int)M, (int)N, K, a, lda, 1, bb, ldb, 0, dst, N, 0, SL_BF16, 0, 1));
        else
            SL_TRY(gemm32((int)M, (int)N, K, a, lda, 1, bb, ldb, 0, dst, N, 0));
        if (!done && !nm.fused) SL_TRY(round_in_place(dw, M * N, nm.half));
        if (done) { /* dw += R(t) (the bf16 GEMM's writeback rounded t already) */
            ocl_call c = ocl_begin(OK_MOE_ACC_ROUNDED);
            ocl_ref_arg(&c, dw);
            ocl_ref_arg(&c, t);
            ocl_long(&c, M * N);
            ocl_int(&c, nm.fused ? 0 : nm.half);
            SL_TRY(ocl_run1(&c, (size_t)(M * N)));
        }
        done = 1;
    }
    return done ? SL_OK : fill(dw, 0, M * N, 0.0f);
}

static sl_status packed_back_half(moe_num nm, const row_blocks *bk, int64_t cnt, int64_t C, int64_t I,
                                  ocl_ref dy, int64_t ds, ocl_ref w2, ocl_ref a1, ocl_ref a3, ocl_ref d1,
                                  ocl_ref d3, ocl_ref dw2) {
    cl_mem m;
    int64_t used = 0;
    SL_TRY(ocl_scratch2(sizeof(float) * (size_t)(cnt * C + cnt * I + 2 * I * C + 80), &m));
    ocl_ref g = carve(m, &used, cnt * C), hh = carve(m, &used, cnt * I), t = carve(m, &used, I * C);
    int M = (int)cnt, Ci = (int)C, Ii = (int)I;
    SL_TRY(swiglu_h(d1, a1, a3, cnt * I, nm.half)); /* h in d1's rows, then dh */
    if (nm.fused) {
        SL_TRY(round_rows(as_bf(g), 1, dy, ds, cnt, C, 1));
        SL_TRY(round_rows(as_bf(hh), 1, d1, I, cnt, I, 1));
        SL_TRY(dw_blocks(nm, C, I, as_bf(g), C, as_bf(hh), I, bk, t, dw2));             /* bf16(dy^T h) */
        SL_TRY(ocl_gemm(M, Ii, Ci, as_bf(g), C, 0, w2, I, 0, d1, I, 0, SL_BF16, 1, 0)); /* dh = dy w2 */
    } else {
        ocl_ref W2 = carve(m, &used, I * C);
        SL_TRY(round_rows(g, 0, dy, ds, cnt, C, nm.half));
        SL_TRY(round_rows(W2, 0, w2, I, C, I, nm.half));
        SL_TRY(dw_blocks(nm, C, I, g, C, d1, I, bk, t, dw2)); /* R(dy^T h) */
        SL_TRY(gemm32(M, Ii, Ci, g, C, 0, W2, I, 0, d1, I, 0));
    }
    return swiglu_back_h(d1, d3, a1, a3, cnt * I, nm.half);
}

static sl_status packed_back_w_half(moe_num nm, const row_blocks *bk, int64_t cnt, int64_t C, int64_t I,
                                    ocl_ref x, ocl_ref d1, ocl_ref d3, ocl_ref dw1) {
    cl_mem m;
    int64_t used = 0;
    SL_TRY(ocl_scratch2(sizeof(float) * (size_t)(cnt * C + 2 * cnt * I + I * C + 80), &m));
    ocl_ref xr = carve(m, &used, cnt * C), h1 = carve(m, &used, cnt * I), h3 = carve(m, &used, cnt * I),
            t = carve(m, &used, I * C);
    ocl_ref dw3 = at(dw1, I * C);
    if (nm.fused) {
        SL_TRY(round_rows(as_bf(xr), 1, x, C, cnt, C, 1));
        SL_TRY(round_rows(as_bf(h1), 1, d1, I, cnt, I, 1));
        SL_TRY(round_rows(as_bf(h3), 1, d3, I, cnt, I, 1));
        SL_TRY(dw_blocks(nm, I, C, as_bf(h1), I, as_bf(xr), C, bk, t, dw1));
        return dw_blocks(nm, I, C, as_bf(h3), I, as_bf(xr), C, bk, t, dw3);
    }
    SL_TRY(round_rows(xr, 0, x, C, cnt, C, nm.half));
    SL_TRY(dw_blocks(nm, I, C, d1, I, xr, C, bk, t, dw1));
    return dw_blocks(nm, I, C, d3, I, xr, C, bk, t, dw3);
}

static sl_status packed_dx_half(moe_num nm, int64_t cnt, int64_t C, int64_t I, ocl_ref d1, ocl_ref d3,
                                ocl_ref w1, ocl_ref w3, ocl_ref dx) {
    cl_mem m;
    int64_t used = 0;
    SL_TRY(ocl_scratch2(sizeof(float) * (size_t)(cnt * C + 2 * cnt * I + 2 * I * C + 96), &m));
    ocl_ref t = carve(m, &used, cnt * C);
    int M = (int)cnt, Ci = (int)C, Ii = (int)I;
    if (nm.fused) {
        ocl_ref h1 = carve(m, &used, cnt * I), h3 = carve(m, &used, cnt * I);
        SL_TRY(round_rows(as_bf(h1), 1, d1, I, cnt, I, 1));
        SL_TRY(round_rows(as_bf(h3), 1, d3, I, cnt, I, 1));
        SL_TRY(ocl_gemm(M, Ci, Ii, as_bf(h1), I, 0, w1, C, 0, dx, C, 0, SL_BF16, 1, 0));
        SL_TRY(ocl_gemm(M, Ci, Ii, as_bf(h3), I, 0, w3, C, 0, t, C, 0, SL_BF16, 1, 0));
    } else {
        ocl_ref W1 = carve(m, &used, I * C), W3 = carve(m, &used, I * C);
        SL_TRY(round_rows(W1, 0, w1, C, I, C, nm.half));
        SL_TRY(round_rows(W3, 0, w3, C, I, C, nm.half));
        SL_TRY(gemm32(M, Ci, Ii, d1, I, 0, W1, C, 0, dx, C, 0));
        SL_TRY(gemm32(M, Ci, Ii, d3, I, 0, W3, C, 0, t, C, 0));
    }
    ocl_call c = ocl_begin(OK_MOE_ADD_ROUNDED);
    ocl_ref_arg(&c, dx);
    ocl_ref_arg(&c, t);
    ocl_long(&c, cnt * C);
    ocl_int(&c, nm.half);
    return ocl_run1(&c, (size_t)(cnt * C));
}

/* the rows [*off, *off + *cnt) of chain node f's expert in its packed input (the CPU's packed_rows); when bk
 * is set, their blocks per source rank (the CPU's grad_blocks: one block without EP), from the same read */
static sl_status packed_rows(const sl_tensor *n, const sl_tensor *f, int64_t *off, int64_t *cnt,
                             row_blocks *bk) {
    const sl_tensor *xp = f->src[0], *c = xp->src[1];
    int64_t S = xp->ne[0], e = f->iparams[0], El = f->iparams[1], o = 0, k = 0;
    float v[1024];
    if (El == 0) {
        int64_t N = c->ne[0], E = c->ne[1];
        if (e >= E || e >= 1024)
            return sl_fail(SL_ERR_INVALID, "%s: expert %lld", sl_op_name(n->op), (long long)e);
        SL_TRY(read_floats(n, c, 3 * N * E + E, e + 1, v)); /* the route's kept counts */
        for (int64_t j = 0; j <= e; j++) {
            int64_t w = whole(v[j], N);
            if (w < 0)
                return sl_fail(SL_ERR_INVALID, "%s: expert %lld has a bad kept count", sl_op_name(n->op),
                               (long long)j);
            if (j < e)
                o += w;
            else
                k = w;
        }
    } else {
        int64_t E = c->ne[0], P = E / El;
        if (E > 1024) return sl_fail(SL_ERR_UNSUPPORTED, "%s: more than 1024 experts", sl_op_name(n->op));
        SL_TRY(read_floats(n, c, 0, E, v));
        for (int64_t p = 0; p < P; p++)
            for (int64_t j = 0; j <= e; j++) {
                int64_t w = whole(v[p * El + j], S);
                if (w < 0)
                    return sl_fail(SL_ERR_INVALID, "%s: rank %lld sent a bad count for local expert %lld",
                                   sl_op_name(n->op), (long long)p, (long long)j);
                if (j < e)
                    o += w;
                else
                    k += w;
                if (bk && j == e) bk->rows[p] = w;
            }
        if (bk) bk->n = P;
    }
    if (o + k > S)
        return sl_fail(SL_ERR_INVALID, "%s: expert %lld's rows [%lld, %lld) exceed the %lld packed rows",
                       sl_op_name(n->op), (long long)e, (long long)o, (long long)(o + k), (long long)S);
    *off = o;
    *cnt = k;
    if (bk && El == 0) bk->n = 1, bk->rows[0] = k;
    return SL_OK;
}

static sl_status op_packed_ffn(sl_tensor *n) {
    const sl_tensor *xp = n->src[0];
    int64_t S = n->ne[0], C = n->ne[1], I = n->src[1]->ne[0], off, cnt;
    SL_TRY(packed_rows(n, n, &off, &cnt, NULL));
    ocl_ref o, x; /* in place: the chain's first node's storage, its aux after its (S, C) rows */
    REF(n, &o);
    REF(xp, &x);
    ocl_ref a1 = at(o, S * C + off * I);
    moe_num nm = num_of(n);
    if (nm.half && cnt > 0)
        return packed_fwd_half(n, nm, cnt, C, I, at(x, off * C), at(o, off * C), a1, at(a1, S * I));
    return ffn_forward(n, cnt, C, I, at(x, off * C), at(o, off * C), a1, at(a1, S * I));
}

static sl_status op_packed_ffn_back(sl_tensor *n) {
    const sl_tensor *f = n->src[0], *dy = n->src[1], *w2 = n->src[2];
    int64_t S = f->ne[0], C = f->ne[1], I = w2->ne[1], Rb = n->iparams[2], off, cnt;
    row_blocks bk;
    SL_TRY(packed_rows(n, f, &off, &cnt, &bk));
    if (cnt > Rb)
        return sl_fail(SL_ERR_INVALID, "moe_packed_ffn_back: expert %d holds %lld rows, more than %lld",
                       f->iparams[0], (long long)cnt, (long long)Rb);
    ocl_ref o, rf, rd, rw2;
    REF(n, &o);
    REF(f, &rf);
    REF(dy, &rd);
    REF(w2, &rw2);
    ocl_ref a1 = at(rf, S * C + off * I), d1 = at(o, C * I);
    moe_num nm = num_of(f);
    if (nm.half && cnt > 0)
        return packed_back_half(nm, &bk, cnt, C, I, at(rd, off * dy->nb[0]), dy->nb[0], rw2, a1,
                                at(a1, S * I), d1, at(d1, Rb * I), o);
    return ffn_back(n, cnt, C, I, at(rd, off * dy->nb[0]), dy->nb[0], rw2, a1, at(a1, S * I), d1,
                    at(d1, Rb * I), o);
}

static sl_status op_packed_ffn_back_w(sl_tensor *n) {
    const sl_tensor *b = n->src[0], *xp = n->src[1], *f = b->src[0];
    int64_t C = f->ne[1], I = b->ne[1], Rb = b->iparams[2], off, cnt;
    row_blocks bk;
    SL_TRY(packed_rows(n, f, &off, &cnt, &bk));
    ocl_ref o, rb, rx;
    REF(n, &o);
    REF(b, &rb);
    REF(xp, &rx);
    ocl_ref d1 = at(rb, C * I);
    moe_num nm = num_of(f);
    if (nm.half && cnt > 0)
        return packed_back_w_half(nm, &bk, cnt, C, I, at(rx, off * C), d1, at(d1, Rb * I), o);
    return ffn_back_x(n, cnt, C, I, at(rx, off * C), d1, at(d1, Rb * I), rx, rx, &o, NULL);
}

static sl_status op_packed_ffn_dx(sl_tensor *n) {
    const sl_tensor *b = n->src[0], *w1 = n->src[1], *w3 = n->src[2], *f = b->src[0];
    int64_t C = f->ne[1], I = w1->ne[0], Rb = b->iparams[2], off, cnt;
    SL_TRY(packed_rows(n, f, &off, &cnt, NULL));
    ocl_ref o, rb, r1, r3;
    REF(n, &o);
    REF(b, &rb);
    REF(w1, &r1);
    REF(w3, &r3);
    ocl_ref d1 = at(rb, C * I), dx = at(o, off * C);
    moe_num nm = num_of(f);
    if (nm.half && cnt > 0) return packed_dx_half(nm, cnt, C, I, d1, at(d1, Rb * I), r1, r3, dx);
    return ffn_back_x(n, cnt, C, I, o, d1, at(d1, Rb * I), r1, r3, NULL, &dx);
}

/* ---------------- the bf16 expert of inference ---------------- */

/* Note [OpenCL bf16 experts]
 * MOE_EXPERT with the bf16 numerics (iparams[1]: a bf16 inference model's Mixtral experts, Note [Sparse
 * experts] in src/device/cpu/kernels/llama_ops.c) as sl_k_moe_expert computes it, on the expert's routed rows
 * only: k_moe_gate_map scans the gate column in token order (one work-item) and the row count is read back (4
 * bytes, blocking, as the routed ops read theirs: Note [OpenCL MoE kernels]); the routed rows of h go into
 * bf16 rows (k_moe_gate_rows_bf: the CPU's conversion of x); w1 x and w3 x are the register GEMM's bf16 path
 * with the product rounded in its writeback (Note [OpenCL bf16 GEMM]; bf16 weights widened exactly, f32
 * weights rounded as they are packed: Note [OpenCL fused weight casts], the CPU's wb copy); the SwiGLU rounds
 * R(R(silu(a)) * b) (k_moe_swiglu, hm 1, exp as glibc's expf where the device has fp64); its bf16 rows go
 * through the same GEMM with w2, and k_moe_gate_scatter writes o * gate on the routed rows (unrounded: Note
 * [bf16 Mixtral experts] in src/nn/llama.c), zero on the others. Every rounding point is the CPU's; only the
 * order of each GEMM's fp32 sums may differ (the register GEMM sums k in order with FMAs; the CPU's bf16 GEMM
 * per its kernel: AMX, vdpbf16ps pairs or widened FMAs), which moves a value by one bf16 ulp where it sits at
 * a rounding boundary. The tiled GEMM (GPU-type devices) has no bf16 path: refused there. Temporaries: a
 * carve of scratch2 (the GEMM uses scratch). */
static int bf16_expert_ok(const sl_tensor *n) {
    const sl_tensor *h = n->src[0], *gate = n->src[1];
    sl_dtype wt = n->src[2]->dtype;
    if (g_ocl.gemm_kind != OCL_GEMM_REG || n->dtype != SL_F32 || !sl_is_contiguous(n) || !f32c(h) ||
        h->ndim != 2 || !f32_rows(gate) || (wt != SL_BF16 && wt != SL_F32))
        return 0;
    for (int i = 2; i < 5; i++)
        if (n->src[i]->dtype != wt || !sl_is_contiguous(n->src[i])) return 0;
    return 1;
}

/* the gate map of expert e (k_moe_gate_map) into map */
static sl_status gate_map(ocl_ref map, ocl_ref g, int64_t gs, int64_t N, int64_t e) {
    ocl_call c = ocl_begin(OK_MOE_GATE_MAP);
    ocl_ref_arg(&c, map);
    ocl_ref_arg(&c, g);
    ocl_long(&c, gs);
    ocl_long(&c, N);
    ocl_long(&c, e);
    return ocl_run1(&c, 1);
}

static sl_status op_moe_expert_bf16(sl_tensor *n) {
    const sl_tensor *h = n->src[0], *gate = n->src[1], *w1 = n->src[2];
    int64_t N = h->ne[0], C = h->ne[1], I = w1->ne[0], gs = gate->nb[0], e = n->iparams[0];
    int wf32 = w1->dtype == SL_F32; /* f32 weights under bf16 numerics: rounded as they are packed */
    if (N >= INT32_MAX || C > INT32_MAX || I > INT32_MAX)
        return sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: moe_expert '%s' too large", n->name);
    ocl_ref y, rh, rg, r1, r3, r2;
    REF(n, &y);
    REF(h, &rh);
    REF(gate, &rg);
    REF(w1, &r1);
    REF(n->src[3], &r3);
    REF(n->src[4], &r2);
    cl_mem m;
    int64_t used = 0, M = 0;
    SL_TRY(ocl_scratch2(sizeof(float) * (size_t)(2 * N + 1 + 16), &m));
    ocl_ref map = carve(m, &used, 2 * N + 1);
    SL_TRY(gate_map(map, rg, gs, N, e));
    cl_int cnt = 0, err = clEnqueueReadBuffer(g_ocl.queue, m, CL_TRUE, sizeof(float) * (size_t)(map.off + N),
                                              sizeof cnt, &cnt, 0, NULL, NULL);
    if (err != CL_SUCCESS) return ocl_fail(err, "reading the expert's row count");
    M = cnt;
    if (!M) return fill(y, 0, N * C, 0.0f);
    /* the rows' temporaries after the map: bf16 x, w1 x, w3 x (then the SwiGLU in place), bf16 of it, w2 of
     * it */
    size_t need = sizeof(float) * (size_t)(used + (M * C + 1) / 2 + 2 * M * I + (M * I + 1) / 2 + M * C + 80);
    if (need > g_ocl.scratch2_size) { /* scratch2 grows into a new buffer: the map again there */
        SL_TRY(ocl_scratch2(need, &m));
        map.mem = m;
        SL_TRY(gate_map(map, rg, gs, N, e));
    }
    ocl_ref xb = as_bf(carve(m, &used, (M * C + 1) / 2)), u = carve(m, &used, M * I),
            g = carve(m, &used, M * I), hb = as_bf(carve(m, &used, (M * I + 1) / 2)),
            o = carve(m, &used, M * C);
    ocl_call c = ocl_begin(OK_MOE_GATE_ROWS_BF);
    ocl_ref_arg(&c, xb);
    ocl_ref_arg(&c, rh);
    ocl_ref_arg(&c, map);
    ocl_long(&c, C);
    ocl_long(&c, M * C);
    SL_TRY(ocl_run1(&c, (size_t)(M * C)));
    int Mi = (int)M, Ci = (int)C, Ii = (int)I;
    SL_TRY(ocl_gemm(Mi, Ii, Ci, xb, C, 0, r1, C, 1, u, I, 0, SL_BF16, wf32, 1)); /* R(x w1^T) */
    SL_TRY(ocl_gemm(Mi, Ii, Ci, xb, C, 0, r3, C, 1, g, I, 0, SL_BF16, wf32, 1)); /* R(x w3^T) */
    SL_TRY(swiglu_h(u, u, g, M * I, 1));                                         /* R(R(silu(u)) g) */
    SL_TRY(round_rows(hb, 1, u, I, M, I, 1));                                    /* its bits (exact) */
    SL_TRY(ocl_gemm(Mi, Ci, Ii, hb, I, 0, r2, I, 1, o, C, 0, SL_BF16, wf32, 1)); /* R(h w2^T) */
    ocl_call d = ocl_begin(OK_MOE_GATE_SCATTER);
    ocl_ref_arg(&d, y);
    ocl_ref_arg(&d, o);
    ocl_ref_arg(&d, map);
    ocl_long(&d, N);
    ocl_ref_arg(&d, rg);
    ocl_long(&d, gs);
    ocl_long(&d, e);
    ocl_long(&d, C);
    return ocl_run1(&d, (size_t)(N * C));
}

sl_status ocl_op_moe(sl_tensor *n) {
    switch (n->op) {
    case SL_OP_MOE_ROUTE:
        return op_route(n);
    case SL_OP_MOE_ROUTE_BACK:
        return op_route_back(n);
    case SL_OP_MOE_ROUTER_LOSS:
        return op_router_loss(n);
    case SL_OP_MOE_ROUTER_LOSS_BACK:
        return op_router_loss_back(n);
    case SL_OP_MOE_GATHER:
        return op_gather(n);
    case SL_OP_MOE_COMBINE:
        return op_combine(n);
    case SL_OP_MOE_COMBINE_BACK_GATE:
        return op_combine_back_gate(n);
    case SL_OP_MOE_EP_COUNTS:
        return op_ep_counts(n);
    case SL_OP_MOE_EP_PACK:
        return op_pack(n, 1);
    case SL_OP_MOE_EP_UNPACK:
        return op_pack(n, 0);
    case SL_OP_MOE_EP_UNPACK_BACK_GATE:
        return op_unpack_back_gate(n);
    case SL_OP_MOE_EP_GATHER:
    case SL_OP_MOE_EP_SCATTER:
    case SL_OP_MOE_EP_REGROUP:
        return op_ep_rows(n);
    case SL_OP_MOE_EXPERT_FFN:
        return op_expert_ffn(n);
    case SL_OP_MOE_EXPERT_FFN_BACK:
        return op_expert_ffn_back(n);
    case SL_OP_MOE_EXPERT_FFN_BACK_X:
        return op_expert_ffn_back_x(n);
    case SL_OP_MOE_PACKED_FFN:
        return op_packed_ffn(n);
    case SL_OP_MOE_PACKED_FFN_BACK:
        return op_packed_ffn_back(n);
    case SL_OP_MOE_PACKED_FFN_BACK_W:
        return op_packed_ffn_back_w(n);
    case SL_OP_MOE_PACKED_FFN_DX:
        return op_packed_ffn_dx(n);
    case SL_OP_MOE_EXPERT: /* the bf16 numerics (the f32 expert is ocl_op_nn's) */
        return op_moe_expert_bf16(n);
    default:
        return sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: op %s is not a MoE op", sl_op_name(n->op));
    }
}
