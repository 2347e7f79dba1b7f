/* Waiting in the stage: sleeps, and condition variables timed on the monotonic clock (common/clock
 * gives the clocks themselves). */
#include <errno.h>
#include <time.h>

#include "stage/stage.h"

void pp_stage_sleep_us(long us)
{
    struct timespec ts = {us / 1000000L, (us % 1000000L) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void pp_stage_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

int pp_stage_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline)
{
    double now = pp_clock_mono();
    if (now >= deadline)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double wait = deadline - now;
    long long ns = (long long)ts.tv_nsec + (long long)((wait - (double)(long long)wait) * 1e9);
    ts.tv_sec += (time_t)wait + (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    return pthread_cond_timedwait(cv, mu, &ts) == 0;
}
