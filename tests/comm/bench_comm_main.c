/* Stand-alone driver for bench/bench_comm.c: sl_bench_comm [flags] == suanli bench comm [flags]. */
#include "bench_comm.h"
int main(int argc, char **argv) {
    argv[0] = "comm";
    return sl_bench_comm(argc, argv);
}
