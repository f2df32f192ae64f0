/* bench_ckpt_io.h — `suanli bench ckpt-io`: one checkpoint shard file (a 4096-byte header + N MiB of data,
 * fsynced, renamed) written by the shard write path (src/ckpt/shard_io.c, O_DIRECT) against the anchor in
 * the same run: the same bytes through the page cache (write + fsync, what sl_safetensors_write and the
 * checkpoint writer did before). Wall MB/s and the writing thread's CPU seconds, medians, the two orders
 * alternating per repetition. */
#ifndef SL_BENCH_CKPT_IO_H
#define SL_BENCH_CKPT_IO_H
/* argv[0] == "ckpt-io". Flags: --json, --mib N (512), --reps R (median, 5), --dir D (where the file goes:
 * the disk under test; default /tmp). Returns an exit code (2 on bad flags, 1 on an I/O failure). */
int sl_bench_ckpt_io(int argc, char **argv);
#endif
