/* Small cJSON accessors with one-line errors naming the file and field. */
#ifndef SL_BASE_JSON_UTIL_H
#define SL_BASE_JSON_UTIL_H
#include <cjson/cJSON.h>

#include "suanli/base.h"

/* root[key] must be an integer >= min; errors name `path` and `key`. */
sl_status sl_json_int(const cJSON *root, const char *path, const char *key, int min, int *out);
/* 1 when v is a number holding a non-negative integer in [0, 2^53] (exact in a double, so it converts to
 * int64_t / size_t without undefined behaviour); a manifest's steps, offsets, lengths and sizes. */
int sl_json_is_count(const cJSON *v);
/* f as the shortest decimal that reads back as the same float, for writing config values (config.json held
 * 1e-05 and 0.1, the floats read from them are 9.99999974737875e-06 and 0.10000000149011612 as doubles) */
double sl_json_float_dec(float f);
/* Read and parse a JSON object file; *out owned by caller (cJSON_Delete). */
sl_status sl_json_read_object(const char *path, cJSON **out);
#endif
