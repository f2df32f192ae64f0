/* suanli/ckpt.h — sharded, asynchronous, resharding training checkpoints.
 *
 * Layout: ROOT/step-NNNNNNN/{manifest.json, shard-rRRRRR.safetensors...} and ROOT/latest (the name of the
 * newest committed step dir). Every tensor (param/<name>, exp_avg/<name>, exp_avg_sq/<name>) is described
 * in the manifest by its global shape and dtype and a list of shards: file, key in that file, the element
 * range [offset, offset+length) of the flattened global tensor it holds, and an XXH3 checksum. Any saved
 * layout loads into any other: a reader copies the overlap of each shard with the ranges it needs.
 *
 * Usage (every rank):
 *   sl_ckpt_writer *w = sl_ckpt_writer_new();
 *   sl_ckpt_save_begin(w, "out", &state);          // snapshot to host memory, background thread writes
 *   ... training continues; each step: ...
 *   if (all ranks report sl_ckpt_writer_done(w))   // e.g. all-reduce MIN of the flag
 *       rank 0: sl_ckpt_commit("out", step, world, keep);   // manifest, fsync, rename, latest, prune
 *   sl_ckpt_load(dir, &state);                     // resharding load; sl_ckpt_find_latest picks a valid one
 */
#ifndef SUANLI_CKPT_H
#define SUANLI_CKPT_H
#include <stdio.h>

#include "suanli/nn.h"
#include "suanli/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A range of the flat parameter buffer owned by this rank; `off` indexes the rank's state arrays.
 * Data parallelism defines it (sl_dp_state hands out this rank's segments). */
typedef sl_dp_seg sl_ckpt_seg;

typedef struct sl_ckpt_state {
    sl_model *m;
    const sl_ckpt_seg *seg; /* optimizer-state segments of this rank (stage 0: the whole buffer) */
    int nseg;
    float *exp_avg, *exp_avg_sq;             /* host memory indexed by seg.off, or NULL: */
    sl_buffer *exp_avg_buf, *exp_avg_sq_buf; /* the moments in device buffers (indexed by seg.off), copied */
    float *param_shard; /* ZeRO-3: parameters indexed by seg.off (NULL: m->params_mem indexed by lo, or
                           m->params_buf through copies when the backend is not host-visible) */
    sl_buffer *param_shard_buf; /* ZeRO-3 on such a backend: the shard's device buffer (seg.off), copied */
    int write_params;           /* this rank writes params for its segments */
    int write_optim;            /* this rank writes optimizer state for its segments */
    int64_t step;               /* optimizer steps completed */
    int64_t adam_t;
    uint64_t seed;
    /* fp16 dynamic loss scaling (Megatron keeps its grad scaler in the optimizer state): sl_ckpt_load sets
     * has_scaler when the manifest's train.loss_scaler holds a valid state; saving takes it from layout_json
     */
    int has_scaler;
    double loss_scale;
    int64_t growth_tracker, hysteresis_tracker, skipped;
    int rank, world;
    const char *layout_json; /* JSON object describing the mesh / ZeRO stage (embedded in the manifest) */
    int verified; /* sl_ckpt_load: the caller verified dir just before (sl_ckpt_find_latest/_verify), so the
                     load skips the checksums; 0: the load verifies every shard it reads */
} sl_ckpt_state;

typedef struct sl_ckpt_writer sl_ckpt_writer;
sl_ckpt_writer *sl_ckpt_writer_new(void);
/* Waits for a pending write, then frees. */
void sl_ckpt_writer_free(sl_ckpt_writer *w);
/* Start saving this rank's part: the background thread copies the live state into host memory (see
 * sl_ckpt_writer_wait_snapshot) and writes ROOT/step-N.tmp/shard-rR.safetensors + its sidecar. */
sl_status sl_ckpt_save_begin(sl_ckpt_writer *w, const char *root, const sl_ckpt_state *st);
/* Root of the in-memory checkpoint copy: SUANLI_MEM_CKPT_DIR (a tmpfs dir that `suanli run` creates for
 * the job and removes at exit, one per node), or NULL. Writers mirror each shard there; rank 0 commits it
 * like the disk copy (keeping only the newest) when every rank writes into the same root, and a restarted
 * job loads from it when it is at least as new. Otherwise (several nodes) the first local rank of every
 * node removes its node's uncommitted copies (Notes [In-memory roots on every node] and [A partial
 * in-memory copy is not committed] in src/train/job.c). */
const char *sl_ckpt_mem_root(void);
/* Allocate the snapshot buffer ahead of the first save (floats = elements per save; 4096-aligned; its
 * pages are faulted in by the writer thread during the first snapshot). */
sl_status sl_ckpt_writer_reserve(sl_ckpt_writer *w, size_t floats);
/* Block until the writer has copied the live state (call before anything modifies parameters or
 * optimizer state, i.e. before the next optimizer update). Cheap when no save is in flight. */
void sl_ckpt_writer_wait_snapshot(sl_ckpt_writer *w);
/* 1 when no write is pending (the last one finished, successfully or not). */
int sl_ckpt_writer_done(sl_ckpt_writer *w);
/* Wait for the pending write; returns its status. */
sl_status sl_ckpt_writer_wait(sl_ckpt_writer *w);
/* Seconds the last save stalled the training thread (save_begin + waiting for the snapshot), bytes written.
 */
double sl_ckpt_writer_stall(const sl_ckpt_writer *w);
double sl_ckpt_writer_write_seconds(const sl_ckpt_writer *w);
/* The last save's parts: the snapshot copy with its checksums, the local shard file's write (fsync
 * included; 0 under erasure coding, which writes blocks only), and whether that went out with O_DIRECT. */
void sl_ckpt_writer_times(const sl_ckpt_writer *w, double *snapshot, double *disk, int *direct);
size_t sl_ckpt_writer_bytes(const sl_ckpt_writer *w);
/* Rank 0, after every rank's write finished: merge the sidecars into manifest.json, fsync, rename the
 * tmp dir to step-N, update `latest` atomically, keep only the newest `keep` step dirs (0: all). */
sl_status sl_ckpt_commit(const char *root, int64_t step, int world, int keep, const char *model_json,
                         const char *layout_json);

/* Newest committed checkpoint under root that verifies (checksums, files present); older ones are tried
 * when the newest is corrupt (a warning names the problem). out receives the step dir path.
 * Returns SL_ERR_IO with "no checkpoint" when there is none. */
sl_status sl_ckpt_find_latest(const char *root, char *out, size_t cap);
/* Step number of the newest committed step dir under root (by name, nothing read or verified); -1 if none. */
int64_t sl_ckpt_newest_step(const char *root);
/* Load params (all), optimizer state (the rank's segments), step, adam_t, seed. The model shape must
 * match the manifest's tensors. */
sl_status sl_ckpt_load(const char *dir, sl_ckpt_state *st);
/* Only the manifest's part of sl_ckpt_load: step, adam_t, seed (kept when the manifest records none) and the
 * loss scaler into st; no tensor is read, st->m is not used. A resume checks them before the load. */
sl_status sl_ckpt_load_train_state(const char *dir, sl_ckpt_state *st);
/* Check every shard's checksum, and that config.json (when the manifest has a model) is the manifest's
 * "model"; print a summary with `inspect`. */
sl_status sl_ckpt_verify(const char *dir);
sl_status sl_ckpt_inspect(const char *dir, FILE *f);
/* 1 if dir looks like a checkpoint root (has `latest`) or a step dir (has manifest.json). */
int sl_ckpt_is_checkpoint(const char *dir);
/* Remove what interrupted saves of a job left under root (Note [Stale temp dirs]): directories named
 * step-NNNNNNN.tmp or step-NNNNNNN.tmpK (K digits) and files latest.tmp.PID; nothing else (a symlink of
 * such a name neither). Call it only while no writer of the job runs (a restart's setup). Returns how many
 * were removed; names in `names` (may be NULL), ", "-separated, truncated to cap. */
int sl_ckpt_remove_stale_tmp(const char *root, char *names, size_t cap);
/* Remove root/step-N.tmpK, the uncommitted step dir this attempt's writers (K = SUANLI_RESTART_COUNT) left
 * for step N: the in-memory copy of a node whose root no commit reaches (Note [In-memory roots on every
 * node] in src/train/job.c). Call it once every writer of step N finished. Absent: SL_OK. */
sl_status sl_ckpt_remove_uncommitted(const char *root, int64_t step);

/* ---- pooled node-local storage (src/ckpt/pool.c; Note [Pooled checkpoint store]) ----
 * Each rank writes its shard into its host's local directory ROOT/host-<h>/step-N/ and makes it redundant
 * across hosts: `replicas` copies on hosts h, h+1, ... (mod hosts), or Reed–Solomon ec_k data + ec_m
 * parity blocks on hosts h .. h+k+m-1. Rank 0 commits the step on every host (manifest.json with the
 * placement and checksums of every copy and block). A restore reassembles the newest step that the
 * surviving hosts can rebuild.
 *   sl_ckpt_pool p = {"local", hosts, sl_ckpt_pool_host_of(rank, world, hosts), 2, 0, 0};
 *   sl_ckpt_writer_set_pool(w, &p);     // save_begin now writes under local/host-<h>
 *   ... rank 0: sl_ckpt_pool_commit(&p, step, world, keep, model_json, layout_json);
 *   sl_ckpt_pool_gather("local", hosts, -1, "restored", &step);   // a plain step dir for sl_ckpt_load */
typedef struct sl_ckpt_pool {
    const char *local_root; /* borrowed */
    int hosts;              /* hosts in the job (>= 1) */
    int host;               /* this rank's host, 0..hosts-1 */
    int replicas;           /* copies of each shard on distinct hosts, own host first (>= 1), or 0 with EC */
    int ec_k, ec_m;         /* erasure coding: k data + m parity blocks on k+m distinct hosts (0: off) */
    /* The job's ranks (borrowed; rank order = job rank), used only by the writer threads: copies, blocks and
     * the commit's sidecars travel over it, and no rank opens another host's directory (Note [Pool
     * transfers over comm]); sl_ckpt_writer_commit_pool is then called on every rank. NULL: the owning rank
     * writes into ROOT/host-<peer> itself (hosts that share a file system view, as in one machine's tests).
     */
    sl_comm *comm;
} sl_ckpt_pool;
/* Host of a rank when `hosts` hosts hold `world` ranks in consecutive groups: rank * hosts / world. */
int sl_ckpt_pool_host_of(int rank, int world, int hosts);
/* Parse "K+M" (1 <= K <= 16, 1 <= M <= 8); SL_ERR_INVALID naming --ckpt-ec otherwise. */
sl_status sl_ckpt_pool_parse_ec(const char *s, int *k, int *m);
/* Check a pool's settings against its host count (messages name --ckpt-replicas / --ckpt-ec / --hosts);
 * SL_ERR_UNSUPPORTED when EC is asked of a build without ISA-L. */
sl_status sl_ckpt_pool_check(const sl_ckpt_pool *p);
/* 1 when this build has erasure coding (Intel ISA-L). */
int sl_ckpt_ec_available(void);
/* The Reed–Solomon code of --ckpt-ec (Note [Erasure code matrix] in src/ckpt/ec.c), 1 <= k <= 16, 1 <= m <=
 * 8: parity[0..m) = code of data[0..k), every block len bytes. Decode: blocks[0..k+m), present[i] != 0 for
 * the intact ones (at least k); the lost data blocks are rebuilt in place (lost parity is left alone).
 * SL_ERR_UNSUPPORTED without ISA-L. */
sl_status sl_ckpt_ec_encode(int k, int m, size_t len, uint8_t **data, uint8_t **parity);
sl_status sl_ckpt_ec_decode(int k, int m, size_t len, uint8_t **blocks, const int *present);
/* Pool the writer's saves (a copy of *p is kept; NULL: back to a single directory). */
void sl_ckpt_writer_set_pool(sl_ckpt_writer *w, const sl_ckpt_pool *p);
/* The shared tier of a pooled writer: every save is also written as a plain checkpoint under shared_root
 * (step-N.tmp, by each rank's writer thread), and sl_ckpt_writer_commit_pool then commits it there too,
 * keeping `keep` steps (0: all). A failure there is a warning: the pooled copy is what counts. NULL: off. */
void sl_ckpt_writer_set_drain(sl_ckpt_writer *w, const char *shared_root, int keep);
/* Rank 0 (every rank when the pool has a comm): run the pooled commit (sl_ckpt_pool_commit, or its
 * collective form over the pool's comm, where each host's first rank commits its own host) on the writer
 * thread, so that the fsyncs of every host's commit do not stall training; sl_ckpt_writer_done / _wait
 * report it like a write, and the next save_begin waits for it. */
sl_status sl_ckpt_writer_commit_pool(sl_ckpt_writer *w, int64_t step, int world, int keep,
                                     const char *model_json, const char *layout_json);
double sl_ckpt_writer_commit_seconds(const sl_ckpt_writer *w);
/* Rank 0, after every rank's write finished: the manifest (sidecars of every rank, with the placement of
 * every copy and block) into every host's step-N.tmp dir, which is renamed to step-N; latest; prune. */
sl_status sl_ckpt_pool_commit(const sl_ckpt_pool *p, int64_t step, int world, int keep,
                              const char *model_json, const char *layout_json);
/* 1 if dir holds host-<h> subdirectories with checkpoints. */
int sl_ckpt_is_pool(const char *dir);
/* Assemble step `step` (< 0: the newest one that can be rebuilt, older ones tried after a warning) from
 * ROOT/host-* into the checkpoint root `dest`: dest/step-N (written as step-N.tmp, then renamed) and
 * dest/latest; other step dirs under dest are removed. hosts: the job's host count (a placement on a host
 * >= hosts is an error); 0: the manifest's. dest NULL: verify only. *got: the step assembled. The error
 * names the missing or damaged shard files and hosts. */
sl_status sl_ckpt_pool_gather(const char *root, int hosts, int64_t step, const char *dest, int64_t *got);
/* sl_ckpt_pool_gather(p->local_root, p->hosts, -1, dest, got) done by the first rank of every host together
 * (collective over `leaders`: those ranks, rank = host), each reading only its own host's directory; the
 * reads of another host's files arrive over `leaders` from that host's first rank (Note [Pool transfers
 * over comm]). Every caller assembles the same step into its dest (its own host's .restore) or fails. */
sl_status sl_ckpt_pool_restore(const sl_ckpt_pool *p, sl_comm *leaders, const char *dest, int64_t *got);
/* Remove what a restore assembled into dest (its step dirs, partial ones included, and `latest`) and dest
 * itself when that leaves it empty: a restart's .restore once every rank of the host has loaded it. A file
 * of someone else's in dest is kept (and so dest). */
sl_status sl_ckpt_pool_restore_remove(const char *dest);
/* Placement and redundancy of the newest step (every copy and block: ok, missing, damaged) to f. */
sl_status sl_ckpt_pool_inspect(const char *root, int hosts, FILE *f);
/* The offline tools on a cluster without a shared file system (Note [Pool transfers over comm]): collective
 * over `hosts` (one rank per host, rank = host), each rank reading only ROOT/host-<rank> (its node-local
 * disk) and the other hosts' files arriving over the communicator. gather: dest (NULL: verify only) is
 * written by rank 0 alone; inspect: the report goes to f on rank 0. */
sl_status sl_ckpt_pool_gather_comm(const char *root, sl_comm *hosts, int64_t step, const char *dest,
                                   int64_t *got);
sl_status sl_ckpt_pool_inspect_comm(const char *root, sl_comm *hosts, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
