/* Sampling settings between the wire (ppserve.v1.Sampling, where every zero means "off") and the
 * sampler. Shared by the coordinator, which validates a request, and the last stage, which samples.
 */
#ifndef PP_WIRE_SAMPLING_H
#define PP_WIRE_SAMPLING_H

#include "common/status.h"
#include "model/sampler.h"
#include "ppserve/v1/client.pb-c.h"

/* Converts w (NULL = greedy) into s and validates it; the message names the field, what is allowed
 * and what arrived. */
pp_status pp_sampling_from_wire(const Ppserve__V1__Sampling *w, struct pp_sampling *s);

#endif
