/* Clocks of the stage: realtime seconds for the spans that travel on the wire (comparable across
 * hosts), monotonic seconds for durations and deadlines. */
#include <errno.h>
#include <time.h>

#include "stage/stage.h"

double pp_stage_now_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double pp_stage_now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
    double now = pp_stage_now_mono();
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
