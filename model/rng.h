/* Counter-based random numbers: a value is a pure function of (seed, counter), so a sequence's step
 * draws the same number wherever and whenever it runs (another stage, a retry, a failover). */
#ifndef PP_RNG_H
#define PP_RNG_H

#include <stdint.h>

/* 64 well-mixed bits for (seed, counter). */
static inline uint64_t pp_rng_bits(uint64_t seed, uint64_t counter)
{
    /* two rounds of the splitmix64 finaliser over a keyed counter */
    uint64_t z = seed * 0x9e3779b97f4a7c15ull ^ (counter + 0x632be59bd9b4e019ull);
    for (int r = 0; r < 2; r++) {
        z += 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
    }
    return z;
}

/* Uniform double in [0, 1) with 53 random bits. */
static inline double pp_rng_uniform(uint64_t seed, uint64_t counter)
{
    return (double)(pp_rng_bits(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
