/* Internal interfaces of src/ckpt: the pieces ckpt.c (the writer, the commit) and pool.c (pooled node-local
 * storage) share, and the erasure code (ec.c). Not installed. */
#ifndef SL_CKPT_POOL_INTERNAL_H
#define SL_CKPT_POOL_INTERNAL_H
#include <pthread.h>
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
/* after the commit of `step` under root, with keep > 0: remove the step dirs newer than it (Note [Pruning
 * after a commit]), then keep only the newest `keep`; keep <= 0: nothing is removed */
void sl_ckpt_prune(const char *root, int64_t step, int keep);
/* manifest from the per-rank sidecars side[0..world) (paths; absent files are skipped, or, with require_all,
 * an error: every rank of a pooled job writes one, and a missing one means its host was lost after the write)
 */
sl_status sl_ckpt_manifest_build(int64_t step, int world, const char *model_json, const char *layout_json,
                                 char *const *side, int require_all, cJSON **out);
/* the same from the sidecars' texts (texts[r] of lens[r] bytes, every rank's present) */
sl_status sl_ckpt_manifest_build_texts(int64_t step, int world, const char *model_json,
                                       const char *layout_json, char *const *texts, const size_t *lens,
                                       cJSON **out);

/* ---- shard_io.c (Note [Shard write path]) ---- */
enum { SL_CKPT_IO_DIRECT = 1, SL_CKPT_IO_SYNC = 2 };
typedef struct {
    int direct;     /* the data went out with O_DIRECT (0: buffered, asked so or refused by the FS) */
    double seconds; /* open to the directory fsync */
    size_t bytes;
} sl_ckpt_io;
/* SUANLI_CKPT_DIRECT=0 turns O_DIRECT off (docs/ENV.md) */
int sl_ckpt_direct_enabled(void);
/* hdr[0, hlen) then data[0, dlen) to path atomically (path.tmp.PID, [fsync], rename, [fsync dir]);
 * SL_CKPT_IO_DIRECT tries O_DIRECT when hdr is 4096-aligned and hlen a multiple of 4096 (data should be
 * 4096-aligned too; where the kernel refuses anything, the write continues buffered). On failure neither
 * path nor the temp file exists and the message names path and the failed call. io may be NULL. */
sl_status sl_ckpt_write_file(const char *path, const void *hdr, size_t hlen, const void *data, size_t dlen,
                             int flags, sl_ckpt_io *io);
/* The same write in pieces, for files that arrive in parts (pool_comm.c): open path.tmp.PID (O_DIRECT when
 * direct is set, enabled and accepted), write pieces at any 4096-aligned offsets, then close: keep = 1
 * truncates the last block's zero padding, fsyncs when sync, and renames over path; keep = 0 (or an earlier
 * failure) removes the temp file. Under O_DIRECT, p must be 4096-aligned; a piece whose length is not a
 * multiple of 4096 must be the file's last: it is written zero-padded, in place when p has room up to cap
 * bytes (the padding overwrites p[n, cap)), else from an aligned copy. Failures name path and the call. */
typedef struct {
    int fd, direct, padded, failed, err;
    double t0, seconds; /* open time; open to close, set by a successful close */
    char path[4400], tmp[4420];
} sl_ckpt_out;
/* sl_ckpt_write_file on a helper thread (where one cannot start, on the caller's, before start returns):
 * the disk write of one file beside other work. join returns its status, with its message set again. */
typedef struct {
    const char *path;
    const void *hdr, *data;
    size_t hlen, dlen;
    int flags;
    sl_ckpt_io io;
    sl_status st;
    char err[512];
    int running;
    pthread_t th;
} sl_ckpt_file_job;
void sl_ckpt_file_job_start(sl_ckpt_file_job *j);
sl_status sl_ckpt_file_job_join(sl_ckpt_file_job *j);
sl_status sl_ckpt_out_open(sl_ckpt_out *o, const char *path, int direct);
sl_status sl_ckpt_out_write(sl_ckpt_out *o, const void *p, size_t n, size_t off, size_t cap);
sl_status sl_ckpt_out_close(sl_ckpt_out *o, size_t size, int sync, int keep);

/* ---- pool.c ---- */
/* Writer thread: the shard file's bytes are hdr[0, hlen) + data[0, dlen) (the snapshot, nothing read
 * back). With replicas, ROOT/host-<p->host>/stepbase/file is written by the caller (before, or at the same
 * time on another thread: ckpt.c) and the other replica hosts get copies; with erasure coding the file is
 * not written, and its k+m blocks go to k+m hosts.
 * *placement (owned) describes where everything went, with sizes and checksums, for pool.files. */
/* ---- pool_comm.c (Note [Pool transfers over comm]) ---- */
#define SL_CKPT_POOL_MAX_STREAMS (SL_EC_MAX_K + SL_EC_MAX_M)
/* the bytes move in pieces of this size (the exchange's rounds, a restore stream's broadcasts) */
enum { SL_CKPT_POOL_PIECE = 8 << 20 };
/* The exchange's wire record: every rank all-gathers SL_CKPT_POOL_MAX_STREAMS of these (unused: src = dst
 * = -1), then stream i's pieces (head, then body) travel from src to dst in rounds. Here so that a test can
 * stand in for a peer (tests/fault/test_pool_cut.c). */
typedef struct {
    int32_t src, dst; /* ranks */
    int64_t hlen, blen;
    char name[88]; /* file name in the receiver's host step dir */
} sl_ckpt_pool_stream_desc;
_Static_assert(sizeof(sl_ckpt_pool_stream_desc) == 112, "stream descriptor is 112 bytes");
typedef struct {
    int dst;          /* receiving rank */
    const char *name; /* file name in the receiver's host step dir (< 88 bytes) */
    const void *head, *body;
    size_t hlen, blen;
} sl_ckpt_pool_stream;
/* first rank of a host (world when the host has none); the rank of `host` that receives rank src's streams */
int sl_ckpt_pool_first_rank(int host, int world, int hosts);
int sl_ckpt_pool_receiver(int src, int host, int world, int hosts);
/* Collective over p->comm (every rank, each with its outgoing streams, possibly none): sends out[] and
 * writes every stream addressed to this rank into ROOT/host-<p->host>/stepbase/<name> (temp, fsync, rename).
 * Every rank returns only once the exchange is over; a local write failure is reported after it. */
sl_status sl_ckpt_pool_exchange(const sl_ckpt_pool *p, const char *stepbase, const sl_ckpt_pool_stream *out,
                                int nout);
/* Collective over lc, the hosts' leaders (rank = host), in lock step: the restore stream of Note [Pooled
 * restore stream]. Host `holder` reads path (its own disk; name and holder go into messages) in pieces and
 * every leader receives them and hashes them ("xxh3:%016llx" into got); a leader with dest set writes them to
 * dest (temp name, O_DIRECT, no fsync), renamed into place only when got equals want_sum. Returns 1 when the
 * holder read the whole file, of size want (SIZE_MAX: any), and every piece arrived; else 0 with the reason
 * in why, the same on every leader. *wst: this leader's own write status (not agreed). */
int sl_ckpt_pool_restore_stream(sl_comm *lc, int holder, const char *path, const char *name, size_t want,
                                const char *dest, const char *want_sum, char *got, size_t gcap,
                                sl_status *wst, char *why, size_t wcap);
/* Collective over p->comm (writer threads): the pooled commit of Note [Pool transfers over comm]; side is
 * this rank's sidecar text. */
sl_status sl_ckpt_pool_commit_comm(const sl_ckpt_pool *p, int64_t step, int keep, const char *model_json,
                                   const char *layout_json, const char *side);

sl_status sl_ckpt_pool_spread(const sl_ckpt_pool *p, const char *stepbase, int64_t step, const char *file,
                              const void *hdr, size_t hlen, const void *data, size_t dlen, cJSON **placement);
/* ---- pool.c / pool_write.c: the pooled store's two sides (Note [Pooled checkpoint store]) ---- */
/* an erasure-code block's header (Note [Pooled checkpoint store]) */
typedef struct {
    char magic[8]; /* "SLECBLK1" */
    uint32_t k, m, index, reserved;
    uint64_t step, file_size, block_size;
    char stripe[80]; /* "step-NNNNNNN/shard-rRRRRR.safetensors" */
} ec_header;
_Static_assert(sizeof(ec_header) == 128, "erasure-code block header is 128 bytes");
enum { EC_ALIGN = 4096 }; /* a block file's padded header and its block size are multiples of this */
/* "xxh3:<16 hex digits>" of n bytes at p */
void sl_pool_sum_str(char *out, size_t cap, const void *p, size_t n);
#endif
