/* mmap of model files. */
#include "model/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

pp_status pp_mapped_file_open(const char *path, struct pp_mapped_file *out)
{
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pp_error(PP_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pp_error(PP_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return pp_error(PP_ERR_IO, "%s is not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return pp_error(PP_ERR_IO, "cannot mmap %s: %s", path, strerror(e));
        }
        out->data = p;
        out->size = st.st_size;
    }
    close(fd);
    return PP_OK;
}

void pp_mapped_file_close(struct pp_mapped_file *f)
{
    if (f && f->data)
        munmap((void *)f->data, (size_t)f->size);
    if (f) {
        f->data = NULL;
        f->size = 0;
    }
}
