/* Predicates shared by the accelerator backends (src/device/opencl, src/device/cuda): which ops an f32
 * device backend without host-visible memory runs (the op table of GPT-2 / Llama-family training and
 * KV-cache generation, with the CPU kernels' layout limits) and the range checks and step constants of
 * the state operations. Each backend adds its own extras (bf16 GEMMs, local-memory limits) around these.
 * Not a backend: includes none, is included by them only. */
#ifndef SL_DEVICE_ACCEL_SUPPORT_H
#define SL_DEVICE_ACCEL_SUPPORT_H

#include "suanli/device.h"

/* rows with a unit last stride */
int sl_accel_last_unit(const sl_tensor *t);
/* node and every source f32 */
int sl_accel_all_f32(const sl_tensor *n);
/* Note [Accelerator supported ops] (accel_support.c): the f32 op table; 1 when n can run */
int sl_accel_supports(const sl_tensor *n);
/* the same, also accepting what `extra` names (SL_ACCEL_*): the dropout ops (DROPOUT, ATTENTION /
 * ATTENTION_BACK with dropout of the probabilities) for a backend that draws the masks (Note [OpenCL
 * dropout]); the vocabulary-parallel ops of tensor parallelism (EMBEDDING / EMBEDDING_BACK of a vocab shard,
 * CE_VP_STATS, CE_VP, CE_VP_BACK: Note [OpenCL tensor parallelism]); f16 storage (CONT / ZEROS / CONCAT in
 * f16, CAST f32 <-> f16: Note [OpenCL f16 storage]); the half numerics of ATTENTION / ATTENTION_BACK (the
 * eager modes 1-4, Note [OpenCL half attention]) and ROPE (modes 0-6, Note [RoPE numerics]) */
enum { SL_ACCEL_DROPOUT = 1, SL_ACCEL_VOCAB_SHARD = 2, SL_ACCEL_F16_STORAGE = 4, SL_ACCEL_HALF_NUMERICS = 8 };
int sl_accel_supports_ex(const sl_tensor *n, int extra);

/* What a dropout node draws (Note [Dropout from counters], src/ops/build.c): DROPOUT, or an ATTENTION node
 * (for ATTENTION_BACK, its forward node) */
typedef struct sl_accel_dropout {
    int on;               /* 0: the identity (turned off, or p = 0) */
    uint64_t seed, hi;    /* the Philox key, and the counter's high words: stream * 2^16 + site */
    uint32_t thr;         /* kept iff the word >= thr = sl_dropout_threshold(p) */
    float keep;           /* the kept values' scale, (float)(1 / (1 - p)) computed in double */
    int64_t heads, head0; /* ATTENTION: the model's query heads, this node's first (TP); heads 0 -> NH */
    int64_t seq, t0;      /* DROPOUT on a sequence shard: the full length and the shard's first position */
} sl_accel_dropout;
sl_accel_dropout sl_accel_dropout_of(const sl_tensor *n);

/* float span [off, off + n) inside buffer b */
int sl_accel_span_ok(const sl_buffer *b, int64_t off, int64_t n);
/* every span of an AdamW call inside its buffers; else SL_ERR_INVALID naming the backend and the span */
sl_status sl_accel_adamw_check(const sl_adamw_call *c, const char *backend);
/* the step constants of Note [AdamW order of operations], computed as the CPU does */
typedef struct sl_accel_adamw_consts {
    float step;     /* lr / (1 - beta1^t) */
    float bc2_sqrt; /* sqrt(1 - beta2^t) */
    float decay_on; /* 1 - lr * weight_decay (spans with decay) */
} sl_accel_adamw_consts;
sl_accel_adamw_consts sl_accel_adamw_consts_of(const sl_adamw_call *c);
#endif
