/* suanli/ckpt_trainer.h — kept for old includes: sl_trainer_ckpt_state and sl_trainer_set_adam_t are
 * declared in suanli/train.h (the train layer owns trainer checkpoints). */
#ifndef SUANLI_CKPT_TRAINER_H
#define SUANLI_CKPT_TRAINER_H
#include "suanli/train.h"

#ifdef __cplusplus
extern "C" {
#endif
#ifdef __cplusplus
}
#endif
#endif
