#include "base/json_util.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

sl_status sl_json_int(const cJSON *root, const char *path, const char *key, int min, int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it) return sl_fail(SL_ERR_FORMAT, "%s: missing field '%s'", path, key);
    double v = cJSON_IsNumber(it) ? it->valuedouble : NAN; /* range first: (int)1e300 is undefined */
    if (!(v >= min && v <= INT_MAX) || v != floor(v))
        return sl_fail(SL_ERR_FORMAT, "%s: field '%s' must be an integer >= %d", path, key, min);
    *out = (int)it->valuedouble;
    return SL_OK;
}

sl_status sl_json_read_object(const char *path, cJSON **out) {
    char *text;
    size_t len;
    *out = NULL;
    SL_TRY(sl_file_read_all(path, &text, &len));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sl_fail(SL_ERR_FORMAT, "%s: not a JSON object", path);
    }
    *out = root;
    return SL_OK;
}

int sl_json_is_count(const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 9007199254740992.0 &&
           v->valuedouble == floor(v->valuedouble);
}

double sl_json_float_dec(float f) {
    char b[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)f);
        if ((float)strtod(b, NULL) == f) return strtod(b, NULL);
    }
    return f;
}
