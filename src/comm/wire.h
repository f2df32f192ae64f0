/* The wire messages of the bootstrap rendezvous and of the TCP transport's handshake, and the checks a
 * received one must pass before any field is used. Kept apart from the sockets so that they can be fuzzed
 * without a network (tests/fuzz/fuzz_comm_wire.c). Messages are host-endian: every rank of a job runs the
 * same build on the same kind of machine. */
#ifndef SL_COMM_WIRE_H
#define SL_COMM_WIRE_H
#include <stddef.h>
#include <stdint.h>

#include "comm/comm_internal.h"

#define SL_WIRE_BOOT_MAGIC 0x534c4230u /* "SLB0" */
#define SL_WIRE_TCP_MAGIC 0x534c5443u  /* "SLTC" */
#define SL_WIRE_TOKEN_BYTES 64

/* bootstrap: rank r > 0 -> rank 0, once, right after connecting */
typedef struct sl_wire_boot_hello {
    uint32_t magic, rank, size, pad;
    char token[SL_WIRE_TOKEN_BYTES]; /* NUL-terminated */
} sl_wire_boot_hello;

/* tcp transport: rank r -> each lower rank, once, right after connecting */
typedef struct sl_wire_tcp_hello {
    uint32_t magic, rank;
    char token[SL_WIRE_TOKEN_BYTES];
} sl_wire_tcp_hello;

/* tcp transport: every rank's listening address, all-gathered through the bootstrap */
typedef struct sl_wire_tcp_addr {
    char ip[64]; /* NUL-terminated dotted quad or host name */
    int32_t port;
} sl_wire_tcp_addr;

/* The rank a bootstrap hello of `len` bytes announces when it carries this job's token and world size and
 * a rank in [1, size); -1 otherwise (the connection is dropped). */
int sl_wire_boot_hello_rank(const void *msg, size_t len, const char *token, int size);
/* The rank a tcp hello announces when it carries the token and a rank in (me, size); -1 otherwise. */
int sl_wire_tcp_hello_rank(const void *msg, size_t len, const char *token, int me, int size);
/* Check rank `peer`'s address entry: a NUL-terminated, non-empty ip of printable characters and a port in
 * [1, 65535]. SL_ERR_PEER naming the rank otherwise. */
sl_status sl_wire_tcp_addr_check(const void *msg, size_t len, int peer);
#endif
