/* suanli train — flags and config file into sl_train_opts, then one call into the library (sl_train_run,
 * src/train). Flag names follow Megatron-LM where one exists. */
#include <string.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "suanli/train.h"

/* The flag table, bound to the library's options (config: --config's own destination). Megatron-LM names. */
static int train_flags(sl_train_opts *o, const char **config, sl_flag *flags, int cap) {
    const sl_flag t[] = {
        {"config", SL_FLAG_STR, config, 0, 0, "JSON file whose keys are these flag names", 0},
        {"data-path", SL_FLAG_STR, &o->data.path, 0, 0, "directory made by 'suanli data prepare' (required)",
         0},
        {"num-layers", SL_FLAG_INT, &o->model.num_layers, 1, 1024, "transformer layers (4)", 0},
        {"hidden-size", SL_FLAG_INT, &o->model.hidden_size, 1, 65536, "model width C (128)", 0},
        {"num-attention-heads", SL_FLAG_INT, &o->model.num_heads, 1, 4096, "attention heads (4)", 0},
        {"seq-length", SL_FLAG_INT, &o->data.seq_length, 1, 1 << 20, "tokens per sample T (128)", 0},
        {"max-position-embeddings", SL_FLAG_INT, &o->model.max_positions, 1, 1 << 20,
         "position table size (= seq-length)", 0},
        {"vocab-size", SL_FLAG_INT, &o->model.vocab_size, 2, 1 << 24,
         "must equal the data's vocab (default: from data)", 0},
        {"micro-batch-size", SL_FLAG_INT, &o->data.micro_batch_size, 1, 1 << 20,
         "samples per micro-batch B (8)", 0},
        {"global-batch-size", SL_FLAG_INT, &o->data.global_batch_size, 1, 1 << 30,
         "samples per step (= micro-batch-size); a multiple of it", 0},
        {"train-iters", SL_FLAG_INT, &o->train_iters, 0, 1e12, "optimizer steps (1000)", 0},
        {"lr", SL_FLAG_FLOAT, &o->optim.lr, 0, 10, "peak learning rate (1e-3)", 0},
        {"min-lr", SL_FLAG_FLOAT, &o->optim.min_lr, 0, 10, "final learning rate of the cosine decay (lr/10)",
         0},
        {"lr-warmup-iters", SL_FLAG_INT, &o->optim.warmup_iters, 0, 1e12, "linear warmup steps (0)", 0},
        {"lr-decay-iters", SL_FLAG_INT, &o->optim.decay_iters, 0, 1e12, "cosine decay length (= train-iters)",
         0},
        {"weight-decay", SL_FLAG_FLOAT, &o->optim.weight_decay, 0, 10,
         "AdamW decoupled weight decay on 2-D weights (0.1)", 0},
        {"clip-grad", SL_FLAG_FLOAT, &o->optim.clip_grad, 0, 1e9, "global grad-norm clip, 0 = off (1.0)", 0},
        {"adam-beta1", SL_FLAG_FLOAT, &o->optim.beta1, 0, 0.999999, "(0.9)", 0},
        {"adam-beta2", SL_FLAG_FLOAT, &o->optim.beta2, 0, 0.999999, "(0.95)", 0},
        {"adam-eps", SL_FLAG_FLOAT, &o->optim.eps, 0, 1, "(1e-8)", 0},
        {"seed", SL_FLAG_INT, &o->seed, 0, 9.007199254740992e15, "seeds init and data order (1234)", 0},
        {"eval-interval", SL_FLAG_INT, &o->eval.interval, 0, 1e12,
         "steps between val-loss evaluations, 0 = end only (100)", 0},
        {"eval-iters", SL_FLAG_INT, &o->eval.iters, 1, 1e6, "val micro-batches per evaluation (20)", 0},
        {"log-interval", SL_FLAG_INT, &o->log.interval, 1, 1e12, "steps between progress lines (1)", 0},
        {"exit-duration-in-mins", SL_FLAG_FLOAT, &o->exit_duration_mins, 0, 1e9,
         "stop (eval, save) after this many minutes, 0 = off", 0},
        {"tensorboard-dir", SL_FLAG_STR, &o->log.tensorboard_dir, 0, 0,
         "write TensorBoard event files (lm loss, lm loss validation, learning-rate, grad-norm, "
         "tokens-per-sec)",
         0},
        {"save", SL_FLAG_STR, &o->ckpt.save_dir, 0, 0,
         "output dir: model.safetensors, config.json, tokenizer.json, metrics.jsonl", 0},
        {"load", SL_FLAG_STR, &o->ckpt.load_dir, 0, 0,
         "resume from the newest valid checkpoint under this dir, or start from its model.safetensors", 0},
        {"save-interval", SL_FLAG_INT, &o->ckpt.save_interval, 0, 1e12,
         "steps between checkpoints under --save, 0 = none", 0},
        {"save-keep", SL_FLAG_INT, &o->ckpt.keep, 0, 1e6,
         "checkpoints to keep (under --save; also per host unless --ckpt-local-keep), 0 = all (2)", 0},
        {"ckpt-local-dir", SL_FLAG_STR, &o->ckpt.local_dir, 0, 0,
         "pooled checkpoints: each host writes under DIR/host-<h> (hosts: suanli run --hosts or "
         "SUANLI_HOSTS) "
         "instead of --save; resume looks there too",
         0},
        {"ckpt-replicas", SL_FLAG_INT, &o->ckpt.replicas, 1, 64,
         "with --ckpt-local-dir: copies of each shard on distinct hosts (1)", 0},
        {"ckpt-shared", SL_FLAG_BOOL, &o->ckpt.shared, 0, 1,
         "with --ckpt-local-dir: also write every checkpoint under --save (a shared mount), in the "
         "background",
         0},
        {"ckpt-local-keep", SL_FLAG_INT, &o->ckpt.local_keep, 0, 1e6,
         "with --ckpt-local-dir: checkpoints kept on each host, 0 = --save-keep (which then counts for "
         "--save)",
         0},
        {"ckpt-ec", SL_FLAG_STR, &o->ckpt.ec, 0, 0,
         "with --ckpt-local-dir: Reed-Solomon K+M across hosts instead of replicas (needs ISA-L)", 0},
        {"init-from", SL_FLAG_STR, &o->model.init_from, 0, 0,
         "start from a Hugging Face model dir (Llama/Qwen2/Mistral/Mixtral/Baichuan2/Qwen2-MoE/DeepSeek-V3 "
         "with Llama attention, GPT-2 (GPT2LMHeadModel)); --save writes HF "
         "layout; with --load, resume that model's checkpoints",
         0},
        {"threads", SL_FLAG_INT, &o->threads, 0, 1024, "compute threads (default: OpenMP's)", 0},
        {"micro-batch-lanes", SL_FLAG_INT, &o->parallel.micro_batch_lanes, 1, 16,
         "split each micro-batch's rows over this many graphs run side by side, one thread each, "
         "gradients added in lane order (small models on several cores; also under data parallelism with "
         "ZeRO-0/1; 1)",
         0},
        {"device", SL_FLAG_STR, &o->model.device, 0, 0,
         "backend the model's state and compute live on: cpu (default), opencl[:N], strict (test backend); "
         "suanli devices lists them",
         0},
        {"sample-tokens", SL_FLAG_INT, &o->sample.tokens, 0, 1e6, "print a sample of N tokens at the end (0)",
         0},
        {"sample-prompt", SL_FLAG_STR, &o->sample.prompt, 0, 0, "prompt for the sample", 0},
        {"temperature", SL_FLAG_FLOAT, &o->sample.temperature, 0, 100, "sample temperature (0.8)", 0},
        {"top-k", SL_FLAG_INT, &o->sample.top_k, 0, 1 << 24, "sample top-k, 0 = off", 0},
        {"tensor-model-parallel-size", SL_FLAG_INT, &o->parallel.tp, 1, 4096,
         "tensor-parallel ranks (GPT-2, --init-from Llama family or HF GPT-2; rank order tp fastest, world = "
         "dp x pp x tp)",
         0},
        {"tp", SL_FLAG_INT, &o->parallel.tp, 1, 4096, "short for --tensor-model-parallel-size", 0},
        {"sequence-parallel", SL_FLAG_BOOL, &o->parallel.sequence_parallel, 0, 1,
         "split the norm/residual regions along the sequence across the TP group (needs --tp > 1)", 0},
        {"pipeline-model-parallel-size", SL_FLAG_INT, &o->parallel.pp, 1, 4096,
         "pipeline stages (GPT-2, --init-from Llama family or HF GPT-2; 1F1B schedule; world = dp x pp x tp)",
         0},
        {"pp", SL_FLAG_INT, &o->parallel.pp, 1, 4096, "short for --pipeline-model-parallel-size", 0},
        {"recompute-granularity", SL_FLAG_STR, &o->parallel.recompute_granularity, 0, 0,
         "full: recompute each transformer layer in the backward from its input, keeping only the layer "
         "boundaries' activations (one more forward per step)",
         0},
        {"recompute-method", SL_FLAG_STR, &o->parallel.recompute_method, 0, 0,
         "with --recompute-granularity full: uniform (default: a checkpoint every --recompute-num-layers "
         "layers, each group recomputed as one) or block (only the first --recompute-num-layers layers of "
         "each pipeline stage recomputed, the rest kept)",
         0},
        {"recompute-num-layers", SL_FLAG_INT, &o->parallel.recompute_num_layers, 1, 1 << 20,
         "with --recompute-granularity full: layers per checkpoint (uniform) or layers recomputed (block) "
         "(1)",
         0},
        {"num-layers-per-virtual-pipeline-stage", SL_FLAG_INT, &o->parallel.layers_per_virtual_stage, 1, 4096,
         "interleaved 1F1B: layers per model chunk (num-layers / (pp x this) chunks per stage)", 0},
        {"enable-zero-bubble", SL_FLAG_BOOL, &o->parallel.zero_bubble, 0, 1,
         "pipeline: the ZB-H1 schedule (each backward split into input- and weight-gradient passes, the "
         "latter filling 1F1B's bubble; not with --num-layers-per-virtual-pipeline-stage)",
         0},
        {"decoder-first-pipeline-num-layers", SL_FLAG_INT, &o->parallel.first_stage_layers, 1, 4096,
         "layers on the first pipeline stage (uneven split; the stages between share the rest evenly)", 0},
        {"decoder-last-pipeline-num-layers", SL_FLAG_INT, &o->parallel.last_stage_layers, 1, 4096,
         "layers on the last pipeline stage, which also runs the LM head and the loss (uneven split)", 0},
        {"expert-model-parallel-size", SL_FLAG_INT, &o->parallel.ep, 1, 4096,
         "expert-parallel ranks (1): the routed experts of Qwen2-MoE / DeepSeek-V3-style --init-from models "
         "split over ep data-parallel ranks (ep divides the experts and the DP size)",
         0},
        {"ep", SL_FLAG_INT, &o->parallel.ep, 1, 4096, "short for --expert-model-parallel-size", 0},
        {"expert-tensor-parallel-size", SL_FLAG_INT, &o->parallel.etp, 1, 4096,
         "1 (default): every TP rank holds the routed experts whole; = tp: each expert's intermediate "
         "dimension split over the TP group (Megatron's flag; Qwen2-MoE / DeepSeek-V3; with --ep too)",
         0},
        {"num-experts", SL_FLAG_INT, &o->moe.num_experts, -1e9, 1e9,
         "MoE: experts per layer; checked against the --init-from model's (0 = the model's)", 0},
        {"moe-router-topk", SL_FLAG_INT, &o->moe.topk, -1e9, 1e9,
         "MoE: experts per token (default: the model's num_experts_per_tok)", 0},
        {"moe-router", SL_FLAG_STR, &o->moe.router, 0, 0,
         "MoE router: config (default), topk-softmax (Mixtral), softmax-topk (Switch, Qwen2-MoE), sigmoid "
         "(DeepSeek-V3)",
         0},
        {"moe-capacity-factor", SL_FLAG_FLOAT, &o->moe.capacity_factor, -1e9, 1e9,
         "MoE: > 0: each expert keeps ceil(f * tokens * topk / experts) tokens, later ones (token order) are "
         "dropped; default: dropless",
         0},
        {"moe-aux-loss-coeff", SL_FLAG_FLOAT, &o->moe.aux_loss_coeff, -1e9, 1e9,
         "MoE: Switch load-balancing loss coefficient, per layer (0)", 0},
        {"moe-z-loss-coeff", SL_FLAG_FLOAT, &o->moe.z_loss_coeff, -1e9, 1e9,
         "MoE: router z-loss coefficient (0)", 0},
        {"moe-router-bias-update-rate", SL_FLAG_FLOAT, &o->moe.bias_update_rate, -1e9, 1e9,
         "MoE (DeepSeek-V3): aux-loss-free balancing, bias += rate * sign(mean load - load) per step (0)", 0},
        {"attention-dropout", SL_FLAG_FLOAT, &o->model.attention_dropout, -1e9, 1e9,
         "dropout probability of the attention probabilities, in [0, 1) (0)", 0},
        {"hidden-dropout", SL_FLAG_FLOAT, &o->model.hidden_dropout, -1e9, 1e9,
         "dropout probability of the embedding output and of each attention and MLP block's output before "
         "its residual add, in [0, 1) (0)",
         0},
        {"bf16", SL_FLAG_BOOL, &o->model.bf16, 0, 1,
         "bf16 mixed precision, fp32 master weights and optimizer (GPT-2: bf16 matmul operands; --init-from "
         "models: PyTorch autocast numerics)",
         0},
        {"fp16", SL_FLAG_BOOL, &o->model.fp16, 0, 1,
         "fp16 mixed precision (torch.autocast fp16 numerics; GPT-2 and the Llama family), fp32 master "
         "weights "
         "and optimizer, dynamic loss scaling: inf/nan steps are skipped and the scale halves",
         0},
        {"initial-loss-scale", SL_FLAG_FLOAT, &o->optim.initial_loss_scale, -1e38, 1e38,
         "--fp16: starting loss scale (2^32)", 0},
        {"min-loss-scale", SL_FLAG_FLOAT, &o->optim.min_loss_scale, -1e38, 1e38,
         "--fp16: the scale never backs off below this (1)", 0},
        {"loss-scale-window", SL_FLAG_INT, &o->optim.loss_scale_window, -(1ll << 40), 1ll << 40,
         "--fp16: finite steps before the scale doubles (1000)", 0},
        {"hysteresis", SL_FLAG_INT, &o->optim.hysteresis, -(1ll << 40), 1ll << 40,
         "--fp16: overflow steps tolerated (since the last growth) before the scale halves (2)", 0},
        {"zero-stage", SL_FLAG_INT, &o->parallel.zero_stage, 0, 3,
         "0: DP all-reduce, 1: shard optimizer state, 2: + gradients, 3: + parameters", 0},
        {"ddp-bucket-size", SL_FLAG_INT, &o->parallel.bucket_elems, 1, 1ll << 40,
         "gradient bucket size in elements (1Mi)", 0},
    };
    int n = (int)(sizeof t / sizeof t[0]);
    SL_ASSERT(n <= cap);
    memcpy(flags, t, sizeof t);
    return n;
}

int sl_cmd_train(int argc, char **argv) {
    sl_train_opts o;
    sl_train_opts_default(&o);
    const char *config = NULL;
    sl_flag flags[80];
    int nf = train_flags(&o, &config, flags, 80);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: suanli train --data-path DIR [flags]\n");
            sl_flags_usage(flags, nf, stdout);
            return 0;
        }
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli train: %s\n", sl_errmsg());
        return 2;
    }
    sl_train_result r;
    sl_status st = sl_train_run(&o, NULL, &r);
    if (st == SL_OK) return r.requeue ? SL_EXIT_REQUEUE : 0;
    fprintf(stderr, "suanli train: %s\n", sl_errmsg());
    return st == SL_ERR_INVALID ? 2 : 1;
}
