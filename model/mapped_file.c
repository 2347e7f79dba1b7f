/* mmap of model files, and a registry of the live maps so that pages of one can be dropped
 * safely (madvise on memory that is not a file map would discard data). */
#include "model/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"

struct live_map {
    const uint8_t *data;
    int64_t size;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pp_buf g_maps; /* struct live_map records */

static struct live_map *maps(int *n)
{
    *n = (int)(g_maps.len / sizeof(struct live_map));
    return (struct live_map *)g_maps.data;
}

static int register_map(const uint8_t *data, int64_t size)
{
    struct live_map m = {data, size};
    pthread_mutex_lock(&g_mu);
    pp_buf_put(&g_maps, &m, sizeof(m));
    int failed = g_maps.failed;
    g_maps.failed = 0; /* a failed append leaves the records as they were: the next may succeed */
    pthread_mutex_unlock(&g_mu);
    return failed ? -1 : 0;
}

static void unregister_map(const uint8_t *data)
{
    pthread_mutex_lock(&g_mu);
    int n;
    struct live_map *m = maps(&n);
    for (int i = 0; i < n; i++)
        if (m[i].data == data) {
            m[i] = m[n - 1];
            g_maps.len -= sizeof(*m);
            break;
        }
    if (g_maps.len == 0)
        pp_buf_free(&g_maps);
    pthread_mutex_unlock(&g_mu);
}

int pp_mapped_file_drop_pages(const void *p, int64_t bytes)
{
    const uint8_t *b = p;
    if (!b || bytes <= 0)
        return 0;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)b + page - 1) & ~(page - 1);
    uintptr_t hi = ((uintptr_t)b + (uintptr_t)bytes) & ~(page - 1);
    int dropped = 0, n;
    pthread_mutex_lock(&g_mu); /* held across madvise: the map cannot be closed meanwhile */
    const struct live_map *m = maps(&n);
    for (int i = 0; i < n && !dropped; i++) {
        const uint8_t *d = m[i].data;
        if (b >= d && b + bytes <= d + m[i].size) {
            if (hi > lo)
                dropped = madvise((void *)lo, hi - lo, MADV_DONTNEED) == 0;
            else
                dropped = 1; /* inside a map, but no whole page to drop */
        }
    }
    pthread_mutex_unlock(&g_mu);
    return dropped;
}

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
        if (register_map(p, st.st_size) != 0) {
            munmap(p, (size_t)st.st_size);
            close(fd);
            return pp_error(PP_ERR_NOMEM, "cannot map %s: no memory to record the map", path);
        }
        out->data = p;
        out->size = st.st_size;
    }
    close(fd);
    return PP_OK;
}

void pp_mapped_file_close(struct pp_mapped_file *f)
{
    if (f && f->data) {
        unregister_map(f->data);
        munmap((void *)f->data, (size_t)f->size);
    }
    if (f) {
        f->data = NULL;
        f->size = 0;
    }
}
