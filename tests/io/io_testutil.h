/* Small file helpers for the io tests. */
#ifndef SL_IO_TESTUTIL_H
#define SL_IO_TESTUTIL_H
#include <stddef.h>
#include <stdint.h>
int iot_write(const char *path, const void *data, size_t len); /* 0 on success */
char *iot_read(const char *path, size_t *len);                 /* malloc'd or NULL */
int iot_exists(const char *path);
int iot_contains(const char *hay, const char *needle);
int iot_count_lines(const char *s);
/* Number of entries in dir whose name contains `part` (NULL: all but . and ..). */
int iot_count_entries(const char *dir, const char *part);
/* Remove a tu_tmpdir() directory if no check failed so far. */
void iot_cleanup(const char *dir);
#define IOT_CORPUS SL_SOURCE_DIR "/data/tinyshakespeare.txt"
#endif
