/* libFuzzer target: arbitrary bytes as a daemon's configuration file (libconfig), read with the
 * stage's and the coordinator's key tables and then checked as the daemons check them. Every
 * input must come back as PP_OK or an error with a message; and a file the loader accepts must
 * leave every string key terminated within its buffer. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/coordinator_config.h"
#include "fuzz_util.h"
#include "stage/stage_config.h"

/* An error must say something. */
static void check_status(pp_status st)
{
    if (st != PP_OK && !pp_error_detail()[0])
        abort();
}

/* Every string key of a loaded table ends within its buffer. */
static void check_strings(const struct pp_cfg_key *keys, int n_keys, const void *dest)
{
    for (int i = 0; i < n_keys; i++)
        if (keys[i].type == PP_CFG_STRING &&
            !memchr((const char *)dest + keys[i].offset, 0, PP_CFG_STR_MAX))
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = pp_fuzz_memfile(data, size, path, sizeof(path));
    if (fd < 0)
        return 0;
    struct pp_stage_config sc;
    pp_stage_config_defaults(&sc);
    pp_error_clear();
    pp_status st = pp_config_load_file(pp_stage_config_keys, pp_stage_config_n_keys, &sc, path);
    check_status(st);
    if (st == PP_OK) {
        check_strings(pp_stage_config_keys, pp_stage_config_n_keys, &sc);
        pp_error_clear();
        check_status(pp_stage_config_check(&sc));
    }
    struct pp_coordinator_config cc;
    pp_coordinator_config_defaults(&cc);
    pp_error_clear();
    st = pp_config_load_file(pp_coordinator_config_keys, pp_coordinator_config_n_keys, &cc, path);
    check_status(st);
    if (st == PP_OK) {
        check_strings(pp_coordinator_config_keys, pp_coordinator_config_n_keys, &cc);
        pp_error_clear();
        check_status(pp_coordinator_config_check(&cc));
    }
    close(fd);
    return 0;
}
