/* Random numbers that tell processes apart (a coordinator's stage ids, a stage's instance): from
 * the kernel's random source, or where that fails from the pid and the clock. Not for secrets. */
#ifndef PP_NONCE_H
#define PP_NONCE_H

#include <stdint.h>

/* A random 64-bit number, never 0. */
uint64_t pp_nonce64(void);

#endif
