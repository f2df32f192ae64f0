/* suanli/safetensors.h — read and write the HF safetensors format.
 *
 * Usage:
 *   float w[6] = {...};
 *   sl_st_tensor t = {.name = "wte", .dtype = "F32", .ndim = 2, .shape = {2, 3}, .data = w, .nbytes = sizeof
 * w}; const char *meta[] = {"format", "pt", "step", "100", NULL};
 *   SL_TRY(sl_safetensors_write("model.safetensors", &t, 1, meta));
 *
 *   sl_safetensors *st;
 *   SL_TRY(sl_safetensors_open("model.safetensors", &st));
 *   const sl_st_tensor *x = sl_safetensors_find(st, "wte");   // borrowed; valid until _close
 *   if (x && !strcmp(x->dtype, "F32")) memcpy(dst, x->data, x->nbytes);
 *   const char *step = sl_safetensors_meta(st, "step");        // borrowed or NULL
 *   sl_safetensors_close(st);
 *
 * Format: u64 little-endian header length N, then N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {"k":
 * "v"}} (padded with spaces so the data starts 8-byte aligned), then the data buffer; offsets are relative to
 * the start of the data buffer. The reader is strict like the reference implementation: header length
 * within the file and <= 100 MB, a JSON object, known dtypes, integer shapes with numel*size == end-begin,
 * byte ranges in order, non-overlapping, without holes, and covering the data buffer exactly; duplicate
 * names rejected. The data buffer starts 8-byte aligned in the file (header padded); tensors follow
 * one another in the order given to the writer, so a tensor's data pointer is aligned only as far as the
 * sizes of the tensors before it allow: copy with memcpy when in doubt.
 */
#ifndef SUANLI_SAFETENSORS_H
#define SUANLI_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "suanli/base.h"
#include "suanli/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SL_ST_MAX_DIMS 8
#define SL_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef struct sl_st_tensor {
    const char *name;
    const char *dtype; /* "F64","F32","F16","BF16","I64","I32","I16","I8","U64","U32","U16","U8","BOOL",
                          "F8_E4M3","F8_E5M2" */
    int ndim;          /* 0 (scalar) .. SL_ST_MAX_DIMS */
    int64_t shape[SL_ST_MAX_DIMS];
    const void *data;
    size_t nbytes; /* must equal numel * dtype size */
} sl_st_tensor;

/* Size in bytes of one element of a safetensors dtype string, 0 if unknown. */
size_t sl_safetensors_dtype_size(const char *dtype);
/* safetensors dtype string of an sl_dtype ("F32", "BF16", "I32"); NULL if none. */
const char *sl_safetensors_dtype_name(sl_dtype dt);
/* sl_dtype of a dtype string; returns SL_DTYPE_COUNT if it has no sl_dtype. */
sl_dtype sl_safetensors_dtype_parse(const char *dtype);

/* Write n tensors (data laid out in the given order) and optional metadata meta_kv = {key, value, ...,
 * NULL} (or meta_kv == NULL). Atomic: written to path.tmp.PID, fsynced, renamed. Validates names (unique,
 * non-empty, not "__metadata__"), dtypes, shapes vs nbytes. */
sl_status sl_safetensors_write(const char *path, const sl_st_tensor *tensors, int n,
                               const char *const *meta_kv);

/* The file's first bytes for these tensors (length field, JSON header, space padding) without writing:
 * *out (owned, free with sl_free_aligned) holds *out_len bytes, a multiple of align (a power of two >= 8),
 * so the data that follows starts align-aligned in the file (the checkpoint writer's O_DIRECT path uses
 * 4096). Same validation as sl_safetensors_write; path only names the file in messages. */
sl_status sl_safetensors_header(const char *path, const sl_st_tensor *tensors, int n,
                                const char *const *meta_kv, size_t align, char **out, size_t *out_len);

typedef struct sl_safetensors sl_safetensors;
/* mmap and validate (see above). *out owned: sl_safetensors_close. Errors name the file and the problem. */
sl_status sl_safetensors_open(const char *path, sl_safetensors **out);
int sl_safetensors_count(const sl_safetensors *st);
/* Tensors in order of their data offsets. Borrowed; valid until close. NULL if i out of range. */
const sl_st_tensor *sl_safetensors_get(const sl_safetensors *st, int i);
const sl_st_tensor *sl_safetensors_find(const sl_safetensors *st, const char *name); /* NULL if absent */
const char *sl_safetensors_meta(const sl_safetensors *st, const char *key);          /* NULL if absent */
int sl_safetensors_meta_count(const sl_safetensors *st);
/* i-th metadata pair; returns 0 if i out of range. Borrowed strings. */
int sl_safetensors_meta_get(const sl_safetensors *st, int i, const char **key, const char **value);
void sl_safetensors_close(sl_safetensors *st);

#ifdef __cplusplus
}
#endif
#endif
