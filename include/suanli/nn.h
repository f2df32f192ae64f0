/* suanli/nn.h — models over flat parameter/gradient buffers, and the optimizer.
 *
 * Usage:
 *   sl_gpt2_config cfg = {.n_layer = 4, .n_head = 4, .n_embd = 128, .vocab_size = 256, .max_seq_len = 128};
 *   sl_model *m; sl_gpt2_new_on(&cfg, sl_backend_get("cpu"), &m);  // parameters: one flat backend buffer
 *   sl_model_init_weights(m, seed);
 *   sl_tensor *ids = ..., *tg = ...;               // i32 (B, T) leaves created in m->ctx
 *   sl_tensor *logits, *loss = sl_gpt2_build(m, ids, tg, &logits);
 *   // the optimizer over these buffers: suanli/optim.h
 */
#ifndef SUANLI_NN_H
#define SUANLI_NN_H

#include "suanli/device.h"
#include "suanli/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sl_gpt2_config {
    int n_layer, n_head, n_embd, vocab_size, max_seq_len;
} sl_gpt2_config;

typedef struct sl_param_info {
    sl_tensor *t;   /* leaf bound to params_mem + offset */
    int64_t offset; /* element offset in the flat buffers */
    int64_t numel;
    int decay; /* weight decay applies (2-D weights), not to biases / norms */
    int init;  /* SL_INIT_* */
    /* Tensor parallelism (sl_gpt2_new_tp): how this leaf is a shard of the full parameter. tp_split 0
     * (zero-initialised default): replicated on every TP rank; 1 / 2: split along rows / columns (dim
     * tp_split - 1), whose full size is tp_full. The split dimension is tp_pack equal blocks (3 for GPT-2's
     * packed q|k|v), each split into tp contiguous parts [block * r / tp, block * (r + 1) / tp): heads
     * split evenly; the vocabulary may not. */
    int tp_split, tp_pack;
    int64_t tp_full;
    /* 0: split into tp parts, part tp_rank. > 0: split into tp_parts < tp parts (GQA kv heads when tp > kv
     * heads), TP rank r holding part r / (tp / tp_parts): replicated inside each group of tp / tp_parts
     * consecutive ranks, whose partial gradients are summed in the graph (SL_GROUP_TP_KV). */
    int tp_parts;
    /* Pipeline parallelism: 1 for the last stage's copy of an embedding tied to the first stage's (equal
     * values; its gradient is summed with the first stage's and it is counted once in the norm). */
    int tied_copy;
    /* Expert parallelism: 1 for a routed expert's weight, held only by the EP ranks that own the expert
     * (its gradient is reduced over the expert-data-parallel group, src/parallel/dp.c) */
    int expert;
    /* a bf16 model keeps this leaf's fp32 values (transformers' _keep_in_fp32_modules: DeepSeek-V3's router
     * weight and e_score_correction_bias); other f32 leaves of a bf16 model hold bf16 values */
    int keep_f32;
} sl_param_info;

enum { SL_INIT_NORMAL = 0, SL_INIT_NORMAL_RESID, SL_INIT_ZERO, SL_INIT_ONE };

/* Architectures built from the same graph ops (src/nn/gpt2.c, src/nn/llama.c). */
typedef enum sl_arch {
    SL_ARCH_GPT2 = 0,
    SL_ARCH_LLAMA,       /* RMSNorm, RoPE, SwiGLU, GQA, untied head */
    SL_ARCH_QWEN2,       /* Llama + q/k/v biases */
    SL_ARCH_MISTRAL,     /* Llama + sliding-window attention */
    SL_ARCH_MIXTRAL,     /* Mistral + sparse MoE FFN (top-k routing) */
    SL_ARCH_BAICHUAN,    /* Llama with fused W_pack qkv and a normalised LM head (Baichuan2-7B) */
    SL_ARCH_QWEN2_MOE,   /* Qwen2 + softmax-then-top-k MoE with a sigmoid-gated shared expert */
    SL_ARCH_DEEPSEEK_V3, /* Llama attention (not MLA) + DeepSeek-V3's sigmoid group-limited MoE */
    SL_ARCH_COUNT
} sl_arch;
const char *sl_arch_name(sl_arch a);

/* The Llama family's hyper-parameters (names follow transformers' config.json). */
typedef struct sl_llama_config {
    sl_arch arch;
    int n_layer;      /* num_hidden_layers */
    int n_head;       /* num_attention_heads */
    int n_kv_head;    /* num_key_value_heads (GQA when < n_head) */
    int head_dim;     /* head_dim, default hidden / n_head */
    int hidden;       /* hidden_size */
    int intermediate; /* intermediate_size */
    int vocab_size;
    int max_seq_len; /* max_position_embeddings */
    float rms_eps;   /* rms_norm_eps */
    float rope_theta;
    /* rope_scaling of type "llama3" (Llama 3.1+): factor > 0 enables it */
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx;
    int tie_embeddings;               /* tie_word_embeddings */
    int qkv_bias;                     /* Qwen2 (attention_bias for Llama) */
    int sliding_window;               /* 0: off */
    int n_experts, n_experts_per_tok; /* Mixtral (num_local_experts, num_experts_per_tok); Qwen2-MoE
                                         num_experts; DeepSeek-V3 n_routed_experts */
    int moe_intermediate;             /* moe_intermediate_size (Qwen2-MoE, DeepSeek-V3); 0: intermediate */
    int shared_intermediate;          /* shared expert width (Qwen2-MoE shared_expert_intermediate_size,
                                         DeepSeek-V3 n_shared_experts * moe_intermediate_size); 0: none */
    int norm_topk_prob;               /* renormalise the top-k weights (Qwen2-MoE, DeepSeek-V3) */
    int n_group, topk_group;          /* DeepSeek-V3 group-limited routing; 0: off */
    float routed_scaling;             /* DeepSeek-V3 routed_scaling_factor; 0: 1 */
    int first_dense;                  /* DeepSeek-V3 first_k_dense_replace: layers < this are dense */
} sl_llama_config;

/* Training-time MoE options (src/nn/moe.c; CLI --moe-*); zero-initialised = dropless, no router losses,
 * the configured router. */
typedef enum sl_moe_router {
    SL_MOE_ROUTER_CONFIG = 0,   /* as the architecture / config.json says */
    SL_MOE_ROUTER_TOPK_SOFTMAX, /* softmax over the top-k logits (Mixtral) */
    SL_MOE_ROUTER_SOFTMAX_TOPK, /* top-k of the softmax, not renormalised (Switch, Qwen2-MoE) */
    SL_MOE_ROUTER_SIGMOID,      /* sigmoid scores, top-k, renormalised (DeepSeek-V3; group limits kept) */
    SL_MOE_ROUTER_COUNT
} sl_moe_router;
typedef struct sl_moe_train_opts {
    float capacity_factor; /* > 0: each expert keeps ceil(cf * N * k / E) tokens, later ones are dropped; 0:
                              dropless */
    float aux_coeff;       /* Switch load-balancing loss coefficient (--moe-aux-loss-coeff) */
    float z_coeff;         /* router z-loss coefficient (--moe-z-loss-coeff) */
    sl_moe_router router;
    float bias_update_rate; /* DeepSeek-V3 aux-loss-free balancing: e_score_correction_bias += rate *
                               sign(mean load - load) after each step (sl_moe_update_bias); 0: off */
} sl_moe_train_opts;

/* Per-step MoE statistics read back from a graph's routing nodes (sl_moe_graph_stats). */
#define SL_MOE_MAX_EXPERTS 1024
typedef struct sl_moe_stats {
    int n_layers, n_experts;
    int n_loss;                      /* layers whose router losses aux and z average */
    double load[SL_MOE_MAX_EXPERTS]; /* tokens routed to each expert (assignments), summed over layers */
    double dropped_frac;             /* dropped assignments / routed assignments, all layers */
    double aux, z;                   /* raw load-balancing and z losses, mean over layers */
} sl_moe_stats;

typedef struct sl_model {
    sl_gpt2_config
        cfg;     /* GPT-2 config; for other architectures n_layer/n_head/n_embd/vocab/max_seq mirror lcfg */
    sl_ctx *ctx; /* holds parameters and every graph built on the model (owned) */
    sl_param_info *params; /* owned */
    int n_params;
    int64_t numel;         /* total parameter count */
    sl_backend *backend;   /* where the state lives (borrowed) */
    sl_buffer *params_buf; /* flat f32 parameters (owned) */
    sl_buffer *grads_buf;  /* flat f32 gradients, same layout (owned; NULL for inference models) */
    /* Host mappings of params_buf / grads_buf when the backend's memory is host-visible (cpu); NULL on
     * other backends, where code moves parameters with sl_model_params_read/write. Data parallelism and
     * ZeRO (src/parallel) run on these mappings and may rebind them (Note [Gradients in a window]). */
    float *params_mem;
    float *grads_mem;
    sl_dtype compute_dtype; /* SL_F32; SL_BF16 or SL_F16 (GPT-2 and the Llama family): the numerics of
                             * torch.autocast("cpu", bfloat16 / float16) over f32 master weights,
                             * Note [Half autocast] in gpt2.c */
    sl_arch arch;           /* SL_ARCH_GPT2 for models made by sl_gpt2_new */
    sl_llama_config lcfg;   /* valid when arch != SL_ARCH_GPT2 */
    /* bf16 inference (sl_llama_new_ex with SL_BF16): the 2-D projection weights are SL_BF16 leaves (their
     * offsets index wmem, or they are bound straight into a memory-mapped checkpoint); embedding, norms
     * and biases stay f32 in params_mem. No gradients: grads_mem is NULL. */
    sl_dtype wdtype; /* SL_F32 (default) or SL_BF16 */
    int64_t wnumel;  /* bf16 elements */
    uint16_t *wmem;  /* owned bf16 storage for weights that are not memory-mapped (may be NULL) */
    sl_buffer *wbuf; /* owned: on a backend without host-visible memory the bf16 leaves live here (offsets
                      * in bf16 elements as for wmem) and the loader copies them in; NULL elsewhere */
    void *wsrc;      /* owned mapping that bf16 leaves point into (e.g. safetensors shards) */
    void (*wsrc_free)(void *);
    /* Training with PyTorch autocast-bf16 numerics (f32 master weights), the same as compute_dtype SL_BF16
     * (kept for callers that set it): Note [Half autocast] in gpt2.c */
    int autocast_bf16;
    /* Tensor parallelism: this model holds TP rank tp_rank's shards of a model split tp ways (tp <= 1: a
     * whole model). Its graphs contain COLLECTIVE nodes (Note [Tensor-parallel graphs]). */
    int tp, tp_rank;
    int sp; /* sequence parallelism on top of TP (set before building graphs; seq length % tp == 0) */
    /* Pipeline parallelism: stage pp_rank of pp holds layers [layer0, layer0 + n_layers) (a whole model:
     * pp <= 1, layer0 0, n_layers all) */
    int pp, pp_rank, layer0, n_layers;
    /* Interleaved pipeline: vpp model chunks per stage (<= 1: one), chunk c = virtual stage c * pp + pp_rank
     * holding layers [(c * pp + pp_rank) * Lc, + Lc) with Lc = n_layers / vpp; layer0 is chunk 0's first */
    int vpp;
    /* An uneven split (sl_pp_stage_layers): layers on the first / last stage, 0 = even */
    int pp_first_layers, pp_last_layers;
    /* Expert parallelism: this model holds the routed experts [ep_rank E / ep, (ep_rank + 1) E / ep) of every
     * sparse layer (ep <= 1: all); Note [Expert-parallel dispatch] */
    int ep, ep_rank;
    /* Expert tensor parallelism (TP > 1, routed experts): every routed expert's I dimension is split over
     * the TP group like a dense MLP (gate/up column-, down row-parallel) instead of each TP rank holding it
     * whole; Note [Expert tensor parallelism] in src/nn/moe.c */
    int etp;
    sl_moe_train_opts moe; /* read when a graph is built (MoE architectures only) */
    /* Dropout probabilities in [0, 1), read when a training/evaluation graph is built (0: no dropout
     * nodes). Places (sl_model_dropout_site): attention probabilities (attention_dropout); the embedding
     * output, the attention block's output projection and the MLP's output, each before its residual add
     * (hidden_dropout) -- nanoGPT's and HF GPT-2's places, and Megatron-LM's for every family (HF Llama has
     * attention_dropout only). Off until the trainer turns them on (Note [Dropout from counters]). */
    float attention_dropout, hidden_dropout;
    /* the training graphs' recomputation (sl_graph_set_recompute: SL_RECOMPUTE_*, layers; Note [Full
     * recomputation] in src/graph/autodiff.c; set by sl_trainer_init from sl_trainer_config) */
    int recompute, recompute_layers;
} sl_model;

/* Where a dropout sits: 0 the embedding, 1 + 3 l + {0 attention probabilities, 1 attention output, 2 MLP
 * output} in layer l. Its counters (Note [Dropout from counters], src/ops/build.c) use this number. */
enum { SL_DROP_ATTN_PROBS = 0, SL_DROP_ATTN_OUT = 1, SL_DROP_MLP_OUT = 2 };
static inline int sl_model_dropout_site(int layer, int kind) { return layer < 0 ? 0 : 1 + 3 * layer + kind; }
/* x with the model's hidden dropout at `site` (x itself when hidden_dropout is 0) */
sl_tensor *sl_model_hidden_dropout(sl_model *m, sl_tensor *x, int site);
/* res + dropout(x) as one node (res NULL: dropout(x); no hidden dropout: the plain add), Note [Hidden dropout
 * bits] in src/ops/build.c */
sl_tensor *sl_model_hidden_dropout_add(sl_model *m, sl_tensor *res, sl_tensor *x, int site);
/* attention node a with the model's attention dropout (a itself when attention_dropout is 0) */
sl_tensor *sl_model_attention_dropout(sl_model *m, sl_tensor *a, int layer);

/* How a model is split: TP rank tp_rank of tp, pipeline stage pp_rank of pp, vpp model chunks per stage
 * (0 or 1: one; Megatron's interleaved schedule otherwise); first_layers / last_layers (0: even) the
 * layers of the first / last stage (Megatron's --decoder-first/last-pipeline-num-layers, no interleaving),
 * the others shared evenly by the stages between; expert-parallel rank ep_rank of ep (0 or 1: every
 * expert; MoE models of the Llama family). */
typedef struct sl_model_split {
    int tp, tp_rank, pp, pp_rank, vpp;
    int first_layers, last_layers;
    int ep, ep_rank;
    int etp; /* 1: split the routed experts over TP (sl_model.etp); needs tp > 1 */
} sl_model_split;

/* Note [Uneven pipeline stages]: the layers [*l0, *l0 + *n) of stage s of pp for L layers split as
 * sp->first_layers / sp->last_layers say (0: even; the stages without a fixed count share the rest evenly,
 * Megatron's rule). SL_ERR_INVALID, naming the flag and the numbers, when a count is out of range, the rest
 * does not divide, or a stage would hold no layer. */
sl_status sl_pp_stage_layers(int L, const sl_model_split *sp, int s, int *l0, int *n);
/* The split of L layers over pp stages whose slowest stage is fastest when the last stage also costs
 * head_layers layers (the LM head and loss; sl_gpt2_head_layers): *first / *last layers on the first / last
 * stage, both 0 when the even split is as good (ties go to it), so the flags can be passed on as they are. */
void sl_pp_balanced_split(int L, int pp, double head_layers, int *first, int *last);
/* The LM head's training FLOPs per token in units of one transformer layer's, by the count of
 * sl_gpt2_flops_per_token: 6 V C / (72 C^2 + 6 T C) = V / (12 C + T) (5.4 for GPT-2 124M at T = 64). */
double sl_gpt2_head_layers(const sl_gpt2_config *cfg, int T);

/* Validates the config (one-line error naming the field) and allocates the flat buffers on `be`
 * (sl_gpt2_new: on the cpu backend). */
sl_status sl_gpt2_new(const sl_gpt2_config *cfg, sl_model **out);
sl_status sl_gpt2_new_on(const sl_gpt2_config *cfg, sl_backend *be, sl_model **out);
/* TP rank `tp_rank`'s shards of the model split `tp` ways (Megatron layout): attention heads and the
 * MLP's hidden units split evenly (column-parallel c_attn / c_fc, row-parallel c_proj), the vocabulary
 * (wte, tied to the LM head) into contiguous row ranges, everything else replicated. Needs n_head and
 * 4 * n_embd divisible by tp (one-line error naming --tensor-model-parallel-size otherwise). Every
 * sl_param_info says how its leaf maps onto the full parameter (tp_dim, tp_pack, tp_full; see
 * sl_tp_shard_range in suanli/parallel.h for the copy between full and shard). */
sl_status sl_gpt2_new_tp(const sl_gpt2_config *cfg, sl_backend *be, int tp, int tp_rank, sl_model **out);
/* A pipeline stage (and TP shard): the first stage holds wte and wpe, the last ln_f and the LM head (a copy
 * of the tied wte, sl_param_info.tied_copy, when it is not also the first), each stage num-layers / pp
 * layers (one-line error naming --pipeline-model-parallel-size when pp does not divide them). */
sl_status sl_gpt2_new_par(const sl_gpt2_config *cfg, sl_backend *be, const sl_model_split *split,
                          sl_model **out);
/* A stage's graph (of model chunk `chunk`, 0 without interleaving): from the ids (the first virtual stage)
 * or x_in (B, T or T/tp under SP, C) to the loss (the last virtual stage, with targets) or to the chunk's
 * output activations. */
sl_tensor *sl_gpt2_build_stage(sl_model *m, int chunk, sl_tensor *ids, sl_tensor *x_in, sl_tensor *targets,
                               sl_tensor **logits_out);
/* The part of p that TP rank r of tp holds: *parts parts, part *part (Note [TP shard layout]). */
void sl_param_tp_part(const sl_param_info *p, int tp, int r, int *parts, int *part);
/* The range [lo, lo + len) of rows block_full * r / tp .. of one of tp parts (the TP split rule). */
void sl_tp_part(int64_t block_full, int tp, int r, int64_t *lo, int64_t *len);
/* Allocates params_buf (and grads_buf) on be and binds every f32 parameter (and gradient) leaf to its
 * slice; used by the constructors. */
sl_status sl_model_alloc_state(sl_model *m, sl_backend *be, int with_grads);
/* Host <-> device copies of n parameters (gradients) starting at flat element offset off. */
sl_status sl_model_params_write(sl_model *m, int64_t off, int64_t n, const float *src);
sl_status sl_model_params_read(const sl_model *m, int64_t off, int64_t n, float *dst);
sl_status sl_model_grads_read(const sl_model *m, int64_t off, int64_t n, float *dst);
/* Host view of every parameter: the mapping on host-visible backends, else a copy (*owned is set then:
 * sl_free_aligned it). For readers such as savers and exporters. */
sl_status sl_model_params_host(const sl_model *m, const float **out, float **owned);
/* Swapping state buffers (src/parallel): drop frees a buffer (its leaves stay bound to whatever the
 * caller binds next); new_params allocates a fresh parameter buffer and binds every f32 parameter leaf
 * to it; adopt_grads makes buf (owned from then on, may wrap a communicator window) the gradient buffer
 * and binds the gradient leaves to it. */
void sl_model_drop_params(sl_model *m);
void sl_model_drop_grads(sl_model *m);
sl_status sl_model_new_params(sl_model *m);
sl_status sl_model_adopt_grads(sl_model *m, sl_buffer *buf);
/* A lane of m (Note [Micro-batch lanes], src/train/lanes.c): a model of the same architecture and layout
 * whose f32 parameter leaves are bound to m's parameter buffer (read, never owned) and which owns its own
 * gradient buffer; the settings a graph reads when it is built (compute dtype, dropout, recomputation) are
 * m's. For a whole f32 training model on a host-visible backend (not split by TP, PP or EP); free it with
 * sl_model_free before m. */
sl_status sl_model_new_lane(const sl_model *m, sl_model **out);
void sl_model_free(sl_model *m);
/* GPT-2 init: N(0, 0.02); residual projections N(0, 0.02/sqrt(2L)); biases 0; norm weights 1.
 * Deterministic in (seed) through the counter RNG: each tensor uses its own stream. */
void sl_model_init_weights(sl_model *m, uint64_t seed);
sl_status sl_model_init_weights_ex(sl_model *m, uint64_t seed); /* the same, returning failures */
/* A bf16 model (sl_llama_new_ex(.., SL_BF16)) with random weights and no files: f32 leaves as
 * sl_model_init_weights_ex (rounded to bf16 values), bf16 leaves U(-0.02 sqrt 3, 0.02 sqrt 3) in an owned
 * block (m->wmem). For benchmarks and tests; Note [Random bf16 models] in src/nn/model_state.c. */
sl_status sl_model_init_bf16_random(sl_model *m, uint64_t seed);
const sl_param_info *sl_model_find(const sl_model *m, const char *name);
/* Note [Full-tensor coordinates] (src/nn/model_state.c): elements of the full parameter p is a part of, and
 * the runs that local elements [a, b) of p (offsets inside p) form in the full parameter's flattened
 * elements, in local order: fn(u, full offset, local offset, length). Identity for unsplit parameters. */
typedef void (*sl_run_fn)(void *u, int64_t full_off, int64_t local_off, int64_t len);
int64_t sl_param_full_numel(const sl_model *m, const sl_param_info *p);
void sl_param_runs(const sl_model *m, const sl_param_info *p, int64_t a, int64_t b, sl_run_fn fn, void *u);
/* Build the forward graph nodes for ids (B, T) -> logits (B, T, V); if targets != NULL also the mean
 * cross-entropy loss (returned). *logits_out receives the logits node. */
sl_tensor *sl_gpt2_build(sl_model *m, sl_tensor *ids, sl_tensor *targets, sl_tensor **logits_out);
/* GPT-2 with a KV cache (use sl_model_build_kv, which dispatches here) */
struct sl_kv_cache;
sl_tensor *sl_gpt2_build_kv(sl_model *m, sl_tensor *ids, struct sl_kv_cache *kv, int pos0);
/* FLOPs of one forward+backward per token (6N + attention), for MFU. */
double sl_gpt2_flops_per_token(const sl_gpt2_config *cfg, int T);

/* ---- Llama family (src/nn/llama.c) ---- */
/* Validates (one-line error naming the field) and allocates; parameter names are transformers' names
 * (model.layers.N.self_attn.q_proj.weight, ...), so HF checkpoints load and save by name. */
sl_status sl_llama_new(const sl_llama_config *cfg, sl_model **out);
/* wdtype SL_BF16: inference model with bf16 projection weights and bf16 compute (activations rounded
 * to bf16 where transformers' bf16 models round them; bf16 GEMM with fp32 accumulation). Leaves of
 * bf16 weights are left unbound (the loader binds them: memory-mapped or in wmem). */
sl_status sl_llama_new_ex(const sl_llama_config *cfg, sl_dtype wdtype, sl_model **out);
sl_status sl_llama_new_on(const sl_llama_config *cfg, sl_dtype wdtype, sl_backend *be, sl_model **out);
/* TP rank tp_rank's shards of a Llama-family model (Llama, Qwen2, Mistral; f32) split tp ways, as
 * sl_gpt2_new_tp: q/k/v and gate/up column-parallel, o_proj and down_proj row-parallel, the embedding and
 * an untied lm_head vocab-parallel, norms replicated. Needs tp to divide the query and the kv heads. */
sl_status sl_llama_new_tp(const sl_llama_config *cfg, sl_backend *be, int tp, int tp_rank, sl_model **out);
/* TP shard and/or pipeline stage (as sl_gpt2_new_par): the first stage holds the embedding, the last the
 * final norm and the head (an untied lm_head, or a copy of the tied embedding marked tied_copy). */
sl_status sl_llama_new_par(const sl_llama_config *cfg, sl_backend *be, const sl_model_split *split,
                           sl_model **out);
/* Any architecture's split model shaped like `like` (its config and arch), for another split. */
sl_status sl_model_new_split(const sl_model *like, sl_backend *be, const sl_model_split *split,
                             sl_model **out);
/* A pipeline stage's graph, any architecture (sl_gpt2_build_stage for GPT-2): the loss on the last
 * virtual stage, else the chunk's output activations. *router_loss (when not NULL): on a stage whose
 * output is not the loss, the sum of its MoE layers' router losses (--moe-aux-loss-coeff, --moe-z-loss-
 * coeff), which the whole model's loss adds (NULL where there are none; the last stage adds its own). */
sl_tensor *sl_model_build_stage(sl_model *m, int chunk, sl_tensor *ids, sl_tensor *x_in, sl_tensor *targets,
                                sl_tensor **router_loss);
/* Any architecture: ids (B, T) -> logits (B, T, V) [+ mean cross-entropy loss when targets]. */
sl_tensor *sl_model_build(sl_model *m, sl_tensor *ids, sl_tensor *targets, sl_tensor **logits_out);

/* KV-cache inference: one cache pair per layer, (B, S, NKV, hd) f32, owned by the sl_kv_cache. */
typedef struct sl_kv_cache {
    int B, S, n_layer;
    sl_tensor **k, **v; /* leaves bound to mem */
    sl_backend *backend;
    sl_buffer *mem; /* every layer's K and V, on the model's backend */
    sl_buffer *pos; /* GPT-2: position ids of the graphs built on this cache (pos_cap entries) */
    int pos_cap, pos_used;
    int last_only; /* set by the caller: graphs built on this cache compute the final norm and LM head on
                      the last position only, logits (B, 1, V) (a prompt's other rows are not sampled) */
} sl_kv_cache;
sl_status sl_kv_cache_new(sl_model *m, int B, int S, sl_kv_cache *kv);
void sl_kv_cache_free(sl_kv_cache *kv);
/* ids (B, Tq) at positions pos0.. -> logits (B, Tq, V) (kv->last_only: (B, 1, V)), appending the chunk's
 * K/V to the cache.
 * The position is a run-time parameter: sl_kv_graph_set_pos changes it in a built graph. */
sl_tensor *sl_model_build_kv(sl_model *m, sl_tensor *ids, sl_kv_cache *kv, int pos0);
sl_status sl_kv_graph_set_pos(sl_graph *g, int pos0);
/* MoE (src/nn/moe.c): whether the model has routed experts; the statistics of the last execution of g
 * (zeros if g has no routing node); DeepSeek-V3's bias update from those loads or from `loads` (params
 * written through the backend). */
int sl_model_is_moe(const sl_model *m);
sl_status sl_moe_graph_stats(sl_graph *g, sl_moe_stats *out);
/* the tokens an expert of m keeps when a sparse layer routes N tokens: ceil(capacity_factor N k / E), 0 when
 * nothing can be dropped (no capacity factor, or a capacity >= N) */
int64_t sl_moe_capacity(const sl_model *m, int64_t N);
/* add(user, offset, n, delta): adds delta[0..n) to parameters [offset, offset + n) of the flat buffer where
 * the caller keeps them (ZeRO-3: the rank's shard, sl_dp_add_params); NULL: read, add, write through the
 * backend. The update is a function of the loads only (rate x sign(mean - load)), never of the bias. */
typedef sl_status (*sl_param_add_fn)(void *user, int64_t offset, int64_t n, const float *delta);
sl_status sl_moe_update_bias(sl_model *m, sl_graph *g, const float *loads, sl_param_add_fn add, void *user);
/* The routing nodes that carry a selection bias (DeepSeek-V3) and their experts; their routed counts
 * (layer-major, n_layers x E floats) for a reduction over data-parallel ranks before sl_moe_update_bias
 * (loads NULL there: the graph's own). */
int sl_moe_bias_layers(sl_graph *g, int64_t *n_experts);
sl_status sl_moe_bias_loads(sl_graph *g, float *loads);

/* ---- sampling (generate) ---- */
typedef struct sl_sample_opts {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: whole vocabulary */
    float top_p;       /* in (0,1]; 1: off */
    uint64_t seed;
} sl_sample_opts;
/* Pick a token from logits[V]; `counter` indexes the RNG draw so sampling is reproducible. */
int32_t sl_sample_logits(const float *logits, int V, const sl_sample_opts *o, uint64_t counter);
/* Called with each new token; return non-zero to stop. */
typedef int (*sl_token_cb)(void *user, int32_t token);
/* GPT-2's exact sliding window of its max positions without a cache: each token re-runs the whole
 * window (W times a decode step). sl_model_generate is the fast path (a KV cache, refilled in windows
 * past the positions: Note [GPT-2 past its positions]). Builds its own graph on the model. */
sl_status sl_gpt2_generate(sl_model *m, const int32_t *prompt, int n_prompt, int max_new,
                           const sl_sample_opts *o, sl_token_cb cb, void *user);

/* ---- generation over any architecture, GPT-2 included: batched prefill + KV-cache decode
 * (src/nn/generate_kv.c) ---- */
typedef struct sl_gen_stats {
    int n_prompt, n_generated;
    double prompt_seconds, gen_seconds; /* prefill time; time of the decode steps */
    int stopped_by_eos;
} sl_gen_stats;
/* Generates up to max_new tokens after the prompt; stops early on any of stop[0..n_stop) (the stop
 * token is passed to cb and counted). cb may be NULL; out_tokens (may be NULL) receives the generated
 * ids (capacity max_new). */
sl_status sl_model_generate(sl_model *m, const int32_t *prompt, int n_prompt, int max_new,
                            const sl_sample_opts *o, const int32_t *stop, int n_stop, sl_token_cb cb,
                            void *user, int32_t *out_tokens, sl_gen_stats *stats);
/* Whether backend be runs the generation graphs of a model of config c (c->arch SL_ARCH_GPT2: n_layer,
 * n_head, hidden, vocab_size, max_seq_len read) with wdtype weights and compute dtype `compute`, without
 * loading it: the graphs of a small model of the same family and head shapes are built on be and every node
 * asked of be->supports_op. SL_ERR_UNSUPPORTED naming the first op be cannot run (Note [Generation probe]).
 */
sl_status sl_model_generate_probe(const sl_llama_config *c, sl_dtype wdtype, sl_dtype compute,
                                  sl_backend *be);

#ifdef __cplusplus
}
#endif
#endif
