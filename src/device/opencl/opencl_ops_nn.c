/* The OpenCL backend's network ops: norms, softmax, attention (training and KV-cache), embedding,
 * cross-entropy, RoPE, the top-k gate and the sparse MoE expert. Each function resolves the node's tensors
 * to (cl_mem, offset) and launches the kernels of kernels/norm.cl, attention.cl, loss.cl, llama.cl. */
#include <math.h>
#include <string.h>

#include "device/accel_support.h"
#include "device/opencl/opencl_internal.h"

#define REF(t, r) SL_TRY(ocl_ref_of(n, (t), (r)))
#define AUX(t, r) SL_TRY(ocl_aux_of(n, (t), (r)))

static int64_t rows_of(const sl_tensor *t) {
    return t->ne[t->ndim - 1] ? sl_nelements(t) / t->ne[t->ndim - 1] : 0;
}
/* row r of a tensor whose last dim is contiguous and whose leading dims fold uniformly (as on the CPU) */
static int64_t row_stride(const sl_tensor *t) { return t->ndim >= 2 ? t->nb[t->ndim - 2] : t->ne[0]; }

/* ---------------- norms and softmax ---------------- */

/* Launch a row kernel (Note [OpenCL row reductions], kernels/norm.cl): one work-group of L work-items per
 * row, L a power of two up to g_ocl.row_wg (16 on CPU devices, 256 on GPUs), about C / 2 at most and
 * within the device's limit, and L floats of local memory as the last argument. */
static sl_status run_rows(ocl_call *c, int64_t R, int64_t C) {
    size_t L = 1;
    while (L < (size_t)g_ocl.row_wg && (int64_t)(2 * L) <= (C + 1) / 2 + 1 && 2 * L <= g_ocl.max_wg) L *= 2;
    ocl_arg(c, sizeof(float) * L, NULL);
    size_t global = (size_t)R * L;
    return ocl_run(c, 1, &global, &L);
}

static sl_status op_layernorm(sl_tensor *n) {
    const sl_tensor *x = n->src[0];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x);
    ocl_ref y, st, rx, w, b;
    REF(n, &y);
    AUX(n, &st);
    REF(x, &rx);
    REF(n->src[1], &w);
    REF(n->src[2], &b);
    ocl_call c = ocl_begin(OK_LAYERNORM);
    ocl_ref_arg(&c, y);
    ocl_ref_arg(&c, st);
    ocl_ref_arg(&c, rx);
    ocl_long(&c, row_stride(x));
    ocl_ref_arg(&c, w);
    ocl_ref_arg(&c, b);
    ocl_long(&c, R);
    ocl_long(&c, C);
    ocl_float(&c, n->fparams[0]);
    return run_rows(&c, R, C);
}

static sl_status op_layernorm_back(sl_tensor *n) {
    int wb = n->op == SL_OP_LAYERNORM_BACK_WB;
    const sl_tensor *f = n->src[0], *x = n->src[1], *g = n->src[wb ? 2 : 3];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x);
    ocl_ref d, st, rx, rg, w;
    REF(n, &d);
    AUX(f, &st);
    REF(x, &rx);
    REF(g, &rg);
    ocl_call c = ocl_begin(wb ? OK_LN_BACK_WB : OK_LN_BACK_X);
    ocl_ref_arg(&c, d);
    ocl_ref_arg(&c, st);
    ocl_ref_arg(&c, rx);
    ocl_long(&c, row_stride(x));
    if (!wb) {
        REF(n->src[2], &w);
        ocl_ref_arg(&c, w);
    }
    ocl_ref_arg(&c, rg);
    ocl_long(&c, row_stride(g));
    ocl_long(&c, R);
    ocl_long(&c, C);
    return wb ? ocl_run1(&c, (size_t)C) : run_rows(&c, R, C);
}

static sl_status op_rmsnorm(sl_tensor *n) {
    const sl_tensor *x = n->src[0], *w = n->src[1];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x);
    ocl_ref y, st, rx, rw;
    REF(n, &y);
    AUX(n, &st);
    REF(x, &rx);
    if (w)
        REF(w, &rw);
    else
        rw = rx;
    ocl_call c = ocl_begin(OK_RMSNORM);
    ocl_ref_arg(&c, y);
    ocl_ref_arg(&c, st);
    ocl_ref_arg(&c, rx);
    ocl_long(&c, row_stride(x));
    ocl_ref_arg(&c, rw);
    ocl_int(&c, w != NULL);
    ocl_long(&c, C);
    ocl_float(&c, n->fparams[0]);
    return run_rows(&c, R, C);
}

static sl_status op_rmsnorm_back(sl_tensor *n) {
    int bw = n->op == SL_OP_RMSNORM_BACK_W;
    const sl_tensor *f = n->src[0], *x = n->src[1], *w = bw ? NULL : n->src[2], *g = n->src[bw ? 2 : 3];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x);
    ocl_ref d, st, rx, rg, rw;
    REF(n, &d);
    AUX(f, &st);
    REF(x, &rx);
    REF(g, &rg);
    ocl_call c = ocl_begin(bw ? OK_RMS_BACK_W : OK_RMS_BACK_X);
    ocl_ref_arg(&c, d);
    ocl_ref_arg(&c, st);
    ocl_ref_arg(&c, rx);
    ocl_long(&c, row_stride(x));
    if (!bw) {
        if (w)
            REF(w, &rw);
        else
            rw = rx;
        ocl_ref_arg(&c, rw);
        ocl_int(&c, w != NULL);
    }
    ocl_ref_arg(&c, rg);
    ocl_long(&c, row_stride(g));
    ocl_long(&c, bw ? R : C);
    return bw ? ocl_run1(&c, (size_t)C) : run_rows(&c, R, C);
}

static sl_status op_softmax(sl_tensor *n) {
    const sl_tensor *x = n->src[0];
    ocl_ref y, rx;
    REF(n, &y);
    REF(x, &rx);
    ocl_call c = ocl_begin(OK_SOFTMAX);
    ocl_ref_arg(&c, y);
    ocl_ref_arg(&c, rx);
    ocl_long(&c, row_stride(x));
    ocl_long(&c, x->ne[x->ndim - 1]);
    return run_rows(&c, rows_of(x), x->ne[x->ndim - 1]);
}

/* SOFTMAX_BACK and TOPK_GATE_BACK: dx = y * (dy - sum(y * dy)) per row */
static sl_status op_softmax_back(sl_tensor *n) {
    const sl_tensor *y = n->src[0], *g = n->src[1];
    ocl_ref d, ry, rg;
    REF(n, &d);
    REF(y, &ry);
    REF(g, &rg);
    ocl_call c = ocl_begin(OK_SOFTMAX_BACK);
    ocl_ref_arg(&c, d);
    ocl_ref_arg(&c, ry);
    ocl_ref_arg(&c, rg);
    ocl_long(&c, row_stride(g));
    ocl_long(&c, y->ne[y->ndim - 1]);
    return run_rows(&c, rows_of(y), y->ne[y->ndim - 1]);
}

/* ---------------- attention ---------------- */

static cl_long4 strides4(const sl_tensor *t) {
    cl_long4 s = {{0, 0, 0, 0}};
    for (int d = 0; d < 3 && d < t->ndim; d++) s.s[d] = t->nb[d];
    return s;
}

static void qkv_args(ocl_call *c, ocl_ref q, const sl_tensor *tq, ocl_ref k, const sl_tensor *tk, ocl_ref v,
                     const sl_tensor *tv) {
    cl_long4 qs = strides4(tq), ks = strides4(tk), vs = strides4(tv);
    ocl_ref_arg(c, q);
    ocl_arg(c, sizeof qs, &qs);
    ocl_ref_arg(c, k);
    ocl_arg(c, sizeof ks, &ks);
    ocl_ref_arg(c, v);
    ocl_arg(c, sizeof vs, &vs);
}

/* the dropout arguments of the attention kernels: on, seed, hi, thr, keep, heads, head0 (Note [OpenCL
 * dropout] in kernels/0_common.cl) */
static void att_dropout(ocl_call *c, const sl_tensor *fwd, int64_t NH) {
    sl_accel_dropout d = sl_accel_dropout_of(fwd);
    cl_ulong seed = d.seed, hi = d.hi;
    cl_uint thr = d.thr;
    ocl_int(c, d.on);
    ocl_arg(c, sizeof seed, &seed);
    ocl_arg(c, sizeof hi, &hi);
    ocl_arg(c, sizeof thr, &thr);
    ocl_float(c, d.keep);
    ocl_long(c, d.on ? d.heads : NH);
    ocl_long(c, d.head0);
}

/* Note [OpenCL flash attention] (kernels/attention.cl): blocks of OCL_ATT_B rows, one work-group each; the
 * half kernels (fwd->iparams[2] != 0) take the mode and a scratch buffer instead of local tiles */
static void att_tail(ocl_call *c, int64_t T, int64_t NH, int64_t NKV, int64_t hs, int64_t win,
                     const sl_tensor *fwd, int n_tiles, int n_rows) {
    ocl_long(c, T);
    ocl_long(c, NH);
    ocl_long(c, NKV);
    ocl_long(c, hs);
    ocl_long(c, win);
    ocl_float(c, 1.0f / sqrtf((float)hs));
    if (fwd->iparams[2]) ocl_int(c, fwd->iparams[2]); /* the half kernels: Note [OpenCL half attention] */
    att_dropout(c, fwd, NH);
    for (int i = 0; i < n_tiles; i++) ocl_arg(c, sizeof(float) * OCL_ATT_B * (size_t)hs, NULL);
    for (int i = 0; i < n_rows; i++) ocl_arg(c, sizeof(float) * OCL_ATT_B, NULL);
}

static sl_status att_run(ocl_call *c, int64_t T, int64_t heads, int64_t B) {
    size_t global[3] = {(size_t)((T + OCL_ATT_B - 1) / OCL_ATT_B * OCL_ATT_B), (size_t)heads, (size_t)B};
    size_t local[3] = {OCL_ATT_B, 1, 1};
    return ocl_run(c, 3, global, local);
}

/* Note [OpenCL half attention]: KT / VT (k_attention_half_kt) in scratch S at kto, rows of Tp floats. The
 * scratch before them is the forward's P rows (B NH T x 2 T floats), and the backward's ds / P-v rows are the
 * same size, so the backward needs no more scratch than the forward (the old per-(b, kv head) backward took
 * B NKV (3 T + 2 T hs) floats) */
static int64_t half_tp(int64_t T) { return (T + 15) / 16 * 16 + 16; } /* 16-key vectors from any j < T */
static sl_status half_kt(ocl_ref rk, const sl_tensor *k, ocl_ref rv, const sl_tensor *v, int64_t B, int64_t T,
                         int64_t NKV, int64_t hs, int hm, cl_mem S, int64_t kto) {
    cl_long4 ks = strides4(k), vs = strides4(v);
    int64_t Tp = half_tp(T);
    ocl_call c = ocl_begin(OK_ATTN_HALF_KT);
    ocl_ref_arg(&c, rk);
    ocl_arg(&c, sizeof ks, &ks);
    ocl_ref_arg(&c, rv);
    ocl_arg(&c, sizeof vs, &vs);
    ocl_long(&c, T);
    ocl_long(&c, NKV);
    ocl_long(&c, hs);
    ocl_long(&c, Tp);
    ocl_int(&c, hm);
    ocl_ref_arg(&c, (ocl_ref){S, kto});
    return ocl_run1(&c, (size_t)(B * NKV * hs * Tp));
}

static sl_status op_attention(sl_tensor *n) {
    const sl_tensor *q = n->src[0], *k = n->src[1], *v = n->src[2];
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
    ocl_ref o, lse, rq, rk, rv;
    REF(n, &o);
    AUX(n, &lse);
    REF(q, &rq);
    REF(k, &rk);
    REF(v, &rv);
    if (n->iparams[2]) { /* Note [OpenCL half attention]: K / V transposed, then a work-item per query row */
        cl_mem P;
        size_t rows = (size_t)(B * NH * T) * (size_t)(2 * T),
               kt = (size_t)(B * NKV * 2 * hs) * (size_t)half_tp(T);
        SL_TRY(ocl_scratch(sizeof(float) * (rows + kt) + 4, &P));
        SL_TRY(half_kt(rk, k, rv, v, B, T, NKV, hs, (int)n->iparams[2], P, (int64_t)rows));
        ocl_call c = ocl_begin(OK_ATTN_HALF);
        ocl_ref_arg(&c, o);
        ocl_ref_arg(&c, lse);
        qkv_args(&c, rq, q, rk, k, rv, v);
        att_tail(&c, T, NH, NKV, hs, n->iparams[1], n, 0, 0);
        ocl_mem(&c, P);
        ocl_long(&c, half_tp(T));
        ocl_long(&c, (int64_t)rows);
        return ocl_run1(&c, (size_t)(B * NH * T));
    }
    ocl_call c = ocl_begin(OK_ATTN_FWD);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, lse);
    qkv_args(&c, rq, q, rk, k, rv, v);
    att_tail(&c, T, NH, NKV, hs, n->iparams[1], n, 4, 0);
    return att_run(&c, T, NH, B);
}

static sl_status op_attention_back(sl_tensor *n) {
    const sl_tensor *f = n->src[0], *q = n->src[1], *k = n->src[2], *v = n->src[3], *g = n->src[4];
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
    ocl_ref o, lse, rq, rk, rv, rg;
    REF(n, &o);
    AUX(f, &lse);
    REF(q, &rq);
    REF(k, &rk);
    REF(v, &rv);
    REF(g, &rg);
    cl_long4 gs = {{g->nb[0], g->nb[1], 0, 0}};
    if (f->iparams[2]) { /* Note [OpenCL half attention]: K / V transposed, query rows, key rows */
        cl_mem S;
        int64_t Tp = half_tp(T);
        size_t rows = (size_t)(B * NH * T) * (size_t)(2 * T), kt = (size_t)(B * NKV * 2 * hs) * (size_t)Tp;
        SL_TRY(ocl_scratch(sizeof(float) * (rows + kt) + 4, &S));
        cl_long4 qs = strides4(q), ks = strides4(k);
        SL_TRY(half_kt(rk, k, rv, v, B, T, NKV, hs, (int)f->iparams[2], S, (int64_t)rows));
        ocl_call c = ocl_begin(OK_ATTN_HALF_BACK_Q);
        ocl_ref_arg(&c, o);
        ocl_ref_arg(&c, lse);
        ocl_ref_arg(&c, rq);
        ocl_arg(&c, sizeof qs, &qs);
        ocl_ref_arg(&c, rg);
        ocl_arg(&c, sizeof gs, &gs);
        att_tail(&c, T, NH, NKV, hs, n->iparams[1], f, 0, 0);
        ocl_mem(&c, S);
        ocl_long(&c, Tp);
        ocl_long(&c, (int64_t)rows);
        ocl_ref_arg(&c, rk);
        ocl_arg(&c, sizeof ks, &ks);
        SL_TRY(ocl_run1(&c, (size_t)(B * NH * T)));
        ocl_call c2 = ocl_begin(OK_ATTN_HALF_BACK_KV);
        ocl_ref_arg(&c2, o);
        ocl_ref_arg(&c2, rq);
        ocl_arg(&c2, sizeof qs, &qs);
        ocl_ref_arg(&c2, rg);
        ocl_arg(&c2, sizeof gs, &gs);
        ocl_long(&c2, T);
        ocl_long(&c2, NH);
        ocl_long(&c2, NKV);
        ocl_long(&c2, hs);
        ocl_long(&c2, n->iparams[1]);
        ocl_int(&c2, f->iparams[2]);
        ocl_mem(&c2, S);
        return ocl_run1(&c2, (size_t)(B * NKV * T));
    }
    cl_mem dsum;
    SL_TRY(ocl_scratch(sizeof(float) * (size_t)(B * NH * T > 0 ? B * NH * T : 1), &dsum));
    for (int pass = 0; pass < 2; pass++) {
        ocl_call c = ocl_begin(pass ? OK_ATTN_BWD_DKV : OK_ATTN_BWD_DQ);
        ocl_ref_arg(&c, o);
        ocl_mem(&c, dsum);
        ocl_ref_arg(&c, lse);
        qkv_args(&c, rq, q, rk, k, rv, v);
        ocl_ref_arg(&c, rg);
        ocl_arg(&c, sizeof gs, &gs);
        att_tail(&c, T, NH, NKV, hs, n->iparams[1], f, pass ? 8 : 6, pass ? 2 : 0);
        SL_TRY(att_run(&c, T, pass ? NKV : NH, B));
    }
    return SL_OK;
}

static sl_status op_attention_kv(sl_tensor *n) {
    const sl_tensor *q = n->src[0], *kc = n->src[1], *vc = n->src[2];
    int64_t B = q->ne[0], Tq = q->ne[1], NH = q->ne[2], hs = q->ne[3], S = kc->ne[1], NKV = kc->ne[2];
    int64_t pos0 = n->iparams[0];
    if (pos0 < 0 || pos0 + Tq > S)
        return sl_fail(SL_ERR_INVALID, "kv cache: position %lld + %lld exceeds capacity %lld",
                       (long long)pos0, (long long)Tq, (long long)S);
    ocl_ref o, rq, rk, rv;
    REF(n, &o);
    REF(q, &rq);
    REF(kc, &rk);
    REF(vc, &rv);
    cl_long4 qs = strides4(q);
    ocl_call c = ocl_begin(OK_ATTN_KV);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, rq);
    ocl_arg(&c, sizeof qs, &qs);
    ocl_ref_arg(&c, rk);
    ocl_ref_arg(&c, rv);
    ocl_long(&c, Tq);
    ocl_long(&c, S);
    ocl_long(&c, NH);
    ocl_long(&c, NKV);
    ocl_long(&c, hs);
    ocl_long(&c, pos0);
    ocl_long(&c, n->iparams[1]);
    ocl_float(&c, 1.0f / sqrtf((float)hs));
    ocl_int(&c, n->iparams[2] != 0); /* bf16 numerics */
    return ocl_run1(&c, (size_t)(B * NH * Tq));
}

/* ---------------- embedding and cross-entropy ---------------- */

static sl_status op_embedding(sl_tensor *n) {
    const sl_tensor *tab = n->src[0], *ids = n->src[1];
    int64_t V = tab->ne[0], C = tab->ne[1], N = sl_nelements(ids);
    ocl_ref o, rt, ri;
    REF(n, &o);
    REF(tab, &rt);
    REF(ids, &ri);
    int shard = n->iparams[3] != 0; /* a vocab shard from iparams[2] (Note [OpenCL tensor parallelism]) */
    ocl_call c = ocl_begin(shard ? OK_EMBED_SHARD : OK_EMBED);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, rt);
    ocl_ref_arg(&c, ri);
    ocl_long(&c, V);
    ocl_long(&c, C);
    if (shard) ocl_long(&c, n->iparams[2]);
    ocl_mem(&c, g_ocl.flag);
    SL_TRY(ocl_run1(&c, (size_t)(N * C)));
    return ocl_check_flag("embedding: token", V);
}

static sl_status op_embedding_back(sl_tensor *n) {
    const sl_tensor *ids = n->src[1], *g = n->src[2];
    int64_t V = n->ne[0], C = n->ne[1], N = sl_nelements(ids);
    ocl_ref d, ri, rg;
    REF(n, &d);
    REF(ids, &ri);
    REF(g, &rg);
    if (n->iparams[1]) /* Note [Overwriting first gradient writes] */
        SL_TRY(ocl_ew_flat(EW_FILL, 0.0f, d.mem, d.off, V * C));
    int shard = n->iparams[3] != 0; /* the rows of a vocab shard (Note [OpenCL tensor parallelism]) */
    ocl_call c = ocl_begin(shard ? OK_EMBED_BACK_SHARD : OK_EMBED_BACK);
    ocl_ref_arg(&c, d);
    ocl_ref_arg(&c, ri);
    ocl_ref_arg(&c, rg);
    ocl_long(&c, N);
    ocl_long(&c, V);
    ocl_long(&c, C);
    if (shard) {
        ocl_long(&c, n->iparams[2]);
        return ocl_run1(&c, (size_t)C);
    }
    ocl_mem(&c, g_ocl.flag);
    SL_TRY(ocl_run1(&c, (size_t)C));
    return ocl_check_flag("embedding_back: token", V);
}

/* k_ce_mean: mode 0 the mean loss into out, mode 1 the backward's scale dloss / count */
static sl_status ce_mean(int mode, ocl_ref out, ocl_ref lse, ocl_ref lg, ocl_ref tg, ocl_ref dl, int64_t N,
                         int64_t V) {
    ocl_call c = ocl_begin(OK_CE_MEAN);
    ocl_ref_arg(&c, out);
    ocl_ref_arg(&c, lse);
    ocl_ref_arg(&c, lg);
    ocl_ref_arg(&c, tg);
    ocl_ref_arg(&c, dl);
    ocl_long(&c, N);
    ocl_long(&c, V);
    ocl_int(&c, mode);
    return ocl_run1(&c, 1);
}

/* k_ce_lse: the logsumexp of every row into lse; targets >= vcheck are flagged */
static sl_status ce_lse(ocl_ref lse, ocl_ref rl, ocl_ref rt, int64_t N, int64_t V, int64_t vcheck) {
    ocl_call c = ocl_begin(OK_CE_LSE);
    ocl_ref_arg(&c, lse);
    ocl_ref_arg(&c, rl);
    ocl_ref_arg(&c, rt);
    ocl_long(&c, V);
    ocl_long(&c, vcheck);
    ocl_mem(&c, g_ocl.flag);
    return run_rows(&c, N, V);
}

static sl_status op_cross_entropy(sl_tensor *n) {
    const sl_tensor *lg = n->src[0], *tg = n->src[1];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg);
    ocl_ref o, lse, rl, rt;
    REF(n, &o);
    AUX(n, &lse);
    REF(lg, &rl);
    REF(tg, &rt);
    SL_TRY(ce_lse(lse, rl, rt, N, V, V));
    SL_TRY(ocl_check_flag("cross_entropy: target", V));
    return ce_mean(0, o, lse, rl, rt, rl, N, V);
}

static sl_status op_cross_entropy_back(sl_tensor *n) {
    const sl_tensor *f = n->src[0], *lg = n->src[1], *tg = n->src[2], *dl = n->src[3];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg);
    ocl_ref d, lse, rl, rt, rdl;
    REF(n, &d);
    AUX(f, &lse);
    REF(lg, &rl);
    REF(tg, &rt);
    REF(dl, &rdl);
    int vp = n->op == SL_OP_CE_VP_BACK; /* a vocab shard from iparams[0] (Note [OpenCL tensor parallelism]) */
    cl_mem sc;
    SL_TRY(ocl_scratch(sizeof(float), &sc));
    ocl_ref rsc = {sc, 0};
    SL_TRY(ce_mean(vp ? 2 : 1, rsc, lse, rl, rt, rdl, N, V));
    ocl_call c = ocl_begin(OK_CE_BACK);
    ocl_ref_arg(&c, d);
    ocl_ref_arg(&c, lse);
    ocl_ref_arg(&c, rl);
    ocl_ref_arg(&c, rt);
    ocl_mem(&c, sc);
    ocl_long(&c, V);
    ocl_long(&c, vp ? n->iparams[0] : 0);
    size_t global[2] = {(size_t)((V + 15) / 16), (size_t)N}; /* Note [OpenCL vector cross-entropy] */
    return ocl_run(&c, 2, global, NULL);
}

/* CE_VP_STATS: the shard's logsumexp per row (k_ce_lse, no target bound: they are global ids) and the
 * target's logit where the shard holds it */
static sl_status op_ce_vp_stats(sl_tensor *n) {
    const sl_tensor *lg = n->src[0], *tg = n->src[1];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg);
    ocl_ref o, rl, rt;
    REF(n, &o);
    REF(lg, &rl);
    REF(tg, &rt);
    cl_mem sc;
    SL_TRY(ocl_scratch(sizeof(float) * (size_t)(N ? N : 1), &sc));
    SL_TRY(ce_lse((ocl_ref){sc, 0}, rl, rt, N, V, INT64_MAX));
    ocl_call c = ocl_begin(OK_CE_VP_STATS);
    ocl_ref_arg(&c, o);
    ocl_mem(&c, sc);
    ocl_ref_arg(&c, rl);
    ocl_ref_arg(&c, rt);
    ocl_long(&c, V);
    ocl_long(&c, n->iparams[0]);
    return ocl_run1(&c, (size_t)N);
}

/* CE_VP: the group's stats -> the global logsumexp (aux) and the mean loss */
static sl_status op_ce_vp(sl_tensor *n) {
    const sl_tensor *tg = n->src[1], *st = n->src[2];
    int64_t N = sl_nelements(tg), P = st->ne[0];
    ocl_ref o, lse, rt, rs;
    REF(n, &o);
    AUX(n, &lse);
    REF(tg, &rt);
    REF(st, &rs);
    ocl_call c = ocl_begin(OK_CE_VP);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, lse);
    ocl_ref_arg(&c, rt);
    ocl_ref_arg(&c, rs);
    ocl_long(&c, N);
    ocl_long(&c, P);
    return ocl_run1(&c, 1);
}

/* ---------------- llama family ---------------- */

/* inverse frequencies exactly as the CPU computes them (Note [RoPE numerics], llama3 scaling) */
static void rope_inv_freq(const sl_tensor *n, int64_t hs, float *inv) {
    int64_t half = hs / 2;
    float theta = n->fparams[0], factor = n->fparams[1];
    for (int64_t i = 0; i < half; i++) inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
    if (factor > 0) {
        float lo = n->fparams[2], hi = n->fparams[3], old = (float)n->iparams[3];
        float lo_wl = old / lo, hi_wl = old / hi;
        for (int64_t i = 0; i < half; i++) {
            float wl = 2.0f * (float)M_PI / inv[i];
            float f = wl > lo_wl ? inv[i] / factor : inv[i];
            if (!(wl < hi_wl) && !(wl > lo_wl)) {
                float sm = (old / wl - lo) / (hi - lo);
                f = (1.0f - sm) * f / factor + sm * f;
            }
            inv[i] = f;
        }
    }
}

static sl_status op_rope(sl_tensor *n) {
    const sl_tensor *x = n->src[0];
    int64_t B = x->ne[0], T = x->ne[1], NH = x->ne[2], hs = x->ne[3], half = hs / 2;
    ocl_ref y, rx;
    REF(n, &y);
    REF(x, &rx);
    float local[256], *inv = half <= 256 ? local : malloc(sizeof(float) * (size_t)half);
    if (!inv) return sl_fail(SL_ERR_NOMEM, "opencl backend: rope: out of memory");
    rope_inv_freq(n, hs, inv);
    cl_int err;
    /* a buffer per call: released at once, kept by the runtime until the kernel has run */
    cl_mem m = clCreateBuffer(g_ocl.ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                              sizeof(float) * (size_t)(half ? half : 1), inv, &err);
    if (inv != local) free(inv);
    if (err != CL_SUCCESS) return ocl_fail(err, "rope frequencies");
    cl_long4 xs = strides4(x);
    ocl_call c = ocl_begin(OK_ROPE);
    ocl_ref_arg(&c, y);
    ocl_ref_arg(&c, rx);
    ocl_arg(&c, sizeof xs, &xs);
    ocl_mem(&c, m);
    ocl_long(&c, T);
    ocl_long(&c, NH);
    ocl_long(&c, hs);
    ocl_long(&c, n->iparams[0]);
    ocl_float(&c, n->iparams[1] ? -1.0f : 1.0f);
    int mode = n->iparams[2]; /* Note [RoPE numerics] (src/device/cpu/kernels/llama_ops.c) */
    ocl_int(&c, mode == 1 || mode == 5 ? 1 : mode == 2 || mode == 6 ? 2 : 0);
    ocl_int(&c, mode == 1 || mode == 2);
    sl_status st = ocl_run1(&c, (size_t)(B * T * NH * half));
    clReleaseMemObject(m);
    return st;
}

static sl_status op_topk_gate(sl_tensor *n) {
    const sl_tensor *a = n->src[0];
    ocl_ref y, ra;
    REF(n, &y);
    REF(a, &ra);
    ocl_call c = ocl_begin(OK_TOPK);
    ocl_ref_arg(&c, y);
    ocl_ref_arg(&c, ra);
    ocl_long(&c, a->nb[0]);
    ocl_long(&c, a->ne[1]);
    ocl_int(&c, n->iparams[0]);
    return ocl_run1(&c, (size_t)a->ne[0]);
}

/* Note [Sparse experts] (llama_ops.c) in two kernels: a = silu(h w1^T) * (h w3^T) on the routed rows
 * (scratch, N x I), then y = gate * (a w2^T), zero on the other rows. */
static sl_status op_moe_expert(sl_tensor *n) {
    const sl_tensor *h = n->src[0], *gate = n->src[1], *w1 = n->src[2], *w3 = n->src[3], *w2 = n->src[4];
    int64_t N = h->ne[0], C = h->ne[1], I = w1->ne[0], e = n->iparams[0];
    ocl_ref y, rh, rg, r1, r3, r2;
    REF(n, &y);
    REF(h, &rh);
    REF(gate, &rg);
    REF(w1, &r1);
    REF(w3, &r3);
    REF(w2, &r2);
    cl_mem a;
    SL_TRY(ocl_scratch(sizeof(float) * (size_t)(N * I > 0 ? N * I : 1), &a));
    ocl_call c = ocl_begin(OK_MOE_UP);
    ocl_mem(&c, a);
    ocl_ref_arg(&c, rh);
    ocl_ref_arg(&c, rg);
    ocl_long(&c, gate->nb[0]);
    ocl_long(&c, e);
    ocl_ref_arg(&c, r1);
    ocl_ref_arg(&c, r3);
    ocl_long(&c, C);
    ocl_long(&c, I);
    SL_TRY(ocl_run1(&c, (size_t)(N * I)));
    ocl_call d = ocl_begin(OK_MOE_DOWN);
    ocl_ref_arg(&d, y);
    ocl_mem(&d, a);
    ocl_ref_arg(&d, rg);
    ocl_long(&d, gate->nb[0]);
    ocl_long(&d, e);
    ocl_ref_arg(&d, r2);
    ocl_long(&d, C);
    ocl_long(&d, I);
    return ocl_run1(&d, (size_t)(N * C));
}

sl_status ocl_op_nn(sl_tensor *n) {
    switch (n->op) {
    case SL_OP_LAYERNORM:
        return op_layernorm(n);
    case SL_OP_LAYERNORM_BACK_X:
    case SL_OP_LAYERNORM_BACK_WB:
        return op_layernorm_back(n);
    case SL_OP_RMSNORM:
        return op_rmsnorm(n);
    case SL_OP_RMSNORM_BACK_X:
    case SL_OP_RMSNORM_BACK_W:
        return op_rmsnorm_back(n);
    case SL_OP_SOFTMAX:
        return op_softmax(n);
    case SL_OP_SOFTMAX_BACK:
    case SL_OP_TOPK_GATE_BACK:
        return op_softmax_back(n);
    case SL_OP_ATTENTION:
        return op_attention(n);
    case SL_OP_ATTENTION_BACK:
        return op_attention_back(n);
    case SL_OP_ATTENTION_KV:
        return op_attention_kv(n);
    case SL_OP_EMBEDDING:
        return op_embedding(n);
    case SL_OP_EMBEDDING_BACK:
        return op_embedding_back(n);
    case SL_OP_CROSS_ENTROPY:
        return op_cross_entropy(n);
    case SL_OP_CROSS_ENTROPY_BACK:
    case SL_OP_CE_VP_BACK:
        return op_cross_entropy_back(n);
    case SL_OP_CE_VP_STATS:
        return op_ce_vp_stats(n);
    case SL_OP_CE_VP:
        return op_ce_vp(n);
    case SL_OP_ROPE:
        return op_rope(n);
    case SL_OP_TOPK_GATE:
        return op_topk_gate(n);
    case SL_OP_MOE_EXPERT:
        return op_moe_expert(n);
    default:
        return sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: op %s (%s) not supported", sl_op_name(n->op),
                       sl_dtype_name(n->dtype));
    }
}
