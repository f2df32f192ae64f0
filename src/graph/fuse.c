/* Graph passes run before planning: producers that write a half-precision cast's output themselves. */
#include <stdlib.h>
#include <string.h>

#include "graph/graph_internal.h"

/* Note [Half outputs]
 * Under bf16 autocast a Linear's input is cast(y, bf16) of an f32 tensor y that nothing else reads: the
 * LayerNorm before the attention and the MLP, the GELU before the second MLP projection, and, backward,
 * the GELU's gradient before the first projection's GEMMs and the hidden dropouts' gradients before the
 * output projections'. Each is a pass that writes y in f32 and a
 * second that reads it back and writes the copy. sl_graph_fuse_half_outputs finds CAST(f32 -> bf16)
 * nodes whose source is a GELU, GELU_BACK, LAYERNORM or DROPOUT (no residual) node read by that cast alone
 * (not a graph output, contiguous; a LayerNorm's backward nodes name it only for the statistics), gives the
 * source the cast's dtype and turns the cast into a view of it. The producer then rounds each value as the
 * CAST kernel would (sl_f32_to_bf16, round to nearest even) and stores it, so every consumer reads the same
 * bits; the f32 copy never exists. A LAYERNORM keeps its mean and rstd after its (now smaller) output, where
 * its backward looks (sl_nbytes of the node). A node is rewritten only where the backend supports the
 * half-output form (the CPU; the accelerators keep the cast). Run by sl_graph_plan; SUANLI_FUSE=0 skips it
 * (A/B). Baby GPT bf16 step: 25 casts fewer of the 101 per step. */
static int fusable_producer(const sl_tensor *s) {
    return (s->op == SL_OP_GELU || s->op == SL_OP_GELU_BACK || s->op == SL_OP_LAYERNORM ||
            (s->op == SL_OP_DROPOUT && !s->src[1])) &&
           s->dtype == SL_F32 && !s->view_src && sl_is_contiguous(s) &&
           !(s->flags & (SL_FLAG_OUTPUT | SL_FLAG_PARAM | SL_FLAG_LOSS));
}

int sl_graph_fuse_half_outputs(sl_graph *g, sl_backend *be) {
    const char *e = getenv("SUANLI_FUSE");
    if ((e && !strcmp(e, "0")) || !be || !be->supports_op) return 0;
    int n = g->n_nodes, fused = 0;
    /* readers per node (by execution index) */
    int *readers = calloc((size_t)(n ? n : 1), sizeof(int));
    if (!readers) return 0; /* an optimization: without memory the graph runs unfused */
    for (int i = 0; i < n; i++) {
        const sl_tensor *t = g->nodes[i];
        for (int k = 0; k < SL_MAX_SRC; k++) {
            const sl_tensor *s = t->src[k];
            /* a LayerNorm's backward names the forward node only for the mean and rstd in its aux area */
            if (k == 0 && (t->op == SL_OP_LAYERNORM_BACK_X || t->op == SL_OP_LAYERNORM_BACK_WB)) continue;
            if (s && s->order >= 0 && s->order < n && g->nodes[s->order] == s) readers[s->order]++;
        }
        if (t->view_src && t->view_src != t->src[0] && t->view_src->order >= 0 && t->view_src->order < n &&
            g->nodes[t->view_src->order] == t->view_src)
            readers[t->view_src->order]++;
    }
    for (int i = 0; i < n; i++) {
        sl_tensor *c = g->nodes[i], *s = c->src[0];
        if (c->op != SL_OP_CAST || c->dtype != SL_BF16 || !s || !fusable_producer(s) || c->view_src ||
            !sl_is_contiguous(c) || (c->flags & SL_FLAG_OUTPUT))
            continue;
        if (s->order < 0 || s->order >= n || g->nodes[s->order] != s || readers[s->order] != 1) continue;
        s->dtype = SL_BF16;
        if (!be->supports_op(be, s)) {
            s->dtype = SL_F32;
            continue;
        }
        c->op = SL_OP_VIEW;
        c->view_src = s;
        c->view_offs = 0;
        fused++;
    }
    free(readers);
    return fused;
}
