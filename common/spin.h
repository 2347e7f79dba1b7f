/* Spin-then-sleep waits for hand-offs that usually take microseconds (thread-pool jobs, the
 * collectives of a stage's workers): a waiter spins with the CPU's pause hint until a budget of
 * time has passed, then sleeps on its condition variable. Every 256 spins it also yields the CPU:
 * when the scheduler has put the thread it waits for on the same CPU (seen on a 2-vCPU host,
 * where a pool's worker stayed beside its caller), that thread runs at once instead of after the
 * whole budget (a 20 µs matmul took 0.25 ms that way). Header-only: the loops are hot. */
#ifndef PP_SPIN_H
#define PP_SPIN_H

#include <sched.h>
#include <stdint.h>
#include <time.h>

#define PP_SPIN_NS 200000 /* how long a waiter spins before it sleeps */

static inline void pp_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* One wait's spin budget: zero it, then call pp_spin_expired once per spin. */
struct pp_spin {
    uint32_t spins;
    int64_t deadline_ns;
};

/* Pauses once; returns 1 when the budget is spent (every 256 spins the thread yields and the clock
 * is read). */
static inline int pp_spin_expired(struct pp_spin *s)
{
    pp_cpu_relax();
    if ((++s->spins & 255) != 0)
        return 0;
    sched_yield();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    if (s->deadline_ns == 0) {
        s->deadline_ns = t + PP_SPIN_NS;
        return 0;
    }
    return t > s->deadline_ns;
}

#endif
