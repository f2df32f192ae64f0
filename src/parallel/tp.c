/* Tensor parallelism: the collective provider that runs a TP graph's COLLECTIVE nodes over the mesh's TP
 * communicator, the copy between full parameters and a rank's shards, and the gradient norm over a TP
 * group (Note [Tensor-parallel graphs], src/ops/build_tp.c; the model split: sl_gpt2_new_tp). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/ep_internal.h"

struct sl_tp {
    sl_comm *comm; /* the mesh's TP communicator (borrowed) */
    int n, r;
    /* groups of g consecutive TP ranks (g = 2, 4, .. < n, dividing n): replicated GQA kv heads (owned) */
    sl_comm *group[8];
    float *scratch; /* the rank-major staging of sequence collectives */
    size_t scratch_cap;
    float *stage; /* host copies of a staged collective's tensors (Note [Staged TP collectives]) */
    size_t stage_cap;
    double coll_sec; /* time inside TP collectives (reset by sl_tp_take_stats) */
    double coll_bytes;
    sl_comm *ep_comm; /* the mesh's expert-parallel communicator (borrowed; NULL: ep 1) */
    int ep;
    double ep_sec, ep_bytes; /* inside EP all-to-alls (reset by sl_ep_take_stats) */
    void *ep_win[64];        /* EP-group windows holding graph arenas (sl_ep_window_arenas) */
    int n_ep_win;
};

sl_status sl_tp_new(sl_tp **out, const sl_mesh *mesh) {
    *out = NULL;
    if (mesh->tp > 1 && !mesh->tp_comm) return sl_fail(SL_ERR_INVALID, "tp: the mesh has no TP communicator");
    sl_tp *t = calloc(1, sizeof *t);
    if (!t) return sl_fail(SL_ERR_NOMEM, "tp: out of memory");
    t->comm = mesh->tp_comm;
    t->n = mesh->tp;
    t->r = mesh->tp_rank;
    t->ep_comm = mesh->ep_comm;
    t->ep = mesh->ep;
    /* collective over the TP group: every rank splits every group size in the same order */
    for (int k = 1; (1 << k) < t->n && k < 8; k++) {
        int g = 1 << k;
        if (t->n % g) continue;
        sl_status st = sl_comm_split(t->comm, t->r / g, t->r, &t->group[k]);
        if (st != SL_OK) {
            sl_tp_free(t);
            return st;
        }
    }
    *out = t;
    return SL_OK;
}

void sl_tp_free(sl_tp *t) {
    if (!t) return;
    for (int i = 0; i < t->n_ep_win; i++) (void)sl_comm_mem_free(t->ep_comm, t->ep_win[i]);
    for (int k = 0; k < 8; k++) sl_comm_free(t->group[k]);
    free(t->scratch);
    free(t->stage);
    free(t);
}

static float *scratch(sl_tp *t, size_t n) {
    if (n > t->scratch_cap) {
        float *p = realloc(t->scratch, sizeof(float) * n);
        if (!p) return NULL;
        t->scratch = p;
        t->scratch_cap = n;
    }
    return t->scratch;
}

/* (B, T, K) <-> (n, B, T/n, K): rank-major blocks of the sequence dimension; to_blocks 1: full -> blocks */
static void seq_blocks(const float *src, float *dst, int64_t B, int64_t T, int64_t K, int n, int to_blocks) {
    int64_t Tl = T / n;
    for (int r = 0; r < n; r++)
        for (int64_t b = 0; b < B; b++) {
            const float *a = to_blocks ? src + (b * T + r * Tl) * K : src + ((r * B + b) * Tl) * K;
            float *d = to_blocks ? dst + ((r * B + b) * Tl) * K : dst + (b * T + r * Tl) * K;
            memcpy(d, a, sizeof(float) * (size_t)(Tl * K));
        }
}

/* Note [TP communication volume]
 * Bytes each rank sends on a ring (NCCL's bus bytes): an all-gather or a reduce-scatter of a full tensor of
 * S bytes sends (n-1)/n S, an all-reduce twice that. The trainer prints the Megatron formula beside it
 * (sl_tp_comm_theory). */
static double bus_bytes(int n, int factor, size_t full_elems) {
    return factor * (double)(n - 1) / n * (double)full_elems * sizeof(float);
}

/* sequence-parallel collectives on (B, T, K..) activations (Note [Tensor-parallel graphs]) */
static sl_status seq_collective(sl_tp *t, sl_tensor *n, sl_tensor *x, int gather) {
    const sl_tensor *full = gather ? n : x;
    int64_t B = full->ne[0], T = full->ne[1], K = sl_nelements(full) / (B * T);
    size_t cnt = (size_t)(B * T * K);
    float *s = scratch(t, cnt);
    if (!s) return sl_fail(SL_ERR_NOMEM, "tp: out of memory");
    if (gather) {
        SL_TRY(sl_comm_all_gather(t->comm, x->data, s, cnt / (size_t)t->n, SL_COMM_F32));
        seq_blocks(s, n->data, B, T, K, t->n, 0);
    } else {
        seq_blocks(x->data, s, B, T, K, t->n, 1);
        SL_TRY(sl_comm_reduce_scatter(t->comm, s, n->data, cnt / (size_t)t->n, SL_COMM_F32, SL_COMM_SUM));
    }
    t->coll_bytes += bus_bytes(t->n, 1, cnt);
    return SL_OK;
}

int sl_tp_size(const sl_tp *t) { return t ? t->n : 1; }

/* Note [EP activations in a window]
 * The dispatch and combine all-to-alls move activation rows between the ranks of the EP group. When the
 * graph's arena is a symmetric window of the EP communicator, every rank's rows lie at the same offset of
 * the same window (the EP ranks build the same graph and plan), so the all-to-all(v) copies each peer's rows
 * straight from its memory (src/comm/algo/sym.c, Note [Window data movement]) instead of through
 * process_vm_readv or the transport's slots. On transports without windows the memory is private and
 * nothing changes (nor with SUANLI_COMM_WINDOWS=0, under which sl_comm_mem_alloc returns private memory). */
sl_status sl_ep_window_alloc(sl_tp *t, size_t bytes, void **out) {
    *out = NULL;
    if (!t || !t->ep_comm || t->ep <= 1) return SL_OK;
    if (t->n_ep_win == (int)(sizeof t->ep_win / sizeof t->ep_win[0]))
        return sl_fail(SL_ERR_INVALID, "ep: more than %d windows", t->n_ep_win);
    SL_TRY(sl_comm_mem_alloc(t->ep_comm, bytes, out));
    t->ep_win[t->n_ep_win++] = *out;
    return SL_OK;
}

sl_status sl_ep_window_arenas(sl_tp *t, sl_graph **graphs, int n) {
    for (int i = 0; i < n; i++) {
        size_t bytes = sl_graph_arena_bytes(graphs[i]);
        void *p = NULL;
        SL_TRY(sl_ep_window_alloc(t, bytes, &p));
        if (!p) return SL_OK; /* no EP */
        SL_TRY(sl_graph_move_arena(graphs[i], p, bytes));
    }
    return SL_OK;
}

void sl_ep_take_stats(sl_tp *t, double *sec, double *bytes) {
    *sec = t ? t->ep_sec : 0;
    *bytes = t ? t->ep_bytes : 0;
    if (t) t->ep_sec = t->ep_bytes = 0;
}

void sl_tp_take_stats(sl_tp *t, double *sec, double *bytes) {
    *sec = t ? t->coll_sec : 0;
    *bytes = t ? t->coll_bytes : 0;
    if (t) t->coll_sec = t->coll_bytes = 0;
}

static sl_status tp_collective_host(sl_tp *t, sl_tensor *n);

/* Note [Staged TP collectives]
 * On a backend whose memory the host cannot address (OpenCL) a collective node's inputs (the tensor, and an
 * expert-parallel all-to-all(v)'s send and receive counts) are copied out into a host buffer, the
 * collective runs on host copies (its tensors' data pointers swapped to them for the call), and the result
 * is copied back into the node, as data parallelism stages its buckets (Note [Staged gradients], dp.c). The
 * graph executor calls the provider in node order, after the device has finished the inputs (the copies out
 * are blocking). The EP group's activations then travel between private host buffers, not through the
 * window arenas of Note [EP activations in a window]. */
static sl_status tp_collective_staged(sl_tp *t, sl_tensor *n) {
    int64_t off[SL_MAX_SRC + 1], tot = 0;
    for (int s = 0; s < SL_MAX_SRC; s++) {
        off[s] = tot;
        if (n->src[s]) tot += sl_nelements(n->src[s]) + 1;
    }
    off[SL_MAX_SRC] = tot;
    size_t need = (size_t)(tot + sl_nelements(n) + 1);
    if (need > t->stage_cap) { /* kept across calls: the same collectives run every step */
        float *p = realloc(t->stage, sizeof(float) * need);
        if (!p) return sl_fail(SL_ERR_NOMEM, "tp: out of memory");
        t->stage = p;
        t->stage_cap = need;
    }
    float *h = t->stage;
    void *dev[SL_MAX_SRC + 1];
    sl_status st = SL_OK;
    for (int s = 0; s < SL_MAX_SRC && st == SL_OK; s++)
        if (n->src[s]) st = sl_tensor_copy_out(n->src[s], h + off[s]);
    if (st == SL_OK) {
        for (int s = 0; s < SL_MAX_SRC; s++)
            if (n->src[s]) dev[s] = n->src[s]->data, n->src[s]->data = h + off[s];
        dev[SL_MAX_SRC] = n->data;
        n->data = h + off[SL_MAX_SRC];
        st = tp_collective_host(t, n);
        for (int s = SL_MAX_SRC - 1; s >= 0; s--) /* (a source listed twice gets its address back last) */
            if (n->src[s]) n->src[s]->data = dev[s];
        n->data = dev[SL_MAX_SRC];
    }
    if (st == SL_OK) st = sl_tensor_copy_in(n, h + off[SL_MAX_SRC]);
    return st;
}

sl_status sl_tp_collective(void *user, sl_tensor *n) {
    sl_tensor *x = n->src[0];
    if (x->buffer && !x->buffer->backend->caps.host_visible) return tp_collective_staged(user, n);
    return tp_collective_host(user, n);
}

static sl_status tp_collective_host(sl_tp *t, sl_tensor *n) {
    sl_tensor *x = n->src[0];
    size_t cnt = (size_t)sl_nelements(x);
    if (!x->data || !n->data)
        return sl_fail(SL_ERR_UNSUPPORTED, "tp: collective '%s' needs host-visible memory", n->name);
    if (n->iparams[2] == SL_GROUP_EP) {
        double t0 = sl_time_sec();
        sl_status st = sl_ep_collective(t->ep_comm, t->ep, n, &t->ep_bytes);
        t->ep_sec += sl_time_sec() - t0;
        return st;
    }
    if (n->iparams[3] != t->n)
        return sl_fail(SL_ERR_INVALID, "tp: collective '%s' built for %d ranks, the group has %d", n->name,
                       n->iparams[3], t->n);
    double t0 = sl_time_sec();
    sl_status st = SL_OK;
    if (n->iparams[2] ==
        SL_GROUP_TP_KV) { /* replicated kv heads: only all-reduces, over groups of iparams[4] */
        int g = n->iparams[4], k = 0;
        while ((1 << k) < g) k++;
        if ((1 << k) != g || k >= 8 || !t->group[k] || n->iparams[0] > SL_COLL_ALLREDUCE)
            return sl_fail(SL_ERR_INVALID, "tp: collective '%s' over groups of %d ranks is not available",
                           n->name, g);
        if (n->iparams[0] == SL_COLL_COPY)
            memcpy(n->data, x->data, cnt * sizeof(float));
        else
            st = sl_comm_all_reduce(t->group[k], x->data, n->data, cnt, SL_COMM_F32, SL_COMM_SUM);
        t->coll_sec += sl_time_sec() - t0;
        return st;
    }
    switch ((sl_coll_kind)n->iparams[0]) {
    case SL_COLL_COPY:
        memcpy(n->data, x->data, cnt * sizeof(float));
        break;
    case SL_COLL_ALLREDUCE:
        if (t->n == 1)
            memcpy(n->data, x->data, cnt * sizeof(float));
        else
            st = sl_comm_all_reduce(t->comm, x->data, n->data, cnt, SL_COMM_F32, SL_COMM_SUM);
        t->coll_bytes += bus_bytes(t->n, 2, cnt);
        break;
    case SL_COLL_ALLGATHER:
        if (t->n == 1)
            memcpy(n->data, x->data, cnt * sizeof(float));
        else
            st = sl_comm_all_gather(t->comm, x->data, n->data, cnt, SL_COMM_F32);
        t->coll_bytes += bus_bytes(t->n, 1, cnt * (size_t)t->n);
        break;
    case SL_COLL_ALLGATHER_SEQ:
    case SL_COLL_REDSCAT_SEQ:
        if (t->n == 1)
            memcpy(n->data, x->data, cnt * sizeof(float));
        else
            st = seq_collective(t, n, x, n->iparams[0] == SL_COLL_ALLGATHER_SEQ);
        break;
    default:
        return sl_fail(SL_ERR_INVALID, "tp: collective '%s' has kind %d", n->name, n->iparams[0]);
    }
    t->coll_sec += sl_time_sec() - t0;
    return st;
}

/* Note [TP shard layout]
 * A parameter split along dim d (tp_split - 1) with full size F along d is tp_pack blocks of F / tp_pack;
 * rank r holds part r (sl_tp_part) of every block, concatenated in block order. For d = 0 a part is a run of
 * whole rows; for d = 1 (2-D only) it is a run of columns in every row. */
void sl_tp_shard_copy(const sl_param_info *p, int tp, int r, float *full, float *shard, int to_shard) {
    const sl_tensor *t = p->t;
    if (p->tp_split == 0) {
        if (to_shard)
            memcpy(shard, full, sizeof(float) * (size_t)p->numel);
        else
            memcpy(full, shard, sizeof(float) * (size_t)p->numel);
        return;
    }
    int dim = p->tp_split - 1;
    int64_t inner = 1; /* elements per index of dim `dim`, in the full tensor */
    for (int d = dim + 1; d < t->ndim; d++) inner *= t->ne[d];
    int64_t outer = 1;
    for (int d = 0; d < dim; d++) outer *= t->ne[d];
    int64_t blk = p->tp_full / p->tp_pack, lo, len;
    int parts, part;
    sl_param_tp_part(p, tp, r, &parts, &part);
    sl_tp_part(blk, parts, part, &lo, &len);
    int64_t local_dim = len * p->tp_pack; /* == t->ne[dim] */
    for (int64_t o = 0; o < outer; o++)
        for (int b = 0; b < p->tp_pack; b++) {
            float *f = full + (o * p->tp_full + b * blk + lo) * inner;
            float *s = shard + (o * local_dim + b * len) * inner;
            size_t n = sizeof(float) * (size_t)(len * inner);
            if (to_shard)
                memcpy(s, f, n);
            else
                memcpy(f, s, n);
        }
}

static int64_t full_numel(const sl_param_info *p) {
    if (p->tp_split == 0) return p->numel;
    return p->numel / p->t->ne[(p->tp_split - 1)] * p->tp_full;
}

sl_status sl_tp_load_full(sl_model *shard, const sl_model *full) {
    const float *fp;
    float *owned = NULL;
    SL_TRY(sl_model_params_host(full, &fp, &owned));
    float *buf = malloc(sizeof(float) * (size_t)(shard->numel ? shard->numel : 1));
    sl_status st = buf ? SL_OK : sl_fail(SL_ERR_NOMEM, "tp: out of memory");
    for (int i = 0; i < shard->n_params && st == SL_OK; i++) {
        const sl_param_info *p = &shard->params[i], *q = sl_model_find(full, p->t->name);
        if (!q)
            st = sl_fail(SL_ERR_INVALID, "tp: parameter '%s' of the shard is not in the whole model",
                         p->t->name);
        else if (full_numel(p) != q->numel)
            st = sl_fail(SL_ERR_INVALID,
                         "tp: parameter '%s' has %lld elements in full, %lld in the whole model", p->t->name,
                         (long long)full_numel(p), (long long)q->numel);
        else
            sl_tp_shard_copy(p, shard->tp > 1 ? shard->tp : 1, shard->tp_rank, (float *)fp + q->offset,
                             buf + p->offset, 1);
    }
    if (st == SL_OK) st = sl_model_params_write(shard, 0, shard->numel, buf);
    free(buf);
    sl_free_aligned(owned);
    return st;
}

sl_status sl_tp_gather_full(sl_tp *t, const sl_model *shard, float *full) {
    int n = t ? t->n : 1;
    const float *sp;
    float *owned = NULL;
    SL_TRY(sl_model_params_host(shard, &sp, &owned));
    sl_status st = SL_OK;
    float *all = NULL;
    size_t *counts = NULL, *displs = NULL;
    int64_t off = 0;
    for (int i = 0; i < shard->n_params && st == SL_OK; i++) {
        const sl_param_info *p = &shard->params[i];
        int64_t fn = full_numel(p);
        if (p->tp_split == 0 || n == 1) {
            memcpy(full + off, sp + p->offset, sizeof(float) * (size_t)p->numel);
            off += fn;
            continue;
        }
        /* every rank's shard of this parameter, in rank order, then unpacked into the full layout */
        free(all);
        free(counts);
        free(displs);
        counts = malloc(sizeof(size_t) * (size_t)n);
        displs = malloc(sizeof(size_t) * (size_t)n);
        if (!counts || !displs) {
            st = sl_fail(SL_ERR_NOMEM, "tp: out of memory");
            break;
        }
        int64_t per_index = p->numel / p->t->ne[(p->tp_split - 1)];
        for (int r = 0; r < n; r++) {
            int64_t lo, len;
            int parts, part;
            sl_param_tp_part(p, n, r, &parts, &part);
            sl_tp_part(p->tp_full / p->tp_pack, parts, part, &lo, &len);
            counts[r] = (size_t)(len * p->tp_pack * per_index);
            displs[r] = r ? displs[r - 1] + counts[r - 1] : 0;
        }
        /* every rank's part: more than the full tensor when parts are replicated over groups of ranks */
        all = malloc(sizeof(float) * (displs[n - 1] + counts[n - 1]));
        if (!all) {
            st = sl_fail(SL_ERR_NOMEM, "tp: out of memory");
            break;
        }
        st = sl_comm_all_gatherv(t->comm, sp + p->offset, all, counts, displs, SL_COMM_F32);
        size_t at = 0;
        for (int r = 0; r < n && st == SL_OK; r++) {
            sl_tp_shard_copy(p, n, r, full + off, all + at, 0);
            at += counts[r];
        }
        off += fn;
    }
    free(all);
    free(counts);
    free(displs);
    sl_free_aligned(owned);
    return st;
}

int64_t sl_tp_full_numel(const sl_model *shard) {
    int64_t n = 0;
    for (int i = 0; i < shard->n_params; i++) n += full_numel(&shard->params[i]);
    return n;
}

/* Sum of squares of the gradients of the whole (unsplit) model: the sharded parameters' sums over the
 * group plus the replicated ones once (every TP rank holds identical replicated gradients). Each part is
 * summed in parameter order, as sl_grad_norm sums the flat buffer. */
sl_status sl_tp_grad_sumsq(sl_tp *t, const sl_model *m, double *ss) {
    double split = 0, rep = 0;
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i];
        double x;
        if (p->tied_copy) continue; /* counted on the first pipeline stage */
        SL_TRY(sl_backend_sumsq(m->backend, m->grads_buf, p->offset, p->numel, &x));
        if (p->tp_split > 0) /* a part replicated over a group of ranks is counted once (x 1/group) */
            split += p->tp_parts > 0 && m->tp > p->tp_parts ? x * p->tp_parts / m->tp : x;
        else
            rep += x;
    }
    if (t && t->n > 1) {
        double all;
        SL_TRY(sl_comm_all_reduce(t->comm, &split, &all, 1, SL_COMM_F64, SL_COMM_SUM));
        split = all;
    }
    *ss = split + rep;
    return SL_OK;
}

/* Write a stage's parameters (full TP layout, stage order, as sl_tp_gather_full returns them) into the
 * whole model by name; the last stage's copy of the tied embedding is skipped (the first stage's is it). */
static sl_status write_stage(const sl_model *stage, const float *full, sl_model *whole) {
    int64_t off = 0;
    for (int i = 0; i < stage->n_params; i++) {
        const sl_param_info *p = &stage->params[i];
        int64_t fn = full_numel(p);
        const sl_param_info *q = sl_model_find(whole, p->t->name);
        if (!q || q->numel != fn)
            return sl_fail(SL_ERR_INVALID, "gather: parameter '%s' does not fit the whole model", p->t->name);
        if (!p->tied_copy) SL_TRY(sl_model_params_write(whole, q->offset, fn, full + off));
        off += fn;
    }
    return SL_OK;
}

sl_status sl_par_gather_whole(sl_tp *t, const sl_mesh *mesh, const sl_model *stage, sl_model *whole) {
    int64_t n = sl_tp_full_numel(stage);
    float *mine = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!mine) return sl_fail(SL_ERR_NOMEM, "gather: out of memory");
    sl_status st = sl_tp_gather_full(t, stage, mine);
    if (st == SL_OK && mesh->pp_rank == 0) st = write_stage(stage, mine, whole);
    if (st == SL_OK && mesh->pp_rank != 0) { /* to stage 0 over the pipeline group: a count, the floats */
        st = sl_comm_send(mesh->pp_comm, &n, 1, SL_COMM_I64, 0);
        if (st == SL_OK) st = sl_comm_send(mesh->pp_comm, mine, (size_t)n, SL_COMM_F32, 0);
    }
    free(mine);
    if (st != SL_OK || mesh->pp <= 1 || mesh->pp_rank != 0) return st;
    /* stage 0: each other stage's part, laid out as a stage model built for it (same config) says */
    for (int s = 1; s < mesh->pp && st == SL_OK; s++) {
        int64_t cnt = 0;
        sl_model *peer = NULL;
        float *buf = NULL;
        st = sl_comm_recv(mesh->pp_comm, &cnt, 1, SL_COMM_I64, s);
        sl_model_split split = {
            stage->tp > 1 ? stage->tp : 1, stage->tp_rank,        mesh->pp, s, stage->vpp,
            stage->pp_first_layers,        stage->pp_last_layers, 1,        0, stage->etp};
        if (st == SL_OK) st = sl_model_new_split(stage, sl_backend_cpu(), &split, &peer);
        if (st == SL_OK && sl_tp_full_numel(peer) != cnt)
            st = sl_fail(SL_ERR_INTERNAL, "gather: stage %d sent %lld parameters, expected %lld", s,
                         (long long)cnt, (long long)sl_tp_full_numel(peer));
        if (st == SL_OK && !(buf = malloc(sizeof(float) * (size_t)(cnt ? cnt : 1))))
            st = sl_fail(SL_ERR_NOMEM, "gather: out of memory");
        if (st == SL_OK) st = sl_comm_recv(mesh->pp_comm, buf, (size_t)cnt, SL_COMM_F32, s);
        if (st == SL_OK) st = write_stage(peer, buf, whole);
        free(buf);
        sl_model_free(peer);
    }
    return st;
}

double sl_tp_comm_theory(const sl_model *m, int B, int T, int micro_batches) {
    int n = m->tp > 1 ? m->tp : 1, first = m->pp_rank == 0, last = m->pp_rank == (m->pp > 1 ? m->pp : 1) - 1;
    if (n == 1) return 0;
    double f = (double)(n - 1) / n, S = (double)B * T * m->cfg.n_embd * sizeof(float);
    int L = m->n_layers;
    /* per layer: forward g after attention and MLP, backward f before them: 4 all-reduces (or 8 all-gathers /
     * reduce-scatters under SP); the embedding's g and the final norm's f; the loss's stats all-gather */
    double per = L * 8 * f * S + (first ? 2 * f * S : 0) + (last ? 2 * f * S : 0);
    if (last) per += f * n * (double)B * T * 2 * sizeof(float);
    /* under SP the replicated parameters (GPT-2: 6 C per layer, wpe, ln_f; Llama: the norms; MoE: the
     * router and the experts when whole) take partial gradients, all-reduced (the selection bias has none) */
    /* MoE layers (a router per sparse layer): no f / g around the experts when they are whole on each rank
     * (Note [MoE under TP]; under SP their replicated weights' gradients are all-reduced instead); with
     * expert tensor parallelism g after the experts, f before them and f of the (N, E) logits (Note [Expert
     * tensor parallelism]) */
    int sparse = 0;
    double rep = 0, E = 0;
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i];
        const char *nm = p->t->name;
        size_t len = strlen(nm), g = strlen(".mlp.gate.weight"), bg = strlen(".block_sparse_moe.gate.weight");
        if ((len > g && !strcmp(nm + len - g, ".mlp.gate.weight")) ||
            (len > bg && !strcmp(nm + len - bg, ".block_sparse_moe.gate.weight"))) {
            sparse++;
            E = (double)p->t->ne[0];
        }
        if (m->sp && p->tp_split == 0 && !strstr(nm, "e_score_correction_bias")) rep += (double)p->numel;
    }
    per -= sparse * 4 * f * S;
    if (m->etp) per += sparse * (4 * f * S + 2 * f * (double)B * T * E * sizeof(float));
    /* whole experts under SP with a capacity: the all-gather of the shards' (B, E) counts (Note [Capacity
     * under sequence parallelism]) */
    if (!m->etp && m->sp && sl_moe_capacity(m, (int64_t)B * T) > 0)
        per += sparse * f * n * (double)B * E * sizeof(float);
    per += 2 * f * sizeof(float) * rep;
    /* full recomputation under SP gathers again: the all-gathers before attention and before the MLP (the
     * experts only when split) of each recomputed layer (Note [Full recomputation], src/graph/autodiff.c):
     * uniform recomputes every layer, block the first recompute_layers of each model chunk */
    if (m->sp && m->recompute != SL_RECOMPUTE_NONE) {
        int v = m->vpp > 1 ? m->vpp : 1, nb = m->recompute_layers > 0 ? m->recompute_layers : 1;
        double layers =
            m->recompute == SL_RECOMPUTE_BLOCK ? (double)v * (nb < L / v ? nb : L / v) : (double)L;
        double sparse_share = L > 0 ? (double)sparse / L : 0; /* MoE layers' MLPs gather when split only */
        per += layers * (2.0 - (m->etp ? 0.0 : sparse_share)) * f * S;
    }
    return per * micro_batches;
}
