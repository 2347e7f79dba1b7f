/* Atomic output files for the synth writers: everything goes to "<path>.tmp.<pid>", which is
 * renamed over path only after every write, the flush and the close succeeded, so a failed or
 * interrupted write never leaves a truncated model where a loader would find it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/synth-impl.h"

#define OUT_BUFFER (1 << 20)

static pp_status io_error(const struct pp__out_file *o, const char *what, int err)
{
    return pp_error(PP_ERR_IO, "%s: %s failed: %s", o->path, what, strerror(err));
}

pp_status pp__out_open(struct pp__out_file *o, const char *path)
{
    memset(o, 0, sizeof(*o));
    if (strlen(path) >= sizeof(o->path))
        return pp_error(PP_ERR_INVALID_ARG, "output path too long (%zu bytes, limit %zu)",
                        strlen(path), sizeof(o->path) - 1);
    strcpy(o->path, path);
    snprintf(o->tmp, sizeof(o->tmp), "%s.tmp.%ld", path, (long)getpid());
    o->f = fopen(o->tmp, "wb");
    if (!o->f)
        return pp_error(PP_ERR_IO, "%s: cannot create %s: %s", path, o->tmp, strerror(errno));
    setvbuf(o->f, NULL, _IOFBF, OUT_BUFFER);
    return PP_OK;
}

pp_status pp__out_write(struct pp__out_file *o, const void *data, uint64_t n)
{
    if (n && fwrite(data, 1, (size_t)n, o->f) != (size_t)n)
        return io_error(o, "write", errno ? errno : EIO);
    o->pos += n;
    return PP_OK;
}

pp_status pp__out_pad(struct pp__out_file *o, uint64_t align, char fill)
{
    char pad[64];
    memset(pad, fill, sizeof(pad));
    uint64_t n = (align - o->pos % align) % align;
    while (n) {
        uint64_t k = n < sizeof(pad) ? n : sizeof(pad);
        pp_status st = pp__out_write(o, pad, k);
        if (st)
            return st;
        n -= k;
    }
    return PP_OK;
}

pp_status pp__out_commit(struct pp__out_file *o)
{
    FILE *f = o->f;
    o->f = NULL;
    int err = 0;
    if (fflush(f) != 0)
        err = errno;
    if (fclose(f) != 0 && !err)
        err = errno;
    if (err) {
        unlink(o->tmp);
        return io_error(o, "write", err);
    }
    if (rename(o->tmp, o->path) != 0) {
        err = errno;
        unlink(o->tmp);
        return pp_error(PP_ERR_IO, "%s: rename from %s failed: %s", o->path, o->tmp, strerror(err));
    }
    o->tmp[0] = '\0';
    return PP_OK;
}

void pp__out_abort(struct pp__out_file *o)
{
    if (o->f) {
        fclose(o->f);
        o->f = NULL;
    }
    if (o->tmp[0]) {
        unlink(o->tmp);
        o->tmp[0] = '\0';
    }
}

pp_status pp__out_write_file(const char *path, const void *data, uint64_t n)
{
    struct pp__out_file o;
    pp_status st = pp__out_open(&o, path);
    if (!st)
        st = pp__out_write(&o, data, n);
    if (!st)
        st = pp__out_commit(&o);
    pp__out_abort(&o);
    return st;
}
