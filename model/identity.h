/* A model's identity: a fingerprint of everything that decides its outputs, so that every stage
 * and every hop of a pipeline can check they serve the same model (the handshake compares it). It
 * covers the format, the hyper-parameters, every tensor's name, dtype and shape, and 4 windows of
 * 64 bytes of every tensor's data (start, one third, two thirds, end), combined so that tensor
 * order and sharding do not matter. It reads a few hundred KiB, not the whole model, so it is cheap
 * at start-up; it tells models apart, it does not verify their integrity. */
#ifndef PP_IDENTITY_H
#define PP_IDENTITY_H

#include <stddef.h>

#include "common/status.h"

#define PP_MODEL_ID_LEN 40 /* "ppid1-" + 32 hex digits + NUL fits */

/* Writes "ppid1-<32 hex digits>" for the model at path (a .gguf file or an HF folder). */
pp_status pp_model_identity(const char *path, char out[PP_MODEL_ID_LEN]);

#endif
