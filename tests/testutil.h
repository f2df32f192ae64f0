/* Minimal test harness: CHECK macros that print the case and keep counting; main returns failures. */
#ifndef SL_TESTUTIL_H
#define SL_TESTUTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>

extern _Atomic int tu_failures, tu_checks; /* atomic: checks may run on threads as ranks */

#define TU_CHECK(cond, ...)                                                                                  \
    do {                                                                                                     \
        tu_checks++;                                                                                         \
        if (!(cond)) {                                                                                       \
            tu_failures++;                                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                  \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fprintf(stderr, "\n");                                                                           \
        }                                                                                                    \
    } while (0)

/* Compare arrays; tolerance: |a-b| <= atol + rtol*|b|. Prints the worst element on failure. */
int tu_allclose(const char *what, const float *got, const float *ref, int64_t n, float atol, float rtol);
/* max|a-b| / max|b| */
double tu_rel_maxdiff(const float *got, const float *ref, int64_t n);
int tu_finish(const char *name); /* prints summary, returns exit code */
/* Under ASan: LeakSanitizer's check now, from main, instead of at exit. A runtime with worker threads of its
 * own (PoCL) may still be tearing them down in exit's destructors when LSan's tracer stops every thread,
 * and the tracer then crashes now and then (google/sanitizers#1353; test_backend_opencl, once in ~10
 * runs). A later check at exit is skipped. A no-op without ASan. */
void tu_leak_check_now(void);
/* Run a shell command, capture stdout+stderr into buf (truncated), return exit status (-1 on error). */
int tu_run(const char *cmd, char *buf, size_t cap);
/* 1 when both files exist and have identical bytes */
int tu_same_file(const char *a, const char *b);
/* 1 when path holds exactly a[0,an) followed by b[0,bn) */
int tu_file_is(const char *path, const void *a, size_t an, const void *b, size_t bn);
/* the entries of directory d whose names contain `part` (0 when d cannot be opened) */
int tu_count_names(const char *d, const char *part);
const char *tu_cli(void); /* path to the suanli CLI (SUANLI_CLI env) */
/* Run `suanli ARGS` (ARGS formatted like printf) capturing stdout+stderr into out; returns the exit status.
 */
int tu_cli_run(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Run `prefix` + the command line formatted like printf (e.g. prefix "SUANLI_COMM_TIMEOUT=60 timeout 300"),
 * capturing stdout+stderr into out; returns the exit status. */
int tu_runf(char *out, size_t cap, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The number after "key": on the metrics.jsonl line of `step` (NAN when absent). */
double tu_metric_at(const char *metrics_path, int step, const char *key);
/* A learnable token pattern with noise, a pure function of (step, micro, position): micro-batch `micro` of
 * `step`, B rows of T ids over vocabulary V, and the targets (the ids shifted by one). */
void tu_synth_tokens(int B, int T, int V, int64_t step, int micro, int32_t *ids, int32_t *tg);
/* "Nothing written" (bad input must leave no trace): a signature of every entry under `dir` (relative
 * path, type, size, modification time in ns), 0 when dir is absent. tu_watch(dir) makes tu_run (and so
 * tu_cli_run, tu_runf) record the signature right before each command; tu_unchanged() is then 1 when the
 * last command created, removed, or modified nothing under dir. */
uint64_t tu_tree_sig(const char *dir);
void tu_watch(const char *dir);
int tu_unchanged(void);
/* dir/data: the first `bytes` of the bundled tinyshakespeare as a byte-level token dataset (`suanli data
 * prepare`; data receives the prefix, out the command's output); returns the exit status. */
int tu_prepare_corpus(const char *dir, int bytes, char *data, size_t data_cap, char *out, size_t cap);
/* Make a fresh temp dir under /tmp; returns static buffer path. */
const char *tu_tmpdir(const char *tag);
#endif
