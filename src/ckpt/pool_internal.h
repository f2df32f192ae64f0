/* Internal interfaces of src/ckpt: the pieces ckpt.c (the writer, the commit) and pool.c (pooled node-local
 * storage) share, and the erasure code (ec.c). Not installed. */
#ifndef SL_CKPT_POOL_INTERNAL_H
#define SL_CKPT_POOL_INTERNAL_H
#include <cjson/cJSON.h>
#include <stdint.h>

#include "suanli/ckpt.h"

#define SL_EC_MAX_K 16
#define SL_EC_MAX_M 8

/* ---- ec.c: Reed–Solomon over ISA-L (Note [Erasure code matrix]) ---- */
int sl_ec_available(void);
/* sl_ckpt_ec_encode / sl_ckpt_ec_decode: suanli/ckpt.h */

/* ---- ckpt.c ---- */
/* step dir names (step-NNNNNNN, committed ones) under root, newest first; caller frees each and the array */
int sl_ckpt_list_steps(const char *root, char ***out);
sl_status sl_ckpt_rm_rf(const char *path);
/* keep only the newest `keep` step dirs under root */
void sl_ckpt_prune(const char *root, int keep);
/* manifest from the per-rank sidecars side[0..world) (paths; absent files are skipped, or, with require_all,
 * an error: every rank of a pooled job writes one, and a missing one means its host was lost after the write)
 */
sl_status sl_ckpt_manifest_build(int64_t step, int world, const char *model_json, const char *layout_json,
                                 char *const *side, int require_all, cJSON **out);

/* ---- pool.c ---- */
/* Writer thread, after ROOT/host-<p->host>/stepbase/file was written: copy it to the replica hosts, or cut
 * it into erasure-coded blocks on k+m hosts (the full file is then removed). *placement (owned) describes
 * where everything went, with sizes and checksums, for the manifest's pool.files. */
sl_status sl_ckpt_pool_spread(const sl_ckpt_pool *p, const char *stepbase, int64_t step, const char *file,
                              cJSON **placement);
#endif
