/* A fast 128-bit non-cryptographic hash (two independent 64-bit lanes of a multiply-xorshift
 * mixer) for identities and fingerprints: it tells different inputs apart with overwhelming
 * probability, but gives no protection against an adversary crafting collisions. */
#ifndef PP_HASH_H
#define PP_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct pp_hash {
    uint64_t a;
    uint64_t b;
    uint64_t n; /* bytes absorbed */
};

static inline uint64_t pp__hash_mix(uint64_t x)
{
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return x;
}

static inline void pp_hash_init(struct pp_hash *h, uint64_t seed)
{
    h->a = pp__hash_mix(seed ^ 0x243f6a8885a308d3ull);
    h->b = pp__hash_mix(seed ^ 0x13198a2e03707344ull);
    h->n = 0;
}

static inline void pp_hash_word(struct pp_hash *h, uint64_t w)
{
    h->a = pp__hash_mix(h->a ^ (w * 0x9e3779b97f4a7c15ull));
    h->b = pp__hash_mix(h->b + (w ^ 0xa4093822299f31d0ull) * 0xc2b2ae3d27d4eb4full);
}

static inline void pp_hash_bytes(struct pp_hash *h, const void *p, size_t n)
{
    const unsigned char *s = p;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        pp_hash_word(h, w);
        s += 8;
        n -= 8;
        h->n += 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    pp_hash_word(h, w ^ ((uint64_t)n << 56)); /* the tail's length keeps "a" and "a\0" apart */
    h->n += n;
}

/* Finalises into two 64-bit words (h is left unusable). */
static inline void pp_hash_final(struct pp_hash *h, uint64_t out[2])
{
    pp_hash_word(h, h->n);
    out[0] = pp__hash_mix(h->a ^ h->b);
    out[1] = pp__hash_mix(h->b + out[0]);
}

#endif
