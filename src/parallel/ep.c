/* Expert parallelism: the all-to-all(v) collectives of expert-parallel graphs (Note [Expert-parallel
 * dispatch], src/ops/moe_ep_ops.c), run by the graph's collective provider (sl_tp_collective) over the mesh's
 * EP communicator. */
#include <string.h>

#include "parallel/ep_internal.h"

/* per rank of the group: elements to or from it, from a counts tensor (E floats, El per rank block) */
static sl_status split_counts(const sl_tensor *counts, int P, int64_t C, int64_t rows, size_t *cnt,
                              size_t *displ, const char *name) {
    const float *c = counts->data;
    int64_t E = counts->ne[0], El = E / P, tot = 0;
    for (int p = 0; p < P; p++) {
        int64_t r = 0;
        for (int64_t j = 0; j < El; j++) {
            float v = c[p * El + j];
            if (!(v >= 0 && v <= (float)rows) || v != (float)(int64_t)v)
                return sl_fail(SL_ERR_INVALID, "ep: collective '%s': token count %g is invalid", name,
                               (double)v);
            r += (int64_t)v;
        }
        displ[p] = (size_t)(tot * C);
        cnt[p] = (size_t)(r * C);
        tot += r;
    }
    if (tot > rows)
        return sl_fail(SL_ERR_INVALID, "ep: collective '%s': %lld rows exceed its %lld", name, (long long)tot,
                       (long long)rows);
    return SL_OK;
}

sl_status sl_ep_collective(sl_comm *comm, int P, sl_tensor *n, double *bytes) {
    sl_tensor *x = n->src[0];
    int kind = n->iparams[0];
    if (n->iparams[3] != P)
        return sl_fail(SL_ERR_INVALID, "ep: collective '%s' built for %d ranks, the group has %d", n->name,
                       n->iparams[3], P);
    if (kind == SL_COLL_ALLTOALL) {
        size_t cnt = (size_t)sl_nelements(x);
        if (P == 1 || !comm) {
            memcpy(n->data, x->data, cnt * sizeof(float));
            return SL_OK;
        }
        *bytes += (double)(P - 1) / P * (double)cnt * sizeof(float);
        return sl_comm_all_to_all(comm, x->data, n->data, cnt / (size_t)P, SL_COMM_F32);
    }
    if (kind != SL_COLL_ALLTOALLV && kind != SL_COLL_ALLTOALLV_REV)
        return sl_fail(SL_ERR_INVALID, "ep: collective '%s' has kind %d", n->name, kind);
    const sl_tensor *scnt = kind == SL_COLL_ALLTOALLV ? n->src[1] : n->src[2],
                    *rcnt = kind == SL_COLL_ALLTOALLV ? n->src[2] : n->src[1];
    int64_t C = x->ne[1];
    size_t buf[4 * 64], *sc = buf, *sd, *rc, *rd;
    if (P > 64 && !(sc = malloc(sizeof(size_t) * 4 * (size_t)P)))
        return sl_fail(SL_ERR_NOMEM, "ep: out of memory");
    sd = sc + P, rc = sd + P, rd = rc + P;
    sl_status st = split_counts(scnt, P, C, x->ne[0], sc, sd, n->name);
    if (st == SL_OK) st = split_counts(rcnt, P, C, n->ne[0], rc, rd, n->name);
    if (st == SL_OK && (P == 1 || !comm)) {
        memcpy(n->data, x->data, sc[0] * sizeof(float));
    } else if (st == SL_OK) {
        int me = sl_comm_rank(comm);
        for (int p = 0; p < P; p++)
            if (p != me) *bytes += (double)sc[p] * sizeof(float);
        st = sl_comm_all_to_allv(comm, x->data, sc, sd, n->data, rc, rd, SL_COMM_F32);
    }
    if (sc != buf) free(sc);
    return st;
}

/* this rank's parameters that are experts (in model order), packed into buf, or their count (read through
 * the backend contract: the parameters may live in device memory) */
static int64_t expert_elems(const sl_model *m, float *buf, sl_status *st) {
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i];
        if (!p->expert) continue;
        if (buf && *st == SL_OK) *st = sl_model_params_read(m, p->offset, p->numel, buf + n);
        n += p->numel;
    }
    return n;
}

/* the expert parameters of `peer` (a model built for another EP rank) from buf, into whole by name */
static sl_status write_experts(const sl_model *peer, const float *buf, sl_model *whole) {
    int64_t off = 0;
    for (int i = 0; i < peer->n_params; i++) {
        const sl_param_info *p = &peer->params[i];
        if (!p->expert) continue;
        const sl_param_info *q = sl_model_find(whole, p->t->name);
        if (!q || q->numel != p->numel)
            return sl_fail(SL_ERR_INVALID, "gather: expert '%s' does not fit the whole model", p->t->name);
        SL_TRY(sl_model_params_write(whole, q->offset, p->numel, buf + off));
        off += p->numel;
    }
    return SL_OK;
}

sl_status sl_ep_gather_whole(const sl_mesh *mesh, const sl_model *mine, sl_model *whole) {
    float *tmp = NULL;
    for (int i = 0; i < mine->n_params; i++) { /* replicated parameters and this rank's experts */
        const sl_param_info *p = &mine->params[i], *q = sl_model_find(whole, p->t->name);
        if (!q || q->numel != p->numel) {
            free(tmp);
            return sl_fail(SL_ERR_INVALID, "gather: parameter '%s' does not fit the whole model", p->t->name);
        }
        const float *src = mine->params_mem ? mine->params_mem + p->offset : NULL;
        sl_status st = SL_OK;
        if (!src) { /* device memory: through a host copy */
            float *t = realloc(tmp, sizeof(float) * (size_t)(p->numel ? p->numel : 1));
            st = t ? sl_model_params_read(mine, p->offset, p->numel, (tmp = t))
                   : sl_fail(SL_ERR_NOMEM, "gather: out of memory");
            src = tmp;
        }
        if (st == SL_OK) st = sl_model_params_write(whole, q->offset, p->numel, src);
        if (st != SL_OK) {
            free(tmp);
            return st;
        }
    }
    free(tmp);
    int P = mine->ep > 1 ? mine->ep : 1;
    if (P == 1) return SL_OK;
    sl_status st = SL_OK;
    int64_t n = expert_elems(mine, NULL, &st); /* the same on every EP rank: El experts of the same shapes */
    float *send = malloc(sizeof(float) * (size_t)(n ? n : 1)),
          *all = malloc(sizeof(float) * (size_t)(n * P + 1));
    if (!send || !all) st = sl_fail(SL_ERR_NOMEM, "gather: out of memory");
    if (st == SL_OK) {
        expert_elems(mine, send, &st);
        if (st == SL_OK) st = sl_comm_all_gather(mesh->ep_comm, send, all, (size_t)n, SL_COMM_F32);
    }
    for (int p = 0; p < P && st == SL_OK; p++) {
        if (p == mine->ep_rank) continue;
        sl_model *peer = NULL;
        sl_model_split split = {mine->tp > 1 ? mine->tp : 1,
                                mine->tp_rank,
                                mine->pp > 1 ? mine->pp : 1,
                                mine->pp_rank,
                                mine->vpp,
                                mine->pp_first_layers,
                                mine->pp_last_layers,
                                P,
                                p,
                                mine->etp};
        st = sl_model_new_split(mine, sl_backend_cpu(), &split, &peer);
        if (st == SL_OK && expert_elems(peer, NULL, &st) != n)
            st = sl_fail(SL_ERR_INTERNAL, "gather: EP rank %d holds another expert layout", p);
        if (st == SL_OK) st = write_experts(peer, all + n * p, whole);
        sl_model_free(peer);
    }
    free(send);
    free(all);
    return st;
}
