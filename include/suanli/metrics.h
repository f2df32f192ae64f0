/* suanli/metrics.h — a training run's metrics after the fact and on the side: `suanli plot` (an SVG of
 * metrics.jsonl files, src/train/plot.c) and TensorBoard event files (`suanli train --tensorboard-dir`,
 * src/train/tboard.c).
 *
 * Usage (plot two runs into cmp.svg):
 *   const char *runs[] = {"out/a", "out/b"};
 *   char written[4096];
 *   if (sl_plot_runs(runs, 2, &(sl_plot_opts){.output = "cmp.svg", .title = "a vs b"}, written,
 *                    sizeof written) != SL_OK)
 *       fprintf(stderr, "%s\n", sl_errmsg());
 *
 * Usage (TensorBoard scalars; the train layer does this once per step with --tensorboard-dir):
 *   sl_tb_writer *tb;
 *   sl_tb_writer_open("out/tb", &tb);
 *   sl_tb_writer_scalar(tb, step, wall_time, "lm loss", loss);
 *   sl_tb_writer_close(tb);
 */
#ifndef SUANLI_METRICS_H
#define SUANLI_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "suanli/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- plot (src/train/plot.c) ---- */

typedef struct sl_plot_opts {
    const char *output; /* NULL: RUN_DIR/loss.svg for one run, ./loss.svg for several */
    const char *title;  /* NULL: "suanli: " and the run dir names */
} sl_plot_opts;

/* Reads RUN_DIR/metrics.jsonl of each run (one JSON object per step: step, loss, lr, tokens_per_s and
 * val_loss when evaluated) and writes a self-contained SVG with four panels (train loss, val loss,
 * tokens/s, learning rate; runs overlaid, one color each, a legend with the run dir names) atomically
 * to the output. Bad input (a missing dir or file, a malformed line (file:line), a line without a
 * numeric loss, no steps) fails with SL_ERR_INVALID and writes nothing. `written` (may be NULL) receives
 * the output path. */
sl_status sl_plot_runs(const char *const *run_dirs, int n_runs, const sl_plot_opts *opts, char *written,
                       size_t cap);

/* ---- TensorBoard event files (src/train/tboard.c) ----
 * Note [TensorBoard events]: one file DIR/events.out.tfevents.<unix time>.<host>.<pid>.suanli of TFRecords
 * (uint64 length, masked CRC32C of the length, an Event protobuf, masked CRC32C of it); the first Event
 * carries file_version "brain.Event:2", the others a Summary of simple_value scalars, or (a resumed run,
 * sl_tb_writer_session_start) a SessionLog with status START. */

typedef struct sl_tb_writer sl_tb_writer;

/* Creates DIR (mkdir -p) and the event file with its file_version record. *out is owned (close it). */
sl_status sl_tb_writer_open(const char *dir, sl_tb_writer **out);
/* One Event with one scalar. wall_time: seconds since the epoch; <= 0: now. */
sl_status sl_tb_writer_scalar(sl_tb_writer *w, int64_t step, double wall_time, const char *tag, float value);
/* An Event at `step` with session_log {status: START}: TensorBoard then drops the events of earlier files
 * in the run directory whose step is >= `step` (its purge of orphaned data after a restart). A resumed
 * run writes it at its first step, so the steps the dead attempt logged past the checkpoint vanish. */
sl_status sl_tb_writer_session_start(sl_tb_writer *w, int64_t step, double wall_time);
sl_status sl_tb_writer_flush(sl_tb_writer *w);
/* The event file's path (borrowed). */
const char *sl_tb_writer_path(const sl_tb_writer *w);
void sl_tb_writer_close(sl_tb_writer *w); /* flushes; NULL is a no-op */

/* CRC32C (Castagnoli) of n bytes, continuing from crc (0 to start), and TFRecord's mask of it. */
uint32_t sl_crc32c(uint32_t crc, const void *data, size_t n);
uint32_t sl_crc32c_masked(const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
