/* The training job shared by job.c (checks and setup) and run.c (the step loop, checkpoints, final save). */
#ifndef SL_TRAIN_INTERNAL_H
#define SL_TRAIN_INTERNAL_H
#include "suanli/ckpt.h"
#include "suanli/data.h"
#include "suanli/hf.h"
#include "suanli/model_io.h"
#include "suanli/parallel.h"
#include "suanli/train.h"

typedef struct sl_train_job {
    sl_train_opts o; /* the caller's options with the defaults that depend on the data/mesh resolved */
    FILE *out, *err; /* out: NULL on ranks other than 0 once setup is done */
    sl_comm *world;  /* NULL: single process */
    int own_world;   /* created from the environment: freed here */
    sl_mesh mesh;
    int mesh_ok, rank0;

    sl_dataset *train, *val;
    sl_backend *be; /* the model's backend (--device) */
    sl_tokenizer *tok;
    char tokpath[4096]; /* the data's tokenizer.json */

    sl_model *m;
    sl_gpt2_config cfg;
    sl_hf_info hf_info; /* with init_from */
    sl_trainer tr;
    int trainer_ok;
    sl_dp *dp;               /* NULL without data parallelism */
    sl_tp *tp;               /* the collective provider: NULL without tensor or expert parallelism */
    int vpp;                 /* model chunks per pipeline stage (interleaved 1F1B), 1 otherwise */
    double tp_sec, tp_bytes; /* the last step's time in and bytes through TP collectives (this rank) */
    double ep_sec, ep_bytes; /* the same for the expert-parallel all-to-alls */
    sl_moe_stats moe_stats;  /* the last step's (MoE models; moe_stats.n_layers == 0 otherwise) */
    float *moe_loads; /* DeepSeek-V3 bias update: the step's routed counts per biased layer, summed over its
                         micro-batches (moe_nl layers x moe_E experts) */
    int moe_nl;
    int64_t moe_E;
    int moe_chunk_nl[SL_PIPE_MAX_CHUNKS]; /* under PP: the biased layers of each model chunk of this stage */
    int B, T, accum;
    int64_t eval_iters_asked; /* --eval-iters when capped to one pass over the val split, else 0 */

    /* where the run starts: a checkpoint (resume) or the weights in load_dir/model.safetensors */
    int resume, init_from_weights;
    int note_fresh;    /* --load == --save without a checkpoint yet: a fresh start, noted after setup */
    int ckpt_verified; /* find_start verified ckdir's checksums (the load skips them) */
    char ckdir[4096], wpath[4200];
    char
        ckfrom[4200]; /* what the resume read, as "resumed from" names it (Note [Where a resume came from]) */
    int64_t start_step;
    int no_steps; /* the step loop ran no step (start_step >= train_iters): val loss of the start weights */
    double resume_seconds;
    double setup_t0, setup_cpu0; /* sl_time_sec() and process CPU seconds when setup began */

    /* outputs and checkpoint orchestration */
    FILE *metrics;
    struct sl_tb_writer *tb; /* --tensorboard-dir (rank 0), opened by open_outputs (job.c) */
    sl_ckpt_writer *ckw;
    int64_t pending_step; /* step of a checkpoint being written; -1: none */
    char model_json[512], layout_json[1024];
    int pooled;              /* --ckpt-local-dir */
    int64_t committing_step; /* pooled: step whose commit runs on the writer thread (rank 0, or every rank
                              * with pool.comm); -1: none */
    double commit_t0;
    sl_ckpt_pool pool; /* this rank's view of the pool */
    int pool_restored; /* pool_restore rebuilt a step into this host's .restore (removed once loaded) */
    int mem_partial;   /* some rank's in-memory root is not rank 0's: rank 0 does not commit its root (Note [A
                        * partial in-memory copy is not committed]) */
    int mem_drop; /* the first rank of a node whose in-memory root rank 0 does not commit: removes each step's
                   * uncommitted copy there (Note [In-memory roots on every node]) */
    sl_comm *ckpt_comm; /* pooled, several ranks: the writer threads' communicator (pool.comm) */
} sl_train_job;

/* Bad input (SL_ERR_INVALID): a one-line message. The arguments may include sl_errmsg(). */
sl_status sl_train_bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A runtime failure with status st (never SL_ERR_INVALID, which means bad input to the caller). */
sl_status sl_train_fail(sl_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* job.c: every check and allocation before the first step; bad input is reported before anything is
 * written (the save dir and metrics.jsonl are created last). */
sl_status sl_train_job_setup(sl_train_job *j, const sl_train_opts *opts);
void sl_train_job_release(sl_train_job *j, int failed);

/* train_moe.c: the --moe-* / --num-experts checks (bad input, before any write; reads --init-from's
 * config.json), their application to the model before the trainer builds its graph, the statistics and
 * bias update after each step, and the metrics.jsonl fields. */
sl_status sl_train_moe_check(sl_train_job *j);
sl_status sl_train_moe_apply(sl_train_job *j);
sl_status sl_train_moe_after_step(sl_train_job *j);
/* after the trainer exists: DeepSeek-V3's bias update collects each micro-batch's loads */
sl_status sl_train_moe_bias_setup(sl_train_job *j);
void sl_train_moe_metrics(const sl_train_job *j, FILE *f);

/* user + system CPU seconds of this process (getrusage) */
double sl_train_cpu_seconds(void);
#endif
