/* Checks of the bootstrap and TCP handshake messages (comm/wire.h). Every field is copied out of the
 * received bytes (no alignment assumed) and validated before use: a stray connection, a port scanner or
 * another job must never make a rank index an array with a foreign rank or read past a token. */
#include "comm/wire.h"

#include <string.h>

static int token_ok(const char *t, const char *token) {
    return memchr(t, 0, SL_WIRE_TOKEN_BYTES) != NULL && strcmp(t, token) == 0;
}

int sl_wire_boot_hello_rank(const void *msg, size_t len, const char *token, int size) {
    sl_wire_boot_hello h;
    if (len != sizeof h || size < 1) return -1;
    memcpy(&h, msg, sizeof h);
    if (h.magic != SL_WIRE_BOOT_MAGIC || !token_ok(h.token, token)) return -1;
    if (h.size != (uint32_t)size || h.rank == 0 || h.rank >= (uint32_t)size) return -1;
    return (int)h.rank;
}

int sl_wire_tcp_hello_rank(const void *msg, size_t len, const char *token, int me, int size) {
    sl_wire_tcp_hello h;
    if (len != sizeof h || me < 0 || size < 1) return -1;
    memcpy(&h, msg, sizeof h);
    if (h.magic != SL_WIRE_TCP_MAGIC || !token_ok(h.token, token)) return -1;
    if (h.rank <= (uint32_t)me || h.rank >= (uint32_t)size) return -1;
    return (int)h.rank;
}

sl_status sl_wire_tcp_addr_check(const void *msg, size_t len, int peer) {
    sl_wire_tcp_addr a;
    if (len != sizeof a)
        return sl_fail(SL_ERR_PEER, "tcp transport: rank %d: address entry of %zu bytes", peer, len);
    memcpy(&a, msg, sizeof a);
    const char *end = memchr(a.ip, 0, sizeof a.ip);
    if (!end || end == a.ip)
        return sl_fail(SL_ERR_PEER,
                       "tcp transport: rank %d sent an address that is not a NUL-terminated string", peer);
    for (const char *p = a.ip; p < end; p++)
        if (*p <= ' ' || *p > '~')
            return sl_fail(SL_ERR_PEER, "tcp transport: rank %d sent an address with byte 0x%02x", peer,
                           (unsigned)(unsigned char)*p);
    if (a.port < 1 || a.port > 65535)
        return sl_fail(SL_ERR_PEER, "tcp transport: rank %d sent port %d", peer, (int)a.port);
    return SL_OK;
}
