#include "base/json_util.h"

sl_status sl_json_int(const cJSON *root, const char *path, const char *key, int min, int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it) return sl_fail(SL_ERR_FORMAT, "%s: missing field '%s'", path, key);
    if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int)it->valuedouble || it->valuedouble < min)
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
