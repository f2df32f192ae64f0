/* libFuzzer target: the messages a rank reads from the network before trusting a peer: the bootstrap hello
 * (rank 0 reads it from every connection), the TCP transport's hello and the all-gathered listening
 * addresses (src/comm/wire.c), and the unique id string (`sl_comm_unique_id_parse`, from the environment
 * or a user). The first byte picks the message and the checking rank's view (world size, own rank); the
 * rest is the message. Whatever a check accepts must be usable: a rank inside the world, a NUL-terminated
 * address, a port in range. */
#include <stdlib.h>
#include <string.h>

#include "comm/wire.h"

static const char k_token[] = "0123456789abcdef0123456789abcdef";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int sel = data[0] & 3, size_w = 1 + ((data[0] >> 2) & 15), me = (data[0] >> 6) % size_w;
    const uint8_t *m = data + 1;
    size_t n = size - 1;
    if (sel == 0) {
        int r = sl_wire_boot_hello_rank(m, n, k_token, size_w);
        if (r != -1 && (r < 1 || r >= size_w)) abort();
    } else if (sel == 1) {
        int r = sl_wire_tcp_hello_rank(m, n, k_token, me, size_w);
        if (r != -1 && (r <= me || r >= size_w)) abort();
    } else if (sel == 2) {
        if (sl_wire_tcp_addr_check(m, n, me) == SL_OK) {
            sl_wire_tcp_addr a;
            memcpy(&a, m, sizeof a);
            if (!memchr(a.ip, 0, sizeof a.ip) || a.port < 1 || a.port > 65535) abort();
        }
    } else {
        sl_comm_unique_id id;
        memset(&id, 0, sizeof id);
        memcpy(id.bytes, m, n < sizeof id.bytes ? n : sizeof id.bytes);
        char addr[128], tok[64];
        int port = 0;
        if (sl_comm_unique_id_parse(&id, addr, sizeof addr, &port, tok, sizeof tok)) {
            if (port < 1 || port > 65535 || !memchr(addr, 0, sizeof addr) || !memchr(tok, 0, sizeof tok))
                abort();
        }
    }
    return 0;
}
