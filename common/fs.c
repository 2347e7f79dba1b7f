/* Filesystem helpers. */
#include "common/fs.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

pp_status pp_mkdirs(const char *dir)
{
    char p[PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof(p))
        return pp_error(PP_ERR_INVALID_ARG, "bad directory path \"%s\"", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        struct stat sb;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return pp_error(PP_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return pp_error(PP_ERR_IO, "%s: exists and is not a directory", p);
        p[i] = c;
    }
    return PP_OK;
}
