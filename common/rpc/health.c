/* The health service. */
#include <stdio.h>
#include "common/rpc/health.h"

#include <pthread.h>
#include <string.h>

#include "common/alloc.h"
#include "grpc/health/v1/health.pb-c.h"

#define MAX_SERVICES 16

struct pp_rpc_health {
    pthread_mutex_t mu;
    int n;
    char names[MAX_SERVICES][64];
    enum pp_health_status status[MAX_SERVICES];
};

static pp_status check(void *ud, const ProtobufCMessage *req, struct pp_buf *resp)
{
    struct pp_rpc_health *h = ud;
    const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
    const char *name = r->service ? r->service : "";
    int found = -1;
    enum pp_health_status st = PP_HEALTH_UNKNOWN;
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < h->n && found < 0; i++)
        if (strcmp(h->names[i], name) == 0) {
            found = i;
            st = h->status[i];
        }
    pthread_mutex_unlock(&h->mu);
    if (found < 0)
        return pp_error(PP_ERR_NOT_FOUND, "unknown service \"%s\"", name);
    Grpc__Health__V1__HealthCheckResponse out = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    out.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)st;
    return pp_rpc_pack(&out.base, resp);
}

pp_status pp_rpc_health_add(struct pp_rpc_server *s, struct pp_rpc_health **out)
{
    struct pp_rpc_health *h = pp_calloc(PP_MEM_RPC, 1, sizeof(*h));
    if (!h)
        return PP_ERR_NOMEM;
    pthread_mutex_init(&h->mu, NULL);
    h->n = 1; /* "" = the whole server */
    h->status[0] = PP_HEALTH_NOT_SERVING;
    pp_status st = pp_rpc_server_add_unary(s, "/grpc.health.v1.Health/Check",
                                           &grpc__health__v1__health_check_request__descriptor,
                                           check, h);
    if (st != PP_OK) {
        pp_rpc_health_free(h);
        return st;
    }
    *out = h;
    return PP_OK;
}

void pp_rpc_health_free(struct pp_rpc_health *h)
{
    if (!h)
        return;
    pthread_mutex_destroy(&h->mu);
    pp_free(PP_MEM_RPC, h);
}

pp_status pp_rpc_health_set(struct pp_rpc_health *h, const char *service,
                            enum pp_health_status status)
{
    if (strlen(service) >= sizeof(h->names[0]))
        return pp_error(PP_ERR_INVALID_ARG, "health: service name too long");
    pthread_mutex_lock(&h->mu);
    int i = 0;
    while (i < h->n && strcmp(h->names[i], service) != 0)
        i++;
    if (i == h->n) {
        if (h->n == MAX_SERVICES) {
            pthread_mutex_unlock(&h->mu);
            return pp_error(PP_ERR_EXHAUSTED, "health: more than %d services", MAX_SERVICES);
        }
        snprintf(h->names[h->n++], sizeof(h->names[0]), "%s", service);
    }
    h->status[i] = status;
    pthread_mutex_unlock(&h->mu);
    return PP_OK;
}
