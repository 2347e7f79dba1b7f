/* Table-driven command-line flags for the ppserve subcommands. Each flag is `--name VALUE` or
 * `--name=VALUE` (flags of type PP_ARG_FLAG take no value). Bad values get a message that names the
 * flag, what it accepts and what arrived. */
#ifndef PP_ARGS_H
#define PP_ARGS_H

#include <stdint.h>

enum pp_arg_type {
    PP_ARG_STRING, /* const char ** */
    PP_ARG_INT,    /* int32_t *, within [min, max] */
    PP_ARG_U64,    /* uint64_t * */
    PP_ARG_FLOAT,  /* float *, within [min, max] */
    PP_ARG_FLAG,   /* int *, set to 1 */
    PP_ARG_IDS,    /* struct pp_id_list *: comma-separated non-negative integers */
    PP_ARG_STRINGS /* struct pp_str_list *: repeatable */
};

struct pp_id_list {
    int32_t *ids;
    int32_t n;
};

#define PP_ARGS_MAX_STRINGS 16
struct pp_str_list {
    const char *items[PP_ARGS_MAX_STRINGS];
    int n;
};

struct pp_arg {
    const char *name; /* without the leading dashes */
    enum pp_arg_type type;
    void *dest;
    double min;
    double max;
    const char *help;
    int seen; /* set by the parser */
};

/* Parses argv[0..argc) against args[n]. Returns 0, or 2 after printing the problem to stderr.
 * Positional arguments are refused unless `positional` is non-NULL (it then receives the first
 * one). */
int pp_args_parse(const char *cmd, struct pp_arg *args, int n, int argc, char **argv,
                  const char **positional);
/* Prints a usage block for the command to stdout. */
void pp_args_usage(const char *cmd, const char *synopsis, const struct pp_arg *args, int n);
/* 1 if the flag of that name was given. */
int pp_args_seen(const struct pp_arg *args, int n, const char *name);
void pp_id_list_free(struct pp_id_list *l);

#endif
