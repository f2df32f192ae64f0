/* Small cJSON accessors with one-line errors naming the file and field. */
#ifndef SL_BASE_JSON_UTIL_H
#define SL_BASE_JSON_UTIL_H
#include <cjson/cJSON.h>

#include "suanli/base.h"

/* root[key] must be an integer >= min; errors name `path` and `key`. */
sl_status sl_json_int(const cJSON *root, const char *path, const char *key, int min, int *out);
/* Read and parse a JSON object file; *out owned by caller (cJSON_Delete). */
sl_status sl_json_read_object(const char *path, cJSON **out);
#endif
