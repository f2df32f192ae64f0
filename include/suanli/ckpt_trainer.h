/* suanli/ckpt_trainer.h — describe a trainer's state (model, optimizer moments of this rank) for
 * sl_ckpt_save_begin / sl_ckpt_load. */
#ifndef SUANLI_CKPT_TRAINER_H
#define SUANLI_CKPT_TRAINER_H
#include "suanli/ckpt.h"
#include "suanli/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills st (borrowing the trainer's buffers); *segs is owned by the caller (free()). Allocates the
 * single-process optimizer state if it does not exist yet. */
sl_status sl_trainer_ckpt_state(sl_trainer *tr, int rank, int world, sl_ckpt_state *st, sl_ckpt_seg **segs);
/* After loading: the optimizer step count to continue from. */
void sl_trainer_set_adam_t(sl_trainer *tr, int64_t t);

#ifdef __cplusplus
}
#endif
#endif
