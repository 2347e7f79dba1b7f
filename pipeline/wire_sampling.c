/* Sampling settings from the wire. */
#include "pipeline/wire_sampling.h"

pp_status pp_sampling_from_wire(const Ppserve__V1__Sampling *w, struct pp_sampling *s)
{
    pp_sampling_defaults(s);
    if (!w)
        return PP_OK;
    s->temperature = w->temperature;
    s->top_k = w->top_k;
    s->top_p = w->top_p == 0.0f ? 1.0f : w->top_p;
    s->min_p = w->min_p;
    s->repeat_penalty = w->repeat_penalty == 0.0f ? 1.0f : w->repeat_penalty;
    s->seed = w->seed;
    return pp_sampling_validate(s);
}
