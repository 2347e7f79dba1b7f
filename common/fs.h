/* Filesystem helpers. */
#ifndef PP_FS_H
#define PP_FS_H

#include "common/status.h"

/* mkdir -p: creates dir and its missing parents. The message names the part that failed. */
pp_status pp_mkdirs(const char *dir);

#endif
