/* safetensors reader (mmap, strict validation) and atomic writer.
 *
 * Note [Strict safetensors validation]
 *   A checkpoint or an imported HF model is untrusted input: every number in the header is checked before
 *   any pointer is formed. The header length must fit the file and SL_ST_MAX_HEADER; the header must be one
 *   JSON object (only spaces after it); each tensor needs a known dtype, an integer shape of at most 8 dims,
 *   and integer data_offsets [begin, end] with begin <= end <= data size; numel * dtype size must equal
 *   end - begin (checked without overflow); sorted by begin, the ranges must tile the data buffer exactly
 *   (no overlap, no hole, no trailing bytes), as the reference implementation requires. Names are unique.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "suanli/safetensors.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},  {"I32", 4},     {"I16", 2},     {"I8", 1},
    {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},   {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};
#define NDTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

static const char *const sl_dtype_st_names[] = {"F32", "BF16", "I32", "F16"};
_Static_assert(sizeof sl_dtype_st_names / sizeof sl_dtype_st_names[0] == SL_DTYPE_COUNT,
               "one safetensors name per sl_dtype");

static int dtype_index(const char *d) {
    if (!d) return -1;
    for (int i = 0; i < NDTYPES; i++)
        if (!strcmp(d, dtypes[i].name)) return i;
    return -1;
}

size_t sl_safetensors_dtype_size(const char *dtype) {
    int i = dtype_index(dtype);
    return i < 0 ? 0 : dtypes[i].size;
}
const char *sl_safetensors_dtype_name(sl_dtype dt) {
    return (unsigned)dt < SL_DTYPE_COUNT ? sl_dtype_st_names[dt] : NULL;
}
sl_dtype sl_safetensors_dtype_parse(const char *dtype) {
    for (int i = 0; i < SL_DTYPE_COUNT; i++)
        if (dtype && !strcmp(dtype, sl_dtype_st_names[i])) return (sl_dtype)i;
    return SL_DTYPE_COUNT;
}

/* numel * esize in bytes; returns 0 and sets *ovf on overflow. */
static uint64_t shape_bytes(const int64_t *shape, int ndim, size_t esize, int *ovf) {
    uint64_t n = esize;
    *ovf = 0;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d) {
            *ovf = 1;
            return 0;
        }
        n *= d;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------- */
/* writer                                                                                         */
static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

sl_status sl_safetensors_header(const char *path, const sl_st_tensor *ts, int n, const char *const *meta_kv,
                                size_t align, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (!path || n < 0 || (n > 0 && !ts) || align < 8 || (align & (align - 1)))
        return sl_fail(SL_ERR_INVALID, "safetensors: bad arguments");
    sl_status st = SL_OK;
    cJSON *root = NULL;
    char *hdr = NULL;
    const char **names = NULL;
    names = malloc(((size_t)n + 1) * sizeof *names);
    root = cJSON_CreateObject();
    if (!names || !root) {
        st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if (meta_kv && meta_kv[0]) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        if (!m) {
            st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (int i = 0; meta_kv[i]; i += 2) {
            if (!meta_kv[i + 1]) {
                st = sl_fail(SL_ERR_INVALID, "%s: metadata key '%s' has no value", path, meta_kv[i]);
                goto done;
            }
            if (cJSON_GetObjectItemCaseSensitive(m, meta_kv[i])) {
                st = sl_fail(SL_ERR_INVALID, "%s: duplicate metadata key '%s'", path, meta_kv[i]);
                goto done;
            }
            cJSON_AddStringToObject(m, meta_kv[i], meta_kv[i + 1]);
        }
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const sl_st_tensor *t = &ts[i];
        if (!t->name || !*t->name || !strcmp(t->name, "__metadata__")) {
            st = sl_fail(SL_ERR_INVALID, "%s: tensor %d has an empty or reserved name", path, i);
            goto done;
        }
        names[i] = t->name;
        int di = dtype_index(t->dtype);
        if (di < 0) {
            st = sl_fail(SL_ERR_INVALID, "%s: tensor '%s': unknown dtype '%s'", path, t->name,
                         t->dtype ? t->dtype : "(null)");
            goto done;
        }
        if (t->ndim < 0 || t->ndim > SL_ST_MAX_DIMS) {
            st = sl_fail(SL_ERR_INVALID, "%s: tensor '%s': ndim %d out of range [0, %d]", path, t->name,
                         t->ndim, SL_ST_MAX_DIMS);
            goto done;
        }
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0) {
                st = sl_fail(SL_ERR_INVALID, "%s: tensor '%s': negative dim %d", path, t->name, d);
                goto done;
            }
        int ovf;
        uint64_t want = shape_bytes(t->shape, t->ndim, dtypes[di].size, &ovf);
        if (ovf || want != t->nbytes) {
            st = sl_fail(SL_ERR_INVALID, "%s: tensor '%s': shape x %s needs %llu bytes but nbytes is %zu",
                         path, t->name, dtypes[di].name, (unsigned long long)want, t->nbytes);
            goto done;
        }
        if (t->nbytes && !t->data) {
            st = sl_fail(SL_ERR_INVALID, "%s: tensor '%s': NULL data", path, t->name);
            goto done;
        }
        cJSON *o = cJSON_AddObjectToObject(root, t->name);
        cJSON *sh = o ? cJSON_AddArrayToObject(o, "shape") : NULL;
        cJSON *of = o ? cJSON_AddArrayToObject(o, "data_offsets") : NULL;
        if (!o || !sh || !of || !cJSON_AddStringToObject(o, "dtype", dtypes[di].name)) {
            st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + t->nbytes)));
        off += t->nbytes;
    }
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 1; i < n; i++)
        if (!strcmp(names[i - 1], names[i])) {
            st = sl_fail(SL_ERR_INVALID, "%s: duplicate tensor name '%s'", path, names[i]);
            goto done;
        }
    if (off > ((uint64_t)1 << 53)) {
        st = sl_fail(SL_ERR_INVALID, "%s: data too large", path);
        goto done;
    }
    char *js = cJSON_PrintUnformatted(root);
    if (!js) {
        st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    size_t jl = strlen(js), hl = ((8 + jl + align - 1) & ~(align - 1)) - 8; /* data starts aligned */
    hdr = align > 64 ? sl_malloc_aligned_to(8 + hl, align) : sl_malloc_aligned(8 + hl);
    if (!hdr) {
        free(js);
        st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (int i = 0; i < 8; i++) hdr[i] = (char)((uint64_t)hl >> (8 * i));
    memcpy(hdr + 8, js, jl);
    memset(hdr + 8 + jl, ' ', hl - jl);
    free(js);
    *out = hdr;
    *out_len = 8 + hl;
    hdr = NULL;
done:
    sl_free_aligned(hdr);
    free(names);
    cJSON_Delete(root);
    return st;
}

sl_status sl_safetensors_write(const char *path, const sl_st_tensor *ts, int n, const char *const *meta_kv) {
    char *hdr = NULL, tmp[4200];
    size_t hlen = 0;
    int fd = -1;
    tmp[0] = 0;
    sl_status st = sl_safetensors_header(path, ts, n, meta_kv, 8, &hdr, &hlen);
    if (st != SL_OK) return st;
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        st = sl_fail(SL_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        tmp[0] = 0;
        goto done;
    }
    for (int i = -1; i < n; i++) {
        const char *p = i < 0 ? hdr : ts[i].data;
        size_t left = i < 0 ? hlen : ts[i].nbytes;
        while (left > 0) {
            ssize_t w = write(fd, p, left > ((size_t)1 << 30) ? (size_t)1 << 30 : left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                st = sl_fail(SL_ERR_IO, "%s: write failed: %s", path, strerror(errno));
                goto done;
            }
            p += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0) {
        st = sl_fail(SL_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
        goto done;
    }
    int rc = close(fd);
    fd = -1;
    if (rc != 0) {
        st = sl_fail(SL_ERR_IO, "%s: close failed: %s", path, strerror(errno));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        st = sl_fail(SL_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
        goto done;
    }
    tmp[0] = 0;
    {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = 0;
            sl_fsync_dir(dir[0] ? dir : "/");
        } else {
            sl_fsync_dir(".");
        }
    }
done:
    if (fd >= 0) close(fd);
    if (tmp[0]) unlink(tmp);
    sl_free_aligned(hdr);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* reader                                                                                         */
struct sl_safetensors {
    const uint8_t *map;
    size_t size;
    cJSON *root; /* names and metadata strings point into it */
    sl_st_tensor *t;
    int n;
    int *by_name; /* indices sorted by name */
    const char **mk, **mv;
    int nmeta;
};

void sl_safetensors_close(sl_safetensors *s) {
    if (!s) return;
    if (s->map) munmap((void *)s->map, s->size);
    cJSON_Delete(s->root);
    free(s->t);
    free(s->by_name);
    free(s->mk);
    free(s->mv);
    free(s);
}

/* A JSON number that is a non-negative integer <= 2^53. */
static int json_u53(const cJSON *j, uint64_t *v) {
    if (!cJSON_IsNumber(j)) return 0;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(uint64_t)d) return 0;
    *v = (uint64_t)d;
    return 1;
}

static int cmp_by_begin(const void *a, const void *b) {
    const sl_st_tensor *x = a, *y = b;
    if (x->data != y->data) return (const uint8_t *)x->data < (const uint8_t *)y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}
static int cmp_by_name(const void *a, const void *b, void *ctx) {
    const sl_safetensors *s = ctx;
    return strcmp(s->t[*(const int *)a].name, s->t[*(const int *)b].name);
}

/* the __metadata__ object: string values only, borrowed from the parsed header */
static sl_status parse_metadata(sl_safetensors *s, const char *path, const cJSON *e) {
    if (!cJSON_IsObject(e))
        return sl_fail(SL_ERR_FORMAT, "%s: __metadata__ must be one object of strings", path);
    int nm = cJSON_GetArraySize(e);
    s->mk = calloc((size_t)nm + 1, sizeof *s->mk);
    s->mv = calloc((size_t)nm + 1, sizeof *s->mv);
    if (!s->mk || !s->mv) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, e) {
        if (!cJSON_IsString(kv))
            return sl_fail(SL_ERR_FORMAT, "%s: __metadata__ value of '%s' is not a string", path, kv->string);
        s->mk[s->nmeta] = kv->string;
        s->mv[s->nmeta++] = kv->valuestring;
    }
    return SL_OK;
}

sl_status sl_safetensors_open(const char *path, sl_safetensors **out) {
    *out = NULL;
    sl_status st = SL_OK;
    sl_safetensors *s = calloc(1, sizeof *s);
    if (!s) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        st = sl_fail(SL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto done;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        st = sl_fail(SL_ERR_IO, "%s: not a regular file", path);
        goto done;
    }
    s->size = (size_t)sb.st_size;
    if (s->size < 8) {
        close(fd);
        st = sl_fail(SL_ERR_FORMAT, "%s: truncated: %zu bytes, less than the 8-byte header length", path,
                     s->size);
        goto done;
    }
    void *m = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        st = sl_fail(SL_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        goto done;
    }
    s->map = m;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)s->map[i] << (8 * i);
    if (hl > SL_ST_MAX_HEADER) {
        st = sl_fail(SL_ERR_FORMAT, "%s: header length %llu exceeds the limit of %llu bytes", path,
                     (unsigned long long)hl, (unsigned long long)SL_ST_MAX_HEADER);
        goto done;
    }
    if (hl > s->size - 8) {
        st = sl_fail(SL_ERR_FORMAT, "%s: header length %llu larger than the file (%zu bytes): truncated?",
                     path, (unsigned long long)hl, s->size);
        goto done;
    }
    if (hl < 2) {
        st = sl_fail(SL_ERR_FORMAT, "%s: header length %llu too small for a JSON object", path,
                     (unsigned long long)hl);
        goto done;
    }
    const char *hj = (const char *)s->map + 8, *end = NULL;
    s->root = cJSON_ParseWithLengthOpts(hj, (size_t)hl, &end, 0);
    if (!s->root || !cJSON_IsObject(s->root)) {
        st = sl_fail(SL_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    for (const char *p = end; p && p < hj + hl; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = sl_fail(SL_ERR_FORMAT, "%s: trailing bytes after the JSON header", path);
            goto done;
        }
    const uint8_t *data = s->map + 8 + hl;
    uint64_t dsize = s->size - 8 - hl;
    int cap = cJSON_GetArraySize(s->root);
    s->t = calloc((size_t)cap + 1, sizeof *s->t);
    s->by_name = calloc((size_t)cap + 1, sizeof *s->by_name);
    if (!s->t || !s->by_name) {
        st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    int seen_meta = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, s->root) {
        const char *name = e->string;
        if (!strcmp(name, "__metadata__")) {
            if (seen_meta++) {
                st = sl_fail(SL_ERR_FORMAT, "%s: __metadata__ must be one object of strings", path);
                goto done;
            }
            if ((st = parse_metadata(s, path, e)) != SL_OK) goto done;
            continue;
        }
        if (!cJSON_IsObject(e)) {
            st = sl_fail(SL_ERR_FORMAT, "%s: tensor '%s': entry is not an object", path, name);
            goto done;
        }
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(jd)) {
            st = sl_fail(SL_ERR_FORMAT, "%s: tensor '%s': missing dtype", path, name);
            goto done;
        }
        int di = dtype_index(jd->valuestring);
        if (di < 0) {
            st = sl_fail(SL_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", path, name, jd->valuestring);
            goto done;
        }
        int nd = cJSON_IsArray(js) ? cJSON_GetArraySize(js) : -1;
        if (nd < 0 || nd > SL_ST_MAX_DIMS) {
            st = sl_fail(SL_ERR_FORMAT, "%s: tensor '%s': shape must be an array of at most %d dims", path,
                         name, SL_ST_MAX_DIMS);
            goto done;
        }
        sl_st_tensor *t = &s->t[s->n];
        t->name = name;
        t->dtype = dtypes[di].name;
        t->ndim = nd;
        for (int d = 0; d < nd; d++) {
            uint64_t v;
            if (!json_u53(cJSON_GetArrayItem(js, d), &v)) {
                st = sl_fail(SL_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", path,
                             name, d);
                goto done;
            }
            t->shape[d] = (int64_t)v;
        }
        uint64_t b, en;
        if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !json_u53(cJSON_GetArrayItem(jo, 0), &b) ||
            !json_u53(cJSON_GetArrayItem(jo, 1), &en)) {
            st = sl_fail(SL_ERR_FORMAT, "%s: tensor '%s': data_offsets must be [begin, end] integers", path,
                         name);
            goto done;
        }
        if (b > en) {
            st = sl_fail(SL_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] out of order", path, name,
                         (unsigned long long)b, (unsigned long long)en);
            goto done;
        }
        if (en > dsize) {
            st = sl_fail(SL_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%llu, %llu] outside the data (%llu bytes)", path,
                         name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)dsize);
            goto done;
        }
        int ovf;
        uint64_t want = shape_bytes(t->shape, nd, dtypes[di].size, &ovf);
        if (ovf || want != en - b) {
            st = sl_fail(SL_ERR_FORMAT,
                         "%s: tensor '%s': shape x %s is %s%llu bytes but data_offsets span %llu", path, name,
                         t->dtype, ovf ? "over 2^64, not " : "", (unsigned long long)want,
                         (unsigned long long)(en - b));
            goto done;
        }
        t->data = data + b;
        t->nbytes = (size_t)(en - b);
        s->n++;
    }
    /* byte ranges must tile [0, dsize) */
    sl_st_tensor *sorted = s->t;
    qsort(sorted, (size_t)s->n, sizeof *sorted, cmp_by_begin);
    uint64_t pos = 0;
    for (int i = 0; i < s->n; i++) {
        uint64_t b = (uint64_t)((const uint8_t *)sorted[i].data - data);
        if (b < pos) {
            st = sl_fail(SL_ERR_FORMAT, "%s: tensor '%s' overlaps tensor '%s'", path, sorted[i].name,
                         sorted[i - 1].name);
            goto done;
        }
        if (b > pos) {
            st = sl_fail(SL_ERR_FORMAT, "%s: %llu-byte hole in the data before tensor '%s'", path,
                         (unsigned long long)(b - pos), sorted[i].name);
            goto done;
        }
        pos = b + sorted[i].nbytes;
    }
    if (pos != dsize) {
        st = sl_fail(SL_ERR_FORMAT, "%s: %llu trailing data bytes not covered by any tensor", path,
                     (unsigned long long)(dsize - pos));
        goto done;
    }
    for (int i = 0; i < s->n; i++) s->by_name[i] = i;
    qsort_r(s->by_name, (size_t)s->n, sizeof *s->by_name, cmp_by_name, s);
    for (int i = 1; i < s->n; i++)
        if (!strcmp(s->t[s->by_name[i]].name, s->t[s->by_name[i - 1]].name)) {
            st = sl_fail(SL_ERR_FORMAT, "%s: duplicate tensor name '%s'", path, s->t[s->by_name[i]].name);
            goto done;
        }
    for (int i = 0; i < s->nmeta; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(s->mk[i], s->mk[j])) {
                st = sl_fail(SL_ERR_FORMAT, "%s: duplicate metadata key '%s'", path, s->mk[i]);
                goto done;
            }
    *out = s;
    s = NULL;
done:
    sl_safetensors_close(s);
    return st;
}

int sl_safetensors_count(const sl_safetensors *s) { return s->n; }
const sl_st_tensor *sl_safetensors_get(const sl_safetensors *s, int i) {
    return i >= 0 && i < s->n ? &s->t[i] : NULL;
}
const sl_st_tensor *sl_safetensors_find(const sl_safetensors *s, const char *name) {
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, s->t[s->by_name[mid]].name);
        if (c == 0) return &s->t[s->by_name[mid]];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}
const char *sl_safetensors_meta(const sl_safetensors *s, const char *key) {
    for (int i = 0; i < s->nmeta; i++)
        if (!strcmp(s->mk[i], key)) return s->mv[i];
    return NULL;
}
int sl_safetensors_meta_count(const sl_safetensors *s) { return s->nmeta; }
int sl_safetensors_meta_get(const sl_safetensors *s, int i, const char **key, const char **value) {
    if (i < 0 || i >= s->nmeta) return 0;
    *key = s->mk[i];
    *value = s->mv[i];
    return 1;
}
