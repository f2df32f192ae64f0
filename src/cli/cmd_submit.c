/* suanli submit — write (and with --go, submit) an sbatch script for a training command.
 *
 * Note [Requeue on the time limit]
 * The script asks Slurm for --requeue and --signal=B:USR1@SEC: SEC seconds before the time limit the batch
 * shell gets SIGUSR1. Its trap forwards the signal to the srun step (srun passes SIGUSR1 on to every task);
 * each `suanli train` rank finishes its step, the ranks agree to stop, save and commit a checkpoint and exit
 * with SL_EXIT_REQUEUE (75, EX_TEMPFAIL; src/train/run.c). When the step ends with 75 the script requeues
 * the job (scontrol requeue), and the next run resumes from the newest checkpoint because the training
 * command loads from its save directory.
 *
 * Note [Requeue after a failure]
 * A step that fails otherwise (a host died: its ranks' peers fail on the communicator deadline or the
 * reset connection and exit non-zero, srun ends the step) also requeues the job, while the job has been
 * requeued fewer than --max-requeues times (SLURM_RESTART_COUNT; default 3; 0: never): the batch script
 * runs `scontrol requeue`, Slurm holds the job until nodes are free (the dead host is marked down after
 * SlurmdTimeout, so a spare or the surviving hosts take it) and the next run resumes from the newest
 * valid checkpoint. With --nodes MIN-MAX the requeued job may get fewer nodes: the training command
 * then resumes with a smaller DP size, resharding the checkpoint (any saved layout loads into any
 * other). The script exports SUANLI_RESTART_COUNT=SLURM_RESTART_COUNT, so ranks know the attempt
 * (test hooks fire on the first attempt only, as under suanli run --max-restarts). A step that ends
 * with 2 (bad input or usage), 126 or 127 (the program cannot run) is not requeued: it would fail the same
 * way on every attempt (as suanli run; Note [Bad input under srun]); the job ends with that status.
 * Any other exit status is the job's. Tested end to end on a namespace Slurm cluster
 * (tests/fault/slurm_requeue.sh).
 *
 * Note [MPI under srun]
 * --mpi TYPE has srun start the ranks through Slurm's PMI plugin (pmix for OpenMPI, pmi2 for MPICH), so
 * MPI_Init in each rank finds its MPI_COMM_WORLD without mpirun. The ranks still take rank, size and the
 * rendezvous from Slurm's environment (src/comm/init.c), and the script sets SUANLI_COMM_TRANSPORT=mpi
 * (unless the caller set another), so the collectives' messages go through that MPI library: its
 * fabric support (verbs, UCX, libfabric) instead of suanli's TCP between hosts. The MPI transport maps
 * each rank to its MPI_COMM_WORLD rank and refuses ranks MPI started as singletons (src/comm/transport/
 * mpi.c). A killed host ends the step as under TCP (the MPI
 * library or the communicator deadline fails the peers) and the job requeues as above. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "suanli/base.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: suanli submit --nodes N|MIN-MAX --ntasks-per-node K --time D-HH:MM:SS|HH:MM:SS [--job-name "
        "NAME]\n"
        "                     [--partition P] [--signal-sec SEC] [--max-requeues R] [--mpi pmix|pmi2]\n"
        "                     [--script FILE] [--go]\n"
        "                     -- PROGRAM ARGS...\n"
        "  writes FILE (default suanli-job.sbatch): #SBATCH --nodes, --ntasks-per-node, --time, --requeue,\n"
        "  --signal=B:USR1@SEC (default 120); the step runs under srun; on USR1 the ranks checkpoint and "
        "exit 75,\n"
        "  and the job requeues itself; a step that fails otherwise (a dead host) requeues it up to R times\n"
        "  (never after exit 2, 126 or 127: bad input, or a program that cannot run)\n"
        "  (default 3), on MIN-MAX nodes possibly fewer (the job resumes with a smaller DP size).\n"
        "  --mpi TYPE launches the ranks with srun --mpi=TYPE (PMIx for OpenMPI, PMI-2 for MPICH) and runs\n"
        "  them over the MPI transport (SUANLI_COMM_TRANSPORT=mpi unless set).\n"
        "  --go submits it with sbatch (exit 2 when sbatch is not installed).\n");
}

/* Slurm's forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; each field after the first below 60, hours after D-
 * below 24 */
static int is_time(const char *s) {
    const char *p = s, *dash = strchr(s, '-');
    long f[3];
    int n = 0;
    if (dash) {
        size_t k = strspn(s, "0123456789");
        if (k == 0 || k > 6 || s + k != dash) return 0;
        p = dash + 1;
    }
    for (;;) {
        size_t k = strspn(p, "0123456789");
        if (k == 0 || k > 6 || n == 3) return 0;
        f[n++] = strtol(p, NULL, 10);
        p += k;
        if (!*p) break;
        if (*p++ != ':') return 0;
    }
    for (int i = 0; i < n; i++)
        if ((i > 0 || dash) && f[i] >= (dash && i == 0 ? 24 : 60)) return 0;
    return 1;
}

/* The leading digits of s as a number (*end after them); -1 when there are none or more than 9. strtol
 * also took leading blanks (a newline too, which ended the #SBATCH line), a sign and overflow. */
static long count_of(const char *s, const char **end) {
    size_t k = strspn(s, "0123456789");
    *end = s + k;
    return k == 0 || k > 9 ? -1 : strtol(s, NULL, 10);
}

/* s for an error message: control characters (a newline made it two lines) shown as spaces */
static const char *one_line(const char *s) {
    static char b[256];
    snprintf(b, sizeof b, "%s", s);
    for (char *p = b; *p; p++)
        if ((unsigned char)*p < ' ') *p = ' ';
    return b;
}

static int plain_word(const char *s) { /* NULL (not given) or no whitespace, control characters */
    for (; s && *s; s++)
        if ((unsigned char)*s <= ' ' || *s == 0x7f) return 0;
    return 1;
}

/* a shell word for the script (single-quoted unless plain) */
static void shell_word(FILE *f, const char *s) {
    int plain = *s != 0;
    for (const char *p = s; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%", *p))
            plain = 0;
    if (plain) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (const char *p = s; *p; p++) {
        if (*p == '\'')
            fputs("'\\''", f);
        else
            fputc(*p, f);
    }
    fputc('\'', f);
}

typedef struct {
    const char *nodes, *tasks, *time, *name, *partition, *script, *signal_sec, *max_requeues, *mpi;
    int go;
} submit_args;

/* The script is composed in memory and written atomically: a failed write (a full disk) left an empty or
 * cut script, and truncated the one there before. */
static int write_script(const submit_args *a, char **prog) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        fprintf(stderr, "suanli submit: --script: out of memory\n");
        return 1;
    }
    fprintf(f, "#!/bin/bash\n# written by suanli submit (Note [Requeue on the time limit] in "
               "src/cli/cmd_submit.c)\n");
    int range = strchr(a->nodes, '-') != NULL;
    fprintf(f, "#SBATCH --job-name=%s\n#SBATCH --nodes=%s\n", a->name, a->nodes);
    /* MIN-MAX: whole nodes, as many as are free (with --ntasks-per-node in the allocation Slurm starts the
     * job on MIN nodes; the tasks per node go to srun instead) */
    if (range)
        fprintf(f, "#SBATCH --exclusive\n");
    else
        fprintf(f, "#SBATCH --ntasks-per-node=%s\n", a->tasks);
    fprintf(f, "#SBATCH --time=%s\n", a->time);
    if (a->partition) fprintf(f, "#SBATCH --partition=%s\n", a->partition);
    fprintf(f,
            "#SBATCH --requeue\n#SBATCH --signal=B:USR1@%s\n#SBATCH --output=%s-%%j.out\n#SBATCH "
            "--open-mode=append\n",
            a->signal_sec, a->name);
    fprintf(f, "export SUANLI_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}\n");
    /* Note [MPI under srun]: the ranks bootstrap from Slurm's environment as always, and the transport is
     * the MPI library the PMI plugin wired up (the same MPI_COMM_WORLD ranks) */
    if (a->mpi) fprintf(f, "export SUANLI_COMM_TRANSPORT=${SUANLI_COMM_TRANSPORT:-mpi}\n");
    fprintf(f,
            "requeue=0\n"
            "trap 'requeue=1; echo \"suanli submit: time limit in %s s: checkpoint and requeue\"; "
            "kill -USR1 \"$child\" 2>/dev/null' USR1\n",
            a->signal_sec);
    /* srun's stderr also goes to a log (Note [Bad input under srun]), removed however the script ends
     * (scancel's SIGTERM included: the TERM trap turns it into an exit that runs the EXIT trap) */
    fprintf(f, "srunlog=$(mktemp \"${TMPDIR:-/tmp}/suanli-srun.XXXXXX\") && mkfifo \"$srunlog.fifo\" || "
               "{ echo \"suanli submit: cannot create a temp file in ${TMPDIR:-/tmp}\" >&2; exit 1; }\n"
               "trap 'rm -f \"$srunlog\" \"$srunlog.fifo\"' EXIT\ntrap 'exit 143' TERM INT\n"
               "tee \"$srunlog\" < \"$srunlog.fifo\" >&2 &\nteepid=$!\n");
    fprintf(f, "srun --kill-on-bad-exit=1");
    if (a->mpi) fprintf(f, " --mpi=%s", a->mpi);
    if (range) fprintf(f, " --ntasks-per-node=%s", a->tasks);
    for (char **p = prog; *p; p++) {
        fputc(' ', f);
        shell_word(f, *p);
    }
    fprintf(f,
            " 2> \"$srunlog.fifo\" &\nchild=$!\nwait \"$child\"; rc=$?\n"
            "while kill -0 \"$child\" 2>/dev/null; do wait \"$child\"; rc=$?; done\n"
            "wait \"$teepid\" 2>/dev/null\n"
            "bad=$(grep -Eo 'tasks? [0-9,-]+: Exited with exit code (2|126|127)$' \"$srunlog\" | head -n 1)\n"
            "rm -f \"$srunlog\" \"$srunlog.fifo\"\n"
            "if [ \"$rc\" -eq 75 ]; then\n"
            "  echo \"suanli submit: checkpoint saved; requeueing job $SLURM_JOB_ID\"\n"
            "  scontrol requeue \"$SLURM_JOB_ID\"\n  exit 0\nfi\n");
    /* Note [Bad input under srun]
     * A task that exits 2 (bad input or usage; Note [No restart after bad input] in src/launch) or 126 / 127
     * (the program cannot run) fails the same way on every attempt, so the job ends with that status
     * instead of being requeued. srun's own status cannot tell: with --kill-on-bad-exit the other tasks
     * are terminated and srun returns the highest status, 143 when one of them was still running. So the
     * script reads srun's per-task report ("task 0: Exited with exit code 2") from its stderr, which it
     * copies to a log (tee through a FIFO: the job's output still shows it as it comes). */
    fprintf(f, "case \"$rc\" in 2|126|127) bad=\"exit code $rc\" ;; esac\n"
               "if [ -n \"$bad\" ]; then\n"
               "  echo \"suanli submit: step failed (status $rc; $bad: bad input, usage or a program that "
               "cannot run); not requeueing job $SLURM_JOB_ID, it would fail the same way\"\n"
               "  exit \"${bad##* }\"\nfi\n");
    fprintf(
        f,
        "if [ \"$rc\" -ne 0 ] && [ \"$SUANLI_RESTART_COUNT\" -lt %s ]; then\n"
        "  echo \"suanli submit: step failed (status $rc) on attempt $SUANLI_RESTART_COUNT; requeueing job "
        "$SLURM_JOB_ID (at most %s times)\"\n"
        "  scontrol requeue \"$SLURM_JOB_ID\"\n  exit 0\nfi\nexit \"$rc\"\n",
        a->max_requeues, a->max_requeues);
    if (fclose(f) != 0) {
        free(text);
        fprintf(stderr, "suanli submit: --script: out of memory\n");
        return 1;
    }
    sl_status st = sl_file_write_atomic(a->script, text, len);
    free(text);
    if (st != SL_OK) {
        fprintf(stderr, "suanli submit: --script: %s\n", sl_errmsg());
        return 2;
    }
    return 0;
}

int sl_cmd_submit(int argc, char **argv) {
    submit_args a = {
        .name = "suanli", .script = "suanli-job.sbatch", .signal_sec = "120", .max_requeues = "3"};
    int i = 1;
    for (; i < argc; i++) {
        const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char **dst = NULL;
        if (!strcmp(s, "--")) {
            i++;
            break;
        }
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(s, "--go")) {
            a.go = 1;
            continue;
        }
        if (!strcmp(s, "--nodes"))
            dst = &a.nodes;
        else if (!strcmp(s, "--ntasks-per-node"))
            dst = &a.tasks;
        else if (!strcmp(s, "--time"))
            dst = &a.time;
        else if (!strcmp(s, "--job-name"))
            dst = &a.name;
        else if (!strcmp(s, "--partition"))
            dst = &a.partition;
        else if (!strcmp(s, "--script"))
            dst = &a.script;
        else if (!strcmp(s, "--signal-sec"))
            dst = &a.signal_sec;
        else if (!strcmp(s, "--max-requeues"))
            dst = &a.max_requeues;
        else if (!strcmp(s, "--mpi"))
            dst = &a.mpi;
        if (!dst) {
            fprintf(stderr, "suanli submit: unknown flag '%s' (see suanli submit --help)\n", one_line(s));
            return 2;
        }
        if (!v || !*v) {
            fprintf(stderr, "suanli submit: %s: missing value\n", s);
            return 2;
        }
        *dst = v;
        i++;
    }
    const char *need = !a.nodes ? "--nodes" : !a.tasks ? "--ntasks-per-node" : !a.time ? "--time" : NULL;
    if (need) {
        fprintf(stderr, "suanli submit: %s: required (see suanli submit --help)\n", need);
        return 2;
    }
    const char *end;
    long nn = count_of(a.nodes, &end), nt, nmax = nn;
    if (*end == '-') nmax = count_of(end + 1, &end);
    if (*end || nn < 1 || nmax < nn) {
        fprintf(stderr, "suanli submit: --nodes: expected an integer >= 1 or MIN-MAX, got '%s'\n",
                one_line(a.nodes));
        return 2;
    }
    long mr = count_of(a.max_requeues, &end);
    if (*end || mr < 0 || mr > 1000) {
        fprintf(stderr, "suanli submit: --max-requeues: expected an integer in 0..1000, got '%s'\n",
                one_line(a.max_requeues));
        return 2;
    }
    nt = count_of(a.tasks, &end);
    if (*end || nt < 1) {
        fprintf(stderr, "suanli submit: --ntasks-per-node: expected an integer >= 1, got '%s'\n",
                one_line(a.tasks));
        return 2;
    }
    long sig = count_of(a.signal_sec, &end);
    if (*end || sig < 1 || sig > 65535) {
        fprintf(stderr, "suanli submit: --signal-sec: expected seconds in 1..65535, got '%s'\n",
                one_line(a.signal_sec));
        return 2;
    }
    if (a.mpi && strcmp(a.mpi, "pmix") && strcmp(a.mpi, "pmi2") &&
        (strncmp(a.mpi, "pmix_v", 6) || !a.mpi[6] || strspn(a.mpi + 6, "0123456789") != strlen(a.mpi + 6))) {
        fprintf(stderr, "suanli submit: --mpi: expected pmix, pmix_vN or pmi2 (srun --mpi=list), got '%s'\n",
                one_line(a.mpi));
        return 2;
    }
    /* written into #SBATCH lines as they are: a newline would end the directives and run the rest */
    const char *word = !plain_word(a.name) ? "--job-name" : !plain_word(a.partition) ? "--partition" : NULL;
    if (word) {
        fprintf(stderr, "suanli submit: %s: must not contain whitespace or control characters\n", word);
        return 2;
    }
    if (!is_time(a.time)) {
        fprintf(stderr, "suanli submit: --time: expected [D-]HH:MM:SS, got '%s'\n", one_line(a.time));
        return 2;
    }
    if (i >= argc) {
        fprintf(stderr, "suanli submit: no training command given (suanli submit ... -- suanli train ...)\n");
        return 2;
    }
    char sbatch[4096];
    if (a.go && !sl_cli_find_in_path("sbatch", sbatch, sizeof sbatch)) { /* before writing anything */
        fprintf(stderr,
                "suanli submit: --go: sbatch not found in PATH (is Slurm installed?); nothing submitted\n");
        return 2;
    }
    int rc = write_script(&a, argv + i);
    if (rc) return rc;
    printf("wrote %s\n", a.script);
    if (!a.go) return 0;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(sbatch, "sbatch", a.script, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "suanli submit: sbatch %s failed (status %d)\n", a.script,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return 1;
    }
    return 0;
}
