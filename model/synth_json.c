/* JSON value helpers for the model writers' in-memory buffers (GGUF metadata, safetensors headers,
 * the HF side files). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json_write.h"
#include "model/synth-impl.h"

void pp__synth_json_cstr(struct pp_buf *b, const char *s)
{
    pp_buf_json_string(b, s, strlen(s));
}

void pp__synth_json_float(struct pp_buf *b, float v)
{
    char s[48];
    if (v > -1e15f && v < 1e15f && v == (float)(int64_t)v) {
        /* integral: "500000.0" rather than "5e+05", so readers see a float */
        snprintf(s, sizeof(s), "%.1f", (double)v);
    } else {
        /* the shortest decimal that reads back as v (the C locale's '.' is assumed) */
        for (int prec = 1; prec <= 9; prec++) {
            snprintf(s, sizeof(s), "%.*g", prec, (double)v);
            if (strtof(s, NULL) == v)
                break;
        }
    }
    pp_buf_puts(b, s);
}

