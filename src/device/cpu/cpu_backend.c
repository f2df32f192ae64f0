/* The CPU backend: host memory buffers and the per-op kernel table. */
#include <omp.h>
#include <string.h>

#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/llama_ops.h"
#include "device/cpu/kernels/moe.h"
#include "suanli/device.h"

typedef sl_status (*kernel_fn)(sl_tensor *n);

static const kernel_fn k_kernels[SL_OP_COUNT] = {
    [SL_OP_CONT] = sl_k_cont,
    [SL_OP_CAST] = sl_k_cast,
    [SL_OP_ADD] = sl_k_add,
    [SL_OP_MUL] = sl_k_mul,
    [SL_OP_SCALE] = sl_k_scale,
    [SL_OP_SUM_TO] = sl_k_sum_to,
    [SL_OP_ACC] = sl_k_acc,
    [SL_OP_ZEROS] = sl_k_zeros,
    [SL_OP_SCATTER_ADD] = sl_k_scatter_add,
    [SL_OP_MATMUL] = sl_k_matmul,
    [SL_OP_GELU] = sl_k_gelu,
    [SL_OP_GELU_BACK] = sl_k_gelu_back,
    [SL_OP_LAYERNORM] = sl_k_layernorm,
    [SL_OP_LAYERNORM_BACK_X] = sl_k_layernorm_back_x,
    [SL_OP_LAYERNORM_BACK_WB] = sl_k_layernorm_back_wb,
    [SL_OP_SOFTMAX] = sl_k_softmax,
    [SL_OP_SOFTMAX_BACK] = sl_k_softmax_back,
    [SL_OP_ATTENTION] = sl_k_attention,
    [SL_OP_ATTENTION_BACK] = sl_k_attention_back,
    [SL_OP_EMBEDDING] = sl_k_embedding,
    [SL_OP_EMBEDDING_BACK] = sl_k_embedding_back,
    [SL_OP_CROSS_ENTROPY] = sl_k_cross_entropy,
    [SL_OP_CROSS_ENTROPY_BACK] = sl_k_cross_entropy_back,
    [SL_OP_CE_VP_STATS] = sl_k_ce_vp_stats,
    [SL_OP_CE_VP] = sl_k_ce_vp,
    [SL_OP_CE_VP_BACK] = sl_k_ce_vp_back,
    [SL_OP_CONCAT] = sl_k_concat,
    [SL_OP_RMSNORM] = sl_k_rmsnorm,
    [SL_OP_RMSNORM_BACK_X] = sl_k_rmsnorm_back_x,
    [SL_OP_RMSNORM_BACK_W] = sl_k_rmsnorm_back_w,
    [SL_OP_ROPE] = sl_k_rope,
    [SL_OP_SILU] = sl_k_silu,
    [SL_OP_SILU_BACK] = sl_k_silu_back,
    [SL_OP_TOPK_GATE] = sl_k_topk_gate,
    [SL_OP_TOPK_GATE_BACK] = sl_k_topk_gate_back,
    [SL_OP_ATTENTION_KV] = sl_k_attention_kv,
    [SL_OP_KV_STORE] = sl_k_kv_store,
    [SL_OP_LINEAR_BF16] = sl_k_linear_bf16,
    [SL_OP_MOE_EXPERT] = sl_k_moe_expert,
    [SL_OP_FILL] = sl_k_fill,
    [SL_OP_MOE_ROUTE] = sl_k_moe_route,
    [SL_OP_MOE_ROUTE_BACK] = sl_k_moe_route_back,
    [SL_OP_MOE_ROUTER_LOSS] = sl_k_moe_router_loss,
    [SL_OP_MOE_ROUTER_LOSS_BACK] = sl_k_moe_router_loss_back,
    [SL_OP_MOE_GATHER] = sl_k_moe_gather,
    [SL_OP_MOE_COMBINE] = sl_k_moe_combine,
    [SL_OP_MOE_COMBINE_BACK_GATE] = sl_k_moe_combine_back_gate,
    [SL_OP_MOE_EXPERT_FFN] = sl_k_moe_expert_ffn,
    [SL_OP_MOE_EXPERT_FFN_BACK] = sl_k_moe_expert_ffn_back,
    [SL_OP_MOE_EXPERT_FFN_BACK_X] = sl_k_moe_expert_ffn_back_x,
    [SL_OP_MOE_EP_COUNTS] = sl_k_moe_ep_counts,
    [SL_OP_MOE_EP_PACK] = sl_k_moe_ep_pack,
    [SL_OP_MOE_EP_UNPACK] = sl_k_moe_ep_unpack,
    [SL_OP_MOE_EP_UNPACK_BACK_GATE] = sl_k_moe_ep_unpack_back_gate,
    [SL_OP_MOE_EP_GATHER] = sl_k_moe_ep_gather,
    [SL_OP_MOE_EP_SCATTER] = sl_k_moe_ep_scatter,
    [SL_OP_DROPOUT] = sl_k_dropout,
    [SL_OP_MOE_PACKED_FFN] = sl_k_moe_packed_ffn,
    [SL_OP_MOE_PACKED_FFN_BACK] = sl_k_moe_packed_ffn_back,
    [SL_OP_MOE_PACKED_FFN_BACK_W] = sl_k_moe_packed_ffn_back_w,
    [SL_OP_MOE_PACKED_FFN_DX] = sl_k_moe_packed_ffn_dx,
    [SL_OP_MOE_EP_REGROUP] = sl_k_moe_ep_regroup,
};

/* Note [First touch]
 * Linux places a page on the NUMA node of the thread that first writes it. A buffer zeroed by the
 * allocating thread alone would sit on one node, and the threads of the other node would read it across
 * the interconnect for the whole run. Large buffers (parameters, gradients, moments, the activation arena)
 * are therefore zeroed by the OpenMP team in equal contiguous page-aligned parts, thread t the t-th part:
 * the same static partition the flat-buffer kernels (AdamW, sum of squares, scale, fill; schedule(static))
 * use, so each thread's pages are local to it once `suanli run --bind` has pinned the rank and
 * OMP_PROC_BIND its threads. (GEMM tiles are not partitioned that way; their reads are mostly cache-blocked.)
 */
static void first_touch_zero(char *p, size_t n) {
    if (n < ((size_t)1 << 20)) {
        memset(p, 0, n);
        return;
    }
#pragma omp parallel
    {
        size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t per = ((n + nt - 1) / nt + 4095) & ~(size_t)4095, lo = per * t;
        if (lo < n) memset(p + lo, 0, n - lo < per ? n - lo : per);
    }
}

static sl_status cpu_alloc(sl_backend *be, size_t bytes, sl_buffer **out) {
    sl_buffer *b = calloc(1, sizeof *b);
    if (!b) return sl_fail(SL_ERR_NOMEM, "cpu backend: out of memory");
    b->base = sl_malloc_aligned(bytes ? bytes : 64);
    if (!b->base) {
        free(b);
        return sl_fail(SL_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
    }
    first_touch_zero(b->base, bytes); /* Note [First touch] */
    b->size = bytes;
    b->backend = be;
    *out = b;
    return SL_OK;
}
static char k_wrapped; /* impl marker: the memory belongs to the caller */
static sl_status cpu_from_host(sl_backend *be, void *ptr, size_t bytes, sl_buffer **out) {
    sl_buffer *b = calloc(1, sizeof *b);
    if (!b) return sl_fail(SL_ERR_NOMEM, "cpu backend: out of memory");
    *b = (sl_buffer){.backend = be, .base = ptr, .size = bytes, .impl = &k_wrapped};
    *out = b;
    return SL_OK;
}
static void cpu_free(sl_backend *be, sl_buffer *b) {
    (void)be;
    if (b->impl != &k_wrapped) sl_free_aligned(b->base);
    free(b);
}
/* Ranges are checked by the generic helpers (src/device/registry.c) before these run. */
static sl_status cpu_copy_in(sl_buffer *dst, size_t off, const void *host, size_t n) {
    memcpy((char *)dst->base + off, host, n);
    return SL_OK;
}
static sl_status cpu_copy_out(const sl_buffer *src, size_t off, void *host, size_t n) {
    memcpy(host, (const char *)src->base + off, n);
    return SL_OK;
}
static sl_status cpu_memset_zero(sl_buffer *b, size_t off, size_t n) {
    if (off > b->size || n > b->size - off)
        return sl_fail(SL_ERR_INVALID, "cpu backend: memset out of range");
    memset((char *)b->base + off, 0, n);
    return SL_OK;
}
static sl_status cpu_copy(sl_buffer *dst, size_t doff, const sl_buffer *src, size_t soff, size_t n) {
    if (doff > dst->size || n > dst->size - doff || soff > src->size || n > src->size - soff)
        return sl_fail(SL_ERR_INVALID, "cpu backend: copy of %zu bytes out of range", n);
    memmove((char *)dst->base + doff, (const char *)src->base + soff, n);
    return SL_OK;
}

/* ---- state operations ---- */
static int span_ok(const sl_buffer *b, int64_t off, int64_t n) {
    return b && off >= 0 && n >= 0 && (size_t)(off + n) * sizeof(float) <= b->size;
}
static sl_status cpu_adamw(sl_backend *be, const sl_adamw_call *c) {
    (void)be;
    for (int i = 0; i < c->n_spans; i++) {
        const sl_adamw_span *s = &c->spans[i];
        if (!span_ok(c->p, s->p_offs, s->n) || !span_ok(c->g, s->g_offs, s->n) ||
            !span_ok(c->m, s->s_offs, s->n) || !span_ok(c->v, s->s_offs, s->n))
            return sl_fail(SL_ERR_INVALID, "cpu backend: adamw span %d out of range", i);
    }
    sl_k_adamw(c->p->base, c->g->base, c->m->base, c->v->base, c->spans, c->n_spans, c->lr, c->gscale, c->hp,
               c->t);
    return SL_OK;
}
static sl_status cpu_sumsq(sl_backend *be, const sl_buffer *b, int64_t off, int64_t n, double *out) {
    (void)be;
    if (!span_ok(b, off, n)) return sl_fail(SL_ERR_INVALID, "cpu backend: sumsq out of range");
    *out = sl_k_sumsq((const float *)b->base + off, n);
    return SL_OK;
}
static sl_status cpu_scale(sl_backend *be, sl_buffer *b, int64_t off, int64_t n, float s) {
    (void)be;
    if (!span_ok(b, off, n)) return sl_fail(SL_ERR_INVALID, "cpu backend: scale out of range");
    sl_k_scale_span((float *)b->base + off, n, s);
    return SL_OK;
}
static sl_status cpu_fill(sl_backend *be, sl_buffer *b, int64_t off, int64_t n, float v) {
    (void)be;
    if (!span_ok(b, off, n)) return sl_fail(SL_ERR_INVALID, "cpu backend: fill out of range");
    sl_k_fill_span((float *)b->base + off, n, v);
    return SL_OK;
}

static int cpu_supports(sl_backend *be, const sl_tensor *n) {
    (void)be;
    if (n->op == SL_OP_VIEW) return 1;
    if ((int)n->op <= 0 || n->op >= SL_OP_COUNT || !k_kernels[n->op]) return 0;
    switch (n->op) {
    case SL_OP_CONT:
    case SL_OP_CONCAT:
    case SL_OP_ZEROS:
        return 1;    /* byte movement: any dtype */
    case SL_OP_CAST: /* f32 <-> bf16, f32 <-> f16 */
        return n->dtype != SL_I32 && n->src[0]->dtype != SL_I32 &&
               (n->dtype == SL_F32 || n->src[0]->dtype == SL_F32 || n->dtype == n->src[0]->dtype);
    case SL_OP_MATMUL: /* f32 x f32, bf16 x bf16 (sl_gemm_bf16) or f16 x f16 (widened), f32 out; bf16 x f32
                        * rounded to bf16 (Note [Fused weight casts]) */
        if (n->iparams[SL_MATMUL_IP_HALF_B])
            return n->dtype == SL_F32 && n->iparams[SL_MATMUL_IP_HALF_B] == SL_BF16 &&
                   n->src[0]->dtype == SL_BF16 && n->src[1]->dtype == SL_F32 &&
                   (!n->src[2] || n->src[2]->dtype == SL_F32);
        return n->dtype == SL_F32 && n->src[0]->dtype == n->src[1]->dtype &&
               (n->src[0]->dtype == SL_F32 || n->src[0]->dtype == SL_BF16 || n->src[0]->dtype == SL_F16) &&
               (!n->src[2] || n->src[2]->dtype == SL_F32);
    case SL_OP_LINEAR_BF16:
    case SL_OP_MOE_EXPERT:
        return 1;
    case SL_OP_GELU: /* f32 in; f32 out, or bf16 (Note [Half outputs], src/graph/fuse.c) */
    case SL_OP_GELU_BACK:
    case SL_OP_LAYERNORM:
    case SL_OP_DROPOUT: /* bf16 out without a residual */
        for (int i = 0; i < SL_MAX_SRC; i++)
            if (n->src[i] && n->src[i]->dtype != SL_F32) return 0;
        /* a bf16 LAYERNORM keeps its f32 statistics right after its output: an even count keeps them aligned
         */
        return n->dtype == SL_F32 ||
               (n->dtype == SL_BF16 && sl_is_contiguous(n) && !(n->op == SL_OP_DROPOUT && n->src[1]) &&
                !(n->op == SL_OP_LAYERNORM && sl_nelements(n) % 2));
    case SL_OP_LAYERNORM_BACK_X: /* f32; src0, the forward node, only for its statistics (any output dtype) */
    case SL_OP_LAYERNORM_BACK_WB:
        for (int i = 1; i < SL_MAX_SRC; i++)
            if (n->src[i] && n->src[i]->dtype != SL_F32) return 0;
        return n->dtype == SL_F32;
    case SL_OP_SUM_TO: /* f32, or a contiguous bf16 (rows, C) summed into f32 C (a bias gradient) */
        if (n->src[0]->dtype == SL_BF16)
            return n->dtype == SL_F32 && n->ndim == 1 && sl_is_contiguous(n->src[0]) &&
                   n->src[0]->ne[n->src[0]->ndim - 1] == n->ne[0];
        return n->dtype == SL_F32 && n->src[0]->dtype == SL_F32;
    default:
        for (int i = 0; i < SL_MAX_SRC; i++) {
            const sl_tensor *s = n->src[i];
            if (!s) continue;
            if (s->dtype == SL_BF16 || s->dtype == SL_F16) return 0; /* half: casts and matmul only */
        }
        return n->dtype == SL_F32;
    }
}

static sl_status cpu_compute(sl_backend *be, sl_tensor *n) {
    be->stats.nodes++;
    return k_kernels[n->op](n);
}

static sl_backend g_cpu = {
    .name = "cpu",
    .caps = {.alignment = 64, .host_visible = 1, .async_copies = 0, .donate_inputs = 1, .matmul_half_b = 1},
    .buffer_alloc = cpu_alloc,
    .buffer_free = cpu_free,
    .buffer_from_host = cpu_from_host,
    .copy_in = cpu_copy_in,
    .copy_out = cpu_copy_out,
    .memset_zero = cpu_memset_zero,
    .copy = cpu_copy,
    .supports_op = cpu_supports,
    .compute_node = cpu_compute,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
    .scale = cpu_scale,
    .fill = cpu_fill,
};

sl_backend *sl_backend_cpu(void) { return &g_cpu; }
