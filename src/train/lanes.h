/* Micro-batch lanes of the trainer (Note [Micro-batch lanes], lanes.c). Lane 0 is the trainer's own graph,
 * model and input buffer; lanes 1..L-1 are built here. */
#ifndef SL_TRAIN_LANES_H
#define SL_TRAIN_LANES_H
#include "suanli/train.h"

/* SL_ERR_INVALID naming --micro-batch-lanes when cfg->lanes cannot run on m */
sl_status sl_lanes_check(const sl_model *m, const sl_trainer_config *cfg);
/* after the trainer built its own graph (for B / lanes rows): lanes 1..L-1, every lane's dropout rows */
sl_status sl_lanes_build(sl_trainer *tr);
void sl_lanes_free(sl_trainer *tr);
/* lanes 1..L-1: gradient overwrite and dropout for the next run (lane 0 is the trainer's graph) */
void sl_lanes_set(sl_trainer *tr, int overwrite, int drop_on, uint64_t seed, uint64_t stream);
void sl_lanes_set_seed(sl_trainer *tr, float seed);
/* lanes 1..L-1: zero the gradients that no node of the lane writes */
sl_status sl_lanes_zero_unwritten(sl_trainer *tr);
/* one micro-batch (B, T) split over the lanes, run side by side; *loss: the lanes' mean */
sl_status sl_lanes_run(sl_trainer *tr, const int32_t *ids, const int32_t *targets, int fwd_only, float *loss);
/* the trainer's gradients += lane 1's + ... (lane order) */
sl_status sl_lanes_sum_grads(sl_trainer *tr);
#endif
