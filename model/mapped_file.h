/* A read-only memory map of a whole file. Model weights are bound in place in such maps (and
 * copied out by backends that want them in their own memory). */
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

/* When [p, p + bytes) lies inside a file this process mapped with pp_mapped_file_open, drops the
 * process's mapping of the whole pages within it (madvise MADV_DONTNEED: the pages stay in the
 * page cache, reclaimable, and are read back in if touched again) and returns 1; otherwise does
 * nothing and returns 0 (never touching other memory). For tensors a backend has copied out: the
 * file's pages then no longer count in the process's resident size beside the copy. */
int pp_mapped_file_drop_pages(const void *p, int64_t bytes);

#endif
