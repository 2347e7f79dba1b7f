/* The `cpu_weights` setting (kernels/backend.h): its values, parsed and checked apart from the
 * backend, so that configuration code (and its fuzz target) needs none of the kernels. */
#include "kernels/backend.h"

#include <string.h>

pp_status pp_cpu_weights_parse(const char *text, int *map)
{
    if (text && strcmp(text, "copy") == 0)
        *map = 0;
    else if (text && strcmp(text, "map") == 0)
        *map = 1;
    else
        return pp_error(PP_ERR_INVALID_ARG, "expected copy (weights copied into huge-page memory) "
                        "or map (used in place from the model file), got '%s'", text ? text : "");
    return PP_OK;
}

pp_status pp_cpu_weights_check(const char *text)
{
    int map;
    return pp_cpu_weights_parse(text, &map);
}
