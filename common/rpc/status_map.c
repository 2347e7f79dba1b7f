/* pp_status ⇄ gRPC status codes: the one place they are mapped. */
#include <grpc/status.h>

#include "common/rpc/rpc.h"

int pp_rpc_code_from_status(pp_status st)
{
    switch (st) {
    case PP_OK: return GRPC_STATUS_OK;
    case PP_ERR_INVALID_ARG: return GRPC_STATUS_INVALID_ARGUMENT;
    case PP_ERR_FORMAT: return GRPC_STATUS_INVALID_ARGUMENT;
    case PP_ERR_OUT_OF_RANGE: return GRPC_STATUS_OUT_OF_RANGE;
    case PP_ERR_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case PP_ERR_EXHAUSTED: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case PP_ERR_NOMEM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case PP_ERR_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
    case PP_ERR_IO: return GRPC_STATUS_UNAVAILABLE;
    case PP_ERR_INTERNAL: return GRPC_STATUS_INTERNAL;
    case PP_ERR_PRECONDITION: return GRPC_STATUS_FAILED_PRECONDITION;
    case PP_ERR_UNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
    case PP_ERR_TIMEOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case PP_ERR_CANCELLED: return GRPC_STATUS_CANCELLED;
    default: return GRPC_STATUS_UNKNOWN;
    }
}

pp_status pp_rpc_status_from_code(int code)
{
    switch (code) {
    case GRPC_STATUS_OK: return PP_OK;
    case GRPC_STATUS_INVALID_ARGUMENT: return PP_ERR_INVALID_ARG;
    case GRPC_STATUS_FAILED_PRECONDITION: return PP_ERR_PRECONDITION;
    case GRPC_STATUS_UNAVAILABLE: return PP_ERR_UNAVAILABLE;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return PP_ERR_TIMEOUT;
    case GRPC_STATUS_CANCELLED: return PP_ERR_CANCELLED;
    case GRPC_STATUS_OUT_OF_RANGE: return PP_ERR_OUT_OF_RANGE;
    case GRPC_STATUS_NOT_FOUND: return PP_ERR_NOT_FOUND;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return PP_ERR_EXHAUSTED;
    case GRPC_STATUS_UNIMPLEMENTED: return PP_ERR_UNSUPPORTED;
    case GRPC_STATUS_INTERNAL:
    case GRPC_STATUS_DATA_LOSS: return PP_ERR_INTERNAL;
    default: return PP_ERR_UNAVAILABLE; /* UNKNOWN, ABORTED, ...: blame the peer */
    }
}

const char *pp_rpc_code_name(int code)
{
    static const char *const names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    return code >= 0 && code <= 16 ? names[code] : "UNKNOWN";
}
