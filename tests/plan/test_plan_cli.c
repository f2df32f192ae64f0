/* suanli plan / submit / topo and the Slurm paths, from the command line:
 * - every bad input (missing flag, unreadable or inconsistent cluster file, unknown model, a layout that
 *   cannot exist or fit, Slurm missing) gives exit 2 and exactly one line naming the file, field or flag;
 * - a plan on this host prints the best layout, its launch command, Young/Daly and the simulation;
 * - suanli submit writes an sbatch script with --requeue and --signal=B:USR1@120 and submits it with a
 *   (fake) sbatch; suanli run inside an allocation execs (a fake) srun;
 * - suanli topo shows a synthetic two-NUMA-node topology and places ranks NUMA-aware, and suanli run pins
 *   them (and sets OMP_PROC_BIND for their threads) accordingly;
 * - SIGUSR1 to a running `suanli train` saves a checkpoint and exits 75; the next run resumes from it. */
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "suanli/base.h"
#include "testutil.h"

static char out[65536];

static int lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* cmd (after the CLI path, may start with VAR=x assignments in `env`) must exit 2 with one line holding
 * `want` */
static void bad(const char *env, const char *args, const char *want) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s %s", env ? env : "", tu_cli(), args);
    int rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 2 && lines(out) == 1 && strstr(out, want),
             "'%s': expected exit 2 and one line with '%s', got %d: %s", args, want, rc, out);
    TU_CHECK(tu_unchanged(), "'%s': the run changed the test dir", args); /* nothing written (tu_watch) */
}

static void write_file(const char *path, const char *text, int exec) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    if (exec) chmod(path, 0755);
}

/* A write of `path` that fails (past the file size limit, as on a full disk): `suanli ARGS` exits 2 with
 * one line naming `flag` (and `name`, where set), keeps the file there whole and leaves no temp file in
 * dir. */
static void failed_write(const char *dir, const char *path, const char *args, const char *flag,
                         const char *name) {
    char cmd[4096], *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    TU_CHECK(sl_file_read_all(path, &before, &nb) == SL_OK, "%s there", path);
    snprintf(cmd, sizeof cmd, "trap '' XFSZ; ulimit -f 1; %s %s", tu_cli(), args);
    int rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 2 && lines(out) == 1 && strstr(out, flag) && (!name || strstr(out, name)),
             "failed %s write: %d: %s", flag, rc, out);
    TU_CHECK(before && sl_file_read_all(path, &after, &na) == SL_OK && na == nb && !memcmp(before, after, nb),
             "a failed %s write keeps %s whole", flag, path);
    free(before);
    free(after);
    snprintf(cmd, sizeof cmd, "ls -a %s | grep -q tmp", dir);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 1, "a failed %s write leaves no temp file in %s", flag, dir);
}

static void test_plan_bad(const char *d) {
    char p[600], args[2048], cmd[4096];
    const char *cl = SL_SOURCE_DIR "/configs/cluster/this-host.json";
    bad(NULL, "plan --cluster x.json", "--model");
    snprintf(args, sizeof args, "plan --model gpt2-124m");
    bad(NULL, args, "--cluster");
    bad(NULL, "plan --model gpt2-124m --cluster /nonexistent/c.json", "/nonexistent/c.json");
    snprintf(args, sizeof args, "plan --model gpt3-175b --cluster %s", cl);
    bad(NULL, args, "gpt3-175b");
    /* a JSON file that is neither a train config nor named config.json: not its directory's config.json */
    snprintf(p, sizeof p, "%s/hfcfg", d);
    mkdir(p, 0755);
    snprintf(args, sizeof args, "cp %s/tests/fixtures/hf/llama/config.json %s/hfcfg/", SL_SOURCE_DIR, d);
    TU_CHECK(system(args) == 0, "copy config.json");
    snprintf(p, sizeof p, "%s/hfcfg/other.json", d);
    write_file(p, "{\"hidden_size\": 64}", 0);
    snprintf(args, sizeof args, "plan --model %s --cluster %s", p, cl);
    bad(NULL, args, "other.json: no 'num_layers'");
    snprintf(p, sizeof p, "%s/incons.json", d);
    write_file(
        p,
        "{\"hosts\": 4, \"devices_per_host\": 8, \"device\": {\"peak_TFLOPs\": 100, \"memory_GiB\": 40, "
        "\"mem_bw_GBps\": 1000}, \"links\": {\"intra_host\": {\"alpha_us\": 2, \"beta_GBps\": 50}, "
        "\"inter_host\": {\"alpha_us\": 5, \"beta_GBps\": 400}}, \"reliability\": {\"host_mtbf_hours\": "
        "1000, "
        "\"ckpt_write_GBps\": 1, \"ckpt_read_GBps\": 2}}",
        0);
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s", p);
    bad(NULL, args, "links.inter_host.beta_GBps");
    snprintf(p, sizeof p, "%s/nolinks.json", d);
    write_file(
        p,
        "{\"hosts\": 1, \"devices_per_host\": 8, \"device\": {\"peak_TFLOPs\": 100, \"memory_GiB\": 40, "
        "\"mem_bw_GBps\": 1000}, \"reliability\": {\"host_mtbf_hours\": 1000, \"ckpt_write_GBps\": 1, "
        "\"ckpt_read_GBps\": 2}}",
        0);
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s", p);
    bad(NULL, args, "links");
    snprintf(p, sizeof p, "%s/launcher.json", d); /* a launcher that is not a string was taken as "run" */
    snprintf(args, sizeof args, "sed 's/\"launcher\": \"run\"/\"launcher\": [\"slurm\"]/' %s > %s", cl, p);
    TU_CHECK(system(args) == 0, "write launcher.json");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s", p);
    bad(NULL, args, "launcher.json: field 'launcher' must be the string");
    snprintf(args, sizeof args, "plan --model llama-70b --cluster %s --seq-len 4096", cl);
    bad(NULL, args, "no layout fits");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --tp 3", cl);
    bad(NULL, args, "--tp");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --micro-batch 3 --global-batch 8", cl);
    bad(NULL, args, "--micro-batch");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --seq-len 4096", cl);
    bad(NULL, args, "--seq-len");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --devices 64", cl);
    bad(NULL, args, "--devices");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --recompute sometimes", cl);
    bad(NULL, args, "--recompute");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --sequence-parallel maybe", cl);
    bad(NULL, args, "--sequence-parallel: expected off, on or any, got 'maybe'");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --tp 1 --sequence-parallel on", cl);
    bad(NULL, args, "--sequence-parallel on: needs tp > 1 (tp 1)");
    snprintf(args, sizeof args,
             "plan --model gpt2-124m --cluster %s --tp 2 --seq-len 63 --sequence-parallel on", cl);
    bad(NULL, args, "--sequence-parallel on: --seq-len 63 is not divisible by tp 2");
    snprintf(
        args, sizeof args,
        "plan --model %s/tests/fixtures/hf/qwen2_moe --cluster %s --tp 2 --seq-len 64 --sequence-parallel on",
        SL_SOURCE_DIR, cl);
    bad(NULL, args, "models sequence parallelism for dense models only");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --zero 7", cl);
    bad(NULL, args, "--zero");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --expert-tensor-parallel-size 2", cl);
    bad(NULL, args, "--expert-tensor-parallel-size"); /* a dense model has no experts to split */
    snprintf(
        args, sizeof args,
        "plan --model %s/tests/fixtures/hf/qwen2_moe --cluster %s --tp 2 --expert-tensor-parallel-size 4",
        SL_SOURCE_DIR, cl);
    bad(NULL, args, "--expert-tensor-parallel-size 4: must be 1 or the tensor-parallel size");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --nonsense 1", cl);
    bad(NULL, args, "--nonsense");
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --ckpt-bench %s/nonexistent.json", cl,
             d);
    bad(NULL, args, "nonexistent.json");
    snprintf(p, sizeof p, "%s/ckpt.json", d);
    write_file(p, "{\"bench\": \"ckpt\", \"ckpt_mib\": 38, \"write_mb_s\": 237}", 0);
    snprintf(args, sizeof args, "plan --model gpt2-124m --cluster %s --ckpt-bench %s", cl, p);
    bad(NULL, args, "kill_to_training_s");
    write_file(p, "{\"bench\": \"ckpt\", \"ckpt_mib\": 38, \"write_mb_s\": 237, \"kill_to_training_s\": 6.5}",
               0);
    snprintf(args, sizeof args,
             "plan --model gpt2-124m --cluster %s --ckpt-bench %s --global-batch 8 --seq-len 64 "
             "--simulate-failures "
             "--mtbf-hours 2 --work-hours 100",
             cl, p);
    int rc = tu_cli_run(out, sizeof out, "%s", args);
    /* 124M: 1.39 GiB at 237 MB/s = 6.3 s; restore = 5 s restart + 1.39 GiB at 38 MiB / 1.5 s = 61 s */
    TU_CHECK(rc == 0 && strstr(out, "save 6.3 s") && strstr(out, "restore 61.") &&
                 strstr(out, "simulated optimum") && strstr(out, "runs today") &&
                 !strstr(out, "best layout suanli runs today"), /* TP and PP run: the best layout does */
             "--ckpt-bench: %d: %s", rc, out);
    /* a job MTBF far below the 300 s restore: restores that never succeed are bad input, not a hang */
    snprintf(cmd, sizeof cmd,
             "timeout 60 %s plan --model gpt2-124m --cluster %s/configs/cluster/accel-10k.json "
             "--simulate-failures --mtbf-hours 10",
             tu_cli(), SL_SOURCE_DIR);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 2 && strstr(out, "--simulate-failures: the run never finishes"),
             "MTBF 10 h on 1250 hosts: %d: %s", rc, out);
}

static void test_plan_good(void) {
    int rc = tu_cli_run(out, sizeof out,
                        "plan --model gpt2-124m --cluster %s/configs/cluster/this-host.json --global-batch 8 "
                        "--seq-len 64 --simulate-failures --work-hours 2000",
                        SL_SOURCE_DIR);
    TU_CHECK(rc == 0 && strstr(out, "best: ") && strstr(out, "launch: suanli run -n ") &&
                 strstr(out, "Young") && strstr(out, "simulated optimum") && strstr(out, "runs today"),
             "plan on this host: %d: %s", rc, out);
    /* 70B on 10k accelerators: the best layout is Megatron's tp 8 with sequence parallelism, without
     * recomputation (Note [Sequence-parallel memory]); without SP every fitting layout recomputes (tp x pp
     * with recomputation runs since Note [Recomputation memory]); each launch line says so */
    for (int sp = 1; sp >= 0; sp--) {
        rc = tu_cli_run(out, sizeof out,
                        "plan --model llama-70b --cluster %s/configs/cluster/accel-10k.json --seq-len 4096 "
                        "--global-batch 4000 --top 3 --sequence-parallel %s",
                        SL_SOURCE_DIR, sp ? "any" : "off");
        TU_CHECK(rc == 0 && strstr(out, "launch: suanli submit --nodes "), "70b on 10k accelerators: %d: %s",
                 rc, out);
        const char *row1 = strstr(out, "\n   1 "), *end1 = row1 ? strchr(row1 + 1, '\n') : NULL;
        const char *key = row1 ? strstr(row1, sp ? "   8 sp " : " full |") : NULL,
                   *run1 = row1 ? strstr(row1, "| yes  runs today") : NULL;
        TU_CHECK(end1 && key && key < end1 && run1 && run1 < end1 &&
                     strstr(out, sp ? " --tensor-model-parallel-size 8 --sequence-parallel "
                                    : " --recompute-granularity full --save run") &&
                     !strstr(out, "note: this layout uses"),
                 "70b on 10k accelerators, the best layout %s and runs: %s",
                 sp ? "is tp 8 with sequence parallelism" : "recomputes", out);
    }
    /* no runnable layout fits (without SP): the note names what suanli train lacks (ZeRO-3 with pp), not
     * the old "data parallelism and ZeRO only" (TP and PP run since issue 16) nor recomputation (runs since
     * stop 47); with SP, tp 8 x dp 512 with ZeRO-3 and recomputation fits and runs */
    rc = tu_cli_run(out, sizeof out,
                    "plan --model llama-405b --cluster %s/configs/cluster/accel-10k.json --seq-len 4096 "
                    "--global-batch 2048 --devices 4096 --top 1 --sequence-parallel off",
                    SL_SOURCE_DIR);
    TU_CHECK(rc == 0 && strstr(out, "no layout that suanli train runs today fits") &&
                 strstr(out, "with or without recomputation, but no ZeRO-3 with pp") &&
                 strstr(out, "note: this layout uses ZeRO-3 with pipeline stages"),
             "405b on 4096 accelerators, the note on runnable layouts: %d: %s", rc, out);
    rc = tu_cli_run(out, sizeof out,
                    "plan --model llama-405b --cluster %s/configs/cluster/accel-10k.json --seq-len 4096 "
                    "--global-batch 2048 --devices 4096 --top 1",
                    SL_SOURCE_DIR);
    TU_CHECK(rc == 0 && !strstr(out, "no layout that suanli train runs today fits") &&
                 strstr(out, "   1    512   8 sp   1 ") &&
                 strstr(out, "--zero-stage 3 --recompute-granularity full"),
             "405b on 4096 accelerators with SP: %d: %s", rc, out);
    /* sequence parallelism (Note [Sequence-parallel memory]): enumerated beside tp > 1, marked in the sp
     * column and launched with the flag */
    rc = tu_cli_run(out, sizeof out,
                    "plan --model gpt2-124m --cluster %s/configs/cluster/this-host.json --global-batch 4 "
                    "--seq-len 64 --tp 2 --sequence-parallel on --top 1",
                    SL_SOURCE_DIR);
    TU_CHECK(rc == 0 && strstr(out, "      1   2 sp   1 ") && strstr(out, "(sequence parallel)") &&
                 strstr(out, "--tensor-model-parallel-size 2 --sequence-parallel --save run"),
             "plan with --sequence-parallel on: %d: %s", rc, out);
    /* expert tensor parallelism: a split-expert layout is enumerated and launched with the flag */
    rc = tu_cli_run(out, sizeof out,
                    "plan --model %s/tests/fixtures/hf/qwen2_moe --cluster %s/configs/cluster/cpu-512.json "
                    "--devices 4 --tp 2 --expert-tensor-parallel-size 2 --seq-len 64 --global-batch 8",
                    SL_SOURCE_DIR, SL_SOURCE_DIR);
    TU_CHECK(rc == 0 && strstr(out, "(experts split over tp)") &&
                 strstr(out, "--tensor-model-parallel-size 2") &&
                 strstr(out, "--expert-tensor-parallel-size 2"),
             "plan with --expert-tensor-parallel-size 2: %d: %s", rc, out);
    /* --probe: a core measured faster than the file's peak raises the peak (efficiency 1) instead of capping
     * the efficiency at 1; one slower keeps the peak and sets the efficiency */
    const char *pd = tu_tmpdir("plan-probe");
    char slow[600], fast[600];
    snprintf(slow, sizeof slow, "%s/slow.json", pd);
    snprintf(fast, sizeof fast, "%s/fast.json", pd);
    const char *fmt =
        "{\"hosts\": 1, \"devices_per_host\": 1, \"device\": {\"peak_TFLOPs\": %s, \"memory_GiB\": 12, "
        "\"mem_bw_GBps\": 15}, \"links\": {\"intra_host\": {\"alpha_us\": 1, \"beta_GBps\": 5}}, "
        "\"reliability\": {\"host_mtbf_hours\": 1000, \"ckpt_write_GBps\": 1, \"ckpt_read_GBps\": 1}}";
    char text[1024];
    snprintf(text, sizeof text, fmt, "0.001");
    write_file(slow, text, 0);
    snprintf(text, sizeof text, fmt, "1000");
    write_file(fast, text, 0);
    rc = tu_cli_run(out, sizeof out,
                    "plan --model gpt2-124m --cluster %s --global-batch 4 --seq-len 64 --probe --threads 1",
                    slow);
    TU_CHECK(rc == 0 && strstr(out, "above the file's 1.0 GFLOP/s peak") && strstr(out, "(efficiency 1)"),
             "--probe on a file whose peak is below the core's: %d: %s", rc, out);
    rc = tu_cli_run(out, sizeof out,
                    "plan --model gpt2-124m --cluster %s --global-batch 4 --seq-len 64 --probe --threads 1",
                    fast);
    TU_CHECK(rc == 0 && strstr(out, "of the file's 1000000.0 GFLOP/s peak") &&
                 !strstr(out, "above the file's"),
             "--probe on a file whose peak is above the core's: %d: %s", rc, out);
}

static void test_submit(const char *d) {
    char cmd[4096], script[600], fake[600];
    snprintf(script, sizeof script, "%s/job.sbatch", d);
    bad(NULL, "submit --ntasks-per-node 2 --time 1:00:00 -- suanli train", "--nodes");
    bad(NULL, "submit --nodes 2 --ntasks-per-node 2 --time soon -- suanli train", "--time");
    /* out-of-range fields were accepted (any digits, '-' and at most two ':') */
    const char *bad_times[] = {"99:99:99", "1:60", "1-24:00:00", "1-2-3", "1:2:3:4", "::", "1-", ":5", "-1"};
    for (int k = 0; k < 9; k++) {
        snprintf(cmd, sizeof cmd, "submit --nodes 2 --ntasks-per-node 2 --time %s -- suanli train",
                 bad_times[k]);
        bad(NULL, cmd, "--time");
    }
    bad(NULL, "submit --nodes 2 --ntasks-per-node 2 --time 1:00:00", "no training command");
    snprintf(cmd, sizeof cmd,
             "submit --go --script %s --nodes 2 --ntasks-per-node 2 --time 1:00:00 -- suanli train", script);
    bad("PATH=/nonexistent", cmd, "sbatch not found");
    TU_CHECK(access(script, F_OK) != 0, "nothing written when sbatch is missing");
    snprintf(fake, sizeof fake, "%s/bin", d);
    mkdir(fake, 0755);
    snprintf(fake, sizeof fake, "%s/bin/sbatch", d);
    write_file(fake, "#!/bin/sh\necho \"Submitted batch job 42 ($1)\"\n", 1);
    snprintf(cmd, sizeof cmd,
             "PATH=%s/bin:/usr/bin:/bin %s submit --go --script %s --nodes 2 --ntasks-per-node 4 --time "
             "0-02:00:00 "
             "-- suanli train --data-path 'my data' --save run --load run",
             d, tu_cli(), script);
    int rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0 && strstr(out, "Submitted batch job 42"), "submit with a fake sbatch: %d: %s", rc, out);
    char *s = NULL;
    size_t n;
    TU_CHECK(sl_file_read_all(script, &s, &n) == SL_OK, "script written");
    if (s) {
        TU_CHECK(strstr(s, "#SBATCH --nodes=2\n") && strstr(s, "#SBATCH --ntasks-per-node=4\n") &&
                     strstr(s, "#SBATCH --time=0-02:00:00\n") && strstr(s, "#SBATCH --requeue\n") &&
                     strstr(s, "#SBATCH --signal=B:USR1@120\n") &&
                     strstr(s, "srun --kill-on-bad-exit=1 suanli train --data-path 'my data'") &&
                     strstr(s, "scontrol requeue") && strstr(s, "-eq 75"),
                 "script: %s", s);
        free(s);
    }
    snprintf(cmd, sizeof cmd, "bash -n %s", script);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "the script parses: %s", out);
    /* node ranges and the requeue of a failed step (the behaviour itself: tests/fault/slurm_requeue.sh) */
    bad(NULL, "submit --nodes 2-1 --ntasks-per-node 2 --time 1:00:00 -- suanli train", "--nodes");
    bad(NULL, "submit --nodes 1-x --ntasks-per-node 2 --time 1:00:00 -- suanli train", "--nodes");
    bad(NULL, "submit --nodes 2 --ntasks-per-node 2 --time 1:00:00 --max-requeues -1 -- suanli train",
        "--max-requeues");
    bad(NULL, "submit --nodes 2 --ntasks-per-node 2 --time 1:00:00 --mpi openmpi -- suanli train", "--mpi");
    /* numbers are digits only: strtol took a leading newline (it ended the #SBATCH line, and Slurm read
     * no directive after it), a sign, and overflow */
    const char *bad_nums[] = {"--nodes '\n 3'",     "--nodes 99999999999999999999",
                              "--nodes +2",         "--ntasks-per-node ' 2'",
                              "--signal-sec ' 60'", "--max-requeues '\n3'"};
    for (int k = 0; k < 6; k++) {
        snprintf(cmd, sizeof cmd, "submit --script %s --nodes 2 --ntasks-per-node 2 --time 1:00:00 %s -- x",
                 script, bad_nums[k]);
        char flag[24];
        snprintf(flag, sizeof flag, "%.*s", (int)strcspn(bad_nums[k], " "), bad_nums[k]);
        bad(NULL, cmd, flag);
    }
    /* values written into the script unquoted: nothing that could end a line or add a command */
    const char *unsafe[] = {"--mpi 'pmix_v3;reboot'", "--job-name 'a\nreboot'", "--partition 'p q'"};
    for (int k = 0; k < 3; k++) {
        snprintf(cmd, sizeof cmd, "submit --script %s --nodes 2 --ntasks-per-node 2 --time 1:00:00 %s -- x",
                 script, unsafe[k]);
        char flag[16];
        snprintf(flag, sizeof flag, "%.*s", (int)strcspn(unsafe[k], " "), unsafe[k]);
        bad(NULL, cmd, flag);
    }
    snprintf(cmd, sizeof cmd,
             "%s submit --script %s --nodes 1-4 --ntasks-per-node 2 --time 1:00:00 --max-requeues 5 "
             "-- suanli train",
             tu_cli(), script);
    rc = tu_run(cmd, out, sizeof out);
    s = NULL;
    TU_CHECK(rc == 0 && sl_file_read_all(script, &s, &n) == SL_OK, "range script: %d %s", rc, out);
    if (s) {
        TU_CHECK(strstr(s, "#SBATCH --nodes=1-4\n") && strstr(s, "#SBATCH --exclusive\n") &&
                     !strstr(s, "#SBATCH --ntasks-per-node") &&
                     strstr(s, "srun --kill-on-bad-exit=1 --ntasks-per-node=2 suanli train") &&
                     strstr(s, "-lt 5 ]") && strstr(s, "SUANLI_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}") &&
                     strstr(s, "#SBATCH --open-mode=append") && !strstr(s, "--mpi=") &&
                     !strstr(s, "SUANLI_COMM_TRANSPORT"),
                 "range script: %s", s);
        free(s);
    }
    /* --mpi: srun starts the ranks through the PMI plugin, and they talk over MPI (the run itself:
     * tests/fault/slurm_requeue.sh, phase pmix) */
    snprintf(cmd, sizeof cmd,
             "%s submit --script %s --nodes 2 --ntasks-per-node 1 --time 1:00:00 --mpi pmix -- suanli train",
             tu_cli(), script);
    rc = tu_run(cmd, out, sizeof out);
    s = NULL;
    TU_CHECK(rc == 0 && sl_file_read_all(script, &s, &n) == SL_OK, "--mpi script: %d %s", rc, out);
    if (s) {
        TU_CHECK(strstr(s, "srun --kill-on-bad-exit=1 --mpi=pmix suanli train") &&
                     strstr(s, "export SUANLI_COMM_TRANSPORT=${SUANLI_COMM_TRANSPORT:-mpi}\n"),
                 "--mpi script: %s", s);
        free(s);
    }
    /* a write that fails keeps the script there and leaves no part of the new one: it truncated the old
     * script and left the cut new one */
    snprintf(cmd, sizeof cmd,
             "submit --script %s --nodes 3 --ntasks-per-node 1 --time 1:00:00 -- suanli train", script);
    failed_write(d, script, cmd, "--script", NULL);
}

static void test_srun(const char *d) {
    char cmd[4096], fake[600];
    snprintf(fake, sizeof fake, "%s/bin/srun", d);
    write_file(fake, "#!/bin/sh\necho \"FAKE-SRUN $*\"\n", 1);
    snprintf(cmd, sizeof cmd, "SLURM_JOB_ID=5 PATH=%s/bin:/usr/bin:/bin %s run -n 2 -- /bin/true x", d,
             tu_cli());
    int rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0 &&
                 strstr(out, "FAKE-SRUN --nodes=1 --ntasks-per-node=2 --kill-on-bad-exit=1 /bin/true x"),
             "suanli run defers to srun: %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "run -n 2 -- /bin/true");
    /* the stderr note plus the error: the error is the last line */
    snprintf(cmd, sizeof cmd, "SLURM_JOB_ID=5 PATH=/nonexistent %s run -n 2 -- /bin/true", tu_cli());
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 2 && lines(out) == 1 && strstr(out, "srun is not in PATH"), "Slurm without srun: %d: %s",
             rc, out);
    snprintf(
        cmd, sizeof cmd,
        "SLURM_JOB_ID=5 SUANLI_RUN_NO_SRUN=1 PATH=/nonexistent %s run -n 1 --no-prefix -- /bin/echo local",
        tu_cli());
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0 && strstr(out, "local"), "SUANLI_RUN_NO_SRUN=1 launches locally: %d: %s", rc, out);
}

static void test_topo(const char *d) {
    int rc = tu_cli_run(out, sizeof out, "topo --synthetic 'pack:1 numa:2 core:2 pu:1' --ranks 4");
    TU_CHECK(rc == 0 && strstr(out, "2 NUMA node(s), 4 core(s)") && strstr(out, "rank 0: NUMA node 0") &&
                 strstr(out, "rank 1: NUMA node 0") && strstr(out, "rank 2: NUMA node 1") &&
                 strstr(out, "rank 3: NUMA node 1"),
             "synthetic two-node topology: %d: %s", rc, out);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "HWLOC_SYNTHETIC='numa:2 core:3 pu:2' %s topo --ranks 2", tu_cli());
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0 && strstr(out, "2 NUMA node(s), 6 core(s), 12 PU(s)") &&
                 strstr(out, "rank 1: NUMA node 1, cores 3 4 5"),
             "HWLOC_SYNTHETIC: %d: %s", rc, out);
    /* the same through an XML file (HWLOC_XMLFILE) */
    snprintf(cmd, sizeof cmd, "%s topo --synthetic 'pack:2 numa:1 l3:1 core:4 pu:2' --export-xml %s/t.xml",
             tu_cli(), d);
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0, "export xml: %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "HWLOC_XMLFILE=%s/t.xml %s topo --ranks 4", d, tu_cli());
    rc = tu_run(cmd, out, sizeof out);
    TU_CHECK(rc == 0 && strstr(out, "2 package(s), 2 NUMA node(s), 8 core(s), 16 PU(s)") &&
                 strstr(out, "rank 2: NUMA node 1, cores 4 5 (CPUs 8-11)"),
             "HWLOC_XMLFILE: %d: %s", rc, out);
    { /* a write that fails keeps t.xml: hwloc's writer emptied it, and then the loader saw no topology */
        char xp[600];
        snprintf(xp, sizeof xp, "%s/t.xml", d);
        snprintf(cmd, sizeof cmd, "topo --synthetic 'numa:2 core:1 pu:1' --export-xml %s", xp);
        failed_write(d, xp, cmd, "--export-xml", "t.xml");
    }
    rc = tu_cli_run(out, sizeof out, "topo");
    TU_CHECK(rc == 0 && strstr(out, "NUMA node"), "this host: %d: %s", rc, out);
    /* the launcher binds ranks NUMA-aware on a fake two-node machine (1 core per node: CPUs 0 and 1) */
    if (sysconf(_SC_NPROCESSORS_ONLN) >= 2) {
        snprintf(cmd, sizeof cmd,
                 "HWLOC_SYNTHETIC='numa:2 core:1 pu:1' %s run -n 3 --no-prefix -- sh -c 'echo \"R$RANK "
                 "$(grep Cpus_allowed_list /proc/self/status | cut -f2) $OMP_PROC_BIND\"'",
                 tu_cli());
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 0 && strstr(out, "R0 0 close") && strstr(out, "R1 0 close") &&
                     strstr(out, "R2 1 close"),
                 "suanli run --bind auto on two NUMA nodes: ranks 0, 1 on node 0 (CPU 0), rank 2 on node 1: "
                 "%d: %s",
                 rc, out);
    }
    bad(NULL, "topo --synthetic 'numa:x'", "--synthetic");
    bad(NULL, "topo --ranks 0", "--ranks");
}

static void test_usr1(const char *d) {
    char cmd[4096], run[600], metrics[700];
    snprintf(cmd, sizeof cmd, "%s data prepare --input %s/data/tinyshakespeare.txt --output-prefix %s/tok",
             tu_cli(), SL_SOURCE_DIR, d);
    TU_CHECK(tu_run(cmd, out, sizeof out) == 0, "data prepare: %s", out);
    snprintf(run, sizeof run, "%s/run", d);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    char tok[600], logp[600];
    snprintf(tok, sizeof tok, "%s/tok", d);
    snprintf(logp, sizeof logp, "%s/train.log", d);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(logp, "w", stdout);
        (void)f;
        dup2(fileno(stdout), 2);
        execl(tu_cli(), "suanli", "train", "--data-path", tok, "--num-layers", "2", "--hidden-size", "64",
              "--num-attention-heads", "2", "--seq-length", "32", "--micro-batch-size", "4", "--train-iters",
              "1000000", "--threads", "1", "--eval-interval", "0", "--log-interval", "100000", "--save", run,
              "--load", run, "--save-interval", "1000000", (char *)NULL);
        _exit(127);
    }
    int seen = 0;
    for (int i = 0; i < 600 && !seen; i++) { /* until the first step is logged (60 s at most) */
        struct stat sb;
        seen = stat(metrics, &sb) == 0 && sb.st_size > 0;
        if (!seen) usleep(100000);
    }
    TU_CHECK(seen, "the run logged a step");
    kill(pid, SIGUSR1);
    int status = 0;
    waitpid(pid, &status, 0);
    char *log = NULL;
    size_t n;
    sl_file_read_all(logp, &log, &n);
    TU_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 75 && log && strstr(log, "SIGUSR1 after step") &&
                 strstr(log, "committed; exiting for requeue"),
             "SIGUSR1: exit %d: %s", WIFEXITED(status) ? WEXITSTATUS(status) : -1, log ? log : "");
    free(log);
    char latest[700];
    snprintf(latest, sizeof latest, "%s/latest", run);
    char *lt = NULL;
    TU_CHECK(sl_file_read_all(latest, &lt, &n) == SL_OK && lt && !strncmp(lt, "step-", 5),
             "latest names a step");
    long step = lt ? atol(lt + 5) : 0;
    free(lt);
    snprintf(
        cmd, sizeof cmd,
        "%s train --data-path %s --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 "
        "--micro-batch-size 4 --train-iters %ld --threads 1 --eval-iters 1 --save %s --load %s "
        "--save-interval 1000000",
        tu_cli(), tok, step + 2, run, run);
    int rc = tu_run(cmd, out, sizeof out);
    char want[64];
    snprintf(want, sizeof want, "at step %ld", step);
    TU_CHECK(rc == 0 && strstr(out, "resumed from") && strstr(out, want), "requeued run resumes: %d: %s", rc,
             out);
}

int main(void) {
    const char *d0 = tu_tmpdir("plan-cli");
    char d[512];
    snprintf(d, sizeof d, "%s", d0);
    tu_watch(d);
    test_plan_bad(d);
    test_plan_good();
    test_submit(d);
    test_srun(d);
    test_topo(d);
    test_usr1(d);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d);
    if (!tu_failures) tu_run(cmd, NULL, 0);
    return tu_finish("test_plan_cli");
}
