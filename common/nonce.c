/* Random numbers that tell processes apart. */
#include "common/nonce.h"

#include <sys/random.h>
#include <unistd.h>

#include "common/clock.h"

uint64_t pp_nonce64(void)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
        r = ((uint64_t)getpid() << 32) ^ (uint64_t)(pp_clock_real() * 1e9);
    return r ? r : 1;
}
