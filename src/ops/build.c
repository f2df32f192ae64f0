/* Op builders: shape rules for every forward op. Programmer errors (impossible shapes) assert. */
#include <string.h>

#include "ops/ops_internal.h"

/* ---------------- views ---------------- */

sl_tensor *sl_view(sl_ctx *ctx, sl_tensor *a, int ndim, const int64_t *ne, const int64_t *nb, int64_t offs) {
    sl_tensor *t = sl_new_op(ctx, SL_OP_VIEW, a->dtype, ndim, ne);
    for (int d = 0; d < ndim; d++) t->nb[d] = nb[d];
    t->src[0] = a;
    t->view_src = a;
    t->view_offs = offs;
    /* bounds: the furthest element must lie inside a's extent */
    int64_t lo = offs, hi = offs, alo = 0, ahi = 0;
    for (int d = 0; d < ndim; d++)
        if (ne[d] > 0) hi += (ne[d] - 1) * nb[d];
    for (int d = 0; d < a->ndim; d++)
        if (a->ne[d] > 0) ahi += (a->ne[d] - 1) * a->nb[d];
    SL_ASSERT(lo >= alo && hi <= ahi);
    return t;
}

sl_tensor *sl_reshape(sl_ctx *ctx, sl_tensor *a, int ndim, const int64_t *ne) {
    SL_ASSERT(sl_is_contiguous(a));
    int64_t n = 1, nb[SL_MAX_DIMS];
    for (int d = 0; d < ndim; d++) n *= ne[d];
    SL_ASSERT(n == sl_nelements(a));
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        nb[d] = s;
        s *= ne[d];
    }
    return sl_view(ctx, a, ndim, ne, nb, 0);
}

sl_tensor *sl_reshape_2d(sl_ctx *ctx, sl_tensor *a, int64_t n0, int64_t n1) {
    return sl_reshape(ctx, a, 2, (int64_t[]){n0, n1});
}

sl_tensor *sl_permute(sl_ctx *ctx, sl_tensor *a, const int *perm) {
    int64_t ne[SL_MAX_DIMS], nb[SL_MAX_DIMS];
    int seen = 0;
    for (int d = 0; d < a->ndim; d++) {
        SL_ASSERT(perm[d] >= 0 && perm[d] < a->ndim && !(seen & (1 << perm[d])));
        seen |= 1 << perm[d];
        ne[d] = a->ne[perm[d]];
        nb[d] = a->nb[perm[d]];
    }
    return sl_view(ctx, a, a->ndim, ne, nb, 0);
}

sl_tensor *sl_transpose(sl_ctx *ctx, sl_tensor *a, int d0, int d1) {
    int perm[SL_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++) perm[d] = d;
    perm[d0] = d1;
    perm[d1] = d0;
    return sl_permute(ctx, a, perm);
}

sl_tensor *sl_slice(sl_ctx *ctx, sl_tensor *a, int dim, int64_t start, int64_t len) {
    SL_ASSERT(dim >= 0 && dim < a->ndim && start >= 0 && len >= 0 && start + len <= a->ne[dim]);
    int64_t ne[SL_MAX_DIMS];
    memcpy(ne, a->ne, sizeof ne);
    ne[dim] = len;
    return sl_view(ctx, a, a->ndim, ne, a->nb, start * a->nb[dim]);
}

void sl_split(sl_ctx *ctx, sl_tensor *a, int dim, int n, sl_tensor **out) {
    SL_ASSERT(n > 0 && a->ne[dim] % n == 0);
    int64_t len = a->ne[dim] / n;
    for (int i = 0; i < n; i++) out[i] = sl_slice(ctx, a, dim, i * len, len);
}

sl_tensor *sl_concat(sl_ctx *ctx, sl_tensor *a, sl_tensor *b, int dim) {
    SL_ASSERT(a->ndim == b->ndim && a->dtype == b->dtype && dim >= 0 && dim < a->ndim);
    int64_t ne[SL_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++) {
        SL_ASSERT(d == dim || a->ne[d] == b->ne[d]);
        ne[d] = d == dim ? a->ne[d] + b->ne[d] : a->ne[d];
    }
    sl_tensor *t = sl_new_op(ctx, SL_OP_CONCAT, a->dtype, a->ndim, ne);
    t->src[0] = a;
    t->src[1] = b;
    t->iparams[0] = dim;
    return t;
}

/* ---------------- elementwise ---------------- */

static sl_tensor *unary(sl_ctx *ctx, sl_op op, sl_tensor *a, sl_dtype dt) {
    sl_tensor *t = sl_new_op(ctx, op, dt, a->ndim, a->ne);
    t->src[0] = a;
    return t;
}

sl_tensor *sl_cont(sl_ctx *ctx, sl_tensor *a) { return unary(ctx, SL_OP_CONT, a, a->dtype); }

sl_tensor *sl_cast(sl_ctx *ctx, sl_tensor *a, sl_dtype t) {
    SL_ASSERT(a->dtype != SL_I32 && t != SL_I32);
    return unary(ctx, SL_OP_CAST, a, t);
}

int sl_can_broadcast(const sl_tensor *b, const sl_tensor *a) {
    if (b->ndim > a->ndim) return 0;
    for (int d = 0; d < b->ndim; d++) {
        int64_t nb_ = b->ne[b->ndim - 1 - d], na = a->ne[a->ndim - 1 - d];
        if (nb_ != na && nb_ != 1) return 0;
    }
    return 1;
}

static sl_tensor *binary(sl_ctx *ctx, sl_op op, sl_tensor *a, sl_tensor *b) {
    SL_ASSERT(a->dtype == SL_F32 && b->dtype == SL_F32);
    SL_ASSERT(sl_can_broadcast(b, a));
    sl_tensor *t = sl_new_op(ctx, op, a->dtype, a->ndim, a->ne);
    t->src[0] = a;
    t->src[1] = b;
    return t;
}

sl_tensor *sl_add(sl_ctx *ctx, sl_tensor *a, sl_tensor *b) { return binary(ctx, SL_OP_ADD, a, b); }
sl_tensor *sl_mul(sl_ctx *ctx, sl_tensor *a, sl_tensor *b) { return binary(ctx, SL_OP_MUL, a, b); }
sl_tensor *sl_bias(sl_ctx *ctx, sl_tensor *a, sl_tensor *b) {
    SL_ASSERT(b->ndim == 1 && b->ne[0] == a->ne[a->ndim - 1]);
    return binary(ctx, SL_OP_ADD, a, b);
}

sl_tensor *sl_scale(sl_ctx *ctx, sl_tensor *a, float s) {
    sl_tensor *t = unary(ctx, SL_OP_SCALE, a, a->dtype);
    t->fparams[0] = s;
    return t;
}

/* a bf16 `a` sums into f32 (each value widened exactly: a bf16 Linear gradient's bias sum, Note [Rounded
 * Linear outputs]); the CPU backend takes it as a contiguous (rows, C) -> (C) sum, the accelerators refuse it
 */
sl_tensor *sl_sum_to(sl_ctx *ctx, sl_tensor *a, const sl_tensor *like) {
    SL_ASSERT(sl_can_broadcast(like, a));
    sl_tensor *t =
        sl_new_op(ctx, SL_OP_SUM_TO, a->dtype == SL_BF16 ? SL_F32 : a->dtype, like->ndim, like->ne);
    t->src[0] = a;
    return t;
}

sl_tensor *sl_acc(sl_ctx *ctx, sl_tensor *dst, sl_tensor *src) {
    SL_ASSERT(sl_nelements(dst) == sl_nelements(src) && dst->dtype == SL_F32 && src->dtype == SL_F32);
    sl_tensor *t = sl_new_op(ctx, SL_OP_ACC, dst->dtype, dst->ndim, dst->ne);
    memcpy(t->nb, dst->nb, sizeof t->nb);
    t->src[0] = dst;
    t->src[1] = src;
    t->view_src = dst;
    return t;
}

int sl_try_accumulate_into(sl_tensor *c, sl_tensor *dst) {
    if (c->op != SL_OP_MATMUL || c->order >= 0 || c->view_src || c->iparams[2] || c->src[2] ||
        c->dtype != SL_F32 || dst->dtype != SL_F32 || c->ndim != 2 || !sl_same_shape(c, dst) ||
        !sl_is_contiguous(dst) || !sl_is_contiguous(c))
        return 0;
    c->iparams[2] = 1;
    c->view_src = dst;
    return 1;
}

sl_tensor *sl_fill(sl_ctx *ctx, sl_dtype dt, int ndim, const int64_t *ne, float value) {
    SL_ASSERT(dt == SL_F32);
    sl_tensor *t = sl_new_op(ctx, SL_OP_FILL, dt, ndim, ne);
    t->fparams[0] = value;
    return t;
}

sl_tensor *sl_zeros(sl_ctx *ctx, sl_dtype dt, int ndim, const int64_t *ne) {
    return sl_new_op(ctx, SL_OP_ZEROS, dt, ndim, ne);
}

/* Encodes the view geometry (offset, strides) of `view_of_dst` relative to dst's storage so that the
 * kernel can write src (shape == view's shape) into it. */
sl_tensor *sl_scatter_add(sl_ctx *ctx, sl_tensor *dst, sl_tensor *src, const sl_tensor *view_of_dst) {
    SL_ASSERT(sl_same_shape(src, view_of_dst) && view_of_dst->ndim <= 4);
    SL_ASSERT(dst->dtype == SL_F32 && src->dtype == SL_F32 && sl_is_contiguous(dst));
    sl_tensor *t = sl_new_op(ctx, SL_OP_SCATTER_ADD, dst->dtype, dst->ndim, dst->ne);
    t->src[0] = dst;
    t->src[1] = src;
    t->view_src = dst;
    t->iparams[0] = (int32_t)view_of_dst->view_offs;
    for (int d = 0; d < view_of_dst->ndim; d++) t->iparams[1 + d] = (int32_t)view_of_dst->nb[d];
    t->iparams[5] = view_of_dst->ndim;
    return t;
}

/* ---------------- matmul ---------------- */

static sl_tensor *matmul_node(sl_ctx *ctx, sl_tensor *a, sl_tensor *b, int transA, int transB);

sl_tensor *sl_matmul(sl_ctx *ctx, sl_tensor *a, sl_tensor *b, int transA, int transB) {
    /* operands both f32, both bf16 or both f16 (fp32 accumulation); the product is f32 */
    SL_ASSERT(a->ndim >= 2 && b->ndim >= 2 && a->dtype == b->dtype &&
              (a->dtype == SL_F32 || a->dtype == SL_BF16 || a->dtype == SL_F16));
    return matmul_node(ctx, a, b, transA, transB);
}

sl_tensor *sl_matmul_half_b(sl_ctx *ctx, sl_tensor *a, sl_tensor *b, int transA, int transB) {
    SL_ASSERT(a->ndim >= 2 && b->ndim == 2 && a->dtype == SL_BF16 && b->dtype == SL_F32 && !transA);
    sl_tensor *t = matmul_node(ctx, a, b, transA, transB);
    t->iparams[SL_MATMUL_IP_HALF_B] = SL_BF16;
    return t;
}

sl_tensor *sl_linear_half_w(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, sl_tensor *b) {
    sl_tensor *y = sl_matmul_half_b(ctx, x, w, 0, 1);
    if (b && b->dtype == SL_F32 && b->ndim == 1 && b->ne[0] == y->ne[y->ndim - 1]) {
        y->src[2] = b; /* bias added by the GEMM */
        return y;
    }
    return b ? sl_bias(ctx, y, b) : y;
}

sl_tensor *sl_linear_half_w_rounded(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, sl_tensor *b) {
    sl_tensor *y = sl_linear_half_w(ctx, x, w, b);
    if (y->op != SL_OP_MATMUL) return sl_round_half(ctx, y, SL_BF16); /* a bias the GEMM could not take */
    y->iparams[SL_MATMUL_IP_ROUND] = SL_BF16; /* Note [Rounded Linear outputs] (gemm.c) */
    return y;
}

static sl_tensor *matmul_node(sl_ctx *ctx, sl_tensor *a, sl_tensor *b, int transA, int transB) {
    SL_ASSERT(a->nb[a->ndim - 1] == 1 && b->nb[b->ndim - 1] == 1); /* rows contiguous */
    int64_t aM = transA ? a->ne[a->ndim - 1] : a->ne[a->ndim - 2];
    int64_t aK = transA ? a->ne[a->ndim - 2] : a->ne[a->ndim - 1];
    int64_t bK = transB ? b->ne[b->ndim - 1] : b->ne[b->ndim - 2];
    int64_t bN = transB ? b->ne[b->ndim - 2] : b->ne[b->ndim - 1];
    SL_ASSERT(aK == bK);
    int64_t ne[SL_MAX_DIMS];
    int nd;
    if (b->ndim == 2 && a->ndim > 2) {
        /* linear layer: a's leading dims fold into M; they must be uniformly strided */
        SL_ASSERT(!transA);
        for (int d = 0; d < a->ndim - 2; d++)
            SL_ASSERT(a->ne[d + 1] == 1 || a->nb[d] == a->nb[d + 1] * a->ne[d + 1]);
        nd = a->ndim;
        for (int d = 0; d < nd - 1; d++) ne[d] = a->ne[d];
        ne[nd - 1] = bN;
    } else {
        SL_ASSERT(a->ndim == b->ndim && a->ndim <= 5);
        for (int d = 0; d < a->ndim - 2; d++) SL_ASSERT(a->ne[d] == b->ne[d]);
        nd = a->ndim;
        for (int d = 0; d < nd - 2; d++) ne[d] = a->ne[d];
        ne[nd - 2] = aM;
        ne[nd - 1] = bN;
    }
    sl_tensor *t = sl_new_op(ctx, SL_OP_MATMUL, SL_F32, nd, ne);
    t->src[0] = a;
    t->src[1] = b;
    t->iparams[0] = transA;
    t->iparams[1] = transB;
    return t;
}

sl_tensor *sl_linear(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, sl_tensor *b) {
    sl_tensor *y = sl_matmul(ctx, x, w, 0, 1);
    if (b && b->dtype == SL_F32 && b->ndim == 1 && b->ne[0] == y->ne[y->ndim - 1] && w->ndim == 2) {
        y->src[2] = b; /* bias added by the GEMM (sl_sgemm_bias): no separate pass over y */
        return y;
    }
    return b ? sl_bias(ctx, y, b) : y;
}

/* ---------------- nn ops ---------------- */

sl_tensor *sl_gelu(sl_ctx *ctx, sl_tensor *a) {
    SL_ASSERT(a->dtype == SL_F32);
    return unary(ctx, SL_OP_GELU, a, a->dtype);
}

sl_tensor *sl_layernorm(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, sl_tensor *b, float eps) {
    int64_t C = x->ne[x->ndim - 1];
    SL_ASSERT(x->dtype == SL_F32 && x->nb[x->ndim - 1] == 1);
    SL_ASSERT(w->ndim == 1 && w->ne[0] == C && b->ndim == 1 && b->ne[0] == C);
    sl_tensor *t = unary(ctx, SL_OP_LAYERNORM, x, SL_F32);
    t->src[1] = w;
    t->src[2] = b;
    t->fparams[0] = eps;
    t->aux_bytes = 2 * sizeof(float) * (size_t)(sl_nelements(x) / (C ? C : 1));
    return t;
}

sl_tensor *sl_softmax(sl_ctx *ctx, sl_tensor *a) {
    SL_ASSERT(a->dtype == SL_F32);
    return unary(ctx, SL_OP_SOFTMAX, a, a->dtype);
}

sl_tensor *sl_attention(sl_ctx *ctx, sl_tensor *q, sl_tensor *k, sl_tensor *v) {
    return sl_attention_window(ctx, q, k, v, 0);
}

sl_tensor *sl_attention_window(sl_ctx *ctx, sl_tensor *q, sl_tensor *k, sl_tensor *v, int window) {
    SL_ASSERT(q->ndim == 4 && k->ndim == 4 && v->ndim == 4);
    SL_ASSERT(q->dtype == SL_F32 && k->dtype == SL_F32 && v->dtype == SL_F32);
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3];
    SL_ASSERT(sl_same_shape(k, v) && k->ne[0] == B && k->ne[1] == T && k->ne[3] == hs);
    SL_ASSERT(k->ne[2] > 0 && NH % k->ne[2] == 0);
    SL_ASSERT(q->nb[3] == 1 && k->nb[3] == 1 && v->nb[3] == 1);
    sl_tensor *t = sl_new_op(ctx, SL_OP_ATTENTION, SL_F32, 3, (int64_t[]){B, T, NH * hs});
    t->src[0] = q;
    t->src[1] = k;
    t->src[2] = v;
    t->iparams[1] = window > 0 && window < T ? window : 0;
    t->aux_bytes = sizeof(float) * (size_t)(B * NH * T); /* per-row logsumexp (B, NH, T) for backward */
    return t;
}

/* Note [Dropout from counters]
 * A dropout mask is never drawn from a stateful generator: element e of a dropout site keeps its value iff
 * u >= p * 2^32, u = Philox-4x32-10(key = seed, counter = (stream * 2^16 + site, e / 4)) word e % 4
 * (sl_rng_dropout, src/base/rng.c), and kept values are scaled by 1 / (1 - p) (inverted dropout, as
 * torch.nn.functional.dropout). stream is the global micro-batch counter, step * (dp * accum) + micro (the
 * micro-batch index a single process gives the same batch), site names the layer and place, e is the
 * element's index in the full logical tensor. So the mask depends on nothing else: not on the thread count
 * or partition, not on the data-parallel split (a DP rank draws the masks of the micro-batches it runs),
 * and the backward regenerates the forward's mask from the same counters instead of storing it:
 * DROPOUT's gradient is a DROPOUT node with the same parameters, and ATTENTION_BACK reads them from its
 * forward node (or, on the CPU, the forward's mask kept as bits in the node's aux area: Note [Attention
 * dropout bits] in suanli/tensor.h; the same mask, drawn once). For attention the dropped elements are the
 * probabilities P (B, NH, T, T), e = ((b NH + h) T
 * + i) T + j; the softmax denominator is the undropped one, as in torch's softmax followed by dropout.
 * A graph is built with dropout off (SL_DROPOUT_IP_ON = 0: the identity), so evaluation and generation
 * run without it; the trainer turns it on for each training micro-batch (sl_graph_set_dropout). Tensor and
 * sequence parallelism keep "the index in the full logical tensor": a TP rank's attention node holds query
 * heads [HEAD0, + NH) of HEADS, so its element (b, h, i, j) is number ((b HEADS + HEAD0 + h) T + i) T + j,
 * and a dropout node on an SP sequence shard (B, Tl, R) holds positions [T0, + Tl) of SEQ, its row (b, t)
 * starting at (b SEQ + T0 + t) R (SL_DROPOUT_IP_* in tensor.h; set by sl_model_*_dropout). */
static void set_dropout(sl_tensor *t, float p, int site) {
    SL_ASSERT(p >= 0.0f && p < 1.0f && site >= 0 && site < 65536);
    t->fparams[0] = p;
    t->iparams[SL_DROPOUT_IP_ON] = 0;
    t->iparams[SL_DROPOUT_IP_SITE] = site;
}

sl_tensor *sl_dropout(sl_ctx *ctx, sl_tensor *x, float p, int site) {
    SL_ASSERT(x->dtype == SL_F32);
    if (!sl_is_contiguous(x)) x = sl_cont(ctx, x);
    sl_tensor *t = unary(ctx, SL_OP_DROPOUT, x, SL_F32);
    set_dropout(t, p, site);
    return t;
}

/* Note [Hidden dropout bits]
 * The model's hidden dropouts sit before a residual add (nanoGPT's resid_dropout and mlp.dropout, Megatron's
 * bias-dropout-add) or alone (the embedding's). sl_dropout_add builds them as one DROPOUT node: src1 = the
 * residual, out = res + x * m (the product rounded, then the add: the bits of add(res, dropout(x)); the
 * kernels keep contraction off), one pass instead of two. Its aux area keeps the mask as bits (Note
 * [Dropout bits], src/device/cpu/kernels/kernels.h): 128 bytes per 1,024-element chunk of the kernel's
 * walk (a sequence shard walks B rows of chunks, hence the B spare chunks), after the 32-byte header. The
 * backward DROPOUT links the forward node as src2 and reads the bits instead of drawing the Philox mask a
 * second time. The link keeps the forward node's buffer until then; it holds the residual stream, which the
 * next norm's backward (just before) reads anyway, so the planned memory hardly moves. The Philox draws of
 * the backward were ~2 % of the baby model's bf16 step; the separate residual add another ~2 %. */
sl_tensor *sl_dropout_add(sl_ctx *ctx, sl_tensor *x, sl_tensor *res, float p, int site) {
    sl_tensor *t = sl_dropout(ctx, x, p, site);
    if (res) {
        SL_ASSERT(res->dtype == SL_F32 && sl_same_shape(res, t));
        t->src[1] = sl_is_contiguous(res) ? res : sl_cont(ctx, res);
    }
    if (p > 0.0f) t->aux_bytes = sl_dropout_bits_bytes(t);
    return t;
}

sl_tensor *sl_attention_dropout(sl_tensor *attn, float p, int site) {
    SL_ASSERT(attn->op == SL_OP_ATTENTION);
    set_dropout(attn, p, site);
    int64_t B = attn->src[0]->ne[0], T = attn->src[0]->ne[1], NH = attn->src[0]->ne[2];
    attn->aux_bytes =
        sizeof(float) * (size_t)(B * NH * T); /* lse, then the mask (Note [Attention dropout bits]) */
    if (p > 0.0f) attn->aux_bytes += sl_attn_dropout_bits_bytes(B, NH, T);
    return attn;
}

sl_tensor *sl_embedding(sl_ctx *ctx, sl_tensor *table, sl_tensor *ids) {
    SL_ASSERT(table->ndim == 2 && table->dtype == SL_F32 && sl_is_contiguous(table));
    SL_ASSERT(ids->dtype == SL_I32 && ids->ndim < SL_MAX_DIMS && sl_is_contiguous(ids));
    int64_t ne[SL_MAX_DIMS];
    for (int d = 0; d < ids->ndim; d++) ne[d] = ids->ne[d];
    ne[ids->ndim] = table->ne[1];
    sl_tensor *t = sl_new_op(ctx, SL_OP_EMBEDDING, SL_F32, ids->ndim + 1, ne);
    t->src[0] = table;
    t->src[1] = ids;
    return t;
}

sl_tensor *sl_cross_entropy(sl_ctx *ctx, sl_tensor *logits, sl_tensor *targets) {
    SL_ASSERT(logits->dtype == SL_F32 && targets->dtype == SL_I32 && sl_is_contiguous(logits));
    SL_ASSERT(targets->ndim == logits->ndim - 1 && sl_is_contiguous(targets));
    for (int d = 0; d < targets->ndim; d++) SL_ASSERT(targets->ne[d] == logits->ne[d]);
    sl_tensor *t = sl_new_op(ctx, SL_OP_CROSS_ENTROPY, SL_F32, 1, (int64_t[]){1});
    t->src[0] = logits;
    t->src[1] = targets;
    t->aux_bytes = sizeof(float) * (size_t)sl_nelements(targets); /* per-row logsumexp */
    t->flags |= SL_FLAG_LOSS;
    return t;
}

/* ---------------- Llama family (issue 7) ---------------- */

sl_tensor *sl_rmsnorm(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, float eps) {
    int64_t C = x->ne[x->ndim - 1];
    SL_ASSERT(x->dtype == SL_F32 && x->nb[x->ndim - 1] == 1);
    SL_ASSERT(!w || (w->dtype == SL_F32 && w->ndim == 1 && w->ne[0] == C && sl_is_contiguous(w)));
    for (int d = 0; d + 1 < x->ndim - 1; d++)
        SL_ASSERT(x->ne[d + 1] == 1 || x->nb[d] == x->nb[d + 1] * x->ne[d + 1]);
    sl_tensor *t = unary(ctx, SL_OP_RMSNORM, x, SL_F32);
    t->src[1] = w;
    t->fparams[0] = eps;
    t->aux_bytes = sizeof(float) * (size_t)(C ? sl_nelements(x) / C : 0);
    return t;
}

sl_tensor *sl_rope(sl_ctx *ctx, sl_tensor *x, int pos0, float theta) {
    SL_ASSERT(x->ndim == 4 && x->dtype == SL_F32 && x->nb[3] == 1 && x->ne[3] % 2 == 0);
    SL_ASSERT(pos0 >= 0 && theta > 0);
    sl_tensor *t = unary(ctx, SL_OP_ROPE, x, SL_F32);
    t->iparams[0] = pos0;
    t->iparams[1] = 0;
    t->fparams[0] = theta;
    return t;
}

sl_tensor *sl_silu(sl_ctx *ctx, sl_tensor *a) {
    SL_ASSERT(a->dtype == SL_F32);
    return unary(ctx, SL_OP_SILU, a, SL_F32);
}

sl_tensor *sl_topk_gate(sl_ctx *ctx, sl_tensor *logits, int k) {
    SL_ASSERT(logits->ndim == 2 && logits->dtype == SL_F32 && logits->nb[1] == 1);
    SL_ASSERT(k >= 1 && k <= logits->ne[1]);
    sl_tensor *t = unary(ctx, SL_OP_TOPK_GATE, logits, SL_F32);
    t->iparams[0] = k;
    return t;
}

sl_tensor *sl_attention_kv(sl_ctx *ctx, sl_tensor *q, sl_tensor *kc, sl_tensor *vc, int pos0, int window) {
    SL_ASSERT(q->ndim == 4 && kc->ndim == 4 && sl_same_shape(kc, vc));
    SL_ASSERT(q->dtype == SL_F32 && kc->dtype == SL_F32 && vc->dtype == SL_F32);
    SL_ASSERT(sl_is_contiguous(kc) && sl_is_contiguous(vc) && q->nb[3] == 1);
    int64_t B = q->ne[0], Tq = q->ne[1], NH = q->ne[2], hs = q->ne[3];
    SL_ASSERT(kc->ne[0] == B && kc->ne[3] == hs && kc->ne[2] > 0 && NH % kc->ne[2] == 0);
    SL_ASSERT(pos0 >= 0 && pos0 + Tq <= kc->ne[1] && window >= 0);
    sl_tensor *t = sl_new_op(ctx, SL_OP_ATTENTION_KV, SL_F32, 3, (int64_t[]){B, Tq, NH * hs});
    t->src[0] = q;
    t->src[1] = kc;
    t->src[2] = vc;
    t->iparams[0] = pos0;
    t->iparams[1] = window;
    return t;
}

sl_tensor *sl_kv_store(sl_ctx *ctx, sl_tensor *cache, sl_tensor *x, int pos0) {
    SL_ASSERT(cache->ndim == 4 && x->ndim == 4 && cache->dtype == SL_F32 && x->dtype == SL_F32);
    SL_ASSERT(sl_is_contiguous(cache) && x->nb[3] == 1);
    SL_ASSERT(x->ne[0] == cache->ne[0] && x->ne[2] == cache->ne[2] && x->ne[3] == cache->ne[3]);
    SL_ASSERT(pos0 >= 0 && pos0 + x->ne[1] <= cache->ne[1]);
    sl_tensor *t = sl_new_op(ctx, SL_OP_KV_STORE, SL_F32, 4, cache->ne);
    t->src[0] = cache;
    t->src[1] = x;
    t->view_src = cache;
    t->iparams[0] = pos0;
    return t;
}

sl_tensor *sl_linear_bf16(sl_ctx *ctx, sl_tensor *x, sl_tensor *w, int round_out) {
    SL_ASSERT(x->dtype == SL_F32 && w->dtype == SL_BF16 && w->ndim == 2 && sl_is_contiguous(w));
    SL_ASSERT(x->ndim >= 1 && x->nb[x->ndim - 1] == 1 && x->ne[x->ndim - 1] == w->ne[1]);
    for (int d = 0; d + 1 < x->ndim - 1; d++)
        SL_ASSERT(x->ne[d + 1] == 1 || x->nb[d] == x->nb[d + 1] * x->ne[d + 1]);
    int64_t ne[SL_MAX_DIMS];
    for (int d = 0; d < x->ndim - 1; d++) ne[d] = x->ne[d];
    ne[x->ndim - 1] = w->ne[0];
    sl_tensor *t = sl_new_op(ctx, SL_OP_LINEAR_BF16, SL_F32, x->ndim, ne);
    t->src[0] = x;
    t->src[1] = w;
    t->iparams[0] = 1;
    t->iparams[1] = round_out;
    return t;
}

sl_tensor *sl_round_bf16(sl_ctx *ctx, sl_tensor *x) { return sl_round_half(ctx, x, SL_BF16); }
sl_tensor *sl_round_half(sl_ctx *ctx, sl_tensor *x, sl_dtype half) {
    SL_ASSERT(half == SL_BF16 || half == SL_F16);
    return sl_cast(ctx, sl_cast(ctx, x, half), SL_F32);
}

sl_tensor *sl_moe_expert(sl_ctx *ctx, sl_tensor *h, sl_tensor *gate, int e, sl_tensor *w1, sl_tensor *w3,
                         sl_tensor *w2, int bf16) {
    SL_ASSERT(h->ndim == 2 && h->dtype == SL_F32 && sl_is_contiguous(h));
    SL_ASSERT(gate->ndim == 2 && gate->dtype == SL_F32 && gate->ne[0] == h->ne[0] && gate->nb[1] == 1 &&
              e >= 0 && e < gate->ne[1]);
    int64_t C = h->ne[1], I = w1->ne[0];
    SL_ASSERT(w1->ndim == 2 && w3->ndim == 2 && w2->ndim == 2 && w1->ne[1] == C && w3->ne[0] == I &&
              w3->ne[1] == C);
    SL_ASSERT(w2->ne[0] == C && w2->ne[1] == I && sl_is_contiguous(w1) && sl_is_contiguous(w3) &&
              sl_is_contiguous(w2));
    SL_ASSERT(w1->dtype == w3->dtype && w1->dtype == w2->dtype &&
              (w1->dtype == SL_F32 || w1->dtype == SL_BF16));
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EXPERT, SL_F32, 2, h->ne);
    t->src[0] = h;
    t->src[1] = gate;
    t->src[2] = w1;
    t->src[3] = w3;
    t->src[4] = w2;
    t->iparams[0] = e;
    t->iparams[1] = bf16;
    return t;
}
