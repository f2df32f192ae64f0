/* suanli run: rank-prefixed output, environment, failure propagation naming the rank and cause,
 * exit codes, bad input. Runs the CLI through the shell (SUANLI_CLI). */
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "suanli/base.h"
#include "testutil.h"

static char out[1 << 16];

static int run(const char *fmt, const char *arg) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, tu_cli(), arg ? arg : "");
    return tu_run(cmd, out, sizeof out);
}

int main(void) {
    int rc;
    /* prefixes and environment */
    rc = run("%s run -n 3 -- sh -c 'echo env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE; echo err $RANK "
             ">&2' %s",
             NULL);
    TU_CHECK(rc == 0, "rc=%d out=%s", rc, out);
    TU_CHECK(strstr(out, "[0] env 0 3 0 3") && strstr(out, "[1] env 1 3 1 3") &&
                 strstr(out, "[2] env 2 3 2 3"),
             "out=%s", out);
    TU_CHECK(strstr(out, "[2] err 2") != NULL, "stderr lines prefixed: %s", out);
    rc = run("%s run -n 2 -- sh -c 'test -n \"$MASTER_ADDR\" && test -n \"$MASTER_PORT\" && test -n "
             "\"$SUANLI_JOB_TOKEN\"' %s",
             NULL);
    TU_CHECK(rc == 0, "rendezvous variables set: rc=%d out=%s", rc, out);
    rc = run("%s run --no-prefix -n 1 -- echo plain%s", NULL);
    TU_CHECK(rc == 0 && strncmp(out, "plain", 5) == 0, "no-prefix: %s", out);
    /* a rank fails: the others are stopped within seconds, the rank and status are named */
    double t0 = sl_time_sec();
    rc = run("%s run -n 3 -- sh -c 'if [ $RANK = 1 ]; then sleep 0.3; exit 7; fi; sleep 60' %s", NULL);
    double dt = sl_time_sec() - t0;
    TU_CHECK(rc == 1, "rc=%d", rc);
    TU_CHECK(strstr(out, "rank 1 exited with status 7") != NULL, "out=%s", out);
    TU_CHECK(dt < 10, "took %.1f s to stop the others", dt);
    /* a rank killed by a signal; a rank that ignores SIGTERM is SIGKILLed after the grace period */
    t0 = sl_time_sec();
    rc = run(
        "%s run -n 3 --grace 1 -- sh -c 'trap \"\" TERM; if [ $RANK = 2 ]; then kill -9 $$; fi; sleep 60' %s",
        NULL);
    dt = sl_time_sec() - t0;
    TU_CHECK(rc == 1 && strstr(out, "rank 2 was killed by signal 9"), "rc=%d out=%s", rc, out);
    TU_CHECK(dt < 10, "took %.1f s", dt);
    /* missing program: checked before any rank starts, the shell's 127 */
    rc = run("%s run -n 2 -- /nonexistent/program%s", NULL);
    TU_CHECK(rc == 127 && strstr(out, "cannot execute /nonexistent/program"), "rc=%d out=%s", rc, out);
    /* restarts: fail on the first attempt only */
    rc = run("%s run -n 2 --max-restarts 2 -- sh -c 'test $SUANLI_RESTART_COUNT -ge 1' %s", NULL);
    TU_CHECK(rc == 0, "restart: rc=%d out=%s", rc, out);
    /* segments of dead ranks are swept after the job (Note [Shared-memory names]); other jobs' are kept */
    if (access("/dev/shm", W_OK) == 0) {
        char tok[64], cmd2[1024], keep[128], left[128];
        snprintf(tok, sizeof tok, "sweep%d", (int)getpid());
        snprintf(keep, sizeof keep, "/dev/shm/sl-%sx-keep", tok); /* same leading characters, other job */
        FILE *f = fopen(keep, "w");
        TU_CHECK(f != NULL, "cannot create %s", keep);
        fclose(f);
        snprintf(cmd2, sizeof cmd2,
                 "SUANLI_JOB_TOKEN=%s %%s run -n 2 -- sh -c 'touch /dev/shm/sl-%s-0123-r$RANK; "
                 "[ $RANK = 1 ] && kill -9 $$; sleep 60' %%s",
                 tok, tok);
        rc = run(cmd2, NULL);
        TU_CHECK(rc == 1 && strstr(out, "rank 1 was killed by signal 9"), "rc=%d out=%s", rc, out);
        for (int r = 0; r < 2; r++) {
            snprintf(left, sizeof left, "/dev/shm/sl-%s-0123-r%d", tok, r);
            TU_CHECK(access(left, F_OK) != 0, "%s was left behind", left);
        }
        TU_CHECK(access(keep, F_OK) == 0, "another job's %s was removed", keep);
        unlink(keep);
        /* in-memory checkpoint directories of launchers that died (SIGKILL) are removed, live ones kept:
         * `gone` has no .owner and a dead pid, `stale` an unlocked .owner, `live` a locked one */
        pid_t dead = fork();
        if (dead == 0) _exit(0);
        waitpid(dead, NULL, 0);
        char gone[128], stale[128], live[128], file[160];
        snprintf(gone, sizeof gone, "/dev/shm/suanli-ckpt-%d", (int)dead);
        snprintf(stale, sizeof stale, "/dev/shm/suanli-ckpt-%d", (int)getpid());
        snprintf(live, sizeof live, "/dev/shm/suanli-ckpt-%d", (int)getppid());
        TU_CHECK(mkdir(gone, 0700) == 0 && mkdir(stale, 0700) == 0 && mkdir(live, 0700) == 0,
                 "cannot create %s / %s / %s", gone, stale, live);
        snprintf(file, sizeof file, "%s/.owner", stale);
        int sfd = open(file, O_RDWR | O_CREAT, 0600);
        snprintf(file, sizeof file, "%s/.owner", live);
        int lfd = open(file, O_RDWR | O_CREAT, 0600);
        TU_CHECK(sfd >= 0 && lfd >= 0 && flock(lfd, LOCK_EX) == 0, "cannot create/lock the .owner files");
        close(sfd);
        rc = run("%s run -n 1 -- true%s", NULL);
        TU_CHECK(rc == 0, "rc=%d out=%s", rc, out);
        TU_CHECK(access(gone, F_OK) != 0, "%s (dead pid, no .owner) was left behind", gone);
        TU_CHECK(access(stale, F_OK) != 0, "%s (unlocked .owner) was left behind", stale);
        TU_CHECK(access(live, F_OK) == 0, "%s (locked .owner) was removed", live);
        close(lfd);
        unlink(file);
        rmdir(live);
    } else {
        printf("skip: /dev/shm not writable, segment sweep not tested\n");
    }
    /* bad input: exit 2 with one line naming the flag */
    static const struct {
        const char *args, *want;
    } bad[] = {
        {"-n 0 -- true", "-n: expected an integer in 1..4096, got '0'"},
        {"-n abc -- true", "-n"},
        /* a flag without its value: "missing value", naming the flag (it said got '' or got '--') */
        {"-n", "suanli run: -n: missing value"},
        {"-n -- true", "suanli run: -n: missing value"},
        {"-n '' -- true", "suanli run: -n: empty value"},
        {"--nproc-per-node", "suanli run: --nproc-per-node: missing value"},
        {"-n 2 --nnodes", "suanli run: --nnodes: missing value"},
        {"-n 2 --node-rank -- true", "suanli run: --node-rank: missing value"},
        {"-n 2 --max-restarts", "suanli run: --max-restarts: missing value"},
        {"-n 2 --grace -- true", "suanli run: --grace: missing value"},
        {"-n 2 --master", "suanli run: --master: missing value"},
        {"-n 2 --bind -- true", "suanli run: --bind: missing value"},
        {"-n 2 --hosts", "suanli run: --hosts: missing value"},
        {"-- true", "-n"},
        {"-n 2", "no program"},
        {"--bogus -n 2 -- true", "--bogus"},
        {"-n 2 --nnodes 2 -- true", "--master"},
        {"-n 2 --master nohost -- true", "--master"},
        {"-n 2 --nnodes 2 --node-rank 5 --master h:1 -- true", "--node-rank"},
        {"-n 2 --master h:99999 -- true", "--master"},
        {"-n 2 --grace nan -- true", "--grace"}, /* NaN: the SIGKILL deadline never came */
        {"-n 2 --grace '' -- true", "suanli run: --grace: empty value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = run("%s run %s", bad[i].args);
        int lines = 0;
        for (char *p = out; *p; p++) lines += *p == '\n';
        TU_CHECK(rc == 2 && strstr(out, bad[i].want) && lines == 1, "args '%s': rc=%d out=%s", bad[i].args,
                 rc, out);
    }
    char longhost[400]; /* a host name longer than the launcher keeps: it exited 2 without a message */
    memset(longhost, 'h', 300);
    snprintf(longhost + 300, sizeof longhost - 300, ":29500");
    rc = run("%s run -n 2 --master %s -- true", longhost);
    TU_CHECK(rc == 2 && strstr(out, "--master") && strchr(out, '\n') == out + strlen(out) - 1,
             "--master with a 300-character host: rc=%d out=%s", rc, out);
    /* a real communicator job: ranks killed mid-collective under the launcher */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/tests/comm/test_comm_loopback", SL_BINARY_DIR);
    rc = run("%s run -n 4 -- %s env", cmd);
    TU_CHECK(rc == 0 && strstr(out, "[3] rank 3/4 transport shm: ok"), "comm job: rc=%d out=%.2000s", rc,
             out);
    /* a rank that stops (SIGSTOP) mid-collective: the launcher has no heartbeat of its own; the
     * communicator deadline (2 s here) makes every other rank fail and exit, which ends the job
     * and SIGKILLs the stopped rank after the grace period (shm, then tcp) */
    snprintf(cmd, sizeof cmd, "%s/tests/comm/test_comm_fault_loopback", SL_BINARY_DIR);
    for (int tcp = 0; tcp < 2; tcp++) {
        rc = run(tcp ? "SUANLI_COMM_TRANSPORT=tcp %s run -n 3 --grace 1 -- %s env-stop"
                     : "%s run -n 3 --grace 1 -- %s env-stop",
                 cmd);
        /* each survivor fails: by the deadline, or by the other survivor giving up first */
        int e0 = strstr(out, "[0] rank 0: timeout after") || strstr(out, "[0] rank 0: peer failure after");
        int e2 = strstr(out, "[2] rank 2: timeout after") || strstr(out, "[2] rank 2: peer failure after");
        TU_CHECK(rc == 1 && e0 && e2 &&
                     (strstr(out, "suanli run: rank 0 exited with status 3") ||
                      strstr(out, "suanli run: rank 2 exited with status 3")) &&
                     strstr(out, tcp ? "tcp transport: no progress" : "shm transport: ") &&
                     strstr(out, "no progress"),
                 "stopped rank (%s): rc=%d out=%.3000s", tcp ? "tcp" : "shm", rc, out);
    }
    snprintf(cmd, sizeof cmd, "%s/tests/comm/test_comm_loopback", SL_BINARY_DIR);
    /* two launchers on this host as two nodes of one job (--nnodes 2 --master); they pretend to be
     * two hosts, so the communicator is hybrid (shm inside a host, tcp between) with the hierarchical
     * all-reduce */
    char mn[3072];
    int port = 12000 + (int)(getpid() % 20000); /* below the ephemeral range (Note [Slurm rendezvous port]) */
    snprintf(mn, sizeof mn,
             "SUANLI_COMM_HOSTNAME=nodeA %s run -n 2 --nnodes 2 --node-rank 0 --master 127.0.0.1:%d -- %s "
             "env & p=$!; "
             "SUANLI_COMM_HOSTNAME=nodeB %s run -n 2 --nnodes 2 --node-rank 1 --master 127.0.0.1:%d -- %s "
             "env; r1=$?; wait $p; r0=$?; "
             "echo rc $r0 $r1",
             tu_cli(), port, cmd, tu_cli(), port, cmd);
    rc = tu_run(mn, out, sizeof out);
    TU_CHECK(strstr(out, "rc 0 0") && strstr(out, "[0] rank 0/4") &&
                 strstr(out, "[3] rank 3/4 transport hybrid: ok"),
             "two nodes: %.3000s", out);
    return tu_finish("test_launch");
}
