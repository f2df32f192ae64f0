/* Glue between the trainer (single process, DP/ZeRO, TP shards, pipeline stages) and checkpoints: every
 * rank describes its state in its model's local flat layout; the checkpoint layer names each element by
 * its full tensor (Note [Full-tensor coordinates]), so any layout loads any other's checkpoint. */
#include <string.h>

#include "suanli/ckpt.h"
#include "suanli/train.h"
#include "suanli/parallel.h"

sl_status sl_trainer_ckpt_state(sl_trainer *tr, int rank, int world, sl_ckpt_state *st, sl_ckpt_seg **segs) {
    memset(st, 0, sizeof *st);
    *segs = NULL;
    st->m = tr->model;
    st->rank = rank;
    st->world = world;
    if (tr->dp) {
        SL_TRY(sl_dp_state(tr->dp, segs, &st->nseg, &st->exp_avg, &st->exp_avg_sq));
        /* not host-visible (Note [Staged gradients]): the moments are copied through the contract */
        if (!tr->model->backend->caps.host_visible)
            sl_dp_state_bufs(tr->dp, &st->exp_avg_buf, &st->exp_avg_sq_buf);
        int zero = sl_dp_zero_stage(tr->dp);
        /* replicas over DP hold the same state: the first writes it (TP shards and pipeline stages each
         * hold their own part, so every dp-rank-0 writes) */
        /* with expert parallelism the first rank of each expert-data-parallel group (dp ranks 0..ep-1)
         * holds its EP rank's experts: each writes (the replicated parameters they share are equal) */
        int ep = tr->model->ep > 1 ? tr->model->ep : 1;
        int first = sl_dp_rank(tr->dp) < ep;
        st->write_params = zero > 0 || first;
        st->write_optim = zero > 0 || first;
        st->adam_t = tr->opt_t;
        st->param_shard = sl_dp_param_shard(tr->dp);
        if (!st->param_shard) st->param_shard_buf = sl_dp_param_shard_buf(tr->dp);
    } else {
        if (!tr->opt_ready) {
            SL_TRY(sl_adamw_init(&tr->opt, tr->model, tr->cfg.hp));
            tr->opt_ready = 1;
        }
        *segs = calloc(1, sizeof(sl_ckpt_seg));
        if (!*segs) return sl_fail(SL_ERR_NOMEM, "checkpoint: out of memory");
        (*segs)[0] = (sl_ckpt_seg){0, tr->model->numel, 0};
        st->nseg = 1;
        /* host-visible: the writer thread snapshots from the mappings; else save/load copy through the
         * contract (sl_ckpt_save_begin copies on this thread) */
        st->exp_avg = tr->model->backend->caps.host_visible ? sl_buffer_map(tr->opt.m) : NULL;
        st->exp_avg_sq = tr->model->backend->caps.host_visible ? sl_buffer_map(tr->opt.v) : NULL;
        st->exp_avg_buf = tr->opt.m;
        st->exp_avg_sq_buf = tr->opt.v;
        st->write_params = st->write_optim = 1;
        st->adam_t = tr->opt.t;
    }
    st->seg = *segs;
    return SL_OK;
}

void sl_trainer_set_adam_t(sl_trainer *tr, int64_t t) {
    tr->opt_t = t;
    if (tr->opt_ready) tr->opt.t = t;
}
