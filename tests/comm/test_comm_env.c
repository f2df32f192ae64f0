/* Environment detection: suanli run / torchrun, OpenMPI, MPICH (PMI), Slurm; bad values; unique ids. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "testutil.h"

static const char *ALL[] = {"RANK",
                            "WORLD_SIZE",
                            "LOCAL_RANK",
                            "LOCAL_WORLD_SIZE",
                            "MASTER_ADDR",
                            "MASTER_PORT",
                            "SUANLI_JOB_TOKEN",
                            "OMPI_COMM_WORLD_RANK",
                            "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK",
                            "OMPI_COMM_WORLD_LOCAL_SIZE",
                            "PMI_RANK",
                            "PMI_SIZE",
                            "MPI_LOCALRANKID",
                            "MPI_LOCALNRANKS",
                            "SLURM_PROCID",
                            "SLURM_NTASKS",
                            "SLURM_LOCALID",
                            "SLURM_JOB_ID",
                            "SLURM_STEP_ID",
                            "SLURM_STEP_NODELIST",
                            "SLURM_JOB_NODELIST"};
static void clear(void) {
    for (size_t i = 0; i < sizeof ALL / sizeof ALL[0]; i++) unsetenv(ALL[i]);
}

int main(void) {
    sl_comm_env e;
    clear();
    TU_CHECK(sl_comm_env_detect(&e) == SL_OK && e.size == 1 && e.rank == 0 && !strcmp(e.source, "single"),
             "single");

    setenv("RANK", "3", 1), setenv("WORLD_SIZE", "8", 1), setenv("LOCAL_RANK", "1", 1);
    setenv("MASTER_ADDR", "node7", 1), setenv("MASTER_PORT", "29500", 1);
    TU_CHECK(sl_comm_env_detect(&e) == SL_OK && e.rank == 3 && e.size == 8 && e.local_rank == 1 &&
                 !strcmp(e.master_addr, "node7") && e.master_port == 29500 && !strcmp(e.source, "torchrun"),
             "torchrun: %s", sl_errmsg());
    setenv("SUANLI_JOB_TOKEN", "abc", 1);
    TU_CHECK(sl_comm_env_detect(&e) == SL_OK && !strcmp(e.source, "suanli") && !strcmp(e.token, "abc"),
             "suanli");
    setenv("RANK", "8", 1);
    TU_CHECK(sl_comm_env_detect(&e) == SL_ERR_INVALID && strstr(sl_errmsg(), "rank 8"), "rank>=size: %s",
             sl_errmsg());
    setenv("RANK", "x1", 1);
    TU_CHECK(sl_comm_env_detect(&e) == SL_ERR_INVALID && strstr(sl_errmsg(), "RANK=x1"), "bad RANK: %s",
             sl_errmsg());
    setenv("RANK", "1", 1), setenv("MASTER_PORT", "70000", 1);
    TU_CHECK(sl_comm_env_detect(&e) == SL_ERR_INVALID && strstr(sl_errmsg(), "MASTER_PORT"), "bad port: %s",
             sl_errmsg());

    clear();
    setenv("OMPI_COMM_WORLD_RANK", "2", 1), setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1), setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    TU_CHECK(sl_comm_env_detect(&e) == SL_OK && e.rank == 2 && e.size == 4 && e.local_rank == 0 &&
                 e.local_size == 2 && !strcmp(e.source, "openmpi") && e.master_port == 0,
             "openmpi");

    clear();
    setenv("PMI_RANK", "5", 1), setenv("PMI_SIZE", "6", 1), setenv("MPI_LOCALRANKID", "1", 1);
    TU_CHECK(sl_comm_env_detect(&e) == SL_OK && e.rank == 5 && e.size == 6 && e.local_rank == 1 &&
                 !strcmp(e.source, "pmi"),
             "pmi");

    clear();
    setenv("SLURM_PROCID", "1", 1), setenv("SLURM_NTASKS", "4", 1), setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_JOB_ID", "1234", 1), setenv("SLURM_STEP_ID", "0", 1),
        setenv("SLURM_STEP_NODELIST", "gpu[03-05,9],cpu1", 1);
    TU_CHECK(sl_comm_env_detect(&e) == SL_OK && e.rank == 1 && e.size == 4 && !strcmp(e.source, "slurm") &&
                 !strcmp(e.master_addr, "gpu03") && e.master_port == 12000 + (1234 * 7) % 20000 &&
                 strstr(e.token, "1234"),
             "slurm: addr=%s port=%d token=%s", e.master_addr, e.master_port, e.token);
    clear();

    sl_comm_unique_id id;
    char addr[128], tok[64];
    int port = 0;
    TU_CHECK(sl_comm_get_unique_id(&id) == SL_OK, "get_unique_id: %s", sl_errmsg());
    TU_CHECK(sl_comm_unique_id_parse(&id, addr, sizeof addr, &port, tok, sizeof tok) && port > 0 &&
                 strlen(tok) == 32,
             "parse: %s", id.bytes);
    memset(&id, 'x', sizeof id);
    TU_CHECK(!sl_comm_unique_id_parse(&id, addr, sizeof addr, &port, tok, sizeof tok), "garbage id rejected");
    sl_comm *c = NULL;
    TU_CHECK(sl_comm_init_rank(&c, 2, &id, 0, NULL) == SL_ERR_INVALID && !c, "init with garbage id");
    TU_CHECK(sl_comm_init_rank(&c, 2, &id, 2, NULL) == SL_ERR_INVALID, "rank out of range");
    /* argument checks */
    sl_comm *cs[2];
    TU_CHECK(sl_comm_init_loopback(1, cs, NULL) == SL_OK, "loopback 1");
    float x = 1;
    TU_CHECK(sl_comm_all_reduce(cs[0], &x, &x, 1, SL_COMM_U8, SL_COMM_SUM) == SL_ERR_INVALID,
             "u8 reduce rejected");
    TU_CHECK(sl_comm_broadcast(cs[0], &x, &x, 1, SL_COMM_F32, 3) == SL_ERR_INVALID &&
                 strstr(sl_errmsg(), "rank 3"),
             "bad root: %s", sl_errmsg());
    TU_CHECK(sl_comm_send(cs[0], &x, 1, SL_COMM_F32, 0) == SL_ERR_INVALID, "send to self");
    TU_CHECK(sl_comm_async_error(cs[0]) == SL_OK, "argument errors do not poison the communicator");
    /* all-to-all(v) whose own block's send and receive counts differ: refused, not half-copied */
    float a2a_s[4] = {1, 2, 3, 4}, a2a_r[4] = {0};
    size_t sc = 2, rc = 3, zero = 0;
    TU_CHECK(sl_comm_all_to_allv(cs[0], a2a_s, &sc, &zero, a2a_r, &rc, &zero, SL_COMM_F32) ==
                     SL_ERR_INVALID &&
                 strstr(sl_errmsg(), "sends itself 2 elements but expects 3"),
             "all-to-allv with unequal self counts: %s", sl_errmsg());
    sl_comm_free(cs[0]);
    return tu_finish("test_comm_env");
}
