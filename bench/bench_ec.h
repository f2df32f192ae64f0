/* bench_ec.h — `suanli bench ec`: Reed–Solomon encode/decode throughput of the pooled checkpoint store
 * (sl_ckpt_ec_encode / sl_ckpt_ec_decode over ISA-L) on one core, GB/s of data bytes, beside memcpy of the
 * same bytes. Decode loses min(k, m) data blocks (the most work). */
#ifndef SL_BENCH_EC_H
#define SL_BENCH_EC_H
/* argv[0] == "ec". Flags: --json, --mib N (data per stripe set, 256), --reps R (median, 5).
 * Returns an exit code (2 on bad flags, 1 without ISA-L). */
int sl_bench_ec(int argc, char **argv);
#endif
