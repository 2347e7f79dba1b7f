/* A read-only memory map of a whole file. Model weights are used in place from such maps. */
#ifndef PP_MAPPED_FILE_H
#define PP_MAPPED_FILE_H

#include <stdint.h>

#include "common/status.h"

struct pp_mapped_file {
    const uint8_t *data;
    int64_t size;
};

/* Maps path read-only; an empty file maps to data == NULL, size 0. On error the message names the
 * path and the system error. */
pp_status pp_mapped_file_open(const char *path, struct pp_mapped_file *out);
/* NULL-safe and safe on a zeroed struct. */
void pp_mapped_file_close(struct pp_mapped_file *f);

#endif
