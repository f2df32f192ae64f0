/* The OpenCL backend's op table: supports_op (honest: op, dtypes, layouts), the dispatch of compute_node,
 * the elementwise / data-movement ops (k_ew, k_ew16, k_sum_to) and MATMUL (k_gemm). The other ops are in
 * opencl_ops_nn.c. Semantics of every op: the enum in suanli/tensor.h and the CPU kernels. */
#include <string.h>

#include "device/accel_support.h"
#include "device/opencl/opencl_internal.h"

/* ---------------- iteration forms ---------------- */

ocl_it5 ocl_it5_of(const sl_tensor *t) {
    ocl_it5 r;
    memset(&r, 0, sizeof r);
    int pad = 5 - t->ndim;
    for (int d = 0; d < 5; d++) {
        r.ne.s[d] = d < pad ? 1 : t->ne[d - pad];
        r.nb.s[d] = d < pad ? 0 : t->nb[d - pad];
    }
    r.ne.s[5] = r.ne.s[6] = r.ne.s[7] = 1;
    return r;
}

ocl_it5 ocl_it5_broadcast(const sl_tensor *b, const sl_tensor *out) {
    ocl_it5 o = ocl_it5_of(out), r = ocl_it5_of(b);
    for (int d = 0; d < 5; d++) {
        if (r.ne.s[d] != o.ne.s[d]) r.nb.s[d] = 0; /* broadcast dim (size 1) */
        r.ne.s[d] = o.ne.s[d];
    }
    return r;
}

cl_long8 ocl_contig_nb(cl_long8 ne) {
    cl_long8 nb;
    memset(&nb, 0, sizeof nb);
    int64_t s = 1;
    for (int d = 4; d >= 0; d--) {
        nb.s[d] = s;
        s *= ne.s[d];
    }
    return nb;
}

static int64_t count5(cl_long8 ne) { return ne.s[0] * ne.s[1] * ne.s[2] * ne.s[3] * ne.s[4]; }

static cl_long8 flat_ne(int64_t n) {
    cl_long8 ne;
    for (int d = 0; d < 8; d++) ne.s[d] = 1;
    ne.s[4] = n;
    return ne;
}

/* x and y agree on every dim of more than one element */
static int same_nb(cl_long8 x, cl_long8 y, cl_long8 ne) {
    for (int d = 0; d < 5; d++)
        if (ne.s[d] != 1 && x.s[d] != y.s[d]) return 0;
    return 1;
}

/* b's period when its strides are 0 over the leading dims and contiguous over the trailing ones (a
 * broadcast over rows, as a bias), 0 when b is contiguous over all of ne, else -1 */
static int64_t bcast_period(cl_long8 nbb, cl_long8 ne, cl_long8 cnb) {
    int d = 0;
    while (d < 5 && (nbb.s[d] == 0 || ne.s[d] == 1)) d++;
    int64_t per = 1;
    for (int e = d; e < 5; e++) {
        if (ne.s[e] != 1 && nbb.s[e] != cnb.s[e]) return -1;
        per *= ne.s[e];
    }
    return per == count5(ne) ? 0 : per;
}

sl_status ocl_ew(int op, float f, ocl_ref o, cl_long8 nbo, ocl_ref a, cl_long8 nba, ocl_ref b, cl_long8 nbb,
                 cl_long8 ne) {
    cl_long8 cnb = ocl_contig_nb(ne);
    int64_t per = -1;
    if (same_nb(nbo, cnb, ne) && same_nb(nba, cnb, ne) && (per = bcast_period(nbb, ne, cnb)) == 0) {
        int64_t n = count5(ne);
        ocl_call c = ocl_begin(OK_EWV); /* Note [OpenCL vector elementwise] */
        ocl_ref_arg(&c, o);
        ocl_ref_arg(&c, a);
        ocl_ref_arg(&c, b);
        ocl_long(&c, n);
        ocl_int(&c, op);
        ocl_float(&c, f);
        return ocl_run1(&c, (size_t)((n + 15) / 16));
    }
    if (per > 0) {
        ocl_call c = ocl_begin(OK_EWC); /* Note [OpenCL contiguous elementwise] */
        ocl_ref_arg(&c, o);
        ocl_ref_arg(&c, a);
        ocl_ref_arg(&c, b);
        ocl_long(&c, per);
        ocl_int(&c, op);
        ocl_float(&c, f);
        return ocl_run1(&c, (size_t)count5(ne));
    }
    ocl_call c = ocl_begin(OK_EW);
    ocl_ref_arg(&c, o);
    ocl_arg(&c, sizeof nbo, &nbo);
    ocl_ref_arg(&c, a);
    ocl_arg(&c, sizeof nba, &nba);
    ocl_ref_arg(&c, b);
    ocl_arg(&c, sizeof nbb, &nbb);
    ocl_arg(&c, sizeof ne, &ne);
    ocl_int(&c, op);
    ocl_float(&c, f);
    return ocl_run1(&c, (size_t)count5(ne));
}

sl_status ocl_ew_flat(int op, float f, cl_mem m, int64_t off, int64_t n) {
    ocl_ref r = {m, off};
    cl_long8 ne = flat_ne(n), nb = ocl_contig_nb(ne);
    return ocl_ew(op, f, r, nb, r, nb, r, nb, ne);
}

static sl_status ew16(int op, ocl_ref o, cl_long8 nbo, ocl_ref a, cl_long8 nba, cl_long8 ne) {
    cl_long8 cnb = ocl_contig_nb(ne);
    if (same_nb(nbo, cnb, ne) && same_nb(nba, cnb, ne)) { /* contiguous: k_ew16v */
        int64_t n = count5(ne);
        ocl_call c = ocl_begin(OK_EW16V);
        ocl_ref_arg(&c, o);
        ocl_ref_arg(&c, a);
        ocl_long(&c, n);
        ocl_int(&c, op);
        return ocl_run1(&c, (size_t)((n + 15) / 16));
    }
    ocl_call c = ocl_begin(OK_EW16);
    ocl_ref_arg(&c, o);
    ocl_arg(&c, sizeof nbo, &nbo);
    ocl_ref_arg(&c, a);
    ocl_arg(&c, sizeof nba, &nba);
    ocl_arg(&c, sizeof ne, &ne);
    ocl_int(&c, op);
    return ocl_run1(&c, (size_t)count5(ne));
}

/* ---------------- supports_op ---------------- */

/* Note [OpenCL f16 storage]
 * f16 is a storage format here, with every operation in f32, so it needs no cl_khr_fp16 (PoCL's CPU device
 * lacks it): vload_half / vstore_half_rte are core OpenCL 1.2. CAST f32 <-> f16 rounds to nearest even;
 * CONT / CONCAT / ZEROS move 16-bit elements; MATMUL with f16 x f16 operands (f32 out and bias, the fp16
 * autocast GEMM) packs both operands into f32 panels (k_gemm_pack_*_h widen as they pack) and runs the
 * register-blocked kernel with f32 accumulation, as the CPU widens f16 for its GEMM. The tiled GEMM (GPU-
 * type devices) has no f16 path yet: there f16 MATMUL is refused by name. bf16 x bf16 MATMUL takes the same
 * path (k_gemm_pack_*_b), with the bf16 rounding of the product (Note [OpenCL bf16 GEMM], gemm_reg.cl), and
 * so does a bf16 A with an f32 weight B rounded to bf16 as it is packed (Note [OpenCL fused weight casts]).
 * The eager half attention and RoPE numerics (ATTENTION / ROPE iparams[2], the --fp16 / --bf16 paths) have
 * kernels of their own (Note [OpenCL half attention], k_rope).
 *
 * Note [OpenCL supported ops]
 * The shared accelerator table (Note [Accelerator supported ops], src/device/accel_support.c: every f32 op of
 * GPT-2 / Llama-family training and KV-cache generation, sliding-window attention included; bf16 / f16
 * compute refused by name), with attention limited to head sizes whose tiles fit the device's local memory
 * (OCL_ATT_LOCAL, Note [OpenCL flash attention]); the trainable MoE ops and the bf16 numerics of MOE_EXPERT
 * are decided first by ocl_moe_supports (Note [OpenCL MoE kernels], Note [OpenCL bf16 experts] in
 * opencl_ops_moe.c). */
static int sum_whole_rows(const sl_tensor *n); /* SUM_TO over whole rows (op_sum_to) */

/* what this backend adds to the shared table: dropout (Note [OpenCL dropout]), the vocab-parallel ops (Note
 * [OpenCL tensor parallelism], kernels/loss.cl), f16 storage, the half numerics of attention and RoPE (Note
 * [OpenCL half attention], k_rope in kernels/llama.cl) */
#define OCL_EXTRA (SL_ACCEL_DROPOUT | SL_ACCEL_VOCAB_SHARD | SL_ACCEL_F16_STORAGE | SL_ACCEL_HALF_NUMERICS)

int ocl_supports(const sl_tensor *n) {
    const sl_tensor *a = n->src[0], *b = n->src[1];
    int moe = ocl_moe_supports(n); /* the trainable MoE ops (opencl_ops_moe.c), -1 for other ops */
    if (moe >= 0) return moe;
    switch (n->op) {
    case SL_OP_SUM_TO: /* a bf16 source summed into f32 rows (the bias gradient of a fused-cast Linear) */
        if (a->dtype == SL_BF16) return n->dtype == SL_F32 && sum_whole_rows(n);
        return sl_accel_supports(n);
    case SL_OP_LINEAR_BF16: /* Note [OpenCL bf16 linear] */
        return g_ocl.gemm_kind == OCL_GEMM_REG && a->dtype == SL_F32 && b->dtype == SL_BF16 &&
               n->dtype == SL_F32 && b->ndim == 2 && sl_is_contiguous(b) && sl_accel_last_unit(a) &&
               sl_is_contiguous(n);
    case SL_OP_MATMUL: /* f16 x f16 and bf16 x bf16 -> f32 on the register-blocked GEMM, bf16 rounding of
                          the product there too (Note [OpenCL f16 storage], Note [OpenCL bf16 GEMM]) */
        if (n->iparams[SL_MATMUL_IP_HALF_B] && (n->iparams[SL_MATMUL_IP_HALF_B] != SL_BF16 ||
                                                a->dtype != SL_BF16 || b->dtype != SL_F32 || b->ndim != 2))
            return 0; /* the fused weight cast: bf16 A, f32 B (Note [OpenCL fused weight casts]) */
        if (((a->dtype == SL_F16 && b->dtype == SL_F16) || (a->dtype == SL_BF16 && b->dtype == SL_BF16) ||
             (a->dtype == SL_F32 && b->dtype == SL_F32 && n->iparams[SL_MATMUL_IP_ROUND] == SL_BF16) ||
             n->iparams[SL_MATMUL_IP_HALF_B]) &&
            n->dtype == SL_F32 && (!n->src[2] || n->src[2]->dtype == SL_F32) &&
            (a->dtype != SL_F16 || !n->iparams[SL_MATMUL_IP_ROUND]))
            return g_ocl.gemm_kind == OCL_GEMM_REG && a->ndim >= 2 && b->ndim >= 2 && n->ndim >= 2 &&
                   sl_accel_last_unit(a) && sl_accel_last_unit(b) && sl_accel_last_unit(n) &&
                   (!n->src[2] || sl_is_contiguous(n->src[2]));
        return sl_accel_supports_ex(n, OCL_EXTRA);
    case SL_OP_ATTENTION_KV: /* also the bf16 numerics of a bf16 model (iparams[2] = 1, k_attention_kv) */
        return sl_accel_all_f32(n) && n->iparams[2] >= 0 && n->iparams[2] <= 1 && sl_accel_last_unit(a) &&
               sl_is_contiguous(b) && sl_is_contiguous(n->src[2]);
    case SL_OP_ATTENTION: /* the flash kernels' tiles must fit local memory (the eager half kernels need none)
                           */
        return sl_accel_supports_ex(n, OCL_EXTRA) &&
               ((n->iparams[2] >= 1 && n->iparams[2] <= 4) || OCL_ATT_LOCAL(a->ne[3]) <= g_ocl.local_mem);
    case SL_OP_ATTENTION_BACK:
        return sl_accel_supports_ex(n, OCL_EXTRA) &&
               ((a->iparams[2] >= 1 && a->iparams[2] <= 4) || OCL_ATT_LOCAL(b->ne[3]) <= g_ocl.local_mem);
    default:
        return sl_accel_supports_ex(n, OCL_EXTRA);
    }
}

/* ---------------- elementwise and data movement ---------------- */

#define REF(t, r) SL_TRY(ocl_ref_of(n, (t), (r)))

/* o (node, contiguous) = copy of a, 32- or 16-bit elements, or a cast */
static sl_status op_copy(sl_tensor *n, const sl_tensor *a, ocl_ref o, cl_long8 nbo, int cast) {
    ocl_ref ra;
    REF(a, &ra);
    ocl_it5 ia = ocl_it5_of(a);
    if (cast) { /* k_ew16: 1 f32 -> bf16, 2 bf16 -> f32, 3 f32 -> f16, 4 f16 -> f32 */
        int half = a->dtype == SL_F16 || n->dtype == SL_F16;
        return ew16(a->dtype == SL_F32 ? (half ? 3 : 1) : (half ? 4 : 2), o, nbo, ra, ia.nb, ia.ne);
    }
    if (sl_dtype_size(a->dtype) == 2) return ew16(0, o, nbo, ra, ia.nb, ia.ne);
    return ocl_ew(EW_COPY_A, 0, o, nbo, ra, ia.nb, ra, ia.nb, ia.ne);
}

static sl_status op_concat(sl_tensor *n) {
    ocl_ref o;
    REF(n, &o);
    ocl_it5 io = ocl_it5_of(n);
    int dim = n->iparams[0];
    SL_TRY(op_copy(n, n->src[0], o, io.nb, 0));
    o.off += n->src[0]->ne[dim] * n->nb[dim];
    return op_copy(n, n->src[1], o, io.nb, 0);
}

static sl_status op_binary(sl_tensor *n, int op) {
    ocl_ref o, a, b;
    REF(n, &o);
    REF(n->src[0], &a);
    ocl_it5 io = ocl_it5_of(n), ia = ocl_it5_of(n->src[0]), ib = io;
    if (n->src[1]) {
        REF(n->src[1], &b);
        ib = ocl_it5_broadcast(n->src[1], n);
    } else {
        b = a;
        ib = ia;
    }
    return ocl_ew(op, n->fparams[0], o, io.nb, a, ia.nb, b, ib.nb, io.ne);
}

/* DROPOUT (Note [OpenCL dropout], kernels/0_common.cl and dropout.cl): x * m (+ a residual); turned off,
 * the copy or the add of the CPU's sl_k_dropout, the same bits */
static sl_status op_dropout(sl_tensor *n) {
    ocl_ref o, x, r;
    REF(n, &o);
    REF(n->src[0], &x);
    const sl_tensor *res = n->src[1];
    if (res) REF(res, &r);
    int64_t N = sl_nelements(n);
    sl_accel_dropout d = sl_accel_dropout_of(n);
    if (!d.on) {
        cl_long8 ne = flat_ne(N), nb = ocl_contig_nb(ne);
        if (res) return ocl_ew(EW_ADD, 0, o, nb, r, nb, x, nb, ne);
        if (o.mem == x.mem && o.off == x.off) return SL_OK;
        return ocl_ew(EW_COPY_A, 0, o, nb, x, nb, x, nb, ne);
    }
    /* a sequence shard (B, Tl, R) of a (B, seq, R) tensor: one block per batch row */
    int shard = d.seq > 0 && n->ndim >= 2;
    int64_t nb = shard ? n->ne[0] : 1, blk = N / (nb ? nb : 1);
    int64_t R = shard && n->ne[1] > 0 ? blk / n->ne[1] : 0, per = blk / 4 + 2;
    cl_ulong seed = d.seed, hi = d.hi;
    cl_uint thr = d.thr;
    ocl_call c = ocl_begin(OK_DROPOUT);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, x);
    ocl_ref_arg(&c, res ? r : x);
    ocl_int(&c, res != NULL);
    ocl_long(&c, blk);
    ocl_long(&c, per);
    ocl_long(&c, R);
    ocl_long(&c, shard ? d.seq : 0);
    ocl_long(&c, d.t0);
    ocl_arg(&c, sizeof seed, &seed);
    ocl_arg(&c, sizeof hi, &hi);
    ocl_arg(&c, sizeof thr, &thr);
    ocl_float(&c, d.keep);
    return ocl_run1(&c, (size_t)(nb * per));
}

/* SUM_TO with a contiguous source and n its trailing dims: a sum over whole rows */
static int sum_whole_rows(const sl_tensor *n) {
    ocl_it5 ia = ocl_it5_of(n->src[0]), io = ocl_it5_of(n);
    int lead = 0;
    while (lead < 5 && io.ne.s[lead] == 1) lead++;
    int trailing = sl_is_contiguous(n->src[0]);
    for (int d = lead; d < 5 && trailing; d++) trailing = io.ne.s[d] == ia.ne.s[d];
    return trailing;
}

static sl_status op_sum_to(sl_tensor *n) {
    ocl_ref o, a;
    REF(n, &o);
    REF(n->src[0], &a);
    ocl_it5 ia = ocl_it5_of(n->src[0]), io = ocl_it5_of(n);
    /* a contiguous, n its trailing dims: a sum over whole rows, in row order (the CPU's order); a bf16 source
     * (supports_op takes it only so) widened as it is read */
    if (sum_whole_rows(n)) {
        int64_t P = sl_nelements(n);
        ocl_call c = ocl_begin(n->src[0]->dtype == SL_BF16 ? OK_SUM_ROWS_B : OK_SUM_ROWS);
        ocl_ref_arg(&c, o);
        ocl_ref_arg(&c, a);
        ocl_long(&c, P ? sl_nelements(n->src[0]) / P : 0);
        ocl_long(&c, P);
        return ocl_run1(&c, (size_t)P);
    }
    ocl_call c = ocl_begin(OK_SUM_TO);
    ocl_ref_arg(&c, o);
    ocl_ref_arg(&c, a);
    ocl_arg(&c, sizeof ia.ne, &ia.ne);
    ocl_arg(&c, sizeof ia.nb, &ia.nb);
    ocl_arg(&c, sizeof io.ne, &io.ne);
    return ocl_run1(&c, (size_t)sl_nelements(n));
}

static sl_status op_acc(sl_tensor *n) {
    const sl_tensor *dst = n->src[0], *src = n->src[1];
    ocl_ref d, s;
    REF(dst, &d);
    REF(src, &s);
    int op = n->iparams[0] ? EW_COPY_B : EW_ADD; /* Note [Overwriting first gradient writes] */
    if (sl_is_contiguous(dst) && sl_is_contiguous(src)) {
        cl_long8 ne = flat_ne(sl_nelements(dst)), nb = ocl_contig_nb(ne);
        return ocl_ew(op, 0, d, nb, d, nb, s, nb, ne);
    }
    ocl_it5 id = ocl_it5_of(dst), is = ocl_it5_of(src);
    return ocl_ew(op, 0, d, id.nb, d, id.nb, s, is.nb, id.ne);
}

static sl_status op_scatter_add(sl_tensor *n) {
    const sl_tensor *src = n->src[1];
    ocl_ref d, s;
    REF(n, &d);
    REF(src, &s);
    ocl_it5 is = ocl_it5_of(src);
    cl_long8 nbv = is.nb;
    int vnd = n->iparams[5], pad = 5 - vnd;
    for (int k = 0; k < 5; k++) nbv.s[k] = k < pad ? 0 : n->iparams[1 + k - pad];
    d.off += n->iparams[0];
    return ocl_ew(EW_ADD, 0, d, nbv, d, nbv, s, is.nb, is.ne);
}

static sl_status op_zeros(sl_tensor *n) {
    ocl_ref o;
    REF(n, &o);
    size_t es = sl_dtype_size(n->dtype), bytes = sl_nbytes(n);
    if (!bytes) return SL_OK;
    cl_uchar zero = 0;
    cl_int err = clEnqueueFillBuffer(g_ocl.queue, o.mem, &zero, 1, (size_t)o.off * es, bytes, 0, NULL, NULL);
    return err == CL_SUCCESS ? SL_OK : ocl_fail(err, "zeros");
}

static sl_status op_kv_store(sl_tensor *n) {
    const sl_tensor *x = n->src[1];
    int64_t T = x->ne[1], NKV = x->ne[2], hs = x->ne[3], S = n->ne[1], pos0 = n->iparams[0];
    if (pos0 < 0 || pos0 + T > S)
        return sl_fail(SL_ERR_INVALID, "kv cache: position %lld + %lld exceeds capacity %lld",
                       (long long)pos0, (long long)T, (long long)S);
    ocl_ref o, rx;
    REF(n, &o);
    REF(x, &rx);
    ocl_it5 ix = ocl_it5_of(x);
    cl_long8 nbo = ix.nb;
    nbo.s[0] = 0, nbo.s[1] = S * NKV * hs, nbo.s[2] = NKV * hs, nbo.s[3] = hs, nbo.s[4] = 1;
    o.off += pos0 * NKV * hs;
    return ocl_ew(EW_COPY_A, 0, o, nbo, rx, ix.nb, rx, ix.nb, ix.ne);
}

/* ---------------- matmul ---------------- */

/* Pack op(X) into panels of W (Note [OpenCL GEMM tiles]) from X at r with leading dim ld: kmajor: X is
 * stored K-major (rows of X^T, k_gemm_pack_n), else row-major (k_gemm_pack_t*). Panels of batch element z
 * at P + po + z*pz. */
static sl_status gemm_pack(ocl_ref r, int64_t ld, int kmajor, int rows, int K, int W, cl_mem P, int64_t po,
                           int64_t pz, cl_long4 bne, cl_long4 bs, int64_t nz, sl_dtype dt, int rnd) {
    size_t panels = ((size_t)rows + (size_t)W - 1) / (size_t)W;
    ocl_kernel_id id = kmajor ? OK_GEMM_PACK_N : W == 32 ? OK_GEMM_PACK_TB : OK_GEMM_PACK_TA;
    if (dt == SL_F16) id = kmajor ? OK_GEMM_PACK_N_H : W == 32 ? OK_GEMM_PACK_TB_H : OK_GEMM_PACK_TA_H;
    if (dt == SL_BF16) id = kmajor ? OK_GEMM_PACK_N_B : W == 32 ? OK_GEMM_PACK_TB_B : OK_GEMM_PACK_TA_B;
    if (rnd) /* f32 rounded to bf16: B (W == 32), or row-major A (Note [OpenCL bf16 linear]) */
        id = kmajor ? OK_GEMM_PACK_N_R : W == 32 ? OK_GEMM_PACK_TB_R : OK_GEMM_PACK_TA_R;
    ocl_call c = ocl_begin(id);
    ocl_int(&c, rows);
    ocl_int(&c, K);
    if (kmajor) ocl_int(&c, W);
    ocl_ref_arg(&c, r);
    ocl_long(&c, ld);
    ocl_ref_arg(&c, (ocl_ref){P, po});
    ocl_long(&c, pz);
    ocl_arg(&c, sizeof bne, &bne);
    ocl_arg(&c, sizeof bs, &bs);
    size_t g[3] = {panels, ((size_t)K + 15) / 16, (size_t)nz};
    return ocl_run(&c, 3, g, NULL);
}

/* batch strides that put batch element z at z * per (flat, in bne's order) */
static cl_long4 flat_bs(cl_long4 bne, int64_t per) {
    cl_long4 r = {{bne.s[1] * bne.s[2] * per, bne.s[2] * per, per, 0}};
    return r;
}

/* The register-blocked GEMM (kernels/gemm_reg.cl) for CPU-type devices. Both operands are packed into
 * contiguous panels in scratch memory first (A's panels, then B's), also those whose layout is already a
 * panel (op(A) = A^T, op(B) = B with N % 32 == 0): read in place, their rows are ld floats apart, and at
 * GPT-2's widths (multiples of 768 floats, 3 KiB) the 32 x KC slice of B that should stay in L1 across the
 * MG m-tiles fell into 4-8 of the 64 L1 sets (Note [OpenCL GEMM packing]). */
static sl_status gemm_reg(int M, int N, int K, ocl_ref ra, int64_t lda, int tA, ocl_ref rb, int64_t ldb,
                          int tB, ocl_ref rc, int64_t ldc, int beta1, const ocl_ref *rbias, cl_long4 bne,
                          cl_long4 bsa, cl_long4 bsb, cl_long4 bsc, sl_dtype dt, int half_a, int half_b,
                          int round) {
    const int MR = g_ocl.gemm_mr;
    int64_t nz = bne.s[0] * bne.s[1] * bne.s[2];
    int64_t Mp = ((int64_t)M + MR - 1) / MR * MR, Np = ((int64_t)N + 31) / 32 * 32;
    int64_t pa = Mp * K, pb = Np * K; /* packed floats per batch element */
    /* Cp: partial sums between k-blocks, for chunks of cpp column panels at a time (bounded) */
    int64_t npan = Np / 32, cpp = npan;
    while (cpp > 1 && nz * Mp * cpp * 32 * (int64_t)sizeof(float) > g_ocl.gemm_cp_max) cpp = (cpp + 1) / 2;
    int64_t cpn = K > g_ocl.gemm_kc ? nz * Mp * cpp * 32 : 0;
    cl_mem P;
    SL_TRY(ocl_scratch(sizeof(float) * (size_t)(nz * (pa + pb) + cpn + 1), &P)); /* + 1: never empty (K 0) */
    /* half_a: an f32 A rounded to bf16 in its panels (Note [OpenCL bf16 linear]) */
    SL_TRY(gemm_pack(ra, lda, tA, M, K, MR, P, 0, pa, bne, bsa, nz, half_a ? SL_F32 : dt, half_a));
    /* half_b: an f32 B rounded to bf16 in its panels (Note [OpenCL fused weight casts], gemm_reg.cl) */
    SL_TRY(gemm_pack(rb, ldb, !tB, N, K, 32, P, nz * pa, pb, bne, bsb, nz, half_b ? SL_F32 : dt, half_b));
    /* element (i, k) of A's panel p at A + p*a_pan + k*a_k + i; (k, j) of B's panel q at B + q*b_pan + k*b_k
     * + j */
    ra = (ocl_ref){P, 0}, rb = (ocl_ref){P, nz * pa};
    const int64_t a_pan = (int64_t)MR * K, a_k = MR, b_pan = 32 * (int64_t)K, b_k = 32;
    bsa = flat_bs(bne, pa), bsb = flat_bs(bne, pb);
    ocl_call c = ocl_begin(OK_GEMM_REG);
    ocl_int(&c, M);
    ocl_int(&c, N);
    ocl_int(&c, K);
    ocl_ref_arg(&c, ra);
    ocl_long(&c, a_pan);
    ocl_long(&c, a_k);
    ocl_arg(&c, sizeof bsa, &bsa);
    ocl_ref_arg(&c, rb);
    ocl_long(&c, b_pan);
    ocl_long(&c, b_k);
    ocl_arg(&c, sizeof bsb, &bsb);
    ocl_ref_arg(&c, rc);
    ocl_long(&c, ldc);
    ocl_arg(&c, sizeof bsc, &bsc);
    ocl_int(&c, beta1);
    ocl_ref_arg(&c, rbias ? *rbias : rc);
    ocl_int(&c, rbias != NULL);
    ocl_arg(&c, sizeof bne, &bne);
    ocl_ref_arg(&c, (ocl_ref){P, cpn ? nz * (pa + pb) : 0});
    ocl_int(&c, g_ocl.gemm_kc);
    ocl_int(&c, g_ocl.gemm_mg);
    ocl_int(&c, round); /* Note [OpenCL bf16 GEMM] */
    int64_t nmb = Mp / MR, ng = (nmb + g_ocl.gemm_mg - 1) / g_ocl.gemm_mg;
    cl_int cpld = (cl_int)(cpp * 32);
    for (int64_t nb0 = 0; nb0 < npan; nb0 += cpp) { /* in-order queue: chunks reuse Cp one after another */
        cl_int b0 = (cl_int)nb0;
        if (c.err == CL_SUCCESS) c.err = clSetKernelArg(c.k, c.n, sizeof b0, &b0);
        if (c.err == CL_SUCCESS) c.err = clSetKernelArg(c.k, c.n + 1, sizeof cpld, &cpld);
        size_t global[3] = {(size_t)(npan - nb0 < cpp ? npan - nb0 : cpp), (size_t)ng, (size_t)nz};
        size_t local[3] = {1, 1, 1};
        SL_TRY(ocl_run(&c, 3, global, local));
    }
    return SL_OK;
}

/* Note [OpenCL bf16 linear]
 * LINEAR_BF16 (the projections of a bf16 inference model, Note [bf16 compute] in src/nn/llama.c) is
 * bf16(x) @ w^T with fp32 sums, its output rounded to bf16 when iparams[1]: the register GEMM with A's panels
 * rounded from f32 as they are packed (k_gemm_pack_ta_r: the CAST kernel's rounding, as the CPU rounds x's
 * rows once), B's widened exactly from bf16 (k_gemm_pack_tb_b / n_b) and the product rounded by the GEMM's
 * bf16 store (Note [OpenCL bf16 GEMM]). Only the order of the fp32 sums differs from the CPU kernel. */
static sl_status op_linear_bf16(sl_tensor *n) {
    const sl_tensor *x = n->src[0], *w = n->src[1];
    int nx = x->ndim;
    int64_t K = x->ne[nx - 1], N = n->ne[n->ndim - 1], M = 1;
    for (int d = 0; d < nx - 1; d++) M *= x->ne[d]; /* x's leading dims fold into rows (sl_linear_bf16) */
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
        return sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: linear_bf16 '%s' too large", n->name);
    ocl_ref rc, ra, rb;
    REF(n, &rc);
    REF(x, &ra);
    REF(w, &rb);
    int64_t lda = nx >= 2 ? x->nb[nx - 2] : K;
    cl_long4 bne = {{1, 1, 1, 1}}, z = {{0, 0, 0, 0}};
    return gemm_reg((int)M, (int)N, (int)K, ra, lda, 0, rb, w->nb[0], n->iparams[0], rc, N, 0, NULL, bne, z,
                    z, z, SL_BF16, 1, 0, n->iparams[1] != 0);
}

sl_status ocl_op_matmul(sl_tensor *n) {
    const sl_tensor *a = n->src[0], *b = n->src[1], *bias = n->src[2];
    int tA = n->iparams[0], tB = n->iparams[1];
    int na = a->ndim, nbd = b->ndim, no = n->ndim;
    int64_t K = tA ? a->ne[na - 2] : a->ne[na - 1], N = n->ne[no - 1], M;
    int64_t lda = a->nb[na - 2], ldb = b->nb[nbd - 2], ldc = n->nb[no - 2];
    ocl_ref rc, ra, rb, rbias;
    REF(n, &rc);
    REF(a, &ra);
    REF(b, &rb);
    if (bias)
        REF(bias, &rbias);
    else
        rbias = rc;
    cl_long4 bne = {{1, 1, 1, 1}}, bsa = {{0, 0, 0, 0}}, bsb = bsa, bsc = bsa;
    if (nbd == 2 && na > 2) { /* folded: a's leading dims are rows */
        M = 1;
        for (int d = 0; d < na - 1; d++) M *= a->ne[d];
        tA = 0;
        ldc = N;
    } else {
        M = n->ne[no - 2];
        ocl_it5 ia = ocl_it5_of(a), ib = ocl_it5_of(b), ic = ocl_it5_of(n);
        for (int d = 0; d < 3; d++) {
            bne.s[d] = ic.ne.s[d];
            bsa.s[d] = ia.nb.s[d];
            bsb.s[d] = ib.nb.s[d];
            bsc.s[d] = ic.nb.s[d];
        }
    }
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
        return sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: matmul '%s' too large", n->name);
    if (g_ocl.gemm_kind == OCL_GEMM_REG)
        return gemm_reg((int)M, (int)N, (int)K, ra, lda, tA, rb, ldb, tB, rc, ldc, n->iparams[2] == 1,
                        bias ? &rbias : NULL, bne, bsa, bsb, bsc, a->dtype, 0,
                        n->iparams[SL_MATMUL_IP_HALF_B] == SL_BF16,
                        n->iparams[SL_MATMUL_IP_ROUND] == SL_BF16);
    ocl_call c = ocl_begin(OK_GEMM);
    ocl_int(&c, (int)M);
    ocl_int(&c, (int)N);
    ocl_int(&c, (int)K);
    ocl_ref_arg(&c, ra);
    ocl_long(&c, lda);
    ocl_int(&c, tA);
    ocl_ref_arg(&c, rb);
    ocl_long(&c, ldb);
    ocl_int(&c, tB);
    ocl_ref_arg(&c, rc);
    ocl_long(&c, ldc);
    ocl_int(&c, n->iparams[2] == 1);
    ocl_ref_arg(&c, rbias);
    ocl_int(&c, bias != NULL);
    ocl_arg(&c, sizeof bne, &bne);
    ocl_arg(&c, sizeof bsa, &bsa);
    ocl_arg(&c, sizeof bsb, &bsb);
    ocl_arg(&c, sizeof bsc, &bsc);
    size_t ts = (size_t)g_ocl.gemm_ts, rts = ts / 4;
    size_t global[3] = {((size_t)N + ts - 1) / ts * rts, ((size_t)M + ts - 1) / ts * rts,
                        (size_t)(bne.s[0] * bne.s[1] * bne.s[2])};
    size_t local[3] = {rts, rts, 1};
    return ocl_run(&c, 3, global, local);
}

sl_status ocl_gemm(int M, int N, int K, ocl_ref a, int64_t lda, int tA, ocl_ref b, int64_t ldb, int tB,
                   ocl_ref c, int64_t ldc, int beta1, sl_dtype dt, int half_b, int round) {
    if (M <= 0 || N <= 0) return SL_OK;
    cl_long4 bne = {{1, 1, 1, 1}}, bs = {{0, 0, 0, 0}};
    if (g_ocl.gemm_kind == OCL_GEMM_REG)
        return gemm_reg(M, N, K, a, lda, tA, b, ldb, tB, c, ldc, beta1, NULL, bne, bs, bs, bs, dt, 0, half_b,
                        round);
    if (dt != SL_F32 || half_b || round) /* (refused in supports_op) */
        return sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: the tiled GEMM has no bf16 path");
    ocl_call k = ocl_begin(OK_GEMM);
    ocl_int(&k, M);
    ocl_int(&k, N);
    ocl_int(&k, K);
    ocl_ref_arg(&k, a);
    ocl_long(&k, lda);
    ocl_int(&k, tA);
    ocl_ref_arg(&k, b);
    ocl_long(&k, ldb);
    ocl_int(&k, tB);
    ocl_ref_arg(&k, c);
    ocl_long(&k, ldc);
    ocl_int(&k, beta1);
    ocl_ref_arg(&k, c);
    ocl_int(&k, 0);
    ocl_arg(&k, sizeof bne, &bne);
    ocl_arg(&k, sizeof bs, &bs);
    ocl_arg(&k, sizeof bs, &bs);
    ocl_arg(&k, sizeof bs, &bs);
    size_t ts = (size_t)g_ocl.gemm_ts, rts = ts / 4;
    size_t global[3] = {((size_t)N + ts - 1) / ts * rts, ((size_t)M + ts - 1) / ts * rts, 1};
    size_t local[3] = {rts, rts, 1};
    return ocl_run(&k, 3, global, local);
}

/* ---------------- dispatch ---------------- */

sl_status ocl_compute(sl_tensor *n) {
    ocl_ref o;
    switch (n->op) {
    case SL_OP_VIEW:
        return SL_OK;
    case SL_OP_CONT:
    case SL_OP_CAST:
        REF(n, &o);
        return op_copy(n, n->src[0], o, ocl_it5_of(n).nb,
                       n->op == SL_OP_CAST && n->dtype != n->src[0]->dtype);
    case SL_OP_CONCAT:
        return op_concat(n);
    case SL_OP_ADD:
        return op_binary(n, EW_ADD);
    case SL_OP_MUL:
        return op_binary(n, EW_MUL);
    case SL_OP_SCALE:
        return op_binary(n, EW_SCALE);
    case SL_OP_GELU:
        return op_binary(n, EW_GELU);
    case SL_OP_GELU_BACK:
        return op_binary(n, EW_GELU_BACK);
    case SL_OP_SILU:
        return op_binary(n, EW_SILU);
    case SL_OP_SILU_BACK:
        return op_binary(n, EW_SILU_BACK);
    case SL_OP_FILL:
        REF(n, &o);
        return ocl_ew_flat(EW_FILL, n->fparams[0], o.mem, o.off, sl_nelements(n));
    case SL_OP_SUM_TO:
        return op_sum_to(n);
    case SL_OP_ACC:
        return op_acc(n);
    case SL_OP_SCATTER_ADD:
        return op_scatter_add(n);
    case SL_OP_DROPOUT:
        return op_dropout(n);
    case SL_OP_ZEROS:
        return op_zeros(n);
    case SL_OP_KV_STORE:
        return op_kv_store(n);
    case SL_OP_MATMUL:
        return ocl_op_matmul(n);
    case SL_OP_LINEAR_BF16:
        return op_linear_bf16(n);
    default:
        if (ocl_moe_supports(n) >= 0) return ocl_op_moe(n);
        return ocl_op_nn(n);
    }
}
