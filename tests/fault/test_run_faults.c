/* suanli run as a torchrun/Slurm user meets it when things go wrong: which failures are restarted (not a
 * rank's exit 2, bad input: Note [No restart after bad input] in src/launch/launch.c), the launcher's exit
 * status and messages, signals to the launcher, and no rank left running afterwards. Trivial programs
 * (sh -c) under the CLI (SUANLI_CLI). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "suanli/base.h"
#include "testutil.h"

static char out[1 << 16];

/* the CLI under a 60 s timeout, its output in `out` (FMT a string literal) */
#define run(FMT, ...) tu_runf(out, sizeof out, "timeout 60", "%s " FMT, tu_cli(), ##__VA_ARGS__)

/* processes (not zombies: PID 1 of a container may not reap) whose command line holds `marker` */
static int leftovers(const char *marker) {
    char cmd[256], buf[4096];
    snprintf(cmd, sizeof cmd, "ps -eo stat=,args= | grep -v grep | grep -v '^Z' | grep -c -- '%s'", marker);
    tu_run(cmd, buf, sizeof buf);
    return atoi(buf);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++) n++;
    return n;
}

int main(void) {
    /* a rank that exits 2 (bad input) is not restarted, and the message says why, on one line */
    int rc = run("run -n 2 --max-restarts 3 -- sh -c 'echo attempt $SUANLI_RESTART_COUNT; exit 2'");
    TU_CHECK(rc == 1 && count(out, "attempt") == 2 && !strstr(out, "attempt 1") &&
                 !strstr(out, "restarting ("),
             "exit 2 restarted: rc=%d out=%s", rc, out);
    TU_CHECK(strstr(out, "exited with status 2 (bad input or usage: not restarting"), "exit 2: out=%s", out);
    /* any other failure is restarted up to --max-restarts */
    rc = run("run -n 2 --max-restarts 2 -- sh -c 'echo attempt $SUANLI_RESTART_COUNT; exit 3'");
    TU_CHECK(rc == 1 && count(out, "attempt") == 6 && count(out, "restarting (") == 2, "exit 3: rc=%d out=%s",
             rc, out);
    /* restarts are reported: each one, giving up, and success after restarts */
    TU_CHECK(strstr(out, "rank ") && strstr(out, "exited with status 3 (gave up: --max-restarts 2 used up)"),
             "exhausted restarts: out=%s", out);
    rc = run("run -n 2 --max-restarts 3 -- sh -c 'test $SUANLI_RESTART_COUNT -ge 2'");
    TU_CHECK(rc == 0 && count(out, "restarting (") == 2 &&
                 strstr(out, "every rank finished after 2 restarts"),
             "success after restarts: rc=%d out=%s", rc, out);
    /* a program that cannot be run: one line, the shell's 127 / 126, no rank started (no "[r]" line) */
    char noexe[600];
    snprintf(noexe, sizeof noexe, "%s/not_executable", tu_tmpdir("run_faults"));
    FILE *f = fopen(noexe, "w");
    TU_CHECK(f != NULL, "cannot create %s", noexe);
    if (f) fclose(f);
    const struct {
        const char *prog, *want;
        int rc;
    } noexec[] = {
        {"/nonexistent/program", "cannot execute /nonexistent/program: No such file or directory", 127},
        {"no_such_program_sl", "cannot execute no_such_program_sl: not found in PATH", 127},
        {"''", "cannot execute '': empty program name", 127},
        {"/tmp", "cannot execute /tmp: is a directory", 126},
        {noexe, "Permission denied", 126},
    };
    for (size_t i = 0; i < sizeof noexec / sizeof noexec[0]; i++) {
        rc = run("run -n 2 --max-restarts 2 -- %s", noexec[i].prog);
        TU_CHECK(rc == noexec[i].rc && strstr(out, noexec[i].want) && count(out, "\n") == 1 &&
                     !strstr(out, "["),
                 "program %s: rc=%d out=%s", noexec[i].prog, rc, out);
    }
    unlink(noexe);
    *strrchr(noexe, '/') = 0;
    rmdir(noexe);
    /* an empty PATH component is the current directory, as for execvp */
    {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "cd %s && PATH=/usr/bin:/bin: %s run -n 1 -- %s", SL_BINARY_DIR, tu_cli(),
                 "suanli --help");
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 0, "program in the current directory through an empty PATH entry: rc=%d out=%.300s",
                 rc, out);
    }
    /* 127 from inside a rank (a wrapper that runs a missing command) is not restarted either */
    rc = run("run -n 2 --max-restarts 2 -- sh -c 'echo attempt; no_such_program_sl'");
    TU_CHECK(rc == 1 && count(out, "attempt") == 2 && strstr(out, "status 127") &&
                 strstr(out, "not restarting"),
             "rank exit 127: rc=%d out=%s", rc, out);
    /* signals to the launcher: forwarded, no restart, 128+sig; ranks that ignore them get SIGKILL after
     * --grace, or at once on a second signal (a second Ctrl-C) */
    static const char *sh =
        "(%s run -n 2 --max-restarts 3 --grace 30 -- sh -c 'trap \"\" INT TERM; sleep 31.%d' & "
        "p=$!; sleep 1; kill -%s $p; %s wait $p; echo rc=$?)";
    const char *sigs[] = {"INT", "TERM"};
    for (int k = 0; k < 2; k++) {
        char cmd[1024], want[32], marker[32];
        snprintf(cmd, sizeof cmd, sh, tu_cli(), k + 1, sigs[k],
                 k ? "sleep 0.5; kill -TERM $p;" : "sleep 0.5; kill -INT $p;");
        snprintf(want, sizeof want, "rc=%d", k ? 143 : 130);
        snprintf(marker, sizeof marker, "sleep 31.%d", k + 1);
        double t0 = sl_time_sec();
        rc = tu_run(cmd, out, sizeof out);
        double dt = sl_time_sec() - t0;
        TU_CHECK(
            strstr(out, want) &&
                strstr(out, k ? "interrupted by signal 15 (SIGTERM)" : "interrupted by signal 2 (SIGINT)") &&
                !strstr(out, "restarting ("),
            "second SIG%s: out=%s", sigs[k], out);
        TU_CHECK(dt < 10, "second SIG%s: the launcher took %.1f s (--grace 30)", sigs[k], dt);
        TU_CHECK(leftovers(marker) == 0, "second SIG%s: ranks left running", sigs[k]);
    }
    /* the launcher killed with SIGKILL (or by the OOM killer): its ranks die with it */
    {
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "(%s run -n 2 -- sleep 32.5 & p=$!; sleep 1; kill -KILL $p; wait $p; echo rc=$?)", tu_cli());
        tu_run(cmd, out, sizeof out);
        int left = 0;
        for (int k = 0; k < 20 && (left = leftovers("sleep 32.5")) > 0; k++) usleep(50000);
        TU_CHECK(strstr(out, "rc=137") && left == 0, "launcher SIGKILLed: %d rank(s) left running; out=%s",
                 left, out);
    }
    /* more ranks than open files allow (two pipes each): refused before any rank starts, naming -n; a soft
     * limit below the hard one is raised */
    {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "ulimit -n 100 && %s run -n 60 -- sh -c 'echo started'", tu_cli());
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 2 && strstr(out, "-n 60: the launcher needs") && strstr(out, "ulimit -n") &&
                     count(out, "\n") == 1 && !strstr(out, "started"),
                 "-n 60 under ulimit -n 100: rc=%d out=%.500s", rc, out);
        snprintf(cmd, sizeof cmd, "ulimit -Sn 100 && %s run -n 60 -- true", tu_cli());
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 0, "-n 60 under a soft ulimit -n 100: rc=%d out=%.500s", rc, out);
    }
    /* a rank killed by a signal: named as SIGSEGV / SIGKILL, the first failed rank, the others stopped */
    rc = run("run -n 3 -- sh -c 'if [ $RANK = 1 ]; then kill -SEGV $$; fi; exec sleep 33.5'");
    TU_CHECK(rc == 1 && strstr(out, "rank 1 was killed by signal 11 (SIGSEGV)") &&
                 strstr(out, "stopped the other"),
             "SIGSEGV: rc=%d out=%s", rc, out);
    TU_CHECK(leftovers("sleep 33.5") == 0, "SIGSEGV: ranks left running");
    rc = run("run -n 2 -- sh -c 'if [ $RANK = 0 ]; then kill -KILL $$; fi; exec sleep 33.5'");
    TU_CHECK(rc == 1 &&
                 strstr(out, "rank 0 was killed by signal 9 (SIGKILL: kill -9 or the out-of-memory killer"),
             "SIGKILL: rc=%d out=%s", rc, out);
    TU_CHECK(leftovers("sleep 33.5") == 0, "SIGKILL: ranks left running");
    /* exit 75 (EX_TEMPFAIL, "restart me": Note [Exit 75 asks for a restart]): restarted while
     * --max-restarts allows, then passed on as the launcher's own status when every rank that failed on its
     * own asked for it (a rank the launcher stopped does not count); any other failure keeps exit 1 */
    rc = run("run -n 2 -- sh -c 'exit 75'");
    TU_CHECK(rc == 75 && strstr(out, "exited with status 75 (a restart was asked for: exit 75 for the "
                                     "supervisor to requeue)"),
             "exit 75 without restarts: rc=%d out=%s", rc, out);
    rc = run("run -n 2 --max-restarts 1 -- sh -c 'echo attempt; exit 75'");
    TU_CHECK(rc == 75 && count(out, "attempt") == 4 && count(out, "restarting (1 of 1)") == 1 &&
                 strstr(out, "and --max-restarts is used up"),
             "exit 75, budget used up: rc=%d out=%s", rc, out);
    rc = run("run -n 2 --max-restarts 1 -- sh -c 'test $SUANLI_RESTART_COUNT -ge 1 || exit 75'");
    TU_CHECK(rc == 0 && strstr(out, "every rank finished after 1 restart"), "exit 75 restarted: rc=%d out=%s",
             rc, out);
    rc = run("run -n 2 -- sh -c 'if [ $RANK = 0 ]; then exit 75; fi; exit 3'");
    TU_CHECK(rc == 1, "one rank 75, the other 3: rc=%d out=%s", rc, out);
    rc = run("run -n 2 -- sh -c 'if [ $RANK = 0 ]; then exit 75; fi; exec sleep 34.5'");
    TU_CHECK(rc == 75 && strstr(out, "rank 0 exited with status 75"),
             "rank 0 exits 75, rank 1 stopped by the launcher: rc=%d out=%s", rc, out);
    TU_CHECK(leftovers("sleep 34.5") == 0, "exit 75: ranks left running");
    return tu_finish("test_run_faults");
}
