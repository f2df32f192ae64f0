/* Token shards: a 64-byte little-endian header followed by the tokens (2 or 4 bytes each).
 *
 * Note [Shard header]
 *   off  size  field
 *     0     8  magic "SLTOKSH1"
 *     8     4  version (1)
 *    12     4  header_bytes (64)
 *    16     4  token_bytes (2 if vocab_size <= 65536, else 4)
 *    20     4  vocab_size
 *    24     8  num_tokens
 *    32     8  XXH3-64 of the payload (seed 0)
 *    40    24  reserved, zero
 *   The file size must be exactly 64 + num_tokens * token_bytes. Readers check every field, the checksum and
 *   that every token is < vocab_size, so a truncated, foreign or corrupted file is one clear error, never a
 *   wrong token fed to the model.
 */
#define _GNU_SOURCE
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_internal.h"

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32); }

sl_status sl__shard_encode(const char *what, const int32_t *tokens, int64_t n, int vocab_size, void **buf,
                           size_t *len) {
    *buf = NULL;
    *len = 0;
    if (n < 0 || (n > 0 && !tokens)) return sl_fail(SL_ERR_INVALID, "%s: bad token array", what);
    if (vocab_size < 1) return sl_fail(SL_ERR_INVALID, "%s: vocab_size %d must be >= 1", what, vocab_size);
    uint32_t width = vocab_size <= 65536 ? 2 : 4;
    size_t total = SL_SHARD_HEADER_BYTES + (size_t)n * width;
    uint8_t *b = calloc(1, total);
    if (!b) return sl_fail(SL_ERR_NOMEM, "%s: out of memory (%zu bytes)", what, total);
    uint8_t *pay = b + SL_SHARD_HEADER_BYTES;
    for (int64_t i = 0; i < n; i++) {
        int32_t t = tokens[i];
        if (t < 0 || t >= vocab_size) {
            free(b);
            return sl_fail(SL_ERR_INVALID, "%s: token %d at index %lld outside vocab [0, %d)", what, t,
                           (long long)i, vocab_size);
        }
        uint8_t *q = pay + (size_t)i * width;
        q[0] = (uint8_t)t;
        q[1] = (uint8_t)(t >> 8);
        if (width == 4) {
            q[2] = (uint8_t)(t >> 16);
            q[3] = (uint8_t)(t >> 24);
        }
    }
    memcpy(b, SL_SHARD_MAGIC, 8);
    put32(b + 8, SL_SHARD_VERSION);
    put32(b + 12, SL_SHARD_HEADER_BYTES);
    put32(b + 16, width);
    put32(b + 20, (uint32_t)vocab_size);
    put64(b + 24, (uint64_t)n);
    put64(b + 32, XXH3_64bits(pay, (size_t)n * width));
    *buf = b;
    *len = total;
    return SL_OK;
}

sl_status sl__shard_validate(const char *path, const uint8_t *p, size_t fsize, sl_shard_header *hdr) {
    if (fsize < SL_SHARD_HEADER_BYTES)
        return sl_fail(SL_ERR_FORMAT, "%s: truncated header (%zu bytes, need %d)", path, fsize,
                       SL_SHARD_HEADER_BYTES);
    if (memcmp(p, SL_SHARD_MAGIC, 8) != 0)
        return sl_fail(SL_ERR_FORMAT, "%s: bad magic (not a suanli token shard; expected \"%s\")", path,
                       SL_SHARD_MAGIC);
    sl_shard_header h = {get32(p + 8),  get32(p + 12), get32(p + 16),
                         get32(p + 20), get64(p + 24), get64(p + 32)};
    if (h.version != SL_SHARD_VERSION)
        return sl_fail(SL_ERR_FORMAT, "%s: unsupported version %u (this build reads version %d)", path,
                       h.version, SL_SHARD_VERSION);
    if (h.header_bytes != SL_SHARD_HEADER_BYTES)
        return sl_fail(SL_ERR_FORMAT, "%s: bad header_bytes %u (expected %d)", path, h.header_bytes,
                       SL_SHARD_HEADER_BYTES);
    if (h.vocab_size < 1 || h.vocab_size > (1u << 30))
        return sl_fail(SL_ERR_FORMAT, "%s: bad vocab_size %u", path, h.vocab_size);
    uint32_t want_width = h.vocab_size <= 65536 ? 2 : 4;
    if (h.token_bytes != want_width)
        return sl_fail(SL_ERR_FORMAT, "%s: bad token_bytes %u (vocab_size %u needs %u)", path, h.token_bytes,
                       h.vocab_size, want_width);
    for (int i = 40; i < SL_SHARD_HEADER_BYTES; i++)
        if (p[i]) return sl_fail(SL_ERR_FORMAT, "%s: reserved header byte %d is not zero", path, i);
    uint64_t payload = fsize - SL_SHARD_HEADER_BYTES;
    if (h.num_tokens > payload / h.token_bytes)
        return sl_fail(
            SL_ERR_FORMAT, "%s: truncated payload: num_tokens %llu needs %llu bytes, file has %llu", path,
            (unsigned long long)h.num_tokens,
            h.num_tokens > UINT64_MAX / 4 ? 0ull : (unsigned long long)(h.num_tokens * h.token_bytes),
            (unsigned long long)payload);
    if (h.num_tokens * h.token_bytes != payload)
        return sl_fail(SL_ERR_FORMAT,
                       "%s: file size %zu does not match num_tokens %llu (expected %llu bytes)", path, fsize,
                       (unsigned long long)h.num_tokens,
                       (unsigned long long)(SL_SHARD_HEADER_BYTES + h.num_tokens * h.token_bytes));
    const uint8_t *pay = p + SL_SHARD_HEADER_BYTES;
    for (uint64_t i = 0; i < h.num_tokens; i++) {
        int32_t t = sl__shard_token(pay, h.token_bytes, (int64_t)i);
        if (t < 0 || (uint32_t)t >= h.vocab_size)
            return sl_fail(SL_ERR_FORMAT, "%s: token %u at index %llu >= vocab_size %u", path, (uint32_t)t,
                           (unsigned long long)i, h.vocab_size);
    }
    uint64_t sum = XXH3_64bits(pay, (size_t)payload);
    if (sum != h.checksum)
        return sl_fail(SL_ERR_FORMAT,
                       "%s: checksum mismatch (header %016llx, payload %016llx): file corrupted", path,
                       (unsigned long long)h.checksum, (unsigned long long)sum);
    if (hdr) *hdr = h;
    return SL_OK;
}

sl_status sl_shard_write(const char *path, const int32_t *tokens, int64_t n, int vocab_size) {
    void *buf;
    size_t len;
    SL_TRY(sl__shard_encode(path, tokens, n, vocab_size, &buf, &len));
    sl_status st = sl_file_write_atomic(path, buf, len);
    free(buf);
    return st;
}

sl_status sl_shard_read(const char *path, sl_shard_header *hdr, int32_t **tokens, int64_t *n) {
    *tokens = NULL;
    *n = 0;
    char *buf;
    size_t len;
    SL_TRY(sl_file_read_all(path, &buf, &len));
    sl_shard_header h;
    sl_status st = sl__shard_validate(path, (const uint8_t *)buf, len, &h);
    if (st != SL_OK) {
        free(buf);
        return st;
    }
    int32_t *t = malloc(h.num_tokens ? (size_t)h.num_tokens * 4 : 4);
    if (!t) {
        free(buf);
        return sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
    }
    for (uint64_t i = 0; i < h.num_tokens; i++)
        t[i] = sl__shard_token((const uint8_t *)buf + SL_SHARD_HEADER_BYTES, h.token_bytes, (int64_t)i);
    free(buf);
    if (hdr) *hdr = h;
    *tokens = t;
    *n = (int64_t)h.num_tokens;
    return SL_OK;
}
