/* Resolving a model name inside a model root. */
#define _DEFAULT_SOURCE
#include "pipeline/model_path.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pp_status pp_model_path_resolve(const char *root, const char *name, char out[PATH_MAX])
{
    if (!name || !name[0])
        return pp_error(PP_ERR_INVALID_ARG, "model: expected a name under the model root %s, got "
                        "an empty one", root);
    if (name[0] == '/')
        return pp_error(PP_ERR_INVALID_ARG, "model '%s': expected a name relative to the model "
                        "root %s, got an absolute path", name, root);
    char root_real[PATH_MAX], joined[2 * PATH_MAX + 2];
    if (!realpath(root, root_real))
        return pp_error(PP_ERR_NOT_FOUND, "model root %s: %s", root, strerror(errno));
    snprintf(joined, sizeof(joined), "%s/%s", root_real, name);
    if (!realpath(joined, out)) {
        int e = errno;
        return pp_error(e == ENOENT || e == ENOTDIR ? PP_ERR_NOT_FOUND : PP_ERR_IO,
                        "model '%s' not found under the model root %s (%s)", name, root,
                        strerror(e));
    }
    size_t n = strlen(root_real);
    int inside = n == 1 ? out[1] != '\0' /* root "/" */
                        : strncmp(out, root_real, n) == 0 && out[n] == '/' && out[n + 1] != '\0';
    if (!inside)
        return pp_error(PP_ERR_INVALID_ARG, "model '%s' resolves to %s, which is not inside the "
                        "model root %s", name, out, root_real);
    return PP_OK;
}

