/* Graph: node ordering, liveness-based memory planning, and the executor. */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "graph/graph_internal.h"

sl_graph *sl_graph_new(sl_ctx *ctx) {
    sl_graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->ctx = ctx;
    return g;
}

static void cap_release(sl_graph *g);

enum { REGION_ARENA, REGION_CAP, REGION_SCRATCH }; /* sl_graph.region */

void sl_graph_free(sl_graph *g) {
    if (!g) return;
    if (g->arena) sl_backend_free(g->backend, g->arena);
    cap_release(g);
    free(g->region);
    free(g->nodes);
    free(g->visited);
    free(g->grads);
    free(g->last_grad_write);
    free(g->offsets);
    free(g);
}

void sl_graph_ensure_id_capacity(sl_graph *g) {
    int need = sl_ctx_count(g->ctx);
    if (need <= g->visited_cap) return;
    int cap = need * 2 + 64;
    g->visited = realloc(g->visited, (size_t)cap);
    g->grads = realloc(g->grads, sizeof(sl_tensor *) * (size_t)cap);
    g->last_grad_write = realloc(g->last_grad_write, sizeof(int) * (size_t)cap);
    SL_ASSERT(g->visited && g->grads && g->last_grad_write);
    for (int i = g->visited_cap; i < cap; i++) {
        g->visited[i] = 0;
        g->grads[i] = NULL;
        g->last_grad_write[i] = -1;
    }
    g->visited_cap = cap;
    g->grads_cap = cap;
}

void sl_graph_push(sl_graph *g, sl_tensor *t) {
    if (g->n_nodes == g->cap_nodes) {
        g->cap_nodes = g->cap_nodes ? 2 * g->cap_nodes : 256;
        g->nodes = realloc(g->nodes, sizeof(sl_tensor *) * (size_t)g->cap_nodes);
        SL_ASSERT(g->nodes);
    }
    t->order = g->n_nodes;
    g->nodes[g->n_nodes++] = t;
    sl_graph_ensure_id_capacity(g);
    g->visited[t->id] = 1;
    g->planned = 0;
}

static void visit(sl_graph *g, sl_tensor *t) {
    sl_graph_ensure_id_capacity(g);
    if (g->visited[t->id]) return;
    /* iterative DFS would avoid deep recursion; graphs here are a few thousand nodes deep at most */
    for (int i = 0; i < SL_MAX_SRC; i++)
        if (t->src[i]) visit(g, t->src[i]);
    if (t->op == SL_OP_NONE) {
        g->visited[t->id] = 1; /* leaves are not executed */
        return;
    }
    sl_graph_push(g, t);
}

void sl_graph_build_forward(sl_graph *g, sl_tensor *out) {
    visit(g, out);
    out->flags |= SL_FLAG_OUTPUT;
}

int sl_graph_n_nodes(const sl_graph *g) { return g->n_nodes; }
sl_tensor *sl_graph_node(sl_graph *g, int i) { return (i >= 0 && i < g->n_nodes) ? g->nodes[i] : NULL; }

sl_tensor *sl_graph_grad_of(sl_graph *g, const sl_tensor *t) {
    return (g->grads && t->id < g->grads_cap) ? g->grads[t->id] : NULL;
}

int sl_graph_last_grad_write(sl_graph *g, const sl_tensor *p) {
    return (g->last_grad_write && p->id < g->grads_cap) ? g->last_grad_write[p->id] : -1;
}

int sl_graph_set_dropout(sl_graph *g, int on, uint64_t seed, uint64_t stream) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        sl_tensor *t = g->nodes[i];
        if (t->op != SL_OP_DROPOUT && !(t->op == SL_OP_ATTENTION && t->fparams[0] > 0)) continue;
        t->iparams[SL_DROPOUT_IP_ON] = on;
        t->iparams[SL_DROPOUT_IP_SEED_LO] = (int32_t)(uint32_t)seed;
        t->iparams[SL_DROPOUT_IP_SEED_HI] = (int32_t)(uint32_t)(seed >> 32);
        t->iparams[SL_DROPOUT_IP_STREAM_LO] = (int32_t)(uint32_t)stream;
        t->iparams[SL_DROPOUT_IP_STREAM_HI] = (int32_t)(uint32_t)(stream >> 32);
        n++;
    }
    return n;
}

void sl_graph_set_grad_overwrite(sl_graph *g, int on) {
    for (int i = 0; i < g->n_nodes; i++) {
        sl_tensor *t = g->nodes[i];
        if (!(t->flags & SL_FLAG_GRAD_FIRST)) continue;
        switch (t->op) {
        case SL_OP_ACC:
            t->iparams[0] = on;
            break;
        case SL_OP_MATMUL:
            t->iparams[2] = on ? 2 : 1;
            break;
        case SL_OP_EMBEDDING_BACK:
            t->iparams[1] = on;
            break;
        default:
            SL_ASSERT(!"unexpected gradient writer");
        }
    }
}

/* ---------------- planner ---------------- */

static int is_inplace(const sl_tensor *t) {
    /* MATMUL with view_src: an accumulating dW (Note [Accumulating gradient writes]); the packed experts'
     * chains (Note [Packed experts]) */
    return t->op == SL_OP_VIEW || t->op == SL_OP_ACC || t->op == SL_OP_SCATTER_ADD ||
           t->op == SL_OP_EMBEDDING_BACK || t->op == SL_OP_KV_STORE ||
           ((t->op == SL_OP_MATMUL || t->op == SL_OP_MOE_PACKED_FFN || t->op == SL_OP_MOE_PACKED_FFN_DX) &&
            t->view_src);
}

static sl_tensor *storage_root(sl_tensor *t) {
    while (t->op != SL_OP_NONE && is_inplace(t)) t = t->view_src;
    return t;
}

sl_tensor *sl_storage_root(sl_tensor *t) { return t ? storage_root(t) : NULL; }

/* Note [Splitting the backward]
 * A zero-bubble pipeline (Qi et al. 2023, ZB-H1; src/train/pipeline.c) runs a stage's backward in two
 * passes: B, what the gradient of the stage's input needs (sent upstream at once), and W, the parameters'
 * gradients, deferred into what would be the bubble. B is the closure of the nodes that write the input's
 * gradient leaf under "is a source of" (srcs and the storage an in-place node writes); W is every other
 * backward node. Moving B ahead of W keeps a topological order (a W node feeds no B node, else it would be
 * in B) and each class keeps its old order, so every gradient is computed by the same nodes from the same
 * values: the results are bitwise those of the unsplit backward, and the parameters' gradient writers (all
 * in W) keep their first-write order (Note [Overwriting first gradient writes]). What could differ is an
 * in-place node (ACC, SCATTER_ADD, an accumulating dW) writing storage that a node of the other class reads:
 * a W reader before a B writer, or a W writer before a B reader, would then see another value. Autodiff's
 * accumulators are read only once complete, so this does not happen; the split checks it and refuses
 * (-1) rather than reorder such a graph. The planner then sees the new order: what W reads lives until W. */
int sl_graph_split_backward(sl_graph *g, int start, const sl_tensor *leaf) {
    int n = g->n_nodes, ids = sl_ctx_count(g->ctx);
    if (start < 0 || start > n) return -1;
    uint8_t *inB = calloc((size_t)(n ? n : 1), 1);
    int *lastBw = malloc(sizeof(int) * (size_t)(ids ? ids : 1)),
        *firstWw = malloc(sizeof(int) * (size_t)(ids ? ids : 1));
    int *lastBr = malloc(sizeof(int) * (size_t)(ids ? ids : 1)),
        *firstWr = malloc(sizeof(int) * (size_t)(ids ? ids : 1));
    sl_tensor **nodes = malloc(sizeof(sl_tensor *) * (size_t)(n ? n : 1));
    int *map = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int ret = -1;
    if (!inB || !lastBw || !firstWw || !lastBr || !firstWr || !nodes || !map) goto done;
    for (int i = start; leaf && i < n; i++)
        if (storage_root(g->nodes[i]) == leaf) inB[i] = 1;
    for (int i = n - 1; i >= start; i--) { /* sources come first: one reverse pass closes the set */
        if (!inB[i]) continue;
        sl_tensor *t = g->nodes[i];
        for (int s = 0; s <= SL_MAX_SRC; s++) {
            sl_tensor *x = s < SL_MAX_SRC ? t->src[s] : t->view_src;
            if (x && x->op != SL_OP_NONE && x->order >= start && x->order < i && g->nodes[x->order] == x)
                inB[x->order] = 1;
        }
    }
    /* the check: per storage (by root id), the B writers / readers against the W writers / readers */
    for (int k = 0; k < ids; k++) lastBw[k] = lastBr[k] = -1, firstWw[k] = firstWr[k] = n;
    for (int i = start; i < n; i++) {
        sl_tensor *t = g->nodes[i];
        if (t->op != SL_OP_VIEW && is_inplace(t)) {
            int r = storage_root(t)->id;
            if (inB[i])
                lastBw[r] = i;
            else if (firstWw[r] == n)
                firstWw[r] = i;
        }
        for (int s = 0; s < SL_MAX_SRC; s++) {
            if (!t->src[s]) continue;
            int r = storage_root(t->src[s])->id;
            if (inB[i])
                lastBr[r] = i;
            else if (firstWr[r] == n)
                firstWr[r] = i;
        }
    }
    for (int k = 0; k < ids; k++)
        if ((lastBw[k] >= 0 && firstWr[k] < lastBw[k]) || (lastBr[k] >= 0 && firstWw[k] < lastBr[k]))
            goto done;
    int m = start;
    for (int pass = 1; pass >= 0; pass--)
        for (int i = start; i < n; i++)
            if (inB[i] == pass) map[i] = m, nodes[m++] = g->nodes[i];
    for (int i = 0; i < start; i++) map[i] = i;
    int w = start;
    for (int i = start; i < n; i++) w += inB[i];
    for (int i = start; i < n; i++) {
        g->nodes[i] = nodes[i];
        g->nodes[i]->order = i;
    }
    for (int k = 0; k < g->grads_cap; k++)
        if (g->last_grad_write[k] >= start && g->last_grad_write[k] < n)
            g->last_grad_write[k] = map[g->last_grad_write[k]];
    g->planned = 0;
    ret = w;
done:
    free(inB);
    free(lastBw);
    free(firstWw);
    free(lastBr);
    free(firstWr);
    free(nodes);
    free(map);
    return ret;
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

typedef struct {
    int node;       /* node index */
    int start, end; /* lifetime [start, end] in node indices */
    size_t size, offset;
} plan_item;

static int cmp_size_desc(const void *pa, const void *pb) {
    const plan_item *a = pa, *b = pb;
    if (a->size != b->size) return a->size < b->size ? 1 : -1;
    return a->start - b->start;
}

/* Note [Donated storage]
 * An elementwise backward op whose input dies at that op can write its output over the input: the
 * cross-entropy gradient over the logits (llm.c does the same; B * T * V floats, GPT-2's largest
 * activation), GELU's gradient over the incoming gradient or the pre-activation. The planner merges such an
 * output into its input's storage (same bytes, same element size, the input read by no later node) when the
 * backend says its kernels allow it (sl_backend_caps.donate_inputs). Values are unchanged; only the
 * arena shrinks. SUANLI_PLAN_DONATE=0 turns it off (A/B). */
static int may_overwrite(const sl_tensor *t, int s) {
    switch (t->op) {
    case SL_OP_CROSS_ENTROPY_BACK:
    case SL_OP_CE_VP_BACK:
        return s == 1;
    case SL_OP_GELU_BACK:
        return s == 0 || s == 1;
    default:
        return 0;
    }
}

/* donor[i]: the node whose storage node i writes over (-1: its own). `last` is extended so the donor's
 * storage lives as long as the output. Runs in node order, so chains resolve to their first owner. */
static void plan_donations(sl_graph *g, const sl_backend *be, int *last, int *donor, int reserve) {
    int n = g->n_nodes;
    for (int i = 0; i < n; i++) donor[i] = -1;
    const char *e = getenv("SUANLI_PLAN_DONATE");
    if (!be->caps.donate_inputs || (e && !strcmp(e, "0"))) return;
    for (int i = 0; i < n; i++) {
        sl_tensor *t = g->nodes[i];
        if (is_inplace(t) || (t->flags & SL_FLAG_OUTPUT) || t->aux_bytes || !sl_is_contiguous(t)) continue;
        for (int s = 0; s < SL_MAX_SRC && donor[i] < 0; s++) {
            sl_tensor *x = t->src[s];
            if (!x || !may_overwrite(t, s) || x->op == SL_OP_NONE || is_inplace(x) || x->order < 0 ||
                (reserve && ((x->flags ^ t->flags) & SL_FLAG_ROWS_CAP)) || /* Note [Reserved rows] */
                last[x->order] != i || (x->flags & SL_FLAG_OUTPUT) || !sl_is_contiguous(x) ||
                sl_nbytes(x) + x->aux_bytes != sl_nbytes(t) ||
                sl_dtype_size(x->dtype) != sl_dtype_size(t->dtype))
                continue;
            int root = donor[x->order] >= 0 ? donor[x->order] : x->order;
            donor[i] = root;
            last[root] = last[i];
        }
    }
}

/* Greedy-by-size placement of items (sorted here): each at the lowest gap among the already-placed items
 * whose lifetimes intersect its own. Returns the region's size. */
static size_t place(plan_item *items, int m, plan_item **ov) {
    qsort(items, (size_t)m, sizeof *items, cmp_size_desc);
    size_t total = 0;
    for (int k = 0; k < m; k++) {
        int nov = 0;
        for (int j = 0; j < k; j++)
            if (items[j].start <= items[k].end && items[k].start <= items[j].end) ov[nov++] = &items[j];
        /* sort overlapping by offset (insertion sort; nov is small) */
        for (int a = 1; a < nov; a++)
            for (int b = a; b > 0 && ov[b - 1]->offset > ov[b]->offset; b--) {
                plan_item *tmp = ov[b];
                ov[b] = ov[b - 1];
                ov[b - 1] = tmp;
            }
        size_t off = 0;
        for (int a = 0; a < nov; a++) {
            if (ov[a]->offset >= off + items[k].size) break;
            size_t e = ov[a]->offset + ov[a]->size;
            if (e > off) off = e;
        }
        items[k].offset = off;
        if (off + items[k].size > total) total = off + items[k].size;
    }
    return total;
}

/* Note [Reserved rows]
 * Some storages are sized for a worst case of which a step uses a data-dependent prefix of rows: the
 * expert-parallel receive side (Note [Expert-parallel dispatch]) holds up to ep x min(k, E / ep) rows per
 * token for the experts of this rank, ep times the k of a balanced router (32x for DeepSeek-V3's 256 experts
 * top-8 at ep 64), and which rows arrive is known only when the counts are exchanged. Such nodes carry
 * SL_FLAG_ROWS_CAP (src/nn/moe.c flags the received rows, their regrouping, the experts' chain and the
 * gradients received or computed on those rows). The planner packs them on their own, in a second region
 * that is address space reserved with mmap (MAP_NORESERVE) and never zeroed, so the kernel commits the
 * pages that a step's rows touch: resident memory follows the rows that arrive (the largest step so far),
 * not the worst case. The flagged kernels write and read only the counted rows (MOE_EP_REGROUP leaves the
 * rows past the counts untouched in such storage); the rows past them stay undefined, and
 * tests/parallel/test_ep_rows.c fills the region with NaN before every step to prove that nothing reads
 * them. The price: the two regions cannot share storage across the flag boundary (nor donate across it),
 * so the reservation exceeds the one-arena plan, by 7-11 C floats per token on test_plan_moe's EP layouts
 * (src/plan/model.c). As with a dynamic allocator, an overload the machine cannot hold ends in the kernel's
 * OOM handling at that step instead of a refusal at start-up. Where the region cannot be reserved address
 * space (a backend whose memory is not host-visible or cannot wrap host memory) it would only cost memory,
 * so the flag is ignored and everything is planned in the one arena, as with SUANLI_PLAN_RESERVE=0 (the
 * A/B, and the refusal at start-up). */
static int reserve_rows(const sl_backend *be) {
    const char *e = getenv("SUANLI_PLAN_RESERVE");
    return be->caps.host_visible && be->buffer_from_host && !(e && !strcmp(e, "0"));
}

static size_t page_size(void) {
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (size_t)ps : 4096;
}

static void cap_release(sl_graph *g) {
    if (g->cap_arena) sl_backend_free(g->backend, g->cap_arena);
    if (g->cap_map) munmap(g->cap_map, g->cap_map_len);
    g->cap_arena = NULL;
    g->cap_map = NULL;
    g->cap_map_len = 0;
}

static sl_status cap_alloc(sl_graph *g, sl_backend *be) {
    size_t page = page_size(), len = (g->cap_bytes + page - 1) / page * page;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
        if (sl_backend_wrap_host(be, p, len, &g->cap_arena) == SL_OK) {
            g->cap_map = p;
            g->cap_map_len = len;
            return SL_OK;
        }
        munmap(p, len);
        sl_clear_error();
    }
    return sl_backend_alloc(be, g->cap_bytes, &g->cap_arena); /* committed: only where mmap failed */
}

size_t sl_graph_cap_bytes(const sl_graph *g) { return g->planned ? g->cap_bytes : 0; }

/* Note [Shared scratch]
 * A pipeline stage holds one graph per micro-batch in flight (K slots per model chunk, Note [Pipeline
 * stages and 1F1B]), and each graph's forward, backward and (zero bubble) weight-gradient nodes run as
 * separate units of the schedule, with the other slots' units between them. Planned alone, every slot's
 * arena holds its whole working set, so K slots cost K times the backward's peak although only one unit
 * runs at a time. What a slot must keep between its units is only what crosses a phase boundary: the
 * activations its backward reads, the weight-gradient phase's inputs, and its outputs (the loss, the stage
 * output being sent). So with phases set, sl_graph_plan sorts each storage by its lifetime (after
 * donations, in the extended lifetimes): one that starts and ends in the same phase, and is not an output
 * or a reserved-rows storage, goes to the scratch region, planned on its own by the same greedy placement;
 * the rest to the graph's arena. The owner allocates one scratch buffer of the largest scratch size of its
 * graphs and binds it to all of them. The same nodes compute the same values in the same order, so the
 * results are bitwise those of one arena per slot (test_pp, test_recompute, test_ep compare each layout
 * with the single process bitwise or at 1e-6). The price is what the split forbids: a scratch storage and
 * an arena storage never share bytes, so a slot's arena plus the scratch can exceed its one-arena plan,
 * and the pipeline keeps the split only where the sum over its slots comes out smaller (src/train/
 * pipeline.c, plan_stage). With full recomputation almost everything a slot computes is transient:
 * GPT-2 124M at pp 4 with 8 micro-batches, stage 0 57.1 -> 24.0 MiB (docs/BENCHMARKS.md, "Shared
 * scratch"); without it most of a slot is kept activations, and the gain is 3-9 %. */
void sl_graph_set_phases(sl_graph *g, const int *ends, int n) {
    g->n_phases = n < 0 ? 0 : n > SL_GRAPH_MAX_PHASES ? SL_GRAPH_MAX_PHASES : n;
    for (int i = 0; i < g->n_phases; i++) g->phase_end[i] = ends[i];
}

size_t sl_graph_scratch_bytes(const sl_graph *g) { return g->planned ? g->scratch_bytes : 0; }

sl_status sl_graph_bind_scratch(sl_graph *g, sl_buffer *buf) {
    if (!g->planned || !buf || buf->size < g->scratch_bytes || buf->backend != g->backend)
        return sl_fail(SL_ERR_INVALID, "graph: a scratch buffer of %zu bytes for a plan of %zu",
                       buf ? buf->size : 0, g->scratch_bytes);
    g->scratch = buf;
    return SL_OK;
}

/* the phase node i runs in (the last one for nodes past the set ends) */
static int phase_of(const sl_graph *g, int i) {
    int p = 0;
    while (p < g->n_phases - 1 && i >= g->phase_end[p]) p++;
    return p;
}

static int scratch_on(const sl_graph *g) {
    const char *e = getenv("SUANLI_PLAN_SCRATCH");
    return g->n_phases > 1 && !(e && !strcmp(e, "0"));
}

size_t sl_graph_cap_resident(const sl_graph *g) {
    if (!g->planned || !g->cap_bytes) return 0;
    if (!g->cap_map) return g->cap_bytes;
    size_t page = page_size(), np = g->cap_map_len / page;
    unsigned char *v = malloc(np);
    if (!v) return g->cap_bytes;
    size_t res = 0;
    if (mincore(g->cap_map, g->cap_map_len, v) == 0)
        for (size_t i = 0; i < np; i++) res += v[i] & 1;
    else
        res = np;
    free(v);
    return res * page;
}

/* Note [Activation planning]
 * Every node that owns storage (not a view, not an in-place op, not a leaf) needs nbytes + aux_bytes.
 * Its lifetime runs from its own index to the last node that reads it or any alias of it (views and
 * in-place ops resolve to their storage root). OUTPUT nodes live to the end. Offsets are assigned
 * offline, largest first, each at the lowest offset that does not overlap an already-placed item
 * with an intersecting lifetime (greedy-by-size, as in TFLite's arena planner). The arena is
 * allocated once; no allocation happens in the step loop. */
sl_status sl_graph_plan(sl_graph *g, sl_backend *be, sl_plan_stats *stats) {
    sl_graph_fuse_half_outputs(g, be); /* Note [Half outputs] (fuse.c) */
    int n = g->n_nodes;
    int *last = malloc(sizeof(int) * (size_t)(n ? n : 1)), *donor = malloc(sizeof(int) * (size_t)(n ? n : 1));
    plan_item *items = malloc(sizeof(plan_item) * (size_t)(n ? n : 1));
    free(g->offsets);
    g->offsets = malloc(sizeof(size_t) * (size_t)(n ? n : 1));
    if (!last || !donor || !items || !g->offsets) {
        free(last);
        free(donor);
        free(items);
        return sl_fail(SL_ERR_NOMEM, "graph plan: out of memory");
    }
    for (int i = 0; i < n; i++) {
        last[i] = i;
        g->offsets[i] = SIZE_MAX;
    }
    for (int i = 0; i < n; i++) {
        sl_tensor *t = g->nodes[i];
        sl_tensor *r = storage_root(t);
        if (r->op != SL_OP_NONE && r->order >= 0 && last[r->order] < i) last[r->order] = i;
        for (int s = 0; s < SL_MAX_SRC; s++) {
            if (!t->src[s]) continue;
            sl_tensor *rs = storage_root(t->src[s]);
            if (rs->op != SL_OP_NONE && rs->order >= 0 && last[rs->order] < i) last[rs->order] = i;
        }
    }
    for (int i = 0; i < n; i++) {
        sl_tensor *r = storage_root(g->nodes[i]);
        if ((g->nodes[i]->flags & SL_FLAG_OUTPUT) && r->op != SL_OP_NONE) last[r->order] = n - 1;
    }
    int reserve = reserve_rows(be);
    plan_donations(g, be, last, donor, reserve);
    int m = 0;
    size_t naive = 0;
    for (int i = 0; i < n; i++) {
        sl_tensor *t = g->nodes[i];
        if (is_inplace(t)) continue;
        size_t sz = align64(sl_nbytes(t) + t->aux_bytes);
        naive += sz; /* every storage on its own: the sum without any reuse, donation included */
        if (donor[i] < 0) items[m++] = (plan_item){i, i, last[i], sz, 0};
    }
    /* each class packed on its own: the reserved rows' storages first, then the arena's, then the storages
     * that live within one phase (Note [Shared scratch]) */
    int mc = 0, ms = m, scr = scratch_on(g);
    for (int k = 0; k < m && reserve; k++)
        if (g->nodes[items[k].node]->flags & SL_FLAG_ROWS_CAP) {
            plan_item t = items[k];
            items[k] = items[mc];
            items[mc++] = t;
        }
    for (int k = m - 1; k >= mc && scr; k--) {
        const plan_item *it = &items[k];
        if ((g->nodes[it->node]->flags & SL_FLAG_OUTPUT) || phase_of(g, it->start) != phase_of(g, it->end))
            continue;
        plan_item t = items[k];
        items[k] = items[--ms];
        items[ms] = t;
    }
    uint8_t *region = calloc(n > 0 ? (size_t)n : 1, 1);
    plan_item **ov = malloc(sizeof(plan_item *) * (size_t)(m ? m : 1));
    if (!ov || !region) {
        free(ov);
        free(region);
        free(last);
        free(donor);
        free(items);
        return sl_fail(SL_ERR_NOMEM, "graph plan: out of memory");
    }
    size_t cap_total = place(items, mc, ov), total = place(items + mc, ms - mc, ov);
    size_t scratch_total = place(items + ms, m - ms, ov);
    for (int k = 0; k < m; k++) {
        g->offsets[items[k].node] = items[k].offset;
        region[items[k].node] = k < mc ? REGION_CAP : k < ms ? REGION_ARENA : REGION_SCRATCH;
    }
    for (int i = 0; i < n; i++)
        if (donor[i] >= 0) g->offsets[i] = g->offsets[donor[i]], region[i] = region[donor[i]];
    free(ov);
    free(last);
    free(donor);
    free(items);
    free(g->region);
    g->region = region;
    g->scratch = NULL; /* the caller binds one of the new size */
    g->scratch_bytes = scratch_total;
    if (g->arena) sl_backend_free(g->backend, g->arena);
    g->arena = NULL;
    cap_release(g);
    g->planned = 0; /* until both regions are allocated */
    g->backend = be;
    g->arena_bytes = total ? total : 64;
    sl_status st = sl_backend_alloc(be, g->arena_bytes, &g->arena);
    if (st != SL_OK) return st;
    g->cap_bytes = cap_total;
    if (cap_total) SL_TRY(cap_alloc(g, be));
    if (stats) {
        stats->planned_bytes = total + cap_total + scratch_total;
        stats->cap_bytes = cap_total;
        stats->scratch_bytes = scratch_total;
        stats->naive_bytes = naive;
        stats->n_allocs = m;
    }
    g->planned = 1;
    return SL_OK;
}

size_t sl_graph_arena_bytes(const sl_graph *g) { return g->planned ? g->arena_bytes : 0; }

sl_status sl_graph_move_arena(sl_graph *g, void *host, size_t bytes) {
    if (!g->planned || bytes < g->arena_bytes)
        return sl_fail(SL_ERR_INVALID, "graph: arena of %zu bytes for a plan of %zu", bytes, g->arena_bytes);
    sl_buffer *b = NULL;
    SL_TRY(sl_backend_wrap_host(g->backend, host, bytes, &b));
    sl_backend_free(g->backend, g->arena);
    g->arena = b; /* the nodes move at the next compute (resolve) */
    return SL_OK;
}

/* ---------------- executor ---------------- */

/* A view or in-place node takes its data address and buffer position from its source. */
static void alias_of(sl_tensor *t, const sl_tensor *src, int64_t elem_offs) {
    size_t off = (size_t)elem_offs * sl_dtype_size(src->dtype);
    t->data = (char *)src->data + off;
    t->buffer = src->buffer;
    t->buffer_offs = src->buffer_offs + off;
}

static sl_status resolve(sl_graph *g) {
    char *base = sl_buffer_base(g->arena);
    if (g->scratch_bytes && !g->scratch)
        return sl_fail(SL_ERR_INVALID, "graph: planned a %zu-byte scratch region, none bound",
                       g->scratch_bytes);
    for (int i = 0; i < g->n_nodes; i++) {
        sl_tensor *t = g->nodes[i];
        if (t->op == SL_OP_VIEW) {
            if (!t->view_src->data)
                return sl_fail(SL_ERR_INVALID, "graph: leaf '%s' has no data bound", t->view_src->name);
            alias_of(t, t->view_src, t->view_offs);
        } else if (is_inplace(t)) {
            alias_of(t, t->view_src, 0);
        } else if (g->region && g->region[i] != REGION_ARENA) { /* Note [Reserved rows], [Shared scratch] */
            sl_buffer *b = g->region[i] == REGION_CAP ? g->cap_arena : g->scratch;
            t->data = (char *)sl_buffer_base(b) + g->offsets[i];
            t->buffer = b;
            t->buffer_offs = g->offsets[i];
        } else {
            t->data = base + g->offsets[i];
            t->buffer = g->arena;
            t->buffer_offs = g->offsets[i];
        }
        for (int s = 0; s < SL_MAX_SRC; s++)
            if (t->src[s] && t->src[s]->op == SL_OP_NONE && !t->src[s]->data)
                return sl_fail(SL_ERR_INVALID, "graph: leaf '%s' (input of %s) has no data bound",
                               t->src[s]->name, sl_op_name(t->op));
    }
    return SL_OK;
}

void sl_graph_refresh_views(sl_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        sl_tensor *t = g->nodes[i];
        if (t->op == SL_OP_VIEW && t->view_src->data)
            alias_of(t, t->view_src, t->view_offs);
        else if (is_inplace(t) && t->view_src->data)
            alias_of(t, t->view_src, 0);
    }
}

void sl_graph_set_collective(sl_graph *g, sl_collective_fn fn, void *user) {
    g->coll_fn = fn;
    g->coll_user = user;
}

sl_status sl_graph_compute_range(sl_graph *g, int start, int end, sl_node_hook hook, void *user) {
    if (!g->planned) return sl_fail(SL_ERR_INVALID, "graph: compute before plan");
    if (start == 0) SL_TRY(resolve(g));
    sl_backend *be = g->backend;
    if (be->graph_compute) return be->graph_compute(be, g, start, end, hook, user);
    int prof = sl_profile_enabled();
    for (int i = start; i < end; i++) {
        sl_tensor *t = g->nodes[i];
        if (t->op == SL_OP_COLLECTIVE) {
            if (!g->coll_fn)
                return sl_fail(SL_ERR_INVALID, "graph: collective node '%s' but no collective provider",
                               t->name);
            double t0 = prof ? sl_time_sec() : 0;
            SL_TRY(g->coll_fn(g->coll_user, t));
            if (prof) sl_profile_add(t->op, sl_time_sec() - t0);
        } else if (t->op != SL_OP_VIEW) {
            int host = !be->supports_op(be, t); /* Note [Host fallback] (host_fallback.c) */
            if (host && (be->caps.host_visible || !sl_host_fallback_enabled()))
                return sl_fail(SL_ERR_UNSUPPORTED, "backend %s: op %s (%s) not supported%s", be->name,
                               sl_op_name(t->op), sl_dtype_name(t->dtype),
                               be->caps.host_visible ? "" : " (SUANLI_HOST_FALLBACK=1 runs it on the host)");
            double t0 = prof ? sl_time_sec() : 0;
            SL_TRY(host ? sl_host_fallback(be, t) : be->compute_node(be, t));
            if (prof) sl_profile_add(t->op, sl_time_sec() - t0);
        }
        if (hook) SL_TRY(hook(g, i, t, user));
    }
    return SL_OK;
}

sl_status sl_graph_compute(sl_graph *g, sl_node_hook hook, void *user) {
    return sl_graph_compute_range(g, 0, g->n_nodes, hook, user);
}

/* Note [Op profile]
 * SUANLI_PROFILE=1 accumulates wall time per op kind in the executor and prints a table at exit. Graphs may
 * run side by side (micro-batch lanes: Note [Micro-batch lanes], src/train/lanes.c), so the sums are atomic
 * (nanoseconds); with lanes the table sums every lane's time. */
static int64_t g_prof_ns[SL_OP_COUNT];
static long g_prof_cnt[SL_OP_COUNT];
static int g_prof = -1;

static void profile_report(void) {
    double tot = 0;
    for (int i = 0; i < SL_OP_COUNT; i++) tot += (double)g_prof_ns[i] * 1e-9;
    fprintf(stderr, "[suanli profile] op time (s), calls, share\n");
    for (int i = 0; i < SL_OP_COUNT; i++)
        if (g_prof_cnt[i]) {
            double sec = (double)g_prof_ns[i] * 1e-9;
            fprintf(stderr, "  %-20s %9.3f %8ld %5.1f%%\n", sl_op_name((sl_op)i), sec, g_prof_cnt[i],
                    100 * sec / (tot > 0 ? tot : 1));
        }
}

int sl_profile_enabled(void) {
    int v = __atomic_load_n(&g_prof, __ATOMIC_ACQUIRE), unset = -1;
    if (v >= 0) return v;
    const char *e = getenv("SUANLI_PROFILE");
    v = e && *e && strcmp(e, "0") != 0;
    /* the first caller registers the report (lanes may start their graphs at once) */
    if (__atomic_compare_exchange_n(&g_prof, &unset, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) && v)
        atexit(profile_report);
    return __atomic_load_n(&g_prof, __ATOMIC_ACQUIRE);
}

void sl_profile_add(sl_op op, double sec) {
    __atomic_fetch_add(&g_prof_ns[op], (int64_t)(sec * 1e9), __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_prof_cnt[op], 1, __ATOMIC_RELAXED);
}

void sl_graph_print(sl_graph *g, FILE *f) {
    for (int i = 0; i < g->n_nodes; i++) {
        sl_tensor *t = g->nodes[i];
        fprintf(f, "%4d %-20s %-5s [", i, sl_op_name(t->op), sl_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) fprintf(f, "%s%lld", d ? "," : "", (long long)t->ne[d]);
        fprintf(f, "] %s\n", t->name);
    }
}
