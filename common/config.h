/* Daemon configuration: one typed table of keys per daemon, filled from a libconfig file and then
 * from command-line flags (`--key value` overrides the file). Every value is validated; an error
 * names the file and line (or the flag), the key, what is allowed and what arrived. */
#ifndef PP_CONFIG_H
#define PP_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

enum pp_cfg_type {
    PP_CFG_INT,    /* int64_t, within [min, max] */
    PP_CFG_FLOAT,  /* double, within [min, max] */
    PP_CFG_BOOL,   /* int, 0 or 1 */
    PP_CFG_STRING, /* char[PP_CFG_STR_MAX] */
    PP_CFG_INTS,   /* struct pp_cfg_ints: a list of integers within [min, max] */
};

#define PP_CFG_STR_MAX 256
#define PP_CFG_INTS_MAX 64

struct pp_cfg_ints {
    int64_t v[PP_CFG_INTS_MAX];
    int n;
};

struct pp_cfg_key {
    const char *name;  /* as in the file and as the flag (--name) */
    enum pp_cfg_type type;
    size_t offset;     /* of the value inside the daemon's config struct */
    double min;
    double max;
    const char *help;
    /* PP_CFG_STRING only, may be NULL: validates a value as it is read (from a file or a flag);
     * returns PP_OK, or an error whose detail says what was expected and what arrived (the loader
     * adds the file and line or the flag, and the key). */
    pp_status (*check)(const char *value);
};

/* Reads path into the struct at dest (keys not in the file keep their current values, so set
 * defaults first). Unknown keys and wrong types are errors. */
pp_status pp_config_load_file(const struct pp_cfg_key *keys, int n_keys, void *dest,
                              const char *path);

/* Sets one key from text (a flag); source names it in errors, e.g. "--threads". */
pp_status pp_config_set(const struct pp_cfg_key *keys, int n_keys, void *dest, const char *name,
                        const char *value, const char *source);

/* Applies `--key value` / `--key=value` flags from argv; `--config PATH` is read first wherever it
 * appears, so flags override the file. Flags not in the table are errors. */
pp_status pp_config_from_args(const struct pp_cfg_key *keys, int n_keys, void *dest, int argc,
                              char **argv);

/* Checks shared by the daemons' tables: a host:port address, a log level name. The messages name
 * the key. */
pp_status pp_config_check_address(const char *key, const char *value);
pp_status pp_config_check_log_level(const char *key, const char *value);

/* Prints the keys with their help and current values (for --help). */
void pp_config_usage(const struct pp_cfg_key *keys, int n_keys, const void *dest);

#endif
