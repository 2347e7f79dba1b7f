/* grpc.health.v1.Health for a daemon: a serving status per service name ("" = the whole server),
 * answered by Check. Thread-safe: the daemon flips statuses (e.g. NOT_SERVING while draining) while
 * completion-queue threads answer. */
#ifndef PP_RPC_HEALTH_H
#define PP_RPC_HEALTH_H

#include "common/rpc/rpc.h"

enum pp_health_status {
    PP_HEALTH_UNKNOWN = 0,
    PP_HEALTH_SERVING = 1,
    PP_HEALTH_NOT_SERVING = 2,
};

struct pp_rpc_health;

/* Registers Check on s (before pp_rpc_server_start). The whole server ("") starts NOT_SERVING. */
pp_status pp_rpc_health_add(struct pp_rpc_server *s, struct pp_rpc_health **out);
void pp_rpc_health_free(struct pp_rpc_health *h);
/* Sets a service's status; a name never set answers NOT_FOUND. */
pp_status pp_rpc_health_set(struct pp_rpc_health *h, const char *service,
                            enum pp_health_status status);

#endif
