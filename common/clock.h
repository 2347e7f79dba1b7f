/* Clocks: monotonic seconds for durations and deadlines, realtime seconds for timestamps that
 * travel between processes and hosts (the pipeline's spans). */
#ifndef PP_CLOCK_H
#define PP_CLOCK_H

double pp_clock_mono(void);
double pp_clock_real(void);

#endif
