/* Clocks. */
#include "common/clock.h"

#include <time.h>

static double read_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double pp_clock_mono(void)
{
    return read_clock(CLOCK_MONOTONIC);
}

double pp_clock_real(void)
{
    return read_clock(CLOCK_REALTIME);
}
