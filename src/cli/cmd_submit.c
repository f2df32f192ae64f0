/* suanli submit — write (and with --go, submit) an sbatch script for a training command.
 *
 * Note [Requeue on the time limit]
 * The script asks Slurm for --requeue and --signal=B:USR1@SEC: SEC seconds before the time limit the batch
 * shell gets SIGUSR1. Its trap forwards the signal to the srun step (srun passes SIGUSR1 on to every task);
 * each `suanli train` rank finishes its step, the ranks agree to stop, save and commit a checkpoint and exit
 * with SL_EXIT_REQUEUE (75, EX_TEMPFAIL; src/train/run.c). When the step ends with 75 the script requeues
 * the job (scontrol requeue), and the next run resumes from the newest checkpoint because the training
 * command loads from its save directory. Any other exit status is the job's. */
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
        "usage: suanli submit --nodes N --ntasks-per-node K --time D-HH:MM:SS|HH:MM:SS [--job-name NAME]\n"
        "                     [--partition P] [--signal-sec SEC] [--script FILE] [--go] -- PROGRAM ARGS...\n"
        "  writes FILE (default suanli-job.sbatch): #SBATCH --nodes, --ntasks-per-node, --time, --requeue,\n"
        "  --signal=B:USR1@SEC (default 120); the step runs under srun; on USR1 the ranks checkpoint and "
        "exit 75,\n"
        "  and the job requeues itself. --go submits it with sbatch (exit 2 when sbatch is not "
        "installed).\n");
}

static int is_time(const char *s) { /* [D-]HH:MM:SS or MM:SS or minutes */
    int colons = 0;
    for (const char *p = s; *p; p++) {
        if (*p == ':')
            colons++;
        else if (*p != '-' && (*p < '0' || *p > '9'))
            return 0;
    }
    return *s && colons <= 2;
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
    const char *nodes, *tasks, *time, *name, *partition, *script, *signal_sec;
    int go;
} submit_args;

static int write_script(const submit_args *a, char **prog) {
    FILE *f = fopen(a->script, "w");
    if (!f) {
        fprintf(stderr, "suanli submit: --script: cannot write '%s'\n", a->script);
        return 2;
    }
    fprintf(f, "#!/bin/bash\n# written by suanli submit (Note [Requeue on the time limit] in "
               "src/cli/cmd_submit.c)\n");
    fprintf(f, "#SBATCH --job-name=%s\n#SBATCH --nodes=%s\n#SBATCH --ntasks-per-node=%s\n#SBATCH --time=%s\n",
            a->name, a->nodes, a->tasks, a->time);
    if (a->partition) fprintf(f, "#SBATCH --partition=%s\n", a->partition);
    fprintf(f, "#SBATCH --requeue\n#SBATCH --signal=B:USR1@%s\n#SBATCH --output=%s-%%j.out\n", a->signal_sec,
            a->name);
    fprintf(f,
            "requeue=0\n"
            "trap 'requeue=1; echo \"suanli submit: time limit in %s s: checkpoint and requeue\"; "
            "kill -USR1 \"$child\" 2>/dev/null' USR1\n",
            a->signal_sec);
    fprintf(f, "srun --kill-on-bad-exit=1");
    for (char **p = prog; *p; p++) {
        fputc(' ', f);
        shell_word(f, *p);
    }
    fprintf(f, " &\nchild=$!\nwait \"$child\"; rc=$?\n"
               "while kill -0 \"$child\" 2>/dev/null; do wait \"$child\"; rc=$?; done\n"
               "if [ \"$rc\" -eq 75 ]; then\n"
               "  echo \"suanli submit: checkpoint saved; requeueing job $SLURM_JOB_ID\"\n"
               "  scontrol requeue \"$SLURM_JOB_ID\"\n  exit 0\nfi\nexit \"$rc\"\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "suanli submit: --script: cannot write '%s'\n", a->script);
        return 2;
    }
    return 0;
}

int sl_cmd_submit(int argc, char **argv) {
    submit_args a = {.name = "suanli", .script = "suanli-job.sbatch", .signal_sec = "120"};
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
        if (!dst) {
            fprintf(stderr, "suanli submit: unknown flag '%s' (see suanli submit --help)\n", s);
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
    char *end;
    long nn = strtol(a.nodes, &end, 10), nt;
    if (*end || nn < 1) {
        fprintf(stderr, "suanli submit: --nodes: expected an integer >= 1, got '%s'\n", a.nodes);
        return 2;
    }
    nt = strtol(a.tasks, &end, 10);
    if (*end || nt < 1) {
        fprintf(stderr, "suanli submit: --ntasks-per-node: expected an integer >= 1, got '%s'\n", a.tasks);
        return 2;
    }
    long sig = strtol(a.signal_sec, &end, 10);
    if (*end || sig < 1 || sig > 65535) {
        fprintf(stderr, "suanli submit: --signal-sec: expected seconds in 1..65535, got '%s'\n",
                a.signal_sec);
        return 2;
    }
    if (!is_time(a.time)) {
        fprintf(stderr, "suanli submit: --time: expected [D-]HH:MM:SS, got '%s'\n", a.time);
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
