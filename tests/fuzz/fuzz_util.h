/* Fuzz harness helper: the loaders take paths, so each input is written to an anonymous in-memory
 * file and opened through /proc/self/fd. */
#ifndef PP_FUZZ_UTIL_H
#define PP_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data to a memfd; fills path; returns the fd (close it after use) or -1. */
static int pp_fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t cap)
{
    int fd = memfd_create("pp-fuzz", 0);
    if (fd < 0)
        return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        if (n <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)n;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
