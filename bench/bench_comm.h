/* suanli bench comm: nccl-tests style benchmark of the collectives (and of MPI's, when run under
 * mpirun in an MPI build). argv[0] == "comm". Returns an exit code (0 ok, 1 failure, 2 usage). */
#ifndef SL_BENCH_COMM_H
#define SL_BENCH_COMM_H
int sl_bench_comm(int argc, char **argv);
#endif
