/* Where a model named by the coordinator lives: a name relative to a model root, resolved with
 * realpath so that neither "..", an absolute name nor a symbolic link can leave the root. Shared
 * by the coordinator (its own copy) and the stages (theirs). */
#ifndef PP_MODEL_PATH_H
#define PP_MODEL_PATH_H

#include <limits.h>

#include "common/status.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* Writes the resolved path of name under root to out. PP_ERR_INVALID_ARG for an empty or absolute
 * name or one that resolves outside the root, PP_ERR_NOT_FOUND when it (or the root) does not
 * exist; the message names the name and the root. */
pp_status pp_model_path_resolve(const char *root, const char *name, char out[PATH_MAX]);

#endif
