/* Declarative flags shared by CLI commands: "--name value", "--name=value", and JSON config files whose
 * keys are the flag names (with '-' or '_'). Every error is one line naming the flag or key. */
#ifndef SL_CLI_FLAGS_H
#define SL_CLI_FLAGS_H
#include <stddef.h>
#include <stdint.h>

#include "suanli/base.h"

typedef enum { SL_FLAG_INT, SL_FLAG_FLOAT, SL_FLAG_STR, SL_FLAG_BOOL } sl_flag_type;

typedef struct sl_flag {
    const char *name; /* without leading dashes */
    sl_flag_type type;
    void *dst;     /* int64_t*, double*, const char**, int* */
    double lo, hi; /* inclusive range for numbers */
    const char *help;
    int set; /* filled in: 1 if given on the command line or in a config file */
} sl_flag;

/* Parse argv[first..argc). Unknown flags, missing values, malformed or out-of-range numbers fail. If a
 * flag named "config" exists and is given, that JSON file is applied first and the command line
 * overrides it. */
sl_status sl_flags_parse(sl_flag *flags, int n, int argc, char **argv, int first);
/* Free the strings that config files gave to string flags (their dst pointers dangle afterwards). */
void sl_flags_config_release(void);
void sl_flags_usage(const sl_flag *flags, int n, FILE *f);
/* -h or --help among argv[1..argc): the usage line and the flags on stdout, and 1 (the command exits 0) */
int sl_flags_help(const sl_flag *flags, int n, int argc, char **argv, const char *usage);
const sl_flag *sl_flags_find(const sl_flag *flags, int n, const char *name);
/* The first executable PROG in $PATH into out; 0 when there is none. */
int sl_cli_find_in_path(const char *prog, char *out, size_t cap);
#endif
